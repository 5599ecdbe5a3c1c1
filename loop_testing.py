"""Tests only (not collected by pytest, not installed): what the agent_loop test files share.

The core's tests (test_agent_loop.py, test_agent_loop_tools_and_ir.py,
test_agent_loop_replay.py, test_docs_and_demo.py) import their builders, their one fake
model, their one driver and its checker from here:

- builders in the seed's vocabulary: user(), call(), add_tool(), echo_tool(), stop(),
  tool_turn(), ... and the tables of JSON that is not plain (NOT_PLAIN_JSON);
- FakeModel, for what al.ScriptedModel cannot do (its docstring says what);
- run() and settle(): the one driver, which checks the run's invariants (check_run) after
  every run, and start_run() for tests that step, close or throw into a run;
- the reference model (predict(), over StepPlans) and random_script(): the oracle that
  test_agent_loop.py's random scripts are checked against.

test_agent_loop_providers.py and test_agent_loop_providers_connection.py import the
providers' builders from its next section: event streams built and recorded, Canned (a
stand-in for the exchange) and settle_prompt(), their driver (with the command line's
tools, agent_loop_cli.TOOLS). Its last section is the fixture server (serving()), a
local http.server that test_agent_loop_providers_connection.py and
test_agent_loop_cli.py run the adapters against.

It is a plain module rather than a conftest.py: a test file imports from it by name, as
it imports agent_loop, and mypy checks it like any module; pytest imports a conftest.py
itself, under a name of its choosing, so importing from one is fragile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import json
import random
import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import (
    Any,
    Callable,
    Dict,
    Generator,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
    cast,
)

import pytest

import agent_loop as al
import agent_loop_cli as cli
import agent_loop_providers as providers

# --- Builders, the one fake model, the one driver ---------------------------------------
#
# Every test builds its values with the builders below (the seed's own vocabulary), plays
# a model with al.ScriptedModel (FakeModel where a script cannot say it) and runs the loop
# with run(), which checks the run's invariants (check_run) every time.


# The seed's vocabulary: messages, calls, responses and tools.


def user(text: str = "Add 20 and 22.", id: str = "user-001") -> al.UserMessage:
    """The seed's user(): one user message."""
    return al.UserMessage(id, text)


def call(name: str, id: str, arguments: dict[str, Any]) -> al.ToolCall:
    """The seed's call(name, id, arguments)."""
    return al.ToolCall(id, name, arguments)


NUMBERS = {
    "type": "object",
    "properties": {"left": {"type": "number"}, "right": {"type": "number"}},
    "required": ["left", "right"],
    "additionalProperties": False,
}


def add_tool() -> al.Tool:
    """The seed's addTool(): returns {"sum": left + right}."""
    return al.Tool(
        "add",
        "Adds two numbers.",
        NUMBERS,
        lambda arguments, signal: {"sum": arguments["left"] + arguments["right"]},
    )


def echo_tool(executed: list[str] | None = None) -> al.Tool:
    """An echo tool that returns its ``text`` argument and records each text it ran with."""

    def echo(arguments: dict[str, Any], signal: Any) -> object:
        if executed is not None:
            executed.append(arguments["text"])
        return arguments["text"]

    schema = {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    }
    return al.Tool("echo", "Returns its text.", schema, echo)


def text(value: str) -> al.TextBlock:
    return al.TextBlock(value)


def thought(value: str, signature: str | None = None) -> al.ThinkingBlock:
    """A thinking block (streamed by al.ScriptedModel as one ThinkingDelta of its text)."""
    return al.ThinkingBlock(value, signature)


def add_call(id: str = "call-add-001") -> al.ToolCall:
    """The seed's addCall: call("add", id, {left: 20, right: 22})."""
    return call("add", id, {"left": 20, "right": 22})


def add_result(id: str = "call-add-001") -> al.ToolResultMessage:
    """The linked result of add_call(id)."""
    return al.ToolResultMessage("tool-result-" + id, id, "add", '{"sum":42}', False)


def echo_call(id: str, value: str | None = None) -> al.ToolCall:
    """An echo call of ``value``; by default its text is its own id, so that
    echo_tool(executed) records call order."""
    return call("echo", id, {"text": id if value is None else value})


def echo_result(id: str) -> al.ToolResultMessage:
    """The linked result of echo_call(id)."""
    return al.ToolResultMessage("tool-result-" + id, id, "echo", id, False)


def assistant(response_id: str, *blocks: al.TextBlock | al.ToolCall) -> al.AssistantMessage:
    """The assistant message the loop builds from response ``response_id``."""
    return al.AssistantMessage("message-" + response_id, blocks)


def stop(response_id: str, final: str = "The sum is 42.") -> Any:
    """A scripted stop response holding one text block."""
    return al.scripted_response(response_id, [text(final)], "stop")


def tool_turn(response_id: str, *blocks: al.TextBlock | al.ToolCall) -> Any:
    """A scripted toolCall response holding the given blocks."""
    return al.scripted_response(response_id, blocks, "toolCall")


def scripted_step(
    content: Sequence[Any], stop_reason: str = "toolCall", chunks: Sequence[Any] | None = None
) -> al.ScriptedResponse:
    """One scripted step, of any stop reason (even one the loop does not know)."""
    return al.scripted_response("response-001", content, cast(Any, stop_reason), chunks=chunks)


def recording_add_tool(executed: list[str]) -> al.Tool:
    """The seed's addTool() that also appends "add" to ``executed`` each time it runs."""

    def add(arguments: dict[str, Any], signal: Any) -> object:
        executed.append("add")
        return {"sum": arguments["left"] + arguments["right"]}

    return al.Tool("add", "Adds two numbers.", NUMBERS, add)


def recording_tools(executed: list[str]) -> list[al.Tool]:
    """add and echo, both recording into ``executed`` (add as "add", echo as its text)."""
    return [recording_add_tool(executed), echo_tool(executed)]


def no_arguments_tool(name: str, execute: Callable[[dict[str, Any], Any], object]) -> al.Tool:
    """A tool that takes no arguments and runs ``execute``."""
    return al.Tool(name, f"The {name} tool.", {"type": "object"}, execute)


def raising(error: BaseException) -> Callable[[dict[str, Any], Any], object]:
    """A tool function that raises ``error``."""

    def execute(arguments: dict[str, Any], signal: Any) -> object:
        raise error

    return execute


def returns(value: object) -> Callable[[dict[str, Any], Any], object]:
    """A tool function that returns ``value``."""
    return lambda arguments, signal: value


def opaque(arguments: dict[str, Any], signal: Any) -> object:
    """A tool function whose result, a set, is not JSON."""
    return {1, 2}


def copy_echo(arguments: dict[str, Any], signal: Any) -> object:
    """A module-level tool function, so that a Tool using it can be pickled."""
    return arguments["text"]


def two_parameters(arguments: Dict[str, Any], signal: al.Signal) -> object:
    return "two"


def one_call(name: str, arguments: Any = None) -> FakeModel:
    """A model that calls the tool once, then stops with "done"."""
    return FakeModel(
        al.scripted_response("r1", [al.ToolCall("c1", name, arguments or {})], "toolCall"),
        al.scripted_response("r2", [al.TextBlock("done")], "stop"),
    )


