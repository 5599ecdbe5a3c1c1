"""Tests for agent_loop: every rule, limit, failure code, event order, cancellation
case and acceptance criterion of the seed ("Checkpoint 07: Run the iterative Agent
Loop"), then the contract of API.md.

The suite imports ``agent_loop`` once, as ``al``: point it at another copy of the
module by putting that copy first on sys.path.
"""

from __future__ import annotations

import collections.abc
import inspect
import itertools
import threading
from typing import (
    Any,
    Callable,
    Generator,
    Iterable,
    Iterator,
    Sequence,
    cast,
)

import pytest

import agent_loop as al

# --- Helpers shared by every test class: the seed's own test vocabulary -----------------


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


def run(
    responses: Sequence[Any],
    *,
    messages: Iterable[al.Message] | None = None,
    tools: Sequence[al.Tool] = (),
    max_steps: int = 4,
    signal: threading.Event | None = None,
    request_sequence_start: int = 0,
) -> tuple[list[al.Event], al.RunResult, al.ScriptedModel]:
    """Runs a ScriptedModel over ``responses`` to the end; returns events, result, model."""
    model = al.ScriptedModel(responses)
    events, result = al.settle_run(
        al.run_agent_loop(
            messages=[user()] if messages is None else messages,
            model=model,
            tools=al.ToolRegistry(tools),
            max_steps=max_steps,
            signal=signal,
            request_sequence_start=request_sequence_start,
        )
    )
    return events, result, model


def types_of(events: Iterable[al.Event]) -> list[str]:
    return [event.type for event in events]


def assert_well_formed(events: Sequence[al.Event], result: al.RunResult) -> None:
    """The invariants every run keeps, whatever happened in it."""
    assert [event.sequence for event in events] == list(range(len(events)))
    assert types_of(events).count("run.finished") == 1
    assert events[-1].type == "run.finished"
    assert events[-1].payload["result"] is result


# --- Helpers of the core test classes ---------------------------------------------------


def add_call(id: str = "call-add-001") -> al.ToolCall:
    """The seed's addCall: call("add", id, {left: 20, right: 22})."""
    return call("add", id, {"left": 20, "right": 22})


def add_result(id: str = "call-add-001") -> al.ToolResultMessage:
    """The linked result of add_call(id)."""
    return al.ToolResultMessage("tool-result-" + id, id, "add", '{"sum":42}', False)


def echo_call(id: str) -> al.ToolCall:
    """An echo call whose text is its own id, so that echo_tool(executed) records call order."""
    return call("echo", id, {"text": id})


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


class Fatal(BaseException):
    """A BaseException that is not an Exception: no tool result can stand for it."""


class GeneratorModel:
    """A hand-written model: ``stream`` calls the given function, counting and recording
    each request like ScriptedModel does."""

    def __init__(self, stream: Callable[[al.ModelRequest, Any], Any]) -> None:
        self._stream = stream
        self.requests: list[al.ModelRequest] = []
        self.call_count = 0

    def stream(self, request: al.ModelRequest, signal: Any) -> Any:
        self.call_count += 1
        self.requests.append(request)
        return self._stream(request, signal)


def model_of(script: Any) -> Any:
    """A ScriptedModel for a list of scripted responses, a GeneratorModel for a function."""
    return GeneratorModel(script) if callable(script) else al.ScriptedModel(script)


def run_with(
    model: Any,
    *,
    messages: Iterable[Any] | None = None,
    tools: Sequence[al.Tool] = (),
    max_steps: int = 4,
    signal: Any = None,
) -> tuple[list[al.Event], al.RunResult]:
    """Runs any model to the end; returns events and result."""
    return al.settle_run(
        al.run_agent_loop(
            messages=[user()] if messages is None else messages,
            model=model,
            tools=al.ToolRegistry(tools),
            max_steps=max_steps,
            signal=signal,
        )
    )


def settle_setting_signal(
    run: Generator[al.Event, None, al.RunResult], signal: threading.Event, at: tuple[str, int]
) -> tuple[list[al.Event], al.RunResult]:
    """Drains a run like settle_run, and sets ``signal`` while it holds the ``at[1]``-th
    event of type ``at[0]`` (counting from 1): an observer that cancels on that event."""
    event_type, nth = at
    events: list[al.Event] = []
    while True:
        try:
            event = next(run)
        except StopIteration as done:
            return events, done.value
        events.append(event)
        if event.type == event_type and types_of(events).count(event_type) == nth:
            signal.set()


def abort_from_another_thread(ready: threading.Event, signal: threading.Event) -> threading.Thread:
    """Starts a helper thread that sets ``signal`` once ``ready`` is set."""

    def abort() -> None:
        if ready.wait(5):  # a safety net: the test sets ready long before
            signal.set()

    thread = threading.Thread(target=abort)
    thread.start()
    return thread


def assert_joined(thread: threading.Thread) -> None:
    thread.join(5)
    assert not thread.is_alive()


def assert_failed(events: Sequence[al.Event], result: al.RunResult, code: str) -> None:
    """A failed run: well formed, status failed, the given code and a message that says why."""
    assert_well_formed(events, result)
    assert result.status == "failed"
    assert isinstance(result.error, al.RunError)
    assert result.error.code == code
    assert isinstance(result.error.message, str)
    assert result.error.message
    assert result.final_text is None
    assert result.max_steps is None


def index_of(events: Sequence[al.Event], at: tuple[str, int]) -> int:
    """The index of the ``at[1]``-th event of type ``at[0]`` (counting from 1)."""
    return [index for index, event in enumerate(events) if event.type == at[0]][at[1] - 1]


def open_call_ids(messages: Iterable[al.Message]) -> list[str]:
    return [open_call.id for open_call in al.open_tool_calls(messages)]


# --- 1. The focused test: the seed's two verbatim fragments, translated -----------------


class TestGoldenFragments:
    def test_appends_one_tool_call_and_its_matching_result_before_the_second_model_request(
        self,
    ) -> None:
        """Seed: "The second request contains the assistant Tool call before its result,
        and both share call-add-001." (the seed's first fragment, translated exactly)"""
        add_call_001 = call("add", "call-add-001", {"left": 20, "right": 22})
        model = al.ScriptedModel(
            [
                al.scripted_response("response-tool-001", [add_call_001], "toolCall"),
                al.scripted_response(
                    "response-tool-002", [al.TextBlock("The sum is 42.")], "stop"
                ),
            ]
        )

        events, result = al.settle_run(
            al.run_agent_loop(
                messages=[user()],
                model=model,
                tools=al.ToolRegistry([add_tool()]),
                max_steps=2,
                signal=threading.Event(),
            )
        )

        assert model.call_count == 2
        assert [request.id for request in model.requests] == ["request-001", "request-002"]
        assert model.requests[1].messages == (
            user(),
            al.AssistantMessage("message-response-tool-001", (add_call_001,)),
            al.ToolResultMessage(
                "tool-result-call-add-001", "call-add-001", "add", '{"sum":42}', False
            ),
        )
        assert types_of(events) == [
            "message.accepted",
            "model.chunk",
            "tool.started",
            "tool.finished",
            "model.chunk",
            "run.finished",
        ]
        assert [event.sequence for event in events] == [0, 1, 2, 3, 4, 5]
        assert result.status == "completed"
        assert result.final_text == "The sum is 42."

    @staticmethod
    def budget_run(max_steps: int) -> tuple[list[str], list[al.Event], al.RunResult, Any]:
        """The seed's failure experiment: three echo calls, then a continuation response."""
        executed: list[str] = []
        calls = [
            echo_call("call-echo-001"),
            echo_call("call-echo-002"),
            echo_call("call-echo-003"),
        ]
        model = al.ScriptedModel(
            [
                al.scripted_response("response-budget-001", calls, "toolCall"),
                al.scripted_response(
                    "response-budget-002", [al.TextBlock("must not run")], "stop"
                ),
            ]
        )
        events, result = al.settle_run(
            al.run_agent_loop(
                messages=[user("Echo three values.")],
                model=model,
                tools=al.ToolRegistry([echo_tool(executed)]),
                max_steps=max_steps,
                signal=threading.Event(),
            )
        )
        return executed, events, result, model

    def test_a_one_step_budget_completes_the_tool_batch_and_opens_no_continuation(self) -> None:
        """Seed: "All three calls execute in order, model.callCount remains 1, and the
        result is maxSteps." (the seed's second fragment, translated exactly)"""
        executed, events, result, model = self.budget_run(max_steps=1)

        assert executed == ["call-echo-001", "call-echo-002", "call-echo-003"]
        assert model.call_count == 1
        assert result.status == "maxSteps"
        assert result.max_steps == 1
        last = events[-1]
        assert last.type == "run.finished"
        assert last.sequence == len(events) - 1
        assert last.payload["result"].status == "maxSteps"
        assert last.payload["result"].max_steps == 1

    def test_the_same_script_with_two_steps_runs_the_continuation_and_completes(self) -> None:
        """Seed: "Change only maxSteps to 2; the queued continuation may run and complete." """
        executed, events, result, model = self.budget_run(max_steps=2)

        assert executed == ["call-echo-001", "call-echo-002", "call-echo-003"]
        assert model.call_count == 2
        assert result.status == "completed"
        assert result.final_text == "must not run"
        assert result.max_steps is None
        assert_well_formed(events, result)


