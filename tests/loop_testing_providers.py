"""Tests only (not collected by pytest, not installed): the providers' builders and server.

The providers' test files (test_agent_loop_providers.py, its _failures, _retries and
_connection siblings) import the providers' builders from here: event streams built and
recorded; the transport seam's builders (Canned, an Exchange with a head and scripted
reads, given to a model through a CannedTransport; posted(), what a model sends; Hurried,
a signal whose waits are short and recorded, for the retry tests); answers fed from bytes
alone (new_answer(), parsed()); and settle_prompt(), their driver (with the command line's
tools, agent_loop_cli.TOOLS). Its last section is the fixture server (serving()), a local
http.server that test_agent_loop_providers_connection.py and test_agent_loop_cli.py run
the adapters against, and free_port() for the tests that start a server of their own
(the MCP SDK's, the real model's).
"""

from __future__ import annotations

import contextlib
import http
import http.server
import json
import logging
import re
import select
import socket
import ssl
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import (
    Any,
    Callable,
    Dict,
    Iterator,
    List,
    Mapping,
    NoReturn,
    Optional,
    Sequence,
    Tuple,
    Type,
    Union,
    cast,
)

import pytest

import agent_loop as al
import agent_loop_cli as cli
import agent_loop_providers as providers

# --- The providers' builders ------------------------------------------------------------
#
# What both provider test files use: the providers' event streams, built and recorded, the
# transport seam (canned exchanges, no socket: the models' public transport= argument)
# and the one driver of a prompt (settle_prompt). A builder that one of the two files
# alone uses stays in that file.


def openai_chunk(delta: Optional[Dict[str, Any]] = None, finish: Optional[str] = None) -> bytes:
    """One Chat Completions chunk: a choice with its delta, and its finish_reason."""
    choice = {"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}
    data = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [choice]}
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def openai_call(index: int, id: Optional[str], name: Optional[str], arguments: str) -> bytes:
    """A chunk with one tool-call fragment (its id and name where not None)."""
    fragment: Dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if id is not None:
        fragment["id"] = id
        fragment["type"] = "function"
    if name is not None:
        fragment["function"]["name"] = name
    return openai_chunk({"tool_calls": [fragment]})


DONE = b"data: [DONE]\n\n"
STOP = openai_chunk({}, "stop")
"""The finish of a complete answer: [DONE] alone is not one (require_finish_reason)."""


def anthropic_event(type: str, **fields: Any) -> bytes:
    """One Messages event of that type, its name on the event line."""
    return f"event: {type}\ndata: {json.dumps({'type': type, **fields})}\n\n".encode()


def anthropic_start(index: Any, block: Any) -> bytes:
    """content_block_start of block at index."""
    return anthropic_event("content_block_start", index=index, content_block=block)


def anthropic_delta(index: int, **delta: Any) -> bytes:
    """content_block_delta of the block at index."""
    return anthropic_event("content_block_delta", index=index, delta=delta)


def anthropic_stop(index: int) -> bytes:
    """content_block_stop of the block at index."""
    return anthropic_event("content_block_stop", index=index)


def anthropic_text(index: int, *pieces: str) -> List[bytes]:
    """A text block: its start, a text_delta per piece, its stop."""
    block = {"type": "text", "text": ""}
    return [
        anthropic_start(index, block),
        *[anthropic_delta(index, type="text_delta", text=piece) for piece in pieces],
        anthropic_stop(index),
    ]


def anthropic_tool(index: int, id: str, name: str, *fragments: str) -> List[bytes]:
    """A tool_use block: its start, an input_json_delta per fragment, its stop."""
    block = {"type": "tool_use", "id": id, "name": name, "input": {}}
    return [
        anthropic_start(index, block),
        *[
            anthropic_delta(index, type="input_json_delta", partial_json=fragment)
            for fragment in fragments
        ],
        anthropic_stop(index),
    ]


MESSAGE_START = anthropic_event(
    "message_start", message={"id": "msg_1", "type": "message", "role": "assistant", "content": []}
)


def anthropic_end(stop_reason: Optional[str] = "end_turn", usage: Any = None) -> List[bytes]:
    """The end of a message: message_delta with its stop_reason and usage, message_stop."""
    return [
        anthropic_event("message_delta", delta={"stop_reason": stop_reason}, usage=usage or {}),
        anthropic_event("message_stop"),
    ]


