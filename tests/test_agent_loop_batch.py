"""Tests for agent_loop_batch.run_many: many runs on a few threads, with progress.

The runs are run_agent_loop() with the shipped ScriptedModel, so nothing here needs a
server. No assertion is about time except the stated bound on stopping (STOP_BOUND, far
above agent_loop.WATCH_SECONDS plus a run's reaction); a thread that waits for another
waits at most WAIT seconds, so that a broken batch fails a test instead of hanging it.

Contents
    TestOptions: each argument checked at call time, boundaries on both sides
    TestResults: in the order of items, up to `concurrency` at once, failures per item
    TestStopping: the batch's signal, Ctrl-C, a run's KeyboardInterrupt, a raising callback
    TestProgress: the callable, the plain lines, the terminal line (in a real pty)
"""

from __future__ import annotations

import _thread
import fcntl
import io
import os
import pty
import select
import signal as os_signal
import struct
import sys
import termios
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

import agent_loop as al
import agent_loop_batch as batch

WAIT: float = 10.0
STOP_BOUND: float = 5.0  # seconds: WATCH_SECONDS (0.05) plus a tool that returns on its signal


def answer_run(item: str, signal: threading.Event) -> Iterator[al.Event]:
    """A run whose model answers `item` as its final text."""
    model = al.ScriptedModel([al.scripted_response("response-001", [al.TextBlock(item)], "stop")])
    return al.run_agent_loop(
        messages=[al.UserMessage("user-001", "Say " + item)],
        model=model,
        tools=al.ToolRegistry(),
        max_steps=1,
        signal=signal,
    )


def tool_run(
    item: str, signal: threading.Event, execute: Callable[[Dict[str, Any], al.Signal], object]
) -> Iterator[al.Event]:
    """A run whose model calls the tool `wait` once, then answers `item`."""
    model = al.ScriptedModel(
        [
            al.scripted_response("response-001", [al.ToolCall("call-1", "wait", {})], "toolCall"),
            al.scripted_response("response-002", [al.TextBlock(item)], "stop"),
        ]
    )
    tool = al.Tool("wait", "Waits.", {"type": "object"}, execute)
    return al.run_agent_loop(
        messages=[al.UserMessage("user-001", "Say " + item)],
        model=model,
        tools=al.ToolRegistry([tool]),
        max_steps=2,
        signal=signal,
    )


def batch_threads() -> List[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("agent_loop_batch")]


@pytest.fixture(autouse=True)
def no_thread_left() -> Iterator[None]:
    yield
    assert batch_threads() == []