# --- 2. Construction rejects invalid options before starting model work -----------------


class SignalLike:
    """Not a threading.Event, but with the same reading side: is_set() and wait()."""

    def is_set(self) -> bool:
        return False

    def wait(self, timeout: float | None = None) -> bool:
        return False


class OnlyIsSet:
    def is_set(self) -> bool:
        return False


class StreamNotCallable:
    stream = "not a function"


INVALID_OPTIONS = [
    pytest.param({"max_steps": 0}, ValueError, "max_steps", id="max_steps-under-limit-0"),
    pytest.param({"max_steps": 65}, ValueError, "max_steps", id="max_steps-over-limit-65"),
    pytest.param({"max_steps": -1}, ValueError, "max_steps", id="max_steps-negative"),
    pytest.param({"max_steps": True}, TypeError, "max_steps", id="max_steps-bool"),
    pytest.param({"max_steps": 2.0}, TypeError, "max_steps", id="max_steps-float"),
    pytest.param({"max_steps": "2"}, TypeError, "max_steps", id="max_steps-str"),
    pytest.param({"max_steps": None}, TypeError, "max_steps", id="max_steps-None"),
    pytest.param(
        {"request_sequence_start": -1},
        ValueError,
        "request_sequence_start",
        id="request_sequence_start-under-limit-negative",
    ),
    pytest.param(
        {"request_sequence_start": 61, "max_steps": 4},
        ValueError,
        "request_sequence_start",
        id="request_sequence_start-over-limit-61+4",
    ),
    pytest.param(
        {"request_sequence_start": 64, "max_steps": 1},
        ValueError,
        "request_sequence_start",
        id="request_sequence_start-over-limit-64+1",
    ),
    pytest.param(
        {"request_sequence_start": True},
        TypeError,
        "request_sequence_start",
        id="request_sequence_start-bool",
    ),
    pytest.param(
        {"request_sequence_start": 1.0},
        TypeError,
        "request_sequence_start",
        id="request_sequence_start-float",
    ),
    pytest.param({"model": object()}, TypeError, "model", id="model-without-stream"),
    pytest.param({"model": StreamNotCallable()}, TypeError, "model", id="stream-not-callable"),
    pytest.param({"tools": [add_tool()]}, TypeError, "tools", id="tools-a-list"),
    pytest.param({"tools": None}, TypeError, "tools", id="tools-None"),
    pytest.param({"signal": object()}, TypeError, "signal", id="signal-object"),
    pytest.param({"signal": True}, TypeError, "signal", id="signal-bool"),
    pytest.param({"signal": OnlyIsSet()}, TypeError, "signal", id="signal-without-wait"),
    pytest.param({"messages": 42}, TypeError, "messages", id="messages-int"),
    pytest.param({"messages": None}, TypeError, "messages", id="messages-None"),
]

VALID_OPTIONS = [
    pytest.param({"max_steps": 1}, id="max_steps-at-limit-1"),
    pytest.param({"max_steps": 64}, id="max_steps-at-limit-64"),
    pytest.param({"request_sequence_start": 0}, id="request_sequence_start-at-limit-0"),
    pytest.param(
        {"request_sequence_start": 60, "max_steps": 4}, id="request_sequence_start-at-limit-60+4"
    ),
    pytest.param(
        {"request_sequence_start": 63, "max_steps": 1}, id="request_sequence_start-at-limit-63+1"
    ),
    pytest.param({"signal": SignalLike()}, id="signal-like-object"),
    pytest.param({"signal": None}, id="signal-None"),
    pytest.param({"messages": (user(),)}, id="messages-tuple"),
]


class TestConstructionRejectsInvalidOptions:
    @staticmethod
    def options(model: al.ScriptedModel, overrides: dict[str, Any]) -> dict[str, Any]:
        options: dict[str, Any] = {
            "messages": [user()],
            "model": model,
            "tools": al.ToolRegistry([add_tool()]),
            "max_steps": 2,
            "signal": threading.Event(),
        }
        options.update(overrides)
        return options

    @pytest.mark.parametrize(("overrides", "error", "names"), INVALID_OPTIONS)
    def test_an_invalid_option_raises_at_call_time(
        self, overrides: dict[str, Any], error: type[Exception], names: str
    ) -> None:
        """Seed: "Invalid construction throws before an EventStream is returned." The
        call itself raises (nothing is iterated), naming the option; the model never runs."""
        model = al.ScriptedModel([stop("response-001")])
        with pytest.raises(error, match=names):
            al.run_agent_loop(**self.options(model, overrides))
        assert model.call_count == 0

    @pytest.mark.parametrize("overrides", VALID_OPTIONS)
    def test_a_valid_option_returns_a_generator_that_has_not_called_the_model(
        self, overrides: dict[str, Any]
    ) -> None:
        model = al.ScriptedModel([stop("response-001")])
        run = al.run_agent_loop(**self.options(model, overrides))

        assert isinstance(run, collections.abc.Generator)
        assert inspect.getgeneratorstate(run) == "GEN_CREATED"
        assert model.call_count == 0
        events, result = al.settle_run(run)
        assert result.status == "completed"
        assert model.call_count == 1
        assert_well_formed(events, result)


# --- 3. The run owns snapshots of starting messages and Tool registry membership -------