def anthropic_thinking(index: int, *pieces: str, signature: Optional[str] = "sig") -> List[bytes]:
    """A thinking block: its deltas, then its signature_delta (None: none), then its stop."""
    block = {"type": "thinking", "thinking": "", "signature": ""}
    parts = [
        anthropic_start(index, block),
        *[anthropic_delta(index, type="thinking_delta", thinking=piece) for piece in pieces],
    ]
    if signature is not None:
        delta = {"type": "signature_delta", "signature": signature}
        parts.append(anthropic_event("content_block_delta", index=index, delta=delta))
    return [*parts, anthropic_stop(index)]


def sse(data: Any, event: Optional[str] = None) -> bytes:
    """One server-sent event of JSON data, with its event line if given."""
    head = b"" if event is None else b"event: " + event.encode() + b"\n"
    return head + b"data: " + json.dumps(data).encode() + b"\n\n"


def openai_sent_call(id: str, name: str, arguments: str) -> Dict[str, Any]:
    """A tool call as the OpenAI adapter sends it back."""
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}


def anthropic_sent_result(id: str, content: str, is_error: bool) -> Dict[str, Any]:
    """A tool result as the Anthropic adapter sends it."""
    return {"type": "tool_result", "tool_use_id": id, "content": content, "is_error": is_error}


PROVIDERS = pytest.mark.parametrize("provider", ["openai", "anthropic"])
"""A test for each adapter, named by its provider."""

AnswerItem = Union[str, al.ThinkingBlock, Tuple[str, str, Dict[str, Any]]]
"""One piece of a scripted answer: a text delta, a thinking delta (a ThinkingBlock of its
text), or a tool call (id, name, arguments)."""


def answer_parts(
    provider: str, items: Sequence[AnswerItem], end: Optional[str] = None
) -> List[bytes]:
    """The provider's event stream for items, one event per delta, with its end.

    Anthropic: each run of text or of thinking is one block (a thinking block's signature
    is ``sig-<index>``). ``end`` is the finish (OpenAI) or stop (Anthropic) reason; None:
    the usual one.
    """
    parts: List[bytes] = []
    if provider == "openai":
        calls = 0
        for item in items:
            if isinstance(item, str):
                parts.append(openai_chunk({"content": item}))
            elif isinstance(item, al.ThinkingBlock):
                parts.append(openai_chunk({"reasoning_content": item.thinking}))
            else:
                parts.append(openai_call(calls, item[0], item[1], json.dumps(item[2])))
                calls += 1
        return [*parts, openai_chunk({}, end or "stop"), DONE]
    parts.append(MESSAGE_START)
    index = 0
    open_block: Optional[str] = None  # the type of the block being streamed
    for item in items:
        kind = "text" if isinstance(item, str) else "thinking"
        if open_block is not None and (isinstance(item, tuple) or kind != open_block):
            parts.extend(anthropic_block_end(index, open_block))
            index += 1
            open_block = None
        if isinstance(item, tuple):
            parts.extend(anthropic_tool(index, item[0], item[1], json.dumps(item[2])))
            index += 1
            continue
        if open_block is None:
            parts.append((anthropic_text if kind == "text" else anthropic_thinking)(index)[0])
            open_block = kind
        if isinstance(item, str):
            delta = {"type": "text_delta", "text": item}
        else:
            delta = {"type": "thinking_delta", "thinking": item.thinking}
        parts.append(anthropic_event("content_block_delta", index=index, delta=delta))
    if open_block is not None:
        parts.extend(anthropic_block_end(index, open_block))
    return [*parts, *anthropic_end(end or "end_turn")]


def anthropic_block_end(index: int, kind: str) -> List[bytes]:
    """The end of a text or thinking block: a thinking block's signature, then its stop."""
    stop = anthropic_stop(index)
    if kind == "text":
        return [stop]
    delta = {"type": "signature_delta", "signature": f"sig-{index}"}
    return [anthropic_event("content_block_delta", index=index, delta=delta), stop]


