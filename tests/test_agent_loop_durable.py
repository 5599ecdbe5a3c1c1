"""Tests for agent_loop_durable.durable_run(): a run written to its journal as it goes, which
a later call (in another process, after a crash) finishes from where the last one stopped.

The suite imports ``agent_loop_durable`` once, as ``ald`` (``agent_loop`` as ``al``, and
``agent_loop_replay`` as ``alr`` for its JSON lines).
Every live run goes through the driver's settle() (loop_testing.py), which checks the
run's invariants; a finished run given again from its journal is compared with the run
that wrote it. The model is a RequestKeyedModel: deterministic in the sense a resumed run
needs (the same request gets the same answer, whatever came before).

Contents
    TestAnUninterruptedDurableRun: run_agent_loop()'s events and result, journaled as they come
    TestAFinishedRunIsGivenAgain: from its journal, calling neither the model nor a tool
    TestAnUnfinishedRunGoesOn: from any point where its journal stops, the same events and result
    TestCancellation: the consumer's signal, in a live run and while a run is given again
    TestRefusedJournals: another run's or a corrupt journal: JournalError naming the line
    TestOptions: run_agent_loop()'s errors at call time, and the journal's own
    TestEveryOptionOfRunAgentLoop: tools at once and consent, from any point of the journal
    TestADecisionThatComesLater: LATER stops the run; called again, it asks again
    TestEffectKeys: effect_key(), the same in every process, another run's differ
    TestLiveFrom: live_from(), the first event given live
    TestKilledProcesses: a child process killed at every kind of point, then run again
    TestKilledProcessesWithToolsAtOnce: the same for a batch at once, and a decision later
    TestProgressAndEndingTools: tool.progress and ends_run through journals, from any cut
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Generator, Iterator, List, Optional, Tuple, cast

import pytest

import agent_loop as al
import agent_loop_durable as ald
import agent_loop_replay as alr
from loop_testing import (
    Choreography,
    Fatal,
    Plan,
    RequestKeyedModel,
    add_tool,
    call,
    dicts_of,
    event_key,
    settle,
    text,
    user,
)

# --- The script, its tools, and the runs of it ------------------------------------------


def script() -> Dict[str, al.ScriptedResponse]:
    """Three steps: text in pieces and two calls; thinking, a call of an unknown tool and a
    refusal; the answer in two pieces. Every response has its usage."""
    return {
        "request-001": al.scripted_response(
            "response-001",
            [
                text("Let me add."),
                call("add", "call-1", {"left": 20, "right": 22}),
                call("effect", "call-2", {"note": "first"}),
            ],
            "toolCall",
            chunks=[
                text("Let me "),
                text(""),
                text("add."),
                call("add", "call-1", {"left": 20, "right": 22}),
                call("effect", "call-2", {"note": "first"}),
            ],
            usage=al.Usage(100, 20),
        ),
        "request-002": al.scripted_response(
            "response-002",
            [
                al.ThinkingBlock("Now the rest, \u2028 in one go.", "sig-002"),
                call("effect", "call-3", {"note": "second \u00e9\ud800"}),
                call("missing", "call-4", {}),
                call("refuse", "call-5", {}),
            ],
            "toolCall",
            usage=al.Usage(130, 30),
        ),
        "request-003": al.scripted_response(
            "response-003",
            [text("The sum is 42.")],
            "stop",
            chunks=[text("The sum "), text("is 42.")],
            usage=al.Usage(160, 8),
        ),
    }


START = al.UserMessage("user-001", "Add 20 and 22.")
"""The script's starting message, unless a test gives others (the journal tests quote it)."""

REQUESTS = ("request-001", "request-002", "request-003")
EXECUTED_CALLS = ("call-1", "call-2", "call-3", "call-5")
"""The calls whose tool runs, in order (call-4 names a tool the registry does not hold)."""


class Effects:
    """What the script's tools did in one process: ``executions`` lists a call's id each
    time its tool runs; ``applied`` lists it once, as a tool that makes itself idempotent
    with agent_loop.current_tool_call().id applies its effect."""

    def __init__(self, interrupt: Optional[str] = None) -> None:
        self.executions: List[str] = []
        self.applied: List[str] = []
        self.interrupt = interrupt  # a call id whose first run dies after its effect

    def tools(self) -> List[al.Tool]:
        def add(arguments: Dict[str, Any], signal: al.Signal) -> object:
            self.ran()
            return {"sum": arguments["left"] + arguments["right"]}

        def effect(arguments: Dict[str, Any], signal: al.Signal) -> object:
            self.ran()
            return "noted " + arguments["note"]

        def refuse(arguments: Dict[str, Any], signal: al.Signal) -> object:
            self.ran()
            raise al.ToolError("Not today.")

        notes = {"type": "object", "properties": {"note": {"type": "string"}}}
        return [
            al.Tool("add", "Adds two numbers.", add_tool().parameters, add),
            al.Tool("effect", "Notes something, once.", notes, effect),
            al.Tool("refuse", "Refuses.", {"type": "object"}, refuse),
        ]

    def ran(self) -> None:
        call = al.current_tool_call()
        assert call is not None
        self.executions.append(call.id)
        if call.id not in self.applied:
            self.applied.append(call.id)
        if call.id == self.interrupt:
            self.interrupt = None
            raise SystemExit("the process dies inside the tool")


@dataclasses.dataclass
class Process:
    """A process that runs the script durably: its own model and tools, fresh."""

    model: RequestKeyedModel = dataclasses.field(
        default_factory=lambda: RequestKeyedModel(script())
    )
    effects: Effects = dataclasses.field(default_factory=Effects)

    def durable_run(
        self, journal: Path, **options: Any
    ) -> Generator[al.Event, None, al.RunResult]:
        options.setdefault("messages", [START])
        options.setdefault("max_steps", 8)
        tools = al.ToolRegistry(self.effects.tools())
        return ald.durable_run(journal, model=self.model, tools=tools, **options)

    def settle(
        self, journal: Path, cancel_at: Any = None, **options: Any
    ) -> Tuple[List[al.Event], al.RunResult]:
        """A run that is live at least in part: through the driver, which checks it."""
        signal = threading.Event()
        run = self.durable_run(journal, signal=signal, **options)
        start = list(options.get("messages", [START]))
        return settle(run, signal=signal, cancel_at=cancel_at, start=start)

    def given_again(self, journal: Path, **options: Any) -> Tuple[List[al.Event], al.RunResult]:
        """A finished run from its journal: nothing is called."""
        events, result = al.settle_run(self.durable_run(journal, **options))
        assert self.model.call_count == 0
        assert self.effects.executions == []
        return events, result


def reference(cancel_at: Any = None, **options: Any) -> Tuple[List[al.Event], al.RunResult]:
    """run_agent_loop() on the script, uninterrupted: what a durable run must give."""
    options.setdefault("messages", [START])
    options.setdefault("max_steps", 8)
    model, signal = RequestKeyedModel(script()), threading.Event()
    run = al.run_agent_loop(
        model=model, tools=al.ToolRegistry(Effects().tools()), signal=signal, **options
    )
    return settle(
        run,
        model,
        max_steps=options["max_steps"],
        start=list(options["messages"]),
        signal=signal,
        cancel_at=cancel_at,
    )


def whole_lines(data: bytes) -> List[Dict[str, Any]]:
    """The JSON of each whole line (one that ends with a newline) of journal bytes, an
    event line without its time."""
    lines = [json.loads(line) for line in data.split(b"\n")[:-1]]
    for line in lines:
        line.pop("time", None)
    return lines


def kind_of(line: Dict[str, Any]) -> str:
    """A journal line's record kind, or its event's type."""
    return str(line["record"]) if "record" in line else str(line["type"])


def recorded_in(data: bytes) -> Tuple[set[str], set[str], bool]:
    """What the whole lines of journal bytes record: the calls with a result, the requests
    with a response, and whether the run finished."""
    lines = whole_lines(data)
    results = {
        line["payload"]["toolCall"]["id"] for line in lines if kind_of(line) == "tool.finished"
    }
    responses = {line["response"]["requestId"] for line in lines if kind_of(line) == "response"}
    return results, responses, any(kind_of(line) == "run.finished" for line in lines)


# --- An uninterrupted run ---------------------------------------------------------------


