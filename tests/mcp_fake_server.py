"""Tests only: a canned MCP server, written without the SDK, that test_agent_loop_mcp.py
copies into tmp_path and runs with sys.executable (stdio), or serves in-process over HTTP.

Every message it receives is appended, as received, to the log file given in its config
(one line each), so that the tests assert the client's wire format from bytes. Its tools
each do one thing a real server may do: answer, fail, stall until cancelled, report
progress, crash, answer too much, send what is not JSON... (``Fake.call``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List

Message = Dict[str, Any]


def schema(**properties: Any) -> Dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties)}


TOOLS: List[Dict[str, Any]] = [
    {
        "name": "echo",
        "description": "Says its text back.",
        "inputSchema": schema(text={"type": "string"}),
    },
    {
        "name": "slow",
        "description": "Answers when cancelled, never before.",
        "inputSchema": schema(),
    },
    {
        "name": "progress",
        "description": "Reports progress, then answers.",
        "inputSchema": schema(),
    },
    {"name": "crash", "description": "Exits mid-call.", "inputSchema": schema()},
    {
        "name": "big",
        "description": "Answers size characters.",
        "inputSchema": schema(size={"type": "integer"}),
    },
    {"name": "fail", "description": "A tool error.", "inputSchema": schema()},
    *(
        {"name": name, "description": f"The {name} case.", "inputSchema": {"type": "object"}}
        for name in ("result", "raw", "garbage", "oversized", "change", "ask", "close_output")
    ),
]


Send = Callable[[Any], None]  # a message (a dict), or raw bytes to write as they are


class Fake:
    """The server's state and its answers; each answer goes to the ``send`` it is given."""

    def __init__(self, config: Dict[str, Any]) -> None:
        self.config = config
        only = config.get("only")  # the names of the tools above it lists, if not all
        listed = [dict(tool) for tool in TOOLS if only is None or tool["name"] in only]
        self.tools = listed + list(config.get("extra_tools", []))
        self.cancelled: Dict[Any, threading.Event] = {}
        self.listings = 0  # tools/list requests so far
        self.lock = threading.Lock()
        self.a_cancel = threading.Event()  # set by the first notifications/cancelled

    def log(self, raw: bytes) -> None:
        path = self.config.get("log")
        if path:
            with self.lock, open(path, "ab") as log:
                log.write(raw.rstrip(b"\n") + b"\n")

    def handle(self, raw: bytes, send: Send) -> None:
        self.log(raw)
        message = json.loads(raw)
        method = message.get("method")
        if method is None:
            return  # a response to a request of ours: logged, that is all
        if method == "notifications/cancelled":
            self.a_cancel.set()
            with self.lock:
                event = self.cancelled.setdefault(
                    message["params"]["requestId"], threading.Event()
                )
            event.set()
            return
        if "id" not in message:
            return
        if method == "initialize":
            version = self.config.get("version", message["params"]["protocolVersion"])
            if version == "error":
                send(
                    {
                        "jsonrpc": "2.0",
                        "id": message["id"],
                        "error": {"code": -32602, "message": "Unsupported protocol version"},
                    }
                )
                return
            send(
                {
                    "jsonrpc": "2.0",
                    "id": message["id"],
                    "result": {
                        "protocolVersion": version,
                        "capabilities": {"tools": {"listChanged": True}},
                        "serverInfo": {"name": "fake", "version": "1"},
                    },
                }
            )
        elif method == "tools/list":
            page_size = self.config.get("page_size", len(self.tools) or 1)
            start = int((message.get("params") or {}).get("cursor", "0"))
            result: Dict[str, Any] = {"tools": self.tools[start : start + page_size]}
            if self.config.get("endless_pages") or start + page_size < len(self.tools):
                result["nextCursor"] = str(start + page_size)
            result.update(self.config.get("list_extra", {}))
            self.listings += 1
            if self.listings in self.config.get("change_at_listings", []):
                send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
            answer = {"jsonrpc": "2.0", "id": message["id"], "result": result}
            # Listings held until the server gets a cancel; it reads on meanwhile.
            if self.listings in self.config.get("hold_listings", []):
                held = threading.Thread(target=self.after_a_cancel, args=(send, answer))
                held.daemon = True
                held.start()
            else:
                send(answer)
        elif method == "tools/call":
            threading.Thread(target=self.call, args=(message, send), daemon=True).start()
        else:
            send(
                {
                    "jsonrpc": "2.0",
                    "id": message["id"],
                    "error": {"code": -32601, "message": "Method not found"},
                }
            )

    def after_a_cancel(self, send: Send, message: Message) -> None:
        self.a_cancel.wait(60)
        send(message)

    def call(self, message: Message, send: Send) -> None:
        def answer(result: Dict[str, Any]) -> None:
            send({"jsonrpc": "2.0", "id": message["id"], "result": result})

        def text(value: str, is_error: bool = False) -> None:
            answer({"content": [{"type": "text", "text": value}], "isError": is_error})

        name = message["params"]["name"]
        arguments = message["params"].get("arguments", {})
        token = message["params"].get("_meta", {}).get("progressToken")
        if name == "echo":
            text(arguments.get("text", ""))
        elif name == "slow":
            with self.lock:
                event = self.cancelled.setdefault(message["id"], threading.Event())
            event.wait(60)
            if self.config.get("answer_after_cancel"):
                text("too late")
        elif name == "progress":
            for step in range(arguments.get("steps", 5)):
                send(
                    {
                        "jsonrpc": "2.0",
                        "method": "notifications/progress",
                        "params": {"progressToken": token, "progress": step + 1},
                    }
                )
            if self.config.get("hold_progress"):  # then answer only when cancelled
                with self.lock:
                    event = self.cancelled.setdefault(message["id"], threading.Event())
                event.wait(60)
            text("done")
        elif name == "crash":
            sys.stderr.write("boom: the server crashed\n")
            sys.stderr.flush()
            os._exit(3)
        elif name == "big":
            text("x" * arguments["size"])
        elif name == "fail":
            text("the city is unknown", is_error=True)
        elif name == "result":
            answer(arguments["result"])
        elif name == "raw":  # lines as they are (or [text, times]), then messages
            for line in arguments.get("lines", []):
                data, times = (line, 1) if isinstance(line, str) else line
                send(data.encode() * times + b"\n")
            for raw in arguments.get("messages", [arguments.get("message")]):
                send(raw)
        elif name == "garbage":
            send(b"this is not JSON\n")
        elif name == "oversized":
            send(b'{"padding": "' + b"x" * arguments["size"] + b'"}\n')
            text("after the oversized line")
        elif name == "change":
            self.tools.append({"name": "added", "description": "New.", "inputSchema": schema()})
            send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
            text("changed")
        elif name == "ask":
            send({"jsonrpc": "2.0", "id": "server-1", "method": "ping"})
            send(
                {
                    "jsonrpc": "2.0",
                    "id": "server-2",
                    "method": "sampling/createMessage",
                    "params": {},
                }
            )
            send(
                {
                    "jsonrpc": "2.0",
                    "method": "notifications/message",
                    "params": {"level": "info", "data": "hi"},
                }
            )
            text("asked")
        elif name == "close_output":
            os.close(1)
            time.sleep(60)


def main() -> None:
    config = json.loads(sys.argv[1])
    out = sys.stdout.buffer
    write_lock = threading.Lock()

    def send(message: Any) -> None:
        write(message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n")

    def write(data: bytes) -> None:
        with write_lock:
            out.write(data)
            out.flush()

    fake = Fake(config)
    if config.get("ignore_term"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if config.get("child"):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        with open(config["child"], "w") as pid_file:
            pid_file.write(str(child.pid))
    if config.get("banner"):
        write(b"fake MCP server starting\n\n")  # and a blank line
    if config.get("stderr"):
        sys.stderr.write("e" * config["stderr"])
        sys.stderr.flush()
    with open(config["pid"], "w") if config.get("pid") else open(os.devnull, "w") as pid_file:
        pid_file.write(str(os.getpid()))
    for raw in sys.stdin.buffer:
        fake.handle(raw, send)
    if config.get("farewell"):
        write(b"a line after its input closed\n")
    if config.get("linger"):
        time.sleep(120)  # a server that does not exit when its input closes


if __name__ == "__main__":
    main()
