"""Tests of agent_loop_mcp.py against canned servers, without the MCP SDK.

The stdio server is mcp_fake_server.py, copied into tmp_path and run with sys.executable;
it logs every line it receives, so the client's wire format is asserted from bytes. The
HTTP server is the same Fake behind an http.server on 127.0.0.1 and a free port. The
tests against servers built with the official SDK are in test_agent_loop_mcp_sdk.py.
"""

from __future__ import annotations

import contextlib
import gc
import http.server
import json
import os
import queue
import re
import ssl
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

import agent_loop as al
import agent_loop_mcp as mcp
from loop_testing import REPOSITORY, TESTS, run
from mcp_fake_server import Fake

FAKE_SOURCE = (TESTS / "mcp_fake_server.py").read_text(encoding="utf-8")
CANCEL_BOUND = 0.25  # seconds from the signal to the run's end, as docs/mcp.md states


# --- Helpers --------------------------------------------------------------------------


class Canned:
    """A canned stdio server's command, and what it received."""

    def __init__(self, tmp_path: Path, **config: Any) -> None:
        self.script = tmp_path / "server.py"
        self.script.write_text(FAKE_SOURCE, encoding="utf-8")
        self.log = tmp_path / "received.jsonl"
        self.pid_file = tmp_path / "server.pid"
        self.config = {"log": str(self.log), "pid": str(self.pid_file), **config}

    @property
    def command(self) -> List[str]:
        return [sys.executable, str(self.script), json.dumps(self.config)]

    def server(self) -> mcp.StdioServer:
        """The server; its requests wait 10 s, however slow the machine (a test shortens
        one request with ``only_now``)."""
        return mcp.StdioServer(self.command, timeout=10.0)

    def lines(self) -> List[bytes]:
        return self.log.read_bytes().splitlines() if self.log.exists() else []

    def received(self) -> List[Dict[str, Any]]:
        return [json.loads(line) for line in self.lines()]

    def pid(self) -> int:
        return int(self.pid_file.read_text())


def shortened(server: Any, timeout: Optional[float]) -> Any:
    if timeout is not None:
        server.__enter__()
        server.timeout = timeout
    return server


@contextlib.contextmanager
def only_now(server: Any, timeout: float) -> Iterator[None]:
    """Requests sent inside the block wait ``timeout``; those before and after it wait
    the server's own (10 s), so that only the request meant to time out can.

    A request takes its deadline when it is sent: setting the timeout back once the
    block's call has ended leaves that call's deadline as it was.
    """
    before = server.timeout
    server.timeout = timeout
    try:
        yield
    finally:
        server.timeout = before