class TestAnUninterruptedDurableRun:
    """Uninterrupted, a durable run is run_agent_loop(), and its journal holds the run
    record, every event and every toolCall response, synced at each complete message."""

    def test_it_gives_the_events_and_the_result_of_run_agent_loop(self, tmp_path: Path) -> None:
        process = Process()
        events, result = process.settle(tmp_path / "run.jsonl")
        expected, expected_result = reference()
        assert dicts_of(events) == dicts_of(expected)
        assert result == expected_result
        assert result.status == "completed"
        assert result.usage == al.Usage(390, 58)
        assert process.effects.executions == list(EXECUTED_CALLS)
        assert [request.id for request in process.model.requests] == list(REQUESTS)

    def test_its_journal_holds_the_run_record_the_events_and_each_tool_call_response(
        self, tmp_path: Path
    ) -> None:
        journal = tmp_path / "run.jsonl"
        events, _ = Process().settle(journal)
        data = journal.read_bytes()
        assert data.isascii()
        assert data.endswith(b"\n")
        times = [json.loads(line).get("time") for line in data.splitlines()[1:]]
        lines = whole_lines(data)
        run_id = lines[0]["runId"]
        assert lines[0] == {
            "record": "run",
            "format": 2,
            "runId": run_id,
            "messages": [user().to_dict()],
            "tools": [tool.spec().to_dict() for tool in Effects().tools()],
            "maxSteps": 8,
            "requestSequenceStart": 0,
            "toolConcurrency": 1,
        }
        assert list(lines[0])[:3] == ["record", "format", "runId"]
        assert isinstance(run_id, str)
        assert len(run_id) == 32
        event_lines = [line for line in lines[1:] if "record" not in line]
        # Each event line holds its time: seconds since durable_run() was called, in order.
        times = [seconds for seconds, line in zip(times, lines[1:]) if "record" not in line]
        assert all(isinstance(seconds, float) for seconds in times)
        assert times[0] >= 0
        assert times == sorted(times)
        assert event_lines == dicts_of(events)
        responses = [line for line in lines if kind_of(line) == "response"]
        scripted = script()
        assert [line["response"] for line in responses] == [
            al.ModelResponse(
                scripted[request_id].id,
                request_id,
                scripted[request_id].content,
                "toolCall",
                scripted[request_id].usage,
            ).to_dict()
            for request_id in REQUESTS[:2]
        ]
        # Each response comes right before its request's first tool.started.
        for index, line in enumerate(lines):
            if kind_of(line) == "response":
                assert kind_of(lines[index + 1]) == "tool.started"
                assert lines[index + 1]["payload"]["requestId"] == line["response"]["requestId"]
        # The event lines are the events, as load_events() reads JSON lines.
        text_lines = data.decode("ascii").splitlines(keepends=True)
        assert alr.load_events(line for line in text_lines if '"record"' not in line) == events

    def test_each_event_is_in_the_journal_before_the_consumer_sees_it(
        self, tmp_path: Path
    ) -> None:
        journal = tmp_path / "run.jsonl"
        seen = []

        def last_line(event: al.Event) -> None:
            seen.append(whole_lines(journal.read_bytes())[-1] == event.to_dict())

        al.settle_run(Process().durable_run(journal), on_event=last_line)
        assert seen
        assert all(seen)

    def test_the_journal_is_synced_at_each_complete_message_and_at_the_end_only(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        journal = tmp_path / "run.jsonl"
        synced: List[int] = []  # how many whole lines the journal held at each fsync
        real_fsync = os.fsync

        def fsync(descriptor: int) -> None:
            real_fsync(descriptor)
            synced.append(journal.read_bytes().count(b"\n"))

        monkeypatch.setattr(os, "fsync", fsync)
        Process().settle(journal)
        lines = whole_lines(journal.read_bytes())
        boundaries = [2]  # the run record with the first event, then its directory's entry
        for number, line in enumerate(lines, start=1):
            if kind_of(line) in ("response", "tool.finished", "run.finished"):
                boundaries.append(number)
        assert synced == [2, *boundaries]  # never at a chunk

    def test_nothing_is_written_until_the_run_is_iterated(self, tmp_path: Path) -> None:
        journal = tmp_path / "run.jsonl"
        run = Process().durable_run(journal)
        assert not journal.exists()
        next(run)
        assert journal.exists()
        run.close()

    def test_a_write_that_the_system_cuts_short_is_written_whole(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        Process().settle(tmp_path / "whole.jsonl")
        real_write = os.write
        monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data)[:7]))
        Process().settle(tmp_path / "short.jsonl")
        monkeypatch.undo()
        short, whole = (
            (tmp_path / "short.jsonl").read_bytes(),
            (tmp_path / "whole.jsonl").read_bytes(),
        )
        # The same lines but the run id and the times.
        assert short.count(b"\n") == whole.count(b"\n")
        assert whole_lines(short)[1:] == whole_lines(whole)[1:]

    def test_a_system_that_opens_no_directory_still_gets_the_journal(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Windows cannot open a directory to sync it; the journal is written all the same."""
        real_open = os.open

        def open_no_directory(path: Any, flags: int, *mode: int) -> int:
            if os.path.isdir(path):
                raise PermissionError(13, "Permission denied", path)
            return real_open(path, flags, *mode)

        monkeypatch.setattr(os, "open", open_no_directory)
        events, result = Process().settle(tmp_path / "run.jsonl")
        monkeypatch.undo()
        assert result == reference()[1]
        assert Process().given_again(tmp_path / "run.jsonl") == (events, result)

    def test_a_journal_is_a_str_or_a_path(self, tmp_path: Path) -> None:
        _, result = Process().settle(tmp_path / "run.jsonl")
        _, again = Process().given_again(str(tmp_path / "run.jsonl"))  # type: ignore[arg-type]
        assert again == result


# --- A finished run -----------------------------------------------------------------------


def endings() -> Dict[str, Callable[[Process, Path], Tuple[List[al.Event], al.RunResult]]]:
    """Each way a run ends, as a durable run that ends so in a journal."""

    def missing_step(process: Process, journal: Path) -> Tuple[List[al.Event], al.RunResult]:
        del process.model.script["request-002"]
        return process.settle(journal)

    def wrong_request_id(process: Process, journal: Path) -> Tuple[List[al.Event], al.RunResult]:
        step = process.model.script["request-002"]
        process.model.script["request-002"] = dataclasses.replace(step, request_id="other")
        return process.settle(journal)

    def fatal_tool(process: Process, journal: Path) -> Tuple[List[al.Event], al.RunResult]:
        def fatal(arguments: Dict[str, Any], signal: al.Signal) -> object:
            raise Fatal("not an Exception")

        tools = [al.Tool("add", "Adds two numbers.", add_tool().parameters, fatal)]
        return settle(
            ald.durable_run(
                journal,
                messages=[user()],
                model=process.model,
                tools=al.ToolRegistry(tools),
                max_steps=8,
            )
        )

    return {
        "completed": lambda process, journal: process.settle(journal),
        "maxSteps": lambda process, journal: process.settle(journal, max_steps=2),
        "cancelled": lambda process, journal: process.settle(journal, cancel_at=7),
        "MODEL_STREAM_ERROR": missing_step,
        "MODEL_PROTOCOL_ERROR": wrong_request_id,
        "TOOL_PHASE_ERROR": fatal_tool,
        "INVALID_TRANSCRIPT": lambda process, journal: process.settle(
            journal, messages=[user(), user()]
        ),
    }


class TestAFinishedRunIsGivenAgain:
    """A finished run (any status) is given again from its journal: its recorded events
    and result, and neither the model nor a tool is called."""

    @pytest.mark.parametrize("ending", list(endings()))
    def test_it_yields_the_recorded_events_and_returns_the_recorded_result(
        self, tmp_path: Path, ending: str
    ) -> None:
        journal = tmp_path / "run.jsonl"
        events, result = endings()[ending](Process(), journal)
        assert (result.error.code if result.error else result.status) == ending
        written = journal.read_bytes()
        options: Dict[str, Any] = {"max_steps": 2} if ending == "maxSteps" else {}
        if ending == "TOOL_PHASE_ERROR":
            process = Process()
            run = ald.durable_run(
                journal,
                messages=[user()],
                model=process.model,
                tools=al.ToolRegistry([add_tool()]),
                max_steps=8,
            )
            again, again_result = al.settle_run(run)
            assert process.model.call_count == 0
        else:
            messages = [user(), user()] if ending == "INVALID_TRANSCRIPT" else [user()]
            again, again_result = Process().given_again(journal, messages=messages, **options)
        assert again == events
        assert again_result == result
        assert again[-1].payload["result"] is again_result
        assert journal.read_bytes() == written  # nothing is written for a finished run

    def test_a_failed_result_read_back_has_no_exception(self, tmp_path: Path) -> None:
        journal = tmp_path / "run.jsonl"
        _, result = endings()["MODEL_STREAM_ERROR"](Process(), journal)
        assert result.error is not None
        assert isinstance(result.error.exception, KeyError)
        _, again = Process().given_again(journal)
        assert again.error is not None
        assert again.error.exception is None


# --- An unfinished run --------------------------------------------------------------------


def cuts(data: bytes) -> List[int]:
    """Where a crash can stop a journal: at the start, halfway through each line, just
    before its newline, and after it."""
    points = {0}
    begin = 0
    for end in (index for index, byte in enumerate(data) if byte == ord("\n")):
        points.update(((begin + end) // 2, end, end + 1))
        begin = end + 1
    return sorted(points)


class TestAnUnfinishedRunGoesOn:
    """Called again after its process died, a run gives its recorded events again up to
    its last complete message, then goes on live: recorded responses are not requested
    again, recorded results not run again, and it ends as the uninterrupted run does."""

    def test_from_any_point_where_its_journal_stops(self, tmp_path: Path) -> None:
        whole = tmp_path / "whole.jsonl"
        expected, expected_result = Process().settle(whole)
        data = whole.read_bytes()
        for cut in cuts(data):
            journal = tmp_path / f"cut-{cut}.jsonl"
            journal.write_bytes(data[:cut])
            results, responses, finished = recorded_in(data[:cut])
            process = Process()
            if finished:
                events, result = process.given_again(journal)
            else:
                events, result = process.settle(journal)
            assert dicts_of(events) == dicts_of(expected), cut
            assert result == expected_result, cut
            # What is recorded is not done again; what is not, is (from its step on).
            assert process.effects.executions == [
                call_id for call_id in EXECUTED_CALLS if call_id not in results and not finished
            ], cut
            assert [request.id for request in process.model.requests] == [
                request_id
                for request_id in REQUESTS
                if request_id not in responses and not finished
            ], cut
            # The journal only grew (a torn last line aside), and now holds a finished run.
            grown = journal.read_bytes()
            kept = data[: data.rfind(b"\n", 0, cut) + 1]
            assert grown.startswith(kept), cut
            assert Process().given_again(journal) == (events, result), cut

    def test_the_process_that_goes_on_writes_a_resume_record_first(self, tmp_path: Path) -> None:
        journal = tmp_path / "run.jsonl"
        data = self._journal_cut_after(tmp_path, "tool.started", 2)
        journal.write_bytes(data)
        events, _ = Process().settle(journal)
        added = whole_lines(journal.read_bytes()[len(data) :])
        started = [line for line in whole_lines(data) if kind_of(line) == "tool.started"][1]
        # The tool.started recorded after the last result is void: given live again.
        assert added[0] == {"record": "resume", "sequence": started["sequence"]}
        assert added[1] == started
        assert [line["sequence"] for line in added[1:] if "record" not in line] == list(
            range(started["sequence"], len(events))
        )

    def test_the_process_that_goes_on_goes_on_with_the_journals_clock(
        self, tmp_path: Path
    ) -> None:
        """A journal's times never go back: the time between two processes counts nothing,
        and this process's time before its first live event (its replay) counts. (The
        loop's own clock, time.time() in Event.time, is the one a process's times count
        on: no fake clock stands in for it.)"""
        journal = tmp_path / "run.jsonl"
        journal.write_bytes(self._journal_cut_after(tmp_path, "tool.finished", 1))
        first = ald.read_journal(journal).times
        last_recorded = max(time for time in first if time is not None)
        began = time.time()
        Process().settle(journal)
        took = time.time() - began
        times = ald.read_journal(journal).times
        assert None not in times  # every event has its time
        assert list(times) == sorted(cast(Tuple[float, ...], times))
        live = cast(Tuple[float, ...], times[len(first) :])
        # From the last recorded time on, as much as this process took and no more.
        assert last_recorded <= live[0] <= live[-1] <= last_recorded + took

    def test_read_journal_gives_the_runs_events_times_and_resumes(self, tmp_path: Path) -> None:
        """Its other entries are skipped, the events a resume entry voids dropped, and so is
        a torn last line; the page reads a journal with it (view.read_run, by the first line)."""
        import agent_loop_view as view

        events, _ = reference()
        journal = tmp_path / "run.jsonl"
        cut = self._journal_cut_after(tmp_path, "tool.started", 2)
        journal.write_bytes(cut + b'{"sequ')  # a process died writing a line
        read = ald.read_journal(journal)
        assert dicts_of(read.events) == dicts_of(events[: len(read.events)])
        assert (read.resumes, read.awaiting) == ((), ())
        boundary = ald.live_from(journal)
        Process().settle(journal)  # another went on from its last complete message
        read = ald.read_journal(journal)
        assert dicts_of(read.events) == dicts_of(events)
        assert read.resumes == (boundary,)
        assert None not in read.times
        timed, held = view.read_run(str(journal))
        assert (timed, held) == (list(zip(read.events, read.times)), read)
        # A journal whose first line is torn holds nothing yet.
        journal.write_bytes(cut[: cut.index(b"\n") // 2])
        assert ald.read_journal(journal).events == ()

    def _journal_cut_after(self, tmp_path: Path, kind: str, occurrence: int) -> bytes:
        """The journal of the script, cut after the ``occurrence``-th line of ``kind``."""
        whole = tmp_path / "whole.jsonl"
        Process().settle(whole)
        lines = whole.read_bytes().split(b"\n")
        ends = [
            index for index, line in enumerate(lines[:-1]) if kind_of(json.loads(line)) == kind
        ]
        return b"\n".join(lines[: ends[occurrence - 1] + 1]) + b"\n"

    def test_a_call_that_started_and_has_no_result_runs_again(self, tmp_path: Path) -> None:
        """At least once: the process died inside the tool, after its effect. The tool
        runs again, and a tool keyed by the call's id applies its effect once."""
        journal = tmp_path / "run.jsonl"
        effects = Effects(interrupt="call-2")
        with pytest.raises(SystemExit):
            Process(effects=effects).settle(journal)
        assert effects.executions == ["call-1", "call-2"]
        results, _, _ = recorded_in(journal.read_bytes())
        assert results == {"call-1"}
        process = Process(effects=effects)
        events, result = process.settle(journal)
        assert effects.executions == ["call-1", "call-2", "call-2", "call-3", "call-5"]
        assert effects.applied == list(EXECUTED_CALLS)
        assert (dicts_of(events), result) == (dicts_of(reference()[0]), reference()[1])

    def test_a_consumer_that_closes_the_run_leaves_it_to_go_on(self, tmp_path: Path) -> None:
        journal = tmp_path / "run.jsonl"
        effects = Effects()
        stops = [3, 9, 9, 15, 2, 20]  # events taken by each process before it stops
        for stop in stops:
            run = Process(effects=effects).durable_run(journal)
            taken = [next(run) for _ in range(stop + 1)]
            run.close()
            assert [event.sequence for event in taken] == list(range(stop + 1))
        events, result = Process(effects=effects).settle(journal)
        assert (dicts_of(events), result) == (dicts_of(reference()[0]), reference()[1])
        assert effects.executions == list(EXECUTED_CALLS)  # closed between calls: none twice
        # A process that only gave recorded events again wrote nothing; each other began
        # with a resume record at the first event past the last complete message.
        resumes = [line for line in whole_lines(journal.read_bytes()) if kind_of(line) == "resume"]
        assert [line["sequence"] for line in resumes] == [0, 10, 16, 20]

    def test_a_run_with_history_and_a_request_sequence_start_goes_on(self, tmp_path: Path) -> None:
        history = [
            al.UserMessage("user-000", "Earlier."),
            al.AssistantMessage("message-response-000", [text("Earlier answer.")]),
            user(),
        ]
        keyed = {f"request-01{n}": script()[f"request-00{n}"] for n in (1, 2, 3)}
        options: Dict[str, Any] = {
            "messages": history,
            "max_steps": 5,
            "request_sequence_start": 10,
        }
        whole = tmp_path / "whole.jsonl"
        expected, expected_result = Process(model=RequestKeyedModel(keyed)).settle(
            whole, **options
        )
        assert expected_result.next_request_sequence == 13
        data = whole.read_bytes()
        journal = tmp_path / "run.jsonl"
        journal.write_bytes(
            data[: data.index(b'"type":"model.chunk","payload":{"requestId":"request-013"')]
        )
        events, result = Process(model=RequestKeyedModel(keyed)).settle(journal, **options)
        assert (dicts_of(events), result) == (dicts_of(expected), expected_result)


