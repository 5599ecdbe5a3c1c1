"""Tests for issue "Record once, replay forever": ``replay(events) -> ReplayedRun``,
``RunResult.next_request_sequence``, and JSON lines recordings that replay exactly.

The suite imports ``agent_loop`` once, as ``al``; its helpers are prefixed ``_rp_`` so
that it can join test_agent_loop.py without a clash.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import random
import re
import threading
from typing import Any, Callable, Iterable, Sequence

import pytest

import agent_loop as al

# --- Helpers: record a run, replay it, compare the logs ----------------------------------


def _rp_user(text: str = "Add 20 and 22.", id: str = "user-001") -> al.UserMessage:
    return al.UserMessage(id, text)


def _rp_echo(executed: list[str] | None = None) -> al.Tool:
    """Returns its ``text`` argument, and records each text it ran with."""

    def echo(arguments: dict[str, Any], signal: al.Signal) -> object:
        if executed is not None:
            executed.append(arguments["text"])
        return arguments["text"]

    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    return al.Tool("echo", "Returns its text.", schema, echo)


def _rp_counter(start: int = 41) -> al.Tool:
    """A tool that answers differently each time: a recording must not run it again."""
    count = [start]

    def counter(arguments: dict[str, Any], signal: al.Signal) -> object:
        count[0] += 1
        return str(count[0])

    return al.Tool("counter", "Counts.", {"type": "object"}, counter)


def _rp_refuse(arguments: dict[str, Any], signal: al.Signal) -> object:
    raise al.ToolError("No, and that is final.")


def _rp_boom(arguments: dict[str, Any], signal: al.Signal) -> object:
    raise LookupError("nothing here")


def _rp_tools(executed: list[str] | None = None) -> list[al.Tool]:
    """echo, counter, refuse (ToolError) and boom (raises): every kind of result."""
    return [
        _rp_echo(executed),
        _rp_counter(),
        al.Tool("refuse", "Refuses.", {"type": "object"}, _rp_refuse),
        al.Tool("boom", "Raises.", {"type": "object"}, _rp_boom),
    ]


def _rp_call(name: str, id: str, **arguments: Any) -> al.ToolCall:
    return al.ToolCall(id, name, arguments)


def _rp_text(value: str) -> al.TextBlock:
    return al.TextBlock(value)


def _rp_record(
    responses: Sequence[al.ScriptedResponse],
    *,
    messages: Sequence[al.Message] | None = None,
    tools: Sequence[al.Tool] | None = None,
    max_steps: int = 8,
    request_sequence_start: int = 0,
    cancel_when: Callable[[al.Event], bool] | None = None,
) -> tuple[list[al.Event], al.RunResult]:
    """Runs a ScriptedModel to the end, setting the signal once ``cancel_when`` holds for
    an event the consumer received; returns the events and the result."""
    signal = threading.Event()
    run = al.run_agent_loop(
        messages=[_rp_user()] if messages is None else messages,
        model=al.ScriptedModel(responses),
        tools=al.ToolRegistry(_rp_tools() if tools is None else tools),
        max_steps=max_steps,
        signal=signal,
        request_sequence_start=request_sequence_start,
    )
    events: list[al.Event] = []
    while True:
        try:
            event = next(run)
        except StopIteration as done:
            return events, done.value
        events.append(event)
        if cancel_when is not None and cancel_when(event):
            signal.set()


def _rp_settle(replayed: al.ReplayedRun) -> tuple[list[al.Event], al.RunResult]:
    return al.settle_run(replayed.run())


def _rp_dicts(events: Iterable[al.Event]) -> list[dict[str, Any]]:
    return [event.to_dict() for event in events]


def _rp_json_lines(events: Iterable[al.Event]) -> str:
    """A recording as the demo's --json writes it: one to_dict() per line."""
    return "".join(json.dumps(event.to_dict(), ensure_ascii=False) + "\n" for event in events)


def _rp_read_json_lines(text: str) -> list[al.Event]:
    return [al.event_from_dict(json.loads(line)) for line in text.splitlines()]


def _rp_assert_replays_exactly(events: list[al.Event]) -> al.ReplayedRun:
    """replay() of the log, live and read back from JSON lines, reproduces it exactly."""
    for log in (events, _rp_read_json_lines(_rp_json_lines(events))):
        replayed = al.replay(log)
        again, result = _rp_settle(replayed)
        assert _rp_dicts(again) == _rp_dicts(events)
        assert result == events[-1].payload["result"]
    return replayed


