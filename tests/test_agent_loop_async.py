"""Tests for agent_loop_async.arun: a run's events in an asyncio program.

The runs are run_agent_loop() with the shipped ScriptedModel (the llmock tests are in
test_many_runs_llmock.py). Each test is one asyncio.run(). No assertion is about time
except the stated bound on cancellation (CANCEL_BOUND, far above the loop's own); a wait
for another thread is bounded by WAIT, so that a broken hand-off fails instead of hanging.

Contents
    TestOptions: arun's arguments, checked at call time
    TestEvents: in order, the result once they end, back-pressure, what the run raises
    TestCancellation: the iterating task cancelled, aclose, async with, a dropped iterator
    TestManyRuns: many runs at once in one event loop
    TestServerSentEvents: sse()'s framing (a client that leaves: test_agent_loop_web.py, and
        the asyncio streams server of docs/many-runs.md)
"""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import time
from typing import Any, Callable, Dict, Generator, Iterator, List, Optional, Tuple, cast

import pytest

import agent_loop as al
import agent_loop_async as aio
from agent_loop_providers import ServerSentEvents
from agent_loop_replay import json_line, passed_on

WAIT: float = 10.0
CANCEL_BOUND: float = 5.0  # seconds; the loop's own bound is a check after every event


def chatty_run(
    signal: threading.Event, chunks: int = 30
) -> Generator[al.Event, None, al.RunResult]:
    """A run whose one answer streams `chunks` text chunks."""
    blocks = [al.TextBlock(f"w{n} ") for n in range(chunks)]
    model = al.ScriptedModel(
        [
            al.scripted_response(
                "response-001",
                [al.TextBlock("".join(b.text for b in blocks))],
                "stop",
                chunks=blocks,
            )
        ]
    )
    return al.run_agent_loop(
        messages=[al.UserMessage("user-001", "Talk.")],
        model=model,
        tools=al.ToolRegistry(),
        max_steps=1,
        signal=signal,
    )


class Waiting:
    """A run whose model calls the tool `wait`, which waits for the run's signal."""

    def __init__(self, signal: threading.Event) -> None:
        self.started = threading.Event()
        self.stopped = threading.Event()  # the tool saw the signal
        self.returns = threading.Event()  # once it saw the signal, it returns when this is set
        self.returns.set()
        self.model = al.ScriptedModel(
            [
                al.scripted_response(
                    "response-001",
                    [al.TextBlock("Waiting."), al.ToolCall("call-1", "wait", {})],
                    "toolCall",
                ),
                al.scripted_response("response-002", [al.TextBlock("Done.")], "stop"),
            ]
        )

        def execute(arguments: Dict[str, Any], tool_signal: al.Signal) -> object:
            self.started.set()
            if tool_signal.wait(WAIT):
                self.stopped.set()
            self.returns.wait(WAIT)
            return "woke"

        self.run = al.run_agent_loop(
            messages=[al.UserMessage("user-001", "Wait.")],
            model=self.model,
            tools=al.ToolRegistry([al.Tool("wait", "Waits.", {"type": "object"}, execute)]),
            max_steps=2,
            signal=signal,
        )


async def until(flag: threading.Event) -> None:
    """Waits for a flag that another thread sets (at most WAIT seconds)."""
    await until_true(flag.is_set)


async def until_true(check: Callable[[], bool]) -> None:
    """Waits until `check()` is true, giving the event loop's other tasks their turns (at
    most WAIT seconds)."""
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.001)


def run_threads() -> List[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "agent_loop_async"]


@pytest.fixture(autouse=True)
def no_thread_left() -> Iterator[None]:
    yield
    assert run_threads() == []


class TestOptions:
    def test_run_must_be_a_generator(self) -> None:
        with pytest.raises(TypeError, match="run must be a run's generator, got list"):
            aio.arun([], threading.Event())  # type: ignore[arg-type]

    def test_signal_must_be_settable(self) -> None:
        class ReadOnly:
            def is_set(self) -> bool:
                return False

            def wait(self, timeout: Optional[float] = None) -> bool:
                return False

        signal = threading.Event()
        with pytest.raises(TypeError, match=r"is_set\(\), wait\(\) and set\(\)\), got ReadOnly"):
            aio.arun(chatty_run(signal), ReadOnly())  # type: ignore[arg-type]