def in_pieces(data: bytes, size: int = 7) -> List[bytes]:
    """data cut every size bytes: events, lines and characters split anywhere."""
    return [data[start : start + size] for start in range(0, len(data), size)]


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
# Reasoning and the usage chunk (after the finish, before [DONE]) in the shape
# DeepSeek's API streams them: reasoning_content deltas, then content, then usage with
# its details (prompt_tokens includes the cached tokens, completion_tokens the
# reasoning ones).
OPENAI_REASONING_STREAM = (
    b'data: {"id":"d1","object":"chat.completion.chunk","created":1,"model":"deepseek-reasoner",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":null,"reasoning_content":'
    b'""},"logprobs":null,"finish_reason":null}],"usage":null}\n\n'
    b'data: {"id":"d1","object":"chat.completion.chunk","created":1,"model":"deepseek-reasoner",'
    b'"choices":[{"index":0,"delta":{"content":null,"reasoning_content":"27 * 453: "},'
    b'"logprobs":null,"finish_reason":null}],"usage":null}\n\n'
    b'data: {"id":"d1","object":"chat.completion.chunk","created":1,"model":"deepseek-reasoner",'
    b'"choices":[{"index":0,"delta":{"content":null,"reasoning_content":"10,800 + 1,431."},'
    b'"logprobs":null,"finish_reason":null}],"usage":null}\n\n'
    b'data: {"id":"d1","object":"chat.completion.chunk","created":1,"model":"deepseek-reasoner",'
    b'"choices":[{"index":0,"delta":{"content":"12,231","reasoning_content":null},'
    b'"logprobs":null,"finish_reason":null}],"usage":null}\n\n'
    b'data: {"id":"d1","object":"chat.completion.chunk","created":1,"model":"deepseek-reasoner",'
    b'"choices":[{"index":0,"delta":{"content":"","reasoning_content":null},'
    b'"logprobs":null,"finish_reason":"stop"}],"usage":null}\n\n'
    b'data: {"id":"d1","object":"chat.completion.chunk","created":1,"model":"deepseek-reasoner",'
    b'"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":45,"total_tokens":65,'
    b'"prompt_tokens_details":{"cached_tokens":16},"completion_tokens_details":'
    b'{"reasoning_tokens":41},"prompt_cache_hit_tokens":16,"prompt_cache_miss_tokens":4}}\n\n'
    b"data: [DONE]\n\n"
)


REASONING_USAGE = al.Usage(4, 45, cache_read_tokens=16, reasoning_tokens=41)
"""What OPENAI_REASONING_STREAM's usage chunk says."""


def request(
    messages: Sequence[al.Message] = (), tools: Sequence[al.ToolSpec] = (), id: str = "request-001"
) -> al.ModelRequest:
    """A ModelRequest of messages (one user message if none) and tools."""
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


class Canned:
    """A canned exchange: a head and scripted reads, no socket; what a Transport returns.

    It records the request it answered (``url``, ``request_headers`` by lower-case name,
    ``body`` as JSON), counts its reads and closes. Its transport raises ``failure``
    instead of returning it, when there is one. Each ``read()`` returns the next part (or
    raises it, when it is an error), then b"" (the end of the input).
    """

    def __init__(
        self,
        parts: Sequence[Union[bytes, providers.ProviderError]] = (),
        *,
        status: int = 200,
        headers: Optional[Mapping[str, str]] = None,
        failure: Optional[providers.ProviderError] = None,
    ) -> None:
        self.parts = list(parts)
        self.status = status
        self.reason = next((s.phrase for s in http.HTTPStatus if s.value == status), "")
        given = {"Content-Type": "text/event-stream"} if headers is None else headers
        self.headers = {name.lower(): value for name, value in given.items()}
        self.failure = failure
        self.reads = 0
        self.closes = 0
        self.url = ""
        self.request_headers: Dict[str, str] = {}
        self.body: Dict[str, Any] = {}

    def read(self) -> bytes:
        self.reads += 1
        part = self.parts.pop(0) if self.parts else b""
        if isinstance(part, providers.ProviderError):
            raise part
        return part

    def close(self) -> None:
        self.closes += 1

    @property
    def closed(self) -> bool:
        return self.closes > 0


Attempt = Union[Sequence[bytes], Canned]
"""One attempt of a CannedTransport: the parts of a 200 event stream, or a Canned."""