def alive(pid: int) -> bool:
    """Whether a process exists (a zombie of another parent counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return not (status.exists() and status.read_text().split()[2] == "Z")


def wait_for(condition: Any, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return bool(condition())


def registry(server: Any) -> al.ToolRegistry:
    return al.ToolRegistry(server.tools())


def call(
    server: Any, name: str, arguments: Optional[Dict[str, Any]] = None, signal: Any = None
) -> al.ToolResultMessage:
    """One tools/call, as the loop makes it."""
    tool_call = al.ToolCall("call-1", name, arguments or {})
    return al.execute_tool_call(registry(server), tool_call, signal or threading.Event())


def ok(content: str) -> Tuple[str, bool]:
    return content, False


@pytest.fixture
def canned(tmp_path: Path) -> Canned:
    return Canned(tmp_path)


# --- Arguments ------------------------------------------------------------------------


class TestArguments:
    """Call-time misuse raises TypeError or ValueError naming the parameter."""

    @pytest.mark.parametrize(
        ("command", "words"),
        [
            pytest.param("python server.py", "no shell", id="str"),
            pytest.param(b"python", "no shell", id="bytes"),
            pytest.param(42, "sequence of str", id="int"),
            pytest.param([], "non-empty", id="empty"),
            pytest.param(["python", 3], "non-empty sequence of str", id="not-str"),
        ],
    )
    def test_command_is_an_argv(self, command: Any, words: str) -> None:
        with pytest.raises(TypeError, match=words):
            mcp.StdioServer(command)

    def test_env_and_cwd(self) -> None:
        with pytest.raises(TypeError, match="env must be a mapping"):
            mcp.StdioServer(["x"], env={"A": 1})  # type: ignore[dict-item]
        with pytest.raises(TypeError, match="env must be a mapping"):
            mcp.StdioServer(["x"], env=["A"])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="cwd must be a path"):
            mcp.StdioServer(["x"], cwd=3)  # type: ignore[arg-type]

    @pytest.mark.parametrize(
        ("timeout", "error"),
        [
            pytest.param(True, TypeError, id="bool"),
            pytest.param("1", TypeError, id="str"),
            pytest.param(0, ValueError, id="zero"),
            pytest.param(float("inf"), ValueError, id="infinite"),
            pytest.param(float("nan"), ValueError, id="nan"),
        ],
    )
    def test_timeout_is_a_positive_number(self, timeout: Any, error: type) -> None:
        with pytest.raises(error, match="timeout"):
            mcp.StdioServer(["x"], timeout=timeout)
        with pytest.raises(error, match="timeout"):
            mcp.HttpServer("http://127.0.0.1/mcp", timeout=timeout)

    @pytest.mark.parametrize(
        ("kwargs", "error", "words"),
        [
            pytest.param({"url": 3}, TypeError, "url must be a str", id="url-not-str"),
            pytest.param({"url": "ftp://h/mcp"}, ValueError, "http:// or https://", id="scheme"),
            pytest.param({"url": "http:///mcp"}, ValueError, "with a host", id="no-host"),
            pytest.param({"headers": {"A": 1}}, TypeError, "headers must be", id="header-value"),
            pytest.param({"headers": ["A"]}, TypeError, "headers must be", id="headers-list"),
            pytest.param({"headers": {"Accept": "x"}}, ValueError, "may not set", id="owned"),
            pytest.param(
                {"headers": {"mcp-session-id": "x"}}, ValueError, "may not set", id="owned-case"
            ),
            pytest.param({"ssl_context": "yes"}, TypeError, "ssl.SSLContext", id="ssl"),
        ],
    )
    def test_http_arguments(self, kwargs: Dict[str, Any], error: type, words: str) -> None:
        arguments = {"url": "http://127.0.0.1:1/mcp", **kwargs}
        with pytest.raises(error, match=words):
            mcp.HttpServer(**arguments)

    def test_env_and_cwd_are_the_processes(self, canned: Canned, tmp_path: Path) -> None:
        env = {**os.environ, "FAKE_GREETING": "hello"}
        with mcp.StdioServer(canned.command, env=env, cwd=tmp_path) as server:
            assert server.env == env
            assert server.cwd == tmp_path
            pid = canned.pid()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert b"FAKE_GREETING=hello" in environ
            assert Path(f"/proc/{pid}/cwd").resolve() == tmp_path.resolve()

    def test_the_process_starts_at_with_not_when_built(self, canned: Canned) -> None:
        server = canned.server()
        assert not canned.pid_file.exists()
        with server:
            assert wait_for(canned.pid_file.exists)
        assert not alive(canned.pid())


# --- The handshake --------------------------------------------------------------------


class TestHandshake:
    """initialize offers the newest version, accepts those it speaks, then initialized."""

    def test_the_wire_format_from_bytes(self, canned: Canned) -> None:
        with canned.server() as server:
            assert server.protocol_version == "2025-11-25"
            assert call(server, "echo", {"text": "hi\nthere"}) == al.ToolResultMessage(
                "tool-result-call-1", "call-1", "echo", "hi\nthere", False
            )
        lines = canned.lines()
        version = mcp.__version__
        assert lines[:3] == [
            b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":'
            b'"2025-11-25","capabilities":{},"clientInfo":{"name":"agent_loop_mcp","version":"'
            + version.encode()
            + b'"}}}',
            b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
            b'{"jsonrpc":"2.0","id":2,"method":"tools/list"}',
        ]
        # One line per message: the newline in the argument is escaped.
        assert lines[3:] == [
            b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo",'
            b'"arguments":{"text":"hi\\nthere"},"_meta":{"progressToken":3}}}'
        ]

    def test_an_older_version_it_speaks_is_accepted(self, tmp_path: Path) -> None:
        """Each version: TestHandshake of test_agent_loop_mcp_rules.py; here, the oldest."""
        version = mcp.PROTOCOL_VERSIONS[-1]
        with Canned(tmp_path, version=version).server() as server:
            assert server.protocol_version == version
            assert [tool.name for tool in server.tools()][:2] == ["echo", "slow"]

    @pytest.mark.parametrize(
        ("version", "words"),
        [
            pytest.param("2026-07-28", "'2026-07-28'; this client speaks 2025-11-25", id="newer"),
            pytest.param("1.0", "protocol version '1.0'", id="unknown"),
            pytest.param("error", "JSON-RPC error -32602: 'Unsupported protocol", id="refused"),
        ],
    )
    def test_another_version_ends_the_session(
        self, tmp_path: Path, version: str, words: str
    ) -> None:
        canned = Canned(tmp_path, version=version)
        server = canned.server()
        with pytest.raises(mcp.McpError, match=words):
            server.tools()
        assert wait_for(lambda: not alive(canned.pid()))
        with pytest.raises(mcp.McpError, match="the MCP session is closed"):
            server.tools()

    def test_a_server_that_cannot_start(self, tmp_path: Path) -> None:
        missing = str(tmp_path / "no-such-server")
        with pytest.raises(mcp.McpError, match=r"could not start .*no-such-server"):
            mcp.StdioServer([missing]).__enter__()

    def test_a_banner_on_stdout_is_dropped(self, tmp_path: Path) -> None:
        with Canned(tmp_path, banner=True).server() as server:
            assert call(server, "echo", {"text": "ok"}).content == "ok"

    def test_a_server_that_never_answers_initialize(self, tmp_path: Path) -> None:
        script = tmp_path / "mute.py"
        script.write_text("import sys\nsys.stdin.read()\n")  # exits once its input closes
        server = mcp.StdioServer([sys.executable, str(script)], timeout=0.2)
        with pytest.raises(mcp.McpError, match=r"initialize got no answer within 0\.2"):
            server.tools()

    def test_a_last_message_without_its_newline_is_read(self, tmp_path: Path) -> None:
        """A server that answers initialize and exits before it ends the line."""
        script = tmp_path / "abrupt.py"
        script.write_text(
            "import json, sys\n"
            "m = json.loads(sys.stdin.buffer.readline())\n"
            "r = {'protocolVersion': '2025-11-25', 'capabilities': {}}\n"
            "sys.stdout.write(json.dumps({'jsonrpc': '2.0', 'id': m['id'], 'result': r}))\n"
        )
        server = mcp.StdioServer([sys.executable, str(script)])
        # It has exited by tools/list, or exits while tools/list waits: lost either way.
        with server, pytest.raises(mcp.McpError, match="the server exited with status 0"):
            server.tools()
        assert server.protocol_version == "2025-11-25"

    def test_a_server_that_exits_at_once(self, tmp_path: Path) -> None:
        script = tmp_path / "exits.py"
        script.write_text("import sys\nsys.stderr.write('missing API key')\nsys.exit(2)\n")
        server = mcp.StdioServer([sys.executable, str(script)])
        with pytest.raises(
            mcp.McpError,
            match="exited with status 2; its standard error ends with: missing API key",
        ):
            server.tools()


# --- Tools ----------------------------------------------------------------------------


class TestToolsList:
    """tools/list follows nextCursor, within bounds; each tool is an agent_loop Tool."""

    def test_each_tool_is_the_servers(self, canned: Canned) -> None:
        with canned.server() as server:
            echo = server.tools()[0]
        assert (echo.name, echo.description) == ("echo", "Says its text back.")
        assert echo.spec().to_dict()["parameters"] == {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        }

    def test_each_tool_carries_the_servers_annotations_and_title(self, tmp_path: Path) -> None:
        """MCP's Tool.title and Tool.annotations, in Tool.annotations; never in the spec."""
        hints = {"title": "Old title", "readOnlyHint": False, "destructiveHint": True}
        extra = [
            {
                "name": "rm",
                "title": "Remove",
                "inputSchema": {"type": "object"},
                "annotations": hints,
            },
            {
                "name": "ls",
                "inputSchema": {"type": "object"},
                "annotations": {"readOnlyHint": True},
            },
            {"name": "bare", "inputSchema": {"type": "object"}},
        ]
        with Canned(tmp_path, only=[], extra_tools=extra).server() as server:
            rm, ls, bare = server.tools()
        assert dict(rm.annotations) == {**hints, "title": "Remove"}
        assert dict(ls.annotations) == {"readOnlyHint": True}
        assert dict(bare.annotations) == {}
        assert "annotations" not in rm.spec().to_dict()

    def test_annotations_that_are_not_an_object_make_the_tool_unusable(
        self, tmp_path: Path
    ) -> None:
        extra = [{"name": "odd", "inputSchema": {"type": "object"}, "annotations": ["x"]}]
        server = Canned(tmp_path, only=[], extra_tools=extra).server()
        with server, pytest.raises(
            mcp.McpError, match=r"tool 'odd' cannot be used: .*annotations"
        ):
            server.tools()

    def test_pages_are_followed(self, tmp_path: Path) -> None:
        canned = Canned(tmp_path, page_size=2)
        with canned.server() as server:
            names = [tool.name for tool in server.tools()]
        assert names == [tool["name"] for tool in Fake({}).tools]
        cursors = [m.get("params") for m in canned.received() if m.get("method") == "tools/list"]
        assert cursors == [None, *({"cursor": str(n)} for n in range(2, len(names), 2))]

    @pytest.mark.parametrize(
        ("tools", "fails"),
        [
            pytest.param(mcp.MAX_TOOLS, False, id="at-limit"),
            pytest.param(mcp.MAX_TOOLS + 1, True, id="over-limit"),
        ],
    )
    def test_at_most_max_tools(self, tmp_path: Path, tools: int, fails: bool) -> None:
        extra = [
            {"name": f"t{n}", "inputSchema": {"type": "object"}}
            for n in range(tools - len(Fake({}).tools))
        ]
        with Canned(tmp_path, extra_tools=extra, page_size=100).server() as server:
            if fails:
                with pytest.raises(mcp.McpError, match=f"more than {mcp.MAX_TOOLS} tools"):
                    server.tools()
            else:
                assert len(server.tools()) == tools
                assert server.tools()[-1].description == ""

    @pytest.mark.parametrize(
        ("pages", "fails"),
        [
            pytest.param(mcp.MAX_TOOL_PAGES, False, id="at-limit"),
            pytest.param(mcp.MAX_TOOL_PAGES + 1, True, id="over-limit"),
        ],
    )
    def test_at_most_max_tool_pages(self, tmp_path: Path, pages: int, fails: bool) -> None:
        extra = [
            {"name": f"t{n}", "inputSchema": {"type": "object"}}
            for n in range(pages - len(Fake({}).tools))
        ]
        with Canned(tmp_path, extra_tools=extra, page_size=1).server() as server:
            if fails:
                with pytest.raises(mcp.McpError, match=f"more than {mcp.MAX_TOOL_PAGES} pages"):
                    server.tools()
            else:
                assert len(server.tools()) == pages

    @pytest.mark.parametrize(
        ("config", "words"),
        [
            pytest.param(
                {"list_extra": {"tools": "none"}}, "without a list of tools", id="not-a-list"
            ),
            pytest.param({"list_extra": {"nextCursor": 2}}, "not a str", id="cursor"),
            pytest.param(
                {"extra_tools": [{"description": "x"}]}, "a tool without a name", id="nameless"
            ),
            pytest.param(
                {"extra_tools": [{"name": "bad", "inputSchema": {"type": "array"}}]},
                'tool \'bad\' cannot be used: .*"type": "object"',
                id="schema",
            ),
            pytest.param(
                {"extra_tools": [{"name": "none"}]}, "tool 'none' cannot be used", id="no-schema"
            ),
        ],
    )
    def test_a_list_that_cannot_be_used(
        self, tmp_path: Path, config: Dict[str, Any], words: str
    ) -> None:
        with Canned(tmp_path, **config).server() as server, pytest.raises(
            mcp.McpError, match=words
        ):
            server.tools()

    def test_a_jsonrpc_error_to_tools_list(self, tmp_path: Path) -> None:
        script = tmp_path / "no_tools.py"
        script.write_text(
            "import json, sys\n"
            "for line in sys.stdin:\n"
            "    m = json.loads(line)\n"
            "    if m.get('method') == 'initialize':\n"
            "        r = {'protocolVersion': '2025-11-25', 'capabilities': {}}\n"
            "        a = {'jsonrpc': '2.0', 'id': m['id'], 'result': r}\n"
            "        print(json.dumps(a), flush=True)\n"
            "    elif 'id' in m:\n"
            "        e = {'code': -32601, 'message': 'Method not found', 'data': 'tools/list'}\n"
            "        a = {'jsonrpc': '2.0', 'id': m['id'], 'error': e}\n"
            "        print(json.dumps(a), flush=True)\n"
        )
        with mcp.StdioServer([sys.executable, str(script)]) as server, pytest.raises(
            mcp.McpError,
            match=r"tools/list failed: JSON-RPC error -32601: 'Method not found' \('tools/list'\)",
        ):
            server.tools()

    def test_list_changed_makes_the_next_tools_list_again(self, canned: Canned) -> None:
        with canned.server() as server:
            before = server.tools()
            assert [tool.name for tool in server.tools()] == [tool.name for tool in before]

            def lists() -> int:
                return sum(m.get("method") == "tools/list" for m in canned.received())

            assert lists() == 1  # the second call used the list it had
            tools = al.ToolRegistry(before)
            # The fake announces the change before it answers: the answer comes after it.
            assert call(server, "change").content == "changed"
            after = [tool.name for tool in server.tools()]
            assert after == [*(tool.name for tool in before), "added"]
            assert lists() == 2  # listed again after the change, once
            assert "added" not in tools  # a registry keeps the tools it was built with

    def test_a_change_while_listing_is_not_lost(self, tmp_path: Path) -> None:
        # The first listing's answer follows a list_changed: what it read may be stale.
        canned = Canned(tmp_path, change_at_listings=[1])
        with canned.server() as server:
            counts = []
            for _ in range(3):
                server.tools()
                counts.append(sum(m.get("method") == "tools/list" for m in canned.received()))
        assert counts == [1, 2, 2]  # not kept, listed again, then kept


