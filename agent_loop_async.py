# agent_loop_async.py 1.1.0: an asyncio face on a run of agent_loop.py.
# One file, standard library only; copy it next to agent_loop.py and agent_loop_replay.py (for
# its one line writer). Home: the agent_loop repository.
"""``async for event in arun(run, signal)``: a run's events in an asyncio program, and
``sse(run, signal)``: the same as server-sent events, for a web framework's response.

Rules (docs/many-runs.md says the same, with examples):

1. ``run`` is a run's generator (``run_agent_loop()``, ``durable_run()``) built with
   ``signal``, a ``threading.Event``. The run is driven in a thread of its own, started at
   the first ``__anext__`` (or by ``aclose()``), so the event loop never blocks on a model
   or a tool.
2. The events come in the run's order. The hand-off is bounded: the run's thread never
   has more than ``EVENTS_AHEAD`` events taken from the run that the consumer has not
   received (one fewer while the consumer holds the last one it received), so a slow
   consumer holds the run back instead of letting it race ahead.
3. ``result`` is the run's ``RunResult`` once the events have ended (the ``async for`` is
   over, or ``aclose()`` returned), or once a cancelled run has ended; before that it
   raises ``asyncio.InvalidStateError``. The run's thread keeps the outcome, so no
   cancellation of any await loses it.
4. Cancelling the task that iterates (in ``__anext__`` or in its own loop body, once or
   again and again as anyio does), ``aclose()``, leaving ``async with``, dropping the
   object, and closing the event loop with the run unfinished each set ``signal``. The
   run then ends on its own rule (within the loop's bound; a tool ends when it returns),
   its remaining events are dropped, and its thread ends. A cancelled ``__anext__`` and
   ``aclose()`` wait for that (a wait that a second cancellation ends: the run still ends
   on its own), so once a task cancelled once is done the thread is gone and ``result``
   is the run's (``cancelled``, unless it ended first); the thread is never a daemon.
5. An exception that the run raises (not a ``failed`` result: a ``JournalError``, a
   ``KeyboardInterrupt`` from a tool) comes out of the ``__anext__`` after the events
   before it, and ``result`` then raises ``asyncio.InvalidStateError`` from it.
6. ``sse()`` gives each event as ``event: <type>``, ``id: <sequence>``, ``data: <the
   event's to_dict() as one json_line()>`` and a blank line; the last is ``run.finished``,
   which carries the result. It is an ``arun()`` underneath, so rules 2-5 hold for it: a
   client that leaves (the framework cancels or closes the response's iterator) cancels
   the run, and the iterator's ``result`` keeps its result.

It uses only the public names of agent_loop and agent_loop_replay.
"""

from __future__ import annotations

import asyncio
import collections.abc
import threading
import weakref
from typing import Any, Final, Iterator, Optional, Tuple, Type, Union, cast

import agent_loop as al
from agent_loop_replay import json_line

__version__ = "1.1.0"

__all__ = ["AsyncRun", "EVENTS_AHEAD", "EventStreamBody", "LOOP_CHECK_SECONDS", "arun", "sse"]

EVENTS_AHEAD: Final = 8
"""Events the run's thread may have taken from the run that the consumer has not asked
for: a few, so that a fast consumer rarely waits, and a slow one holds the run back."""

LOOP_CHECK_SECONDS: Final = 0.1
"""While the run's thread waits for the consumer, how often it checks that the event loop
is still open: a loop closed with the run unfinished cancels the run, so that its thread
(not a daemon) does not keep the program from exiting."""

# What the run's thread hands to the event loop: an event, the result, or what it raised.
_Item = Tuple[str, Union[al.Event, al.RunResult, BaseException]]


def arun(run: Iterator[al.Event], signal: threading.Event) -> AsyncRun:
    """Returns an ``AsyncRun``: ``async for event in arun(run, signal)`` gives its events.

    ``run`` must be a run's generator built with ``signal``, which must have ``set()``
    (a ``threading.Event``), since cancelling sets it. Raises TypeError at call time for
    either; nothing runs until the first event is asked for.
    """
    if not isinstance(run, collections.abc.Iterator):
        raise TypeError(f"run must be a run's generator, got {type(run).__name__}")
    if not all(callable(getattr(signal, name, None)) for name in ("is_set", "wait", "set")):
        raise TypeError(
            "signal must be the threading.Event the run was built with (is_set(), wait() "
            f"and set()), got {type(signal).__name__}"
        )
    return AsyncRun(run, signal)