def _rp_demo(*options: str) -> str:
    """The demonstration's output with ``--json`` and the options."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert al._main(["--json", *options]) == 0
    return out.getvalue()


def _rp_tool_step(response_id: str, *blocks: al.TextBlock | al.ToolCall) -> al.ScriptedResponse:
    return al.scripted_response(response_id, blocks, "toolCall")


def _rp_stop(response_id: str, final: str = "Done.") -> al.ScriptedResponse:
    return al.scripted_response(response_id, [_rp_text(final)], "stop")


def _rp_three_step_script() -> list[al.ScriptedResponse]:
    """Text split into chunks (an empty delta too), tool calls of every kind of result."""
    return [
        al.scripted_response(
            "response-001",
            [_rp_text("Echo, then count."), _rp_call("echo", "call-1", text="one")],
            "toolCall",
            chunks=[
                _rp_text("Echo, "),
                _rp_text(""),
                _rp_text("then count."),
                _rp_call("echo", "call-1", text="one"),
            ],
        ),
        _rp_tool_step(
            "response-002",
            _rp_call("counter", "call-2"),
            _rp_call("refuse", "call-3"),
            _rp_call("boom", "call-4"),
            _rp_call("missing", "call-5"),
            _rp_call("echo", "call-6", text=5),
        ),
        al.scripted_response(
            "response-003",
            [_rp_text("All done.")],
            "stop",
            chunks=[_rp_text("All "), _rp_text("done.")],
        ),
    ]


class _RpSignalWithoutSet:
    """A Signal (is_set() and wait()) that cannot be set."""

    def is_set(self) -> bool:
        return False

    def wait(self, timeout: float | None = None) -> bool:
        return False


# --- Exact replay -----------------------------------------------------------------------


class TestExactReplay:
    """Issue: "Running the loop on them with the recorded budget yields an event log whose
    to_dict() equals the recording, for every run that ended completed or maxSteps." """

    def test_a_completed_run_replays_exactly_and_runs_no_tool(self) -> None:
        executed: list[str] = []
        events, result = _rp_record(_rp_three_step_script(), tools=_rp_tools(executed))
        assert result.status == "completed"
        assert executed == ["one"]
        replayed = _rp_assert_replays_exactly(events)
        assert executed == ["one"]  # the recorded tools answered; nothing ran again
        assert replayed.messages == (_rp_user(),)
        assert replayed.max_steps == 3
        assert replayed.request_sequence_start == 0

    def test_chunks_are_streamed_as_recorded_empty_deltas_included(self) -> None:
        events, _ = _rp_record(_rp_three_step_script())
        again, _ = _rp_settle(al.replay(events))
        chunks = [event.payload["chunk"] for event in again if event.type == "model.chunk"]
        assert chunks[:3] == [
            al.TextDelta("request-001", "Echo, "),
            al.TextDelta("request-001", ""),
            al.TextDelta("request-001", "then count."),
        ]
        assert len(chunks) == 4 + 5 + 2

    def test_recorded_error_results_are_reproduced_exactly(self) -> None:
        """Issue: "replay's recorded-result tools may use it [ToolError] to reproduce
        is_error=True results exactly"."""
        events, result = _rp_record(_rp_three_step_script())
        _, again = _rp_settle(al.replay(events))
        results = [m for m in again.messages if isinstance(m, al.ToolResultMessage)]
        assert [(m.content, m.is_error) for m in results] == [
            ("one", False),
            ("42", False),
            ("No, and that is final.", True),
            ("tool 'boom' raised LookupError: nothing here", True),
            ("unknown tool 'missing' (available: echo, counter, refuse, boom)", True),
            ("invalid arguments for tool 'echo': $.text must be string, got integer", True),
        ]
        assert again.messages == result.messages

    def test_a_non_deterministic_tool_answers_as_recorded(self) -> None:
        script = [_rp_tool_step("response-001", _rp_call("counter", "call-1")), _rp_stop("r2")]
        events, result = _rp_record(script)
        assert result.messages[2].content == "42"
        for _ in range(3):  # a ReplayedRun runs again and again, one run at a time
            _rp_assert_replays_exactly(events)

    def test_a_max_steps_run_replays_exactly_with_its_budget(self) -> None:
        script = [
            _rp_tool_step("response-001", _rp_call("echo", "call-1", text="a")),
            _rp_tool_step("response-002", _rp_call("counter", "call-2")),
            _rp_stop("response-003"),
        ]
        events, result = _rp_record(script, max_steps=2)
        assert result.status == "maxSteps"
        replayed = _rp_assert_replays_exactly(events)
        assert replayed.max_steps == 2

    def test_a_run_with_history_and_a_request_sequence_start_replays_exactly(self) -> None:
        history: list[al.Message] = [
            _rp_user("Hi.", "user-000"),
            al.AssistantMessage("message-response-000", (_rp_call("weather", "call-0"),)),
            al.ToolResultMessage("tool-result-call-0", "call-0", "weather", "Sunny.", False),
            al.AssistantMessage("message-response-00", (_rp_text("Hello."),)),
            _rp_user(),
        ]
        script = [_rp_tool_step("response-005", _rp_call("echo", "call-1", text="b"))]
        events, result = _rp_record(
            [*script, _rp_stop("response-006")], messages=history, request_sequence_start=4
        )
        assert result.status == "completed"
        replayed = _rp_assert_replays_exactly(events)
        assert replayed.messages == tuple(history)
        assert replayed.request_sequence_start == 4
        # The tools are those the run's own calls name, not the history's.
        assert [tool.name for tool in replayed.tools] == ["echo"]

    def test_a_step_that_streamed_nothing_replays_exactly(self) -> None:
        """A stop response with no content streams no chunk: its request has no event."""
        script = [
            _rp_tool_step("response-001", _rp_call("echo", "call-1", text="a")),
            al.scripted_response("response-002", [], "stop"),
        ]
        events, result = _rp_record(script)
        assert result.status == "completed"
        assert result.final_text == ""
        assert "request-002" not in json.dumps(_rp_dicts(events))
        _rp_assert_replays_exactly(events)

    def test_the_replayed_run_is_run_agent_loop_on_its_fields(self) -> None:
        """Issue: "a frozen dataclass with messages, model, tools, max_steps and
        request_sequence_start, whose run() returns run_agent_loop(...) on them"."""
        events, _ = _rp_record(_rp_three_step_script())
        replayed = al.replay(iter(events))
        assert [field.name for field in dataclasses.fields(al.ReplayedRun)] == [
            "messages",
            "model",
            "tools",
            "max_steps",
            "request_sequence_start",
        ]
        with pytest.raises(dataclasses.FrozenInstanceError):
            replayed.max_steps = 4  # type: ignore[misc]
        assert [tool.name for tool in replayed.tools] == [
            "echo",
            "counter",
            "refuse",
            "boom",
            "missing",
        ]
        assert all(spec.parameters == {"type": "object"} for spec in replayed.tools.specs())
        by_hand = al.run_agent_loop(
            messages=replayed.messages,
            model=replayed.model,
            tools=replayed.tools,
            max_steps=replayed.max_steps,
        )
        assert _rp_dicts(al.settle_run(by_hand)[0]) == _rp_dicts(events)

    def test_a_larger_budget_changes_nothing_for_a_completed_run(self) -> None:
        events, _ = _rp_record(_rp_three_step_script())
        replayed = dataclasses.replace(al.replay(events), max_steps=al.MAX_AGENT_STEPS)
        assert _rp_dicts(_rp_settle(replayed)[0]) == _rp_dicts(events)

    def test_a_request_the_recording_does_not_hold_fails_the_run(self) -> None:
        script = [
            _rp_tool_step("response-001", _rp_call("echo", "call-1", text="a")),
            _rp_stop("response-002"),
        ]
        events, result = _rp_record(script, max_steps=1)
        assert result.status == "maxSteps"
        again, failed = _rp_settle(dataclasses.replace(al.replay(events), max_steps=2))
        assert _rp_dicts(again[:-1]) == _rp_dicts(events[:-1])
        assert failed.status == "failed"
        assert failed.error is not None
        assert failed.error.code == "MODEL_STREAM_ERROR"
        assert failed.error.message == (
            "model.stream() raised RuntimeError: the recording holds no request-002 "
            "(it holds request-001)"
        )