def probe_tool(received: list[dict[str, Any]], parameters: Any | None = None) -> al.Tool:
    """A tool named "probe" that records the arguments it was given and returns "ok"."""

    def execute(arguments: dict[str, Any], signal: Any) -> object:
        received.append(arguments)
        return "ok"

    schema = {"type": "object"} if parameters is None else parameters
    return al.Tool("probe", "Records its arguments.", schema, execute)


class Fatal(BaseException):
    """A BaseException that is not an Exception: no tool result can stand for it."""


PRIOR_ROUND = (
    user("Add 1 and 2.", "user-000"),
    al.AssistantMessage(
        "message-response-000", (call("add", "call-add-000", {"left": 1, "right": 2}),)
    ),
    al.ToolResultMessage("tool-result-call-add-000", "call-add-000", "add", '{"sum":3}', False),
    al.AssistantMessage("message-response-000b", (text("It is 3."),)),
    user(),
)


ADD_ROUND = (assistant("response-000", add_call()), add_result())


HISTORY: tuple[al.Message, ...] = (
    al.UserMessage("user-000", "Echo old."),
    al.AssistantMessage("message-old", (echo_call("call-old", "old"),)),
    al.ToolResultMessage("tool-result-call-old", "call-old", "echo", "old", False),
    user(),
)


HOSTILE = pytest.mark.hostile
"""The mark of attacker-style tests, for a row of a table (a class carries
``@pytest.mark.hostile``)."""

untyped: Any = al
"""The module, untyped: tests build values of the wrong type with it on purpose."""

REPOSITORY = Path(__file__).resolve().parent
"""The folder of this file and of the README it checks."""


# JSON: the one nested-JSON builder, the one not-plain-JSON table, plain comparisons.


def nested(depth: int, kinds: str = "object-array") -> Any:
    """JSON with ``depth`` nested containers around a 0: objects and arrays in turn, or
    objects only (``kinds="object"``), or arrays only (``kinds="array"``)."""
    value: Any = 0
    for level in reversed(range(depth)):
        as_object = kinds == "object" or (kinds == "object-array" and level % 2 == 0)
        value = {"k": value} if as_object else [value]
    return value


class Custom:
    """An object that is not JSON."""


def cyclic_object() -> dict[str, Any]:
    arguments: dict[str, Any] = {"a": 1}
    arguments["self"] = arguments
    return arguments


def cyclic_array() -> dict[str, Any]:
    items: list[Any] = [1]
    items.append(items)
    return {"xs": items}


def shared_array() -> dict[str, Any]:
    shared = [1, 2]
    return {"a": shared, "b": shared}


def shared_object() -> dict[str, Any]:
    shared = {"k": "v"}
    return {"xs": [shared, shared]}


DEEP_ARGUMENTS = [
    pytest.param(lambda: nested(100_000, "object"), id="nested-100000-deep-objects"),
    pytest.param(lambda: {"a": nested(100_000, "array")}, id="nested-100000-deep-arrays"),
]
"""Arguments far deeper than any bound: checking them must never raise RecursionError."""


NOT_PLAIN_JSON = [
    *DEEP_ARGUMENTS,
    pytest.param(lambda: {"x": float("nan")}, id="nan"),
    pytest.param(lambda: {"x": float("inf")}, id="inf"),
    pytest.param(lambda: {"x": [float("-inf")]}, id="minus-inf-in-array"),
    pytest.param(lambda: {"x": {1, 2}}, id="set"),
    pytest.param(lambda: {"x": frozenset()}, id="frozenset"),
    pytest.param(lambda: {"x": b"bytes"}, id="bytes"),
    pytest.param(lambda: {1: "one"}, id="int-key"),
    pytest.param(lambda: {"x": {None: 1}}, id="none-key-nested"),
    pytest.param(lambda: {"x": {("a",): 1}}, id="tuple-key"),
    pytest.param(shared_array, id="shared-list"),
    pytest.param(shared_object, id="shared-object"),
    pytest.param(cyclic_object, id="cyclic-dict"),
    pytest.param(cyclic_array, id="cyclic-list"),
    pytest.param(lambda: {"x": Custom()}, id="custom-object"),
    pytest.param(lambda: {"x": object()}, id="object"),
    pytest.param(lambda: [1], id="list-root"),
    pytest.param(lambda: "text", id="str-root"),
    pytest.param(lambda: None, id="none-root"),
]
"""Tool arguments that are not plain bounded JSON, each built fresh by its factory: plain
JSON is a dict with str keys, list, str, int, finite float, bool and None, with no object
reachable twice, within the depth bound."""


def plain_copy(value: object) -> Any:
    """A plain copy (dicts and lists) of JSON, frozen or not, to compare with a literal."""
    if isinstance(value, Mapping):
        return {key: plain_copy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_copy(item) for item in value]
    return value


def is_plain(value: object) -> bool:
    """True if value is made of dict (str keys), list and JSON scalars only."""
    if type(value) is dict:
        return all(type(key) is str and is_plain(item) for key, item in value.items())
    if type(value) is list:
        return all(is_plain(item) for item in value)
    return value is None or type(value) in (bool, int, float, str)


def same_json(left: object, right: object) -> bool:
    """JSON equality that also tells True from 1 and 1 from 1.0, and keeps key order."""
    return json.dumps(left) == json.dumps(right)


AT_LIMIT = pytest.param(True, id="at-limit")


OVER_LIMIT = pytest.param(False, id="over-limit")


# The one fake model, and the steps it plays.


Step = Callable[["FakeModel", al.ModelRequest, Any], Any]
"""A hand-written model step: called with the model, the request and the signal; what it
returns (usually a generator) is the stream."""


class FakeModel:
    """The one fake model, for what al.ScriptedModel cannot do; everywhere else the tests
    use al.ScriptedModel (run() builds one for a script of ScriptedResponses only).

    Why it exists: a ScriptedModel plays only well-formed turns, and the loop's tests also
    need models that raise (from stream() or from its generator), block on the signal,
    never end, yield chunks or return responses of the wrong type or with foreign ids, and
    streams whose closing can be observed. Each call of stream() plays the next step of its
    script: a ScriptedResponse is played as al.ScriptedModel plays it (each block of its
    chunks, else of its content, as one chunk with the active request id, then its
    response), a Step function does anything else. Like al.ScriptedModel it records
    ``requests`` and counts ``call_count``, and a call with no step left raises
    RuntimeError. What only it records: ``finalized``, the request ids whose stream's
    ``finally`` ran; ``exits``, those whose stream was closed while suspended; ``held``, a
    copy of what each request held when it was made.
    """

    def __init__(self, *steps: al.ScriptedResponse | Step) -> None:
        self._steps = steps
        self.call_count = 0
        self.requests: list[al.ModelRequest] = []
        self.finalized: list[str] = []
        self.exits: list[str] = []
        self.held: list[list[al.Message]] = []

    def stream(self, request: al.ModelRequest, signal: Any) -> Any:
        self.call_count += 1
        self.requests.append(request)
        self.held.append(list(request.messages))
        if self.call_count > len(self._steps):
            raise RuntimeError(f"FakeModel has no step left for {request.id}")
        step = self._steps[self.call_count - 1]
        if isinstance(step, al.ScriptedResponse):
            blocks = step.content if step.chunks is None else step.chunks
            request_id = request.id if step.request_id is None else step.request_id
            response = untyped.ModelResponse(
                step.id, request_id, step.content, step.stop_reason, step.usage
            )
            return stream_of(self, request, blocks, lambda request: response)
        return step(self, request, signal)