class TestRunOwnsSnapshots:
    @pytest.mark.parametrize(
        "mutate",
        [
            pytest.param(
                lambda messages: messages.append(user("Later.", "user-002")), id="append"
            ),
            pytest.param(lambda messages: messages.clear(), id="clear"),
            pytest.param(lambda messages: messages.insert(0, "not a message"), id="insert-junk"),
        ],
    )
    def test_mutating_the_callers_list_after_the_call_does_not_reach_the_run(
        self, mutate: Callable[[list[Any]], None]
    ) -> None:
        """Seed: "The caller can later mutate its input array ... without changing the
        active run." """
        messages: list[Any] = [user()]
        model = al.ScriptedModel([stop("response-001")])
        run = al.run_agent_loop(
            messages=messages, model=model, tools=al.ToolRegistry(), max_steps=1
        )
        mutate(messages)
        events, result = al.settle_run(run)

        assert result.status == "completed"
        assert model.requests[0].messages == (user(),)
        assert [event.payload["message"] for event in events[:1]] == [user()]
        assert types_of(events).count("message.accepted") == 1
        assert result.messages == (user(), assistant("response-001", text("The sum is 42.")))

    def test_a_generator_of_messages_is_read_completely_at_call_time(self) -> None:
        read: list[str] = []

        def start() -> Iterator[al.Message]:
            for message in (user(), user("And then?", "user-002")):
                read.append(message.id)
                yield message

        messages = start()
        model = al.ScriptedModel([stop("response-001")])
        run = al.run_agent_loop(
            messages=messages, model=model, tools=al.ToolRegistry(), max_steps=1
        )
        assert read == ["user-001", "user-002"]
        assert next(messages, None) is None  # consumed once, by the call

        _events, result = al.settle_run(run)
        assert model.requests[0].messages == (user(), user("And then?", "user-002"))
        assert result.status == "completed"

    def test_registering_a_tool_after_the_call_does_not_reach_the_run(self) -> None:
        """Seed: "The caller can later ... register another Tool without changing the
        active run." A call to the late tool gets an unknown-tool result."""
        executed: list[str] = []
        registry = al.ToolRegistry([add_tool()])
        model = al.ScriptedModel(
            [tool_turn("response-001", echo_call("call-echo-001")), stop("response-002")]
        )
        run = al.run_agent_loop(messages=[user()], model=model, tools=registry, max_steps=2)
        registry.register(echo_tool(executed))
        _events, result = al.settle_run(run)

        assert executed == []
        assert [[spec.name for spec in request.tools] for request in model.requests] == [
            ["add"],
            ["add"],
        ]
        late = result.messages[2]
        assert isinstance(late, al.ToolResultMessage)
        assert late.tool_call_id == "call-echo-001"
        assert late.is_error
        assert "echo" in late.content
        assert result.status == "completed"

    def test_a_tool_that_registers_a_tool_during_the_run_does_not_reach_the_run(self) -> None:
        executed: list[str] = []
        registry = al.ToolRegistry()

        def register_echo(arguments: dict[str, Any], signal: Any) -> object:
            registry.register(echo_tool(executed))
            return "registered"

        registry.register(no_arguments_tool("register", register_echo))
        model = al.ScriptedModel(
            [
                tool_turn("response-001", call("register", "call-register-001", {})),
                tool_turn("response-002", echo_call("call-echo-001")),
                stop("response-003"),
            ]
        )
        _events, result = al.settle_run(
            al.run_agent_loop(messages=[user()], model=model, tools=registry, max_steps=3)
        )

        assert "echo" in registry  # the caller's registry did change...
        assert executed == []  # ...but not the run's snapshot
        assert [[spec.name for spec in request.tools] for request in model.requests] == [
            ["register"]
        ] * 3
        late = result.messages[4]
        assert isinstance(late, al.ToolResultMessage)
        assert late.tool_call_id == "call-echo-001"
        assert late.is_error
        assert result.status == "completed"


# --- 4. Each model step receives the complete frozen transcript and a correlated id ---


class SnapshotRecordingModel(al.ScriptedModel):
    """A ScriptedModel that also copies what each request held when it was made."""

    def __init__(self, responses: Sequence[Any]) -> None:
        super().__init__(responses)
        self.held: list[list[al.Message]] = []

    def stream(self, request: al.ModelRequest, signal: Any) -> Any:
        self.held.append(list(request.messages))
        return super().stream(request, signal)


THREE_STEPS = (
    tool_turn("response-001", add_call()),
    tool_turn("response-002", echo_call("call-echo-001")),
    stop("response-003"),
)


class TestEachStepGetsFrozenTranscriptAndRequestId:
    def test_each_request_holds_the_complete_transcript_at_its_step(self) -> None:
        """Seed: "requestSnapshot() freezes the current transcript"."""
        _events, result, model = run(THREE_STEPS, tools=[add_tool(), echo_tool()])

        first_round = (assistant("response-001", add_call()), add_result())
        second_round = (
            assistant("response-002", echo_call("call-echo-001")),
            echo_result("call-echo-001"),
        )
        assert [request.messages for request in model.requests] == [
            (user(),),
            (user(), *first_round),
            (user(), *first_round, *second_round),
        ]
        assert all(type(request.messages) is tuple for request in model.requests)
        assert result.messages == (
            user(),
            *first_round,
            *second_round,
            assistant("response-003", text("The sum is 42.")),
        )

    def test_later_steps_do_not_change_earlier_requests(self) -> None:
        model = SnapshotRecordingModel(THREE_STEPS)
        run_with(model, tools=[add_tool(), echo_tool()])

        assert [len(held) for held in model.held] == [1, 3, 5]
        assert [list(request.messages) for request in model.requests] == model.held

    @pytest.mark.parametrize(
        ("start", "max_steps", "ids"),
        [
            pytest.param(0, 4, ["request-001", "request-002", "request-003"], id="from-1"),
            pytest.param(5, 4, ["request-006", "request-007", "request-008"], id="offset-5"),
            pytest.param(61, 3, ["request-062", "request-063", "request-064"], id="at-ceiling"),
        ],
    )
    def test_request_ids_count_steps_offset_by_the_sequence_start(
        self, start: int, max_steps: int, ids: list[str]
    ) -> None:
        """Seed: "creates request-001, request-002, and so on, offset by
        requestSequenceStart"; chunks and tool events carry the active request id."""
        events, result, model = run(
            THREE_STEPS,
            tools=[add_tool(), echo_tool()],
            max_steps=max_steps,
            request_sequence_start=start,
        )

        assert result.status == "completed"
        assert [request.id for request in model.requests] == ids
        correlated = [
            (event.type, event.payload["request_id"])
            for event in events
            if "request_id" in event.payload
        ]
        assert correlated == [
            ("model.chunk", ids[0]),
            ("tool.started", ids[0]),
            ("tool.finished", ids[0]),
            ("model.chunk", ids[1]),
            ("tool.started", ids[1]),
            ("tool.finished", ids[1]),
            ("model.chunk", ids[2]),
        ]

    def test_the_last_request_number_of_the_ceiling_is_064(self) -> None:
        _events, result, model = run(
            [stop("response-001")], max_steps=1, request_sequence_start=63
        )

        assert [request.id for request in model.requests] == ["request-064"]
        assert result.status == "completed"

    def test_each_request_carries_the_registry_specs(self) -> None:
        tools = [add_tool(), echo_tool()]
        _events, _result, model = run(THREE_STEPS, tools=tools)

        expected = al.ToolRegistry(tools).specs()
        assert [spec.name for spec in expected] == ["add", "echo"]
        assert [request.tools for request in model.requests] == [expected] * 3


# --- 5. Assistant messages precede their tool results, in assistant order --------------


BATCH = (echo_call("call-echo-001"), add_call(), echo_call("call-echo-002"))
BATCH_RESULTS = (echo_result("call-echo-001"), add_result(), echo_result("call-echo-002"))


class TestAssistantMessagesPrecedeToolResults:
    def test_calls_execute_and_results_append_in_assistant_order(self) -> None:
        """Seed: "Multiple calls execute sequentially in this workshop." and "appends
        the linked Tool-result message" after the assistant message."""
        executed: list[str] = []
        _events, result, model = run(
            [tool_turn("response-001", *BATCH), stop("response-002")],
            tools=recording_tools(executed),
        )

        assert executed == ["call-echo-001", "add", "call-echo-002"]
        assert model.requests[1].messages == (
            user(),
            assistant("response-001", *BATCH),
            *BATCH_RESULTS,
        )
        assert result.status == "completed"

    def test_each_call_has_started_then_finished_with_its_appended_result(self) -> None:
        """Seed: "For each call, it emits tool.started, awaits executeToolCall(), appends
        the linked Tool-result message, then emits tool.finished." """
        events, _result, model = run(
            [tool_turn("response-001", *BATCH), stop("response-002")],
            tools=[add_tool(), echo_tool()],
        )

        tool_events = [event for event in events if event.type.startswith("tool.")]
        assert types_of(tool_events) == ["tool.started", "tool.finished"] * 3
        for index, tool_call in enumerate(BATCH):
            started, finished = tool_events[2 * index : 2 * index + 2]
            assert dict(started.payload) == {"request_id": "request-001", "tool_call": tool_call}
            assert set(finished.payload) == {"request_id", "tool_call", "tool_result"}
            assert finished.payload["request_id"] == "request-001"
            assert finished.payload["tool_call"] == tool_call
            assert finished.payload["tool_result"] == BATCH_RESULTS[index]
            # already appended: the next request holds it at the same place
            assert model.requests[1].messages[2 + index] == finished.payload["tool_result"]

    def test_several_tool_rounds_each_append_assistant_then_results(self) -> None:
        events, result, _model = run(
            [
                tool_turn("response-001", add_call()),
                tool_turn("response-002", echo_call("call-echo-001"), echo_call("call-echo-002")),
                stop("response-003"),
            ],
            tools=[add_tool(), echo_tool()],
        )

        assert result.messages == (
            user(),
            assistant("response-001", add_call()),
            add_result(),
            assistant("response-002", echo_call("call-echo-001"), echo_call("call-echo-002")),
            echo_result("call-echo-001"),
            echo_result("call-echo-002"),
            assistant("response-003", text("The sum is 42.")),
        )
        assert types_of(events) == [
            "message.accepted",
            "model.chunk",
            "tool.started",
            "tool.finished",
            "model.chunk",
            "model.chunk",
            "tool.started",
            "tool.finished",
            "tool.started",
            "tool.finished",
            "model.chunk",
            "run.finished",
        ]
        assert result.steps == 3


