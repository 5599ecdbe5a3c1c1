# agent_loop_async.py 1.0.0: an asyncio face on a run of agent_loop.py.
# One file, standard library only; copy it next to agent_loop.py. Home: the agent_loop repository.
"""``async for event in arun(run, signal)``: a run's events in an asyncio program.

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
   over, or ``aclose()`` returned); before that it raises ``asyncio.InvalidStateError``.
4. Cancelling the task that iterates, ``aclose()``, leaving ``async with``, dropping the
   object, and closing the event loop with the run unfinished each set ``signal``. The
   run then ends on its own rule (within the loop's bound; a tool ends when it returns),
   its remaining events are dropped, and its thread ends. A cancelled ``__anext__`` and
   ``aclose()`` wait for that, so once the task is done the thread is gone and
   ``result`` is the run's (``cancelled``, unless it ended first); the thread is never a
   daemon.
5. An exception that the run raises (not a ``failed`` result: a ``JournalError``, a
   ``KeyboardInterrupt`` from a tool) comes out of the ``__anext__`` after the events
   before it, and ``result`` then raises ``asyncio.InvalidStateError`` from it.

It uses only agent_loop's public names.
"""

from __future__ import annotations

import asyncio
import collections.abc
import threading
import weakref
from typing import Any, Final, Iterator, Optional, Tuple, Type, Union, cast

import agent_loop as al

__version__ = "1.0.0"

__all__ = ["AsyncRun", "EVENTS_AHEAD", "LOOP_CHECK_SECONDS", "arun"]

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
        if isinstance(self._outcome, al.RunResult):
            return self._outcome
        if self._outcome is None:
            raise asyncio.InvalidStateError(
                "the run's events have not ended: read result after the async for loop "
                "(or after aclose())"
            )
        raise asyncio.InvalidStateError(
            f"the run raised {type(self._outcome).__name__}: it has no result"
        ) from self._outcome

    def __aiter__(self) -> AsyncRun:
        return self

    async def __anext__(self) -> al.Event:
        """The next event; StopAsyncIteration once the run has ended."""
        if self._outcome is not None:
            raise StopAsyncIteration
        queue = self._start()
        if self._asked:
            self._handoff.credits.release()  # the consumer is done with the last event
        self._asked = True
        try:
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
        ``result``.
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
        """The run was cancelled: drops its events until its outcome, then joins its thread."""
        while True:
            kind, value = await queue.get()
            if kind != "event":
                self._end(value)
                return

    def _end(self, outcome: Union[al.Event, al.RunResult, BaseException]) -> None:
        """The run's outcome came: keep it; the thread posted it last, so it ends now."""
        self._outcome = cast(Union[al.RunResult, BaseException], outcome)
        self._handoff.thread.join()


class _Handoff:
    """The run's thread and the bounded hand-off of its events to the event loop."""

    def __init__(self, run: Iterator[al.Event], signal: threading.Event) -> None:
        self.run = run
        self.signal = signal
        self.credits = threading.Semaphore(EVENTS_AHEAD)
        self.cancelled = False
        self.ended = False
        self.thread = threading.Thread(target=self.drive, name="agent_loop_async")

    def start(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[_Item]) -> None:
        """Starts the run's thread, which hands its items to `queue` on `loop`."""
        self.loop = loop
        self.queue = queue
        self.thread.start()

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
        self.ended = True
        self.post(outcome)

    def post(self, item: _Item) -> bool:
        """Hands an item to the event loop's queue; False once the loop is closed."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the event loop was closed, so nobody is left to read it
            return False
        return True
