# agent_loop_batch.py 1.1.0: many runs of agent_loop.py on a few threads, with progress.
# One file, standard library only; copy it next to agent_loop.py. Home: the agent_loop repository.
"""Many runs at once: ``run_many(make_run, items, concurrency=8)``.

Rules (docs/many-runs.md says the same, with the figures):

1. ``make_run(item, signal)`` builds one run's generator (``run_agent_loop()`` or
   ``durable_run()``) with the ``threading.Event`` it is given. Up to ``concurrency``
   threads each take the next item that has not begun, build its run and drain it.
2. The results come back in the order of ``items``. A run that ends ``failed`` is one
   result among the others. An ``Exception`` from ``make_run`` or from the run itself
   (a ``JournalError``, a bug) is that item's alone: the other items go on, and once every
   item has ended ``run_many`` raises one ``BatchError`` that names each item that raised
   and carries every result.
3. Stopping: Ctrl-C (``KeyboardInterrupt`` in the calling thread), the batch's own
   ``signal``, a ``KeyboardInterrupt`` or ``SystemExit`` from a run, or an exception from
   the ``progress`` callable sets the signal of every run that has begun, and no other
   item begins. Once every thread has ended (within ``agent_loop.WATCH_SECONDS``, plus
   the time the slowest running run takes to end on its signal: a model that watches it,
   as the providers do, ends within a quarter of a second; a tool ends when it returns)
   the call raises. Ctrl-C and the signal, if they stopped anything, raise
   ``BatchInterrupted``, whose ``results`` keeps every item's result in order (``None``
   for an item never begun); on Ctrl-C it is also a ``KeyboardInterrupt``. The others
   raise what stopped the batch.
4. Progress goes to standard error: on a terminal one line redrawn in place (cut to the
   terminal's width), elsewhere (a log, CI) a plain line after the first run ends, then
   every ``PLAIN_LINE_SECONDS``, and at the end; a batch that was stopped ends it with what
   happened (``stopped: 57 completed, 8 cancelled, 135 not begun``), never a time left.
   ``progress=False`` is silent; a callable is called in the calling thread with ``(item,
   result)`` for each item that ends (``result`` is the exception for an item that raised).

Threads are not daemons and are joined before ``run_many`` returns or raises, so none is
left behind, unless a second Ctrl-C interrupts that wait: then ``run_many`` raises at
once, and the threads end on their runs' signals before the interpreter exits. It uses
only agent_loop's public names.
"""

from __future__ import annotations

import collections.abc
import os
import queue
import reprlib
import sys
import threading
import time
from typing import (
    Callable,
    Dict,
    Final,
    Generic,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    TextIO,
    Tuple,
    TypeVar,
    Union,
    cast,
)

import agent_loop as al

__version__ = "1.1.0"

__all__ = ["BatchError", "BatchInterrupted", "run_many"]

TERMINAL_REDRAW_SECONDS: Final = 0.1
"""The terminal line is redrawn at most this often (a run ending), and at least once a second."""
PLAIN_LINE_SECONDS: Final = 10.0
"""Away from a terminal, a progress line at most this often: a log gets a line, not a flood."""

Item = TypeVar("Item")
Outcome = Union[al.RunResult, Exception]
"""What an item ended with: its run's result, or the exception that its make_run or run raised."""


class BatchError(Exception):
    """Some items raised instead of giving a result; raised once every item has ended.

    ``results`` has one entry per item, in order: the ``RunResult``, or ``None`` where the
    item raised; ``errors`` maps the index of each item that raised to its exception.
    """

    def __init__(
        self,
        items: Sequence[object],
        results: List[Optional[al.RunResult]],
        errors: Dict[int, Exception],
    ) -> None:
        shown = [
            f"item {index} ({reprlib.repr(items[index])}): {type(error).__name__}: {error}"
            for index, error in list(errors.items())[:5]
        ]
        more = f"; and {len(errors) - 5} more" if len(errors) > 5 else ""
        super().__init__(
            f"{len(errors)} of {len(items)} runs raised instead of giving a result: "
            + "; ".join(shown)
            + more
        )
        self.results = results
        self.errors = errors