# --- 6. Recoverable tool errors remain linked messages and reach the continuation ------


def explode(arguments: dict[str, Any], signal: Any) -> object:
    raise ValueError("the fuse blew")


def opaque(arguments: dict[str, Any], signal: Any) -> object:
    return {1, 2}


class TestRecoverableToolErrors:
    @pytest.mark.parametrize(
        ("tool_call", "tools", "named"),
        [
            pytest.param(
                call("search", "call-search-001", {"q": "x"}),
                [add_tool()],
                "search",
                id="unknown-tool",
            ),
            pytest.param(
                call("add", "call-add-001", {"left": "20", "right": 22}),
                [add_tool()],
                "left",
                id="schema-invalid-arguments",
            ),
            pytest.param(
                call("explode", "call-explode-001", {}),
                [no_arguments_tool("explode", explode)],
                "the fuse blew",
                id="tool-raises",
            ),
            pytest.param(
                call("opaque", "call-opaque-001", {}),
                [no_arguments_tool("opaque", opaque)],
                "opaque",
                id="non-json-return",
            ),
        ],
    )
    def test_a_tool_error_is_a_linked_result_that_reaches_the_continuation(
        self, tool_call: al.ToolCall, tools: list[al.Tool], named: str
    ) -> None:
        """Seed: "A recoverable Tool error is still appended and sent to the next model
        request; it does not end the run by itself." """
        events, result, model = run(
            [tool_turn("response-001", tool_call), stop("response-002", "Sorry.")],
            tools=tools,
        )

        error = result.messages[2]
        assert isinstance(error, al.ToolResultMessage)
        assert error.id == "tool-result-" + tool_call.id
        assert error.tool_call_id == tool_call.id
        assert error.tool_name == tool_call.name
        assert error.is_error is True
        assert named in error.content
        assert model.requests[1].messages == (user(), assistant("response-001", tool_call), error)
        finished = [event for event in events if event.type == "tool.finished"]
        assert [event.payload["tool_result"] for event in finished] == [error]
        assert result.status == "completed"
        assert result.final_text == "Sorry."


# --- 7. Event sequence values increase by one; run.finished is last --------------------


PRIOR_ROUND = (
    user("Add 1 and 2.", "user-000"),
    al.AssistantMessage(
        "message-response-000", (call("add", "call-add-000", {"left": 1, "right": 2}),)
    ),
    al.ToolResultMessage("tool-result-call-add-000", "call-add-000", "add", '{"sum":3}', False),
    al.AssistantMessage("message-response-000b", (text("It is 3."),)),
    user(),
)


def run_ending(status: str) -> tuple[list[al.Event], al.RunResult]:
    """A run with every kind of event that ends with ``status``."""
    script = [tool_turn("response-001", add_call()), stop("response-002")]
    if status == "completed":
        events, result, _ = run(script, messages=PRIOR_ROUND, tools=[add_tool()])
    elif status == "maxSteps":
        events, result, _ = run(script, messages=PRIOR_ROUND, tools=[add_tool()], max_steps=1)
    elif status == "failed":
        events, result, _ = run(script[:1], messages=PRIOR_ROUND, tools=[add_tool()])
    else:
        signal = threading.Event()
        loop = al.run_agent_loop(
            messages=PRIOR_ROUND,
            model=al.ScriptedModel(script),
            tools=al.ToolRegistry([add_tool()]),
            max_steps=4,
            signal=signal,
        )
        events, result = settle_setting_signal(loop, signal, ("model.chunk", 2))
    return events, result


class TestEventSequence:
    @pytest.mark.parametrize("status", ["completed", "maxSteps", "failed", "cancelled"])
    def test_one_counter_numbers_every_kind_of_event_and_run_finished_is_last(
        self, status: str
    ) -> None:
        """Seed: "Event sequence values increase by one across message, model, Tool, and
        terminal events; run.finished is last." """
        events, result = run_ending(status)

        assert result.status == status
        assert {"message.accepted", "model.chunk", "tool.started", "tool.finished"} <= set(
            types_of(events)
        )
        assert [event.sequence for event in events] == list(range(len(events)))
        assert types_of(events).count("run.finished") == 1
        assert events[-1].type == "run.finished"
        assert set(events[-1].payload) == {"result"}
        assert events[-1].payload["result"] is result

    def test_one_message_accepted_per_starting_message_in_order_first(self) -> None:
        """Seed: "It first emits one message.accepted event for every starting message." """
        events, _result, model = run([stop("response-001")], messages=PRIOR_ROUND)

        accepted = events[: len(PRIOR_ROUND)]
        assert types_of(accepted) == ["message.accepted"] * len(PRIOR_ROUND)
        assert [dict(event.payload) for event in accepted] == [
            {"message": message} for message in PRIOR_ROUND
        ]
        assert types_of(events).count("message.accepted") == len(PRIOR_ROUND)
        assert model.requests[0].messages == PRIOR_ROUND

    def test_each_chunk_event_carries_the_request_id_and_the_chunk(self) -> None:
        events, _result, _model = run(
            [
                al.scripted_response(
                    "response-001",
                    [text("Adding."), add_call()],
                    "toolCall",
                    chunks=[text("Add"), text("ing."), add_call()],
                ),
                stop("response-002"),
            ],
            tools=[add_tool()],
        )

        chunks = [dict(event.payload) for event in events if event.type == "model.chunk"]
        assert chunks == [
            {"request_id": "request-001", "chunk": al.TextDelta("request-001", "Add")},
            {"request_id": "request-001", "chunk": al.TextDelta("request-001", "ing.")},
            {"request_id": "request-001", "chunk": al.ToolCallChunk("request-001", add_call())},
            {"request_id": "request-002", "chunk": al.TextDelta("request-002", "The sum is 42.")},
        ]


# --- 8. Cancellation retains only complete messages, never a fabricated result ---------


CANCEL_START = (user("Add 20 and 22.", "user-001"), user("Then echo it.", "user-002"))


def cancel_script() -> list[Any]:
    """Step 1: text, add, echo (three chunks, two tools); step 2: the answer."""
    return [
        tool_turn("response-001", text("Adding."), add_call(), echo_call("call-echo-001")),
        stop("response-002"),
    ]


