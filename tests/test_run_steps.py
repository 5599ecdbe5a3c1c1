"""The one reader of a run's log (agent_loop_replay's ``RunSteps``), against one table of
logs: each row is a log, written as words, and the steps it reads to, or the error that
refuses it. Replay, durable runs, the page and the spans read runs through it, so their own
tests hold what they make of the steps, not how the events are walked.

A log's words: ``accepted``; ``chunk N`` (a text chunk of request N; ``chunk N M``: one
that says request M); ``start N ID``, ``progress N ID``, ``finish N ID`` (an ok
result), ``error N ID``, ``refuse N ID``, ``end N ID`` (an ``ends_run`` call's result);
``run`` (run.finished); ``@S words``: the event numbered S. A step is written
``(N, first, last, chunks, calls)`` and a call ``(ID, started, finished, kind, progress)``,
with the kind ``ok``, ``error``, ``refused``, ``ends_run`` or ``open``.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple, cast

import pytest

import agent_loop as al
import agent_loop_replay as alr
from loop_testing import echo_call, user

CallRow = Tuple[str, int, Optional[int], str, Tuple[int, ...]]
StepRow = Tuple[int, int, int, Tuple[int, ...], List[CallRow]]

RESULT = al.RunResult("cancelled", (user(),), 1)


def event(sequence: int, words: str) -> al.Event:
    """The event that a log's words say."""
    kind, *rest = words.split()
    if kind == "accepted":
        return al.Event(sequence, "message.accepted", {"message": user()})
    if kind == "run":
        return al.Event(sequence, "run.finished", {"result": RESULT})
    request_id = al.request_id(int(rest[0]))
    if kind == "chunk":
        chunk = al.TextDelta(al.request_id(int(rest[-1])), "x")
        return al.Event(sequence, "model.chunk", {"request_id": request_id, "chunk": chunk})
    call = echo_call(rest[1])
    payload: dict[str, Any] = {"request_id": request_id, "tool_call": call}
    if kind == "start":
        return al.Event(sequence, "tool.started", payload)
    if kind == "progress":
        progress = {"request_id": request_id, "tool_call_id": call.id, "progress": sequence}
        return al.Event(sequence, "tool.progress", progress)
    payload["tool_result"] = al.ToolResultMessage(
        al.tool_result_id(call.id), call.id, call.name, "r", kind == "error"
    )
    if kind in ("refuse", "end"):
        payload["refused" if kind == "refuse" else "ends_run"] = True
    return al.Event(sequence, "tool.finished", payload)


def log(*words: str) -> List[al.Event]:
    """The events of a log's words, numbered in order ("@S words": numbered S)."""
    return [
        event(int(item.split()[0][1:]), item.split(" ", 1)[1])
        if item.startswith("@")
        else event(sequence, item)
        for sequence, item in enumerate(words)
    ]


def rows(steps: alr.RunSteps) -> List[StepRow]:
    """What the reader holds, in the rows' words."""

    def kind(call: alr.Call) -> str:
        if call.result is None:
            return "open"
        if call.refused or call.ends_run:
            return "refused" if call.refused else "ends_run"
        return "error" if call.result.is_error else "ok"

    return [
        (
            cast(int, al.request_number(step.request_id)),
            step.first,
            step.last,
            step.chunks,
            [
                (call.tool_call.id, call.started, call.finished, kind(call), call.progress)
                for call in step.calls
            ],
        )
        for step in steps.steps
    ]


READS: List[Tuple[str, List[str], List[StepRow]]] = [
    ("no request at all", ["accepted", "run"], []),
    ("a step of chunks", ["accepted", "chunk 1", "chunk 1", "run"], [(1, 1, 2, (1, 2), [])]),
    (
        "a request with no chunk, then the next request",
        ["accepted", "start 1 a", "finish 1 a", "chunk 2", "run"],
        [(1, 1, 2, (), [("a", 1, 2, "ok", ())]), (2, 3, 3, (3,), [])],
    ),
    (
        "a request sequence start: the first request any number",
        ["accepted", "chunk 5", "start 5 a", "error 5 a", "chunk 6", "run"],
        [(5, 1, 3, (1,), [("a", 2, 3, "error", ())]), (6, 4, 4, (4,), [])],
    ),
    (
        "calls at once: started in a row, finished in their order, progress between",
        [
            *("accepted", "chunk 1", "start 1 a", "start 1 b", "progress 1 b"),
            *("progress 1 a", "finish 1 a", "progress 1 b", "finish 1 b", "run"),
        ],
        [(1, 1, 8, (1,), [("a", 2, 6, "ok", (5,)), ("b", 3, 8, "ok", (4, 7))])],
    ),
    (
        "progress between calls started at once",
        ["accepted", "start 1 a", "progress 1 a", "start 1 b", "finish 1 a", "finish 1 b", "run"],
        [(1, 1, 5, (), [("a", 1, 4, "ok", (2,)), ("b", 3, 5, "ok", ())])],
    ),
    (
        "a refused call and an ends_run call",
        ["accepted", "start 1 a", "refuse 1 a", "start 1 b", "end 1 b", "run"],
        [(1, 1, 4, (), [("a", 1, 2, "refused", ()), ("b", 3, 4, "ends_run", ())])],
    ),
    (
        "a cancelled log with an open call",
        ["accepted", "chunk 1", "start 1 a", "progress 1 a", "run"],
        [(1, 1, 3, (1,), [("a", 2, None, "open", (3,))])],
    ),
    (
        "a cancelled group: the first result joined, the others open",
        ["accepted", "start 1 a", "start 1 b", "start 1 c", "finish 1 a", "run"],
        [
            (
                1,
                1,
                4,
                (),
                [("a", 1, 4, "ok", ()), ("b", 2, None, "open", ()), ("c", 3, None, "open", ())],
            )
        ],
    ),
    ("a log that stops before run.finished", ["accepted", "chunk 1"], [(1, 1, 1, (1,), [])]),
]