class BatchInterrupted(Exception):
    """Ctrl-C or the batch's signal stopped it; raised once every thread has ended.

    ``results`` has one entry per item, in order: the ``RunResult`` of each item that
    ended (a run cut short is ``cancelled``), ``None`` for an item never begun or one that
    raised; ``errors`` maps the index of each item that raised to its exception. Raised for
    Ctrl-C it is also a ``KeyboardInterrupt``: code that handles Ctrl-C with ``except
    KeyboardInterrupt`` still does, and ``except BatchInterrupted`` keeps the results of
    both. (Being an Exception too, it is also caught by an ``except Exception`` around
    ``run_many``.)
    """

    def __init__(
        self, why: str, results: List[Optional[al.RunResult]], errors: Dict[int, Exception]
    ) -> None:
        counts: Dict[str, int] = collections.Counter(
            result.status for result in results if result is not None
        )
        counts["raised"] = len(errors)
        not_begun = sum(result is None for result in results) - len(errors)
        super().__init__(f"{why} stopped the batch: {_what_happened(counts, not_begun)}")
        self.results = results
        self.errors = errors


class _KeyboardInterrupted(BatchInterrupted, KeyboardInterrupt):
    """BatchInterrupted for Ctrl-C: a KeyboardInterrupt too, for ``except KeyboardInterrupt``."""


def _what_happened(counts: Mapping[str, int], not_begun: int) -> str:
    """``57 completed, 8 cancelled, 135 not begun``: the counts that are not zero, then the
    items never begun."""
    said = [
        f"{counts[status]} {status}"
        for status in ("completed", "failed", "cancelled", "maxSteps", "raised")
        if counts.get(status)
    ]
    return ", ".join([*said, f"{not_begun} not begun"])


