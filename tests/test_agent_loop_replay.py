"""Tests for agent_loop_replay: replay(events) -> ReplayedRun rebuilds a recorded run
(its starting messages, a model that streams each step's chunks as recorded, tools that
answer each call with its recorded result) and its run() reproduces the recording.

The suite imports ``agent_loop_replay`` once, as ``alr`` (and ``agent_loop`` as ``al``
for the values it replays), so that it can be aimed at any copy. Builders and the one
driver come from loop_testing.py; every replayed run goes through the driver's settle(),
which checks the run's invariants.

Contents
    TestExactReplay: a completed or maxSteps run replays to_dict() for to_dict()
    TestReplayOfCancelledAndFailedRuns: replayed to where the log stops, then cancelled
    TestReplayOfRefusedCalls: a call refused in the recording is refused again
    TestReplayDetectsDrift: a request that differs from the recording fails the run
    TestReplayRejectsLogsOfNoSingleRun: a ValueError that says what is wrong
    TestRandomRecordedRunsReplayExactly: random recorded runs
    TestEveryCancelledConcurrentRunReplays: cancelled batches of tools at once, random
        and one cut after its first result
    TestResumedRunsReplayExactly: a cancel-resume chain, each run replayed
    TestThinkingAndUsageReplayExactly: thinking blocks, deltas and usage, replayed exactly
    TestProgressAndEndsRunReplayExactly: tool.progress in the log's order (calls at once
        too), and a run that ended on an ends_run tool, with its output
    TestPassedOn: passed_on(), the one driver of a run with a hook on each event
    TestJsonLines: dump_events() and load_events(), times, journals, and unreadable lines
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import random
import threading
import time
from pathlib import Path
from typing import Any, Callable, Generator

import pytest

import agent_loop as al
import agent_loop_replay as alr
from loop_testing import (
    Choreography,
    FakeModel,
    Plan,
    add_tool,
    call,
    counter_tool,
    dicts_of,
    event_key,
    every_kind_of_tool,
    json_lines,
    read_json_lines,
    record_run,
    run,
    settle,
    stop,
    text,
    thinking_script,
    tool_turn,
    user,
)


def settle_replay(replayed: alr.ReplayedRun) -> tuple[list[al.Event], al.RunResult]:
    """Runs a replayed run with the driver's settle, so that its invariants are checked."""
    return settle(replayed.run(), max_steps=replayed.max_steps)


def assert_replays_exactly(events: list[al.Event]) -> alr.ReplayedRun:
    """replay() of the log, live and read back from JSON lines, reproduces it exactly."""
    for log in (events, read_json_lines(json_lines(events))):
        replayed = alr.replay(log)
        again, result = settle_replay(replayed)
        assert dicts_of(again) == dicts_of(events)
        assert result == events[-1].payload["result"]
    return replayed


def three_step_script() -> list[al.ScriptedResponse]:
    """Text split into chunks (an empty delta too), tool calls of every kind of result."""
    return [
        al.scripted_response(
            "response-001",
            [text("Echo, then count."), call("echo", "call-1", {"text": "one"})],
            "toolCall",
            chunks=[
                text("Echo, "),
                text(""),
                text("then count."),
                call("echo", "call-1", {"text": "one"}),
            ],
        ),
        tool_turn(
            "response-002",
            call("counter", "call-2", {}),
            call("refuse", "call-3", {}),
            call("boom", "call-4", {}),
            call("missing", "call-5", {}),
            call("echo", "call-6", {"text": 5}),
        ),
        al.scripted_response(
            "response-003",
            [text("All done.")],
            "stop",
            chunks=[text("All "), text("done.")],
        ),
    ]