# --- Cancelled and failed runs ----------------------------------------------------------


def _rp_two_call_script() -> list[al.ScriptedResponse]:
    return [
        al.scripted_response(
            "response-001",
            [_rp_text("Two calls."), _rp_call("echo", "call-1", text="a")],
            "toolCall",
            chunks=[_rp_text("Two "), _rp_text("calls."), _rp_call("echo", "call-1", text="a")],
        ),
        _rp_tool_step(
            "response-002",
            _rp_call("echo", "call-2", text="b"),
            _rp_call("counter", "call-3"),
        ),
        _rp_stop("response-003"),
    ]


def _rp_at(sequence: int) -> Callable[[al.Event], bool]:
    return lambda event: event.sequence == sequence


class TestReplayOfCancelledAndFailedRuns:
    """replay(): "A cancelled or failed run is replayed to where its log stops. There, the
    replayed code that has control ... sets the run's signal, so the replay ends cancelled
    at that point"."""

    @pytest.mark.parametrize(
        "sequence",
        [
            pytest.param(1, id="at-a-chunk"),
            pytest.param(3, id="at-the-last-chunk"),
            pytest.param(4, id="at-tool-started"),
            pytest.param(8, id="at-a-tool-started-of-the-second-step"),
        ],
    )
    def test_a_run_cancelled_while_the_model_or_a_tool_had_control_replays_exactly(
        self, sequence: int
    ) -> None:
        """ "a run cancelled while the model or a tool had control (the signal was seen
        during a request or a tool call) replays exactly"."""
        events, result = _rp_record(_rp_two_call_script(), cancel_when=_rp_at(sequence))
        assert result.status == "cancelled"
        assert events[-2].sequence == sequence
        replayed = _rp_assert_replays_exactly(events)
        assert replayed.max_steps == result.steps + 1

    def test_a_tool_that_saw_the_signal_replays_exactly(self) -> None:
        def cancels(arguments: dict[str, Any], signal: al.Signal) -> object:
            assert isinstance(signal, threading.Event)
            signal.set()
            return "too late"

        tools = [*_rp_tools(), al.Tool("cancels", "Cancels.", {"type": "object"}, cancels)]
        script = [_rp_tool_step("response-001", _rp_call("cancels", "call-1"))]
        events, result = _rp_record(script, tools=tools)
        assert result.status == "cancelled"
        assert [call.id for call in al.open_tool_calls(result.messages)] == ["call-1"]
        _rp_assert_replays_exactly(events)

    def test_a_consumer_that_cancelled_between_two_tool_calls_gets_one_tool_started_more(
        self,
    ) -> None:
        """ "a run that its consumer cancelled between two events runs on to the next such
        point: one more tool.started (the call gets no result, as recorded)"."""
        events, result = _rp_record(_rp_two_call_script(), cancel_when=_rp_at(9))
        assert events[-2].type == "tool.finished"
        again, replayed = _rp_settle(al.replay(events))
        one_more = {
            "sequence": 10,
            "type": "tool.started",
            "payload": {
                "requestId": "request-002",
                "toolCall": _rp_call("counter", "call-3").to_dict(),
            },
        }
        assert _rp_dicts(again[:-1]) == [*_rp_dicts(events[:-1]), one_more]
        assert replayed == result

    @pytest.mark.parametrize(
        ("sequence", "steps"),
        [pytest.param(5, 1, id="after-a-batch"), pytest.param(0, 0, id="at-accepted")],
    )
    def test_a_consumer_that_cancelled_before_a_request_gets_one_request_more(
        self, sequence: int, steps: int
    ) -> None:
        """ "... or one more request counted in steps"."""
        events, result = _rp_record(_rp_two_call_script(), cancel_when=_rp_at(sequence))
        assert result.steps == steps
        again, replayed = _rp_settle(al.replay(events))
        assert _rp_dicts(again) == [*_rp_dicts(events)[:-1], again[-1].to_dict()]
        assert replayed == dataclasses.replace(result, steps=steps + 1)

    def test_a_run_cancelled_before_its_first_event_replays_exactly(self) -> None:
        """Cancelled at SnapshotRun: the result holds the starting messages, no event does."""
        signal = threading.Event()
        signal.set()
        events, result = al.settle_run(
            al.run_agent_loop(
                messages=[_rp_user()],
                model=al.ScriptedModel([]),
                tools=al.ToolRegistry(),
                max_steps=1,
                signal=signal,
            )
        )
        assert [event.type for event in events] == ["run.finished"]
        replayed = al.replay(events)
        assert replayed.messages == (_rp_user(),)
        assert replayed.max_steps == 1
        again, cancelled = _rp_settle(replayed)
        assert [event.type for event in again] == ["message.accepted", "run.finished"]
        assert cancelled == dataclasses.replace(result, steps=1)

    def _failed_run(self, how: str) -> tuple[list[al.Event], al.RunResult]:
        class Abort(BaseException):
            pass

        def aborts(arguments: dict[str, Any], signal: al.Signal) -> object:
            raise Abort

        tools = [*_rp_tools(), al.Tool("aborts", "Aborts.", {"type": "object"}, aborts)]
        first = _rp_tool_step("response-001", _rp_call("echo", "call-1", text="a"))
        if how == "TOOL_PHASE_ERROR":
            second = _rp_tool_step("response-002", _rp_call("aborts", "call-2"))
        else:  # the streamed chunks and the terminal response disagree
            second = al.scripted_response(
                "response-002", [_rp_text("Yes.")], "stop", chunks=[_rp_text("No.")]
            )
        events, result = _rp_record([first, second], tools=tools)
        if how == "MODEL_STREAM_ERROR":
            script = al.ScriptedModel([first])  # asked for a second response it does not have
            events, result = al.settle_run(
                al.run_agent_loop(
                    messages=[_rp_user()],
                    model=script,
                    tools=al.ToolRegistry(tools),
                    max_steps=4,
                )
            )
        assert result.error is not None
        assert result.error.code == how
        return events, result

    @pytest.mark.parametrize(
        "how", ["MODEL_STREAM_ERROR", "MODEL_PROTOCOL_ERROR", "TOOL_PHASE_ERROR"]
    )
    def test_a_failed_run_replays_its_events_and_ends_cancelled_where_it_failed(
        self, how: str
    ) -> None:
        """ "a run that failed in a request or a tool call replays every event before
        run.finished and ends cancelled with the same messages and steps"."""
        events, result = self._failed_run(how)
        again, replayed = _rp_settle(al.replay(events))
        assert _rp_dicts(again[:-1]) == _rp_dicts(events[:-1])
        assert replayed == al.RunResult("cancelled", result.messages, result.steps)

    def test_a_run_that_failed_invalid_transcript_is_a_value_error(self) -> None:
        """ "a run that failed INVALID_TRANSCRIPT logged none of its starting messages"."""
        events, result = _rp_record([], messages=[al.ToolResultMessage("t", "c", "x", "", False)])
        assert result.error is not None
        assert result.error.code == "INVALID_TRANSCRIPT"
        with pytest.raises(ValueError, match="INVALID_TRANSCRIPT: its log holds none"):
            al.replay(events)

    def test_a_signal_that_cannot_be_set_fails_the_replay_where_the_log_stops(self) -> None:
        events, _ = _rp_record(_rp_two_call_script(), cancel_when=_rp_at(2))
        replayed = al.replay(events)
        _, result = al.settle_run(
            al.run_agent_loop(
                messages=replayed.messages,
                model=replayed.model,
                tools=replayed.tools,
                max_steps=replayed.max_steps,
                signal=_RpSignalWithoutSet(),
            )
        )
        assert result.error is not None
        assert result.error.code == "MODEL_STREAM_ERROR"
        assert "the recording stops at request-001, and the run's signal has no set()" in (
            result.error.message
        )