def stream_of(
    model: FakeModel,
    request: al.ModelRequest,
    stream: Sequence[object],
    response: Callable[[al.ModelRequest], object],
) -> Generator[object, None, object]:
    """Streams ``stream`` (a block becomes its chunk with the active request id; a callable
    is called with the request and what it returns is yielded), then returns the response."""
    try:
        for item in stream:
            if isinstance(item, al.TextBlock):
                yield al.TextDelta(request.id, item.text)
            elif isinstance(item, al.ThinkingBlock):
                yield al.ThinkingDelta(request.id, item.thinking)
            elif isinstance(item, al.ToolCall):
                yield al.ToolCallChunk(request.id, item)
            else:
                yield cast(Callable[[al.ModelRequest], object], item)(request)
        return response(request)
    except GeneratorExit:
        model.exits.append(request.id)
        raise
    finally:
        model.finalized.append(request.id)


def respond(
    response_id: str, content: Sequence[object], stop_reason: str
) -> Callable[[al.ModelRequest], object]:
    """A response for the active request: ModelResponse(response_id, request.id, ...)."""
    return lambda request: untyped.ModelResponse(response_id, request.id, content, stop_reason)


def stream_step(stream: Sequence[object], response: Callable[[al.ModelRequest], object]) -> Step:
    """A Step that streams ``stream`` (see stream_of), then returns ``response(request)``."""
    return lambda model, request, signal: stream_of(model, request, stream, response)


def turn(response_id: str, content: Sequence[object], stop_reason: str) -> Step:
    """A well-behaved Step: streams each block of ``content`` as one chunk."""
    return stream_step(content, respond(response_id, content, stop_reason))


def raise_error(error: BaseException) -> Callable[[al.ModelRequest], object]:
    """A stream item or response that raises ``error`` when it is reached."""

    def raiser(request: al.ModelRequest) -> object:
        raise error

    return raiser


# The one driver, and the invariants it checks after every run.


CancelAt = Union[Tuple[str, int], int, Callable[[al.Event], bool], None]
"""Where a consumer cancels: the ``[1]``-th event of type ``[0]`` (counting from 1), the
event of that sequence, or the first event for which a predicate holds."""


def start_run(
    model: Any,
    tools: Sequence[al.Tool] = (),
    *,
    messages: Iterable[Any] | None = None,
    max_steps: int = 4,
    signal: Any = None,
    request_sequence_start: int = 0,
    tool_concurrency: int = 1,
    before_tool_call: Any = None,
) -> Any:
    """The run generator, not yet started: for tests that step, close or throw into it."""
    return al.run_agent_loop(
        messages=[user()] if messages is None else messages,
        model=model,
        tools=al.ToolRegistry(tools),
        max_steps=max_steps,
        signal=signal,
        request_sequence_start=request_sequence_start,
        tool_concurrency=tool_concurrency,
        before_tool_call=before_tool_call,
    )


def model_of(steps: Sequence[al.ScriptedResponse | Step]) -> Any:
    """The model that plays ``steps``: the shipped al.ScriptedModel when every step is a
    ScriptedResponse, else a FakeModel."""
    if all(isinstance(step, al.ScriptedResponse) for step in steps):
        return al.ScriptedModel(cast(Sequence[al.ScriptedResponse], steps))
    return FakeModel(*steps)


def run(
    script: Any,
    tools: Sequence[al.Tool] = (),
    *,
    messages: Iterable[Any] | None = None,
    max_steps: int = 4,
    signal: Any = None,
    request_sequence_start: int = 0,
    cancel_at: CancelAt = None,
    tool_concurrency: int = 1,
    before_tool_call: Any = None,
) -> tuple[list[al.Event], al.RunResult, Any]:
    """The driver: starts a run and settles it (see settle), so that the run's invariants
    are checked. ``script`` is a model (anything with ``stream``) or the steps of a
    FakeModel. Returns the events, the result and the model."""
    model = script if hasattr(script, "stream") else model_of(script)
    start = [user()] if messages is None else messages
    snapshot = tuple(start) if isinstance(start, (list, tuple)) else None
    loop = start_run(
        model,
        tools,
        messages=start,
        max_steps=max_steps,
        signal=signal,
        request_sequence_start=request_sequence_start,
        tool_concurrency=tool_concurrency,
        before_tool_call=before_tool_call,
    )
    events, result = settle(
        loop,
        model,
        max_steps=max_steps,
        start=snapshot,
        signal=signal,
        cancel_at=cancel_at,
        tool_concurrency=tool_concurrency,
        consent=before_tool_call is not None,
    )
    return events, result, model


def settle(
    loop: Generator[al.Event, None, al.RunResult],
    model: Any = None,
    *,
    max_steps: int | None = None,
    start: Sequence[al.Message] | None = None,
    signal: Any = None,
    cancel_at: CancelAt = None,
    tool_concurrency: int = 1,
    consent: bool = False,
) -> tuple[list[al.Event], al.RunResult]:
    """Drains a run to its end, then checks its invariants (check_run; the deeper checks
    when the model records its requests). With ``cancel_at`` the consumer sets ``signal``
    while it holds that event (see CancelAt). ``tool_concurrency`` and ``consent`` (a
    before_tool_call was given) are the run's, for check_run. Returns the events and the
    result."""
    events: list[al.Event] = []
    while True:
        try:
            event = next(loop)
        except StopIteration as done:
            result: al.RunResult = done.value
            break
        events.append(event)
        if cancels(cancel_at, events):
            signal.set()
    recorded = hasattr(model, "requests") and hasattr(model, "call_count")
    check_run(
        events,
        result,
        model if recorded else None,
        max_steps=max_steps,
        start=start,
        tool_concurrency=tool_concurrency,
        consent=consent,
    )
    return events, result


STATUSES = ("completed", "cancelled", "maxSteps", "failed")


CODES = ("INVALID_TRANSCRIPT", "MODEL_PROTOCOL_ERROR", "MODEL_STREAM_ERROR", "TOOL_PHASE_ERROR")


EVENT_TYPES = (
    "message.accepted",
    "model.chunk",
    "tool.started",
    "tool.finished",
    "run.finished",
)


MESSAGE_TYPES = (al.UserMessage, al.AssistantMessage, al.ToolResultMessage)


def normalized(items: Sequence[object]) -> list[object]:
    """Text coalesced, and thinking coalesced, between the other kinds of block; empty
    text and thinking dropped: the seed's normalisation (thinking as the loop extends it),
    written again here so that the checker does not trust the loop's own. Text is a str
    (or a TextBlock), thinking a ThinkingBlock whose signature is ignored; it comes out as
    ("thinking", text)."""
    normalized: list[object] = []
    pending = ""
    pending_kind = ""
    for item in items:
        kind = "call"
        if isinstance(item, al.TextBlock):
            item, kind = item.text, "text"
        elif isinstance(item, str):
            kind = "text"
        elif isinstance(item, al.ThinkingBlock):
            item, kind = item.thinking, "thinking"
        if kind != "call" and item == "":
            continue
        if pending and kind != pending_kind:
            normalized.append(pending if pending_kind == "text" else ("thinking", pending))
            pending = ""
        if kind == "call":
            normalized.append(item)
        else:
            pending += cast(str, item)
            pending_kind = kind
    if pending:
        normalized.append(pending if pending_kind == "text" else ("thinking", pending))
    return normalized