class TestCancellation:
    """Seed: "Cancellation retains only complete messages and never fabricates a Tool
    result for interrupted execution." Each case sets the signal at one point of the
    diagram; the run must match the uncancelled run up to that point, then finish."""

    @pytest.mark.parametrize(
        ("at", "kept", "steps", "open_ids", "executed"),
        [
            pytest.param(None, 2, 0, [], [], id="SnapshotRun-before-first-next"),
            pytest.param(("message.accepted", 1), 2, 0, [], [], id="EmitAccepted"),
            pytest.param(("message.accepted", 2), 2, 0, [], [], id="OpenModel-never-called"),
            pytest.param(("model.chunk", 1), 2, 1, [], [], id="ReadChunks-first-chunk"),
            pytest.param(("model.chunk", 3), 2, 1, [], [], id="ReadChunks-last-chunk"),
            pytest.param(
                ("tool.started", 1),
                3,
                1,
                ["call-add-001", "call-echo-001"],
                [],
                id="ExecuteTools-at-first-tool.started",
            ),
            pytest.param(
                ("tool.finished", 1),
                4,
                1,
                ["call-echo-001"],
                ["add"],
                id="ExecuteTools-second-call-never-starts",
            ),
            pytest.param(
                ("tool.started", 2),
                4,
                1,
                ["call-echo-001"],
                ["add"],
                id="ExecuteTools-at-second-tool.started",
            ),
            pytest.param(
                ("tool.finished", 2), 5, 1, [], ["add", "call-echo-001"], id="between-steps"
            ),
            pytest.param(
                ("model.chunk", 4), 5, 2, [], ["add", "call-echo-001"], id="ReadChunks-step-2"
            ),
        ],
    )
    def test_the_signal_aborts(
        self,
        at: tuple[str, int] | None,
        kept: int,
        steps: int,
        open_ids: list[str],
        executed: list[str],
    ) -> None:
        full_events, full, _ = run(
            cancel_script(), messages=CANCEL_START, tools=[add_tool(), echo_tool()]
        )
        assert full.status == "completed"

        ran: list[str] = []
        signal = threading.Event()
        model = al.ScriptedModel(cancel_script())
        loop = al.run_agent_loop(
            messages=CANCEL_START,
            model=model,
            tools=al.ToolRegistry(recording_tools(ran)),
            max_steps=4,
            signal=signal,
        )
        if at is None:
            signal.set()
            events, result = al.settle_run(loop)
        else:
            events, result = settle_setting_signal(loop, signal, at)

        assert result.status == "cancelled"
        assert_well_formed(events, result)
        # Up to the event that set the signal, the same events as the uncancelled run;
        # after it, nothing but run.finished.
        cut = 0 if at is None else index_of(full_events, at) + 1
        assert events[:-1] == full_events[:cut]
        assert result.messages == full.messages[:kept]
        assert result.steps == steps == model.call_count
        assert open_call_ids(result.messages) == open_ids
        assert ran == executed
        assert (result.final_text, result.max_steps, result.error) == (None, None, None)

    def test_a_response_that_arrives_after_cancellation_is_not_appended(self) -> None:
        """Seed: cancellation can arrive during "terminal response waiting"."""
        signal = threading.Event()

        def answer_then_abort(request: al.ModelRequest, signal: Any) -> Any:
            yield al.TextDelta(request.id, "The sum is 42.")
            signal.set()  # after the last chunk, before the terminal response
            return al.ModelResponse("response-001", request.id, (text("The sum is 42."),), "stop")

        events, result = run_with(GeneratorModel(answer_then_abort), signal=signal)

        assert result.status == "cancelled"
        assert types_of(events) == ["message.accepted", "model.chunk", "run.finished"]
        assert result.messages == (user(),)
        assert result.steps == 1
        assert_well_formed(events, result)

    def test_a_tool_that_returns_after_the_signal_has_its_result_discarded(self) -> None:
        """Seed: "Cancellation during Tool execution retains the complete assistant
        Tool-call message, emits tool.started, and appends no fabricated result." """
        ran: list[str] = []

        def abort_and_return(arguments: dict[str, Any], signal: Any) -> object:
            signal.set()
            return "done anyway"

        abort_call = call("abort", "call-abort-001", {})
        events, result, model = run(
            [
                tool_turn("response-001", abort_call, echo_call("call-echo-001")),
                stop("response-002"),
            ],
            tools=[no_arguments_tool("abort", abort_and_return), echo_tool(ran)],
            signal=threading.Event(),
        )

        assert result.status == "cancelled"
        assert types_of(events)[-2:] == ["tool.started", "run.finished"]
        assert "tool.finished" not in types_of(events)
        assert result.messages == (
            user(),
            assistant("response-001", abort_call, echo_call("call-echo-001")),
        )
        assert open_call_ids(result.messages) == ["call-abort-001", "call-echo-001"]
        assert ran == []
        assert model.call_count == 1

    @pytest.mark.parametrize("ending", ["returns", "raises", "raises-base-exception"])
    def test_from_another_thread_while_a_tool_blocks_on_the_signal(self, ending: str) -> None:
        """A tool that returns, or raises because it saw the signal: cancelled, not failed."""
        signal = threading.Event()
        started = threading.Event()

        def wait_for_abort(arguments: dict[str, Any], tool_signal: Any) -> object:
            started.set()
            tool_signal.wait(5)  # a safety net: the helper thread sets it at once
            if ending == "raises":
                raise RuntimeError("aborted")
            if ending == "raises-base-exception":
                raise Fatal("aborted")
            return "interrupted"

        wait_call = call("wait", "call-wait-001", {})
        thread = abort_from_another_thread(started, signal)
        events, result, model = run(
            [tool_turn("response-001", wait_call), stop("response-002")],
            tools=[no_arguments_tool("wait", wait_for_abort)],
            signal=signal,
        )
        assert_joined(thread)

        assert result.status == "cancelled"
        assert types_of(events) == [
            "message.accepted",
            "model.chunk",
            "tool.started",
            "run.finished",
        ]
        assert result.messages == (user(), assistant("response-001", wait_call))
        assert open_call_ids(result.messages) == ["call-wait-001"]
        assert model.call_count == 1

    @pytest.mark.parametrize("ending", ["yields-next-chunk", "returns-response", "raises"])
    def test_from_another_thread_while_a_model_stream_blocks_on_the_signal(
        self, ending: str
    ) -> None:
        """A stream that goes on, returns, or raises because it saw the signal: cancelled."""
        signal = threading.Event()
        waiting = threading.Event()

        def stream(request: al.ModelRequest, model_signal: Any) -> Any:
            yield al.TextDelta(request.id, "The sum")
            waiting.set()
            model_signal.wait(5)
            if ending == "raises":
                raise RuntimeError("stream aborted")
            if ending == "returns-response":
                return al.ModelResponse("response-001", request.id, (text("The sum"),), "stop")
            yield al.TextDelta(request.id, " is 42.")
            return al.ModelResponse("response-001", request.id, (text("The sum is 42."),), "stop")

        thread = abort_from_another_thread(waiting, signal)
        events, result = run_with(GeneratorModel(stream), signal=signal)
        assert_joined(thread)

        assert result.status == "cancelled"
        assert types_of(events) == ["message.accepted", "model.chunk", "run.finished"]
        assert result.messages == (user(),)
        assert result.steps == 1

    def test_a_model_stream_call_that_raises_because_it_saw_the_signal_is_cancelled(
        self,
    ) -> None:
        signal = threading.Event()
        waiting = threading.Event()

        def refuse(request: al.ModelRequest, model_signal: Any) -> Any:
            waiting.set()
            model_signal.wait(5)
            raise RuntimeError("the request was aborted")

        thread = abort_from_another_thread(waiting, signal)
        model = GeneratorModel(refuse)
        events, result = run_with(model, signal=signal)
        assert_joined(thread)

        assert result.status == "cancelled"
        assert types_of(events) == ["message.accepted", "run.finished"]
        assert result.messages == (user(),)
        assert result.steps == model.call_count == 1


# --- 9. The step budget: a one-step budget completes its batch, opens no continuation --


def budget_script(tool_steps: int) -> list[Any]:
    """``tool_steps`` toolCall steps (one echo each), then a stop response."""
    return [
        tool_turn(f"response-{step:03d}", echo_call(f"call-echo-{step:03d}"))
        for step in range(1, tool_steps + 1)
    ] + [stop(f"response-{tool_steps + 1:03d}")]