class TestEvents:
    def test_the_events_in_order_then_the_result(self) -> None:
        expected_events, expected = al.settle_run(chatty_run(threading.Event()))

        async def main() -> Tuple[List[al.Event], al.RunResult]:
            signal = threading.Event()
            events = [event async for event in aio.arun(chatty_run(signal), signal)]
            run = aio.arun(chatty_run(signal), signal)
            async for _ in run:
                pass
            return events, run.result

        events, result = asyncio.run(main())
        assert [e.to_dict() for e in events] == [e.to_dict() for e in expected_events]
        assert result == expected
        assert result.status == "completed"

    def test_reading_result_before_the_events_end_raises(self) -> None:
        async def main() -> None:
            signal = threading.Event()
            run = aio.arun(chatty_run(signal), signal)
            with pytest.raises(asyncio.InvalidStateError, match="have not ended"):
                _ = run.result
            await run.__anext__()
            with pytest.raises(asyncio.InvalidStateError, match="after the async for loop"):
                _ = run.result
            async for _ in run:
                pass
            assert run.result.status == "completed"
            with pytest.raises(StopAsyncIteration):  # and it stays ended
                await run.__anext__()

        asyncio.run(main())

    @pytest.mark.parametrize(
        "loop_check_seconds",
        [
            pytest.param(aio.LOOP_CHECK_SECONDS, id="as-shipped"),
            # The thread then finds the event loop open each time it finds no credit.
            pytest.param(0.0, id="looking-at-the-open-loop-at-every-wait"),
        ],
    )
    def test_a_slow_consumer_holds_the_run_back(
        self, monkeypatch: pytest.MonkeyPatch, loop_check_seconds: float
    ) -> None:
        """The run is never more than EVENTS_AHEAD events ahead of what the consumer has
        received, and while the consumer holds an event it gets one fewer."""
        monkeypatch.setattr(aio, "LOOP_CHECK_SECONDS", loop_check_seconds)
        produced = [0]
        consumed = [0]
        leads: List[int] = []
        total = 32  # message.accepted, 30 chunks, run.finished

        def take() -> None:
            produced[0] += 1
            leads.append(produced[0] - consumed[0])

        async def main() -> None:
            signal = threading.Event()
            async for _ in aio.arun(passed_on(chatty_run(signal), lambda _: take()), signal):
                consumed[0] += 1
                deadline = time.monotonic() + WAIT
                # The consumer is slow: it waits until the run has gone as far as it may.
                while produced[0] < min(total, consumed[0] + aio.EVENTS_AHEAD - 1):
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.001)

        asyncio.run(main())
        assert produced[0] == consumed[0] == total
        assert aio.EVENTS_AHEAD - 1 <= max(leads) <= aio.EVENTS_AHEAD

    def test_what_the_run_raises_comes_after_its_events(self) -> None:
        def raising(signal: threading.Event) -> Iterator[al.Event]:
            yield from al.settle_run(chatty_run(signal, chunks=1))[0][:2]
            raise OSError("the journal's disk is full")

        async def main() -> None:
            signal = threading.Event()
            run = aio.arun(raising(signal), signal)
            types = [(await run.__anext__()).type, (await run.__anext__()).type]
            assert types == ["message.accepted", "model.chunk"]
            with pytest.raises(OSError, match="disk is full"):
                await run.__anext__()
            with pytest.raises(
                asyncio.InvalidStateError, match="the run raised OSError"
            ) as raised:
                _ = run.result
            assert isinstance(raised.value.__cause__, OSError)
            await run.aclose()  # nothing left to close

        asyncio.run(main())

    def test_a_generator_that_returns_no_result_is_a_type_error(self) -> None:
        def no_result() -> Iterator[al.Event]:
            yield from ()

        async def main() -> None:
            signal = threading.Event()
            with pytest.raises(TypeError, match="must return a RunResult, got NoneType"):
                async for _ in aio.arun(no_result(), signal):
                    pass

        asyncio.run(main())


