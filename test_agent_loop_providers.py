"""Tests of agent_loop_providers.py: the provider adapters, their wire formats, their command line.

Unit tests feed byte-exact event streams from a local ``http.server`` (127.0.0.1, a thread,
started and stopped by a fixture whatever happens). Integration tests, marked ``llmock``,
run both adapters through ``run_agent_loop`` against an ``llmock serve`` subprocess; they
skip where llmock is not importable, unless ``AGENT_LOOP_REQUIRE_LLMOCK=1`` (set by tox's
llmock env) turns the skip into a failure. No test reaches beyond 127.0.0.1.
"""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import select
import signal as os_signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import pytest

import agent_loop as al
import agent_loop_providers as providers

_HERE = os.path.dirname(os.path.abspath(__file__))
_WATCHER = "agent_loop_providers watch"
_BOUND = 10.0
"""Seconds any wait in a test may last at most: nothing hangs."""


# --- The fixture server -------------------------------------------------------------


@dataclass
class Reply:
    """One scripted HTTP answer: a head, body parts written in order, and what follows."""

    parts: Sequence[bytes] = ()
    status: int = 200
    headers: Sequence[Tuple[str, str]] = (("Content-Type", "text/event-stream"),)
    before_head: float = 0.0  # seconds to wait before the status line
    pause: float = 0.0  # seconds between two parts
    stall: bool = False  # after the parts, keep the connection open until the client leaves
    chunked: bool = False  # HTTP/1.1 chunked framing, as uvicorn sends it
    hang_up: bool = False  # close the connection without any answer


