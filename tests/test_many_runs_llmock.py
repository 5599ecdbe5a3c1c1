"""Many runs against llmock 0.2.2: agent_loop_batch.run_many and agent_loop_async.arun.

Marked ``llmock``: they skip where llmock is not importable (it needs Python >= 3.10),
unless ``AGENT_LOOP_REQUIRE_LLMOCK=1`` (tox's llmock env) makes the skip a failure. The
server is the one the provider tests start (test_agent_loop_providers_connection.py's
``llmock_process``: 127.0.0.1, a free port, stopped whatever happens). llmock's own
"auto" tool mode answers each run: a request that offers tools and holds no tool result
calls a tool, the next one answers in text, so every run takes two steps; two tests make
llmock hold every first token for 30 s, and stop the runs (a batch's signal, a cancelled
task) within STOP_BOUND.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, Dict, Generator, List

import pytest

import agent_loop as al
import agent_loop_async as aio
import agent_loop_batch as batch
import agent_loop_providers as providers
from test_agent_loop_providers_connection import LLMock, llmock_process  # noqa: F401

pytestmark = pytest.mark.llmock

STOP_BOUND: float = 5.0  # seconds: the adapters end a request within 0.25 s of the signal


def lookup(city: str) -> str:
    """Looks up the weather in a city."""
    return f"Snow in {city}."


def weather_run(
    model: al.Model, number: int, signal: threading.Event
) -> Generator[al.Event, None, al.RunResult]:
    return al.run_agent_loop(
        messages=[al.UserMessage("user-001", f"Weather number {number}, please: look it up.")],
        model=model,
        tools=al.ToolRegistry([al.Tool.from_function(lookup)]),
        max_steps=2,
        signal=signal,
    )


@pytest.fixture
def shared_model(llmock_process: LLMock) -> providers.OpenAIChatModel:  # noqa: F811
    """One model object for every run of a test, as a batch shares it."""
    llmock_process.admin("POST", "/_llmock/reset", {})
    return providers.OpenAIChatModel(
        "gpt-4o", base_url=llmock_process.url + "/v1", api_key="", timeout=10.0, retries=0
    )


def test_run_many_runs_forty_runs_eight_at_once(
    shared_model: providers.OpenAIChatModel,
    llmock_process: LLMock,  # noqa: F811
) -> None:
    ended: List[str] = []

    def make_run(number: int, signal: threading.Event) -> Generator[al.Event, None, al.RunResult]:
        return weather_run(shared_model, number, signal)

    def progress(number: int, result: object) -> None:
        ended.append(getattr(result, "status", repr(result)))

    results = batch.run_many(make_run, range(40), concurrency=8, progress=progress)
    assert [(r.status, r.steps) for r in results] == [("completed", 2)] * 40, [
        r.error for r in results if r.error is not None
    ]
    assert ended == ["completed"] * 40
    # Each run's transcript is its own: its prompt, and its tool's answer.
    for number, result in enumerate(results):
        first = result.messages[0]
        assert isinstance(first, al.UserMessage)
        assert first.content.startswith(f"Weather number {number},")
        assert "Snow in" in result.messages[2].content
    assert len(llmock_process.admin("GET", "/_llmock/requests")["requests"]) == 80


def test_arun_runs_twenty_runs_at_once_in_one_event_loop(
    shared_model: providers.OpenAIChatModel,
) -> None:
    async def one(number: int) -> Dict[str, Any]:
        signal = threading.Event()
        run = aio.arun(weather_run(shared_model, number, signal), signal)
        types = [event.type async for event in run]
        return {"types": types, "result": run.result}

    async def main() -> List[Dict[str, Any]]:
        return list(await asyncio.gather(*(one(n) for n in range(20))))

    outcomes = asyncio.run(main())
    for outcome in outcomes:
        result = outcome["result"]
        assert (result.status, result.steps) == ("completed", 2), result.error
        assert outcome["types"][0] == "message.accepted"
        assert outcome["types"].count("tool.finished") == 1
        assert outcome["types"][-1] == "run.finished"


class Announcing:
    """The shared model, announcing each answer it begins to stream."""

    def __init__(self, model: al.Model, began: Callable[[], None]) -> None:
        self.model = model
        self.began = began

    def stream(
        self, request: al.ModelRequest, signal: al.Signal
    ) -> Generator[al.ModelChunk, None, al.ModelResponse]:
        self.began()
        return self.model.stream(request, signal)


def test_a_stopped_batch_ends_while_llmock_holds_every_answer(
    shared_model: providers.OpenAIChatModel,
    llmock_process: LLMock,  # noqa: F811
) -> None:
    """llmock holds each first token for 30 s; the batch's signal ends it far sooner."""
    llmock_process.admin(
        "POST",
        "/_llmock/scenario",
        {"behaviors": [{"type": "slow_first_token", "seconds": 30, "times": None}]},
    )
    stop = threading.Event()
    lock = threading.Lock()
    began: List[float] = []

    def announce() -> None:
        with lock:
            began.append(time.monotonic())
            if len(began) == 2:  # both runs are waiting for their first token
                stop.set()

    model = Announcing(shared_model, announce)

    def make_run(number: int, signal: threading.Event) -> Generator[al.Event, None, al.RunResult]:
        return weather_run(model, number, signal)

    with pytest.raises(batch.BatchInterrupted) as raised:
        batch.run_many(make_run, range(4), concurrency=2, progress=False, signal=stop)
    assert time.monotonic() - began[1] < STOP_BOUND
    results = raised.value.results
    assert [(r.status, r.steps) if r else None for r in results[:2]] == [("cancelled", 1)] * 2
    assert results[2:] == [None, None]  # never begun


def test_a_cancelled_task_ends_its_run_while_llmock_holds_the_answer(
    shared_model: providers.OpenAIChatModel,
    llmock_process: LLMock,  # noqa: F811
) -> None:
    llmock_process.admin(
        "POST", "/_llmock/scenario", {"behaviors": [{"type": "slow_first_token", "seconds": 30}]}
    )
    began = threading.Event()
    signal = threading.Event()
    run = aio.arun(weather_run(Announcing(shared_model, began.set), 0, signal), signal)

    async def consume() -> None:
        async for _ in run:
            pass

    async def main() -> float:
        task = asyncio.ensure_future(consume())
        deadline = time.monotonic() + STOP_BOUND
        while not began.is_set():  # the model is asked (a test that fails, not one that hangs)
            assert time.monotonic() < deadline
            await asyncio.sleep(0.001)
        cancelled_at = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - cancelled_at

    assert asyncio.run(main()) < STOP_BOUND
    assert (run.result.status, run.result.steps) == ("cancelled", 1)
    assert [t for t in threading.enumerate() if t.name == "agent_loop_async"] == []