class TestExactReplay:
    """Running the loop on them with the recorded budget yields an event log whose
    to_dict() equals the recording, for every run that ended completed or maxSteps."""

    def test_a_completed_run_replays_exactly_and_runs_no_tool(self) -> None:
        executed: list[str] = []
        events, result = record_run(three_step_script(), tools=every_kind_of_tool(executed))
        assert result.status == "completed"
        assert executed == ["one"]
        replayed = assert_replays_exactly(events)
        assert executed == ["one"]  # the recorded tools answered; nothing ran again
        assert replayed.messages == (user(),)
        assert replayed.max_steps == 3
        assert replayed.request_sequence_start == 0

    @pytest.mark.parametrize(
        ("start", "steps"),
        [pytest.param(63, 1, id="at-limit-63+1"), pytest.param(62, 2, id="at-limit-62+2")],
    )
    def test_a_run_whose_request_ids_end_at_the_ceiling_replays(
        self, start: int, steps: int
    ) -> None:
        """A recorded run may use request ids up to request-064 (MAX_AGENT_STEPS): its
        request_sequence_start is at the limit, and the log replays exactly."""
        script = [tool_turn(f"r{n}", call("echo", f"c{n}", {"text": "x"})) for n in range(steps)]
        events, result = record_run(
            [*script[:-1], stop("r-last", "Done.")], max_steps=steps, request_sequence_start=start
        )
        assert result.next_request_sequence == al.MAX_AGENT_STEPS
        assert_replays_exactly(events)

    def test_chunks_are_streamed_as_recorded_empty_deltas_included(self) -> None:
        events, _ = record_run(three_step_script())
        again, _ = settle_replay(alr.replay(events))
        chunks = [event.payload["chunk"] for event in again if event.type == "model.chunk"]
        assert chunks[:3] == [
            al.TextDelta("request-001", "Echo, "),
            al.TextDelta("request-001", ""),
            al.TextDelta("request-001", "then count."),
        ]
        assert len(chunks) == 4 + 5 + 2

    def test_recorded_error_results_are_reproduced_exactly(self) -> None:
        """Replay's recorded-result tools may use it [ToolError] to reproduce
        is_error=True results exactly."""
        events, result = record_run(three_step_script())
        _, again = settle_replay(alr.replay(events))
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
        script = [tool_turn("response-001", call("counter", "call-1", {})), stop("r2", "Done.")]
        events, result = record_run(script, tools=[counter_tool(42)])
        assert result.messages[2].content == "42"
        for _ in range(3):  # a ReplayedRun runs again and again, one run at a time
            assert_replays_exactly(events)

    def test_a_max_steps_run_replays_exactly_with_its_budget(self) -> None:
        script = [
            tool_turn("response-001", call("echo", "call-1", {"text": "a"})),
            tool_turn("response-002", call("counter", "call-2", {})),
            stop("response-003", "Done."),
        ]
        events, result = record_run(script, max_steps=2)
        assert result.status == "maxSteps"
        replayed = assert_replays_exactly(events)
        assert replayed.max_steps == 2

    def test_a_run_with_history_and_a_request_sequence_start_replays_exactly(self) -> None:
        history: list[al.Message] = [
            user("Hi.", "user-000"),
            al.AssistantMessage("message-response-000", (call("weather", "call-0", {}),)),
            al.ToolResultMessage("tool-result-call-0", "call-0", "weather", "Sunny.", False),
            al.AssistantMessage("message-response-00", (text("Hello."),)),
            user(),
        ]
        script = [tool_turn("response-005", call("echo", "call-1", {"text": "b"}))]
        events, result = record_run(
            [*script, stop("response-006", "Done.")], messages=history, request_sequence_start=4
        )
        assert result.status == "completed"
        replayed = assert_replays_exactly(events)
        assert replayed.messages == tuple(history)
        assert replayed.request_sequence_start == 4
        # The tools are those the run's own calls name, not the history's.
        assert [tool.name for tool in replayed.tools] == ["echo"]

    def test_a_step_that_streamed_nothing_replays_exactly(self) -> None:
        """A stop response with no content streams no chunk: its request has no event."""
        script = [
            tool_turn("response-001", call("echo", "call-1", {"text": "a"})),
            al.scripted_response("response-002", [], "stop"),
        ]
        events, result = record_run(script)
        assert result.status == "completed"
        assert result.final_text == ""
        assert "request-002" not in json.dumps(dicts_of(events))
        assert_replays_exactly(events)

    def test_the_replayed_run_is_run_agent_loop_on_its_fields(self) -> None:
        """A frozen dataclass with messages, model, tools, max_steps,
        request_sequence_start, tool_concurrency and before_tool_call, whose run()
        returns run_agent_loop(...) on them."""
        events, _ = record_run(three_step_script())
        replayed = alr.replay(iter(events))
        assert [field.name for field in dataclasses.fields(alr.ReplayedRun)] == [
            "messages",
            "model",
            "tools",
            "max_steps",
            "request_sequence_start",
            "tool_concurrency",
            "before_tool_call",
        ]
        assert replayed.tool_concurrency == 1  # a sequential recording
        assert replayed.before_tool_call is None  # nothing refused
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
        assert dicts_of(settle(by_hand)[0]) == dicts_of(events)

    def test_a_larger_budget_changes_nothing_for_a_completed_run(self) -> None:
        events, _ = record_run(three_step_script())
        replayed = dataclasses.replace(alr.replay(events), max_steps=al.MAX_AGENT_STEPS)
        assert dicts_of(settle_replay(replayed)[0]) == dicts_of(events)

    def test_a_request_the_recording_does_not_hold_fails_the_run(self) -> None:
        script = [
            tool_turn("response-001", call("echo", "call-1", {"text": "a"})),
            stop("response-002", "Done."),
        ]
        events, result = record_run(script, max_steps=1)
        assert result.status == "maxSteps"
        again, failed = settle_replay(dataclasses.replace(alr.replay(events), max_steps=2))
        assert dicts_of(again[:-1]) == dicts_of(events[:-1])
        assert failed.status == "failed"
        assert failed.error is not None
        assert failed.error.code == "MODEL_STREAM_ERROR"
        assert failed.error.message == (
            "model.stream() raised RuntimeError: the recording holds no request-002 "
            "(it holds request-001)"
        )


class SignalWithoutSet:
    """A Signal (is_set() and wait()) that cannot be set."""

    def is_set(self) -> bool:
        return False

    def wait(self, timeout: float | None = None) -> bool:
        return False


def two_call_script() -> list[al.ScriptedResponse]:
    return [
        al.scripted_response(
            "response-001",
            [text("Two calls."), call("echo", "call-1", {"text": "a"})],
            "toolCall",
            chunks=[text("Two "), text("calls."), call("echo", "call-1", {"text": "a"})],
        ),
        tool_turn(
            "response-002",
            call("echo", "call-2", {"text": "b"}),
            call("counter", "call-3", {}),
        ),
        stop("response-003", "Done."),
    ]