class CannedTransport:
    """A Transport that answers each attempt with the next Canned exchange, in order."""

    def __init__(self, *attempts: Attempt) -> None:
        self.exchanges = [
            attempt if isinstance(attempt, Canned) else Canned(attempt) for attempt in attempts
        ]
        self.opened = 0

    def __call__(
        self, url: str, headers: Mapping[str, str], body: bytes, signal: al.Signal
    ) -> Canned:
        exchange = self.exchanges[self.opened]
        self.opened += 1
        exchange.url = url
        exchange.request_headers = {name.lower(): value for name, value in headers.items()}
        exchange.body = json.loads(body)
        if exchange.failure is not None:
            raise exchange.failure
        return exchange


AnyModel = Union[providers.OpenAIChatModel, providers.AnthropicMessagesModel]


def canned_openai(
    *attempts: Attempt, model: str = "test-model", **arguments: Any
) -> providers.OpenAIChatModel:
    """An OpenAIChatModel on a CannedTransport of attempts (retries 0 unless given)."""
    arguments.setdefault("retries", 0)
    arguments.setdefault("base_url", "http://canned/v1")
    return providers.OpenAIChatModel(model, transport=CannedTransport(*attempts), **arguments)


def canned_anthropic(
    *attempts: Attempt, model: str = "test-model", **arguments: Any
) -> providers.AnthropicMessagesModel:
    """An AnthropicMessagesModel on a CannedTransport of attempts (retries 0 unless given)."""
    arguments.setdefault("retries", 0)
    arguments.setdefault("base_url", "http://canned")
    return providers.AnthropicMessagesModel(
        model, transport=CannedTransport(*attempts), **arguments
    )


def canned_model(provider: str, *attempts: Attempt, **arguments: Any) -> AnyModel:
    """The provider's canned model (canned_openai or canned_anthropic)."""
    if provider == "openai":
        return canned_openai(*attempts, **arguments)
    return canned_anthropic(*attempts, **arguments)


def exchanges(model: AnyModel) -> List[Canned]:
    """The canned exchanges of a model on a CannedTransport, the ones not opened too."""
    return cast(CannedTransport, model.transport).exchanges


def posted(model: AnyModel, model_request: al.ModelRequest) -> Dict[str, Any]:
    """What the model sends for a request, through its CannedTransport (which answers
    it): url, headers (by lower-case name), body."""
    provider = "openai" if isinstance(model, providers.OpenAIChatModel) else "anthropic"
    exchanges(model).append(Canned(answer_parts(provider, ["Hi."])))
    stream(model, model_request)
    sent = exchanges(model)[-1]
    return {"url": sent.url, "headers": sent.request_headers, "body": sent.body}


def assert_stream_error(
    result: al.RunResult,
    *words: str,
    kind: Type[providers.ProviderError] = providers.ProviderError,
) -> providers.ProviderError:
    """The run failed MODEL_STREAM_ERROR with a kind (a ProviderError, or a subclass) whose
    message says words; the loop's message names the error's class."""
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.code == "MODEL_STREAM_ERROR"
    error = result.error.exception
    assert isinstance(error, kind), error
    prefix = f"the model's stream raised {type(error).__name__}: "
    assert result.error.message.startswith(prefix), result.error.message
    for word in words:
        assert word in result.error.message
    return error


class Hurried(threading.Event):
    """A run's signal whose waits last at most 10 ms (each must have a bound), each one
    recorded in ``waits``: the retry tests wait for no backoff, and see the waits asked
    for."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: List[Optional[float]] = []

    def wait(self, timeout: Optional[float] = None) -> bool:
        self.waits.append(timeout)
        # The adapters' waits are all bounded: one without a bound would hang the test.
        assert timeout is not None, "a wait without a bound"
        return super().wait(min(timeout, 0.01))


def backoff_bounds(retried: int) -> Tuple[float, float]:
    """The rule's bounds on the wait before retry number retried + 1 when the server says
    none: 0.5 s doubled per retry, at most 8 s, shortened by a jitter of up to a quarter."""
    full = min(0.5 * 2.0**retried, 8.0)
    return 0.75 * full, full


def logged_delay(line: str) -> float:
    """The seconds a retry's log line says it waits, rounded to 3 significant digits: a
    wait just above the jitter's lower bound is logged as the bound itself."""
    found = re.search(r"; retrying in (\S+) s$", line)
    assert found is not None, line
    return float(found.group(1))