class TestStepBudget:
    @pytest.mark.parametrize("max_steps", [1, 2, 64])
    def test_tool_steps_up_to_the_budget_end_max_steps_without_a_continuation(
        self, max_steps: int
    ) -> None:
        """Seed: "If the current step equals maxSteps, the loop emits run.finished with
        status maxSteps and does not open another model request." """
        executed: list[str] = []
        events, result, model = run(
            budget_script(max_steps), tools=[echo_tool(executed)], max_steps=max_steps
        )

        assert result.status == "maxSteps"
        assert result.max_steps == max_steps
        assert result.steps == model.call_count == max_steps
        assert model.requests[-1].id == f"request-{max_steps:03d}"
        assert executed == [f"call-echo-{step:03d}" for step in range(1, max_steps + 1)]
        assert open_call_ids(result.messages) == []
        assert result.final_text is None
        assert_well_formed(events, result)

    @pytest.mark.parametrize("max_steps", [1, 2, 64])
    def test_a_stop_response_on_the_last_allowed_step_completes(self, max_steps: int) -> None:
        _events, result, model = run(
            budget_script(max_steps - 1), tools=[echo_tool()], max_steps=max_steps
        )

        assert result.status == "completed"
        assert result.max_steps is None
        assert result.steps == model.call_count == max_steps
        assert result.final_text == "The sum is 42."

    def test_the_budget_counts_model_turns_not_tool_calls(self) -> None:
        """Seed: "the budget counts model turns, not individual Tool calls." """
        calls = [echo_call(f"call-echo-{n:03d}") for n in range(1, 6)]
        executed: list[str] = []
        _events, result, _model = run(
            [tool_turn("response-001", *calls), stop("response-002")],
            tools=[echo_tool(executed)],
            max_steps=2,
        )

        assert len(executed) == 5
        assert result.status == "completed"
        assert result.steps == 2

    @pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
    def test_max_steps_is_set_only_for_a_max_steps_result(self, status: str) -> None:
        _events, result = run_ending(status)

        assert result.status == status
        assert result.max_steps is None


# --- Invalid starting transcripts --------------------------------------------------------


ADD_ROUND = (assistant("response-000", add_call()), add_result())

INVALID_STARTS = [
    pytest.param([user(), "Add 20 and 22."], id="non-message-item"),
    pytest.param([user(), user().to_dict()], id="message-dict-not-a-message"),
    pytest.param([user(), add_result()], id="result-without-call"),
    pytest.param(
        [user(), add_result(), assistant("response-000", add_call())], id="result-before-call"
    ),
    pytest.param(
        [
            user(),
            assistant("response-000", add_call()),
            al.ToolResultMessage("tool-result-call-add-001", "call-add-001", "echo", "42", False),
        ],
        id="mismatched-tool-name",
    ),
    pytest.param(
        [
            user(),
            *ADD_ROUND,
            al.ToolResultMessage("tool-result-again", "call-add-001", "add", "42", False),
        ],
        id="two-results-for-one-call",
    ),
    pytest.param([user("One.", "user-001"), user("Two.", "user-001")], id="duplicate-message-ids"),
    pytest.param(
        [user(), *ADD_ROUND, assistant("response-001", add_call())], id="duplicate-tool-call-ids"
    ),
    pytest.param(
        [user(), assistant("response-000", add_call(), add_call()), add_result()],
        id="duplicate-tool-call-ids-in-one-message",
    ),
    pytest.param([user(), assistant("response-000", add_call())], id="incomplete-open-call"),
    pytest.param(
        [user(), assistant("response-000", add_call(), echo_call("call-echo-001")), add_result()],
        id="incomplete-one-of-two-calls",
    ),
    pytest.param([al.UserMessage("user-001", cast(Any, 42))], id="user-content-int"),
    pytest.param([al.UserMessage("", "Hi.")], id="empty-id"),
    pytest.param([al.UserMessage(cast(Any, 7), "Hi.")], id="int-id"),
    pytest.param(
        [user(), al.AssistantMessage("message-response-000", cast(Any, ("Hello.",)))],
        id="assistant-block-not-a-block",
    ),
    pytest.param(
        [
            user(),
            assistant("response-000", add_call()),
            al.ToolResultMessage(
                "tool-result-call-add-001", "call-add-001", "add", "42", cast(Any, "no")
            ),
        ],
        id="result-is_error-not-bool",
    ),
    pytest.param(
        [
            user(),
            assistant(
                "response-000", al.ToolCall("call-add-001", "add", cast(Any, {"left": object()}))
            ),
            add_result(),
        ],
        id="tool-call-arguments-not-json",
    ),
]


def numbered_users(count: int) -> list[al.UserMessage]:
    return [al.UserMessage(f"user-{n:05d}", "Hi.") for n in range(count)]


class TestInvalidStartingTranscript:
    @pytest.mark.parametrize("messages", INVALID_STARTS)
    def test_an_invalid_start_fails_with_one_event_and_never_calls_the_model(
        self, messages: list[Any]
    ) -> None:
        """Seed: "An invalid starting transcript produces one run.finished event with a
        failed INVALID_TRANSCRIPT result and never invokes the model." """
        events, result, model = run([stop("response-001")], messages=messages, tools=[add_tool()])

        assert types_of(events) == ["run.finished"]
        assert_failed(events, result, "INVALID_TRANSCRIPT")
        assert model.call_count == 0
        assert result.messages == ()
        assert result.steps == 0

    @pytest.mark.parametrize(
        ("count", "status"),
        [
            pytest.param(al.MAX_INITIAL_MESSAGES, "completed", id="at-limit"),
            pytest.param(al.MAX_INITIAL_MESSAGES + 1, "failed", id="over-limit"),
        ],
    )
    def test_starting_messages_are_capped_at_4096(self, count: int, status: str) -> None:
        """Seed: "Initial messages are capped at 4096"."""
        messages = numbered_users(count)
        events, result, model = run([stop("response-001")], messages=messages)

        assert result.status == status
        if status == "completed":
            assert types_of(events).count("message.accepted") == 4096
            assert model.requests[0].messages == tuple(messages)
        else:
            assert_failed(events, result, "INVALID_TRANSCRIPT")
            assert types_of(events) == ["run.finished"]
            assert model.call_count == 0

    def test_an_endless_generator_of_messages_fails_instead_of_hanging(self) -> None:
        """Documented choice: at most MAX_INITIAL_MESSAGES + 1 items are read."""
        read = []

        def endless() -> Iterator[al.Message]:
            for n in itertools.count():
                assert n < 100_000, "the loop kept reading an endless iterable"
                read.append(n)
                yield al.UserMessage(f"user-{n}", "Hi.")

        events, result, model = run([stop("response-001")], messages=endless())

        assert_failed(events, result, "INVALID_TRANSCRIPT")
        assert len(read) == al.MAX_INITIAL_MESSAGES + 1
        assert model.call_count == 0

    def test_an_empty_start_is_a_complete_transcript(self) -> None:
        """Documented choice: an empty starting transcript is complete, hence valid."""
        events, result, model = run([stop("response-001")], messages=[])

        assert result.status == "completed"
        assert model.requests[0].messages == ()
        assert types_of(events) == ["model.chunk", "run.finished"]

    def test_a_start_with_complete_prior_tool_rounds_is_valid(self) -> None:
        _events, result, model = run(
            [tool_turn("response-001", add_call()), stop("response-002")],
            messages=PRIOR_ROUND,
            tools=[add_tool()],
        )

        assert result.status == "completed"
        assert result.messages[: len(PRIOR_ROUND)] == PRIOR_ROUND
        assert model.requests[0].messages == PRIOR_ROUND


# --- Model correlation and normalized chunk/response agreement ---------------------------


def foreign_text_chunk(request: al.ModelRequest, signal: Any) -> Any:
    yield al.TextDelta("request-999", "The sum is 42.")
    return al.ModelResponse("response-001", request.id, (text("The sum is 42."),), "stop")


def foreign_call_chunk(request: al.ModelRequest, signal: Any) -> Any:
    yield al.ToolCallChunk("request-999", add_call())
    return al.ModelResponse("response-001", request.id, (add_call(),), "toolCall")