class Stderr:
    """Standard error as pytest captures it: not a terminal."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys

    def getvalue(self) -> str:
        return self.capsys.readouterr().err


@pytest.fixture
def stderr(capsys: pytest.CaptureFixture[str]) -> Stderr:
    return Stderr(capsys)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class TestOptions:
    @pytest.mark.parametrize(
        ("arguments", "error", "words"),
        [
            ({"make_run": None}, TypeError, "make_run must be callable"),
            ({"items": 3}, TypeError, "items must be an iterable"),
            ({"concurrency": True}, TypeError, "concurrency must be an int >= 1, got bool"),
            ({"concurrency": 2.0}, TypeError, "concurrency must be an int >= 1, got float"),
            pytest.param({"concurrency": 0}, ValueError, "got 0", id="below-limit"),
            ({"concurrency": -1}, ValueError, "concurrency must be an int >= 1, got -1"),
            ({"progress": "yes"}, TypeError, "progress must be None, True, False or a callable"),
            ({"signal": object()}, TypeError, "signal must be None or a threading.Event"),
        ],
    )
    def test_a_bad_argument_raises_at_call_time_naming_it(
        self, arguments: Dict[str, Any], error: type, words: str
    ) -> None:
        called: List[object] = []

        def make_run(item: str, signal: threading.Event) -> Iterator[al.Event]:
            called.append(item)
            return answer_run(item, signal)

        options: Dict[str, Any] = {
            "make_run": make_run,
            "items": ["a"],
            "concurrency": 1,
            "progress": False,
        }
        options.update(arguments)
        with pytest.raises(error, match=words):
            batch.run_many(options.pop("make_run"), options.pop("items"), **options)
        assert called == []  # nothing began

    def test_concurrency_one_is_the_least(self) -> None:
        results = batch.run_many(answer_run, ["a", "b"], concurrency=1, progress=False)
        assert [r.final_text for r in results] == ["a", "b"]


class TestResults:
    @pytest.mark.parametrize("concurrency", [1, 3, 20])
    def test_results_come_back_in_the_order_of_items(self, concurrency: int) -> None:
        items = [f"item-{n}" for n in range(10)]
        results = batch.run_many(answer_run, iter(items), concurrency=concurrency, progress=False)
        assert [r.status for r in results] == ["completed"] * 10
        assert [r.final_text for r in results] == items

    def test_no_items_no_runs(self) -> None:
        assert batch.run_many(answer_run, [], concurrency=4, progress=False) == []

    def test_up_to_concurrency_runs_at_once_and_no_more(self) -> None:
        lock = threading.Lock()
        active = [0]
        most = [0]
        together = threading.Barrier(3, timeout=WAIT)

        def execute(arguments: Dict[str, Any], signal: al.Signal) -> object:
            with lock:
                active[0] += 1
                most[0] = max(most[0], active[0])
            together.wait()  # three runs are in their tools at the same time
            with lock:
                active[0] -= 1
            return "done"

        def make_run(item: str, signal: threading.Event) -> Iterator[al.Event]:
            return tool_run(item, signal, execute)

        results = batch.run_many(
            make_run, [str(n) for n in range(6)], concurrency=3, progress=False
        )
        assert [r.status for r in results] == ["completed"] * 6
        assert most[0] == 3

    def test_a_failed_run_is_one_result_among_the_others(self) -> None:
        def make_run(item: str, signal: threading.Event) -> Iterator[al.Event]:
            if item == "broken":  # a model with nothing left to say: MODEL_STREAM_ERROR
                return al.run_agent_loop(
                    messages=[al.UserMessage("user-001", "Hi")],
                    model=al.ScriptedModel([]),
                    tools=al.ToolRegistry(),
                    max_steps=1,
                    signal=signal,
                )
            return answer_run(item, signal)

        results = batch.run_many(make_run, ["a", "broken", "c"], concurrency=2, progress=False)
        assert [r.status for r in results] == ["completed", "failed", "completed"]
        error = results[1].error
        assert error is not None
        assert error.code == "MODEL_STREAM_ERROR"

    def test_an_item_that_raises_is_named_and_the_others_go_on(self) -> None:
        def raising_run(signal: threading.Event) -> Iterator[al.Event]:
            yield from answer_run("half", signal)
            raise OSError("the journal's disk is full")

        def returns_nothing(signal: threading.Event) -> Iterator[al.Event]:
            yield from ()

        def make_run(item: str, signal: threading.Event) -> Any:
            if item == "make_run raises":
                raise ValueError("no such customer")
            if item == "run raises":
                return raising_run(signal)
            if item == "not a generator":
                return [1, 2]
            if item == "no result":
                return returns_nothing(signal)
            return answer_run(item, signal)

        items = ["a", "make_run raises", "b", "run raises", "not a generator", "no result", "c"]
        with pytest.raises(batch.BatchError) as raised:
            batch.run_many(make_run, items, concurrency=2, progress=False)
        error = raised.value
        assert sorted(error.errors) == [1, 3, 4, 5]
        assert isinstance(error.errors[1], ValueError)
        assert isinstance(error.errors[3], OSError)
        assert "make_run must return a run's generator, got list" in str(error.errors[4])
        assert "must return a RunResult, got NoneType" in str(error.errors[5])
        message = str(error)
        assert message.startswith("4 of 7 runs raised instead of giving a result: ")
        assert "item 1 ('make_run raises'): ValueError: no such customer" in message
        assert "item 3 ('run raises'): OSError: the journal's disk is full" in message
        assert [r.final_text if r else None for r in error.results] == [
            "a",
            None,
            "b",
            None,
            None,
            None,
            "c",
        ]

    @pytest.mark.parametrize(("raising", "more"), [(5, ""), (6, "; and 1 more")])
    def test_the_message_names_five_items_at_most(self, raising: int, more: str) -> None:
        def make_run(item: int, signal: threading.Event) -> Iterator[al.Event]:
            raise ValueError(f"bad {item}")

        with pytest.raises(batch.BatchError) as raised:
            batch.run_many(make_run, range(raising), concurrency=2, progress=False)
        assert str(raised.value).endswith("ValueError: bad 4" + more)
        assert len(raised.value.errors) == raising


class TestStopping:
    def blocked_batch(
        self, stop: Callable[[], None], **options: Any
    ) -> Tuple[Callable[[], List[al.RunResult]], List[str], List[str]]:
        """Five items, two at once; each tool waits for its signal; `stop` once both wait."""
        built: List[str] = []
        stopped: List[str] = []
        both = threading.Barrier(2, timeout=WAIT)

        def make_run(item: str, signal: threading.Event) -> Iterator[al.Event]:
            built.append(item)

            def execute(arguments: Dict[str, Any], tool_signal: al.Signal) -> object:
                if both.wait() == 0:
                    stop()
                if tool_signal.wait(WAIT):
                    stopped.append(item)
                return "woke"

            return tool_run(item, signal, execute)

        def go() -> List[al.RunResult]:
            options.setdefault("progress", False)
            return batch.run_many(make_run, ["a", "b", "c", "d", "e"], concurrency=2, **options)

        return go, built, stopped

    @pytest.mark.parametrize("by", ["its-signal", "ctrl-c"])
    def test_a_stopped_batch_cancels_what_runs_begins_nothing_more_and_keeps_every_result(
        self, stderr: Stderr, by: str
    ) -> None:
        signal = threading.Event()
        go, built, stopped = self.blocked_batch(
            signal.set if by == "its-signal" else _thread.interrupt_main,
            signal=signal,
            progress=None,
        )
        # A shell starts a background job with SIGINT ignored, and then interrupt_main()
        # does nothing: Ctrl-C is Python's own handler here, whoever started the tests.
        before = os_signal.signal(os_signal.SIGINT, os_signal.default_int_handler)
        began = time.monotonic()
        try:
            with pytest.raises(batch.BatchInterrupted) as raised:
                go()
        finally:
            os_signal.signal(os_signal.SIGINT, before)
        assert time.monotonic() - began < STOP_BOUND
        # Ctrl-C is still a KeyboardInterrupt for `except KeyboardInterrupt`; the signal not.
        assert isinstance(raised.value, KeyboardInterrupt) == (by == "ctrl-c")
        assert sorted(built) == ["a", "b"]
        assert sorted(stopped) == ["a", "b"]
        results = raised.value.results
        # The two that ran keep their transcripts, the tool call open; the others never began.
        assert [r is not None and r.status for r in results[:2]] == ["cancelled", "cancelled"]
        assert [r is not None and al.open_tool_calls(r.messages) != () for r in results[:2]] == [
            True,
            True,
        ]
        assert results[2:] == [None, None, None]
        assert raised.value.errors == {}
        assert str(raised.value).endswith("stopped the batch: 2 cancelled, 3 not begun")
        # The last line says what happened, never a time left.
        assert stderr.getvalue().splitlines()[-1] == "2/5 runs; stopped: 2 cancelled, 3 not begun"

    @pytest.mark.parametrize(
        ("set_at", "interrupted"),
        [
            pytest.param("before-the-call", True, id="before-the-call-nothing-begins"),
            pytest.param("the-last-end", False, id="after-every-item-ended-nothing-stops"),
        ],
    )
    def test_the_signal_interrupts_only_a_batch_with_items_left(
        self, set_at: str, interrupted: bool
    ) -> None:
        signal = threading.Event()
        built: List[str] = []
        if set_at == "before-the-call":
            signal.set()

        def make_run(item: str, run_signal: threading.Event) -> Iterator[al.Event]:
            built.append(item)
            return answer_run(item, run_signal)

        def progress(item: str, result: object) -> None:
            if len(built) == 2 and item == built[-1]:  # the last item ended
                signal.set()

        def go() -> List[al.RunResult]:
            return batch.run_many(
                make_run, ["a", "b"], concurrency=1, progress=progress, signal=signal
            )

        if interrupted:
            with pytest.raises(
                batch.BatchInterrupted, match=r"signal stopped the batch: 2 not begun$"
            ) as raised:
                go()
            assert raised.value.results == [None, None]
            assert built == []
        else:
            assert [r.final_text for r in go()] == ["a", "b"]

    def test_a_keyboard_interrupt_from_a_run_stops_the_batch_as_ctrl_c_does(self) -> None:
        built: List[str] = []
        stopped: List[str] = []
        both = threading.Barrier(2, timeout=WAIT)

        def make_run(item: str, signal: threading.Event) -> Iterator[al.Event]:
            built.append(item)

            def execute(arguments: Dict[str, Any], tool_signal: al.Signal) -> object:
                if item in ("a", "b"):
                    both.wait()  # b's tool is running when a's raises
                if item == "a":
                    raise KeyboardInterrupt  # the loop never catches it: the worker gets it
                if tool_signal.wait(WAIT):
                    stopped.append(item)
                return "woke"

            return tool_run(item, signal, execute)

        with pytest.raises(KeyboardInterrupt) as raised:
            batch.run_many(make_run, ["a", "b", "c"], concurrency=2, progress=False)
        assert isinstance(raised.value, batch.BatchInterrupted)
        # b was cancelled through its signal (c, if it began, too: no thread is left).
        assert "b" in stopped
        assert set(stopped) <= set(built) - {"a"}
        results = raised.value.results
        assert results[0] is None  # what a's run raised stopped the batch: it has no result
        assert results[1] is not None
        assert results[1].status == "cancelled"

    def test_a_progress_callable_that_raises_stops_the_batch(self) -> None:
        def make_run(item: str, signal: threading.Event) -> Iterator[al.Event]:
            return answer_run(item, signal)

        def progress(item: str, result: object) -> None:
            raise RuntimeError(f"the dashboard is down at {item}")

        with pytest.raises(RuntimeError, match="the dashboard is down at a"):
            batch.run_many(make_run, ["a", "b", "c"], concurrency=1, progress=progress)

    def test_a_thread_that_cannot_start_stops_the_batch(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        started: List[str] = []
        start = threading.Thread.start

        def start_one(thread: threading.Thread) -> None:
            if started:
                raise RuntimeError("can't start new thread")
            started.append(thread.name)
            start(thread)

        monkeypatch.setattr(threading.Thread, "start", start_one)
        with pytest.raises(RuntimeError, match="can't start new thread"):
            batch.run_many(answer_run, ["a", "b", "c"], concurrency=2, progress=False)
        assert started == ["agent_loop_batch-0"]  # joined before the error propagated


class TestProgress:
    def test_a_callable_gets_each_item_and_its_result_in_the_calling_thread(
        self, stderr: Stderr
    ) -> None:
        seen: List[Tuple[str, object, str]] = []

        def make_run(item: str, signal: threading.Event) -> Iterator[al.Event]:
            if item == "b":
                raise ValueError("bad b")
            return answer_run(item, signal)

        def progress(item: str, result: object) -> None:
            seen.append((item, result, threading.current_thread().name))

        with pytest.raises(batch.BatchError):
            batch.run_many(make_run, ["a", "b"], concurrency=1, progress=progress)
        assert [(item, type(result).__name__, name) for item, result, name in seen] == [
            ("a", "RunResult", "MainThread"),
            ("b", "ValueError", "MainThread"),
        ]
        assert stderr.getvalue() == ""  # a callable replaces the printed line

    @pytest.mark.parametrize("progress", [None, True])
    def test_away_from_a_terminal_a_plain_line_after_the_first_and_at_the_end(
        self, stderr: Stderr, progress: Optional[bool]
    ) -> None:
        batch.run_many(answer_run, ["a", "b", "c"], concurrency=1, progress=progress)
        written = stderr.getvalue()
        lines = written.splitlines()
        assert len(lines) == 2  # the batch takes far less than PLAIN_LINE_SECONDS
        assert lines[0].startswith("1/3 runs: 1 completed, 0 failed, 0 cancelled; ")
        assert lines[1].startswith("3/3 runs: 3 completed, 0 failed, 0 cancelled; ")
        assert "\r" not in written
        assert "\x1b" not in written

    def test_the_report_ticks_while_no_run_ends(
        self, stderr: Stderr, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        ticked = threading.Event()
        tick = batch._Report.tick

        def tick_and_tell(report: batch._Report, now: float) -> None:
            tick(report, now)
            ticked.set()

        monkeypatch.setattr(batch._Report, "tick", tick_and_tell)

        def make_run(item: str, signal: threading.Event) -> Iterator[al.Event]:
            return tool_run(item, signal, lambda arguments, signal: ticked.wait(WAIT))

        results = batch.run_many(make_run, ["a"], concurrency=1)
        assert ticked.is_set()
        assert [r.status for r in results] == ["completed"]
        assert stderr.getvalue().startswith("1/1 runs: 1 completed")

    def test_progress_false_is_silent(self, stderr: Stderr) -> None:
        batch.run_many(answer_run, ["a"], concurrency=1, progress=False)
        assert stderr.getvalue() == ""

    def test_without_standard_error_nothing_is_written(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(sys, "stderr", None)  # pythonw, a daemon
        assert [r.status for r in batch.run_many(answer_run, ["a"], concurrency=1)] == [
            "completed"
        ]

    @pytest.mark.parametrize(
        ("second", "lines"),
        [
            pytest.param(110.49, 1, id="below-the-interval"),
            pytest.param(110.5, 2, id="at-the-interval"),
        ],
    )
    def test_plain_lines_come_every_ten_seconds(self, second: float, lines: int) -> None:
        out = io.StringIO()
        report = batch._Report(4, out, False, 100.0)
        result = al.RunResult(status="completed", messages=(), steps=1)
        report.ended(result, 100.5)
        report.tick(105.0)  # nothing on a tick away from a terminal
        report.ended(result, second)
        assert len(out.getvalue().splitlines()) == lines

    def test_the_line_counts_every_status_rate_and_time_left(self) -> None:
        out = io.StringIO()
        report = batch._Report(10, out, False, 100.0)
        assert report.line(100.0) == "0/10 runs: 0 completed, 0 failed, 0 cancelled; - runs/s"
        for status in ("completed", "completed", "failed", "cancelled", "maxSteps"):
            report.ended(al.RunResult(status=status, messages=(), steps=1), 100.0)
        report.ended(ValueError("bad"), 100.0)
        assert report.line(100.0) == (
            "6/10 runs: 2 completed, 1 failed, 1 cancelled, 1 maxSteps, 1 raised; - runs/s"
        )
        assert report.line(104.0) == (
            "6/10 runs: 2 completed, 1 failed, 1 cancelled, 1 maxSteps, 1 raised; "
            "1.5 runs/s, 3 s left"
        )
        report.close(104.0, stopped=True)  # what happened, and no time left
        assert out.getvalue().splitlines()[-1] == (
            "6/10 runs; stopped: 2 completed, 1 failed, 1 cancelled, 1 maxSteps, 1 raised, "
            "4 not begun"
        )

    @pytest.mark.parametrize(
        ("redraw_at", "draws"), [pytest.param(0.09, 1, id="below"), pytest.param(0.1, 2, id="at")]
    )
    def test_a_terminal_line_is_redrawn_in_place_at_most_ten_times_a_second(
        self, redraw_at: float, draws: int
    ) -> None:
        out = io.StringIO()
        report = batch._Report(4, out, True, 0.0)
        result = al.RunResult(status="completed", messages=(), steps=1)
        report.ended(result, 0.0)
        report.ended(result, redraw_at)
        assert out.getvalue().count("\r") == draws
        assert "\n" not in out.getvalue()

    @pytest.mark.parametrize(
        ("tick_at", "draws"),
        [pytest.param(100.99, 1, id="below"), pytest.param(101.0, 2, id="at")],
    )
    def test_a_terminal_line_moves_on_once_a_second_while_nothing_ends(
        self, tick_at: float, draws: int
    ) -> None:
        out = io.StringIO()
        report = batch._Report(4, out, True, 100.0)
        report.ended(al.RunResult(status="completed", messages=(), steps=1), 100.0)
        report.tick(tick_at)
        assert out.getvalue().count("\r") == draws

    def test_a_terminal_line_ends_with_a_newline(self, monkeypatch: pytest.MonkeyPatch) -> None:
        # No tick: one draws "0/2 runs" first whenever no run has ended within
        # WATCH_SECONDS (a slow start, a loaded machine), and may hold back the redraw of
        # the first end. Without ticks the first line is the one the first run's end
        # draws. Ticks have their own tests (test_the_report_ticks_while_no_run_ends,
        # test_a_terminal_line_moves_on_once_a_second_while_nothing_ends).
        monkeypatch.setattr(batch._Report, "tick", lambda report, now: None)
        terminal = Terminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        batch.run_many(answer_run, ["a", "b"], concurrency=2)
        written = terminal.getvalue()
        assert written.startswith("\r1/2 runs: 1 completed")
        assert written.endswith(
            "\r2/2 runs: 2 completed, 0 failed, 0 cancelled; " + written.rsplit("; ", 1)[1]
        )
        assert written.endswith("\x1b[K\n")

    @pytest.mark.parametrize(("columns", "cut"), [(200, False), (40, True)])
    def test_in_a_real_terminal_one_line_is_redrawn_in_place(
        self, monkeypatch: pytest.MonkeyPatch, columns: int, cut: bool
    ) -> None:
        """Standard error is a pseudo-terminal's (of `columns`); its master is read."""
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
        terminal = os.fdopen(slave, "w", encoding="utf-8")
        try:
            # No tick, as in test_a_terminal_line_ends_with_a_newline: the first line drawn
            # is the one the first run's end draws, never a "0/3 runs" of a slow start.
            monkeypatch.setattr(batch._Report, "tick", lambda report, now: None)
            monkeypatch.setattr(sys, "stderr", terminal)
            results = batch.run_many(answer_run, ["a", "b", "c"], concurrency=1)
            monkeypatch.undo()
            terminal.close()
            written = b""
            # The pty hands what the slave wrote to the master asynchronously: wait (at
            # most WAIT) for each read instead of taking what has arrived by now.
            while select.select([master], [], [], WAIT)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # Linux: EIO once the slave is closed and all was read
                    break
                if not chunk:
                    break
                written += chunk
        finally:
            monkeypatch.undo()
            if not terminal.closed:
                terminal.close()
            os.close(master)
        assert [r.status for r in results] == ["completed"] * 3
        text = written.decode()
        assert text.endswith("\x1b[K\r\n")  # the pty turns the last "\n" into "\r\n"
        assert text.count("\n") == 1  # one line, redrawn in place
        drawn = [line.split("\x1b[K")[0] for line in text.split("\r") if line.strip()]
        assert drawn[0].startswith("1/3 runs: 1 completed, 0 failed, 0 cancelled"[: columns - 1])
        assert drawn[-1].startswith("3/3 runs: 3 completed, 0 failed, 0 cancelled"[: columns - 1])
        # A line that would wrap is cut to the terminal's width, less one column.
        longest = max(len(line) for line in drawn)
        assert longest == columns - 1 if cut else longest < columns - 1