# --- Results --------------------------------------------------------------------------


BLOCKS = [
    pytest.param({"content": []}, ok(""), id="no-content"),
    pytest.param({}, ok(""), id="no-content-key"),
    pytest.param(
        {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        ok("a\nb"),
        id="texts-joined-by-newlines",
    ),
    pytest.param(
        {"content": [{"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"}]},
        ok("[image: image/png, 5 bytes, not shown]"),
        id="image",
    ),
    pytest.param(
        {"content": [{"type": "audio", "data": "aGk=", "mimeType": "audio/wav"}]},
        ok("[audio: audio/wav, 2 bytes, not shown]"),
        id="audio",
    ),
    pytest.param(
        {"content": [{"type": "audio", "data": "", "mimeType": "audio/wav"}]},
        ok("[audio: audio/wav, 0 bytes, not shown]"),
        id="audio-empty",
    ),
    pytest.param(
        {
            "content": [
                {
                    "type": "resource_link",
                    "uri": "file:///src/main.rs",
                    "name": "main.rs",
                    "description": "Primary entry point",
                    "mimeType": "text/x-rust",
                }
            ]
        },
        ok("[resource link: file:///src/main.rs (main.rs, text/x-rust): Primary entry point]"),
        id="resource-link",
    ),
    pytest.param(
        {"content": [{"type": "resource_link", "uri": "file:///a"}]},
        ok("[resource link: file:///a]"),
        id="resource-link-bare",
    ),
    pytest.param(
        {"content": [{"type": "resource", "resource": {"uri": "file:///a", "text": "fn main"}}]},
        ok("[resource: file:///a]\nfn main"),
        id="resource-text",
    ),
    pytest.param(
        {
            "content": [
                {
                    "type": "resource",
                    "resource": {"uri": "file:///b", "blob": "AAAA", "mimeType": "a/b"},
                }
            ]
        },
        ok("[resource: file:///b, a/b, 3 bytes, not shown]"),
        id="resource-blob",
    ),
    pytest.param(
        {"content": [{"type": "resource", "resource": {"uri": "file:///c", "blob": "AA=="}}]},
        ok("[resource: file:///c, 1 bytes, not shown]"),
        id="resource-blob-no-type",
    ),
    pytest.param(
        {"content": [{"type": "hologram", "data": "x"}]},
        ok("[hologram content, not shown]"),
        id="unknown-type",
    ),
    pytest.param(
        {"content": [], "structuredContent": {"temperature": 22.5, "city": "Zürich"}},
        ok('{"temperature":22.5,"city":"Zürich"}'),
        id="structured-alone",
    ),
    pytest.param(
        {
            "content": [{"type": "text", "text": '{"t": 1}'}],
            "structuredContent": {"t": 1},
        },
        ok('{"t": 1}'),
        id="structured-with-its-text",
    ),
    pytest.param(
        {"content": [{"type": "text", "text": "no such city"}], "isError": True},
        ("no such city", True),
        id="is-error",
    ),
]


MALFORMED = [
    pytest.param([], "must be an object", id="not-an-object"),
    pytest.param({"content": "text"}, "content must be a list", id="content-not-list"),
    pytest.param({"content": [], "isError": "yes"}, "isError must be true", id="is-error"),
    pytest.param({"content": ["a"]}, r"content\[0\] must be an object", id="block"),
    pytest.param({"content": [{"text": "a"}]}, r"content\[0\]\.type must be a str", id="type"),
    pytest.param(
        {"content": [{"type": "text", "text": 3}]}, r"content\[0\]\.text must be a str", id="text"
    ),
    pytest.param(
        {"content": [{"type": "image", "data": "x"}]},
        r"content\[0\]\.mimeType must be a str",
        id="image-type",
    ),
    pytest.param(
        {"content": [{"type": "resource"}]},
        r"content\[0\]\.resource must be an object",
        id="resource",
    ),
    pytest.param(
        {"content": [{"type": "resource", "resource": {"uri": "u"}}]},
        r"content\[0\]\.resource\.blob must be a str",
        id="resource-neither",
    ),
    pytest.param(
        {"content": [{"type": "resource_link", "uri": "u", "name": 3}]},
        r"content\[0\]\.name must be a str",
        id="link-name",
    ),
]


class TestResults:
    """A tools/call result as the model reads it: rendered, bounded, errors flagged."""

    @pytest.mark.parametrize(("result", "expected"), BLOCKS)
    def test_render_tool_result(self, result: Dict[str, Any], expected: Tuple[str, bool]) -> None:
        assert mcp.render_tool_result(result) == expected

    @pytest.mark.parametrize(("result", "words"), MALFORMED)
    def test_a_malformed_result_is_a_value_error(self, result: Any, words: str) -> None:
        with pytest.raises(ValueError, match=words):
            mcp.render_tool_result(result)

    @pytest.mark.parametrize(
        ("size", "cut"),
        [
            pytest.param(mcp.MAX_RESULT_TEXT, 0, id="at-limit"),
            pytest.param(mcp.MAX_RESULT_TEXT + 1, 1, id="over-limit"),
        ],
    )
    def test_the_content_is_cut_at_max_result_text(self, size: int, cut: int) -> None:
        content, _ = mcp.render_tool_result({"content": [{"type": "text", "text": "é" * size}]})
        note = f"\n[agent_loop_mcp: {cut} more characters of this result were cut]"
        assert content == "é" * mcp.MAX_RESULT_TEXT + (note if cut else "")

    def test_blocks_past_the_limit_are_counted_not_kept(self) -> None:
        blocks = [{"type": "text", "text": "x" * 40_000}] * 3
        content, _ = mcp.render_tool_result({"content": blocks})
        assert content.startswith("x" * 40_000 + "\n" + "x" * 25_535 + "\n[agent_loop_mcp: ")
        assert content.endswith(
            f"{120_002 - mcp.MAX_RESULT_TEXT} more characters of this result were cut]"
        )

    def test_through_a_server(self, canned: Canned) -> None:
        size = mcp.MAX_RESULT_TEXT + 10
        blocks = [{"type": "text", "text": "a"}, {"type": "image", "data": "", "mimeType": "i/p"}]
        with canned.server() as server:
            assert call(server, "big", {"size": size}).content.endswith(
                "10 more characters of this result were cut]"
            )
            assert call(server, "result", {"result": {"content": blocks}}).content == (
                "a\n[image: i/p, 0 bytes, not shown]"
            )
            failed = call(server, "fail")
            assert (failed.content, failed.is_error) == ("the city is unknown", True)
            silent = call(server, "result", {"result": {"content": [], "isError": True}})
            assert (silent.content, silent.is_error) == (
                "MCP tool 'result' failed and said nothing",
                True,
            )
            malformed = call(server, "result", {"result": {"content": "x"}})
            assert malformed.content == (
                "MCP tool 'result': the server's result is malformed: "
                "content must be a list of content blocks"
            )
            assert call(server, "echo", {"text": "still here"}).content == "still here"

    @pytest.mark.parametrize(
        ("message", "words"),
        [
            pytest.param(
                {"jsonrpc": "2.0", "id": 3, "error": {"code": -32000, "message": "disk full"}},
                "MCP tool 'raw': tools/call failed: JSON-RPC error -32000: 'disk full'",
                id="jsonrpc-error",
            ),
            pytest.param(
                {"jsonrpc": "2.0", "id": 3},
                "MCP tool 'raw': tools/call: the server's answer is malformed: ",
                id="neither-result-nor-error",
            ),
            pytest.param(
                {"jsonrpc": "2.0", "id": 3, "result": []},
                "MCP tool 'raw': tools/call: the server's answer is malformed: ",
                id="result-not-object",
            ),
        ],
    )
    def test_an_answer_that_is_no_result(
        self, canned: Canned, message: Dict[str, Any], words: str
    ) -> None:
        with canned.server() as server:
            server.tools()  # ids 1 and 2: the call is id 3
            result = al.execute_tool_call(
                registry_of(server),
                al.ToolCall("c", "raw", {"message": message}),
                threading.Event(),
            )
            assert result.is_error
            assert result.content.startswith(words)


def registry_of(server: Any) -> al.ToolRegistry:
    """The registry of a server's cached tools (no tools/list sent)."""
    return al.ToolRegistry(server.tools())


# --- Time and cancellation --------------------------------------------------------------


class Once:
    """Does ``action`` in a thread of its own once ``condition()`` holds (within
    ``wait_for``'s bound), and notes when: a test acts on what happened, not after a delay."""

    def __init__(self, condition: Callable[[], bool], action: Callable[[], None]) -> None:
        self.when: List[float] = []

        def act() -> None:
            assert wait_for(condition)
            self.when.append(time.monotonic())
            action()

        self.thread = threading.Thread(target=act, daemon=True)
        self.thread.start()

    def seconds_to(self, ended: float) -> float:
        """The seconds from the action to ``ended``, once the action is done."""
        self.thread.join(30)
        return ended - self.when[0]


class LooksSet:
    """A signal that says it is set from its look number ``after + 1`` on."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.looks = 0
        self.set_at: List[float] = []

    def is_set(self) -> bool:
        self.looks += 1
        if self.looks == self.after + 1:
            self.set_at.append(time.monotonic())
        return self.looks > self.after

    def wait(self, timeout: Optional[float] = None) -> bool:
        return self.is_set()


def posted_call(
    received: Callable[[], List[Dict[str, Any]]], count: int = 1
) -> Callable[[], bool]:
    """Whether the server has got ``count`` tools/calls (the last is running: its client
    waits for the answer)."""
    return lambda: [message.get("method") for message in received()].count("tools/call") >= count


def cancelled_call(
    tools: al.ToolRegistry, name: str, condition: Callable[[], bool]
) -> Tuple[al.ToolResultMessage, float]:
    """A call whose signal is set once ``condition()`` holds; its result, and the seconds
    from the signal to the call's return."""
    signal = threading.Event()
    cancel = Once(condition, signal.set)
    result = al.execute_tool_call(tools, al.ToolCall("c", name, {}), signal)
    return result, cancel.seconds_to(time.monotonic())


def cancelled_from(cancels: List[Dict[str, Any]], request_id: int) -> bool:
    return any(
        m.get("method") == "notifications/cancelled" and m["params"]["requestId"] == request_id
        for m in cancels
    )


class TestTimeAndCancellation:
    """A request waits at most timeout (progress restarts it); a cancel reaches the server."""

    def test_a_timed_out_call_is_cancelled_and_the_server_goes_on(self, canned: Canned) -> None:
        with canned.server() as server:
            server.tools()  # the list is kept: call() below sends only tools/call
            with only_now(server, 0.3):
                result = call(server, "slow")
            assert result.is_error
            assert re.fullmatch(
                r"MCP tool 'slow': tools/call got no answer within 0\.3\d* s, and was cancelled",
                result.content,
            )
            assert wait_for(lambda: cancelled_from(canned.received(), 3))
            assert canned.received()[-1] == {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": 3, "reason": "timed out"},
            }
            assert call(server, "echo", {"text": "next"}).content == "next"

    def test_a_cancel_after_the_answer_sends_nothing(self, canned: Canned) -> None:
        """The signal is found set once the answer has come: the answer is the result,
        and no notifications/cancelled is sent for a request that was answered."""
        with canned.server() as server:
            tools = al.ToolRegistry(server.tools())  # ids 1 and 2: the call is id 3

            def text(value: str) -> Dict[str, Any]:
                return {"content": [{"type": "text", "text": value}]}

            class AnsweredFirst:
                """A signal that answers call 3 (through call 4, whose own answer follows
                on the same stream, so call 3's came first) before it says it is set."""

                def __init__(self) -> None:
                    self.answers: List[str] = []

                def is_set(self) -> bool:
                    if not self.answers:
                        answers: List[Any] = [
                            {"jsonrpc": "2.0", "id": 3, "result": text("first")},
                            {"jsonrpc": "2.0", "id": 4, "result": text("second")},
                        ]
                        raw = al.ToolCall("c4", "raw", {"messages": answers})
                        result = al.execute_tool_call(tools, raw, threading.Event())
                        self.answers.append(result.content)
                    return True

                def wait(self, timeout: Optional[float] = None) -> bool:
                    return self.is_set()

            signal = AnsweredFirst()
            result = al.execute_tool_call(tools, al.ToolCall("c3", "slow", {}), signal)
            assert (result.content, signal.answers) == ("first", ["second"])
            assert call(server, "echo", {"text": "next"}).content == "next"
        assert "notifications/cancelled" not in [m.get("method") for m in canned.received()]

    def test_a_call_is_cancelled_while_another_thread_lists_tools(self, tmp_path: Path) -> None:
        """The second tools/list is answered only once the server gets a cancel; a call of
        another thread is cancelled meanwhile within the bound (the list is not read under
        the lock a call waits for)."""
        canned = Canned(tmp_path, hold_listings=[2])
        with canned.server() as server:
            tools = al.ToolRegistry(server.tools())
            assert call(server, "change").content == "changed"  # the next tools() lists
            lister = threading.Thread(target=server.tools)
            lister.start()
            assert wait_for(
                lambda: sum(m.get("method") == "tools/list" for m in canned.received()) == 2
            )
            result, waited = cancelled_call(tools, "slow", posted_call(canned.received, 2))
            lister.join()
            assert result.content == "MCP tool 'slow': tools/call was cancelled with the run"
            assert waited < CANCEL_BOUND

    def test_a_call_closed_while_it_reports_progress_is_cancelled(self, tmp_path: Path) -> None:
        """The run's loop closes a cancelled tool's generator: its request is cancelled."""
        canned = Canned(tmp_path, hold_progress=True)
        with canned.server() as server:
            tool = al.ToolRegistry(server.tools()).get("progress")
            assert tool is not None
            steps = tool.execute({"steps": 1}, threading.Event())
            assert next(steps) == {"progress": 1}  # type: ignore[call-overload]
            steps.close()  # type: ignore[attr-defined]
            assert wait_for(lambda: cancelled_from(canned.received(), 3))

    def test_the_signal_cancels_a_call_within_the_bound(self, canned: Canned) -> None:
        signal = threading.Event()
        with canned.server() as server:
            tools = server.tools()
            model = al.ScriptedModel(
                [
                    al.scripted_response("r1", [al.ToolCall("c1", "slow", {})], "toolCall"),
                    al.scripted_response(
                        "r2", [al.ToolCall("c2", "echo", {"text": "a"})], "toolCall"
                    ),
                    al.scripted_response("r3", [al.TextBlock("done")], "stop"),
                ]
            )
            cancel = Once(posted_call(canned.received), signal.set)
            _, result, _ = run(model, tools, signal=signal)
            assert cancel.seconds_to(time.monotonic()) < CANCEL_BOUND
            assert result.status == "cancelled"
            assert wait_for(lambda: cancelled_from(canned.received(), 3))
            assert canned.received()[-1]["params"] == {
                "requestId": 3,
                "reason": "the run was cancelled",
            }
            # The server goes on: the next run calls it.
            _, again, _ = run(
                al.ScriptedModel(
                    [
                        al.scripted_response(
                            "r1", [al.ToolCall("c", "echo", {"text": "a"})], "toolCall"
                        ),
                        al.scripted_response("r2", [al.TextBlock("done")], "stop"),
                    ]
                ),
                tools,
            )
            assert again.status == "completed"
            assert again.messages[2].content == "a"


# --- Messages ---------------------------------------------------------------------------


class TestMessages:
    """What a server sends that is no answer: dropped, bounded, named."""

    @pytest.mark.parametrize(
        ("size", "dropped"),
        [
            pytest.param(mcp.MAX_MESSAGE_BYTES - len(b'{"padding": ""}'), False, id="at-limit"),
            pytest.param(
                mcp.MAX_MESSAGE_BYTES - len(b'{"padding": ""}') + 1, True, id="over-limit"
            ),
        ],
    )
    def test_a_message_over_max_message_bytes_fails_the_calls_in_flight(
        self, canned: Canned, size: int, dropped: bool
    ) -> None:
        with canned.server() as server:
            result = call(server, "oversized", {"size": size})
            if dropped:
                assert result.content == (
                    "MCP tool 'oversized': tools/call failed: the server sent a message of more "
                    f"than {mcp.MAX_MESSAGE_BYTES} bytes, which was dropped"
                )
            else:  # read, and dropped as no JSON-RPC message: the answer follows
                assert result.content == "after the oversized line"
            assert call(server, "echo", {"text": "next"}).content == "next"

    def test_requests_from_the_server(self, canned: Canned) -> None:
        with canned.server() as server:
            assert call(server, "ask").content == "asked"
            assert wait_for(lambda: len([m for m in canned.received() if "method" not in m]) == 2)
        answers = [m for m in canned.received() if "method" not in m]
        assert answers == [
            {"jsonrpc": "2.0", "id": "server-1", "result": {}},
            {
                "jsonrpc": "2.0",
                "id": "server-2",
                "error": {"code": -32601, "message": "Method not found: sampling/createMessage"},
            },
        ]


# --- Processes --------------------------------------------------------------------------


class TestProcess:
    """close() ends the server and what it started; nothing outlives the session."""

    def test_close_ends_the_server_and_its_children(self, tmp_path: Path) -> None:
        child = tmp_path / "child.pid"
        canned = Canned(tmp_path, child=str(child))
        with canned.server() as server:
            tools = server.tools()
            assert wait_for(child.exists)
            pids = (canned.pid(), int(child.read_text()))
            assert all(alive(pid) for pid in pids)
        # The server has exited; what it started was sent SIGKILL, which takes a moment.
        assert not alive(pids[0])
        assert wait_for(lambda: not alive(pids[1]))
        with pytest.raises(mcp.McpError, match="closed"):
            server.tools()
        closed = echo_through(tools)
        assert closed.content == f"MCP tool 'echo': {server.where}: the MCP session is closed"

    @pytest.mark.parametrize(
        "config",
        [
            pytest.param({"linger": True}, id="stays-after-its-input-closes"),
            pytest.param({"linger": True, "ignore_term": True}, id="ignores-sigterm"),
        ],
    )
    def test_a_server_that_will_not_exit_is_killed(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: Dict[str, Any]
    ) -> None:
        monkeypatch.setattr(mcp, "CLOSE_GRACE_SECONDS", 0.2)
        canned = Canned(tmp_path, **config)
        with canned.server() as server:
            server.tools()
        assert not alive(canned.pid())

    def test_a_close_while_the_server_starts_ends_it(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """close() from another thread after the handshake looked and before the process
        started: the process that starts then is ended all the same."""
        monkeypatch.setattr(mcp, "CLOSE_GRACE_SECONDS", 0.2)
        canned = Canned(tmp_path, linger=True)  # its input closed, it stays
        connect = mcp.StdioServer._connect

        def closed_first(server: mcp.StdioServer) -> None:
            closer = threading.Thread(target=server.close)
            closer.start()
            closer.join()
            connect(server)
            assert wait_for(lambda: canned.pid_file.exists() and canned.pid_file.read_text())

        monkeypatch.setattr(mcp.StdioServer, "_connect", closed_first)
        try:
            with pytest.raises(mcp.McpError, match="the session was closed"):
                canned.server().tools()
            assert not alive(canned.pid())
        finally:
            if alive(canned.pid()):
                os.kill(canned.pid(), 9)

    def test_close_during_a_call_ends_it_with_an_error(self, canned: Canned) -> None:
        with canned.server() as server:
            tools = al.ToolRegistry(server.tools())
            Once(posted_call(canned.received), server.close)
            result = al.execute_tool_call(tools, al.ToolCall("c", "slow", {}), threading.Event())
            assert result.content == (
                "MCP tool 'slow': tools/call did not finish: the session was closed"
            )
        assert not alive(canned.pid())
        server.close()  # again: nothing happens

    def test_a_server_that_crashes_mid_call(self, canned: Canned) -> None:
        with canned.server() as server:
            tools = server.tools()
            result = call(server, "crash")
            assert result.is_error
            assert result.content == (
                "MCP tool 'crash': tools/call did not finish: the server exited with status 3; "
                "its standard error ends with: boom: the server crashed"
            )
            again = echo_through(tools)
            assert again.content.startswith("MCP tool 'echo': the server exited with status 3")
            with pytest.raises(mcp.McpError, match="the server exited with status 3"):
                server.tools()  # the kept list is not given: its tools cannot run

    def test_a_server_that_closes_its_output(
        self, canned: Canned, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(mcp, "CLOSE_GRACE_SECONDS", 0.2)
        with canned.server() as server:
            result = call(server, "close_output")
            assert result.content == (
                "MCP tool 'close_output': tools/call did not finish: the server closed its output"
            )

    def test_stderr_never_fills_its_pipe(self, tmp_path: Path) -> None:
        # Ten times a pipe's buffer: a server whose stderr were not read would block.
        canned = Canned(tmp_path, stderr=10 * 65536)
        with canned.server() as server:
            assert call(server, "echo", {"text": "x"}).content == "x"
            assert wait_for(lambda: len(server._stderr_tail) == mcp.STDERR_TAIL_BYTES)

    @pytest.mark.parametrize(
        "config",
        [
            pytest.param({}, id="its-output-ends"),
            pytest.param({"farewell": True}, id="it-writes-once-collected"),
        ],
    )
    def test_a_dropped_server_is_ended_when_collected(
        self, tmp_path: Path, config: Dict[str, Any]
    ) -> None:
        canned = Canned(tmp_path, **config)
        server = canned.server()
        server.tools()
        pid = canned.pid()
        collected = weakref.ref(server)
        del server
        gc.collect()
        assert collected() is None
        assert wait_for(lambda: not alive(pid))

    def test_a_server_leaving_no_group(
        self, canned: Canned, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        def gone(pid: int, number: int) -> None:
            raise ProcessLookupError

        with canned.server() as server:
            server.tools()
            monkeypatch.setattr(os, "killpg", gone)
        assert not alive(canned.pid())

    def test_a_server_that_closes_its_input(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Every write after the handshake meets a broken pipe: the requests time out, and
        close() ends the server all the same (it ignores its input: SIGTERM ends it)."""
        monkeypatch.setattr(mcp, "CLOSE_GRACE_SECONDS", 0.1)
        script = tmp_path / "deaf.py"
        script.write_text(
            "import json, os, sys, time\n"
            "m = json.loads(sys.stdin.buffer.readline())\n"
            "os.close(0)\n"
            "r = {'protocolVersion': '2025-11-25', 'capabilities': {}}\n"
            "print(json.dumps({'jsonrpc': '2.0', 'id': m['id'], 'result': r}), flush=True)\n"
            "time.sleep(60)\n"
        )
        server = shortened(mcp.StdioServer([sys.executable, str(script)], timeout=10.0), 0.3)
        with server, pytest.raises(mcp.McpError, match=r"tools/list got no answer within 0\.3"):
            server.tools()

    def test_a_server_whose_input_is_broken(self, canned: Canned) -> None:
        with canned.server() as server:
            tools = server.tools()
            os.kill(canned.pid(), 9)
            for _ in range(3):  # the writer meets a broken pipe, the reader the end
                assert echo_through(tools).is_error


def echo_through(tools: List[al.Tool]) -> al.ToolResultMessage:
    """An echo call through tools a server gave before (nothing is listed now)."""
    return al.execute_tool_call(
        al.ToolRegistry(tools), al.ToolCall("c", "echo", {"text": "x"}), threading.Event()
    )


# --- Threads ------------------------------------------------------------------------------


class TestThreads:
    """Many calls from several threads on one connection: each gets its own answer."""

    def test_many_calls_from_threads(self, canned: Canned) -> None:
        with canned.server() as server:
            tools = al.ToolRegistry(server.tools())
            results: Dict[int, str] = {}

            def worker(number: int) -> None:
                for index in range(10):
                    text = f"{number}-{index}"
                    call_ = al.ToolCall(f"c{text}", "echo", {"text": text})
                    results[number * 100 + index] = al.execute_tool_call(
                        tools, call_, threading.Event()
                    ).content

            threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        assert results == {n * 100 + i: f"{n}-{i}" for n in range(8) for i in range(10)}


# --- Streamable HTTP ------------------------------------------------------------------------


class HttpFake:
    """The Fake behind an http.server on 127.0.0.1 and a free port: JSON or SSE answers."""

    def __init__(self, mode: str = "sse", **config: Any) -> None:
        self.fake = Fake(config)
        self.mode = mode
        self.config = config
        self.requests: List[Tuple[str, Dict[str, str], bytes]] = []
        self.stopping = threading.Event()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                owner.requests.append(("POST", dict(self.headers), body))
                owner.post(self, body)

            def do_DELETE(self) -> None:
                owner.requests.append(("DELETE", dict(self.headers), b""))
                if owner.config.get("delete_status") == "hang up":
                    self.close_connection = True
                    return
                self.send_response(owner.config.get("delete_status", 200))
                self.end_headers()

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        # shutdown() waits for the loop's next look: a short poll ends each test soon.
        self.thread = threading.Thread(
            target=self.http.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http.server_address[1]}/mcp?key=1"

    def __enter__(self) -> HttpFake:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stopping.set()
        self.http.shutdown()
        self.http.server_close()

    def posted(self) -> List[Dict[str, Any]]:
        return [json.loads(body) for method, _, body in self.requests if method == "POST"]

    def post(self, handler: http.server.BaseHTTPRequestHandler, body: bytes) -> None:
        message = json.loads(body)
        method = message.get("method")
        hold = self.config.get("hold", {}).get(method)  # an Event that lets it answer
        if hold is not None:
            hold.wait(30)
        override = self.config.get("status", {}).get(method)
        if override is not None:
            status, kind, data, *headers = override  # then (name, value) pairs
            handler.send_response(status)
            if kind:
                handler.send_header("Content-Type", kind)
            for name, value in headers:
                handler.send_header(name, value)
            if status == 200 and kind == "application/json" and data is None:
                handler.send_header("Content-Length", str(mcp.MAX_MESSAGE_BYTES + 1))
                data = b""
            handler.end_headers()
            handler.wfile.write(data or b"")
            return
        answers: queue.Queue[Any] = queue.Queue()
        self.fake.handle(body, answers.put)
        if "id" not in message or method is None:
            handler.send_response(202)
            handler.end_headers()
            return
        handler.send_response(200)
        if method == "initialize" and "session_id" in self.config:
            if self.config["session_id"] is not None:
                handler.send_header("Mcp-Session-Id", self.config["session_id"])
        elif method == "initialize":
            handler.send_header("Mcp-Session-Id", "session-1")
        if self.mode == "json":
            response = self.next_answer(answers, message["id"])
            data = response if isinstance(response, bytes) else json.dumps(response).encode()
            handler.send_header("Content-Type", "application/json")
            handler.end_headers()
            handler.wfile.write(data)
            return
        handler.send_header("Content-Type", "text/event-stream")
        handler.end_headers()
        handler.wfile.write(b": a comment\r\nid: 0\r\ndata:\r\n\r\n")  # the priming event
        while True:
            item = self.next_answer(answers, None)
            if item is None:
                return  # the stream ends without the answer
            if isinstance(item, bytes):
                handler.wfile.write(b"event: message\ndata: " + item.strip() + b"\n\n")
                continue
            lines = json.dumps(item, indent=1).encode().split(b"\n")  # data over many lines
            handler.wfile.write(
                b"event: message\n" + b"".join(b"data:" + line + b"\n" for line in lines) + b"\n"
            )
            handler.wfile.flush()
            if item.get("id") == message["id"] and "method" not in item:
                return

    def next_answer(self, answers: queue.Queue[Any], request_id: Any) -> Any:
        while not self.stopping.is_set():
            try:
                item = answers.get(timeout=0.05)
            except queue.Empty:
                continue
            if item == "end":
                return None
            if request_id is None or (isinstance(item, dict) and item.get("id") == request_id):
                return item
        return None


@pytest.fixture(params=["sse", "json"])
def http_fake(request: pytest.FixtureRequest) -> Iterator[HttpFake]:
    with HttpFake(request.param) as fake:
        yield fake


class TestHttp:
    """Streamable HTTP: POSTs, JSON or SSE answers, the session and version headers."""

    def test_a_session_from_the_wire(self, http_fake: HttpFake) -> None:
        with mcp.HttpServer(http_fake.url, headers={"Authorization": "Bearer t"}) as server:
            assert call(server, "echo", {"text": "hé"}).content == "hé"
        methods = [
            (m, h.get("Mcp-Session-Id"), h.get("MCP-Protocol-Version"))
            for m, h, _ in http_fake.requests
        ]
        assert methods == [
            ("POST", None, None),
            ("POST", "session-1", "2025-11-25"),
            ("POST", "session-1", "2025-11-25"),
            ("POST", "session-1", "2025-11-25"),
            ("DELETE", "session-1", "2025-11-25"),
        ]
        for _, headers, _ in http_fake.requests[:4]:
            assert headers["Accept"] == "application/json, text/event-stream"
            assert headers["Content-Type"] == "application/json"
            assert headers["Authorization"] == "Bearer t"
        assert [m.get("method") for m in http_fake.posted()] == [
            "initialize",
            "notifications/initialized",
            "tools/list",
            "tools/call",
        ]
        assert http_fake.requests[3][2] == (
            b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo",'
            b'"arguments":{"text":"h\xc3\xa9"},"_meta":{"progressToken":3}}}'
        )

    def test_tools_lists_again_each_time(self, http_fake: HttpFake) -> None:
        with mcp.HttpServer(http_fake.url) as server:
            server.tools()
            assert call(server, "change").content == "changed"
            assert "added" in [tool.name for tool in server.tools()]
        assert [m.get("method") for m in http_fake.posted()].count("tools/list") == 3

    def test_errors_and_results(self, http_fake: HttpFake) -> None:
        with mcp.HttpServer(http_fake.url) as server:
            assert call(server, "fail").content == "the city is unknown"
            # Over HTTP, each tools() lists: the call after it is request 5.
            error: Dict[str, Any] = {
                "jsonrpc": "2.0",
                "id": 5,
                "error": {"code": 1, "message": "no"},
            }
            tools = al.ToolRegistry(server.tools())
            result = al.execute_tool_call(
                tools, al.ToolCall("c", "raw", {"message": error}), threading.Event()
            )
            assert result.content == "MCP tool 'raw': tools/call failed: JSON-RPC error 1: 'no'"

    def test_no_session_id(self) -> None:
        with HttpFake("json", session_id=None) as fake:
            with mcp.HttpServer(fake.url) as server:
                assert call(server, "echo", {"text": "x"}).content == "x"
            assert [m for m, _, _ in fake.requests][-1] == "POST"  # no DELETE without a session

    def test_a_session_id_that_is_not_visible_ascii(self) -> None:
        with HttpFake("json", session_id="a b") as fake, pytest.raises(
            mcp.McpError, match="session id that is not visible ASCII: 'a b'"
        ):
            mcp.HttpServer(fake.url).tools()

    def test_an_expired_session_is_opened_again(self, http_fake: HttpFake) -> None:
        with mcp.HttpServer(http_fake.url) as server:
            server.tools()
            http_fake.config["status"] = {"tools/list": (404, "text/plain", b"Session not found")}
            with pytest.raises(mcp.McpError, match=r"ended the session \(HTTP 404\)"):
                server.tools()
            del http_fake.config["status"]
            assert len(server.tools()) == len(Fake({}).tools)
        assert [m.get("method") for m in http_fake.posted()].count("initialize") == 2

    @pytest.mark.parametrize(
        ("status", "words"),
        [
            pytest.param((500, "text/plain", b"it broke"), "HTTP 500: it broke", id="500"),
            pytest.param((404, None, b""), "HTTP 404: ", id="404-before-a-session"),
            pytest.param((200, "text/html", b"<html>"), "Content-Type is text/html", id="html"),
            pytest.param((200, None, b""), "Content-Type is missing", id="no-type"),
            pytest.param((200, "application/json", None), "more than 8388608", id="length"),
            pytest.param((200, "application/json", b"{oops"), "not JSON", id="not-json"),
            pytest.param(
                (200, "text/event-stream", b"data: {oops\n\n"), "not JSON", id="sse-not-json"
            ),
            pytest.param(
                (200, "text/event-stream", b"data: \n\n"),
                "ended before the response",
                id="sse-cut",
            ),
            pytest.param(
                (200, "text/event-stream", b"100\r\ndata: {", ("Transfer-Encoding", "chunked")),
                "ended before the response",
                id="sse-chunk-cut",
            ),
            pytest.param(
                (200, "application/json", b'{"jsonrpc": "2.0", "id": 99, "result": {}}'),
                "ended before the response",
                id="other-id",
            ),
        ],
    )
    def test_an_answer_that_fails_initialize(self, status: Any, words: str) -> None:
        with HttpFake("json", status={"initialize": status}) as fake, pytest.raises(
            mcp.McpError, match=words
        ):
            mcp.HttpServer(fake.url).tools()

    def test_a_notification_that_is_refused(self) -> None:
        status = {"notifications/initialized": (400, "text/plain", b"bad")}
        with HttpFake("json", status=status) as fake, pytest.raises(
            mcp.McpError, match="HTTP 400 for a notification: bad"
        ):
            mcp.HttpServer(fake.url).tools()

    def test_nobody_listening(self) -> None:
        with HttpFake() as fake:
            url = fake.url
        with pytest.raises(mcp.McpError, match="the HTTP exchange failed: ConnectionRefusedError"):
            mcp.HttpServer(url).tools()

    @pytest.mark.parametrize("context", [None, ssl.create_default_context()])
    def test_https_speaks_tls(self, context: Any) -> None:
        with HttpFake() as fake, pytest.raises(mcp.McpError, match="SSL"):
            mcp.HttpServer(
                fake.url.replace("http:", "https:"), ssl_context=context, timeout=2
            ).tools()

    @pytest.mark.parametrize(
        ("size", "fails"),
        [
            pytest.param(mcp.MAX_MESSAGE_BYTES, False, id="at-limit"),
            pytest.param(mcp.MAX_MESSAGE_BYTES + 1, True, id="over-limit"),
        ],
    )
    def test_a_body_over_max_message_bytes(self, size: int, fails: bool) -> None:
        result = b'{"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": "2025-11-25", "p": "'
        body = result + b"x" * (size - len(result) - 3) + b'"}}'
        assert len(body) == size
        for kind in ("application/json", "text/event-stream"):
            data = body if kind == "application/json" else b"data: " + body + b"\n\n"
            with HttpFake("json", status={"initialize": (200, kind, data)}) as fake:
                server = mcp.HttpServer(fake.url)
                if fails:
                    limit = mcp.MAX_MESSAGE_BYTES  # the event stream's parser counts characters
                    words = f"more than {limit}|an event longer than {limit:,}"
                    with pytest.raises(mcp.McpError, match=words):
                        server.tools()
                else:
                    assert len(server.tools()) == len(Fake({}).tools)

    def test_progress_over_the_stream(self) -> None:
        """Progress comes in the call's own stream, before its answer (its deadline: the
        rules' tests)."""
        with HttpFake("sse") as fake, mcp.HttpServer(fake.url) as server:
            assert call(server, "progress", {"steps": 3}).content == "done"

    def test_the_signal_cancels_an_http_call_within_the_bound(self, http_fake: HttpFake) -> None:
        with mcp.HttpServer(http_fake.url) as server:
            signal = threading.Event()
            tools = al.ToolRegistry(server.tools())
            cancel = Once(posted_call(http_fake.posted), signal.set)
            result = al.execute_tool_call(tools, al.ToolCall("c", "slow", {}), signal)
            assert cancel.seconds_to(time.monotonic()) < CANCEL_BOUND
            assert result.content == "MCP tool 'slow': tools/call was cancelled with the run"
            assert wait_for(lambda: cancelled_from(http_fake.posted(), 3))
            assert call(server, "echo", {"text": "next"}).content == "next"

    def test_a_timed_out_call(self, http_fake: HttpFake) -> None:
        with mcp.HttpServer(http_fake.url, timeout=10.0) as server:
            tools = registry(server)  # HTTP lists again in each call(): list it only here
            with only_now(server, 0.3):
                result = al.execute_tool_call(
                    tools, al.ToolCall("c", "slow", {}), threading.Event()
                )
            assert "and was cancelled" in result.content
            assert wait_for(lambda: cancelled_from(http_fake.posted(), 3))

    def test_a_call_waiting_for_another_threads_handshake_is_cancelled(self) -> None:
        """The session expired; another thread's handshake is held until the call has
        ended; a call that waits for it is cancelled within the bound, and is not sent."""
        with HttpFake("json") as fake, mcp.HttpServer(fake.url) as server:
            tools = al.ToolRegistry(server.tools())
            fake.config["status"] = {"tools/list": (404, "text/plain", b"Session not found")}
            with pytest.raises(mcp.McpError, match=r"ended the session \(HTTP 404\)"):
                server.tools()
            del fake.config["status"]
            release = threading.Event()
            fake.config["hold"] = {"initialize": release}
            opener = threading.Thread(target=server.tools)
            opener.start()
            assert wait_for(
                lambda: [m.get("method") for m in fake.posted()].count("initialize") == 2
            )
            # The call waits for the handshake's lock, looking at its signal between waits:
            # it is set at the second look.
            signal = LooksSet(after=1)
            result = al.execute_tool_call(tools, al.ToolCall("c", "slow", {}), signal)
            ended = time.monotonic()
            release.set()
            opener.join()
            assert result.content == (
                "MCP tool 'slow': tools/call was cancelled with the run before it was sent"
            )
            assert signal.looks == 2
            assert ended - signal.set_at[0] < CANCEL_BOUND
        assert "tools/call" not in [m.get("method") for m in fake.posted()]

    @pytest.mark.parametrize(
        ("step", "after", "sent"),
        [
            pytest.param("__init__", False, False, id="before-its-connection"),
            pytest.param("connect", False, False, id="while-it-connects"),
            pytest.param("connect", True, False, id="once-connected"),
            pytest.param("request", True, True, id="once-written"),
        ],
    )
    def test_a_call_cancelled_before_it_is_written_is_not_sent(
        self, monkeypatch: pytest.MonkeyPatch, step: str, after: bool, sent: bool
    ) -> None:
        """The signal is set while the call's POST is held at a step of its exchange: a
        request not yet written is not sent, and neither is its cancel; one written is
        cancelled after it."""
        with HttpFake("sse") as fake, shortened(mcp.HttpServer(fake.url), 5.0) as server:
            tools = al.ToolRegistry(server.tools())  # ids 1 and 2: the call is id 3
            signal = threading.Event()
            gate = Gate(monkeypatch, step, after, signal.set)
            result = al.execute_tool_call(tools, al.ToolCall("c", "slow", {}), signal)
            assert result.content == "MCP tool 'slow': tools/call was cancelled with the run"
            gate.open()  # the call's own thread goes on, and ends
            before = ["initialize", "notifications/initialized", "tools/list"]
            if sent:
                assert wait_for(lambda: len(fake.posted()) == 5)
                posted = fake.posted()
                assert [m.get("method") for m in posted[:3]] == before
                # On two connections: the server may read them in either order.
                assert sorted(m["method"] for m in posted[3:]) == [
                    "notifications/cancelled",
                    "tools/call",
                ]
                assert {
                    "jsonrpc": "2.0",
                    "method": "notifications/cancelled",
                    "params": {"requestId": 3, "reason": "the run was cancelled"},
                } in posted
            else:
                assert [m.get("method") for m in fake.posted()] == before

    def test_close_before_a_call_connects_sends_nothing(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        with HttpFake("sse") as fake:
            server = mcp.HttpServer(fake.url)
            tools = al.ToolRegistry(server.tools())
            gate = Gate(monkeypatch, "__init__", False, lambda: None)
            results: List[al.ToolResultMessage] = []
            caller = threading.Thread(
                target=lambda: results.append(
                    al.execute_tool_call(tools, al.ToolCall("c", "slow", {}), threading.Event())
                )
            )
            caller.start()
            assert gate.entered.wait(10)
            server.close()  # returns while the call's exchange has no connection yet
            caller.join()
            gate.open()
            assert results[0].content == (
                "MCP tool 'slow': tools/call did not finish: the session was closed"
            )
            sent = [
                (method, json.loads(body).get("method") if body else None)
                for method, _, body in fake.requests
            ]
            assert sent == [
                ("POST", "initialize"),
                ("POST", "notifications/initialized"),
                ("POST", "tools/list"),
                ("DELETE", None),
            ]

    def test_requests_from_the_server_are_answered_by_post(self) -> None:
        with HttpFake("sse") as fake, mcp.HttpServer(fake.url) as server:
            assert call(server, "ask").content == "asked"
            assert wait_for(lambda: len([m for m in fake.posted() if "method" not in m]) == 2)

    @pytest.mark.parametrize("answer", [405, "hang up"], ids=["refused", "hangs-up"])
    def test_a_delete_that_fails_still_closes(self, http_fake: HttpFake, answer: Any) -> None:
        http_fake.config["delete_status"] = answer
        server = mcp.HttpServer(http_fake.url)
        server.tools()
        server.close()  # returns: the session is gone either way
        assert [m for m, _, _ in http_fake.requests][-1] == "DELETE"
        with pytest.raises(mcp.McpError, match="the MCP session is closed"):
            server.tools()

    def test_close_when_the_server_is_gone(self) -> None:
        with HttpFake() as fake:
            server = mcp.HttpServer(fake.url)
            server.tools()
        server.close()  # the DELETE finds nobody listening, and close() returns
        with pytest.raises(mcp.McpError, match="the MCP session is closed"):
            server.tools()


class Gate:
    """Holds the first call of an http.client.HTTPConnection method (``step``) made once
    it is built, before or ``after`` the method itself, until ``open()``; ``on_hold`` is
    called, and ``entered`` set, when it holds. The seam is the standard library's."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, step: str, after: bool, on_hold: Any
    ) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.thread: Optional[threading.Thread] = None
        lock = threading.Lock()
        original = getattr(http.client.HTTPConnection, step)
        gate = self

        def held(connection: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(connection, *args, **kwargs) if after else None
            with lock:
                first = gate.thread is None
                gate.thread = gate.thread or threading.current_thread()
            if first:
                on_hold()
                gate.entered.set()
                gate.opened.wait(30)
            return result if after else original(connection, *args, **kwargs)

        monkeypatch.setattr(http.client.HTTPConnection, step, held)

    def open(self) -> None:
        """Lets the held exchange go on, and waits until its thread has ended."""
        self.opened.set()
        assert self.thread is not None
        self.thread.join(30)
        assert not self.thread.is_alive()


def test_the_readme_documents_every_public_class_and_function() -> None:
    section = (REPOSITORY / "docs" / "mcp.md").read_text(encoding="utf-8")
    callables = [name for name in mcp.__all__ if callable(getattr(mcp, name))]
    assert len(callables) == 11  # the Union SessionEvent is not callable
    assert [
        name for name in callables if f"`{name}" not in section and f"mcp.{name}" not in section
    ] == []