def returns_a_dict(request: al.ModelRequest, signal: Any) -> Any:
    yield al.TextDelta(request.id, "The sum is 42.")
    return stop("response-001").__dict__


def returns_a_list(request: al.ModelRequest, signal: Any) -> Any:
    return [al.TextDelta(request.id, "The sum is 42.")]


def streams_a_block(request: al.ModelRequest, signal: Any) -> Any:
    yield text("The sum is 42.")
    return al.ModelResponse("response-001", request.id, (text("The sum is 42."),), "stop")


def text_chunk_not_a_str(request: al.ModelRequest, signal: Any) -> Any:
    yield al.TextDelta(request.id, cast(Any, 42))
    return al.ModelResponse("response-001", request.id, (text("42"),), "stop")


def call_chunk_not_a_call(request: al.ModelRequest, signal: Any) -> Any:
    yield al.ToolCallChunk(request.id, cast(Any, add_call().to_dict()))
    return al.ModelResponse("response-001", request.id, (add_call(),), "toolCall")


def scripted(
    content: Sequence[Any], stop_reason: str = "toolCall", chunks: Sequence[Any] | None = None
) -> list[Any]:
    return [al.scripted_response("response-001", content, cast(Any, stop_reason), chunks=chunks)]


PROTOCOL_VIOLATIONS = [
    pytest.param(foreign_text_chunk, [user()], id="text-chunk-other-request-id"),
    pytest.param(foreign_call_chunk, [user()], id="tool-call-chunk-other-request-id"),
    pytest.param(
        [
            al.scripted_response(
                "response-001", [text("The sum is 42.")], "stop", request_id="request-999"
            )
        ],
        [user()],
        id="response-other-request-id",
    ),
    pytest.param(
        scripted([text("The sum is 42.")], "stop", [text("The sum is 41.")]),
        [user()],
        id="text-differs",
    ),
    pytest.param(
        scripted([add_call()], chunks=[call("add", "call-add-001", {"left": 20, "right": 23})]),
        [user()],
        id="tool-call-arguments-differ",
    ),
    pytest.param(
        scripted([add_call()], chunks=[add_call("call-add-002")]),
        [user()],
        id="tool-call-id-differs",
    ),
    pytest.param(
        scripted([text("Adding."), add_call()], chunks=[add_call(), text("Adding.")]),
        [user()],
        id="order-differs",
    ),
    pytest.param(
        scripted([text("Adding."), add_call()], chunks=[text("Adding.")]),
        [user()],
        id="missing-chunk",
    ),
    pytest.param(
        scripted([add_call()], chunks=[add_call(), text("More.")]), [user()], id="extra-chunk"
    ),
    pytest.param(scripted([text("Hi."), add_call()], "stop"), [user()], id="tool-call-in-stop"),
    pytest.param(
        scripted([text("Hi.")], "toolCall"), [user()], id="tool-call-response-without-calls"
    ),
    pytest.param(scripted([text("Hi.")], "length"), [user()], id="unknown-stop-reason"),
    pytest.param(returns_a_dict, [user()], id="response-not-a-model-response"),
    pytest.param(returns_a_list, [user()], id="stream-returns-a-non-generator"),
    pytest.param(streams_a_block, [user()], id="chunk-not-a-model-chunk"),
    pytest.param(text_chunk_not_a_str, [user()], id="text-chunk-not-a-str"),
    pytest.param(call_chunk_not_a_call, [user()], id="tool-call-chunk-without-a-tool-call"),
    pytest.param(
        scripted([call("add", "", {"left": 20, "right": 22})]), [user()], id="tool-call-empty-id"
    ),
    pytest.param(
        scripted([call("", "call-add-001", {"left": 20, "right": 22})]),
        [user()],
        id="tool-call-empty-name",
    ),
    pytest.param(
        [al.scripted_response("", [text("The sum is 42.")], "stop")],
        [user()],
        id="empty-response-id",
    ),
    pytest.param(
        scripted([add_call(), add_call()]), [user()], id="duplicate-call-ids-in-response"
    ),
    pytest.param(
        scripted([add_call()]), [user(), *ADD_ROUND], id="call-id-reused-from-transcript"
    ),
    pytest.param(
        scripted([text("The sum is 42.")], "stop"),
        [user(), al.UserMessage("message-response-001", "Hi.")],
        id="response-id-reused",
    ),
    pytest.param(
        scripted([add_call()]),
        [user(), al.UserMessage("tool-result-call-add-001", "Hi.")],
        id="result-id-already-taken",
    ),
]


class TestModelCorrelationAndAgreement:
    @pytest.mark.parametrize(
        "script",
        [
            pytest.param(
                scripted([text("The sum is 42.")], "stop", [text("The su"), text("m is 42.")]),
                id="chunks-split-terminal-whole",
            ),
            pytest.param(
                scripted([text("The su"), text("m is 42.")], "stop", [text("The sum is 42.")]),
                id="terminal-split-chunk-whole",
            ),
            pytest.param(
                scripted(
                    [text("The "), text("sum is 42.")], "stop", [text("The sum"), text(" is 42.")]
                ),
                id="both-split-differently",
            ),
        ],
    )
    def test_text_segmentation_may_differ(self, script: list[Any]) -> None:
        """Seed: "The resulting normalized block sequences must agree in content and
        order; raw text-chunk segmentation may differ." """
        events, result, _model = run(script)

        assert result.status == "completed"
        assert result.final_text == "The sum is 42."
        assert types_of(events).count("model.chunk") == len(script[0].chunks)

    def test_tool_calls_are_boundaries_of_coalesced_text(self) -> None:
        """Seed: "coalesces adjacent streamed text deltas and adjacent terminal text
        blocks, using Tool calls as boundaries"."""
        content: list[Any] = [text("Add"), text("ing "), add_call(), text("now.")]
        chunks: list[Any] = [text("Adding "), add_call(), text("no"), text("w.")]
        _events, result, _model = run(
            [
                al.scripted_response("response-001", content, "toolCall", chunks=chunks),
                stop("response-002"),
            ],
            tools=[add_tool()],
        )

        assert result.status == "completed"
        assert result.messages[1] == assistant("response-001", *content)  # as returned

    def test_an_empty_text_chunk_carries_nothing(self) -> None:
        """Documented choice: normalisation drops empty text."""
        events, result, _model = run(
            [
                al.scripted_response(
                    "response-001", [add_call()], "toolCall", chunks=[text(""), add_call()]
                ),
                stop("response-002"),
            ],
            tools=[add_tool()],
        )

        assert result.status == "completed"
        assert types_of(events)[1:3] == ["model.chunk", "model.chunk"]

    def test_text_cannot_move_across_a_tool_call(self) -> None:
        content: list[Any] = [text("Adding "), add_call(), text("now.")]
        chunks: list[Any] = [text("Adding now."), add_call()]
        executed: list[str] = []
        events, result, _model = run(
            [al.scripted_response("response-001", content, "toolCall", chunks=chunks)],
            tools=recording_tools(executed),
        )

        assert_failed(events, result, "MODEL_PROTOCOL_ERROR")
        assert executed == []

    @pytest.mark.parametrize(("script", "start"), PROTOCOL_VIOLATIONS)
    def test_a_protocol_violation_fails_before_any_tool_runs(
        self, script: Any, start: list[al.Message]
    ) -> None:
        """Seed: "These checks occur before a Tool effect. Contradiction or excess becomes
        a failed MODEL_PROTOCOL_ERROR result." The bad response is never appended."""
        executed: list[str] = []
        model = model_of(script)
        events, result = run_with(model, messages=start, tools=recording_tools(executed))

        assert_failed(events, result, "MODEL_PROTOCOL_ERROR")
        assert executed == []
        assert "tool.started" not in types_of(events)
        assert result.messages == tuple(start)
        assert result.steps == model.call_count == 1

    def test_a_chunk_with_another_request_id_has_no_event(self) -> None:
        """Seed: "Request IDs must match the active request." """
        events, result = run_with(GeneratorModel(foreign_text_chunk))

        assert types_of(events) == ["message.accepted", "run.finished"]
        assert_failed(events, result, "MODEL_PROTOCOL_ERROR")

    def test_a_violation_in_a_later_step_keeps_the_earlier_rounds(self) -> None:
        executed: list[str] = []
        events, result, _model = run(
            [
                tool_turn("response-001", add_call()),
                al.scripted_response(
                    "response-002", [text("Done."), add_call("call-add-002")], "stop"
                ),
            ],
            tools=recording_tools(executed),
        )

        assert_failed(events, result, "MODEL_PROTOCOL_ERROR")
        assert executed == ["add"]
        assert result.messages == (user(), assistant("response-001", add_call()), add_result())
        assert result.steps == 2