def retry_logs(caplog: pytest.LogCaptureFixture) -> List[str]:
    """The retries the socket loop logged."""
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "agent_loop.providers" and record.levelno == logging.WARNING
    ]


ROLE = openai_chunk({"role": "assistant", "content": ""})  # a first chunk with no text


def settle_prompt(
    model: al.Model,
    prompt: str = "What is 2 + 3?",
    signal: Any = None,
    max_steps: int = 4,
    on_event: Optional[Callable[[al.Event], object]] = None,
) -> Tuple[List[al.Event], al.RunResult]:
    """A run of model on one user message with the command line's tools, drained by
    al.settle_run (on_event called with each event): its events and its result."""
    return al.settle_run(
        al.run_agent_loop(
            messages=[al.UserMessage("user-001", prompt)],
            model=model,
            tools=al.ToolRegistry(cli.TOOLS),
            max_steps=max_steps,
            signal=signal,
        ),
        on_event,
    )


# A transcript with every kind of message, for the request conversions.
REQUEST_HISTORY: Tuple[al.Message, ...] = (
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
SPECS = tuple(tool.spec() for tool in cli.TOOLS)
"""The command line's tools, as a request sends them."""


def chunk_texts(events: Sequence[al.Event]) -> List[Union[str, al.ToolCall]]:
    """What the step streamed: each chunk's text, or its tool call."""
    chunks = [event.payload["chunk"] for event in events if event.type == "model.chunk"]
    return [chunk.text if isinstance(chunk, al.TextDelta) else chunk.tool_call for chunk in chunks]


# --- Answers, from bytes alone (the three providers test files share them) -----------


def anthropic_redacted(index: int, data: str) -> List[bytes]:
    """A redacted_thinking block: whole in its start, no delta."""
    block = {"type": "redacted_thinking", "data": data}
    return [
        anthropic_start(index, block),
        anthropic_stop(index),
    ]


def openai_usage(usage: Any) -> bytes:
    """The usage chunk: an empty choices list, and the usage of the whole request."""
    data = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [], "usage": usage}
    return b"data: " + json.dumps(data).encode() + b"\n\n"


Answer = Union[providers.OpenAIAnswer, providers.AnthropicAnswer]


def new_answer(provider: str, accept_truncated: bool = False) -> Answer:
    """The provider's answer parser for request()."""
    if provider == "openai":
        return providers.OpenAIAnswer(request(), accept_truncated=accept_truncated)
    return providers.AnthropicAnswer(request(), accept_truncated=accept_truncated)


MODEL_CLASSES = {
    "openai": providers.OpenAIChatModel,
    "anthropic": providers.AnthropicMessagesModel,
}
ADD = {"left": 1, "right": 2}
CANNED_URL = {
    "openai": "http://canned/v1/chat/completions",
    "anthropic": "http://canned/v1/messages",
}


def parsed(answer: Answer, *parts: bytes) -> Tuple[List[al.ModelChunk], al.ModelResponse]:
    """Feeds an answer its parts, then the end of the input: its chunks and response."""
    chunks = [chunk for part in parts for chunk in answer.feed(part)]
    chunks.extend(answer.feed(b""))
    return chunks, answer.response()


# What an OpenAI answer without a finish_reason says: the likely cause (requests at once
# that the server does not serve) first, then, at [DONE], the opt-out.
CONCURRENCY_HINT = (
    "more requests at once than the server serves (it ends an answer it interrupts so): "
    "share one model object, built with max_concurrency=N (N: what the server serves at "
    "once), among every run"
)
DONE_HINT = (
    f"(likely cause: {CONCURRENCY_HINT}; for a server that never sends a finish_reason: "
    "require_finish_reason=False)"
)
END_HINT = (
    "(the server stopped sending: the server failed on this request: its log says why; "
    f"or {CONCURRENCY_HINT})"
)


# --- The fixture server: a local http.server, for what needs a socket ------------------
#
# test_agent_loop_providers_connection.py (the exchange) and test_agent_loop_cli.py (the
# command line) run the adapters against it: 127.0.0.1, a free port, a thread, started
# and stopped by serving() whatever happens.

SERVER_BOUND = 10.0
"""Seconds the fixture server, or a test waiting on it, waits at most: nothing hangs."""


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
    held: bool = False  # after the first part, wait for one of the server's go tokens