def sse(run: Iterator[al.Event], signal: threading.Event) -> EventStreamBody:
    """Returns an ``EventStreamBody``: the run's events as server-sent events, in bytes.

    For a framework's streaming response (Starlette's ``StreamingResponse(sse(run,
    signal), media_type="text/event-stream")``); its ``result`` is the run's, as
    ``arun``'s is. Raises TypeError at call time as ``arun`` does.
    """
    return EventStreamBody(arun(run, signal))


class AsyncRun:
    """A run's events as an async iterator, its result once they end (see ``arun``)."""

    def __init__(self, run: Iterator[al.Event], signal: threading.Event) -> None:
        self._handoff = _Handoff(run, signal)
        self._queue: Optional[asyncio.Queue[_Item]] = None
        self._outcome: Optional[Union[al.RunResult, BaseException]] = None
        self._asked = False
        # Dropped unfinished (a `break` out of `async for`): the run is cancelled, not left
        # waiting for a consumer that is gone.
        weakref.finalize(self, self._handoff.abandon)

    @property
    def result(self) -> al.RunResult:
        """The run's RunResult; asyncio.InvalidStateError until the events have ended."""
        outcome = self._outcome
        if outcome is None and self._handoff.cancelled:
            # Cancelled: its thread kept the outcome, whichever await was cancelled.
            outcome = self._handoff.outcome
        if isinstance(outcome, al.RunResult):
            return outcome
        if outcome is None:
            raise asyncio.InvalidStateError(
                "the run's events have not ended: read result after the async for loop "
                "(or after aclose())"
            )
        raise asyncio.InvalidStateError(
            f"the run raised {type(outcome).__name__}: it has no result"
        ) from outcome

    def __aiter__(self) -> AsyncRun:
        return self

    async def __anext__(self) -> al.Event:
        """The next event; StopAsyncIteration once the run has ended."""
        if self._outcome is None and self._handoff.cancelled:
            await self.aclose()  # cancelled while nobody waited: its events are dropped
        if self._outcome is not None:
            raise StopAsyncIteration
        queue = self._start()
        self._handoff.watch(asyncio.current_task())
        if self._asked:
            self._handoff.credits.release()  # the consumer is done with the last event
        self._asked = True
        try:
            # As long as the run takes to give its next event; a cancel ends the wait.
            kind, value = await queue.get()
        except asyncio.CancelledError:
            self._handoff.cancel()
            await self._drain(queue)
            raise
        if kind == "event":
            return cast(al.Event, value)
        self._end(value)
        if isinstance(value, BaseException):
            raise value
        raise StopAsyncIteration

    async def aclose(self) -> None:
        """Cancels the run (sets its signal) and waits until it and its thread have ended.

        Does nothing once the events have ended. Never raises what the run raised: read
        ``result``. Cancelled while it waits, it raises CancelledError at once; the run
        still ends on its signal, and ``result`` is then the run's.
        """
        if self._outcome is not None:
            return
        self._handoff.cancel()
        await self._drain(self._start())

    async def __aenter__(self) -> AsyncRun:
        return self

    async def __aexit__(
        self, kind: Optional[Type[BaseException]], error: Optional[BaseException], trace: Any
    ) -> None:
        await self.aclose()

    def _start(self) -> asyncio.Queue[_Item]:
        """The hand-off's queue, and the run's thread, made the first time."""
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._handoff.start(asyncio.get_running_loop(), self._queue)
        return self._queue

    async def _drain(self, queue: asyncio.Queue[_Item]) -> None:
        """The run was cancelled: drops its events until its outcome, then joins its thread.

        Each get is bounded by the run's end on its signal (the thread posts its outcome
        last); a cancellation of it leaves the outcome with the thread (``result``)."""
        while True:
            kind, value = await queue.get()
            if kind != "event":
                self._end(value)
                return

    def _end(self, outcome: Union[al.Event, al.RunResult, BaseException]) -> None:
        """The run's outcome came: keep it; the thread posted it last, so it ends now."""
        self._outcome = cast(Union[al.RunResult, BaseException], outcome)
        # Bounded: posting the outcome is the thread's last act; it is returning.
        self._handoff.thread.join()