# --- Drift -------------------------------------------------------------------------------


def _rp_answer_tool(answer: str) -> al.Tool:
    return al.Tool("answer", "Answers.", {"type": "object"}, lambda arguments, signal: answer)


def _rp_answer_script() -> list[al.ScriptedResponse]:
    return [
        _rp_tool_step("response-001", _rp_text("Asking."), _rp_call("answer", "call-1")),
        _rp_stop("response-002", "The answer was given."),
    ]


class TestReplayDetectsDrift:
    """Issue: "The replayed model compares each request it receives with the transcript the
    recording implies; on the first difference it raises, and the run fails
    MODEL_STREAM_ERROR with a message that shows the index and both sides (shortened),
    never a silently different run." """

    def test_a_tool_whose_answer_changed_fails_the_replay(self) -> None:
        events, _ = _rp_record(_rp_answer_script(), tools=[_rp_answer_tool("42")])
        same = dataclasses.replace(
            al.replay(events), tools=al.ToolRegistry([_rp_answer_tool("42")])
        )
        assert _rp_dicts(_rp_settle(same)[0]) == _rp_dicts(events)
        changed = dataclasses.replace(same, tools=al.ToolRegistry([_rp_answer_tool("43")]))
        again, result = _rp_settle(changed)
        assert result.status == "failed"
        assert result.error is not None
        assert result.error.code == "MODEL_STREAM_ERROR"
        assert result.error.message == (
            "model.stream() raised RuntimeError: request-002 differs from the recording at "
            "message 2: recorded ToolResultMessage(id='tool-result-call-1', "
            "tool_call_id='call-1', tool_name='answer', content='42', is_error=False), got "
            "ToolResultMessage(id='tool-result-call-1', tool_call_id='call-1', "
            "tool_name='answer', content='43', is_error=False)"
        )
        # Nothing of request-002 was streamed: the run stopped at the difference.
        assert _rp_dicts(again[:4]) == _rp_dicts(events[:4])
        assert [event.type for event in again[4:]] == ["tool.finished", "run.finished"]

    def test_both_sides_are_shortened_around_the_difference(self) -> None:
        recorded, changed = "x" * 500 + "42" + "y" * 500, "x" * 500 + "43" + "y" * 500
        events, _ = _rp_record(_rp_answer_script(), tools=[_rp_answer_tool(recorded)])
        replayed = dataclasses.replace(
            al.replay(events), tools=al.ToolRegistry([_rp_answer_tool(changed)])
        )
        _, result = _rp_settle(replayed)
        assert result.error is not None
        message = result.error.message
        assert len(message) < 600
        shown = "x" * 159 + "4{}" + "y" * 59 + "..."
        assert f"recorded ...{shown.format(2)}, got ...{shown.format(3)}" in message

    def test_a_missing_or_extra_message_shows_nothing_on_one_side(self) -> None:
        events, _ = _rp_record(_rp_answer_script(), tools=[_rp_answer_tool("42")])
        longer = dataclasses.replace(
            al.replay(events), messages=(_rp_user(), _rp_user("More.", "user-002"))
        )
        _, result = _rp_settle(longer)
        assert result.error is not None
        assert result.error.message.endswith(
            "request-001 differs from the recording at message 1: recorded nothing, got "
            "UserMessage(id='user-002', content='More.')"
        )

    def test_recorded_tools_refuse_calls_the_recording_does_not_hold(self) -> None:
        """The recorded tools answer the replayed model's calls, in order; another model's
        call gets a recoverable error result, not a recorded answer."""
        events, _ = _rp_record(_rp_answer_script(), tools=[_rp_answer_tool("42")])
        replayed = al.replay(events)
        other = al.ScriptedModel(
            [
                _rp_tool_step("response-001", _rp_call("answer", "call-1", extra=1)),
                _rp_stop("response-002"),
            ]
        )
        _, result = _rp_settle(dataclasses.replace(replayed, model=other))
        assert result.status == "completed"
        tool_result = result.messages[2]
        assert isinstance(tool_result, al.ToolResultMessage)
        assert tool_result.is_error
        assert "the recording has no call of tool 'answer' with these arguments" in (
            tool_result.content
        )