REFUSED: List[Tuple[str, List[str], str]] = [
    ("a gap in the sequences", ["accepted", "@2 chunk 1"], "has sequence 2"),
    ("an event after run.finished", ["accepted", "run", "accepted"], "after run.finished"),
    ("message.accepted after a request", ["chunk 1", "accepted"], "before the first request"),
    ("a request that is no request id", ["start 65 a"], "no request id"),
    ("a request skipped", ["chunk 1", "chunk 3"], "its next 'request-002'"),
    ("a request back", ["chunk 2", "chunk 1"], "its next 'request-003'"),
    ("a request again", ["chunk 1", "start 1 a", "finish 1 a", "chunk 2", "chunk 1"], "current"),
    ("a request while a call is open", ["start 1 a", "chunk 2"], "while tool calls"),
    ("a chunk of another request", ["chunk 1 2"], "a chunk carries its event's request id"),
    ("a chunk after a call", ["start 1 a", "finish 1 a", "chunk 1"], "before the request's"),
    (
        "a start after a result in a group",
        ["start 1 a", "start 1 b", "finish 1 a", "start 1 c"],
        "before the previous one finished",
    ),
    ("a call id started twice", ["start 1 a", "start 1 a"], "started twice"),
    ("progress of no open call", ["start 1 a", "finish 1 a", "progress 1 a"], "not open"),
    ("a result never started", ["finish 1 a"], "without starting"),
    ("results out of start order", ["start 1 a", "start 1 b", "finish 1 b"], "started earlier"),
]


class TestRunSteps:
    """The one reader of a run's log, by its table."""

    @pytest.mark.parametrize(("name", "words", "expected"), READS, ids=[row[0] for row in READS])
    def test_a_log_reads_to_its_steps(
        self, name: str, words: List[str], expected: List[StepRow]
    ) -> None:
        steps = alr.RunSteps()
        events = log(*words)
        for position, item in enumerate(events):
            steps.feed(item, time=position / 10 if position % 2 else None)
        assert rows(steps) == expected
        assert steps.events == tuple(events)
        assert steps.times == tuple(p / 10 if p % 2 else None for p in range(len(events)))
        assert steps.accepted == (user(),)
        assert steps.result == (RESULT if words[-1] == "run" else None)

    def test_an_event_of_no_run_is_refused(self) -> None:
        steps = alr.RunSteps()
        with pytest.raises(ValueError, match=r"event 0 \(tool.waiting\): not an event type"):
            steps.feed(al.Event(0, cast(Any, "tool.waiting"), {}))
        with pytest.raises(TypeError, match=r"RunSteps.feed\(\) takes Events, got dict"):
            steps.feed(cast(Any, {}))
        with pytest.raises(TypeError, match="time must be a number"):
            steps.feed(event(0, "accepted"), cast(Any, "1"))
        assert (steps.events, steps.times) == ((), ())

    @pytest.mark.parametrize(("name", "words", "match"), REFUSED, ids=[row[0] for row in REFUSED])
    def test_a_log_out_of_order_is_refused_and_changes_nothing(
        self, name: str, words: List[str], match: str
    ) -> None:
        events = log(*words)
        steps = alr.RunSteps()
        for item in events[:-1]:
            steps.feed(item)
        before = (rows(steps), steps.events, steps.times, steps.accepted, steps.result)
        with pytest.raises(ValueError, match=match) as refused:
            steps.feed(events[-1])
        assert f"event {len(events) - 1} ({events[-1].type})" in str(refused.value)
        assert (rows(steps), steps.events, steps.times, steps.accepted, steps.result) == before