class TestCancellation:
    @pytest.mark.parametrize(
        "where",
        [
            # asyncio's one cancellation: the task waits for the run, then is done.
            "in-anext-once",
            # anyio's (Starlette's): cancelled again while it waits for the run to end.
            "in-anext-then-again",
            # A slow consumer's own await (`await writer.drain()`), between two events.
            "in-the-loop-body",
        ],
    )
    def test_the_result_is_kept_however_the_task_is_cancelled(self, where: str) -> None:
        signal = threading.Event()
        waiting = Waiting(signal)
        if where != "in-anext-once":
            waiting.returns.clear()  # the tool is slow to return: the task ends first
        seen: List[str] = []
        run = aio.arun(waiting.run, signal)

        async def consume() -> None:
            async for event in run:
                seen.append(event.type)
                if where == "in-the-loop-body" and event.type == "tool.started":
                    # Never set: the consumer's own slow await, which the test cancels.
                    await asyncio.Event().wait()

        async def main() -> float:
            task = asyncio.ensure_future(consume())
            await until(waiting.started)
            # The tool runs, so tool.started is handed over; the consumer takes it in its
            # own turn of the event loop, which may come after this one.
            await until_true(lambda: "tool.started" in seen)
            began = time.monotonic()
            task.cancel()
            if where == "in-anext-then-again":
                await until(signal)  # the task waits for the run (in the same step as set)
                task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            if where == "in-anext-once":  # the task is done: the thread is gone
                assert run_threads() == []
                return time.monotonic() - began
            await until(signal)  # set by the cancel, or by the task's end (its body)
            with pytest.raises(asyncio.InvalidStateError, match="have not ended"):
                _ = run.result  # the run has not ended yet: its tool is still returning
            waiting.returns.set()
            began = time.monotonic()
            for thread in run_threads():
                thread.join(WAIT)
            assert run.result.status == "cancelled"  # kept by its thread, nobody waited
            with pytest.raises(StopAsyncIteration):  # and asking again drops what is left
                await run.__anext__()
            return time.monotonic() - began

        assert asyncio.run(main()) < CANCEL_BOUND
        assert waiting.stopped.is_set()
        assert run.result.status == "cancelled"
        assert waiting.model.call_count == 1  # no request after the cancellation
        assert al.open_tool_calls(run.result.messages) == (al.ToolCall("call-1", "wait", {}),)
        assert seen[-1] == "tool.started"

    def test_aclose_cancels_and_waits_and_is_idempotent(self) -> None:
        signal = threading.Event()
        waiting = Waiting(signal)

        async def main() -> al.RunResult:
            run = aio.arun(waiting.run, signal)
            async for event in run:
                if event.type == "tool.started":
                    await until(waiting.started)  # the tool runs, and will see the signal
                    break
            await run.aclose()
            assert run_threads() == []
            await run.aclose()
            return run.result

        assert asyncio.run(main()).status == "cancelled"
        assert waiting.stopped.is_set()

    def test_aclose_drops_the_events_still_handed_over(self) -> None:
        signal = threading.Event()
        taken = [0]

        def take() -> None:
            taken[0] += 1  # the thread handed the event before this one over

        async def main() -> al.RunResult:
            run = aio.arun(passed_on(chatty_run(signal), lambda _: take()), signal)
            await run.__anext__()
            deadline = time.monotonic() + WAIT
            while taken[0] < 4:  # events 2 and 3 handed over, and not asked for
                assert time.monotonic() < deadline
                await asyncio.sleep(0.001)
            await run.aclose()
            return run.result

        assert asyncio.run(main()).status == "cancelled"

    def test_async_with_closes_the_run(self) -> None:
        signal = threading.Event()
        waiting = Waiting(signal)

        async def main() -> aio.AsyncRun:
            async with aio.arun(waiting.run, signal) as run:
                async for event in run:
                    if event.type == "tool.started":
                        await until(waiting.started)
                        break
            return run

        assert asyncio.run(main()).result.status == "cancelled"
        assert waiting.stopped.is_set()

    def test_aclose_before_the_first_event_ends_the_run_cancelled(self) -> None:
        signal = threading.Event()
        waiting = Waiting(signal)

        async def main() -> al.RunResult:
            run = aio.arun(waiting.run, signal)
            await run.aclose()
            return run.result

        result = asyncio.run(main())
        assert result.status == "cancelled"
        assert result.steps == 0
        assert waiting.model.call_count == 0

    def test_a_dropped_iterator_cancels_its_run(self) -> None:
        signal = threading.Event()
        waiting = Waiting(signal)

        async def main() -> None:
            async for event in aio.arun(waiting.run, signal):
                if event.type == "tool.started":
                    await until(waiting.started)  # the tool runs, and will see the signal
                    break  # the AsyncRun is dropped here, unfinished

        asyncio.run(main())
        gc.collect()
        assert signal.is_set()
        assert waiting.stopped.wait(WAIT)
        for thread in run_threads():  # it ends on its own, the event loop being closed
            thread.join(WAIT)

    def test_an_event_loop_closed_with_the_run_unfinished_cancels_it(self) -> None:
        signal = threading.Event()
        kept: List[aio.AsyncRun] = []

        async def main() -> None:
            run = aio.arun(chatty_run(signal), signal)
            kept.append(run)  # still referenced: only the closed event loop tells
            await run.__anext__()
            # Every credit used and its event handed over: the thread waits for a credit,
            # and only its check of the event loop can tell that the loop is closed.
            deadline = time.monotonic() + WAIT
            while cast(Any, run)._queue.qsize() < aio.EVENTS_AHEAD - 1:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.001)

        asyncio.run(main())  # returns with 31 events not asked for
        for thread in run_threads():
            thread.join(WAIT)
            assert not thread.is_alive()
        assert signal.is_set()

    def test_an_event_loop_closed_while_the_run_has_credits_cancels_it_at_once(self) -> None:
        """The thread learns that the loop is closed from the first event it cannot hand
        over, not only once it has used up its credits: the run's tool never runs."""
        signal = threading.Event()
        gate = threading.Event()
        ran = threading.Event()
        call = al.ToolCall("call-1", "act", {})

        class Gated:
            def stream(self, request: al.ModelRequest, signal: al.Signal) -> Any:
                gate.wait(WAIT)  # until the event loop is closed
                yield al.ToolCallChunk(request.id, call)
                return al.ModelResponse("response-001", request.id, (call,), "toolCall")

        def act(arguments: Dict[str, Any], tool_signal: al.Signal) -> object:
            ran.set()
            return "acted"

        kept: List[aio.AsyncRun] = []

        async def main() -> None:
            run = aio.arun(
                al.run_agent_loop(
                    messages=[al.UserMessage("user-001", "Act.")],
                    model=Gated(),
                    tools=al.ToolRegistry([al.Tool("act", "Acts.", {"type": "object"}, act)]),
                    max_steps=1,
                    signal=signal,
                ),
                signal,
            )
            kept.append(run)  # still referenced: only the closed event loop tells
            await run.__anext__()  # message.accepted; the thread has credits left

        asyncio.run(main())
        gate.set()
        for thread in run_threads():
            thread.join(WAIT)
            assert not thread.is_alive()
        assert signal.is_set()
        assert not ran.is_set()

    def test_a_dropped_iterator_that_ended_leaves_its_signal_alone(self) -> None:
        signal = threading.Event()  # say, shared with other runs

        async def main() -> None:
            async for _ in aio.arun(chatty_run(signal), signal):
                pass

        asyncio.run(main())
        gc.collect()
        assert not signal.is_set()

    def test_a_dropped_iterator_never_started_runs_nothing(self) -> None:
        signal = threading.Event()
        waiting = Waiting(signal)
        aio.arun(waiting.run, signal)
        gc.collect()
        assert not signal.is_set()
        assert waiting.model.call_count == 0