def chunk_item(chunk: object) -> object:
    if isinstance(chunk, al.TextDelta):
        return chunk.text
    if isinstance(chunk, al.ThinkingDelta):
        return al.ThinkingBlock(chunk.thinking)
    assert isinstance(chunk, al.ToolCallChunk)
    return chunk.tool_call


USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
)


def summed_usage(messages: Iterable[al.Message]) -> al.Usage | None:
    """The usage of a run that appended these assistant messages, summed as the README
    says (a field unknown in one of them is unknown; no response at all is None), written
    again here so that the checker does not trust the loop's own Usage.__add__."""
    usages = [m.usage for m in messages if isinstance(m, al.AssistantMessage)]
    if not usages:
        return None
    total: dict[str, int | None] = {}
    for name in USAGE_FIELDS:
        counts = [None if usage is None else getattr(usage, name) for usage in usages]
        total[name] = None if None in counts else sum(cast("list[int]", counts))
    return al.Usage(**total)


def cancels(at: CancelAt, events: Sequence[al.Event]) -> bool:
    """True if the consumer cancels on the last of ``events`` (see CancelAt)."""
    event = events[-1]
    if isinstance(at, tuple):
        return event.type == at[0] and types_of(events).count(at[0]) == at[1]
    if isinstance(at, int):
        return event.sequence == at
    return at is not None and at(event)


def check_run(
    events: Sequence[al.Event],
    result: al.RunResult,
    model: Any = None,
    *,
    max_steps: int | None = None,
    start: Sequence[al.Message] | None = None,
    tool_concurrency: int = 1,
    consent: bool = False,
) -> None:
    """The invariants every run keeps whatever the model, the tools and the caller did,
    checked from the outside: one counter (sequences 0..n-1, no gap), exactly one
    run.finished, last, carrying the returned result; complete messages with unique ids,
    every tool result answering an earlier call. Given the ``model`` (which needs
    ``call_count`` and ``requests``), also how the requests, chunks, tools and the
    transcript agree; given ``start``, that the starting messages are the prefix. With
    ``tool_concurrency`` > 1 a group of calls is scheduled at once; with ``consent`` a
    run may be cancelled while before_tool_call asks, its last response appended."""
    # One counter: sequences 0, 1, 2, ... and exactly one run.finished, last, carrying the result.
    assert [event.sequence for event in events] == list(range(len(events)))
    kinds = [event.type for event in events]
    assert set(kinds) <= set(EVENT_TYPES)
    assert kinds.count("run.finished") == 1
    assert kinds[-1] == "run.finished"
    assert events[-1].payload["result"] is result
    status = result.status
    assert status in STATUSES
    assert (result.final_text is not None) == (status == "completed")
    if max_steps is not None:
        assert result.max_steps == (max_steps if status == "maxSteps" else None)
    assert (result.error is not None) == (status == "failed")
    code = None
    if result.error is not None:
        code = result.error.code
        assert code in CODES
        assert isinstance(result.error.message, str)
        assert result.error.message

    # message.accepted events come first.
    accepted = [event.payload["message"] for event in events if event.type == "message.accepted"]
    assert kinds[: len(accepted)] == ["message.accepted"] * len(accepted)

    # Complete protocol messages with unique ids and valid linkage.
    messages = result.messages
    assert isinstance(messages, tuple)
    assert all(type(message) in MESSAGE_TYPES for message in messages)
    assert len({message.id for message in messages}) == len(messages)
    calls: dict[str, tuple[str, int]] = {}  # call id -> (tool name, index of its message)
    answered: dict[str, int] = {}
    assistant_indexes = []
    for index, message in enumerate(messages):
        if isinstance(message, al.AssistantMessage):
            assistant_indexes.append(index)
            assert message.usage is None or type(message.usage) is al.Usage
            for block in message.content:
                assert type(block) in (al.TextBlock, al.ThinkingBlock, al.ToolCall)
                if isinstance(block, al.TextBlock):
                    assert isinstance(block.text, str)
                    continue
                if isinstance(block, al.ThinkingBlock):
                    assert isinstance(block.thinking, str)
                    assert not block.redacted or (block.thinking == "" and block.signature)
                    continue
                assert isinstance(block.id, str)
                assert block.id
                assert isinstance(block.name, str)
                assert block.name
                assert block.id not in calls, "tool-call ids are unique in a transcript"
                calls[block.id] = (block.name, index)
        elif isinstance(message, al.ToolResultMessage):
            # Every result answers an earlier call with the same tool name, exactly once.
            assert message.tool_call_id in calls
            assert calls[message.tool_call_id][0] == message.tool_name
            assert message.tool_call_id not in answered
            answered[message.tool_call_id] = index
            assert isinstance(message.content, str)
            assert isinstance(message.is_error, bool)
        else:
            assert isinstance(message.content, str)
    open_calls = [call_id for call_id in calls if call_id not in answered]
    if open_calls:
        # Only a run interrupted inside its last tool batch leaves calls without a result,
        # and only those of the last assistant message.
        assert status == "cancelled" or code == "TOOL_PHASE_ERROR"
        assert {calls[call_id][1] for call_id in open_calls} == {assistant_indexes[-1]}

    # The starting messages: accepted in order, then kept as the transcript's prefix.
    if code == "INVALID_TRANSCRIPT":
        assert kinds == ["run.finished"]
        assert messages == ()
        assert result.steps == 0
        assert result.usage is None
    else:
        assert accepted == list(messages[: len(accepted)])
        if start is not None:
            assert messages[: len(start)] == tuple(start)
            assert accepted == list(start[: len(accepted)])
            if result.steps > 0 or status != "cancelled":
                assert len(accepted) == len(start)
            start_count = len(start)
        elif result.steps > 0 or status != "cancelled":
            start_count = len(accepted)
        else:
            start_count = len(messages)
        # The run's usage: the sum over the responses it appended, and only those.
        assert result.usage == summed_usage(messages[start_count:])

    if model is None:
        return
    # The model: one call per step, within the budget; every request a prefix of the end.
    assert model.call_count == result.steps
    assert max_steps is None or result.steps <= max_steps
    requests = list(model.requests)
    assert len(requests) == result.steps
    request_ids = [request.id for request in requests]
    if request_ids:
        first = int(request_ids[0][len("request-") :])
        assert request_ids == [f"request-{n:03d}" for n in range(first, first + len(requests))]
    for request in requests:
        assert request.messages == messages[: len(request.messages)]
    if code == "INVALID_TRANSCRIPT":
        return

    # Chunks: every chunk event belongs to an opened request and carries its id.
    for event in events:
        if event.type == "model.chunk":
            assert event.payload["request_id"] in request_ids
            assert event.payload["chunk"].request_id == event.payload["request_id"]

    # No assistant message for a response whose stream was interrupted: the run added one
    # assistant message per step, except a last step that never reached tool.started or
    # completion. Each added message agrees with the chunks streamed for its request.
    added = messages[start_count:]
    added_assistants = [m for m in added if isinstance(m, al.AssistantMessage)]
    if result.steps == 0:
        assert added == ()
    else:
        last_accepted = status == "completed" or any(
            event.type == "tool.started" and event.payload["request_id"] == request_ids[-1]
            for event in events
        )
        # Cancelled or failed while before_tool_call asked about the first call (or
        # group): the response was appended and none of its calls started.
        stopped = status == "cancelled" or code == "TOOL_PHASE_ERROR"
        asked = consent and stopped and len(added_assistants) == result.steps
        assert len(added_assistants) == result.steps - 1 + int(last_accepted or asked)
    for request_id, message in zip(request_ids, added_assistants):
        streamed = [
            chunk_item(event.payload["chunk"])
            for event in events
            if event.type == "model.chunk" and event.payload["request_id"] == request_id
        ]
        assert normalized(streamed) == normalized(message.content)
        # Tools ran in assistant order, for this request only.
        started = [
            event.payload["tool_call"]
            for event in events
            if event.type == "tool.started" and event.payload["request_id"] == request_id
        ]
        message_calls = [block for block in message.content if isinstance(block, al.ToolCall)]
        assert started == message_calls[: len(started)]

    # Tools: each tool.finished carries a result that is in the transcript. The calls of
    # a group (one call; with tool_concurrency > 1, consecutive calls run at once) get
    # their tool.started events in a row, then their tool.finished events in the same
    # order, at once; a call left without one is open, and only a run that ended right
    # there leaves one (a cancelled one may keep the results that came after it).
    finished = [event for event in events if event.type == "tool.finished"]
    added_results = [m for m in added if isinstance(m, al.ToolResultMessage)]
    assert len(finished) == len(added_results)
    for event, message in zip(finished, added_results):
        assert event.payload["tool_result"] is message
        assert event.payload["tool_call"].id == message.tool_call_id
        assert event.payload["tool_call"].name == message.tool_name
    index = 0
    while index < len(events):
        group = []
        while events[index].type == "tool.started":
            group.append(events[index])
            index += 1
        if not group:
            index += 1
            continue
        assert tool_concurrency > 1 or len(group) == 1
        assert len({event.payload["request_id"] for event in group}) == 1
        group_calls = [event.payload["tool_call"] for event in group]
        last = -1  # the position in the group of the last call that finished
        unfinished: list[al.ToolCall] = []
        while events[index].type == "tool.finished":
            position = group_calls.index(events[index].payload["tool_call"])
            assert position > last
            assert events[index].payload["tool_call"] is group_calls[position]
            assert events[index].payload["request_id"] == group[0].payload["request_id"]
            unfinished += group_calls[last + 1 : position]
            last = position
            index += 1
        kept_after_open = bool(unfinished)
        unfinished += group_calls[last + 1 :]
        if unfinished:
            assert events[index].type == "run.finished"
            assert status == "cancelled" or code == "TOOL_PHASE_ERROR"
            assert not kept_after_open or status == "cancelled"
            for open_call in unfinished:
                assert open_call.id in open_calls, "no result for an open call"