def run_many(
    make_run: Callable[[Item, threading.Event], Iterator[al.Event]],
    items: Iterable[Item],
    *,
    concurrency: int,
    progress: Union[bool, Callable[[Item, Outcome], object], None] = None,
    signal: Optional[al.Signal] = None,
) -> List[al.RunResult]:
    """Runs ``make_run(item, signal)`` for every item on up to ``concurrency`` threads.

    Returns the ``RunResult`` of each item, in the order of ``items`` (read completely at
    call time). ``progress``: ``None`` or ``True`` prints to standard error, ``False``
    prints nothing, a callable gets ``(item, result)`` for each item that ends. ``signal``,
    once set, stops the batch: the running runs are cancelled through their signals and no
    other item begins.

    Raises TypeError or ValueError at call time for a bad argument; ``BatchError`` once
    every item has ended if any ``make_run`` or run raised an ``Exception``; after
    cancelling the runs and joining their threads, ``BatchInterrupted`` (with every
    item's result) for Ctrl-C (then also a ``KeyboardInterrupt``) or ``signal``, and any
    ``SystemExit`` of a run or exception of the ``progress`` callable as it is.
    """
    if not callable(make_run):
        raise TypeError(
            "make_run must be callable as make_run(item, signal), returning a run's "
            f"generator; got {type(make_run).__name__}"
        )
    if not isinstance(items, collections.abc.Iterable):
        raise TypeError(f"items must be an iterable of items, got {type(items).__name__}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int):
        raise TypeError(f"concurrency must be an int >= 1, got {type(concurrency).__name__}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be an int >= 1, got {concurrency}")
    if not (progress is None or isinstance(progress, bool) or callable(progress)):
        raise TypeError(
            "progress must be None, True, False or a callable(item, result), "
            f"got {type(progress).__name__}"
        )
    if signal is not None and not (
        callable(getattr(signal, "is_set", None)) and callable(getattr(signal, "wait", None))
    ):
        raise TypeError(
            "signal must be None or a threading.Event (is_set() and wait()), "
            f"got {type(signal).__name__}"
        )
    listed = list(items)
    stream = sys.stderr if progress is None or progress is True else None
    terminal, columns = False, 0
    if stream is not None and stream.isatty():
        terminal, columns = True, _columns(stream)
    report = _Report(len(listed), stream, terminal, _now(), columns)
    callback = progress if callable(progress) else None
    return _Batch(make_run, listed, concurrency, report, callback, signal).run()


class _Batch(Generic[Item]):
    """One call of run_many: the workers' shared state and the calling thread's loop."""

    def __init__(
        self,
        make_run: Callable[[Item, threading.Event], Iterator[al.Event]],
        items: List[Item],
        concurrency: int,
        report: _Report,
        callback: Optional[Callable[[Item, Outcome], object]],
        signal: Optional[al.Signal],
    ) -> None:
        self.make_run = make_run
        self.items = items
        self.report = report
        self.callback = callback
        self.signal = signal
        self.lock = threading.Lock()
        self.next_index = 0
        self.stopping = False
        self.interrupted = False  # stopped with an item running or not begun
        self.running: Dict[int, threading.Event] = {}
        # (index, outcome) per ended item; (-1, None) when a worker exits.
        self.ended: queue.Queue[Tuple[int, Optional[Union[al.RunResult, BaseException]]]] = (
            queue.Queue()
        )
        self.threads = [
            threading.Thread(target=self.work, name=f"agent_loop_batch-{number}")
            for number in range(min(concurrency, len(items)))
        ]

    def run(self) -> List[al.RunResult]:
        """The calling thread: start the workers, collect what ends, stop on request."""
        outcomes: List[Optional[Outcome]] = [None] * len(self.items)
        try:
            if self.signal is not None and self.signal.is_set():
                self.stop()  # set before the call: no item begins
            for thread in self.threads:
                thread.start()
            exited = 0
            while exited < len(self.threads):
                if self.signal is not None and self.signal.is_set() and not self.stopping:
                    self.stop()
                try:
                    index, outcome = self.ended.get(timeout=al.WATCH_SECONDS)
                except queue.Empty:
                    self.report.tick(_now())
                    continue
                if outcome is None:
                    exited += 1
                    continue
                if not isinstance(outcome, (al.RunResult, Exception)):
                    raise outcome  # KeyboardInterrupt, SystemExit: the batch stops as on Ctrl-C
                outcomes[index] = outcome
                self.report.ended(outcome, _now())
                if self.callback is not None:
                    self.callback(self.items[index], outcome)
        except BaseException as error:
            self.stop()
            self.join()
            # The runs that ended on their signals count in the last line, which ends
            # with a newline (a terminal is not left mid-line), and in the results.
            while not self.ended.empty():
                index, outcome = self.ended.get_nowait()
                if isinstance(outcome, (al.RunResult, Exception)):
                    outcomes[index] = outcome
                    self.report.ended(outcome, _now())
            self.report.close(_now(), stopped=True)
            if isinstance(error, KeyboardInterrupt):
                results, errors = self.partial(outcomes)
                raise _KeyboardInterrupted("a KeyboardInterrupt", results, errors) from None
            raise
        self.join()
        self.report.close(_now(), stopped=self.interrupted)
        results, errors = self.partial(outcomes)
        if self.interrupted:
            raise BatchInterrupted("its signal", results, errors)
        if errors:
            raise BatchError(self.items, results, errors)
        # Nothing stopped it and nothing raised: every item began and gave a result.
        return cast(List[al.RunResult], results)

    def partial(
        self, outcomes: List[Optional[Outcome]]
    ) -> Tuple[List[Optional[al.RunResult]], Dict[int, Exception]]:
        """The results in order (None where an item never began or raised), and what raised."""
        errors = {
            index: outcome
            for index, outcome in enumerate(outcomes)
            if isinstance(outcome, Exception)
        }
        results = [outcome if isinstance(outcome, al.RunResult) else None for outcome in outcomes]
        return results, errors

    def stop(self) -> None:
        """No item begins any more, and every running run's signal is set."""
        with self.lock:
            self.stopping = True
            # Stopped after every item had begun and ended, the batch was not interrupted.
            if self.running or self.next_index < len(self.items):
                self.interrupted = True
            for run_signal in self.running.values():
                run_signal.set()

    def join(self) -> None:
        """Waits for every started worker (each ends once its run ends on its signal)."""
        for thread in self.threads:
            if thread.ident is not None:
                # Bounded by the runs' own ends on their signals (rule 3), not by a timeout:
                # a result is never dropped for being slow. A second Ctrl-C leaves it.
                thread.join()

    def work(self) -> None:
        """A worker thread: takes the next item that has not begun, until none is left."""
        try:
            while True:
                with self.lock:
                    if self.stopping or self.next_index == len(self.items):
                        return
                    index = self.next_index
                    self.next_index += 1
                    run_signal = threading.Event()
                    self.running[index] = run_signal
                outcome = self.drive(self.items[index], run_signal)
                with self.lock:
                    del self.running[index]
                self.ended.put((index, outcome))
        finally:
            self.ended.put((-1, None))

    def drive(self, item: Item, run_signal: threading.Event) -> Union[al.RunResult, BaseException]:
        """Builds one item's run and drains it; returns its result or what it raised."""
        try:
            run = self.make_run(item, run_signal)
            if not isinstance(run, collections.abc.Iterator):
                raise TypeError(
                    f"make_run must return a run's generator, got {type(run).__name__}"
                )
            while True:
                try:
                    next(run)
                except StopIteration as done:
                    result = done.value
                    break
            if not isinstance(result, al.RunResult):
                raise TypeError(
                    f"the run's generator must return a RunResult, got {type(result).__name__}"
                )
            return result
        except BaseException as error:  # the calling thread decides what it means
            return error


def _columns(stream: TextIO) -> int:
    """The width of the terminal that ``stream`` writes to; 0 when it is not known."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError):  # no file descriptor (io.UnsupportedOperation is both)
        return 0


def _now() -> float:
    """The clock of the progress report: seconds, monotonic."""
    return time.monotonic()


class _Report:
    """The progress line: counts what ended and decides when to write it (to no stream: not)."""

    def __init__(
        self,
        total: int,
        stream: Optional[TextIO],
        terminal: bool,
        started: float,
        columns: int = 0,
    ) -> None:
        self.total = total
        self.stream = stream
        self.terminal = terminal
        self.columns = columns
        self.started = started
        self.counts: Dict[str, int] = collections.Counter()
        self.done = 0
        self.written: Optional[float] = None
        self.stopped = False

    def ended(self, outcome: Outcome, now: float) -> None:
        """Counts an item that ended; writes the line if it is due."""
        self.done += 1
        self.counts[outcome.status if isinstance(outcome, al.RunResult) else "raised"] += 1
        self.write_if_due(now, TERMINAL_REDRAW_SECONDS if self.terminal else PLAIN_LINE_SECONDS)

    def tick(self, now: float) -> None:
        """Time passed with nothing ended: the terminal line's rate and time left move on."""
        if self.terminal:
            self.write_if_due(now, 1.0)

    def close(self, now: float, stopped: bool = False) -> None:
        """The batch ended: the last line (saying what happened if it was stopped), then a
        newline on a terminal."""
        self.stopped = stopped
        self.write(now)
        if self.terminal and self.stream is not None:
            self.stream.write("\n")
            self.stream.flush()

    def write_if_due(self, now: float, every: float) -> None:
        """Writes the line if none was written yet or the last is ``every`` seconds old."""
        if self.written is None or now - self.written >= every:
            self.write(now)

    def write(self, now: float) -> None:
        """Writes the line: redrawn in place on a terminal, one more line elsewhere."""
        self.written = now
        if self.stream is None:
            return
        line = self.line(now)
        if self.columns > 1:  # a line that wrapped could not be redrawn in place
            line = line[: self.columns - 1]
        self.stream.write("\r" + line + "\x1b[K" if self.terminal else line + "\n")
        self.stream.flush()

    def line(self, now: float) -> str:
        """``12/100 runs: 10 completed, 1 failed, 1 cancelled; 3.2 runs/s, 28 s left``, or
        once stopped ``65/200 runs; stopped: 57 completed, 8 cancelled, 135 not begun``."""
        if self.stopped:
            what = _what_happened(self.counts, self.total - self.done)
            return f"{self.done}/{self.total} runs; stopped: {what}"
        counts = [
            f"{self.counts[status]} {status}" for status in ("completed", "failed", "cancelled")
        ]
        counts += [
            f"{self.counts[status]} {status}"
            for status in ("maxSteps", "raised")
            if self.counts[status]
        ]
        elapsed = now - self.started
        if self.done == 0 or elapsed <= 0:
            pace = "- runs/s"
        else:
            rate = self.done / elapsed
            left = (self.total - self.done) / rate
            pace = f"{rate:.1f} runs/s, {left:.0f} s left"
        return f"{self.done}/{self.total} runs: {', '.join(counts)}; {pace}"