class TestManyRuns:
    def test_fifty_runs_at_once_in_one_event_loop(self) -> None:
        async def one(number: int) -> al.RunResult:
            signal = threading.Event()
            run = aio.arun(chatty_run(signal, chunks=number % 7 + 1), signal)
            count = 0
            async for _ in run:
                count += 1
            assert count == number % 7 + 3
            return run.result

        async def main() -> List[al.RunResult]:
            return list(await asyncio.gather(*(one(n) for n in range(50))))

        results = asyncio.run(main())
        assert [r.status for r in results] == ["completed"] * 50


class TestServerSentEvents:
    """sse(): a run's events as server-sent events."""

    def test_each_event_is_framed_with_its_type_sequence_and_json_line(self) -> None:
        expected_events, expected = al.settle_run(chatty_run(threading.Event(), chunks=3))

        async def main() -> Tuple[bytes, aio.EventStreamBody]:
            signal = threading.Event()
            body = aio.sse(chatty_run(signal, chunks=3), signal)
            streamed = b"".join([chunk async for chunk in body])
            await body.aclose()  # ended: nothing to close
            return streamed, body

        streamed, body = asyncio.run(main())
        assert streamed == b"".join(
            f"event: {e.type}\nid: {e.sequence}\ndata: {json_line(e.to_dict())}\n\n".encode()
            for e in expected_events
        )
        # The project's own event-stream reader reads it back: the last carries the result.
        parsed = ServerSentEvents().feed(streamed)
        assert [(p.event, al.event_from_dict(json.loads(p.data))) for p in parsed] == [
            (e.type, e) for e in expected_events
        ]
        assert body.result == expected