# --- Logs that are not one run's -----------------------------------------------------------


def _rp_recording() -> list[dict[str, Any]]:
    """A completed two-step run, as to_dict() of each event."""
    script = [
        _rp_tool_step(
            "response-001",
            _rp_call("echo", "call-1", text="a"),
            _rp_call("echo", "call-2", text="b"),
        ),
        _rp_stop("response-002"),
    ]
    return _rp_dicts(_rp_record(script)[0])


def _rp_renumbered(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**event, "sequence": index} for index, event in enumerate(log)]


def _rp_result(log: list[dict[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = log[-1]["payload"]["result"]
    return result


def _rp_broken(how: str) -> list[dict[str, Any]]:
    """The recording, broken in one way. Events: 0 accepted, 1-2 chunks, 3-6 tools of
    request-001, 7 chunk of request-002, 8 run.finished."""
    log = _rp_recording()
    if how == "empty":
        return []
    if how == "gap":
        return log[:3] + log[4:]
    if how == "no-run-finished":
        return log[:-1]
    if how == "two-runs":
        return _rp_renumbered(log + log)
    if how == "run-finished-inside":
        return _rp_renumbered([*log[:3], log[-1], *log[3:]])
    if how == "accepted-later":
        return _rp_renumbered([*log[:3], log[0], *log[3:]])
    if how == "unknown-request":
        log[7]["payload"]["requestId"] = log[7]["payload"]["chunk"]["requestId"] = "request-009"
    elif how == "requests-out-of-order":
        return _rp_renumbered([*log[:1], log[7], *log[1:7], *log[8:]])
    elif how == "chunk-of-another-request":
        log[1]["payload"]["chunk"]["requestId"] = "request-002"
    elif how == "chunk-after-a-tool":
        return _rp_renumbered(log[:1] + log[2:4] + [log[1]] + log[4:])
    elif how == "started-twice":
        return _rp_renumbered(log[:4] + log[5:6] + log[4:5] + log[6:])
    elif how == "finished-without-starting":
        return _rp_renumbered(log[:3] + log[4:5] + log[3:4] + log[5:])
    elif how == "result-without-the-accepted":
        _rp_result(log)["messages"][0]["content"] = "Something else."
    elif how == "result-with-a-user-message-added":
        _rp_result(log)["messages"].append(_rp_user("Hm?", "user-002").to_dict())
    elif how == "result-with-a-foreign-assistant-id":
        _rp_result(log)["messages"][-1]["id"] = "assistant-2"
    elif how == "result-with-too-few-steps":
        _rp_result(log)["messages"] = _rp_result(log)["messages"][:-1]
    elif how == "result-with-another-tool-result":
        log[4]["payload"]["toolResult"]["content"] = "not what the transcript says"
    elif how == "start-out-of-range":
        _rp_result(log)["requestSequenceStart"] = 63
    return log


_RP_BROKEN_LOGS = [
    ("empty", "does not end with run.finished"),
    ("gap", "the event at position 3 has sequence 4"),
    ("no-run-finished", "does not end with run.finished"),
    ("two-runs", r"event 8 \(run.finished\): a run's message.accepted events come before"),
    ("run-finished-inside", r"event 3 \(run.finished\): .* and its one run.finished last"),
    ("accepted-later", r"event 3 \(message.accepted\)"),
    ("unknown-request", r"event 7 \(model.chunk\) names 'request-009', which is not the run's"),
    (
        "requests-out-of-order",
        r"event 2 \(model.chunk\) names 'request-001'.*request-001, request-002, in that order",
    ),
    (
        "chunk-of-another-request",
        r"event 1 \(model.chunk\): a chunk carries its event's request id",
    ),
    ("chunk-after-a-tool", r"event 3 \(model.chunk\): .* before the request's tool calls"),
    ("started-twice", r"event 4 \(tool.started\): a tool call started before the previous"),
    (
        "finished-without-starting",
        r"event 3 \(tool.finished\): tool call 'call-1' finished without",
    ),
    ("result-without-the-accepted", "does not begin with the accepted messages"),
    ("result-with-a-user-message-added", "holds user message 'user-002' after the starting"),
    ("result-with-a-foreign-assistant-id", "holds assistant message 'assistant-2'"),
    ("result-with-too-few-steps", "holds 1 assistant message.* for 2 step.* of a completed run"),
    ("result-with-another-tool-result", "the tool events of request-001 do not agree"),
    ("start-out-of-range", "request_sequence_start 63 and steps 2 do not fit in 64 requests"),
]


class TestReplayRejectsLogsOfNoSingleRun:
    """Issue: "A log that is not a single run's (missing run.finished, sequences with gaps,
    chunks of an unknown request) is a ValueError that says what is wrong." """

    @pytest.mark.parametrize(
        ("how", "message"), _RP_BROKEN_LOGS, ids=[c[0] for c in _RP_BROKEN_LOGS]
    )
    def test_a_broken_log_is_a_value_error_that_says_what_is_wrong(
        self, how: str, message: str
    ) -> None:
        events = [al.event_from_dict(data) for data in _rp_broken(how)]
        with pytest.raises(ValueError, match=message):
            al.replay(events)

    def test_the_unbroken_recording_replays(self) -> None:
        _rp_assert_replays_exactly([al.event_from_dict(data) for data in _rp_recording()])

    def test_tool_events_of_a_request_without_a_response_are_a_value_error(self) -> None:
        events, result = _rp_record(_rp_two_call_script(), cancel_when=_rp_at(4))
        assert result.status == "cancelled"
        log = _rp_dicts(events)
        _rp_result(log)["messages"] = _rp_result(log)["messages"][:1]
        with pytest.raises(ValueError, match="request-001 ran tools, but the result holds no"):
            al.replay([al.event_from_dict(data) for data in log])

    def test_an_item_that_is_not_an_event_is_a_type_error(self) -> None:
        with pytest.raises(TypeError, match="replay\\(\\) takes Events, got a dict at 0"):
            al.replay([_rp_recording()[0]])  # type: ignore[list-item]


# --- Resuming across many runs -------------------------------------------------------------


class TestNextRequestSequence:
    """Issue: "RunResult.next_request_sequence says where the next run's request ids go on
    (request_sequence_start + steps), so that a run resumed twice does not repeat a
    request id"."""

    def test_it_is_the_start_plus_the_steps(self) -> None:
        script = [_rp_tool_step("r1", _rp_call("echo", "c1", text="a")), _rp_stop("r2")]
        _, result = _rp_record(script, request_sequence_start=5)
        assert (result.request_sequence_start, result.steps) == (5, 2)
        assert result.next_request_sequence == 7

    def test_request_sequence_start_is_written_only_when_it_is_not_0(self) -> None:
        _, ordinary = _rp_record([_rp_stop("r1")])
        assert "requestSequenceStart" not in ordinary.to_dict()
        _, resumed = _rp_record([_rp_stop("r1")], request_sequence_start=3)
        assert resumed.to_dict()["requestSequenceStart"] == 3
        for result in (ordinary, resumed):
            event = al.Event(0, "run.finished", {"result": result})
            assert al.event_from_dict(json.loads(json.dumps(event.to_dict()))) == event

    def test_a_result_without_the_key_reads_as_0(self) -> None:
        data = {
            "sequence": 0,
            "type": "run.finished",
            "payload": {
                "result": {
                    "status": "cancelled",
                    "messages": [],
                    "steps": 0,
                    "requestSequenceStart": None,
                }
            },
        }
        result = al.event_from_dict(data).payload["result"]
        assert result.request_sequence_start == 0
        assert result.next_request_sequence == 0

    def test_three_runs_in_a_row_have_contiguous_request_ids(self) -> None:
        """Issue: "three runs in a row (cancel, resume, cancel, resume) with contiguous
        request ids and a transcript that grows by complete messages only"."""
        scripts = [
            [  # cancelled in its second step, while echo runs
                _rp_tool_step("response-001", _rp_call("echo", "call-1", text="a")),
                _rp_tool_step("response-002", _rp_call("slow", "call-2")),
            ],
            [  # resumed, then cancelled while its second response streams
                _rp_tool_step("response-003", _rp_call("echo", "call-3", text="b")),
                al.scripted_response(
                    "response-004",
                    [_rp_text("Almost.")],
                    "stop",
                    chunks=[_rp_text("Alm"), _rp_text("ost.")],
                ),
            ],
            [_rp_stop("response-005", "Finished.")],
        ]

        def slow(arguments: dict[str, Any], signal: al.Signal) -> object:
            assert isinstance(signal, threading.Event)
            signal.set()  # as if the user pressed stop while it ran
            return "never kept"

        tools = [*_rp_tools(), al.Tool("slow", "Slow.", {"type": "object"}, slow)]
        cancel_points: list[Callable[[al.Event], bool] | None] = [
            None,
            lambda event: event.payload.get("chunk") == al.TextDelta("request-004", "Alm"),
            None,
        ]
        messages: tuple[al.Message, ...] = (_rp_user(),)
        start = 0
        request_ids: list[str] = []
        statuses = []
        for script, cancel_when in zip(scripts, cancel_points):
            events, result = _rp_record(
                script,
                messages=messages,
                tools=tools,
                request_sequence_start=start,
                cancel_when=cancel_when,
            )
            _rp_assert_replays_exactly(events)
            statuses.append(result.status)
            request_ids += sorted(
                {e.payload["request_id"] for e in events if "request_id" in e.payload}
            )
            # The transcript grows by complete messages only: the old one is its prefix,
            # and what is open is what the cancellation interrupted.
            assert result.messages[: len(messages)] == messages
            messages = al.resolve_open_tool_calls(result.messages, "cancelled by the user")
            start = result.next_request_sequence
        assert statuses == ["cancelled", "cancelled", "completed"]
        assert request_ids == [f"request-{n:03d}" for n in range(1, 6)]
        assert start == 5
        assert [m.id for m in messages] == [
            "user-001",
            "message-response-001",
            "tool-result-call-1",
            "message-response-002",
            "tool-result-call-2",
            "message-response-003",
            "tool-result-call-3",
            "message-response-005",
        ]


# --- JSON lines: the demonstration's --json output ----------------------------------------


class TestJsonLinesRecordings:
    """Issue: "make the replay of the demo's own --json output reproduce it byte for
    byte"."""

    @pytest.mark.parametrize(
        "options",
        [
            pytest.param((), id="completed"),
            pytest.param(("--max-steps", "1"), id="maxSteps-1"),
            pytest.param(("--max-steps", "2"), id="maxSteps-2"),
            pytest.param(("--cancel-after", "3"), id="cancelled-at-a-tool"),
            pytest.param(("--cancel-after", "12"), id="cancelled-while-streaming"),
        ],
    )
    def test_the_demos_json_output_replays_byte_for_byte(self, options: tuple[str, ...]) -> None:
        recorded = _rp_demo(*options)
        events, _ = _rp_settle(al.replay(_rp_read_json_lines(recorded)))
        assert _rp_json_lines(events) == recorded

    def test_the_readme_recording_block_runs_on_its_own(self) -> None:
        path = os.path.join(os.path.dirname(os.path.abspath(al.__file__)), "README.md")
        with open(path, encoding="utf-8") as readme:
            blocks = re.findall(r"```python\n(.*?)```", readme.read(), re.DOTALL)
        (block,) = [block for block in blocks if "al.replay(" in block]
        exec(compile(block, "README.md record-and-replay block", "exec"), {})


# --- Random recorded runs replay exactly ----------------------------------------------------


def _rp_random_text(rng: random.Random) -> str:
    return rng.choice(["", "a", "Hello, ", "world.", "é", "\U0001f600", "x" * rng.randint(1, 40)])


def _rp_random_call(rng: random.Random, call_id: str) -> al.ToolCall:
    kind = rng.choice(["echo", "counter", "refuse", "boom", "missing", "bad-arguments"])
    if kind == "echo":
        return _rp_call("echo", call_id, text=_rp_random_text(rng))
    if kind == "bad-arguments":
        return _rp_call("echo", call_id, text=rng.randint(0, 9))
    return _rp_call(kind, call_id, n=rng.randint(0, 3))


def _rp_random_step(rng: random.Random, step: int, stop: bool) -> al.ScriptedResponse:
    """A valid step: random text blocks and calls, streamed in random pieces."""
    content: list[al.TextBlock | al.ToolCall] = []
    chunks: list[al.TextBlock | al.ToolCall] = []
    calls = 0 if stop else rng.randint(1, 3)
    for index in range(calls + 1):
        if rng.random() < 0.6:
            pieces = [_rp_random_text(rng) for _ in range(rng.randint(1, 3))]
            content.append(_rp_text("".join(pieces)))
            chunks += [_rp_text(piece) for piece in pieces]
        if index < calls:
            call = _rp_random_call(rng, f"call-{step}-{index}")
            content.append(call)
            chunks.append(call)
    return al.scripted_response(
        f"response-{step}", content, "stop" if stop else "toolCall", chunks=chunks
    )


def _rp_random_run(seed: int) -> tuple[list[al.Event], al.RunResult]:
    rng = random.Random(seed)
    tool_steps = rng.randint(0, 5)
    ends_max_steps = rng.random() < 0.3 and tool_steps > 0
    script = [_rp_random_step(rng, step, False) for step in range(1, tool_steps + 1)]
    if not ends_max_steps:
        script.append(_rp_random_step(rng, tool_steps + 1, True))
    return _rp_record(
        script,
        max_steps=len(script) if ends_max_steps else len(script) + rng.randint(0, 2),
        request_sequence_start=rng.choice([0, 0, 3, 50]),
    )


class TestRandomRecordedRunsReplayExactly:
    """Issue: "replaying any recorded random run reproduces its event log"."""

    @pytest.mark.parametrize("seed", range(200))
    def test_a_random_run_replays_exactly(self, seed: int) -> None:
        events, result = _rp_random_run(seed)
        assert result.status in ("completed", "maxSteps")
        _rp_assert_replays_exactly(events)

    def test_the_random_runs_reach_every_kind_of_step_and_ending(self) -> None:
        statuses: set[str] = set()
        errors = 0
        for seed in range(200):
            _, result = _rp_random_run(seed)
            statuses.add(result.status)
            errors += sum(
                1 for m in result.messages if isinstance(m, al.ToolResultMessage) and m.is_error
            )
        assert statuses == {"completed", "maxSteps"}
        assert errors > 100