# --- Cancellation -----------------------------------------------------------------------


class TestCancellation:
    """The consumer's signal cancels a durable run as it cancels run_agent_loop(), and a
    cancelled run is finished: given again as it ended."""

    @pytest.mark.parametrize("sequence", range(len(reference()[0]) - 1))
    def test_the_signal_cancels_as_run_agent_loop_does(
        self, tmp_path: Path, sequence: int
    ) -> None:
        journal = tmp_path / "run.jsonl"
        events, result = Process().settle(journal, cancel_at=sequence)
        expected, expected_result = reference(cancel_at=sequence)
        assert (dicts_of(events), result) == (dicts_of(expected), expected_result)
        assert result.status == "cancelled"
        assert Process().given_again(journal) == (events, result)

    def test_a_signal_set_while_the_run_is_given_again_cancels_it_there(
        self, tmp_path: Path
    ) -> None:
        """The recorded events are given again through the loop, which looks at the signal
        after each: cancelled at event 5 of a run recorded up to event 14, the result is
        the run's cancelled at event 5, and the journal says so from then on."""
        whole = tmp_path / "whole.jsonl"
        Process().settle(whole)
        data = whole.read_bytes()
        journal = tmp_path / "run.jsonl"
        journal.write_bytes(data[: data.index(b'{"sequence":15,')])
        process = Process()
        events, result = process.settle(journal, cancel_at=5)
        expected, expected_result = reference(cancel_at=5)
        assert (dicts_of(events), result) == (dicts_of(expected), expected_result)
        assert process.model.call_count == 0
        assert process.effects.executions == []
        assert whole_lines(journal.read_bytes())[-2] == {"record": "resume", "sequence": 6}
        assert Process().given_again(journal) == (events, result)


# --- Refused journals ---------------------------------------------------------------------


def journal_lines(tmp_path: Path, **options: Any) -> List[bytes]:
    """The whole lines (newlines included) of the script's finished journal."""
    journal = tmp_path / "written.jsonl"
    Process().settle(journal, **options)
    return journal.read_bytes().splitlines(keepends=True)


def line_of(lines: List[bytes], kind: str, occurrence: int = 1) -> int:
    """The index of the ``occurrence``-th line of a record kind or event type."""
    indexes = [index for index, line in enumerate(lines) if kind_of(json.loads(line)) == kind]
    return indexes[occurrence - 1]


def replaced(lines: List[bytes], index: int, *new: bytes) -> bytes:
    return b"".join([*lines[:index], *new, *lines[index + 1 :]])