@dataclass
class Server:
    """The fixture server's script and records."""

    url: str = ""
    replies: List[Reply] = field(default_factory=list)
    requests: List[Dict[str, Any]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    disconnected: threading.Event = field(default_factory=threading.Event)
    connections: int = 0  # accepted, whether a request came on them or not
    holding: int = 0  # held replies waiting for a go token now
    peak: int = 0  # the most held replies at once
    go: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def script(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    def body(self, number: int = 0) -> Dict[str, Any]:
        body: Dict[str, Any] = self.requests[number]["body"]
        return body


class _Handler(http.server.BaseHTTPRequestHandler):
    server_state: Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet

    def setup(self) -> None:
        super().setup()
        with self.server_state.lock:
            self.server_state.connections += 1

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
            if reply.held and not number:
                self._hold(state)
        if reply.stall:
            self._wait_for_client(state, SERVER_BOUND)
        elif reply.chunked and not any(part == b"" for part in reply.parts):
            self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True

    def _hold(self, state: Server) -> None:
        """Holds the stream open until the test gives a go token (counted while held).

        It stops counting before it writes the rest, so that a client cannot end its
        stream, and another begin, while this one still counts.
        """
        with state.lock:
            state.holding += 1
            state.peak = max(state.peak, state.holding)
        state.go.acquire(timeout=SERVER_BOUND)
        with state.lock:
            state.holding -= 1

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
    context: Optional[ssl.SSLContext] = None  # set: the server speaks TLS

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.context is None:
            super().finish_request(request, client_address)
            return
        # The handshake in the connection's own thread; the TLS socket is ours to close.
        with self.context.wrap_socket(request, server_side=True) as tls:
            super().finish_request(tls, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that left early, or refused the certificate, is part of the tests


@contextlib.contextmanager
def serving(context: Optional[ssl.SSLContext] = None) -> Iterator[Server]:
    """A fixture server on 127.0.0.1 and a free port, stopped whatever happens."""
    state = Server()
    handler = type("Handler", (_Handler,), {"server_state": state})
    httpd = _QuietServer(("127.0.0.1", 0), handler)
    httpd.context = context
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02})
    thread.start()
    scheme = "http" if context is None else "https"
    state.url = f"{scheme}://127.0.0.1:{httpd.server_address[1]}"
    try:
        yield state
    finally:
        state.release.set()
        for _ in range(64):  # a held reply ends too
            state.go.release()
        httpd.shutdown()
        httpd.server_close()
        thread.join(SERVER_BOUND)


def eventually(condition: Callable[[], bool], seconds: float = SERVER_BOUND) -> bool:
    """True once condition() is, False if it is not within seconds."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for a test's own server."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def server_process(
    name: str,
    command: Sequence[str],
    ready_url: str,
    start_bound: float,
    log: Optional[Path] = None,
) -> Iterator[None]:
    """Runs ``command``, a server on 127.0.0.1, for the block, and stops it whatever happens.

    Waits until a GET of ``ready_url`` succeeds, else fails the test naming ``name``: it
    exited, or did not answer within ``start_bound`` seconds (with the end of its output
    when ``log`` keeps it). Stops it with SIGTERM, then SIGKILL after SERVER_BOUND seconds.
    """

    def failed(why: str) -> NoReturn:
        said = f"{name} {why}"
        if log is not None:  # the end of what it printed
            said += ":\n" + log.read_bytes().decode("utf-8", "replace")[-4000:]
        pytest.fail(said)

    with contextlib.ExitStack() as stack:
        output = subprocess.DEVNULL if log is None else stack.enter_context(log.open("wb"))
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + start_bound
            while not _answers(ready_url):
                if process.poll() is not None:
                    failed(f"exited with {process.returncode}")
                if time.monotonic() > deadline:
                    failed(f"did not answer on {ready_url} within {start_bound:.0f} s")
                time.sleep(0.1)
            yield
        finally:
            process.terminate()
            try:
                process.wait(SERVER_BOUND)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(SERVER_BOUND)


def _answers(url: str) -> bool:
    """Whether a GET of url succeeds (urlopen raises OSError on a failed connection or an
    error status)."""
    try:
        with urllib.request.urlopen(url, timeout=1.0):
            return True
    except OSError:
        return False