def assert_failed(
    events: Sequence[al.Event], result: al.RunResult, code: str, *words: str
) -> None:
    """A failed run: well formed, status failed, the given code and a message that says
    why, naming each of ``words``."""
    check_run(events, result)
    assert result.status == "failed"
    assert isinstance(result.error, al.RunError)
    assert result.error.code == code
    assert isinstance(result.error.message, str)
    assert result.error.message
    assert result.final_text is None
    assert result.max_steps is None
    for word in words:
        assert word in result.error.message


def failure_message(result: al.RunResult, code: str) -> str:
    """The message of a failed result with this code."""
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.code == code
    return result.error.message


def only_tool_result(result: al.RunResult) -> al.ToolResultMessage:
    """The one tool result of a run's transcript."""
    [message] = [m for m in result.messages if isinstance(m, al.ToolResultMessage)]
    return message


def run_probe_call(
    arguments: Any,
) -> tuple[list[al.Event], al.RunResult, FakeModel, list[dict[str, Any]]]:
    """Runs one step that calls "probe" with ``arguments``, then a step that stops."""
    received: list[dict[str, Any]] = []
    tool_call = al.ToolCall("call-probe-001", "probe", arguments)
    events, result, model = run(
        [
            al.scripted_response("response-001", [tool_call], "toolCall"),
            al.scripted_response("response-002", [text("done")], "stop"),
        ],
        tools=[probe_tool(received)],
    )
    return events, result, model, received


def assert_no_tool_ran(
    events: list[al.Event],
    result: al.RunResult,
    model: FakeModel,
    received: list[dict[str, Any]],
) -> None:
    """Nothing of the failed step was kept: no tool ran, no assistant message was appended."""
    assert received == []
    assert "tool.started" not in types_of(events)
    assert model.call_count == 1
    assert result.messages == (user(),)


def assert_tool_received(
    events: list[al.Event],
    result: al.RunResult,
    received: list[dict[str, Any]],
    arguments: Any,
) -> None:
    """The run completed and the tool ran once, with exactly ``arguments`` as plain JSON."""
    check_run(events, result)
    assert result.status == "completed"
    assert len(received) == 1
    assert is_plain(received[0])
    assert same_json(received[0], arguments)


def types_of(events: Iterable[al.Event]) -> list[str]:
    return [event.type for event in events]


def chunk_event_count(events: list[al.Event]) -> int:
    return types_of(events).count("model.chunk")


def open_call_ids(messages: Iterable[al.Message]) -> list[str]:
    return [open_call.id for open_call in al.open_tool_calls(messages)]


def cancelled_signal() -> threading.Event:
    """A signal that is already set."""
    signal = threading.Event()
    signal.set()
    return signal


def until(run_: Any, event_type: str, occurrence: int = 1) -> list[al.Event]:
    """Iterates a run until the given occurrence of an event type has been yielded."""
    events: list[al.Event] = []
    while True:
        events.append(next(run_))
        if types_of(events).count(event_type) == occurrence and events[-1].type == event_type:
            return events


def counter_tool(start: int = 41) -> al.Tool:
    """A tool that answers differently each time: a recording must not run it again."""
    count = [start]

    def counter(arguments: dict[str, Any], signal: al.Signal) -> object:
        count[0] += 1
        return str(count[0])

    return al.Tool("counter", "Counts.", {"type": "object"}, counter)


def refuse_with_tool_error(arguments: dict[str, Any], signal: al.Signal) -> object:
    raise al.ToolError("No, and that is final.")


def raise_lookup_error(arguments: dict[str, Any], signal: al.Signal) -> object:
    raise LookupError("nothing here")


def every_kind_of_tool(executed: list[str] | None = None) -> list[al.Tool]:
    """echo, counter, refuse (ToolError) and boom (raises): every kind of result."""
    return [
        echo_tool(executed),
        counter_tool(),
        al.Tool("refuse", "Refuses.", {"type": "object"}, refuse_with_tool_error),
        al.Tool("boom", "Raises.", {"type": "object"}, raise_lookup_error),
    ]


def record_run(
    responses: Sequence[al.ScriptedResponse],
    *,
    messages: Sequence[al.Message] | None = None,
    tools: Sequence[al.Tool] | None = None,
    max_steps: int = 8,
    request_sequence_start: int = 0,
    cancel_when: CancelAt = None,
) -> tuple[list[al.Event], al.RunResult]:
    """Records a run with the driver: tools of every kind of result unless ``tools`` says
    otherwise, and a signal that the consumer sets at ``cancel_when``."""
    events, result, _ = run(
        responses,
        every_kind_of_tool() if tools is None else tools,
        messages=messages,
        max_steps=max_steps,
        signal=threading.Event(),
        request_sequence_start=request_sequence_start,
        cancel_at=cancel_when,
    )
    return events, result