def record(data: Dict[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode("ascii") + b"\n"


CORRUPT: Dict[str, Tuple[Callable[[List[bytes]], bytes], Callable[[List[bytes]], int], str]] = {
    # id: (the corrupt journal, the number of the line at fault, what the error says)
    "a line that is not JSON": (
        lambda lines: replaced(lines, 3, b"not json\n"),
        lambda lines: 4,
        "not a line of a journal (Expecting value",
    ),
    "a blank line": (
        lambda lines: replaced(lines, 3, lines[3], b"\n"),
        lambda lines: 5,
        "not a line of a journal",
    ),
    "a line that is not ASCII": (
        lambda lines: replaced(lines, 2, lines[2].replace(b"Let me ", "L\u00e9t me ".encode())),
        lambda lines: 3,
        "not a line of a journal ('ascii' codec can't decode",
    ),
    "a JSON array": (
        lambda lines: replaced(lines, 2, b"[1, 2]\n"),
        lambda lines: 3,
        "not a JSON object but list",
    ),
    "an event out of order": (
        lambda lines: replaced(lines, 2),
        lambda lines: 3,
        "event 1 (model.chunk) has sequence 2",
    ),
    "an event that event_from_dict refuses": (
        lambda lines: replaced(lines, 2, lines[2].replace(b'"model.chunk"', b'"model.chunks"')),
        lambda lines: 3,
        "event.type: unknown value 'model.chunks'",
    ),
    "a line after run.finished": (
        lambda lines: b"".join([*lines, lines[2]]),
        lambda lines: len(lines) + 1,
        "a line after run.finished, which ends a run's journal",
    ),
    "a record of an unknown kind": (
        lambda lines: replaced(lines, 2, record({"record": "note"}), lines[2]),
        lambda lines: 3,
        "an entry 'note': after its first line a journal holds events, and 'response', "
        "'decision', 'awaiting' and 'resume' entries",
    ),
    "a run record without a run id": (
        lambda lines: replaced(lines, 0, lines[0].replace(b'"runId":"', b'"runID":"')),
        lambda lines: 1,
        "the run id must be a non-empty string, got None",
    ),
    "a second run record": (
        lambda lines: replaced(lines, 2, lines[0], lines[2]),
        lambda lines: 3,
        "an entry 'run'",
    ),
    "a resume record beyond the events": (
        lambda lines: replaced(lines, 3, lines[3], record({"record": "resume", "sequence": 4})),
        lambda lines: 5,
        "a resume entry's sequence must be an int in 0..3 (the events recorded before it), got 4",
    ),
    "a resume record with a bool": (
        lambda lines: replaced(lines, 3, lines[3], record({"record": "resume", "sequence": True})),
        lambda lines: 5,
        "got True",
    ),
    "a resume record before event 0": (
        lambda lines: replaced(lines, 3, lines[3], record({"record": "resume", "sequence": -1})),
        lambda lines: 5,
        "got -1",
    ),
    "a second response to a request": (
        lambda lines: replaced(
            lines, line_of(lines, "response"), lines[line_of(lines, "response")] * 2
        ),
        lambda lines: line_of(lines, "response") + 2,
        "a second response to request-001",
    ),
    "a response that is not an object": (
        lambda lines: replaced(lines, 3, record({"record": "response", "response": []}), lines[3]),
        lambda lines: 4,
        "response must be an object, got list",
    ),
    "a response without its request id": (
        lambda lines: replaced(
            lines, 3, record({"record": "response", "response": {"id": "r"}}), lines[3]
        ),
        lambda lines: 4,
        "response.requestId must be a string, got NoneType",
    ),
    "a response whose content is not blocks": (
        lambda lines: replaced(
            lines,
            3,
            record(
                {
                    "record": "response",
                    "response": {
                        "id": "r",
                        "requestId": "request-001",
                        "stopReason": "toolCall",
                        "content": [{"type": "picture"}],
                    },
                }
            ),
            lines[3],
        ),
        lambda lines: 4,
        "message.content[0].type: unknown value 'picture'",
    ),
    "the JSON lines of a run (no run record)": (
        lambda lines: b"".join(line for line in lines if b'"record"' not in line),
        lambda lines: 1,
        "not a durable run's journal: its first line is no run entry",
    ),
    "a file without a whole line": (
        lambda lines: b"Dear diary",
        lambda lines: 1,
        "the file holds no whole line, and its bytes are not the beginning of a journal's "
        "first line: not a journal, or another run's",
    ),
    "the torn run record of another run": (
        lambda lines: lines[0][:40].replace(b'"format"', b'"formal"'),
        lambda lines: 1,
        "the file holds no whole line",
    ),
}


class TestRefusedJournals:
    """A journal of another run, or one that is not a journal durable_run() wrote, is
    refused at call time with a JournalError (a ValueError) naming its line and what is
    wrong there; nothing is called and nothing written."""

    def assert_refused(self, journal: Path, line: int, words: str, **options: Any) -> None:
        written = journal.read_bytes()
        process = Process()
        with pytest.raises(ald.JournalError) as refused:
            process.durable_run(journal, **options)
        assert isinstance(refused.value, ValueError)
        assert refused.value.path == str(journal)
        assert refused.value.line == line
        assert str(refused.value).startswith(f"journal {journal}, line {line}: ")
        assert words in str(refused.value)
        assert journal.read_bytes() == written
        assert process.model.call_count == 0
        assert process.effects.executions == []

    @pytest.mark.parametrize(
        ("options", "words"),
        [
            pytest.param(
                {"messages": [al.UserMessage("user-001", "Add 2 and 2.")]},
                "not the same starting messages, at message 0: journal "
                '{"content":"Add 20 and 22.","id":"user-001","role":"user"}, this run '
                '{"content":"Add 2 and 2.","id":"user-001","role":"user"}',
                id="another message",
            ),
            pytest.param(
                {"messages": [user(), al.UserMessage("user-002", "And more.")]},
                'not the same starting messages, at message 1: journal nothing, this run {"c',
                id="one more message",
            ),
            pytest.param(
                {"max_steps": 7},
                "not the same max_steps: journal 8, this run 7",
                id="another max_steps",
            ),
            pytest.param(
                {"request_sequence_start": 1},
                "not the same request_sequence_start: journal 0, this run 1",
                id="another request_sequence_start",
            ),
        ],
    )
    def test_another_runs_journal(
        self, tmp_path: Path, options: Dict[str, Any], words: str
    ) -> None:
        journal = tmp_path / "run.jsonl"
        Process().settle(journal, messages=[user()])
        self.assert_refused(journal, 1, "the journal holds another run: " + words, **options)

    def test_another_runs_tools(self, tmp_path: Path) -> None:
        journal = tmp_path / "run.jsonl"
        Process().settle(journal)
        process = Process()
        tools = al.ToolRegistry(Effects().tools()[:2])
        tools.register(al.Tool("refuse", "Says no.", {"type": "object"}, lambda a, s: "no"))
        with pytest.raises(
            ald.JournalError, match="not the same tools, at tool 2: journal "
        ) as refused:
            ald.durable_run(
                journal, messages=[user()], model=process.model, tools=tools, max_steps=8
            )
        assert "Refuses." in str(refused.value)
        assert "Says no." in str(refused.value)

    def test_a_journal_of_another_format(self, tmp_path: Path) -> None:
        lines = journal_lines(tmp_path)
        journal = tmp_path / "run.jsonl"
        # Format 1 (1.3) had no run id: effect_key() could not key its effects.
        journal.write_bytes(replaced(lines, 0, lines[0].replace(b'"format":2', b'"format":1')))
        self.assert_refused(journal, 1, "a journal of format 1; this durable_run() reads format 2")

    @pytest.mark.parametrize("corruption", list(CORRUPT))
    def test_a_corrupt_journal(self, tmp_path: Path, corruption: str) -> None:
        lines = journal_lines(tmp_path)
        corrupt, number, words = CORRUPT[corruption]
        journal = tmp_path / "run.jsonl"
        journal.write_bytes(corrupt(lines))
        self.assert_refused(journal, number(lines), words)

    def test_recorded_events_that_the_run_does_not_give_again(self, tmp_path: Path) -> None:
        """Caught when the run gets there: here its first event, whose message was edited."""
        lines = journal_lines(tmp_path)
        journal = tmp_path / "run.jsonl"
        edited = lines[1].replace(b"Add 20 and 22.", b"Add 20 and 23.")
        # Up to the first result: the events up to it are given again and compared.
        journal.write_bytes(
            b"".join([lines[0], edited, *lines[2 : line_of(lines, "tool.finished")]])
        )
        written = journal.read_bytes()
        run = Process().durable_run(journal)
        with pytest.raises(ald.JournalError) as refused:
            next(run)
        assert refused.value.line == 2
        assert str(refused.value).startswith(
            f"journal {journal}, line 2: the run gives event 0 again as "
        )
        assert '"Add 20 and 22."' in str(refused.value)
        assert '"Add 20 and 23."' in str(refused.value)
        assert journal.read_bytes() == written


# --- Options ------------------------------------------------------------------------------


class TestOptions:
    """durable_run() checks its options when it is called, as run_agent_loop() does and
    with its errors, and the journal and the starting messages as only it needs."""

    @pytest.mark.parametrize(
        "bad",
        [
            {"max_steps": 0},
            {"max_steps": 65},
            {"max_steps": True},
            {"request_sequence_start": -1},
            {"request_sequence_start": 57},
            {"request_sequence_start": "1"},
            {"model": object()},
            {"tools": [add_tool()]},
            {"signal": object()},
            {"messages": 5},
        ],
        ids=repr,
    )
    def test_bad_options_raise_what_run_agent_loop_raises(
        self, tmp_path: Path, bad: Dict[str, Any]
    ) -> None:
        options: Dict[str, Any] = {
            "messages": [user()],
            "model": RequestKeyedModel(script()),
            "tools": al.ToolRegistry(Effects().tools()),
            "max_steps": 8,
            **bad,
        }
        with pytest.raises((TypeError, ValueError)) as loop_refused:
            al.run_agent_loop(**options)
        with pytest.raises(type(loop_refused.value)) as refused:
            ald.durable_run(tmp_path / "run.jsonl", **options)
        assert str(refused.value) == str(loop_refused.value)
        assert not (tmp_path / "run.jsonl").exists()

    @pytest.mark.parametrize("journal", [5, b"run.jsonl", None], ids=repr)
    def test_a_journal_that_is_not_a_path_is_a_type_error(self, journal: Any) -> None:
        with pytest.raises(TypeError) as refused:
            Process().durable_run(journal)
        assert str(refused.value) == (
            f"journal must be a path (a str or os.PathLike), got {type(journal).__name__}"
        )

    def test_a_journal_that_cannot_be_read_is_the_os_error(self, tmp_path: Path) -> None:
        with pytest.raises(IsADirectoryError):
            Process().durable_run(tmp_path)

    @pytest.mark.parametrize(
        ("messages", "words"),
        [
            ([user(), 5], "messages[1] cannot be written to the journal as JSON ("),
            (
                [user(), al.UserMessage("user-002", object())],  # type: ignore[arg-type]
                "messages[1] cannot be written to the journal as JSON (Object of type object",
            ),
            (
                [al.AssistantMessage("a", [call("add", "c", {"left": float("nan")})])],
                "messages[0] cannot be written to the journal as JSON (Out of range float",
            ),
        ],
        ids=["an int", "an object in a message", "NaN in a call's arguments"],
    )
    def test_starting_messages_that_cannot_be_written_are_a_value_error(
        self, tmp_path: Path, messages: List[Any], words: str
    ) -> None:
        with pytest.raises(ValueError, match="cannot be written to the journal") as refused:
            Process().durable_run(tmp_path / "run.jsonl", messages=messages)
        assert str(refused.value).startswith(words)
        assert str(refused.value).endswith(
            "a durable run records its starting messages, and run_agent_loop() would fail "
            "this run INVALID_TRANSCRIPT"
        )
        assert not (tmp_path / "run.jsonl").exists()

    def test_the_messages_and_the_tools_are_taken_when_it_is_called(self, tmp_path: Path) -> None:
        messages, process = [user()], Process()
        tools = al.ToolRegistry(process.effects.tools())
        run = ald.durable_run(
            tmp_path / "run.jsonl",
            messages=messages,
            model=process.model,
            tools=tools,
            max_steps=8,
        )
        messages.append(al.UserMessage("user-002", "Later."))
        tools.register(al.Tool("later", "Registered later.", {"type": "object"}, lambda a, s: ""))
        _, result = settle(run)
        assert result == reference()[1]
        run_record = whole_lines((tmp_path / "run.jsonl").read_bytes())[0]
        assert run_record["messages"] == [user().to_dict()]
        assert [tool["name"] for tool in run_record["tools"]] == ["add", "effect", "refuse"]

    @pytest.mark.parametrize(
        ("count", "status"),
        [
            pytest.param(al.MAX_INITIAL_MESSAGES, "completed", id="at-limit"),
            pytest.param(al.MAX_INITIAL_MESSAGES + 1, "failed", id="over-limit"),
        ],
    )
    def test_the_starting_messages_up_to_the_limit_are_recorded_and_run(
        self, tmp_path: Path, count: int, status: str
    ) -> None:
        messages = [al.UserMessage(f"user-{n}", "Hi.") for n in range(count - 1)] + [user()]
        journal = tmp_path / "run.jsonl"
        events, result = Process().settle(journal, messages=messages)
        assert result.status == status
        assert len(whole_lines(journal.read_bytes())[0]["messages"]) == count
        assert Process().given_again(journal, messages=messages) == (events, result)

    def test_it_reads_as_many_messages_as_run_agent_loop(self, tmp_path: Path) -> None:
        """One past the cap, from an iterator that never ends: INVALID_TRANSCRIPT."""

        def endless() -> Iterator[al.Message]:
            return (al.UserMessage(f"user-{n}", "Hi.") for n in itertools.count())

        events, result = settle(Process().durable_run(tmp_path / "run.jsonl", messages=endless()))
        expected, expected_result = settle(
            al.run_agent_loop(
                messages=endless(),
                model=RequestKeyedModel({}),
                tools=al.ToolRegistry(),
                max_steps=1,
            )
        )
        assert (dicts_of(events), result) == (dicts_of(expected), expected_result)
        assert result.error is not None
        assert result.error.code == "INVALID_TRANSCRIPT"
        run_record = whole_lines((tmp_path / "run.jsonl").read_bytes())[0]
        assert len(run_record["messages"]) == al.MAX_INITIAL_MESSAGES + 1

    def test_a_model_whose_stream_is_not_a_generator_fails_as_in_run_agent_loop(
        self, tmp_path: Path
    ) -> None:
        class ListModel:
            def stream(self, request: al.ModelRequest, signal: al.Signal) -> Any:
                return [al.TextDelta(request.id, "Hi.")]

        run = ald.durable_run(
            tmp_path / "run.jsonl",
            messages=[user()],
            model=ListModel(),
            tools=al.ToolRegistry(),
            max_steps=1,
        )
        _, result = settle(run)
        _, expected = settle(
            al.run_agent_loop(
                messages=[user()], model=ListModel(), tools=al.ToolRegistry(), max_steps=1
            )
        )
        assert result == expected
        assert result.error is not None
        assert result.error.message == "model.stream() must return a generator, got list"


# --- Every option, decisions that come later, effect keys --------------------------------


class Asker:
    """A before_tool_call that answers from ``answers`` (call id -> None, a refusal or
    LATER; None for a call it does not name) and notes each call it is asked about."""

    def __init__(self, answers: Optional[Dict[str, object]] = None) -> None:
        self.answers = dict(answers or {})
        self.asked: List[str] = []

    def __call__(self, call: al.ToolCall, signal: Any) -> object:
        self.asked.append(call.id)
        return self.answers.get(call.id)


def untimed(events: List[al.Event]) -> List[Dict[str, Any]]:
    return dicts_of(events)


OPTIONS: Dict[str, Dict[str, Any]] = {
    "tools at once": {"tool_concurrency": 3},
    "consent": {"before_tool_call": "call-3"},
    "tools at once and consent": {"tool_concurrency": 3, "before_tool_call": "call-4"},
}
"""Options a durable run takes as run_agent_loop() does; before_tool_call names the call
its hook refuses."""


def with_hook(options: Dict[str, Any]) -> Dict[str, Any]:
    """The options, with a hook that refuses the call they name."""
    refused = options.get("before_tool_call")
    if refused is None:
        return dict(options)
    return {**options, "before_tool_call": Asker({refused: "Not this one."})}


class TestEveryOptionOfRunAgentLoop:
    """A durable run takes tool_concurrency and before_tool_call, gives the events and the
    result of run_agent_loop() with them, and goes on from any point of its journal to the
    same events, asking before_tool_call once per call across processes."""

    @pytest.mark.parametrize("options", list(OPTIONS.values()), ids=list(OPTIONS))
    def test_it_gives_what_run_agent_loop_gives_from_any_point(
        self, tmp_path: Path, options: Dict[str, Any]
    ) -> None:
        model = RequestKeyedModel(script())
        expected, expected_result = al.settle_run(
            al.run_agent_loop(
                messages=[START],
                model=model,
                tools=al.ToolRegistry(Effects().tools()),
                max_steps=8,
                **with_hook(options),
            )
        )
        whole = tmp_path / "whole.jsonl"
        events, result = al.settle_run(Process().durable_run(whole, **with_hook(options)))
        assert untimed(events) == untimed(expected)
        assert result == expected_result
        data = whole.read_bytes()
        for cut in cuts(data):
            journal = tmp_path / f"cut-{cut}.jsonl"
            journal.write_bytes(data[:cut])
            results, _, _ = recorded_in(data[:cut])
            decided = {line["callId"] for line in whole_lines(data[:cut]) if "callId" in line}
            process, hook = Process(), with_hook(options)
            events, result = al.settle_run(process.durable_run(journal, **hook))
            assert untimed(events) == untimed(expected), cut
            assert result == expected_result, cut
            assert not results.intersection(process.effects.executions), cut
            asker = hook.get("before_tool_call")
            if isinstance(asker, Asker):  # an answer written is never asked again
                assert not decided.intersection(asker.asked), cut
                assert decided.union(asker.asked) >= set(EXECUTED_CALLS), cut

    def test_each_answer_is_written_before_its_call_starts(self, tmp_path: Path) -> None:
        journal = tmp_path / "run.jsonl"
        Process().settle(journal, before_tool_call=Asker({"call-5": "No."}))
        lines = whole_lines(journal.read_bytes())
        kinds = [kind_of(line) for line in lines]
        decisions = [line for line in lines if kind_of(line) == "decision"]
        assert [(line["callId"], line["refusal"]) for line in decisions] == [
            ("call-1", None),
            ("call-2", None),
            ("call-3", None),
            ("call-4", None),
            ("call-5", "No."),
        ]
        for line in decisions:
            index = lines.index(line)
            assert kinds[index + 1] == "tool.started"
            assert lines[index + 1]["payload"]["toolCall"]["id"] == line["callId"]
        # The response before the first answer about its calls.
        assert kinds[kinds.index("decision") - 1] == "response"

    def test_an_answer_that_is_neither_none_nor_a_str_fails_the_run_unwritten(
        self, tmp_path: Path
    ) -> None:
        journal = tmp_path / "run.jsonl"
        _, result = al.settle_run(
            Process().durable_run(journal, before_tool_call=Asker({"call-1": 42}))
        )
        assert result.status == "failed"
        assert result.error is not None
        assert result.error.code == "TOOL_PHASE_ERROR"
        assert "decision" not in [kind_of(line) for line in whole_lines(journal.read_bytes())]

    def test_the_options_are_part_of_the_run(self, tmp_path: Path) -> None:
        journal = tmp_path / "run.jsonl"
        al.settle_run(Process().durable_run(journal, tool_concurrency=2))
        with pytest.raises(ald.JournalError, match="not the same tool_concurrency: journal 2"):
            Process().durable_run(journal)

    def test_a_tool_waits_on_the_runs_signal(self, tmp_path: Path) -> None:
        """The tools get the run's signal, the consumer's: set, it is set for them."""
        seen: List[bool] = []

        def waits(arguments: Dict[str, Any], signal: al.Signal) -> object:
            seen.append(signal.wait(0))
            consumer.set()
            seen.append(signal.wait(0))
            return "waited"

        consumer = threading.Event()
        model = RequestKeyedModel(
            {"request-001": al.scripted_response("response-001", [call("w", "c", {})], "toolCall")}
        )
        tools = al.ToolRegistry([al.Tool("w", "Waits.", {"type": "object"}, waits)])
        run = ald.durable_run(
            tmp_path / "run.jsonl",
            messages=[START],
            model=model,
            tools=tools,
            max_steps=2,
            signal=consumer,
        )
        _, result = al.settle_run(run)
        assert seen == [False, True]
        assert result.status == "cancelled"

    def test_later_is_one_value_with_its_name(self) -> None:
        assert repr(ald.LATER) == "agent_loop_durable.LATER"
        assert ald.LATER is ald.LATER.__class__("LATER")

    def test_the_1_3_import_still_works(self) -> None:
        from agent_loop_replay import JournalError, durable_run

        assert (durable_run, JournalError) == (ald.durable_run, ald.JournalError)
        with pytest.raises(AttributeError, match="has no attribute 'journal_run'"):
            alr.journal_run  # noqa: B018


class TestADecisionThatComesLater:
    """before_tool_call may answer LATER: the run stops cancelled with the call open, the
    journal awaits a decision (awaiting_decision), and called again the run asks again
    for that call, waits again on LATER, and goes on once it is answered."""

    @pytest.mark.parametrize("concurrency", [1, 3], ids=["one at a time", "at once"])
    def test_the_run_stops_and_goes_on_once_answered(
        self, tmp_path: Path, concurrency: int
    ) -> None:
        journal = tmp_path / "run.jsonl"
        expected, expected_result = al.settle_run(
            Process().durable_run(tmp_path / "approved.jsonl", tool_concurrency=concurrency)
        )
        assert ald.awaiting_decision(journal) == ()
        first = Process()
        asker = Asker({"call-4": ald.LATER})
        events, result = al.settle_run(
            first.durable_run(journal, tool_concurrency=concurrency, before_tool_call=asker)
        )
        assert result.status == "cancelled"
        # call-3 ran one at a time; at once, its group waits with it.
        assert first.effects.executions == ["call-1", "call-2", *(["call-3"] * (concurrency == 1))]
        assert asker.asked == ["call-1", "call-2", "call-3", "call-4"]
        opened = ["call-3", "call-4", "call-5"][concurrency == 1 :]
        assert [call.id for call in al.open_tool_calls(result.messages)] == opened
        (awaited,) = ald.awaiting_decision(journal)
        assert awaited.id == "call-4"
        assert awaited == script()["request-002"].content[2]
        # A pause is not a cancel: the result and its run.finished say what awaits.
        assert result.awaiting == events[-1].payload["result"].awaiting == (awaited,)
        line = io.StringIO()
        al.print_event(events[-1], line)
        assert "cancelled" in line.getvalue()
        assert "awaiting a decision: call-4" in line.getvalue()
        # Asked again: LATER again leaves the run as it was.
        again = Asker({"call-4": ald.LATER})
        events_again, result_again = al.settle_run(
            Process().durable_run(journal, tool_concurrency=concurrency, before_tool_call=again)
        )
        assert again.asked == ["call-4"]
        assert untimed(events_again) == untimed(events)
        assert result_again == result
        assert ald.awaiting_decision(journal) == (awaited,)
        # Answered: the run goes on in the same journal, to the events of a run approved
        # all along; nothing ran twice, nothing answered is asked again.
        last, answer = Process(), Asker()
        events, result = al.settle_run(
            last.durable_run(journal, tool_concurrency=concurrency, before_tool_call=answer)
        )
        assert answer.asked == ["call-4", "call-5"]
        assert untimed(events) == untimed(expected)
        assert (result, result.awaiting) == (expected_result, ())
        assert sorted(first.effects.executions + last.effects.executions) == sorted(EXECUTED_CALLS)
        assert ald.awaiting_decision(journal) == ()
        assert ald.live_from(journal) == len(events)

    def test_a_run_that_awaits_a_decision_needs_a_hook_to_ask(self, tmp_path: Path) -> None:
        """Without before_tool_call, the awaiting call would run unasked: a ValueError."""
        journal = tmp_path / "run.jsonl"
        al.settle_run(
            Process().durable_run(journal, before_tool_call=Asker({"call-1": ald.LATER}))
        )
        written = journal.read_bytes()
        with pytest.raises(ValueError, match="awaits a decision on tool call 'call-1': call"):
            Process().durable_run(journal)
        assert journal.read_bytes() == written

    def test_a_recorded_refusal_is_given_again_without_a_hook(self, tmp_path: Path) -> None:
        """The process died after writing call-5's refusal, before its tool.started."""
        whole = tmp_path / "whole.jsonl"
        asker = Asker({"call-5": "No."})
        expected, expected_result = al.settle_run(
            Process().durable_run(whole, before_tool_call=asker)
        )
        lines = whole.read_bytes().splitlines(keepends=True)
        refusal = next(i for i, line in enumerate(lines) if b'"refusal":"No."' in line)
        journal = tmp_path / "run.jsonl"
        journal.write_bytes(b"".join(lines[: refusal + 1]))
        process = Process()
        events, result = al.settle_run(process.durable_run(journal))
        assert untimed(events) == untimed(expected)
        assert result == expected_result
        assert "call-5" not in process.effects.executions

    def test_a_refusal_later_is_the_calls_error_result(self, tmp_path: Path) -> None:
        journal = tmp_path / "run.jsonl"
        al.settle_run(
            Process().durable_run(journal, before_tool_call=Asker({"call-1": ald.LATER}))
        )
        process = Process()
        _, result = al.settle_run(
            process.durable_run(journal, before_tool_call=Asker({"call-1": "Not today."}))
        )
        assert result.status == "completed"
        assert "call-1" not in process.effects.executions
        refusal = next(
            message
            for message in result.messages
            if isinstance(message, al.ToolResultMessage) and message.tool_call_id == "call-1"
        )
        assert (refusal.content, refusal.is_error) == ("Not today.", True)

    def test_a_run_that_awaits_takes_no_line_but_a_resume_record_after_its_end(
        self, tmp_path: Path
    ) -> None:
        journal = tmp_path / "run.jsonl"
        al.settle_run(
            Process().durable_run(journal, before_tool_call=Asker({"call-1": ald.LATER}))
        )
        data = journal.read_bytes()
        assert kind_of(whole_lines(data)[-2]) == "awaiting"
        journal.write_bytes(data + record({"record": "decision", "callId": "x", "refusal": None}))
        with pytest.raises(ald.JournalError, match="where only a resume entry comes"):
            ald.awaiting_decision(journal)

    @pytest.mark.parametrize(
        ("line", "words"),
        [
            ({"record": "decision", "callId": 1, "refusal": None}, "a decision entry holds"),
            ({"record": "decision", "callId": "call-1", "refusal": 2}, "a decision entry holds"),
            ({"record": "awaiting", "toolCall": {"type": "text", "text": "Hi"}}, "a tool call"),
            ({"record": "awaiting", "toolCall": 3}, "must be an object"),
        ],
        ids=["call id", "refusal", "no call", "not an object"],
    )
    def test_a_bad_decision_or_awaiting_record_is_refused(
        self, tmp_path: Path, line: Dict[str, Any], words: str
    ) -> None:
        journal = tmp_path / "run.jsonl"
        journal.write_bytes(journal_lines(tmp_path)[0] + record(line))
        with pytest.raises(ald.JournalError, match="line 2: .*" + words):
            ald.awaiting_decision(journal)


def reporting(body: Callable[[], object]) -> Generator[str, None, object]:
    """A generator tool's body: a progress value, then what ``body`` returns."""
    yield "working"
    return body()


class TestEffectKeys:
    """effect_key(): inside a tool of a durable run, the run's id and the call's id, the same
    in every process that goes on with the journal; another run's differ; None elsewhere."""

    def keys(
        self, journal: Path, generator: bool = False, **options: Any
    ) -> Dict[str, Optional[str]]:
        keys: Dict[str, Optional[str]] = {}

        def noted() -> object:
            call = al.current_tool_call()
            assert call is not None
            keys[call.id] = ald.effect_key()
            return "noted"

        def note(arguments: Dict[str, Any], signal: al.Signal) -> object:
            return reporting(noted) if generator else noted()

        tools = al.ToolRegistry([al.Tool("effect", "Notes.", {"type": "object"}, note)])
        model = RequestKeyedModel(
            {
                "request-001": al.scripted_response(
                    "response-001", [call("effect", "call_0", {})], "toolCall"
                ),
                "request-002": al.scripted_response("response-002", [text("Done.")], "stop"),
            }
        )
        run = ald.durable_run(
            journal, messages=[START], model=model, tools=tools, max_steps=4, **options
        )
        al.settle_run(run)
        return keys

    @pytest.mark.parametrize("generator", [False, True], ids=["a function", "a generator"])
    def test_the_same_call_has_the_same_key_in_every_process(
        self, tmp_path: Path, generator: bool
    ) -> None:
        """A generator tool's body, run on each of the loop's next(), has its key too."""
        journal = tmp_path / "run.jsonl"
        first = self.keys(journal, generator)
        run_id = whole_lines(journal.read_bytes())[0]["runId"]
        assert first == {"call_0": f"{run_id}:call_0"}
        # Cut after the call started: the call runs again, with the same key.
        lines = journal.read_bytes().splitlines(keepends=True)
        started = next(i for i, line in enumerate(lines) if b"tool.started" in line)
        journal.write_bytes(b"".join(lines[: started + 1]))
        assert self.keys(journal, generator) == first

    def test_another_run_with_the_same_call_id_has_another_key(self, tmp_path: Path) -> None:
        one = self.keys(tmp_path / "one.jsonl", tool_concurrency=2)
        other = self.keys(tmp_path / "other.jsonl", tool_concurrency=2)
        assert one.keys() == other.keys() == {"call_0"}
        assert one["call_0"] != other["call_0"]

    def test_there_is_no_key_outside_a_durable_runs_tool(self) -> None:
        seen: List[Optional[str]] = []

        def note(arguments: Dict[str, Any], signal: al.Signal) -> object:
            seen.append(ald.effect_key())
            return "noted"

        tool = al.Tool("effect", "Notes.", {"type": "object"}, note)
        registry = al.ToolRegistry([tool])
        al.execute_tool_call(registry, call("effect", "call_0", {}), threading.Event())
        assert seen == [None]
        assert ald.effect_key() is None


class TestLiveFrom:
    """live_from(journal): the sequence from which durable_run() on the journal gives its
    events live, told before the first of them."""

    def test_the_events_before_it_are_given_again_and_the_others_written(
        self, tmp_path: Path
    ) -> None:
        whole = tmp_path / "whole.jsonl"
        assert ald.live_from(whole) == 0
        expected, _ = Process().settle(whole)
        assert ald.live_from(whole) == len(expected)
        data = whole.read_bytes()
        for cut in cuts(data):
            journal = tmp_path / f"cut-{cut}.jsonl"
            journal.write_bytes(data[:cut])
            live = ald.live_from(journal)
            kept = len(journal.read_bytes())
            if live == len(expected) and recorded_in(data[:cut])[2]:
                continue  # a finished run: nothing is live
            Process().settle(journal)
            added = whole_lines(journal.read_bytes()[data.rfind(b"\n", 0, cut) + 1 :])
            written = [line["sequence"] for line in added if "record" not in line]
            assert written[0] == live, cut
            assert kept <= cut


# --- Killed processes ----------------------------------------------------------------------

CHILD = r'''
"""The durable run that TestKilledProcesses kills: python child.py JOURNAL FOLDER POINT MODE.

When the run gets to POINT, it prints POINT and waits to be killed. POINT is "event N"
(the consumer holds event N), "before-effect ID" or "after-effect ID" (inside the tool,
on either side of its effect), "asked ID" (before_tool_call asked about the call, before
it answers), "torn TEXT" (the journal write that holds TEXT stops halfway through that
line), or "none": the run goes to its end, and its events and result are written into
FOLDER. MODE "one at a time": three notes over two steps, one call at a time; "at once":
a batch of three notes, run at once, each asked about first (and answered from the file
"answers" of FOLDER: "ID yes" or "ID no", LATER for a call it does not name).
"""
import json
import os
import sys
import threading
import time

import agent_loop as al
import agent_loop_replay as alr
import agent_loop_durable as ald

JOURNAL, FOLDER, POINT, MODE = sys.argv[1:5]


def stop_here(where):
    if where == POINT:
        print(where, flush=True)
        threading.Event().wait()  # until the test kills this process


def log(name, line):
    with open(os.path.join(FOLDER, name), "a", encoding="utf-8") as file:
        file.write(line + "\n")


def note(text, call_id):
    return al.ToolCall(call_id, "note", {"text": text})


SCRIPT = {
    "request-001": al.scripted_response(
        "response-001",
        [al.TextBlock("Noting two things."), note("one", "call-1"), note("two", "call-2")],
        "toolCall",
        chunks=[
            al.TextBlock("Noting "),
            al.TextBlock("two things."),
            note("one", "call-1"),
            note("two", "call-2"),
        ],
    ),
    "request-002": al.scripted_response("response-002", [note("three", "call-3")], "toolCall"),
    "request-003": al.scripted_response(
        "response-003",
        [al.TextBlock("Noted.")],
        "stop",
        chunks=[al.TextBlock("No"), al.TextBlock("ted.")],
    ),
}


if MODE == "at once":
    SCRIPT = {
        "request-001": al.scripted_response(
            "response-001",
            [note("one", "call-1"), note("two", "call-2"), note("three", "call-3")],
            "toolCall",
            chunks=[note("one", "call-1"), note("two", "call-2"), note("three", "call-3")],
        ),
        "request-002": al.scripted_response(
            "response-002",
            [al.TextBlock("Noted.")],
            "stop",
            chunks=[al.TextBlock("No"), al.TextBlock("ted.")],
        ),
    }


class ByRequest:
    """Deterministic as a resumed run needs it: the answer depends on the request alone."""

    def stream(self, request, signal):
        log("requests", request.id)
        return al.ScriptedModel([SCRIPT[request.id]]).stream(request, signal)


def ask(call, signal):
    """Answers from the file of answers; LATER for a call it does not name."""
    log("asked", call.id)
    stop_here("asked " + call.id)
    path = os.path.join(FOLDER, "answers")
    answers = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as file:
            answers = dict(line.split() for line in file if line.strip())
    answer = answers.get(call.id)
    if answer is None:
        return ald.LATER
    return None if answer == "yes" else "Refused."


def execute(arguments, signal):
    """Notes its text once per call: the effect is keyed by effect_key()."""
    call = al.current_tool_call()
    log("executions", call.id)
    stop_here("before-effect " + call.id)
    key = ald.effect_key()
    path = os.path.join(FOLDER, "effects")
    with open(path, "a+", encoding="utf-8") as effects:
        effects.seek(0)
        if key not in effects.read().split():
            effects.write(key + "\n")
    stop_here("after-effect " + call.id)
    return "noted " + arguments["text"]


if POINT.startswith("torn "):
    marker = POINT[len("torn "):].encode("ascii")
    write = os.write

    def torn_write(descriptor, data):
        data = bytes(data)
        at = data.find(marker)
        if at < 0:
            return write(descriptor, data)
        begin = data.rfind(b"\n", 0, at) + 1
        end = data.index(b"\n", at)
        write(descriptor, data[: (begin + end) // 2])
        stop_here(POINT)

    os.write = torn_write

schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
run = ald.durable_run(
    JOURNAL,
    messages=[al.UserMessage("user-001", "Note three things.")],
    model=ByRequest(),
    tools=al.ToolRegistry([al.Tool("note", "Notes a text.", schema, execute)]),
    max_steps=4,
    **({"tool_concurrency": 3, "before_tool_call": ask} if MODE == "at once" else {}),
)
events, result = al.settle_run(run, on_event=lambda event: stop_here("event %d" % event.sequence))
with open(os.path.join(FOLDER, "events.jsonl"), "w", encoding="utf-8") as file:
    alr.dump_events(events, file)
with open(os.path.join(FOLDER, "result.json"), "w", encoding="utf-8") as file:
    json.dump(result.to_dict(), file)
'''

CHILD_EVENTS = 15
"""The child's events: message.accepted, 4 chunks, 2 calls (4 events), 1 chunk, 1 call,
2 chunks, run.finished."""


@dataclasses.dataclass
class Child:
    """The child's folder (its journal, its logs and what its last run wrote)."""

    folder: Path
    mode: str = "one at a time"
    answers: str = ""  # the file of answers, for mode "at once"

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "child.py").write_text(CHILD, encoding="utf-8")
        self.answer(self.answers)

    def answer(self, answers: str) -> None:
        """Writes the file of answers (a person decides)."""
        (self.folder / "answers").write_text(answers, encoding="utf-8")

    def effects(self) -> List[str]:
        """The call ids of the effects applied, each keyed by effect_key(): the same run id
        in every process."""
        keys = self.log("effects")
        assert len({key.split(":")[0] for key in keys}) == 1
        return sorted(key.split(":")[1] for key in keys)

    @property
    def journal(self) -> Path:
        return self.folder / "run.jsonl"

    def log(self, name: str) -> List[str]:
        path = self.folder / name
        return path.read_text(encoding="utf-8").split() if path.exists() else []

    def run(self, point: str = "none") -> None:
        """Runs the child; unless ``point`` is "none", kills it once it says it is there."""
        environment = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.abspath(al.__file__)))
        child = subprocess.Popen(
            [sys.executable, "child.py", str(self.journal), str(self.folder), point, self.mode],
            cwd=self.folder,
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            if point == "none":
                _, errors = child.communicate()
                assert child.returncode == 0, errors
                return
            assert child.stdout is not None
            said = child.stdout.readline()
            assert said == point + "\n", child.communicate()[1]
            child.kill()
            child.wait()
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            for pipe in (child.stdout, child.stderr):
                assert pipe is not None
                pipe.close()

    def outcome(self) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
        """The events and result its last run wrote, as JSON."""
        with open(self.folder / "events.jsonl", encoding="utf-8") as file:
            events = dicts_of(alr.load_events(file))
        return events, json.loads((self.folder / "result.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def uninterrupted(
    tmp_path_factory: pytest.TempPathFactory,
) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    """The events and result of the child's run when nothing stops it."""
    child = Child(tmp_path_factory.mktemp("uninterrupted"))
    child.run()
    events, result = child.outcome()
    assert len(events) == CHILD_EVENTS
    assert result["status"] == "completed"
    assert child.log("executions") == ["call-1", "call-2", "call-3"]
    return events, result


def kill_points() -> List[str]:
    return [
        *(f"event {sequence}" for sequence in range(CHILD_EVENTS)),
        "before-effect call-1",
        "after-effect call-1",
        "after-effect call-3",
        'torn {"record":"run"',
        'torn {"sequence":0,',
        'torn {"sequence":2,',
        'torn {"record":"response"',
        'torn {"sequence":5,',
        'torn {"sequence":6,',
        'torn {"sequence":14,',
    ]


class TestKilledProcesses:
    """A child process running a durable run is killed at every kind of point: mid-stream,
    between a tool's start and finish (before and after its effect), after a result, and in
    the middle of a journal write (a torn line), once and several times in a row. Run
    again, it ends with the uninterrupted run's events and result, nothing recorded is
    done again, and each effect (keyed by its call's id) is applied once."""

    def kill_and_go_on(self, child: Child, points: List[str]) -> None:
        for point in points:
            child.run(point)
            data = child.journal.read_bytes() if child.journal.exists() else b""
            results, responses, finished = recorded_in(data)
            answered = {line["callId"] for line in whole_lines(data) if "callId" in line}
            executions, requests = len(child.log("executions")), len(child.log("requests"))
            asked = len(child.log("asked"))
            child.run()  # goes on, or gives the finished run again
            # What the journal recorded when the child died is not done again.
            ran_again = child.log("executions")[executions:]
            assert not results.intersection(ran_again), point
            requested_again = child.log("requests")[requests:]
            assert not responses.intersection(requested_again), point
            assert not answered.intersection(child.log("asked")[asked:]), point
            assert not finished or (ran_again, requested_again) == ([], []), point

    @pytest.mark.parametrize("point", kill_points())
    def test_killed_once(
        self,
        tmp_path: Path,
        point: str,
        uninterrupted: Tuple[List[Dict[str, Any]], Dict[str, Any]],
    ) -> None:
        child = Child(tmp_path)
        self.kill_and_go_on(child, [point])
        assert child.outcome() == uninterrupted
        assert child.effects() == ["call-1", "call-2", "call-3"]

    def test_killed_several_times_in_a_row(
        self, tmp_path: Path, uninterrupted: Tuple[List[Dict[str, Any]], Dict[str, Any]]
    ) -> None:
        child = Child(tmp_path)
        points = [
            "event 2",
            "after-effect call-1",
            'torn {"sequence":8,',
            "event 4",
            "before-effect call-3",
            "event 12",
            'torn {"sequence":14,',
        ]
        for point in points:
            child.run(point)
        child.run()
        assert child.outcome() == uninterrupted
        assert child.effects() == ["call-1", "call-2", "call-3"]
        # Run again only: call-1 and call-3, killed inside the tool; and call-2, whose
        # result line was torn.
        assert sorted(child.log("executions")) == [
            "call-1",
            "call-1",
            "call-2",
            "call-2",
            "call-3",
            "call-3",
        ]
        # Each process that went on wrote a resume record first: all but the first, and
        # the one killed at event 4, while it gave recorded events again.
        records = [kind_of(line) for line in whole_lines(child.journal.read_bytes())]
        assert records.count("resume") == len(points) - 1


AT_ONCE_EVENTS = 13
"""The events of the child's batch: message.accepted, 3 chunks, 3 tool.started, 3
tool.finished, 2 chunks, run.finished."""

APPROVED = "call-1 yes\ncall-2 yes\ncall-3 yes\n"


@pytest.fixture(scope="module")
def uninterrupted_at_once(
    tmp_path_factory: pytest.TempPathFactory,
) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    """The events and result of the child's batch when nothing stops it, every call
    approved."""
    child = Child(tmp_path_factory.mktemp("at-once"), "at once", APPROVED)
    child.run()
    events, result = child.outcome()
    assert len(events) == AT_ONCE_EVENTS
    assert result["status"] == "completed"
    assert sorted(child.log("executions")) == ["call-1", "call-2", "call-3"]
    assert child.log("asked") == ["call-1", "call-2", "call-3"]
    return events, result


def kill_points_at_once() -> List[str]:
    return [
        *(f"event {sequence}" for sequence in range(AT_ONCE_EVENTS)),
        *(f"{where} call-{n}" for n in (1, 2, 3) for where in ("asked", "before-effect")),
        *(f"after-effect call-{n}" for n in (1, 2, 3)),
        'torn {"record":"decision","callId":"call-2"',
        'torn {"sequence":5,',
        'torn {"sequence":8,',
    ]


class TestKilledProcessesWithToolsAtOnce:
    """The same, for a batch of three calls run at once, each asked about first: killed at
    every event, while asked about each call, and before and after each tool's effect,
    the run goes on to the uninterrupted run's events and result; a call that started
    without a recorded result runs again, one with a result never does, an answer written
    is never asked again, and each effect (keyed by effect_key()) is applied once."""

    @pytest.mark.parametrize("point", kill_points_at_once())
    def test_killed_once(
        self,
        tmp_path: Path,
        point: str,
        uninterrupted_at_once: Tuple[List[Dict[str, Any]], Dict[str, Any]],
    ) -> None:
        child = Child(tmp_path, "at once", APPROVED)
        TestKilledProcesses().kill_and_go_on(child, [point])
        assert child.outcome() == uninterrupted_at_once
        assert child.effects() == ["call-1", "call-2", "call-3"]

    def test_a_decision_that_comes_later_across_processes_killed_on_the_way(
        self,
        tmp_path: Path,
        uninterrupted_at_once: Tuple[List[Dict[str, Any]], Dict[str, Any]],
    ) -> None:
        """call-2 awaits a decision, twice; answered, the process dies between two answers,
        then after call-2's effect and before its result is written; the run ends as if
        approved all along, with nothing run twice."""
        child = Child(tmp_path, "at once", "call-1 yes\n")
        child.run()
        events, result = child.outcome()
        assert result["status"] == "cancelled"
        assert [call.id for call in ald.awaiting_decision(child.journal)] == ["call-2"]
        assert child.log("executions") == []  # its group waits with it
        child.run()  # asked again, nobody can answer yet
        assert child.outcome() == (events, result)
        child.answer(APPROVED)
        child.run("asked call-3")  # call-2's answer is written, call-3's is not
        assert ald.awaiting_decision(child.journal) == ()
        child.run("after-effect call-2")
        child.run()
        assert child.outcome() == uninterrupted_at_once
        assert child.effects() == ["call-1", "call-2", "call-3"]
        assert child.log("asked") == ["call-1", "call-2", "call-2", "call-2", "call-3", "call-3"]


# --- Progress and tools that end the run -----------------------------------------------


ENDINGS: Dict[str, Tuple[int, Plan, bool]] = {
    # (tool_concurrency, each call's part (loop_testing.Choreography), ends_run)
    "calls at once with progress": (
        3,
        {
            "a": [("progress:b:b1", "a1"), ("", "a done")],
            "b": [("started:c", "b1"), ("finished:a", "b2"), ("", "b done")],
            "c": [("", "c done")],
        },
        False,
    ),
    "a tool that ends the run": (1, {"a": [("", "a1"), ("", {"answer": 42})]}, True),
}


def choreographed(journal: Path, name: str) -> Tuple[List[al.Event], al.RunResult, Choreography]:
    """A durable run of an ENDINGS row: one response calls each part, then a text answer."""
    concurrency, plan, ends_run = ENDINGS[name]
    choreography = Choreography(plan)
    model = RequestKeyedModel(
        {
            "request-001": al.scripted_response(
                "response-001", [call("work", call_id, {}) for call_id in plan], "toolCall"
            ),
            "request-002": al.scripted_response("response-002", [text("Done.")], "stop"),
        }
    )
    tools = al.ToolRegistry([choreography.tool(ends_run=ends_run)])
    run = ald.durable_run(
        journal,
        messages=[START],
        model=model,
        tools=tools,
        max_steps=4,
        tool_concurrency=concurrency,
    )
    events, result = settle(run, cancel_at=choreography.seen, start=[START])
    return events, result, choreography


def each_calls_events(events: List[al.Event]) -> Dict[str, List[str]]:
    """Each call's tool events, in order."""
    calls: Dict[str, List[str]] = {}
    for event in events:
        if event.type.startswith("tool."):
            calls.setdefault(event_key(event).split(":")[1], []).append(event_key(event))
    return calls


class TestProgressAndEndingTools:
    """A journal keeps every tool.progress; a recorded call gives its progress again before
    its result, calls at once in the journal's order; a group of calls at once with a call
    that has no result goes on live from its tool.started events (that call runs again,
    reporting its progress anew); a run that ended on an ends_run tool ends so again."""

    @pytest.mark.parametrize("name", list(ENDINGS))
    def test_from_any_point_where_its_journal_stops(self, tmp_path: Path, name: str) -> None:
        whole = tmp_path / "whole.jsonl"
        expected, expected_result, _ = choreographed(whole, name)
        data = whole.read_bytes()
        assert any(kind_of(line) == "tool.progress" for line in whole_lines(data))
        group_ends = data.index(b"\n", data.rindex(b'"type":"tool.finished"')) + 1
        journal = tmp_path / "run.jsonl"
        for cut in cuts(data):
            journal.write_bytes(data[:cut])
            given_again = ald.live_from(journal)
            events, result, choreography = choreographed(journal, name)
            assert result == expected_result, cut
            assert each_calls_events(events) == each_calls_events(expected), cut
            # A call runs again only when the journal holds no result of it.
            recorded, _, _ = recorded_in(data[:cut])
            assert set(choreography.ran) == set(ENDINGS[name][1]) - recorded, cut
            assert dicts_of(events[:given_again]) == dicts_of(expected[:given_again]), cut
            if cut >= group_ends:  # the group's events, all given again in their order
                assert dicts_of(events) == dicts_of(expected), cut
        assert expected_result.output == ({"answer": 42} if name.startswith("a tool") else None)

    def test_a_group_with_a_call_to_run_again_goes_on_from_its_tool_started(
        self, tmp_path: Path
    ) -> None:
        """Cut after call a's result: b (and c) run again, so the journal goes on from the
        group's tool.started events; a's progress and result are given again live."""
        whole = tmp_path / "whole.jsonl"
        expected, _, _ = choreographed(whole, "calls at once with progress")
        journal = tmp_path / "run.jsonl"
        data = whole.read_bytes()
        journal.write_bytes(data[: data.index(b"\n", data.index(b'"type":"tool.finished"')) + 1])
        started = [e.sequence for e in expected if e.type == "tool.started"]
        assert ald.live_from(journal) == started[-1] + 1
        _, _, choreography = choreographed(journal, "calls at once with progress")
        assert sorted(choreography.ran) == ["b", "c"]
        read = ald.read_journal(journal)
        assert read.resumes == (started[-1] + 1,)
        assert each_calls_events(list(read.events)) == each_calls_events(expected)
