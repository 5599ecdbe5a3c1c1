"""Tests only (not collected by pytest, not installed): the core's builders and its driver.

The core's tests (test_agent_loop.py, test_agent_loop_transcript_and_model.py,
test_agent_loop_schemas.py, test_agent_loop_tools_and_ir.py,
test_agent_loop_concurrency.py, test_agent_loop_replay.py, test_agent_loop_durable.py,
test_docs_and_demo.py) and the MCP tests import their builders, their fake models and
their one driver from here:

- builders in the seed's vocabulary: user(), call(), add_tool(), echo_tool(), stop(),
  tool_turn(), ... and the tables of JSON that is not plain (NOT_PLAIN_JSON);
- FakeModel, for what al.ScriptedModel cannot do (its docstring says what), and
  RequestKeyedModel, whose answer depends on the request alone (for resumed runs);
- run() and settle(): the one driver, which checks the run's invariants after every run
  (check_run, in loop_invariants.py), groups of concurrent calls included, and
  start_run() for tests that step, close or throw into a run.

Beside it: loop_invariants.py (the invariants every run keeps, checked from the
outside), loop_reference.py (the reference model that random scripts are checked
against) and loop_testing_providers.py (the providers' builders and the fixture server).

It is a plain module rather than a conftest.py: a test file imports from it by name, as
it imports agent_loop, and mypy checks it like any module; pytest imports a conftest.py
itself, under a name of its choosing, so importing from one is fragile.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import (
    Any,
    Callable,
    Dict,
    Generator,
    Iterable,
    List,
    Mapping,
    Sequence,
    Tuple,
    Union,
    cast,
)

import pytest

import agent_loop as al
from loop_invariants import check_run

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


def stop(response_id: str, final: str) -> Any:
    """A scripted stop response holding one text block, ``final`` (the run's final text)."""
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

TESTS = Path(__file__).resolve().parent
"""The folder of the tests, their helpers and their fake servers."""

REPOSITORY = TESTS.parent
"""The repository: the modules, the README and the packaging."""

DOCUMENTS = (REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").glob("*.md")))
"""The README and its guides in docs/: every python block of each runs."""


def documentation() -> str:
    """The README and every guide, one text: where a statement lives may move."""
    return "\n".join(path.read_text(encoding="utf-8") for path in DOCUMENTS)


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


def cancels(at: CancelAt, events: Sequence[al.Event]) -> bool:
    """True if the consumer cancels on the last of ``events`` (see CancelAt)."""
    event = events[-1]
    if isinstance(at, tuple):
        return event.type == at[0] and types_of(events).count(at[0]) == at[1]
    if isinstance(at, int):
        return event.sequence == at
    return at is not None and at(event)


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


# Tools at once: builders and readers (tests/test_agent_loop_concurrency.py and others).

WAIT: float = 10.0
"""Seconds a test thread waits for another before the test fails: generous, so that a
loaded machine never fails a test, and finite, so that a broken loop cannot hang one."""


def tool(
    name: str,
    execute: Callable[[dict[str, Any], Any], object],
    sequential: bool = False,
) -> al.Tool:
    """A tool that takes any arguments."""
    return al.Tool(name, f"The {name} tool.", {"type": "object"}, execute, sequential=sequential)


def calls_of(name: str, *ids: str) -> list[al.ToolCall]:
    return [call(name, id, {}) for id in ids]


def one_batch(*calls: al.ToolCall) -> list[al.ScriptedResponse]:
    """One step that asks for ``calls``, then a step that stops with "Done."."""
    return [tool_turn("response-001", *calls), stop("response-002", "Done.")]


def events_of_tools(events: Sequence[al.Event]) -> list[tuple[str, str]]:
    """The tool events as (type, call id)."""
    return [
        (event.type, event.payload["tool_call"].id)
        for event in events
        if event.type in ("tool.started", "tool.finished")
    ]


def results_of(result: al.RunResult) -> dict[str, tuple[str, bool]]:
    """The run's tool results by call id: (content, is_error)."""
    return {
        message.tool_call_id: (message.content, message.is_error)
        for message in result.messages
        if isinstance(message, al.ToolResultMessage)
    }


def tool_threads() -> list[threading.Thread]:
    """The loop's tool threads still alive."""
    return [
        thread for thread in threading.enumerate() if thread.name.startswith("agent_loop-tool")
    ]


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


def counter_tool(first: int) -> al.Tool:
    """A tool that answers differently each time (``first``, then one more at each call):
    a recording must not run it again."""
    count = [first - 1]

    def counter(arguments: dict[str, Any], signal: al.Signal) -> object:
        count[0] += 1
        return str(count[0])

    return al.Tool("counter", "Counts.", {"type": "object"}, counter)


def refuse_with_tool_error(arguments: dict[str, Any], signal: al.Signal) -> object:
    raise al.ToolError("No, and that is final.")


def raise_lookup_error(arguments: dict[str, Any], signal: al.Signal) -> object:
    raise LookupError("nothing here")


def every_kind_of_tool(executed: list[str] | None = None) -> list[al.Tool]:
    """echo, counter (answering "42", then "43", ...), refuse (ToolError "No, and that is
    final.") and boom (raises LookupError "nothing here"): every kind of result."""
    return [
        echo_tool(executed),
        counter_tool(42),
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
    """A recording as the demo's --json writes it: one to_dict() per line, as every log is
    written (agent_loop_replay.json_line: compact, ASCII)."""
    return "".join(json.dumps(event.to_dict(), separators=(",", ":")) + "\n" for event in events)


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


Plan = Dict[str, List[Tuple[str, object]]]
"""Each call's part, by call id: its steps, each (the event it waits for, its value)."""


class Choreography:
    """Tool calls whose order is fixed by gates, not timing: call C plays ``plan[C]``,
    whose steps each wait until the consumer saw an event (``"started:C"``,
    ``"progress:C:VALUE"``, ``"finished:C"``; ``""``: none; ``"signal"``: the run's
    signal), then yield their value as progress, the last one returned. ``seen`` is the
    driver's ``cancel_at`` (it cancels on the event named ``cancel``); ``ran`` lists the
    calls its tool ran."""

    def __init__(self, plan: Plan, cancel: str = "") -> None:
        self.plan = plan
        self.cancel = cancel
        self.ran: List[str] = []
        self._gates: Dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def tool(self, name: str = "work", ends_run: bool = False) -> al.Tool:
        def execute(arguments: Dict[str, Any], signal: al.Signal) -> object:
            current = al.current_tool_call()
            assert current is not None
            self.ran.append(current.id)
            return self._play(self.plan[current.id], signal)

        return al.Tool(name, "Plays its part.", {"type": "object"}, execute, ends_run=ends_run)

    def seen(self, event: al.Event) -> bool:
        key = event_key(event)
        self._gate(key).set()
        return key == self.cancel

    def _gate(self, key: str) -> threading.Event:
        with self._lock:
            return self._gates.setdefault(key, threading.Event())

    def _play(
        self, steps: List[Tuple[str, object]], signal: al.Signal
    ) -> Generator[object, None, object]:
        *progress, (after_last, last) = steps
        for after, value in progress:
            self._wait(after, signal)
            yield value
        self._wait(after_last, signal)
        return last

    def _wait(self, after: str, signal: al.Signal) -> None:
        if after:
            assert (signal if after == "signal" else self._gate(after)).wait(WAIT), after


def event_key(event: al.Event) -> str:
    """How a Choreography names a tool event (other events: their type)."""
    payload = event.payload
    if event.type == "tool.progress":
        return f"progress:{payload['tool_call_id']}:{payload['progress']}"
    if event.type in ("tool.started", "tool.finished"):
        return f"{event.type[5:]}:{payload['tool_call'].id}"
    return event.type