def dicts_of(events: Iterable[al.Event]) -> list[dict[str, Any]]:
    return [event.to_dict() for event in events]


def json_lines(events: Iterable[al.Event]) -> str:
    """A recording as the demo's --json writes it: one to_dict() per line."""
    return "".join(json.dumps(event.to_dict(), ensure_ascii=False) + "\n" for event in events)


def read_json_lines(text: str) -> list[al.Event]:
    return [al.event_from_dict(json.loads(line)) for line in text.splitlines()]


def thinking_script() -> list[al.ScriptedResponse]:
    """A two-step script with thinking and usage, as a provider with extended thinking
    answers: signed thinking streamed in pieces before a tool call, a redacted block
    (which streams nothing), an empty signed thinking block, text after thinking, and
    usage on each response (one with a field unknown)."""
    return [
        al.scripted_response(
            "response-001",
            [
                al.ThinkingBlock("The user wants a sum; the add tool gives it.", "sig-001"),
                al.ThinkingBlock("", "opaque-redacted-data", redacted=True),
                text("Adding."),
                add_call(),
            ],
            "toolCall",
            chunks=[
                al.ThinkingBlock("The user wants a sum; "),
                al.ThinkingBlock("the add tool gives it."),
                text("Adding."),
                add_call(),
            ],
            usage=al.Usage(412, 96, 2048, 0, 64),
        ),
        al.scripted_response(
            "response-002",
            [
                al.ThinkingBlock("", "sig-empty"),
                al.ThinkingBlock("42 it is.", "sig-002"),
                text("The sum is 42."),
            ],
            "stop",
            usage=al.Usage(530, 18, 2048, 0, None),
        ),
    ]


class RequestKeyedModel:
    """A deterministic model in the sense a resumed run needs: its answer depends on the
    request alone. It plays ``script[request.id]`` as al.ScriptedModel plays a response
    (al.ScriptedModel answers by its call count, so a run that goes on from its third
    step would get the first answer). Records ``requests`` and counts ``call_count``; a
    request the script does not hold raises KeyError (MODEL_STREAM_ERROR)."""

    def __init__(self, script: Mapping[str, al.ScriptedResponse]) -> None:
        self.script = dict(script)
        self.requests: list[al.ModelRequest] = []
        self.call_count = 0

    def stream(
        self, request: al.ModelRequest, signal: al.Signal
    ) -> Generator[al.ModelChunk, None, al.ModelResponse]:
        self.call_count += 1
        self.requests.append(request)
        return al.ScriptedModel([self.script[request.id]]).stream(request, signal)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for a test's own server."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


# --- The reference model: what the seed says a run does, for random scripts ------------
#
# A test oracle, as check_run() is: a script is a list of StepPlans (what each model step
# streams and returns, and what its tool calls do); predict() says, from the seed's rules
# alone, which events, status, steps, transcript and tool effects the run must have;
# run_plans() runs the script with the driver and assert_predicted() compares. The random
# script generator (random_script) makes the scripts test_agent_loop.py runs against it.


@dataclasses.dataclass
class CallPlan:
    """One tool call of a script and what the reference expects of it."""

    call: al.ToolCall
    runs: bool  # whether the tool's function is entered
    record: tuple[object, ...]  # what the tool logs when it runs
    is_error: bool
    content: str | None  # the expected result content, when it is predictable


@dataclasses.dataclass
class StepPlan:
    """One model step of a script. ``stream`` items: a block (streamed as its chunk) or a
    callable(request) whose return value is yielded raw (or which raises)."""

    response_id: str
    stream: list[object]
    response: Callable[[al.ModelRequest], object]
    chunk_events: int  # model.chunk events this step yields
    code: str | None = None  # the failure this step causes, if any
    stop: bool = False
    calls: list[CallPlan] = dataclasses.field(default_factory=list)
    final_text: str = ""


def echo_plan(call_id: str, value: str) -> CallPlan:
    return CallPlan(echo_call(call_id, value), True, ("echo", value), False, value)


def add_plan(call_id: str, left: int, right: int) -> CallPlan:
    return CallPlan(
        al.ToolCall(call_id, "add", {"left": left, "right": right}),
        True,
        ("add", left, right),
        False,
        f'{{"sum":{left + right}}}',
    )


def boom_plan(call_id: str, value: str) -> CallPlan:
    """A tool that runs and raises: a recoverable error result."""
    return CallPlan(
        al.ToolCall(call_id, "boom", {"text": value}), True, ("boom", value), True, None
    )


def plan_tools(log: list[tuple[object, ...]]) -> list[al.Tool]:
    """echo, add and boom; each appends what it was called with to ``log``."""
    string = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

    def echo(arguments: dict[str, Any], signal: Any) -> object:
        log.append(("echo", arguments["text"]))
        return arguments["text"]

    def add(arguments: dict[str, Any], signal: Any) -> object:
        log.append(("add", arguments["left"], arguments["right"]))
        return {"sum": arguments["left"] + arguments["right"]}

    def boom(arguments: dict[str, Any], signal: Any) -> object:
        log.append(("boom", arguments["text"]))
        raise ValueError("boom " + arguments["text"])

    return [
        al.Tool("echo", "Returns its text.", string, echo),
        al.Tool("add", "Adds two numbers.", NUMBERS, add),
        al.Tool("boom", "Always raises.", string, boom),
    ]


def plan_step(
    response_id: str,
    items: Sequence[object],
    stop_reason: str,
    stream: Sequence[object],
    content: Sequence[object],
) -> StepPlan:
    """A valid step: ``items`` are texts and CallPlans in assistant order, streamed as
    ``stream`` and returned as ``content`` (which normalise alike)."""
    return StepPlan(
        response_id,
        list(stream),
        respond(response_id, content, stop_reason),
        len(stream),
        stop=stop_reason == "stop",
        calls=[item for item in items if isinstance(item, CallPlan)],
        final_text="".join(item for item in items if isinstance(item, str)),
    )


@dataclasses.dataclass
class Prediction:
    events: list[tuple[str, int, str | None]]  # (type, step, tool-call id)
    status: str
    code: str | None
    steps: int
    message_ids: list[str]
    results: dict[str, CallPlan]  # result message id -> its call's plan
    executed: list[tuple[object, ...]]
    final_text: str | None