class TestReplayOfCancelledAndFailedRuns:
    """agent_loop_replay: "A cancelled or failed log replays to its last event before
    run.finished, and there run() cancels the run, as a consumer who sets the signal on
    seeing that event does"."""

    @pytest.mark.parametrize(
        "sequence",
        [
            pytest.param(0, id="at-accepted"),
            pytest.param(1, id="at-a-chunk"),
            pytest.param(3, id="at-the-last-chunk"),
            pytest.param(4, id="at-tool-started"),
            pytest.param(5, id="after-a-batch"),
            pytest.param(8, id="at-a-tool-started-of-the-second-step"),
            pytest.param(9, id="between-two-tool-calls"),
        ],
    )
    def test_a_cancelled_run_replays_exactly(self, sequence: int) -> None:
        """ "So a cancelled run replays exactly"."""
        events, result = record_run(two_call_script(), cancel_when=sequence)
        assert result.status == "cancelled"
        assert events[-2].sequence == sequence
        replayed = assert_replays_exactly(events)
        assert replayed.max_steps == max(result.steps, 1)

    def test_a_tool_that_saw_the_signal_replays_exactly(self) -> None:
        def cancels(arguments: dict[str, Any], signal: al.Signal) -> object:
            assert isinstance(signal, threading.Event)
            signal.set()
            return "too late"

        tools = [
            *every_kind_of_tool(),
            al.Tool("cancels", "Cancels.", {"type": "object"}, cancels),
        ]
        script = [tool_turn("response-001", call("cancels", "call-1", {}))]
        events, result = record_run(script, tools=tools)
        assert result.status == "cancelled"
        assert [call.id for call in al.open_tool_calls(result.messages)] == ["call-1"]
        assert_replays_exactly(events)

    def test_a_run_cancelled_before_its_first_event_replays_exactly(self) -> None:
        """Cancelled at SnapshotRun: the result holds the starting messages, no event does."""
        signal = threading.Event()
        signal.set()
        events, _result, _ = run([], max_steps=1, signal=signal)
        assert [event.type for event in events] == ["run.finished"]
        replayed = assert_replays_exactly(events)
        assert replayed.messages == (user(),)
        assert replayed.max_steps == 1

    def test_a_run_cancelled_inside_a_request_before_its_first_chunk_has_one_step_less(
        self,
    ) -> None:
        """ "except one cancelled inside a request before its first chunk: the replay
        does not open that request (steps is one less)"."""

        def cancels_when_asked(model: FakeModel, request: al.ModelRequest, signal: Any) -> Any:
            signal.set()
            return iter(())

        events, result, _ = run([cancels_when_asked], max_steps=2, signal=threading.Event())
        assert (result.status, result.steps) == ("cancelled", 1)
        again, replayed = settle_replay(alr.replay(events))
        assert dicts_of(again[:-1]) == dicts_of(events[:-1])
        assert replayed == dataclasses.replace(result, steps=0)

    def _failed_run(self, how: str) -> tuple[list[al.Event], al.RunResult]:
        class Halt(BaseException):
            pass

        def aborts(arguments: dict[str, Any], signal: al.Signal) -> object:
            raise Halt

        tools = [*every_kind_of_tool(), al.Tool("aborts", "Aborts.", {"type": "object"}, aborts)]
        first = tool_turn("response-001", call("echo", "call-1", {"text": "a"}))
        if how == "TOOL_PHASE_ERROR":
            second = tool_turn("response-002", call("aborts", "call-2", {}))
        else:  # the streamed chunks and the terminal response disagree
            second = al.scripted_response(
                "response-002", [text("Yes.")], "stop", chunks=[text("No.")]
            )
        events, result = record_run([first, second], tools=tools)
        if how == "MODEL_STREAM_ERROR":
            script = al.ScriptedModel([first])  # asked for a second response it does not have
            events, result, _ = run(script, tools, max_steps=4)
        assert result.error is not None
        assert result.error.code == how
        return events, result

    @pytest.mark.parametrize(
        ("how", "steps_less"),
        [("MODEL_STREAM_ERROR", 1), ("MODEL_PROTOCOL_ERROR", 0), ("TOOL_PHASE_ERROR", 0)],
    )
    def test_a_failed_run_replays_its_events_and_ends_cancelled_where_it_failed(
        self, how: str, steps_less: int
    ) -> None:
        """ "A failed run ends cancelled after the same events"."""
        events, result = self._failed_run(how)
        again, replayed = settle_replay(alr.replay(events))
        assert dicts_of(again[:-1]) == dicts_of(events[:-1])
        assert replayed == al.RunResult(
            "cancelled", result.messages, result.steps - steps_less, usage=result.usage
        )

    def test_a_run_that_failed_invalid_transcript_is_a_value_error(self) -> None:
        """ "An INVALID_TRANSCRIPT log holds no starting message: a ValueError"."""
        events, result = record_run([], messages=[al.ToolResultMessage("t", "c", "x", "", False)])
        assert result.error is not None
        assert result.error.code == "INVALID_TRANSCRIPT"
        with pytest.raises(ValueError, match="INVALID_TRANSCRIPT: its log holds none"):
            alr.replay(events)

    def test_run_by_hand_a_log_that_stops_inside_a_request_fails_there(self) -> None:
        events, _ = record_run(two_call_script(), cancel_when=2)
        replayed = alr.replay(events)
        _, result = settle(
            al.run_agent_loop(
                messages=replayed.messages,
                model=replayed.model,
                tools=replayed.tools,
                max_steps=replayed.max_steps,
                signal=SignalWithoutSet(),
            )
        )
        assert result.error is not None
        assert result.error.code == "MODEL_STREAM_ERROR"
        assert "the recording stops inside request-001: replay it with ReplayedRun.run()" in (
            result.error.message
        )


def refused_log() -> list[al.Event]:
    """two_call_script() recorded with call-2 refused by before_tool_call: its
    tool.finished says refused (the core marks it; marked here for a core that does not)."""

    def consent(call: al.ToolCall, signal: Any) -> str | None:
        return "Not this one." if call.id == "call-2" else None

    events, result, _ = run(
        two_call_script(), every_kind_of_tool(), before_tool_call=consent, signal=None
    )
    assert result.status == "completed"
    return [
        al.Event(event.sequence, event.type, {**event.payload, "refused": True})
        if event.type == "tool.finished" and event.payload["tool_call"].id == "call-2"
        else event
        for event in events
    ]


class TestReplayOfRefusedCalls:
    """A call that before_tool_call refused in the recording is refused again: the
    replayed run's before_tool_call refuses exactly the calls whose recorded tool.finished
    says refused, with the recorded words, and runs no tool for them."""

    def test_the_replayed_run_refuses_exactly_the_refused_calls(self) -> None:
        log = refused_log()
        replayed = alr.replay(log)
        assert replayed.before_tool_call is not None
        calls = [event.payload["tool_call"] for event in log if event.type == "tool.started"]
        answers = [replayed.before_tool_call(call, threading.Event()) for call in calls]
        assert answers == [None, "Not this one.", None]
        again, result = settle(replayed.run(), max_steps=replayed.max_steps, consent=True)
        assert [event.type for event in again] == [event.type for event in log]
        assert result == log[-1].payload["result"]

    def test_a_recording_without_refusals_has_no_consent_hook(self) -> None:
        events, _ = record_run(two_call_script())
        assert alr.replay(events).before_tool_call is None


def answer_tool(answer: str) -> al.Tool:
    return al.Tool("answer", "Answers.", {"type": "object"}, lambda arguments, signal: answer)


def answer_script() -> list[al.ScriptedResponse]:
    return [
        tool_turn("response-001", text("Asking."), call("answer", "call-1", {})),
        stop("response-002", "The answer was given."),
    ]


class TestReplayDetectsDrift:
    """The replayed model compares each request it receives with the transcript the
    recording implies; on the first difference it raises, and the run fails
    MODEL_STREAM_ERROR with a message that shows the index and both sides (shortened),
    never a silently different run."""

    def test_a_tool_whose_answer_changed_fails_the_replay(self) -> None:
        events, _ = record_run(answer_script(), tools=[answer_tool("42")])
        same = dataclasses.replace(alr.replay(events), tools=al.ToolRegistry([answer_tool("42")]))
        assert dicts_of(settle_replay(same)[0]) == dicts_of(events)
        changed = dataclasses.replace(same, tools=al.ToolRegistry([answer_tool("43")]))
        again, result = settle_replay(changed)
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
        assert dicts_of(again[:4]) == dicts_of(events[:4])
        assert [event.type for event in again[4:]] == ["tool.finished", "run.finished"]

    def test_both_sides_are_shortened_around_the_difference(self) -> None:
        recorded, changed = "x" * 500 + "42" + "y" * 500, "x" * 500 + "43" + "y" * 500
        events, _ = record_run(answer_script(), tools=[answer_tool(recorded)])
        replayed = dataclasses.replace(
            alr.replay(events), tools=al.ToolRegistry([answer_tool(changed)])
        )
        _, result = settle_replay(replayed)
        assert result.error is not None
        message = result.error.message
        assert len(message) < 600
        shown = "x" * 159 + "4{}" + "y" * 59 + "..."
        assert f"recorded ...{shown.format(2)}, got ...{shown.format(3)}" in message

    def test_a_missing_or_extra_message_shows_nothing_on_one_side(self) -> None:
        events, _ = record_run(answer_script(), tools=[answer_tool("42")])
        longer = dataclasses.replace(
            alr.replay(events), messages=(user(), user("More.", "user-002"))
        )
        _, result = settle_replay(longer)
        assert result.error is not None
        assert result.error.message.endswith(
            "request-001 differs from the recording at message 1: recorded nothing, got "
            "UserMessage(id='user-002', content='More.')"
        )

    def test_recorded_tools_refuse_calls_the_recording_does_not_hold(self) -> None:
        """The recorded tools answer the replayed model's calls, in order; another model's
        call gets a recoverable error result, not a recorded answer."""
        events, _ = record_run(answer_script(), tools=[answer_tool("42")])
        replayed = alr.replay(events)
        other = al.ScriptedModel(
            [
                tool_turn("response-001", call("answer", "call-1", {"extra": 1})),
                stop("response-002", "Done."),
            ]
        )
        _, result = settle_replay(dataclasses.replace(replayed, model=other))
        assert result.status == "completed"
        tool_result = result.messages[2]
        assert isinstance(tool_result, al.ToolResultMessage)
        assert tool_result.is_error
        assert "the recording has no call of tool 'answer' with these arguments" in (
            tool_result.content
        )