# --- Failure codes ---------------------------------------------------------------------


class TestFailureCodes:
    def test_invalid_transcript(self) -> None:
        events, result, _model = run([stop("response-001")], messages=[user(), add_result()])

        assert_failed(events, result, "INVALID_TRANSCRIPT")
        assert "tool-result-call-add-001" in result.error.message  # type: ignore[union-attr]

    def test_model_protocol_error(self) -> None:
        """Seed: "Tool calls are forbidden in a stop response." """
        events, result, _model = run(scripted([add_call()], "stop"), tools=[add_tool()])

        assert_failed(events, result, "MODEL_PROTOCOL_ERROR")
        assert result.messages == (user(),)

    def test_model_stream_error_when_the_stream_raises_after_a_chunk(self) -> None:
        def breaks(request: al.ModelRequest, signal: Any) -> Any:
            yield al.TextDelta(request.id, "The sum")
            raise ConnectionError("the socket closed")

        events, result = run_with(GeneratorModel(breaks))

        assert_failed(events, result, "MODEL_STREAM_ERROR")
        assert types_of(events) == ["message.accepted", "model.chunk", "run.finished"]
        assert "the socket closed" in result.error.message  # type: ignore[union-attr]
        assert result.messages == (user(),)
        assert result.steps == 1

    def test_model_stream_error_when_model_stream_itself_raises(self) -> None:
        def refuses(request: al.ModelRequest, signal: Any) -> Any:
            raise ConnectionError("no route to the model")

        model = GeneratorModel(refuses)
        events, result = run_with(model)

        assert_failed(events, result, "MODEL_STREAM_ERROR")
        assert types_of(events) == ["message.accepted", "run.finished"]
        assert "no route to the model" in result.error.message  # type: ignore[union-attr]
        assert result.steps == model.call_count == 1

    def test_model_stream_error_when_a_scripted_model_runs_out_of_responses(self) -> None:
        events, result, model = run([tool_turn("response-001", add_call())], tools=[add_tool()])

        assert_failed(events, result, "MODEL_STREAM_ERROR")
        assert model.call_count == 2
        assert [request.id for request in model.requests] == ["request-001", "request-002"]
        round_one = (user(), assistant("response-001", add_call()), add_result())
        assert model.requests[1].messages == round_one
        assert result.messages == round_one
        assert result.steps == 2

    def test_tool_phase_error_when_a_tool_raises_a_base_exception(self) -> None:
        def fatal(arguments: dict[str, Any], signal: Any) -> object:
            raise Fatal("the disk caught fire")

        fatal_call = call("fatal", "call-fatal-001", {})
        events, result, model = run(
            [tool_turn("response-001", fatal_call, add_call()), stop("response-002")],
            tools=[no_arguments_tool("fatal", fatal), add_tool()],
            signal=threading.Event(),
        )

        assert_failed(events, result, "TOOL_PHASE_ERROR")
        assert "the disk caught fire" in result.error.message  # type: ignore[union-attr]
        assert types_of(events)[-2:] == ["tool.started", "run.finished"]
        assert "tool.finished" not in types_of(events)
        assert result.messages == (user(), assistant("response-001", fatal_call, add_call()))
        assert open_call_ids(result.messages) == ["call-fatal-001", "call-add-001"]
        assert model.call_count == 1

    @pytest.mark.parametrize(
        "interrupt",
        [
            pytest.param(KeyboardInterrupt(), id="KeyboardInterrupt"),
            pytest.param(SystemExit(3), id="SystemExit"),
        ],
    )
    def test_keyboard_interrupt_and_system_exit_from_a_tool_propagate_unchanged(
        self, interrupt: BaseException
    ) -> None:
        def interrupted(arguments: dict[str, Any], signal: Any) -> object:
            raise interrupt

        loop = al.run_agent_loop(
            messages=[user()],
            model=al.ScriptedModel(
                [tool_turn("response-001", call("stop-me", "call-stop-me-001", {}))]
            ),
            tools=al.ToolRegistry([no_arguments_tool("stop-me", interrupted)]),
            max_steps=1,
        )
        seen = [next(loop).type for _ in range(3)]
        assert seen == ["message.accepted", "model.chunk", "tool.started"]
        with pytest.raises(type(interrupt)) as raised:
            next(loop)  # runs the tool

        assert raised.value is interrupt
        assert list(loop) == []  # the generator is finished: nothing is swallowed or resumed


# --- The run's helpers: settle_run, text_from_assistant, the signal --------------------


class TestRunHelpers:
    def test_settle_run_returns_every_event_and_the_return_value(self) -> None:
        result = al.RunResult("completed", (), 0, final_text="")
        finished = al.Event(1, "run.finished", {"result": result})
        accepted = al.Event(0, "message.accepted", {"message": user()})

        def two_events() -> Generator[al.Event, None, al.RunResult]:
            yield accepted
            yield finished
            return result

        events, returned = al.settle_run(two_events())

        assert events == [accepted, finished]
        assert returned is result

    @pytest.mark.parametrize(
        ("blocks", "expected"),
        [
            pytest.param((text("The sum"), text(" is 42.")), "The sum is 42.", id="no-separator"),
            pytest.param(
                (text("A"), add_call(), text("B"), echo_call("call-echo-001")),
                "AB",
                id="skips-calls",
            ),
            pytest.param((add_call(),), "", id="calls-only"),
            pytest.param((), "", id="empty"),
        ],
    )
    def test_text_from_assistant_concatenates_text_blocks(
        self, blocks: tuple[Any, ...], expected: str
    ) -> None:
        assert al.text_from_assistant(al.AssistantMessage("message-x", blocks)) == expected

    def test_final_text_is_the_text_of_the_stop_response(self) -> None:
        """Seed: "the assistant message is appended and textFromAssistant() becomes
        finalText." """
        _events, result, _model = run(scripted([text("The sum"), text(" is 42.")], "stop"))

        assert result.final_text == "The sum is 42."
        assert result.messages[-1] == assistant("response-001", text("The sum"), text(" is 42."))

    @pytest.mark.parametrize("given", ["None", "Event", "signal-like"])
    def test_the_model_and_every_tool_receive_the_run_signal(self, given: str) -> None:
        signal: Any = {"None": None, "Event": threading.Event(), "signal-like": SignalLike()}[
            given
        ]
        received: list[Any] = []

        def stream(request: al.ModelRequest, model_signal: Any) -> Any:
            received.append(model_signal)
            if len(received) == 1:
                yield al.ToolCallChunk(request.id, call("note", "call-note-001", {}))
                return al.ModelResponse(
                    "response-001", request.id, (call("note", "call-note-001", {}),), "toolCall"
                )
            yield al.TextDelta(request.id, "Done.")
            return al.ModelResponse("response-002", request.id, (text("Done."),), "stop")

        def note(arguments: dict[str, Any], tool_signal: Any) -> object:
            received.append(tool_signal)
            return "noted"

        _events, result = run_with(
            GeneratorModel(stream), tools=[no_arguments_tool("note", note)], signal=signal
        )

        assert result.status == "completed"
        assert len(received) == 3
        assert received[0] is received[1] is received[2]
        if signal is None:
            assert isinstance(received[0], threading.Event)
            assert not received[0].is_set()
        else:
            assert received[0] is signal