def predict(
    start: Sequence[al.Message],
    plans: Sequence[StepPlan],
    max_steps: int,
    cancel_at: int | None = None,
) -> Prediction:
    """What the seed says the run does: events, status, steps, transcript, tool effects.
    ``cancel_at``: the signal is set when the event with that sequence arrives."""
    events: list[tuple[str, int, str | None]] = [("message.accepted", 0, None)] * len(start)
    # Each message with the index of the first event that proves it was appended.
    messages: list[tuple[str, int]] = [(message.id, -1) for message in start]
    executed: list[tuple[tuple[object, ...], int]] = []
    results: dict[str, CallPlan] = {}
    code: str | None = None
    final_text: str | None = None
    status = "maxSteps"
    steps = max_steps
    for step in range(1, max_steps + 1):
        if step > len(plans):  # the model has nothing left: its stream() raises
            status, code, steps = "failed", "MODEL_STREAM_ERROR", step
            break
        plan = plans[step - 1]
        events += [("model.chunk", step, None)] * plan.chunk_events
        if plan.code is not None:
            status, code, steps = "failed", plan.code, step
            break
        # The assistant message is appended before the first tool.started (or run.finished).
        messages.append(("message-" + plan.response_id, len(events)))
        if plan.stop:
            status, final_text, steps = "completed", plan.final_text, step
            break
        for call_plan in plan.calls:
            events.append(("tool.started", step, call_plan.call.id))
            events.append(("tool.finished", step, call_plan.call.id))
            messages.append(("tool-result-" + call_plan.call.id, len(events) - 1))
            results["tool-result-" + call_plan.call.id] = call_plan
            if call_plan.runs:
                executed.append((call_plan.record, len(events) - 1))
    events.append(("run.finished", steps, None))
    if cancel_at is not None and cancel_at < len(events) - 1:
        # The loop looks at the signal right after each event: it stops there, keeping
        # the messages appended so far and opening no further request.
        events = events[: cancel_at + 1]
        steps = max(step for _, step, _ in events)
        events.append(("run.finished", steps, None))
        status, code, final_text = "cancelled", None, None
        messages = [(message_id, proof) for message_id, proof in messages if proof <= cancel_at]
        executed = [(record, proof) for record, proof in executed if proof <= cancel_at]
    return Prediction(
        events,
        status,
        code,
        steps,
        [message_id for message_id, _ in messages],
        results,
        [record for record, _ in executed],
        final_text,
    )


def run_plans(
    start: Sequence[al.Message],
    plans: Sequence[StepPlan],
    max_steps: int,
    cancel_at: int | None = None,
) -> tuple[list[al.Event], al.RunResult, FakeModel, list[tuple[object, ...]]]:
    """Runs a script; the consumer sets the signal when event ``cancel_at`` arrives."""
    log: list[tuple[object, ...]] = []
    model = FakeModel(*[stream_step(plan.stream, plan.response) for plan in plans])
    events, result, _ = run(
        model,
        plan_tools(log),
        messages=list(start),
        max_steps=max_steps,
        signal=threading.Event(),
        cancel_at=cancel_at,
    )
    return events, result, model, log


def assert_predicted(
    prediction: Prediction,
    events: Sequence[al.Event],
    result: al.RunResult,
    model: FakeModel,
    log: Sequence[tuple[object, ...]],
    plans: Sequence[StepPlan],
) -> None:
    observed = []
    for event in events:
        payload = event.payload
        call_id = payload["tool_call"].id if "tool_call" in payload else None
        step = int(payload["request_id"][len("request-") :]) if "request_id" in payload else 0
        observed.append((event.type, step, call_id))
    # run.finished carries no request id; the prediction tags it with the step count.
    assert observed[:-1] == prediction.events[:-1]
    assert observed[-1][0] == "run.finished"
    assert result.status == prediction.status
    assert (result.error.code if result.error else None) == prediction.code
    assert result.steps == prediction.steps
    assert model.call_count == prediction.steps
    assert [message.id for message in result.messages] == prediction.message_ids
    assert result.final_text == prediction.final_text
    assert log == prediction.executed
    for message in result.messages:
        if message.id in prediction.results and isinstance(message, al.ToolResultMessage):
            expected = prediction.results[message.id]
            assert message.is_error is expected.is_error
            if expected.content is not None:
                assert message.content == expected.content
    # Every stream the loop opened was finished or closed: none is left suspended.
    opened = [f"request-{step:03d}" for step in range(1, min(prediction.steps, len(plans)) + 1)]
    assert model.finalized == opened


def bad_schema_plan(call_id: str) -> CallPlan:
    """Arguments that fail the echo schema: a recoverable error, the tool never runs."""
    return CallPlan(al.ToolCall(call_id, "echo", {"text": 5}), False, (), True, None)


def unknown_tool_plan(call_id: str) -> CallPlan:
    return CallPlan(al.ToolCall(call_id, "missing", {"x": 1}), False, (), True, None)


BAD_ARGUMENTS: tuple[Callable[[], Any], ...] = (
    lambda: {"x": float("nan")},
    lambda: {1: "key"},
    cyclic_object,
    lambda: nested(41, "object"),
    lambda: {"x": {1, 2}},
)


BAD_CHUNKS: tuple[Callable[[al.ModelRequest], object], ...] = (
    lambda r: None,
    lambda r: "text",
    lambda r: untyped.TextDelta(r.id, None),
    lambda r: untyped.TextDelta(r.id, 5),
    lambda r: untyped.ToolCallChunk(r.id, untyped.TextBlock("x")),
    lambda r: untyped.ToolCallChunk(r.id, None),
    lambda r: al.TextDelta("request-999", "x"),
)


BAD_RESPONSES: tuple[Callable[[al.ModelRequest], object], ...] = (
    lambda r: None,
    lambda r: {"id": "r"},
    lambda r: al.ModelResponse("", r.id, [], "stop"),
    lambda r: untyped.ModelResponse(None, r.id, [], "stop"),
    lambda r: untyped.ModelResponse("r-bad", r.id, [], "length"),
    lambda r: al.ModelResponse("r-bad", "request-999", [], "stop"),
)


VIOLATIONS = (
    "stop-with-call",
    "toolCall-without-call",
    "disagree",
    "duplicate-id",
    "reused-id",
    "bad-arguments",
    "bad-chunk",
    "bad-response",
    "stream-raises",
)


def random_text(rng: random.Random) -> str:
    return "".join(rng.choice(["a", "b", " ", "é", "🙂", "42"]) for _ in range(rng.randint(0, 5)))


def split_text(rng: random.Random, value: str) -> list[al.TextBlock]:
    """Random chunk boundaries, empty pieces included: all of it normalises to ``value``."""
    cuts = sorted(rng.randint(0, len(value)) for _ in range(rng.randint(0, 3)))
    bounds = [0, *cuts, len(value)]
    return [al.TextBlock(value[a:b]) for a, b in zip(bounds, bounds[1:])]


def random_call(rng: random.Random, call_id: str) -> CallPlan:
    kind = rng.randrange(5)
    if kind == 0:
        return echo_plan(call_id, random_text(rng))
    if kind == 1:
        return add_plan(call_id, rng.randint(-9, 9), rng.randint(0, 99))
    if kind == 2:
        return boom_plan(call_id, random_text(rng))
    if kind == 3:
        return bad_schema_plan(call_id)
    return unknown_tool_plan(call_id)


def random_valid_step(rng: random.Random, response_id: str, step: int, stop: bool) -> StepPlan:
    """A valid step with random text, calls and chunk splits."""
    items: list[object] = []
    if stop:
        items = [random_text(rng) for _ in range(rng.randint(0, 3))]
    else:
        if rng.random() < 0.5:
            items.append(random_text(rng))
        for index in range(rng.randint(1, 3)):
            items.append(random_call(rng, f"call-{step}-{index}"))
            if rng.random() < 0.3:
                items.append(random_text(rng))
    stream: list[object] = []
    content: list[object] = []
    for item in items:
        if isinstance(item, str):
            stream += split_text(rng, item)
            # The terminal response may split its text differently, or drop empty text.
            if item and rng.random() < 0.5:
                content += split_text(rng, item)
            elif item or rng.random() < 0.5:
                content.append(al.TextBlock(item))
        else:
            stream.append(cast(CallPlan, item).call)
            content.append(cast(CallPlan, item).call)
    return plan_step(response_id, items, "stop" if stop else "toolCall", stream, content)