@dataclass
class Server:
    """The fixture server's script and records."""

    url: str = ""
    replies: List[Reply] = field(default_factory=list)
    requests: List[Dict[str, Any]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    disconnected: threading.Event = field(default_factory=threading.Event)

    def script(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    def body(self, number: int = 0) -> Dict[str, Any]:
        body: Dict[str, Any] = self.requests[number]["body"]
        return body


class _Handler(http.server.BaseHTTPRequestHandler):
    server_state: Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet

    def do_POST(self) -> None:
        state = self.server_state
        length = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(length)
        state.requests.append(
            {
                "path": self.path,
                "headers": {name.lower(): value for name, value in self.headers.items()},
                "body": json.loads(raw),
            }
        )
        reply = state.replies.pop(0) if state.replies else Reply(status=500, parts=[b"no reply"])
        try:
            self._answer(reply, state)
        except OSError:
            state.disconnected.set()  # the client left while we wrote

    def _answer(self, reply: Reply, state: Server) -> None:
        if reply.before_head:
            self._wait_for_client(state, reply.before_head)
            if state.disconnected.is_set():
                return
        if reply.hang_up:
            self.close_connection = True
            return
        if reply.chunked:
            self.protocol_version = "HTTP/1.1"
        self.send_response(reply.status)
        for name, value in reply.headers:
            self.send_header(name, value)
        if reply.chunked:
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.flush()
        for number, part in enumerate(reply.parts):
            if number and reply.pause:
                state.release.wait(reply.pause)
            if reply.chunked:
                part = b"%x\r\n%s\r\n" % (len(part), part) if part else b""
            self.wfile.write(part)
            self.wfile.flush()
        if reply.stall:
            self._wait_for_client(state, _BOUND)
        elif reply.chunked and not any(part == b"" for part in reply.parts):
            self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True

    def _wait_for_client(self, state: Server, seconds: float) -> None:
        """Waits until the client closes its side (recorded), the fixture ends, or seconds."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not state.release.is_set():
            readable, _, _ = select.select([self.connection], [], [], 0.02)
            if readable and not self.connection.recv(1024):
                state.disconnected.set()
                return


class _QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that left early is part of the tests


@pytest.fixture
def server() -> Iterator[Server]:
    state = Server()
    handler = type("Handler", (_Handler,), {"server_state": state})
    httpd = _QuietServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02})
    thread.start()
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        yield state
    finally:
        state.release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(_BOUND)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _eventually(condition: Callable[[], bool], seconds: float = _BOUND) -> bool:
    """True once condition() is, False if it is not within seconds."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _watchers_end() -> bool:
    """True once no watcher thread is left (each ends within 50 ms of its stream)."""
    return _eventually(
        lambda: not any(thread.name == _WATCHER for thread in threading.enumerate()), 1.0
    )


# --- Builders -----------------------------------------------------------------------


def openai_chunk(delta: Optional[Dict[str, Any]] = None, finish: Optional[str] = None) -> bytes:
    choice = {"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}
    data = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [choice]}
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def openai_call(index: int, id: Optional[str], name: Optional[str], arguments: str) -> bytes:
    fragment: Dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if id is not None:
        fragment["id"] = id
        fragment["type"] = "function"
    if name is not None:
        fragment["function"]["name"] = name
    return openai_chunk({"tool_calls": [fragment]})


DONE = b"data: [DONE]\n\n"


def anthropic_event(type: str, **fields: Any) -> bytes:
    return f"event: {type}\ndata: {json.dumps({'type': type, **fields})}\n\n".encode()


def anthropic_text(index: int, *pieces: str) -> List[bytes]:
    block = {"type": "text", "text": ""}
    return [
        anthropic_event("content_block_start", index=index, content_block=block),
        *[
            anthropic_event(
                "content_block_delta", index=index, delta={"type": "text_delta", "text": piece}
            )
            for piece in pieces
        ],
        anthropic_event("content_block_stop", index=index),
    ]


def anthropic_tool(index: int, id: str, name: str, *fragments: str) -> List[bytes]:
    block = {"type": "tool_use", "id": id, "name": name, "input": {}}
    return [
        anthropic_event("content_block_start", index=index, content_block=block),
        *[
            anthropic_event(
                "content_block_delta",
                index=index,
                delta={"type": "input_json_delta", "partial_json": fragment},
            )
            for fragment in fragments
        ],
        anthropic_event("content_block_stop", index=index),
    ]


MESSAGE_START = anthropic_event(
    "message_start",
    message={"id": "msg_1", "type": "message", "role": "assistant", "content": []},
)


def anthropic_end(stop_reason: Optional[str] = "end_turn") -> List[bytes]:
    return [
        anthropic_event("message_delta", delta={"stop_reason": stop_reason}, usage={}),
        anthropic_event("message_stop"),
    ]


# Byte-exact recordings, in the shape the providers send them.
OPENAI_TEXT_STREAM = (
    b'data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
    b'data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}\n\n'
    b'data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":", world"},"finish_reason":null}]}\n\n'
    b'data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)
OPENAI_TOOL_STREAM = (
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":'
    b'[{"index":0,"id":"call_A","type":"function","function":{"name":"add","arguments":""}}]},'
    b'"finish_reason":null}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":'
    b'{"arguments":"{\\"left\\": 2, "}}]},"finish_reason":null}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":'
    b'{"arguments":"\\"right\\": 3}"}}]},"finish_reason":null}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_B",'
    b'"type":"function","function":{"name":"weather","arguments":"{\\"city\\":\\"Oslo\\"}"}}]},'
    b'"finish_reason":null}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\n'
    b"data: [DONE]\n\n"
)
ANTHROPIC_STREAM = (
    b"event: message_start\n"
    b'data: {"type":"message_start","message":{"id":"msg_01","type":"message","role":'
    b'"assistant","content":[],"model":"claude","stop_reason":null,"usage":{"input_tokens":9,'
    b'"output_tokens":1}}}\n\n'
    b"event: content_block_start\n"
    b'data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}'
    b"\n\n"
    b'event: ping\ndata: {"type": "ping"}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":'
    b'"Adding."}}\n\n'
    b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
    b"event: content_block_start\n"
    b'data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":'
    b'"toolu_01","name":"add","input":{}}}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta",'
    b'"partial_json":""}}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta",'
    b'"partial_json":"{\\"left\\": 2, \\"right\\""}}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta",'
    b'"partial_json":": 3}"}}\n\n'
    b'event: content_block_stop\ndata: {"type":"content_block_stop","index":1}\n\n'
    b"event: message_delta\n"
    b'data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},'
    b'"usage":{"output_tokens":20}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)


def request(
    messages: Sequence[al.Message] = (),
    tools: Sequence[al.ToolSpec] = (),
    id: str = "request-001",
) -> al.ModelRequest:
    if not messages:
        messages = [al.UserMessage("user-001", "Hi.")]
    return al.ModelRequest(id, tuple(messages), tuple(tools))


def stream(
    model: al.Model, model_request: Optional[al.ModelRequest] = None, signal: Any = None
) -> Tuple[List[al.ModelChunk], al.ModelResponse]:
    """Drains one model stream by hand: its chunks and its returned response."""
    generator = model.stream(model_request or request(), signal or threading.Event())
    chunks: List[al.ModelChunk] = []
    while True:
        try:
            chunks.append(next(generator))
        except StopIteration as done:
            return chunks, done.value


def failure(
    model: al.Model, model_request: Optional[al.ModelRequest] = None
) -> providers.ProviderError:
    """The ProviderError that one model stream raises."""
    with pytest.raises(providers.ProviderError) as caught:
        stream(model, model_request)
    return caught.value


def openai(server: Server, **arguments: Any) -> providers.OpenAIChatModel:
    arguments.setdefault("timeout", 0.5)
    return providers.OpenAIChatModel("test-model", base_url=server.url + "/v1", **arguments)


def anthropic(server: Server, **arguments: Any) -> providers.AnthropicMessagesModel:
    arguments.setdefault("timeout", 0.5)
    return providers.AnthropicMessagesModel("test-model", base_url=server.url, **arguments)


def settle(
    model: al.Model, prompt: str = "What is 2 + 3?", signal: Any = None, max_steps: int = 4
) -> Tuple[List[al.Event], al.RunResult]:
    return al.settle_run(
        al.run_agent_loop(
            messages=[al.UserMessage("user-001", prompt)],
            model=model,
            tools=al._demo_tools(),
            max_steps=max_steps,
            signal=signal,
        )
    )


def assert_stream_error(result: al.RunResult, *words: str) -> providers.ProviderError:
    """The run failed MODEL_STREAM_ERROR with a ProviderError whose message says words."""
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.code == "MODEL_STREAM_ERROR"
    assert result.error.message.startswith("the model's stream raised ProviderError: ")
    for word in words:
        assert word in result.error.message
    assert isinstance(result.error.exception, providers.ProviderError)
    return result.error.exception


# A transcript with every kind of message, for the request conversions.
HISTORY: Tuple[al.Message, ...] = (
    al.UserMessage("user-001", "What is (2 + 3) and the weather in Oslo?"),
    al.AssistantMessage(
        "message-r1",
        [
            al.TextBlock("Let me "),
            al.TextBlock("check."),
            al.ToolCall("c1", "add", {"left": 2, "right": 3}),
            al.ToolCall("c2", "weather", {"city": "Oslo"}),
        ],
    ),
    al.ToolResultMessage("tool-result-c1", "c1", "add", '{"sum":5}', False),
    al.ToolResultMessage("tool-result-c2", "c2", "weather", "no station", True),
    al.AssistantMessage("message-r2", [al.ToolCall("c3", "add", {})]),
    al.ToolResultMessage("tool-result-c3", "c3", "add", "missing left", True),
    al.AssistantMessage("message-r3", [al.TextBlock("Done."), al.TextBlock("")]),
    al.UserMessage("user-002", "Thanks."),
    al.AssistantMessage("message-r4", []),
    al.UserMessage("user-003", "Bye."),
)
SPECS = tuple(al._demo_tools().specs())


# --- Public classes -----------------------------------------------------------------


class TestConstruction:
    """Arguments are checked when a model is built; errors name the parameter."""

    def test_defaults(self) -> None:
        openai_model = providers.OpenAIChatModel("gpt-4o")
        anthropic_model = providers.AnthropicMessagesModel("claude")
        assert openai_model.base_url == "https://api.openai.com/v1"
        assert anthropic_model.base_url == "https://api.anthropic.com"
        assert (openai_model.timeout, anthropic_model.timeout) == (60.0, 60.0)
        assert anthropic_model.max_tokens == 4096
        assert openai_model.options == {}
        assert openai_model.system is None

    def test_a_trailing_slash_is_dropped_and_an_int_timeout_is_seconds(self) -> None:
        model = providers.OpenAIChatModel("m", base_url="http://localhost:11434/v1/", timeout=2)
        assert model.base_url == "http://localhost:11434/v1"
        assert model.timeout == 2.0

    @pytest.mark.parametrize(
        ("arguments", "error", "words"),
        [
            pytest.param({"model": 1}, TypeError, "model must be a str", id="model-type"),
            pytest.param({"model": ""}, ValueError, "model must name", id="model-empty"),
            pytest.param({"base_url": b"x"}, TypeError, "base_url must be a str", id="url-type"),
            pytest.param({"base_url": "ftp://h"}, ValueError, "base_url must be", id="scheme"),
            pytest.param({"base_url": "http://"}, ValueError, "base_url must be", id="no-host"),
            pytest.param({"base_url": "http://h/?a=1"}, ValueError, "no query", id="query"),
            pytest.param({"base_url": "http://h/#a"}, ValueError, "base_url", id="fragment"),
            pytest.param({"base_url": "http://h:x/"}, ValueError, "invalid port", id="port"),
            pytest.param({"api_key": 1}, TypeError, "api_key must be a str", id="api-key"),
            pytest.param({"system": 1}, TypeError, "system must be a str", id="system"),
            pytest.param({"timeout": True}, TypeError, "timeout must be a number", id="bool"),
            pytest.param({"timeout": "1"}, TypeError, "timeout must be a number", id="str"),
            pytest.param({"timeout": 0}, ValueError, "timeout must be a finite", id="zero"),
            pytest.param({"timeout": -1.0}, ValueError, "timeout must be", id="negative"),
            pytest.param({"timeout": float("inf")}, ValueError, "timeout must be", id="inf"),
            pytest.param({"options": [1]}, TypeError, "options must be a mapping", id="opt-type"),
            pytest.param({"options": {"a": {1}}}, TypeError, "options must be plain", id="set"),
            pytest.param(
                {"options": {"a": float("nan")}}, TypeError, "options must be plain", id="nan"
            ),
            pytest.param(
                {"options": {"messages": [], "stream": False}},
                ValueError,
                "options may not set messages, stream",
                id="owned",
            ),
        ],
    )
    @pytest.mark.parametrize(
        "model_class", [providers.OpenAIChatModel, providers.AnthropicMessagesModel]
    )
    def test_bad_arguments(
        self, model_class: Any, arguments: Dict[str, Any], error: type, words: str
    ) -> None:
        arguments = {"model": "m", **arguments}
        with pytest.raises(error, match=words):
            model_class(arguments.pop("model"), **arguments)

    @pytest.mark.parametrize(
        ("max_tokens", "error", "words"),
        [
            pytest.param(True, TypeError, "max_tokens must be an int", id="bool"),
            pytest.param(1.5, TypeError, "max_tokens must be an int", id="float"),
            pytest.param(0, ValueError, "max_tokens must be an int >= 1, got 0", id="zero"),
        ],
    )
    def test_bad_max_tokens(self, max_tokens: Any, error: type, words: str) -> None:
        with pytest.raises(error, match=words):
            providers.AnthropicMessagesModel("m", max_tokens=max_tokens)

    def test_options_may_set_what_the_provider_does_not_own(self) -> None:
        openai_model = providers.OpenAIChatModel("m", options={"max_tokens": 100})
        assert openai_model.options == {"max_tokens": 100}
        with pytest.raises(ValueError, match="options may not set max_tokens, system"):
            providers.AnthropicMessagesModel("m", options={"max_tokens": 1, "system": "x"})

    def test_options_are_copied(self) -> None:
        options: Dict[str, Any] = {"temperature": 0.5, "stop": ["x"]}
        model = providers.OpenAIChatModel("m", options=options)
        options["stop"].append("y")
        assert model.options == {"temperature": 0.5, "stop": ["x"]}

    def test_provider_error_carries_status_and_retry_after(self) -> None:
        error = providers.ProviderError("busy", status=429, retry_after=1.5)
        assert (str(error), error.status, error.retry_after) == ("busy", 429, 1.5)
        plain = providers.ProviderError("broken")
        assert (plain.status, plain.retry_after) == (None, None)

    def test_all_names_the_public_api(self) -> None:
        assert providers.__all__ == ["OpenAIChatModel", "AnthropicMessagesModel", "ProviderError"]


class TestRequests:
    """The transcript and the tools are converted exactly; keys are sent as configured."""

    def test_openai_body(self, server: Server) -> None:
        server.script(Reply([OPENAI_TEXT_STREAM]))
        model = openai(server, system="Be brief.", options={"temperature": 0})
        stream(model, request(HISTORY, SPECS))
        sent = server.requests[0]
        assert sent["path"] == "/v1/chat/completions"
        assert sent["headers"]["content-type"] == "application/json"
        assert sent["headers"]["accept"] == "text/event-stream"
        assert sent["headers"]["user-agent"] == "agent_loop_providers/1.0.0"
        assert sent["body"] == {
            "model": "test-model",
            "stream": True,
            "temperature": 0,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is (2 + 3) and the weather in Oslo?"},
                {
                    "role": "assistant",
                    "content": "Let me check.",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "add", "arguments": '{"left": 2, "right": 3}'},
                        },
                        {
                            "id": "c2",
                            "type": "function",
                            "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                        },
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": '{"sum":5}'},
                {"role": "tool", "tool_call_id": "c2", "content": "no station"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c3",
                            "type": "function",
                            "function": {"name": "add", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c3", "content": "missing left"},
                {"role": "assistant", "content": "Done."},
                {"role": "user", "content": "Thanks."},
                {"role": "assistant", "content": ""},
                {"role": "user", "content": "Bye."},
            ],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": spec.name,
                        "description": spec.description,
                        "parameters": spec.to_dict()["parameters"],
                    },
                }
                for spec in SPECS
            ],
        }

    def test_anthropic_body_merges_consecutive_results_and_carries_is_error(
        self, server: Server
    ) -> None:
        server.script(Reply([ANTHROPIC_STREAM]))
        model = anthropic(server, system="Be brief.", max_tokens=100, options={"top_k": 5})
        stream(model, request(HISTORY, SPECS))
        sent = server.requests[0]
        assert sent["path"] == "/v1/messages"
        assert sent["headers"]["anthropic-version"] == "2023-06-01"
        assert sent["body"] == {
            "model": "test-model",
            "max_tokens": 100,
            "stream": True,
            "system": "Be brief.",
            "top_k": 5,
            "messages": [
                {"role": "user", "content": "What is (2 + 3) and the weather in Oslo?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Let me "},
                        {"type": "text", "text": "check."},
                        {
                            "type": "tool_use",
                            "id": "c1",
                            "name": "add",
                            "input": {"left": 2, "right": 3},
                        },
                        {
                            "type": "tool_use",
                            "id": "c2",
                            "name": "weather",
                            "input": {"city": "Oslo"},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "c1",
                            "content": '{"sum":5}',
                            "is_error": False,
                        },
                        {
                            "type": "tool_result",
                            "tool_use_id": "c2",
                            "content": "no station",
                            "is_error": True,
                        },
                    ],
                },
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "c3", "name": "add", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "c3",
                            "content": "missing left",
                            "is_error": True,
                        }
                    ],
                },
                {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
                {"role": "user", "content": "Thanks."},
                # message-r4 is empty: the API refuses an empty turn, so none is sent
                {"role": "user", "content": "Bye."},
            ],
            "tools": [
                {
                    "name": spec.name,
                    "description": spec.description,
                    "input_schema": spec.to_dict()["parameters"],
                }
                for spec in SPECS
            ],
        }

    def test_no_tools_no_system_no_key(
        self, server: Server, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
        server.script(Reply([OPENAI_TEXT_STREAM]), Reply([ANTHROPIC_STREAM]))
        stream(openai(server))
        stream(anthropic(server))
        first, second = server.requests
        assert "tools" not in first["body"]
        assert "tools" not in second["body"]
        assert first["body"]["messages"] == [{"role": "user", "content": "Hi."}]
        assert "system" not in second["body"]
        assert "authorization" not in first["headers"]
        assert "x-api-key" not in second["headers"]

    def test_keys_are_read_from_the_environment_at_request_time(
        self, server: Server, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        openai_model, anthropic_model = openai(server), anthropic(server)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
        monkeypatch.setenv("ANTHROPIC_API_KEY", "ant-env")
        server.script(Reply([OPENAI_TEXT_STREAM]), Reply([ANTHROPIC_STREAM]))
        stream(openai_model)
        stream(anthropic_model)
        assert server.requests[0]["headers"]["authorization"] == "Bearer sk-env"
        assert server.requests[1]["headers"]["x-api-key"] == "ant-env"

    def test_an_explicit_key_wins_and_an_empty_one_sends_none(
        self, server: Server, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
        server.script(Reply([OPENAI_TEXT_STREAM]), Reply([OPENAI_TEXT_STREAM]))
        stream(openai(server, api_key="sk-given"))
        stream(openai(server, api_key=""))
        assert server.requests[0]["headers"]["authorization"] == "Bearer sk-given"
        assert "authorization" not in server.requests[1]["headers"]


# --- Streaming ----------------------------------------------------------------------


class TestOpenAIStreaming:
    """A TextDelta per delta; a ToolCallChunk per call once complete; [DONE] decides."""

    def test_text(self, server: Server) -> None:
        server.script(Reply([OPENAI_TEXT_STREAM]))
        chunks, response = stream(openai(server))
        assert chunks == [
            al.TextDelta("request-001", "Hello"),
            al.TextDelta("request-001", ", world"),
        ]
        assert response == al.ModelResponse(
            "response-001", "request-001", [al.TextBlock("Hello, world")], "stop"
        )

    def test_tool_calls_are_assembled_from_fragments(self, server: Server) -> None:
        server.script(Reply([OPENAI_TOOL_STREAM]))
        chunks, response = stream(openai(server))
        add = al.ToolCall("call_A", "add", {"left": 2, "right": 3})
        weather = al.ToolCall("call_B", "weather", {"city": "Oslo"})
        assert chunks == [
            al.ToolCallChunk("request-001", add),
            al.ToolCallChunk("request-001", weather),
        ]
        assert response.content == (add, weather)
        assert response.stop_reason == "toolCall"

    def test_a_call_is_yielded_as_soon_as_the_next_one_begins(self, server: Server) -> None:
        # The first call's chunk arrives while the server still holds the second open.
        server.script(
            Reply(
                [
                    openai_call(0, "a", "add", '{"left": 1, "right": 2}'),
                    openai_call(1, "b", "add", '{"left": '),
                ],
                stall=True,
            )
        )
        generator = openai(server).stream(request(), threading.Event())
        first = next(generator)
        assert first == al.ToolCallChunk(
            "request-001", al.ToolCall("a", "add", {"left": 1, "right": 2})
        )
        generator.close()
        assert server.disconnected.wait(_BOUND)

    def test_text_tools_and_text_keep_their_order(self, server: Server) -> None:
        server.script(
            Reply(
                [
                    openai_chunk({"role": "assistant", "content": "First "}),
                    openai_chunk({"content": "the sum."}),
                    openai_call(0, "a", "add", '{"left": 1, "right": 2}'),
                    openai_chunk({"content": "Then more."}),
                    openai_chunk({}, "stop"),
                    DONE,
                ]
            )
        )
        chunks, response = stream(openai(server))
        call = al.ToolCall("a", "add", {"left": 1, "right": 2})
        assert [type(chunk).__name__ for chunk in chunks] == [
            "TextDelta",
            "TextDelta",
            "ToolCallChunk",
            "TextDelta",
        ]
        assert response.content == (
            al.TextBlock("First the sum."),
            call,
            al.TextBlock("Then more."),
        )
        # "stop" for a response that holds tool calls: still a complete toolCall answer.
        assert response.stop_reason == "toolCall"

    def test_ollama_ends_with_a_null_finish_reason_and_done(self, server: Server) -> None:
        server.script(
            Reply(
                [
                    openai_chunk({"role": "assistant", "content": "Hi"}),
                    openai_call(0, "call_0", "add", '{"left":1,"right":1}'),
                    DONE,
                ]
            )
        )
        chunks, response = stream(openai(server))
        assert len(chunks) == 2
        assert response.stop_reason == "toolCall"

    def test_empty_arguments_are_an_empty_object(self, server: Server) -> None:
        no_arguments = {"index": 1, "id": "b", "function": {"name": "now"}}
        server.script(
            Reply(
                [
                    openai_call(0, "a", "now", ""),
                    openai_chunk({"tool_calls": [no_arguments]}),
                    openai_chunk({}, "tool_calls"),
                    DONE,
                ]
            )
        )
        _, response = stream(openai(server))
        assert response.content == (al.ToolCall("a", "now", {}), al.ToolCall("b", "now", {}))

    def test_refusal_is_text_and_other_choices_usage_and_fields_are_ignored(
        self, server: Server
    ) -> None:
        other = {"choices": [{"index": 1, "delta": {"content": "other"}}]}
        usage = {"choices": [], "usage": {"prompt_tokens": 1}}
        server.script(
            Reply(
                [
                    b"data: " + json.dumps(other).encode() + b"\n\n",
                    openai_chunk({"reasoning_content": "thinking...", "content": None}),
                    openai_chunk({"refusal": "I cannot help with that."}),
                    b"data: " + json.dumps(usage).encode() + b"\n\n",
                    b'data: {"choices":[{"delta":{"content":"!"}}]}\n\n',
                    DONE,
                ]
            )
        )
        _, response = stream(openai(server))
        assert response.content == (al.TextBlock("I cannot help with that.!"),)

    def test_nothing_after_done_is_read(self, server: Server) -> None:
        server.script(Reply([OPENAI_TEXT_STREAM + b"data: {not json\n\n"]))
        _, response = stream(openai(server))
        assert response.content == (al.TextBlock("Hello, world"),)

    def test_chunked_transfer_encoding_split_anywhere(self, server: Server) -> None:
        parts = [
            OPENAI_TOOL_STREAM[start : start + 7] for start in range(0, len(OPENAI_TOOL_STREAM), 7)
        ]
        server.script(Reply(parts, chunked=True))
        chunks, _ = stream(openai(server))
        assert [chunk.tool_call.id for chunk in chunks if isinstance(chunk, al.ToolCallChunk)] == [
            "call_A",
            "call_B",
        ]


class TestAnthropicStreaming:
    """Text deltas as they come; a tool_use at its content_block_stop; message_stop decides."""

    def test_text_and_tool_use(self, server: Server) -> None:
        server.script(Reply([ANTHROPIC_STREAM]))
        chunks, response = stream(anthropic(server))
        call = al.ToolCall("toolu_01", "add", {"left": 2, "right": 3})
        assert chunks == [
            al.TextDelta("request-001", "Adding."),
            al.ToolCallChunk("request-001", call),
        ]
        assert response == al.ModelResponse(
            "response-001", "request-001", [al.TextBlock("Adding."), call], "toolCall"
        )

    def test_unknown_blocks_and_events_are_ignored(self, server: Server) -> None:
        thinking = {"type": "thinking", "thinking": ""}
        server.script(
            Reply(
                [
                    MESSAGE_START,
                    anthropic_event("content_block_start", index=0, content_block=thinking),
                    anthropic_event(
                        "content_block_delta",
                        index=0,
                        delta={"type": "thinking_delta", "thinking": "hm"},
                    ),
                    anthropic_event(
                        "content_block_delta",
                        index=0,
                        delta={"type": "signature_delta", "signature": "s"},
                    ),
                    anthropic_event("content_block_stop", index=0),
                    anthropic_event("some_future_event", detail=1),
                    anthropic_event(
                        "content_block_start",
                        index=1,
                        content_block={"type": "text", "text": "Hi"},
                    ),
                    anthropic_event(
                        "content_block_delta",
                        index=1,
                        delta={"type": "citations_delta", "citation": {}},
                    ),
                    anthropic_event("content_block_stop", index=1),
                    *anthropic_end("stop_sequence"),
                ]
            )
        )
        chunks, response = stream(anthropic(server))
        assert chunks == [al.TextDelta("request-001", "Hi")]
        assert response.content == (al.TextBlock("Hi"),)
        assert response.stop_reason == "stop"

    def test_a_tool_use_without_deltas_keeps_its_start_input(self, server: Server) -> None:
        block = {"type": "tool_use", "id": "t", "name": "add", "input": {"left": 1, "right": 2}}
        server.script(
            Reply(
                [
                    MESSAGE_START,
                    anthropic_event("content_block_start", index=0, content_block=block),
                    anthropic_event("content_block_stop", index=0),
                    *anthropic_end(None),
                ]
            )
        )
        _, response = stream(anthropic(server))
        assert response.content == (al.ToolCall("t", "add", {"left": 1, "right": 2}),)

    def test_a_tool_call_is_yielded_at_its_block_stop(self, server: Server) -> None:
        server.script(
            Reply(
                [MESSAGE_START, *anthropic_tool(0, "t", "add", '{"left": 1, "right": 2}')],
                stall=True,
            )
        )
        generator = anthropic(server).stream(request(), threading.Event())
        assert next(generator) == al.ToolCallChunk(
            "request-001", al.ToolCall("t", "add", {"left": 1, "right": 2})
        )
        generator.close()
        assert server.disconnected.wait(_BOUND)


class TestIds:
    """Response and tool-call ids are unique in the transcript and deterministic."""

    def test_a_reused_call_id_is_rewritten_and_sent_back_as_rewritten(
        self, server: Server
    ) -> None:
        def answer(arguments: str) -> Reply:
            return Reply([openai_call(0, "call_0", "add", arguments), DONE])

        server.script(
            answer('{"left": 1, "right": 2}'),
            answer('{"left": 3, "right": 3}'),
            Reply([openai_chunk({"content": "9"}), DONE]),
        )
        _, result = settle(openai(server))
        assert result.status == "completed", result.error
        calls = [call for message in result.messages for call in al.open_tool_calls([message])]
        assert [call.id for call in calls] == ["call_0", "response-002-call-1"]
        assert [
            message.id for message in result.messages if isinstance(message, al.AssistantMessage)
        ] == [
            "message-response-001",
            "message-response-002",
            "message-response-003",
        ]
        sent = server.body(2)["messages"]
        assert [turn.get("tool_call_id") for turn in sent if turn["role"] == "tool"] == [
            "call_0",
            "response-002-call-1",
        ]
        assert sent[3]["tool_calls"][0]["id"] == "response-002-call-1"

    def test_taken_ids_get_the_first_free_suffix(self, server: Server) -> None:
        history = (
            al.UserMessage("user-001", "Go."),
            al.AssistantMessage(
                "message-response-001", [al.ToolCall("response-001-2-call-1", "add", {})]
            ),
            al.ToolResultMessage(
                "tool-result-response-001-2-call-1", "response-001-2-call-1", "add", "x", True
            ),
            al.AssistantMessage("message-response-001-2", [al.ToolCall("x", "add", {})]),
            al.ToolResultMessage("tool-result-x", "x", "add", "x", True),
            al.UserMessage("tool-result-free", "a user message whose id blocks a result id"),
        )
        server.script(
            Reply(
                [
                    openai_call(0, "x", "add", ""),
                    openai_call(1, None, "add", ""),
                    openai_call(2, "free", "add", ""),
                    openai_call(3, "", "add", ""),
                    DONE,
                ]
            )
        )
        _, response = stream(openai(server), request(history))
        assert response.id == "response-001-3"
        assert [block.id for block in response.content if isinstance(block, al.ToolCall)] == [
            "response-001-3-call-1",
            "response-001-3-call-2",
            "response-001-3-call-3",
            "response-001-3-call-4",
        ]

    def test_a_request_id_of_another_shape(self, server: Server) -> None:
        server.script(Reply([OPENAI_TEXT_STREAM]))
        _, response = stream(openai(server), request(id="job-7"))
        assert (response.id, response.request_id) == ("response-job-7", "job-7")

    def test_a_recorded_run_replays_exactly(self, server: Server) -> None:
        server.script(
            Reply([openai_call(0, "call_0", "add", '{"left": 2, "right": 3}'), DONE]),
            Reply([openai_chunk({"content": "5"}), DONE]),
        )
        _, recorded = settle(openai(server))
        added = [
            message
            for message in recorded.messages[1:]
            if isinstance(message, al.AssistantMessage)
        ]
        _, replayed = settle(al.ScriptedModel.from_transcript(added))
        assert replayed.messages == recorded.messages


# --- Failures -----------------------------------------------------------------------


def _openai_events(*events: Dict[str, Any]) -> List[bytes]:
    return [b"data: " + json.dumps(event).encode() + b"\n\n" for event in events]


class TestIncompleteAnswers:
    """Never accept a broken answer: each case fails the run and says what happened."""

    @pytest.mark.parametrize(
        ("parts", "words"),
        [
            pytest.param(
                [openai_chunk({"content": "Hi"}), openai_chunk({}, "stop")],
                ["ended before data: [DONE]"],
                id="no-done",
            ),
            pytest.param(
                [openai_chunk({"content": "Hi"}), openai_chunk({}, "length"), DONE],
                ["cut", "'length'", "token limit"],
                id="length",
            ),
            pytest.param(
                [openai_chunk({}, "content_filter"), DONE],
                ["cut", "content filter"],
                id="content-filter",
            ),
            pytest.param(
                [
                    openai_chunk({"content": "Hi"}),
                    b'data: {"error": {"message": "Model crashed", "type": "server_error"}}\n\n',
                ],
                ["reported an error: server_error: Model crashed"],
                id="error-object",
            ),
            pytest.param(
                [b'event: error\ndata: {"error": "overloaded"}\n\n'],
                ["reported an error: overloaded"],
                id="error-event",
            ),
            pytest.param(
                [b"event: error\ndata: gone\n\n"],
                ["reported an error: gone"],
                id="error-event-text",
            ),
            pytest.param(
                [b'data: {"choices": [{"delta": {"content": "Hi"\n\n'],
                ["malformed event", "not JSON"],
                id="not-json",
            ),
            pytest.param(
                [b"data: [1, 2]\n\n"], ["malformed event", "not a JSON object"], id="not-object"
            ),
            pytest.param([b'data: {"id": "x"}\n\n'], ["without a choices list"], id="no-choices"),
            pytest.param(
                _openai_events({"choices": [1]}), ["choice that is not an object"], id="choice"
            ),
            pytest.param(
                _openai_events({"choices": [{"delta": []}]}), ["with a delta object"], id="delta"
            ),
            pytest.param(
                _openai_events({"choices": [{"delta": {"content": 5}}]}),
                ["delta.content is not a string"],
                id="content",
            ),
            pytest.param(
                _openai_events({"choices": [{"delta": {"tool_calls": {}}}]}),
                ["delta.tool_calls is not a list"],
                id="calls",
            ),
            pytest.param(
                _openai_events({"choices": [{"delta": {"tool_calls": [1]}}]}),
                ["fragment that is not an object"],
                id="fragment",
            ),
            pytest.param(
                _openai_events({"choices": [{"delta": {"tool_calls": [{"index": "0"}]}}]}),
                ["without an int index"],
                id="index",
            ),
            pytest.param(
                _openai_events({"choices": [{"delta": {"tool_calls": [{"function": []}]}}]}),
                ["or a function"],
                id="function",
            ),
            pytest.param(
                _openai_events(
                    {
                        "choices": [
                            {
                                "delta": {
                                    "tool_calls": [{"function": {"name": "add", "arguments": {}}}]
                                }
                            }
                        ]
                    }
                ),
                ["arguments that are not a string"],
                id="arguments-type",
            ),
            pytest.param(
                [
                    openai_call(0, "a", "add", "{}"),
                    openai_call(1, "b", "add", "{}"),
                    openai_call(0, None, None, "1"),
                    DONE,
                ],
                ["tool call 0 continues after it was complete"],
                id="continued",
            ),
            pytest.param(
                [openai_call(0, "a", None, "{}"), DONE], ["a tool call has no name"], id="no-name"
            ),
            pytest.param(
                [openai_call(0, "a", "add", '{"left": 1,'), DONE],
                ["tool call 'add' has arguments that are not JSON", '{"left": 1,'],
                id="bad-json",
            ),
            pytest.param(
                [openai_call(0, "a", "add", "[1]"), DONE],
                ["tool call 'add' has arguments that are not a JSON object"],
                id="array",
            ),
            pytest.param([b"data: \xff\xfe\n\n"], ["not UTF-8"], id="utf-8"),
        ],
    )
    def test_openai(self, server: Server, parts: List[bytes], words: List[str]) -> None:
        server.script(Reply(parts))
        _, result = settle(openai(server))
        error = assert_stream_error(result, *words)
        assert error.status is None
        assert error.retry_after is None
        assert result.messages == (al.UserMessage("user-001", "What is 2 + 3?"),)

    @pytest.mark.parametrize(
        ("parts", "words"),
        [
            pytest.param(
                [
                    MESSAGE_START,
                    *anthropic_text(0, "Hi"),
                    anthropic_event("message_delta", delta={"stop_reason": "end_turn"}),
                ],
                ["ended before message_stop"],
                id="no-stop",
            ),
            pytest.param(
                [MESSAGE_START, *anthropic_text(0, "Hi"), *anthropic_end("max_tokens")],
                ["cut", "'max_tokens'"],
                id="max-tokens",
            ),
            pytest.param(
                [MESSAGE_START, *anthropic_end("refusal")], ["cut", "'refusal'"], id="refusal"
            ),
            pytest.param(
                [MESSAGE_START, *anthropic_end("pause_turn")],
                ["cut", "'pause_turn'"],
                id="pause-turn",
            ),
            pytest.param(
                [MESSAGE_START, *anthropic_end("model_context_window_exceeded")],
                ["context window"],
                id="context",
            ),
            pytest.param(
                [
                    MESSAGE_START,
                    b'event: error\ndata: {"type": "error", "error": '
                    b'{"type": "overloaded_error", "message": "Overloaded"}}\n\n',
                ],
                ["reported an error: overloaded_error: Overloaded"],
                id="error-event",
            ),
            pytest.param(
                [
                    b'data: {"type": "error", "error": {"type": "api_error", '
                    b'"message": "Boom"}}\n\n'
                ],
                ["reported an error: api_error: Boom"],
                id="error-type",
            ),
            pytest.param([b"event: message_start\ndata: {\n\n"], ["not JSON"], id="not-json"),
            pytest.param(
                [
                    anthropic_event(
                        "content_block_delta", index=0, delta={"type": "text_delta", "text": "x"}
                    )
                ],
                ["not a started block"],
                id="unstarted-delta",
            ),
            pytest.param(
                [anthropic_event("content_block_stop", index=3)],
                ["not a started block"],
                id="unstarted-stop",
            ),
            pytest.param(
                [*anthropic_text(0, "a")[:1], *anthropic_text(0, "b")[:1]],
                ["not a new block"],
                id="restarted",
            ),
            pytest.param(
                [
                    anthropic_event(
                        "content_block_start", index="0", content_block={"type": "text"}
                    )
                ],
                ["index"],
                id="index-type",
            ),
            pytest.param(
                [anthropic_event("content_block_start", index=0, content_block="text")],
                ["without a content_block object"],
                id="block",
            ),
            pytest.param(
                [
                    anthropic_event(
                        "content_block_start", index=0, content_block={"type": "text", "text": 1}
                    )
                ],
                ["text that is not a string"],
                id="start-text",
            ),
            pytest.param(
                [
                    *anthropic_text(0)[:1],
                    anthropic_event("content_block_delta", index=0, delta="x"),
                ],
                ["without a delta object"],
                id="delta",
            ),
            pytest.param(
                [
                    *anthropic_text(0)[:1],
                    anthropic_event(
                        "content_block_delta", index=0, delta={"type": "text_delta", "text": None}
                    ),
                ],
                ["text that is not a string"],
                id="delta-text",
            ),
            pytest.param(
                [
                    *anthropic_tool(0, "t", "add")[:1],
                    anthropic_event(
                        "content_block_delta", index=0, delta={"type": "text_delta", "text": "x"}
                    ),
                ],
                ["text_delta for a block that is not text"],
                id="text-to-tool",
            ),
            pytest.param(
                [
                    *anthropic_text(0)[:1],
                    anthropic_event(
                        "content_block_delta",
                        index=0,
                        delta={"type": "input_json_delta", "partial_json": "{}"},
                    ),
                ],
                ["input_json_delta without a tool_use block"],
                id="json-to-text",
            ),
            pytest.param(
                [
                    *anthropic_tool(0, "t", "add")[:1],
                    anthropic_event(
                        "content_block_delta", index=0, delta={"type": "input_json_delta"}
                    ),
                ],
                ["or partial_json"],
                id="no-partial-json",
            ),
            pytest.param(
                [anthropic_event("message_delta", delta=None)],
                ["message_delta without a delta object"],
                id="message-delta",
            ),
            pytest.param(
                [
                    MESSAGE_START,
                    *anthropic_tool(0, "t", "add", "{}")[:2],
                    anthropic_event("message_stop"),
                ],
                ["message_stop before a tool_use block stopped"],
                id="open-tool",
            ),
            pytest.param(
                [
                    MESSAGE_START,
                    *anthropic_tool(0, "t", "add", '{"a": '),
                    *anthropic_end("tool_use"),
                ],
                ["tool call 'add' has arguments that are not JSON"],
                id="bad-json",
            ),
            pytest.param(
                [MESSAGE_START, *anthropic_tool(0, "t", "", "{}"), *anthropic_end("tool_use")],
                ["a tool call has no name"],
                id="no-name",
            ),
        ],
    )
    def test_anthropic(self, server: Server, parts: List[bytes], words: List[str]) -> None:
        server.script(Reply(parts))
        _, result = settle(anthropic(server))
        assert_stream_error(result, *words)
        assert len(result.messages) == 1


class TestHTTPFailures:
    """Status, connection and timeout failures name the status, the address, the wait."""

    def test_429_with_retry_after_reaches_the_caller(self, server: Server) -> None:
        body = b'{"error": {"message": "Rate limit reached", "type": "rate_limit_error"}}'
        headers = (("Content-Type", "application/json"), ("Retry-After", "2"))
        server.script(Reply([body], status=429, headers=headers))
        _, result = settle(openai(server))
        error = assert_stream_error(
            result,
            "HTTP 429 Too Many Requests",
            "rate_limit_error: Rate limit reached",
            "Retry-After: 2 s",
        )
        assert (error.status, error.retry_after) == (429, 2.0)
        assert server.url + "/v1/chat/completions" in str(error)

    @pytest.mark.parametrize(
        ("headers", "retry_after"),
        [
            pytest.param((("retry-after-ms", "1500"), ("Retry-After", "2")), 1.5, id="ms-first"),
            pytest.param((("Retry-After", "0.25"),), 0.25, id="seconds"),
            pytest.param((("Retry-After", "Wed, 21 Oct 2015 07:28:00 GMT"),), None, id="date"),
            pytest.param((("Retry-After", "-1"), ("retry-after-ms", "nan")), None, id="negative"),
            pytest.param((), None, id="none"),
        ],
    )
    def test_retry_after_forms(
        self, server: Server, headers: Tuple[Tuple[str, str], ...], retry_after: Optional[float]
    ) -> None:
        server.script(Reply([b"busy"], status=503, headers=headers))
        error = failure(openai(server))
        assert (error.status, error.retry_after) == (503, retry_after)
        assert "HTTP 503 Service Unavailable: busy" in str(error)

    @pytest.mark.parametrize(
        ("body", "text"),
        [
            pytest.param(
                b'{"type": "error", "error": {"type": "authentication_error", '
                b'"message": "invalid x-api-key"}}',
                "authentication_error: invalid x-api-key",
                id="anthropic",
            ),
            pytest.param(
                b'{"error": {"message": "model not found"}}', "model not found", id="no-type"
            ),
            pytest.param(
                b'{"error": "model \'x\' not found"}', "model 'x' not found", id="ollama"
            ),
            pytest.param(b'{"message": "Unauthorized"}', "Unauthorized", id="message"),
            pytest.param(b'{"detail": "nope"}', '{"detail": "nope"}', id="other-json"),
            pytest.param(b"[1]", "[1]", id="array"),
            pytest.param(b"", "(no body)", id="empty"),
            pytest.param(b"x" * 300, "x" * 200 + "...", id="long"),
        ],
    )
    def test_the_provider_error_text(self, server: Server, body: bytes, text: str) -> None:
        server.script(Reply([body], status=401))
        error = failure(anthropic(server))
        assert str(error).endswith(f"/v1/messages answered HTTP 401 Unauthorized: {text}")
        assert error.status == 401

    def test_an_error_body_that_never_arrives(self, server: Server) -> None:
        headers = (("Content-Type", "application/json"), ("Content-Length", "100"))
        server.script(Reply([b"{"], status=500, headers=headers, stall=True))
        error = failure(openai(server, timeout=0.2))
        assert str(error).endswith("answered HTTP 500 Internal Server Error: (no body)")

    def test_json_instead_of_a_stream(self, server: Server) -> None:
        headers = (("Content-Type", "application/json"),)
        server.script(Reply([b'{"choices": []}'], headers=headers))
        _, result = settle(openai(server))
        assert_stream_error(result, "answered with JSON, not an event stream", '{"choices": []}')

    def test_connection_refused_names_the_address(self) -> None:
        port = _free_port()
        model = providers.OpenAIChatModel("m", base_url=f"http://127.0.0.1:{port}/v1", timeout=0.5)
        _, result = settle(model)
        assert_stream_error(
            result, f"cannot connect to http://127.0.0.1:{port}/v1/chat/completions"
        )

    def test_a_server_that_hangs_up(self, server: Server) -> None:
        server.script(Reply(hang_up=True))
        _, result = settle(anthropic(server))
        assert_stream_error(result, "the request to", "failed: RemoteDisconnected")

    def test_a_chunked_stream_cut_inside_a_chunk(self, server: Server) -> None:
        # Chunked framing written by hand: the body stops inside a chunk of 0x40 bytes.
        headers = (("Content-Type", "text/event-stream"), ("Transfer-Encoding", "chunked"))
        server.script(Reply([b"40\r\ndata: {"], headers=headers))
        _, result = settle(openai(server))
        assert_stream_error(result, "the connection to", "broke: IncompleteRead")

    def test_no_head_for_timeout_seconds(self, server: Server) -> None:
        server.script(Reply([OPENAI_TEXT_STREAM], before_head=2.0))
        started = time.monotonic()
        _, result = settle(openai(server, timeout=0.3))
        assert 0.3 <= time.monotonic() - started < 1.5
        assert_stream_error(result, "sent nothing for 0.3 s")

    def test_no_byte_for_timeout_seconds_mid_stream(self, server: Server) -> None:
        server.script(Reply([openai_chunk({"content": "Hi"})], stall=True))
        started = time.monotonic()
        events, result = settle(openai(server, timeout=0.3))
        assert 0.3 <= time.monotonic() - started < 1.5
        assert_stream_error(result, "sent nothing for 0.3 s")
        assert [event.type for event in events] == [
            "message.accepted",
            "model.chunk",
            "run.finished",
        ]

    def test_pauses_shorter_than_the_timeout_are_fine(self, server: Server) -> None:
        parts = [openai_chunk({"content": "a"}), openai_chunk({"content": "b"}), DONE]
        server.script(Reply(parts, pause=0.15))
        _, result = settle(openai(server, timeout=0.5))
        assert result.status == "completed"
        assert result.final_text == "ab"


class TestCancellation:
    """A set signal closes the connection at once; so does the consumer's close()."""

    @pytest.mark.parametrize(
        "reply",
        [
            pytest.param(Reply(before_head=_BOUND), id="before-the-head"),
            pytest.param(Reply([openai_chunk({"content": "Hi"})], stall=True), id="mid-stream"),
            pytest.param(
                Reply(
                    [b"5\r\ndata:\r\n"],
                    stall=True,
                    headers=(
                        ("Content-Type", "text/event-stream"),
                        ("Transfer-Encoding", "chunked"),
                    ),
                ),
                id="chunked",
            ),
        ],
    )
    def test_within_a_quarter_second_even_if_the_server_sends_nothing(
        self, server: Server, reply: Reply
    ) -> None:
        server.script(reply)
        signal = threading.Event()
        set_at: List[float] = []

        def cancel() -> None:
            time.sleep(0.2)
            set_at.append(time.monotonic())
            signal.set()

        canceller = threading.Thread(target=cancel)
        canceller.start()
        _, result = settle(openai(server, timeout=_BOUND), signal=signal)
        ended = time.monotonic()
        canceller.join(_BOUND)
        assert result.status == "cancelled"
        assert ended - set_at[0] < 0.25
        assert server.disconnected.wait(_BOUND)
        assert _watchers_end()

    def test_a_signal_set_before_connecting(self, server: Server) -> None:
        signal = threading.Event()
        signal.set()
        with pytest.raises(providers.ProviderError, match="was cancelled"):
            stream(openai(server), signal=signal)
        assert server.requests == []

    def test_the_consumers_close_closes_the_connection(self, server: Server) -> None:
        server.script(Reply([openai_chunk({"content": "Hi"})], stall=True))
        run = al.run_agent_loop(
            messages=[al.UserMessage("u", "Hi")],
            model=openai(server, timeout=_BOUND),
            tools=al.ToolRegistry(),
            max_steps=1,
        )
        assert next(run).type == "message.accepted"
        assert next(run).type == "model.chunk"
        run.close()
        assert server.disconnected.wait(1.0)
        assert _watchers_end()

    def test_watchers_end_after_complete_and_failed_streams(self, server: Server) -> None:
        server.script(Reply([OPENAI_TEXT_STREAM]), Reply([b"x"], status=500))
        stream(openai(server))
        failure(openai(server))
        assert _watchers_end()


# --- Wire formats -------------------------------------------------------------------


class TestServerEvents:
    """The event-stream parser, from byte strings alone."""

    def parse(self, *reads: bytes) -> List[Tuple[str, str]]:
        parser = providers._ServerEvents()
        return [(event.event, event.data) for data in reads for event in parser.feed(data)]

    @pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
    def test_line_endings(self, ending: bytes) -> None:
        stream = b"event: a" + ending + b"data: 1" + ending + b"data:2" + ending + ending
        assert self.parse(stream) == [("a", "1\n2")]

    def test_any_split_gives_the_same_events(self) -> None:
        whole = (
            b': comment\r\nevent: x\r\ndata: {"a": "\xc3\xa9"}\r\nid: 7\r\nretry: 9\r\n\r\n'
            b"data\r\n\r\n"
        )
        expected = [("x", '{"a": "\u00e9"}'), ("", "")]
        assert self.parse(whole) == expected
        assert self.parse(*[whole[i : i + 1] for i in range(len(whole))]) == expected
        for cut in range(len(whole)):
            assert self.parse(whole[:cut], whole[cut:]) == expected

    def test_a_cr_at_the_end_of_a_read_then_another_line(self) -> None:
        assert self.parse(b"data: a\r", b"\r", b"data: b\r\r") == [("", "a"), ("", "b")]

    def test_a_blank_line_without_data_dispatches_nothing_and_resets_the_type(self) -> None:
        assert self.parse(b"event: a\n\ndata: b\n\n") == [("", "b")]

    def test_an_event_open_at_the_end_is_not_dispatched(self) -> None:
        assert self.parse(b"data: a\n\ndata: b\n") == [("", "a")]

    def test_invalid_utf_8_is_malformed(self) -> None:
        with pytest.raises(providers.ProviderError, match="not UTF-8"):
            self.parse(b"data: \xff\n\n")

    def test_a_leading_byte_order_mark_is_dropped(self) -> None:
        bom = "\ufeff".encode()
        assert self.parse(bom[:1], bom[1:] + b"data: a\n\n") == [("", "a")]
        assert self.parse(b"data: \xef\xbb\xbfa\n\n") == [("", "\ufeffa")]  # only the first

    def test_a_line_at_the_limit_passes_and_one_longer_is_malformed(self) -> None:
        limit = providers._EVENT_LIMIT
        line = b"data:" + b"x" * (limit - len("data:"))
        assert self.parse(line, b"\n\n") == [("", "x" * (limit - 5))]
        with pytest.raises(providers.ProviderError, match="a line longer than 1,048,576"):
            self.parse(line + b"x")

    def test_an_event_at_the_limit_passes_and_one_longer_is_malformed(self) -> None:
        half = b"data: " + b"y" * (providers._EVENT_LIMIT // 2) + b"\n"
        assert len(self.parse(half, half, b"\n")[0][1]) == providers._EVENT_LIMIT + 1  # the LF
        with pytest.raises(providers.ProviderError, match="an event longer than 1,048,576"):
            self.parse(half, half, b"data: z\n")


class TestHelpers:
    def test_described(self) -> None:
        assert providers._described(OSError()) == "OSError"
        assert providers._described(OSError("x")) == "OSError: x"


# --- The command line ---------------------------------------------------------------


class TestCommandLine:
    """python agent_loop_providers.py --provider ... runs an agent with the demo's tools."""

    def test_openai(self, server: Server, capsys: pytest.CaptureFixture[str]) -> None:
        server.script(
            Reply([openai_call(0, "c1", "add", '{"left": 2, "right": 3}'), DONE]),
            Reply([openai_chunk({"content": "5"}), DONE]),
        )
        status = providers.main(
            [
                "--provider",
                "openai",
                "--base-url",
                server.url + "/v1",
                "--model",
                "m",
                "--system",
                "S",
                "2+3?",
            ]
        )
        out = capsys.readouterr().out
        assert status == 0
        assert out.splitlines() == [
            '  0  message.accepted  user user-001: "2+3?"',
            '  1  model.chunk       request-001 toolCall add({"left":2,"right":3}) [c1]',
            '  2  tool.started      request-001 add({"left":2,"right":3}) [c1]',
            '  3  tool.finished     request-001 add ok: {"sum":5}',
            '  4  model.chunk       request-002 text "5"',
            "  5  run.finished      completed after 2 step(s)",
            "result: completed, 2 step(s), 4 messages",
            "final text: 5",
        ]
        assert server.body()["messages"][0] == {"role": "system", "content": "S"}
        assert len(server.body()["tools"]) == 3

    def test_anthropic_json_and_a_failed_run(
        self, server: Server, capsys: pytest.CaptureFixture[str]
    ) -> None:
        server.script(Reply([b"{}"], status=500))
        status = providers.main(
            [
                "--provider",
                "anthropic",
                "--base-url",
                server.url,
                "--model",
                "m",
                "--json",
                "--max-steps",
                "1",
                "Hi",
            ]
        )
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert status == 1
        assert [line["type"] for line in lines] == ["message.accepted", "run.finished"]
        assert lines[-1]["payload"]["result"]["error"]["code"] == "MODEL_STREAM_ERROR"

    @pytest.mark.parametrize(
        "argv",
        [
            pytest.param([], id="nothing"),
            pytest.param(
                ["--provider", "x", "--base-url", "http://h", "--model", "m", "p"], id="provider"
            ),
            pytest.param(
                ["--provider", "openai", "--base-url", "ftp://h", "--model", "m", "p"], id="url"
            ),
            pytest.param(
                ["--provider", "openai", "--base-url", "http://h", "--model", "", "p"], id="model"
            ),
            pytest.param(
                [
                    "--provider",
                    "openai",
                    "--base-url",
                    "http://h",
                    "--model",
                    "m",
                    "--max-steps",
                    "0",
                    "p",
                ],
                id="steps-low",
            ),
            pytest.param(
                [
                    "--provider",
                    "openai",
                    "--base-url",
                    "http://h",
                    "--model",
                    "m",
                    "--max-steps",
                    "x",
                    "p",
                ],
                id="steps-text",
            ),
        ],
    )
    def test_bad_options_exit_2_with_usage(
        self, argv: List[str], capsys: pytest.CaptureFixture[str]
    ) -> None:
        with pytest.raises(SystemExit) as exited:
            providers.main(argv)
        assert exited.value.code == 2
        assert "usage: python agent_loop_providers.py" in capsys.readouterr().err

    def test_sigint_sets_the_signal(
        self, server: Server, capsys: pytest.CaptureFixture[str]
    ) -> None:
        server.script(Reply([openai_chunk({"content": "Thinking"})], stall=True))

        def interrupt() -> None:
            # Once the request arrived, main() has installed its handler: the server
            # holds the stream open, so main() is still running when SIGINT comes.
            if _eventually(lambda: bool(server.requests)):
                time.sleep(0.1)
                os.kill(os.getpid(), os_signal.SIGINT)

        before = os_signal.getsignal(os_signal.SIGINT)
        interrupter = threading.Thread(target=interrupt)
        interrupter.start()
        try:
            status = providers.main(
                ["--provider", "openai", "--base-url", server.url + "/v1", "--model", "m", "Hi"]
            )
        finally:
            interrupter.join(_BOUND)
        assert status == 1
        assert (
            capsys.readouterr().out.splitlines()[-1] == "result: cancelled, 1 step(s), 1 messages"
        )
        assert os_signal.getsignal(os_signal.SIGINT) is before  # restored

    def test_ctrl_c_cancels_and_prints_the_result(self, server: Server) -> None:
        server.script(Reply([openai_chunk({"content": "Thinking"})], stall=True))
        process = subprocess.Popen(
            [
                sys.executable,
                "agent_loop_providers.py",
                "--provider",
                "openai",
                "--base-url",
                server.url + "/v1",
                "--model",
                "m",
                "Hi",
            ],
            cwd=_HERE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            # The request arrives once main() has installed its handler; the server then
            # holds the stream open, so the run is waiting on the network.
            assert _eventually(lambda: bool(server.requests))
            time.sleep(0.2)
            process.send_signal(os_signal.SIGINT)
            out, err = process.communicate(timeout=_BOUND)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
        assert process.returncode == 1
        assert out.splitlines()[-4:] == [
            '  0  message.accepted  user user-001: "Hi"',
            '  1  model.chunk       request-001 text "Thinking"',
            "  2  run.finished      cancelled after 1 step(s)",
            "result: cancelled, 1 step(s), 1 messages",
        ]
        assert err == ""
        assert server.disconnected.wait(_BOUND)


# --- Integration: llmock ------------------------------------------------------------

_LLMOCK_REQUIRED = os.environ.get("AGENT_LOOP_REQUIRE_LLMOCK") == "1"
_HAS_LLMOCK = importlib.util.find_spec("llmock") is not None


@dataclass
class LLMock:
    """An ``llmock serve`` subprocess and its admin API."""

    url: str

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        call = urllib.request.Request(self.url + path, data=data, method=method)
        call.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(call, timeout=_BOUND) as answer:
            return json.loads(answer.read())

    def scenario(self, *behaviors: Dict[str, Any]) -> None:
        self.admin("POST", "/_llmock/scenario", {"behaviors": list(behaviors)})

    def requests(self) -> List[Dict[str, Any]]:
        records: List[Dict[str, Any]] = self.admin("GET", "/_llmock/requests")["requests"]
        return records

    def openai(self, **arguments: Any) -> providers.OpenAIChatModel:
        arguments.setdefault("timeout", 5.0)
        return providers.OpenAIChatModel("gpt-4o", base_url=self.url + "/v1", **arguments)

    def anthropic(self, **arguments: Any) -> providers.AnthropicMessagesModel:
        arguments.setdefault("timeout", 5.0)
        return providers.AnthropicMessagesModel(
            "claude-sonnet-4-6", base_url=self.url + "/anthropic", **arguments
        )


@pytest.fixture(scope="module")
def llmock_process() -> Iterator[LLMock]:
    if not _HAS_LLMOCK:
        if _LLMOCK_REQUIRED:
            pytest.fail("AGENT_LOOP_REQUIRE_LLMOCK=1 but llmock is not importable")
        pytest.skip("llmock (Python >= 3.10) is not installed: run `tox -e llmock`")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable,
        "-m",
        "llmock.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    process = subprocess.Popen(
        [*command, "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30.0
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=1.0):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"llmock serve did not start on {url}")
                time.sleep(0.1)
        yield LLMock(url)
    finally:
        process.terminate()
        try:
            process.wait(_BOUND)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(_BOUND)


@pytest.fixture
def mock(llmock_process: LLMock) -> LLMock:
    llmock_process.admin("POST", "/_llmock/reset", {})
    return llmock_process


_BOTH = pytest.mark.parametrize("provider", ["openai", "anthropic"])


def _model(mock: LLMock, provider: str, **arguments: Any) -> al.Model:
    return mock.openai(**arguments) if provider == "openai" else mock.anthropic(**arguments)


@pytest.mark.llmock
class TestLLMock:
    """Both adapters through run_agent_loop against llmock 0.2.2's real servers."""

    @_BOTH
    def test_a_tool_round_trip(self, mock: LLMock, provider: str) -> None:
        mock.scenario(
            {
                "type": "reply",
                "text": "Adding.",
                "tool_calls": [{"name": "add", "arguments": {"left": 20, "right": 22}}],
            },
            {"type": "reply", "text": "The sum is 42."},
        )
        events, result = settle(_model(mock, provider, system="Be brief."), "Add 20 and 22.")
        assert result.status == "completed", result.error
        assert result.final_text == "The sum is 42."
        assert result.messages[2].content == '{"sum":42}'
        streamed = "".join(
            event.payload["chunk"].text
            for event in events
            if event.type == "model.chunk" and isinstance(event.payload["chunk"], al.TextDelta)
        )
        assert streamed == "Adding.The sum is 42."
        first, second = mock.requests()
        assert first["body"]["stream"] is True
        assert first["status"] == 200
        call = result.messages[1].content[-1]
        assert isinstance(call, al.ToolCall)
        if provider == "openai":
            assert first["path"] == "/v1/chat/completions"
            assert first["body"]["messages"][0] == {"role": "system", "content": "Be brief."}
            assert second["body"]["messages"][-1] == {
                "role": "tool",
                "tool_call_id": call.id,
                "content": '{"sum":42}',
            }
        else:
            assert first["path"] == "/anthropic/v1/messages"
            assert first["body"]["system"] == "Be brief."
            assert second["body"]["messages"][-1]["content"] == [
                {
                    "type": "tool_result",
                    "tool_use_id": call.id,
                    "content": '{"sum":42}',
                    "is_error": False,
                }
            ]

    @_BOTH
    def test_two_calls_and_a_recoverable_tool_error(self, mock: LLMock, provider: str) -> None:
        mock.scenario(
            {
                "type": "reply",
                "tool_calls": [
                    {"name": "multiply", "arguments": {"left": 6, "right": 7}},
                    {"name": "weather", "arguments": {"city": "Atlantis"}},
                ],
            },
            {"type": "reply", "text": "42, and no weather."},
        )
        _, result = settle(_model(mock, provider))
        assert result.status == "completed", result.error
        assert [message.role for message in result.messages] == [
            "user",
            "assistant",
            "toolResult",
            "toolResult",
            "assistant",
        ]
        assert isinstance(result.messages[3], al.ToolResultMessage)
        assert result.messages[3].is_error
        sent = mock.requests()[1]["body"]["messages"]
        if provider == "anthropic":  # both results in one user turn
            assert [block["is_error"] for block in sent[-1]["content"]] == [False, True]

    @_BOTH
    @pytest.mark.parametrize("status", [429, 500])
    def test_http_errors_keep_retry_after(self, mock: LLMock, provider: str, status: int) -> None:
        mock.scenario({"type": "fail", "status": status, "retry_after": 3})
        _, result = settle(_model(mock, provider))
        error = assert_stream_error(result, f"HTTP {status}")
        assert (error.status, error.retry_after) == (status, 3.0)
        assert mock.requests()[0]["status"] == status

    @_BOTH
    @pytest.mark.parametrize(
        ("kind", "words"),
        [
            pytest.param("disconnect", ["broke"], id="disconnect"),
            pytest.param("truncate", ["ended before"], id="truncate"),
            pytest.param("malformed", ["malformed event"], id="malformed"),
        ],
    )
    def test_stream_faults(self, mock: LLMock, provider: str, kind: str, words: List[str]) -> None:
        mock.scenario(
            {"type": "reply", "text": "one two three four five six"},
            {"type": "stream_fault", "kind": kind, "after_chunks": 3},
        )
        _, result = settle(_model(mock, provider))
        assert_stream_error(result, *words)
        assert len(result.messages) == 1

    @_BOTH
    def test_a_stall_longer_than_the_timeout(self, mock: LLMock, provider: str) -> None:
        mock.scenario(
            {"type": "reply", "text": "one two three"},
            {"type": "stream_fault", "kind": "stall", "after_chunks": 2, "stall_seconds": 5},
        )
        _, result = settle(_model(mock, provider, timeout=0.3))
        assert_stream_error(result, "sent nothing for 0.3 s")

    @_BOTH
    def test_a_stall_is_cancelled_within_a_quarter_second(
        self, mock: LLMock, provider: str
    ) -> None:
        mock.scenario(
            {"type": "reply", "text": "one two three"},
            {"type": "stream_fault", "kind": "stall", "after_chunks": 2, "stall_seconds": 5},
        )
        signal = threading.Event()
        set_at: List[float] = []

        def cancel() -> None:
            time.sleep(0.3)
            set_at.append(time.monotonic())
            signal.set()

        canceller = threading.Thread(target=cancel)
        canceller.start()
        _, result = settle(_model(mock, provider, timeout=_BOUND), signal=signal)
        ended = time.monotonic()
        canceller.join(_BOUND)
        assert result.status == "cancelled"
        assert ended - set_at[0] < 0.25

    @_BOTH
    def test_slow_first_token_within_the_timeout(self, mock: LLMock, provider: str) -> None:
        mock.scenario(
            {"type": "reply", "text": "late"}, {"type": "slow_first_token", "seconds": 0.3}
        )
        _, result = settle(_model(mock, provider, timeout=2.0))
        assert result.status == "completed"
        assert result.final_text == "late"

    @_BOTH
    def test_slow_first_token_beyond_the_timeout(self, mock: LLMock, provider: str) -> None:
        mock.scenario(
            {"type": "reply", "text": "late"}, {"type": "slow_first_token", "seconds": 2}
        )
        _, result = settle(_model(mock, provider, timeout=0.3))
        assert_stream_error(result, "sent nothing for 0.3 s")

    @_BOTH
    def test_malformed_tool_arguments(self, mock: LLMock, provider: str) -> None:
        mock.scenario({"type": "tool_fault", "kind": "malformed_arguments"})
        _, result = settle(_model(mock, provider))
        assert_stream_error(result, "has arguments that are not JSON")

    @_BOTH
    def test_a_cut_answer(self, mock: LLMock, provider: str) -> None:
        mock.scenario({"type": "reply", "text": "cut short", "finish_reason": "length"})
        _, result = settle(_model(mock, provider))
        assert_stream_error(result, "the answer was cut")