def recording() -> list[dict[str, Any]]:
    """A completed two-step run, as to_dict() of each event."""
    script = [
        tool_turn(
            "response-001",
            call("echo", "call-1", {"text": "a"}),
            call("echo", "call-2", {"text": "b"}),
        ),
        stop("response-002", "Done."),
    ]
    return dicts_of(record_run(script)[0])


def renumbered(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**event, "sequence": index} for index, event in enumerate(log)]


def result_of_log(log: list[dict[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = log[-1]["payload"]["result"]
    return result


def broken_log(how: str) -> list[dict[str, Any]]:
    """The recording, broken in one way. Events: 0 accepted, 1-2 chunks, 3-6 tools of
    request-001, 7 chunk of request-002, 8 run.finished. (Logs out of order are
    RunSteps' table, tests/test_run_steps.py: replay raises what it raises.)"""
    log = recording()
    if how == "empty":
        return []
    if how == "gap":
        return log[:3] + log[4:]
    if how == "no-run-finished":
        return log[:-1]
    if how == "requests-of-another-start":
        result_of_log(log)["requestSequenceStart"] = 1
    elif how == "result-without-the-accepted":
        result_of_log(log)["messages"][0]["content"] = "Something else."
    elif how == "result-with-a-user-message-added":
        result_of_log(log)["messages"].append(user("Hm?", "user-002").to_dict())
    elif how == "result-with-a-foreign-assistant-id":
        result_of_log(log)["messages"][-1]["id"] = "assistant-2"
    elif how == "result-with-too-few-steps":
        result_of_log(log)["messages"] = result_of_log(log)["messages"][:-1]
    elif how == "result-with-another-tool-result":
        log[4]["payload"]["toolResult"]["content"] = "not what the transcript says"
    elif how == "start-out-of-range":
        result_of_log(log)["requestSequenceStart"] = 63
    return log


BROKEN_LOGS = [
    ("empty", "does not end with run.finished"),
    ("gap", r"event 3 \(tool.finished\) has sequence 4"),
    ("no-run-finished", "does not end with run.finished"),
    (
        "requests-of-another-start",
        r"the log's requests \(request-001, request-002\) are not the result's "
        r"\(request-002, request-003, in that order\)",
    ),
    ("result-without-the-accepted", "does not begin with the accepted messages"),
    ("result-with-a-user-message-added", "holds user message 'user-002' after the starting"),
    ("result-with-a-foreign-assistant-id", "holds assistant message 'assistant-2'"),
    ("result-with-too-few-steps", "holds 1 assistant message.* for 2 step.* of a completed run"),
    ("result-with-another-tool-result", "the tool events of request-001 do not agree"),
    ("start-out-of-range", "request_sequence_start 63 and steps 2 do not fit in 64 requests"),
]


class TestReplayRejectsLogsOfNoSingleRun:
    """A log that is not a single run's (missing run.finished, sequences with gaps,
    chunks of an unknown request) is a ValueError that says what is wrong."""

    @pytest.mark.parametrize(("how", "message"), BROKEN_LOGS, ids=[c[0] for c in BROKEN_LOGS])
    def test_a_broken_log_is_a_value_error_that_says_what_is_wrong(
        self, how: str, message: str
    ) -> None:
        events = [al.event_from_dict(data) for data in broken_log(how)]
        with pytest.raises(ValueError, match=message):
            alr.replay(events)

    def test_the_unbroken_recording_replays(self) -> None:
        assert_replays_exactly([al.event_from_dict(data) for data in recording()])

    def test_tool_events_of_a_request_without_a_response_are_a_value_error(self) -> None:
        events, result = record_run(two_call_script(), cancel_when=4)
        assert result.status == "cancelled"
        log = dicts_of(events)
        result_of_log(log)["messages"] = result_of_log(log)["messages"][:1]
        with pytest.raises(ValueError, match="request-001 ran tools, but the result holds no"):
            alr.replay([al.event_from_dict(data) for data in log])

    def test_an_item_that_is_not_an_event_is_a_type_error(self) -> None:
        with pytest.raises(TypeError, match="replay\\(\\) takes Events, got dict at position 0"):
            alr.replay([recording()[0]])  # type: ignore[list-item]

    @pytest.mark.parametrize(
        ("how", "where"),
        [
            ("dropped", "normalised block 0: streamed tool call 'call-2'"),
            ("doubled", "normalised block 1: streamed tool call 'call-1'"),
        ],
    )
    def test_chunks_that_disagree_with_the_transcript_are_a_value_error(
        self, how: str, where: str
    ) -> None:
        """In the words of the loop's own check (check_stream_agreement)."""
        log = recording()
        chunk = next(i for i, data in enumerate(log) if data["type"] == "model.chunk")
        if how == "dropped":
            del log[chunk]
        else:
            log.insert(chunk, copy.deepcopy(log[chunk]))
        for sequence, data in enumerate(log):
            data["sequence"] = sequence
        with pytest.raises(ValueError, match="the chunks of request-001 do not agree") as raised:
            alr.replay([al.event_from_dict(data) for data in log])
        assert f"the terminal response disagree at {where}" in str(raised.value)


def random_recorded_text(rng: random.Random) -> str:
    return rng.choice(["", "a", "Hello, ", "world.", "é", "\U0001f600", "x" * rng.randint(1, 40)])


def random_recorded_call(rng: random.Random, call_id: str) -> al.ToolCall:
    kind = rng.choice(["echo", "counter", "refuse", "boom", "missing", "bad-arguments"])
    if kind == "echo":
        return call("echo", call_id, {"text": random_recorded_text(rng)})
    if kind == "bad-arguments":
        return call("echo", call_id, {"text": rng.randint(0, 9)})
    return call(kind, call_id, {"n": rng.randint(0, 3)})


def random_recorded_step(rng: random.Random, step: int, stop: bool) -> al.ScriptedResponse:
    """A valid step: random text blocks and calls, streamed in random pieces."""
    content: list[al.TextBlock | al.ToolCall] = []
    chunks: list[al.TextBlock | al.ToolCall] = []
    calls = 0 if stop else rng.randint(1, 3)
    for index in range(calls + 1):
        if rng.random() < 0.6:
            pieces = [random_recorded_text(rng) for _ in range(rng.randint(1, 3))]
            content.append(text("".join(pieces)))
            chunks += [text(piece) for piece in pieces]
        if index < calls:
            call = random_recorded_call(rng, f"call-{step}-{index}")
            content.append(call)
            chunks.append(call)
    return al.scripted_response(
        f"response-{step}", content, "stop" if stop else "toolCall", chunks=chunks
    )


def random_recorded_run(seed: int) -> tuple[list[al.Event], al.RunResult]:
    rng = random.Random(seed)
    tool_steps = rng.randint(0, 5)
    ends_max_steps = rng.random() < 0.3 and tool_steps > 0
    script = [random_recorded_step(rng, step, False) for step in range(1, tool_steps + 1)]
    if not ends_max_steps:
        script.append(random_recorded_step(rng, tool_steps + 1, True))
    return record_run(
        script,
        max_steps=len(script) if ends_max_steps else len(script) + rng.randint(0, 2),
        request_sequence_start=rng.choice([0, 0, 3, 50]),
    )


class TestRandomRecordedRunsReplayExactly:
    """Replaying any recorded random run reproduces its event log."""

    @pytest.mark.parametrize("seed", range(200))
    def test_a_random_run_replays_exactly(self, seed: int) -> None:
        events, result = random_recorded_run(seed)
        assert result.status in ("completed", "maxSteps")
        assert_replays_exactly(events)

    def test_the_random_runs_reach_every_kind_of_step_and_ending(self) -> None:
        statuses: set[str] = set()
        errors = 0
        for seed in range(200):
            _, result = random_recorded_run(seed)
            statuses.add(result.status)
            errors += sum(
                1 for m in result.messages if isinstance(m, al.ToolResultMessage) and m.is_error
            )
        assert statuses == {"completed", "maxSteps"}
        assert errors > 100


WAIT: float = 10.0  # seconds: a tool that waits for the signal fails instead of hanging


def random_cancelled_batch(seed: int) -> tuple[list[al.Event], al.RunResult]:
    """A batch of 2-5 calls run 2-4 at once, each taking a random time (under 4 ms),
    cancelled by a signal set from another thread at a random time (under 8 ms)."""
    rng = random.Random(seed)
    count = rng.randint(2, 5)
    takes = {f"call-{n}": rng.uniform(0, 0.004) for n in range(count)}

    def work(arguments: dict[str, Any], signal: al.Signal) -> object:
        current = al.current_tool_call()
        assert current is not None
        signal.wait(takes[current.id])  # returns early once the signal is set
        return f"worked on {current.id}"

    script = [
        tool_turn("response-001", *(call("work", call_id, {}) for call_id in takes)),
        stop("response-002", "Done."),
    ]
    signal = threading.Event()
    timer = threading.Timer(rng.uniform(0, 0.008), signal.set)
    timer.start()
    try:
        events, result, _ = run(
            script,
            [al.Tool("work", "Works.", {"type": "object"}, work)],
            signal=signal,
            tool_concurrency=rng.randint(2, 4),
        )
    finally:
        timer.cancel()
        timer.join()
    return events, result


class TestEveryCancelledConcurrentRunReplays:
    """A group of tools at once keeps the sequential loop's rule, "once the loop sees the
    signal, no more results": whatever the timing, its log replays exactly."""

    def test_random_cancelled_batches_replay_exactly(self) -> None:
        # Which batches are cut (some results kept, some calls open) depends on the
        # machine's timing; the cut case is made for sure in the next test.
        for seed in range(150):
            events, result = random_cancelled_batch(seed)
            replayed = alr.replay(events)
            again, again_result = settle(
                replayed.run(),
                max_steps=replayed.max_steps,
                tool_concurrency=replayed.tool_concurrency,
            )
            # Exactly, but a run cancelled inside a request before its first chunk, which
            # the replay does not open (its steps is one less).
            assert dicts_of(again[:-1]) == dicts_of(events[:-1]), seed
            assert again_result.messages == result.messages, seed
            assert again_result.steps in (result.steps, result.steps - 1), seed

    def test_a_batch_cut_after_its_first_result_replays_exactly(self) -> None:
        """Cut by construction: the first call returns at once, the second returns only on
        the signal, which the consumer sets on the first tool.finished. The third is
        dropped behind the second, whether it returned before the signal or not."""

        def work(arguments: dict[str, Any], signal: al.Signal) -> object:
            current = al.current_tool_call()
            assert current is not None
            if current.id == "call-1":
                assert signal.wait(WAIT)
            return f"worked on {current.id}"

        script = [
            tool_turn("response-001", *(call("work", f"call-{n}", {}) for n in range(3))),
            stop("response-002", "Done."),
        ]
        events, result, _ = run(
            script,
            [al.Tool("work", "Works.", {"type": "object"}, work)],
            signal=threading.Event(),
            cancel_at=("tool.finished", 1),
            tool_concurrency=3,
        )
        assert result.status == "cancelled"
        assert [event.type for event in events if event.type.startswith("tool.")] == [
            "tool.started",
            "tool.started",
            "tool.started",
            "tool.finished",
        ]
        assert al.open_tool_calls(result.messages) == (
            call("work", "call-1", {}),
            call("work", "call-2", {}),
        )
        replayed = alr.replay(events)
        again, again_result = settle(
            replayed.run(), max_steps=replayed.max_steps, tool_concurrency=3
        )
        assert replayed.tool_concurrency == 3
        assert dicts_of(again) == dicts_of(events)
        assert again_result == result


class TestResumedRunsReplayExactly:
    """Each run of a cancel-resume chain replays exactly, and the chain's request ids go on
    (RunResult.next_request_sequence)."""

    def test_three_runs_in_a_row_have_contiguous_request_ids(self) -> None:
        """Three runs in a row (cancel, resume, cancel, resume) with contiguous
        request ids and a transcript that grows by complete messages only."""
        scripts = [
            [  # cancelled in its second step, while echo runs
                tool_turn("response-001", call("echo", "call-1", {"text": "a"})),
                tool_turn("response-002", call("slow", "call-2", {})),
            ],
            [  # resumed, then cancelled while its second response streams
                tool_turn("response-003", call("echo", "call-3", {"text": "b"})),
                al.scripted_response(
                    "response-004",
                    [text("Almost.")],
                    "stop",
                    chunks=[text("Alm"), text("ost.")],
                ),
            ],
            [stop("response-005", "Finished.")],
        ]

        def slow(arguments: dict[str, Any], signal: al.Signal) -> object:
            assert isinstance(signal, threading.Event)
            signal.set()  # as if the user pressed stop while it ran
            return "never kept"

        tools = [*every_kind_of_tool(), al.Tool("slow", "Slow.", {"type": "object"}, slow)]
        cancel_points: list[Callable[[al.Event], bool] | None] = [
            None,
            lambda event: event.payload.get("chunk") == al.TextDelta("request-004", "Alm"),
            None,
        ]
        messages: tuple[al.Message, ...] = (user(),)
        start = 0
        request_ids: list[str] = []
        statuses = []
        for script, cancel_when in zip(scripts, cancel_points):
            events, result = record_run(
                script,
                messages=messages,
                tools=tools,
                request_sequence_start=start,
                cancel_when=cancel_when,
            )
            assert_replays_exactly(events)
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


class TestThinkingAndUsageReplayExactly:
    """A run recorded with thinking (signed blocks, a redacted block, thinking deltas)
    and usage replays exactly, live and through JSON lines, cancelled ones included."""

    def test_a_run_with_thinking_and_usage_replays_exactly(self) -> None:
        events, result = record_run(thinking_script(), tools=[add_tool()])
        assert result.status == "completed"
        assert result.usage == al.Usage(942, 114, 4096, 0, None)
        recorded = json_lines(events)
        for words in ('"thinkingSignature":"sig-001"', '"redacted":true', '"usage":{'):
            assert words in recorded
        assert '"type":"thinking","requestId":"request-001"' in recorded  # a delta
        assert_replays_exactly(events)  # the result too, usage and thinking included

    @pytest.mark.parametrize(
        "sequence",
        [
            pytest.param(1, id="at-a-thinking-chunk"),
            pytest.param(3, id="at-a-text-chunk-after-thinking"),
            pytest.param(5, id="at-tool-started"),
            pytest.param(7, id="at-the-second-steps-first-chunk"),
        ],
    )
    def test_a_cancelled_run_with_thinking_replays_exactly(self, sequence: int) -> None:
        events, result = record_run(thinking_script(), tools=[add_tool()], cancel_when=sequence)
        assert result.status == "cancelled"
        assert_replays_exactly(events)

    def test_a_resumed_run_with_thinking_replays_exactly(self) -> None:
        _, first = record_run(thinking_script(), tools=[add_tool()])
        messages = (*first.messages, user("And again?", "user-002"))
        events, result = record_run(
            [al.scripted_response("response-003", [al.ThinkingBlock("Same.", "s3"), text("42.")],
                                  "stop", usage=al.Usage(1, 1))],
            messages=messages,
            request_sequence_start=first.next_request_sequence,
        )  # fmt: skip
        assert result.status == "completed"
        assert result.usage == al.Usage(1, 1)
        replayed = assert_replays_exactly(events)
        assert replayed.messages == messages

    def test_thinking_chunks_that_disagree_with_the_transcript_are_a_value_error(self) -> None:
        events, _ = record_run(thinking_script(), tools=[add_tool()])
        log = dicts_of(events)
        del log[2]  # the second piece of the thinking
        for sequence, data in enumerate(log):
            data["sequence"] = sequence
        with pytest.raises(ValueError, match="the chunks of request-001 do not agree"):
            alr.replay([al.event_from_dict(data) for data in log])


# Calls whose order a Choreography fixes: (tool_concurrency, each call's part, the event
# the consumer cancels on, the tool events of the log it records).
PROGRESS_RUNS: dict[str, tuple[int, Plan, str, list[str]]] = {
    "one at a time": (
        1,
        {"a": [("", "a1"), ("", {"done": 2}), ("", "a done")], "b": [("", "b done")]},
        "",
        [
            *("started:a", "progress:a:a1", "progress:a:{'done': 2}", "finished:a"),
            *("started:b", "finished:b"),
        ],
    ),
    "at once, interleaved": (
        3,
        {
            "a": [("progress:b:b1", "a1"), ("", "a done")],
            "b": [("started:c", "b1"), ("finished:a", "b2"), ("", "b done")],
            "c": [("", "c done")],
        },
        "",
        [
            *("started:a", "started:b", "started:c", "progress:b:b1", "progress:a:a1"),
            *("finished:a", "progress:b:b2", "finished:b", "finished:c"),
        ],
    ),
    "at once, a thread freed for the last call": (
        2,
        {"a": [("progress:c:c1", "a done")], "b": [("", "b done")], "c": [("", "c1"), ("", "")]},
        "",
        [
            *("started:a", "started:b", "started:c", "progress:c:c1"),
            *("finished:a", "finished:b", "finished:c"),
        ],
    ),
    "at once, cancelled with a call open": (
        2,
        {"a": [("progress:b:b1", "a done")], "b": [("", "b1"), ("signal", "b done")]},
        "finished:a",
        ["started:a", "started:b", "progress:b:b1", "finished:a"],
    ),
}


def choreographed_run(
    plan: Plan, concurrency: int, cancel: str = "", ends_run: bool = False
) -> tuple[list[al.Event], al.RunResult]:
    """The run of one response that calls each part of the plan, then a text answer."""
    choreography = Choreography(plan, cancel)
    script = [
        tool_turn("response-001", *(call("work", call_id, {}) for call_id in plan)),
        stop("response-002", "Done."),
    ]
    events, result, _ = run(
        script,
        [choreography.tool(ends_run=ends_run)],
        signal=threading.Event(),
        cancel_at=choreography.seen,
        tool_concurrency=concurrency,
    )
    return events, result


def recorded(name: str) -> tuple[list[al.Event], al.RunResult]:
    """The run of a row of PROGRESS_RUNS."""
    concurrency, plan, cancel, _ = PROGRESS_RUNS[name]
    return choreographed_run(plan, concurrency, cancel)


class TestProgressAndEndsRunReplayExactly:
    """A recorded call yields its recorded progress again before its result; calls at once
    give theirs in the log's order (the order their workers put them on the loop's queue),
    whatever the threads' timing; a run that ended on an ends_run tool ends so again."""

    @pytest.mark.parametrize("name", list(PROGRESS_RUNS))
    def test_a_log_with_progress_replays_exactly(self, name: str) -> None:
        concurrency, _, _, tool_events = PROGRESS_RUNS[name]
        events, result = recorded(name)
        assert [event_key(e) for e in events if e.type.startswith("tool.")] == tool_events
        replayed = alr.replay(read_json_lines(json_lines(events)))
        # The replay's own concurrency (its largest group), and the recorded one.
        for again_at in (replayed, dataclasses.replace(replayed, tool_concurrency=concurrency)):
            for _ in range(5):  # ordered, not by chance
                again, again_result = settle(
                    again_at.run(),
                    max_steps=again_at.max_steps,
                    tool_concurrency=again_at.tool_concurrency,
                )
                assert dicts_of(again) == dicts_of(events)
                assert again_result == result

    @pytest.mark.parametrize(
        "value",
        [{"answer": 42}, '{"answer":42}', "plain words", None],
        ids=["a value", "a text that is JSON", "a text", "none"],
    )
    def test_a_run_that_ended_on_a_tool_replays_with_its_output(self, value: object) -> None:
        # Two calls at once: the first in assistant order gives the output.
        plan: Plan = {"a": [("", value)], "b": [("", "second")]}
        events, result = choreographed_run(plan, 2, ends_run=True)
        assert (result.status, result.output) == ("completed", value)
        assert events[-2].to_dict()["payload"]["endsRun"] is True
        again, again_result = settle_replay(alr.replay(read_json_lines(json_lines(events))))
        assert dicts_of(again) == dicts_of(events)
        assert (again_result, again_result.output) == (result, value)

    @pytest.mark.parametrize(
        ("content", "output"),
        [
            ('{"a":[1,2.5,null]}', {"a": [1, 2.5, None]}),
            ('{"a": 1}', '{"a": 1}'),  # not as the loop encodes a value: a text
            ('"x"', '"x"'),  # a JSON string: a text, which the loop gives verbatim
            ("NaN", "NaN"),
            ("words", "words"),
        ],
    )
    def test_without_its_log_an_ending_result_is_read_as_the_value_it_encodes(
        self, content: str, output: object
    ) -> None:
        """A Recording without the log's result (a durable run cut before run.finished)
        gives the output the content is the loop's encoding of, else the content."""
        ending = call("end", "call-1", {})
        recorded = al.ToolResultMessage(
            al.tool_result_id("call-1"), "call-1", "end", content, False
        )
        recording = alr.Recording({}, {ending: recorded}, {})
        tool = al.Tool("end", "Ends.", {"type": "object"}, returns_nothing, ends_run=True)
        _, result, _ = run([tool_turn("response-001", ending)], [recording.tool(tool)])
        assert (result.output, result.messages[-1]) == (output, recorded)

    @pytest.mark.parametrize(
        ("name", "concurrency", "problem"),
        [
            (
                "at once, a thread freed for the last call",
                1,
                "a recorded call waited 0 s for the log's first",
            ),
            ("at once, cancelled with a call open", 2, "'b' was open when the recording ended"),
        ],
        ids=["a turn that cannot come", "an open call that nothing cancels"],
    )
    def test_every_wait_of_a_recorded_call_is_bounded(
        self, monkeypatch: pytest.MonkeyPatch, name: str, concurrency: int, problem: str
    ) -> None:
        """Past its bound (here 0 s) a recorded call fails instead of hanging the replay:
        one at a time, call a's turn waits for c's progress, which comes after it; run by
        hand, an open call waits for a cancellation that never comes."""
        monkeypatch.setattr(alr, "_TURN_SECONDS", 0.0)
        replayed = dataclasses.replace(
            alr.replay(recorded(name)[0]),
            tool_concurrency=concurrency,
        )
        fields = {
            field.name: getattr(replayed, field.name) for field in dataclasses.fields(replayed)
        }
        run_ = replayed.run() if concurrency == 1 else al.run_agent_loop(**fields)
        events, _ = al.settle_run(run_)
        errors = [
            e.payload["tool_result"].content
            for e in events
            if e.type == "tool.finished" and e.payload["tool_result"].is_error
        ]
        assert problem in errors[0]

    def test_a_call_open_in_the_log_yields_its_progress_then_runs_the_tool(self) -> None:
        events, _ = recorded("at once, cancelled with a call open")
        log = alr.RunSteps()
        for event in events:
            log.feed(event)

        def again(arguments: dict[str, Any], signal: al.Signal) -> Generator[str, None, str]:
            yield "live"
            return "ran again"

        recording = alr.Recording({}, {}, {}, log)
        tools = al.ToolRegistry([recording.tool(al.Tool("work", "W.", {"type": "object"}, again))])
        result = al.execute_tool_call(tools, call("work", "b", {}), threading.Event())
        assert result.content == "ran again"
        # Not run by the loop: nothing is recorded for it.
        assert tools.get("work").execute({}, threading.Event()) is not None  # type: ignore[union-attr]


def returns_nothing(arguments: dict[str, Any], signal: al.Signal) -> object:
    raise AssertionError("a recorded call runs nothing")


class TestPassedOn:
    """passed_on(run, on_event, on_end): the one driver of a run with a hook on each event,
    which replay, durable runs and sessions pass their runs through."""

    def test_each_event_is_seen_then_passed_on_and_the_run_is_closed_however_it_ends(
        self,
    ) -> None:
        events, result, _ = run([stop("response-001", "Hi.")])
        happened: list[str] = []

        def logged_run() -> Generator[al.Event, None, al.RunResult]:
            try:
                for event in events:
                    happened.append(f"gives {event.sequence}")
                    yield event
                return result
            finally:
                happened.append("run closed")

        finished = events[-1]
        other = al.Event(finished.sequence, finished.type, {"result": result})

        def seen(event: al.Event) -> al.Event | None:
            happened.append(f"seen {event.sequence}")
            return other if event is finished else None  # None: the event as it is

        runs = []  # held here, so that only passed_on closes them (not their collection)

        def passed_on(
            on_event: Callable[[al.Event], al.Event | None],
        ) -> Generator[al.Event, None, al.RunResult]:
            runs.append(logged_run())
            return alr.passed_on(runs[-1], on_event, lambda: happened.append("on_end"))

        # Each event is seen before it is passed on (run.finished replaced); the run's
        # result is returned.
        again, again_result = al.settle_run(passed_on(seen))
        assert again[:-1] == events[:-1]
        assert again[-1] is other  # (equal to the run's: an event's time is not compared)
        assert again_result is result
        each = [f"{what} {event.sequence}" for event in events for what in ("gives", "seen")]
        assert happened == [*each, "run closed", "on_end"]
        # Closed after its first event: on_end, then the run is closed.
        happened.clear()
        closed = passed_on(seen)
        assert next(closed) is events[0]
        closed.close()
        assert happened == ["gives 0", "seen 0", "on_end", "run closed"]

        # on_event raises: its exception goes on, and the run is closed, after on_end.
        def refuses(event: al.Event) -> None:
            raise LookupError(f"refused {event.sequence}")

        happened.clear()
        with pytest.raises(LookupError, match="refused 0"):
            al.settle_run(passed_on(refuses))
        assert happened == ["gives 0", "on_end", "run closed"]


class TestJsonLines:
    """dump_events() writes one compact to_dict() JSON line per event; load_events() reads
    the lines back, and a line it cannot read is a ValueError naming its number."""

    def test_the_events_of_a_run_go_to_a_file_and_back(self, tmp_path: Path) -> None:
        events, _ = record_run(thinking_script(), tools=[add_tool()])
        path = tmp_path / "run.jsonl"
        with open(path, "w", encoding="utf-8") as file:
            alr.dump_events(events, file)
        assert path.read_text(encoding="utf-8") == "".join(
            json.dumps(event.to_dict(), separators=(",", ":"), allow_nan=False) + "\n"
            for event in events
        )
        with open(path, encoding="utf-8") as file:
            loaded = alr.load_events(file)
        assert loaded == events
        assert dicts_of(loaded) == dicts_of(events)
        assert_replays_exactly(loaded)

    def test_the_lines_are_ascii_and_every_text_comes_back(self) -> None:
        """Characters beyond ASCII are escapes: a reader that splits lines at U+2028 or
        U+0085 (str.splitlines()) splits no line, and a lone surrogate comes back."""
        content = "One\u2028two\x85three\r\nfour \u00e9 \ud800"
        events, _ = record_run([stop("response-001", content)])
        written = io.StringIO()
        alr.dump_events(events, written)
        assert written.getvalue().isascii()
        assert len(written.getvalue().splitlines()) == len(events)
        loaded = alr.load_events(io.StringIO(written.getvalue()))
        assert loaded == events
        assert loaded[-1].payload["result"].final_text == content

    def test_an_item_that_is_not_an_event_is_a_type_error_after_the_lines_before_it(
        self,
    ) -> None:
        events, _ = record_run([stop("response-001", "The sum is 42.")])
        written = io.StringIO()
        with pytest.raises(TypeError) as refused:
            alr.dump_events([events[0], events[1].to_dict()], written)  # type: ignore[list-item]
        assert str(refused.value) == "dump_events() takes Events, got dict at position 1"
        assert alr.load_events(io.StringIO(written.getvalue())) == events[:1]

    @pytest.mark.parametrize(
        ("line", "message"),
        [
            ("not json\n", "line 2: not JSON (Expecting value: line 1 column 1 (char 0))"),
            ("\n", "line 2: not JSON (Expecting value: line 1 column 1 (char 0))"),
            ('{"sequence": 1\n', "line 2: not JSON (Expecting ',' delimiter: "),
            ("[1, 2]\n", "line 2: event must be an object, got list"),
            ('{"sequence": 1, "type": "model.chunk"}\n', "line 2: event.payload is missing"),
        ],
        ids=["not JSON", "blank", "torn", "an array", "no payload"],
    )
    def test_a_line_that_holds_no_event_is_a_value_error_naming_it(
        self, line: str, message: str
    ) -> None:
        events, _ = record_run([stop("response-001", "The sum is 42.")])
        written = io.StringIO()
        alr.dump_events(events, written)
        lines = written.getvalue().splitlines(keepends=True)
        with pytest.raises(ValueError, match=r"^line 2: ") as refused:
            alr.load_events([lines[0], line, *lines[1:]])
        assert str(refused.value).startswith(message)

    def test_times_are_written_when_asked_and_read_back_with_the_events(self) -> None:
        events, _ = record_run(two_call_script())
        timed, plain = io.StringIO(), io.StringIO()
        # A run written as it goes: the times of the events it times itself (a tool.finished:
        # when its tool returned) and of those it does not (when written) agree in order.
        live = al.run_agent_loop(
            messages=[user()],
            model=al.ScriptedModel(two_call_script()),
            tools=al.ToolRegistry(every_kind_of_tool()),
            max_steps=8,
        )
        alr.dump_events(live, timed, times=True)
        alr.dump_events(events, plain)
        read = alr.load_timed_events(io.StringIO(timed.getvalue()))
        assert [event for event, _ in read] == events
        seconds = [time for _, time in read if isinstance(time, float)]
        assert len(seconds) == len(events)
        assert seconds == sorted(seconds)
        assert seconds[0] >= 0
        assert alr.load_events(io.StringIO(timed.getvalue())) == events  # time not read
        assert alr.load_timed_events(io.StringIO(plain.getvalue())) == [
            (event, None) for event in events
        ]

    def test_an_event_is_timed_from_when_its_run_began_to_when_it_happened(self) -> None:
        finished = al.Event(3, "tool.finished", {}, 1001.5)  # its tool returned then
        assert alr.event_seconds(finished, 1000.0) == 1.5
        assert alr.event_seconds(finished, 1002.0) == 0.0  # never before the run
        began = time.time()
        received = alr.event_seconds(al.Event(0, "message.accepted", {}), began)
        assert 0.0 <= received <= time.time() - began  # no time of its own: now

    @pytest.mark.parametrize(
        ("line", "message"),
        [
            ('{"sequence": 1, "time": "soon"}\n', "line 2: time must be a number of seconds"),
            ('{"sequence": 1, "time": -1}\n', "line 2: time must be a number of seconds"),
        ],
        ids=["a time that is no number", "a negative time"],
    )
    def test_a_line_that_load_timed_events_cannot_read(self, line: str, message: str) -> None:
        events, _ = record_run([stop("response-001", "The sum is 42.")])
        written = io.StringIO()
        alr.dump_events(events, written)
        first = json.loads(written.getvalue().splitlines()[1])
        if "time" in line:
            first.update(json.loads(line))
            line = json.dumps(first) + "\n"
        with pytest.raises(ValueError, match=r"^line 2: ") as refused:
            alr.load_timed_events([written.getvalue().splitlines(keepends=True)[0], line])
        assert str(refused.value).startswith(message)