def random_violation(
    rng: random.Random, response_id: str, step: int, used_ids: Sequence[str]
) -> StepPlan:
    """A step that breaks one rule; the reference knows how many chunks get an event."""
    kind = rng.choice(VIOLATIONS)
    plan = random_valid_step(rng, response_id, step, stop=kind == "toolCall-without-call")
    stream = list(plan.stream)
    if kind == "stop-with-call":
        # A toolCall script answered with stopReason stop: all chunks stream, then it fails.
        calls: list[object] = [block for block in stream if isinstance(block, al.ToolCall)]
        return dataclasses.replace(
            plan,
            response=respond(response_id, calls, "stop"),
            stream=calls,
            chunk_events=len(calls),
            code="MODEL_PROTOCOL_ERROR",
        )
    if kind == "toolCall-without-call":
        return dataclasses.replace(
            plan,
            response=respond(response_id, [al.TextBlock("x")], "toolCall"),
            stream=[*stream, al.TextBlock("x")],
            chunk_events=len(stream) + 1,
            code="MODEL_PROTOCOL_ERROR",
        )
    if kind == "disagree":
        return dataclasses.replace(
            plan,
            stream=[*stream, al.TextBlock("!")],
            chunk_events=len(stream) + 1,
            code="MODEL_PROTOCOL_ERROR",
        )
    if kind in ("duplicate-id", "reused-id"):
        reused = rng.choice(list(used_ids)) if kind == "reused-id" and used_ids else None
        stream_calls = [block for block in stream if isinstance(block, al.ToolCall)]
        duplicate_id = reused or stream_calls[0].id
        duplicate = al.ToolCall(duplicate_id, "echo", {"text": "dup"})
        content: list[object] = [*stream_calls, duplicate] if reused is None else [duplicate]
        return dataclasses.replace(
            plan,
            stream=content,
            response=respond(response_id, content, "toolCall"),
            chunk_events=len(content),
            code="MODEL_PROTOCOL_ERROR",
        )
    position = rng.randint(0, len(stream))
    if kind == "bad-arguments":
        bad: object = al.ToolCall(f"call-{step}-bad", "echo", rng.choice(BAD_ARGUMENTS)())
        code = "MODEL_PROTOCOL_ERROR"
    elif kind == "bad-chunk":
        bad = rng.choice(BAD_CHUNKS)
        code = "MODEL_PROTOCOL_ERROR"
    elif kind == "stream-raises":
        bad = raise_error(ConnectionResetError("peer"))
        code = "MODEL_STREAM_ERROR"
    else:  # bad-response: every chunk streams, then the terminal response is wrong
        return dataclasses.replace(
            plan, response=rng.choice(BAD_RESPONSES), code="MODEL_PROTOCOL_ERROR"
        )
    return dataclasses.replace(
        plan,
        stream=[*stream[:position], bad, *stream[position:]],
        chunk_events=position,
        code=code,
    )


def random_script(
    rng: random.Random,
) -> tuple[list[al.Message], list[StepPlan], int, int | None]:
    start: list[al.Message] = list(HISTORY) if rng.random() < 0.3 else [user()]
    used_ids = ["call-old"] if len(start) > 1 else []
    plans: list[StepPlan] = []
    for step in range(1, rng.randint(1, 7) + 1):
        response_id = f"response-{step:03d}"
        roll = rng.random()
        if roll < 0.2:
            plans.append(random_violation(rng, response_id, step, used_ids))
            break
        plan = random_valid_step(rng, response_id, step, stop=roll < 0.4)
        plans.append(plan)
        used_ids += [call_plan.call.id for call_plan in plan.calls]
        if plan.stop:
            break
    if rng.random() < 0.1:
        plans = plans[: rng.randint(0, len(plans) - 1)]  # the model runs out of answers
    max_steps = rng.randint(1, 6)
    cancel_at = None
    if rng.random() < 0.3:
        cancel_at = rng.randrange(len(predict(start, plans, max_steps).events))
    return start, plans, max_steps, cancel_at


# --- The providers' builders ------------------------------------------------------------
#
# What both provider test files use: the providers' event streams, built and recorded, a
# stand-in for the exchange (Canned) and the one driver of a prompt (settle_prompt). A
# builder that one of the two files alone uses stays in that file.


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
    """A stand-in for the exchange: scripted reads and no socket; it counts the reads.

    ``open()`` raises ``failure`` if there is one; each ``read()`` returns the next part,
    then b"" (the end of the input).
    """

    def __init__(
        self, parts: Sequence[bytes] = (), failure: Optional[providers.ProviderError] = None
    ) -> None:
        self.parts = list(parts)
        self.failure = failure
        self.reads = 0
        self.closed = False
        self.body: Dict[str, Any] = {}  # the request body it was made for

    def open(self) -> None:
        if self.failure is not None:
            raise self.failure

    def read(self) -> bytes:
        self.reads += 1
        return self.parts.pop(0) if self.parts else b""

    def close(self) -> None:
        self.closed = True


Attempt = Union[Sequence[bytes], Canned]
"""One answer for canned(): its parts, or a Canned exchange."""


def canned(model: providers._StreamingModel, *attempts: Attempt) -> List[Canned]:
    """Makes model read canned bytes: one attempt per request or retry, in order."""
    exchanges = [
        attempt if isinstance(attempt, Canned) else Canned(attempt) for attempt in attempts
    ]
    queue = list(exchanges)

    def exchange(url: str, headers: Dict[str, str], body: bytes, signal: Any) -> Canned:
        made = queue.pop(0)
        made.body = json.loads(body)
        return made

    cast(Any, model)._exchange = exchange
    return exchanges


def canned_openai(*attempts: Attempt, **arguments: Any) -> providers.OpenAIChatModel:
    """An OpenAIChatModel that reads attempts (retries 0 unless given)."""
    arguments.setdefault("retries", 0)
    model = providers.OpenAIChatModel("test-model", base_url="http://canned/v1", **arguments)
    canned(model, *attempts)
    return model


def canned_anthropic(*attempts: Attempt, **arguments: Any) -> providers.AnthropicMessagesModel:
    """An AnthropicMessagesModel that reads attempts (retries 0 unless given)."""
    arguments.setdefault("retries", 0)
    model = providers.AnthropicMessagesModel("test-model", base_url="http://canned", **arguments)
    canned(model, *attempts)
    return model


def canned_model(provider: str, *attempts: Attempt, **arguments: Any) -> providers._StreamingModel:
    """The provider's canned model (canned_openai or canned_anthropic)."""
    if provider == "openai":
        return canned_openai(*attempts, **arguments)
    return canned_anthropic(*attempts, **arguments)


def posted(model: providers._StreamingModel, model_request: al.ModelRequest) -> Dict[str, Any]:
    """What the model would post for a request: url, headers (lower-case names), body."""
    url, headers, body = model._post(model_request)
    return {
        "url": url,
        "headers": {name.lower(): value for name, value in headers.items()},
        "body": json.loads(body),
    }


def settle_prompt(
    model: al.Model, prompt: str = "What is 2 + 3?", signal: Any = None, max_steps: int = 4
) -> Tuple[List[al.Event], al.RunResult]:
    """A run of model on one user message with the command line's tools, drained by
    al.settle_run: its events and its result."""
    return al.settle_run(
        al.run_agent_loop(
            messages=[al.UserMessage("user-001", prompt)],
            model=model,
            tools=al.ToolRegistry(cli.TOOLS),
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