class EventStreamBody:
    """A run's events as server-sent events (``bytes``), its result once they end (``sse``)."""

    def __init__(self, events: AsyncRun) -> None:
        self.events = events

    @property
    def result(self) -> al.RunResult:
        """The run's RunResult, as ``AsyncRun.result``."""
        return self.events.result

    def __aiter__(self) -> EventStreamBody:
        return self

    async def __anext__(self) -> bytes:
        """The next event, framed: ``event:``, ``id:``, ``data:`` lines and a blank line."""
        event = await self.events.__anext__()
        data = json_line(event.to_dict())  # ASCII, one line: no newline can end a field early
        return f"event: {event.type}\nid: {event.sequence}\ndata: {data}\n\n".encode("ascii")

    async def aclose(self) -> None:
        """Cancels the run and waits for it, as ``AsyncRun.aclose``."""
        await self.events.aclose()


class _Handoff:
    """The run's thread and the bounded hand-off of its events to the event loop."""

    def __init__(self, run: Iterator[al.Event], signal: threading.Event) -> None:
        self.run = run
        self.signal = signal
        self.credits = threading.Semaphore(EVENTS_AHEAD)
        self.cancelled = False
        self.ended = False
        self.outcome: Optional[Union[al.RunResult, BaseException]] = None
        self.asker: Optional[asyncio.Task[Any]] = None
        self.thread = threading.Thread(target=self.drive, name="agent_loop_async")

    def start(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[_Item]) -> None:
        """Starts the run's thread, which hands its items to `queue` on `loop`."""
        self.loop = loop
        self.queue = queue
        self.thread.start()

    def watch(self, task: Optional[asyncio.Task[Any]]) -> None:
        """The task that asks for events: cancelled anywhere (in its own loop body too), it
        cancels the run when it ends."""
        if task is not None and task is not self.asker:
            self.asker = task
            task.add_done_callback(self.task_done)

    def task_done(self, task: asyncio.Task[Any]) -> None:
        """A task that asked ended: the last one to ask, cancelled, cancels the run. (Not
        one that returned: asyncio.wait_for runs each ask in a task of its own before 3.12.)"""
        if task is self.asker and task.cancelled():
            self.abandon()

    def abandon(self) -> None:
        """The consumer is gone: a run still going is cancelled; an ended or unstarted one
        is left as it is (its signal may be shared with other runs)."""
        if self.thread.ident is not None and not self.ended:
            self.cancel()

    def cancel(self) -> None:
        """Sets the run's signal; the thread stops waiting for the consumer."""
        self.cancelled = True
        self.signal.set()
        self.credits.release()  # wakes the thread if it waits for a credit

    def drive(self) -> None:
        """The run's thread: one credit per event taken from the run; the outcome last."""
        try:
            while True:
                while not self.cancelled and not self.credits.acquire(timeout=LOOP_CHECK_SECONDS):
                    if self.loop.is_closed():  # the program went on without asking for more
                        self.cancel()
                try:
                    event = next(self.run)
                except StopIteration as done:
                    result = done.value
                    break
                if not self.cancelled and not self.post(("event", event)):
                    self.cancel()  # the event loop was closed: nobody asks for more
            if not isinstance(result, al.RunResult):
                raise TypeError(
                    f"the run's generator must return a RunResult, got {type(result).__name__}"
                )
            outcome: _Item = ("result", result)
        except BaseException as error:  # the consumer raises it, in its task
            outcome = ("error", error)
        # Kept here before it is posted: a consumer whose wait for it was cancelled (anyio
        # cancels every await again) still reads it, through `result`.
        self.outcome = cast(Union[al.RunResult, BaseException], outcome[1])
        self.ended = True
        self.post(outcome)

    def post(self, item: _Item) -> bool:
        """Hands an item to the event loop's queue; False once the loop is closed."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the event loop was closed, so nobody is left to read it
            return False
        return True
