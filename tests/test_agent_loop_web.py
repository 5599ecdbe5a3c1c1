"""agent_loop_async.sse() behind a real web server: Starlette served by uvicorn, read by httpx.

``tox -e web`` installs them; elsewhere these tests skip, unless ``AGENT_LOOP_REQUIRE_WEB=1``
(set by that env) turns the skip into a failure. The server runs in a thread of this
process (so that the test sees the run's thread and its result), on 127.0.0.1 and a port
the system picked, and is stopped whatever happens. The client streams with httpx and
reads the events with the project's own event-stream reader. The only timed assertion is
the stated bound on a cancelled run's end (docs/many-runs.md), generous here.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any, Iterator, List

import pytest

import agent_loop as al
import agent_loop_async as aio
from agent_loop_providers import ServerSentEvents
from test_agent_loop_async import CANCEL_BOUND, WAIT, Waiting, chatty_run

try:
    import httpx
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, Response, StreamingResponse
    from starlette.routing import Route
except ImportError:  # the default envs
    HAS_WEB = False
else:
    HAS_WEB = True

_REQUIRED = os.environ.get("AGENT_LOOP_REQUIRE_WEB") == "1"


def run_threads() -> List[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "agent_loop_async"]


class Served:
    """The app's runs, as the endpoint made them, and the server's address."""

    def __init__(self) -> None:
        self.url = ""
        self.bodies: List[aio.EventStreamBody] = []
        self.waiting: List[Waiting] = []

    async def chatty(self, request: Request) -> Response:
        """A run that streams its answer to the end."""
        signal = threading.Event()
        self.bodies.append(aio.sse(chatty_run(signal, chunks=5), signal))
        return StreamingResponse(self.bodies[-1], media_type="text/event-stream")

    async def wait(self, request: Request) -> Response:
        """A run whose tool works until its signal is set."""
        signal = threading.Event()
        self.waiting.append(Waiting(signal))
        self.bodies.append(aio.sse(self.waiting[-1].run, signal))
        return StreamingResponse(self.bodies[-1], media_type="text/event-stream")


@pytest.fixture
def served() -> Iterator[Served]:
    """uvicorn serving the app in a thread; the test begins once it answers."""
    if not HAS_WEB:
        if _REQUIRED:
            pytest.fail("AGENT_LOOP_REQUIRE_WEB=1 but starlette, uvicorn or httpx is missing")
        pytest.skip("starlette, uvicorn and httpx are not installed: run `tox -e web`")
    state = Served()

    async def ready(request: Request) -> Response:
        return PlainTextResponse("ready")

    routes = [Route("/ready", ready), Route("/chatty", state.chatty), Route("/wait", state.wait)]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))  # a free port, held from now on: no race for it
    state.url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    config = uvicorn.Config(
        Starlette(routes=routes), log_level="warning", lifespan="off", ws="none", http="h11"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, name="uvicorn")
    thread.start()
    try:
        deadline = time.monotonic() + WAIT
        while not answers(state.url + "/ready"):
            assert thread.is_alive(), "uvicorn exited before it answered"
            assert time.monotonic() < deadline, f"uvicorn did not answer within {WAIT:.0f} s"
            time.sleep(0.05)
        yield state
    finally:
        server.should_exit = True
        thread.join(WAIT)
        listener.close()
        assert not thread.is_alive(), "uvicorn did not stop"
    assert run_threads() == []


def answers(url: str) -> bool:
    try:
        return bool(httpx.get(url, timeout=1.0).status_code == 200)
    except httpx.TransportError:
        return False


def read_events(chunks: Iterator[bytes], until: str = "") -> List[Any]:
    """The events of an event stream, read with the project's reader (to `until`, if given)."""
    reader = ServerSentEvents()
    events: List[Any] = []
    for chunk in chunks:
        events += reader.feed(chunk)
        if until and any(event.event == until for event in events):
            break
    return events


class TestStarletteUvicornHttpx:
    def test_a_client_that_reads_every_event_gets_the_runs_events(self, served: Served) -> None:
        expected_events, expected = al.settle_run(chatty_run(threading.Event(), chunks=5))
        with httpx.stream("GET", served.url + "/chatty", timeout=WAIT) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            raw = b"".join(response.iter_bytes())
        events = read_events(iter([raw]))
        assert [event.event for event in events] == [e.type for e in expected_events]
        received = [al.event_from_dict(json.loads(event.data)) for event in events]
        assert received == expected_events
        ids = [line for line in raw.decode().split("\n") if line.startswith("id: ")]
        assert ids == [f"id: {e.sequence}" for e in expected_events]
        assert received[-1].payload["result"] == expected  # run.finished carries the result
        assert served.bodies[0].result == expected

    def test_a_client_that_leaves_midway_cancels_the_run_within_the_bound(
        self, served: Served
    ) -> None:
        with httpx.stream("GET", served.url + "/wait", timeout=WAIT) as response:
            events = read_events(response.iter_bytes(), until="tool.started")
        # Leaving the `with` closed the response, and its connection, before its end.
        began = time.monotonic()
        assert [event.event for event in events][-2:] == ["model.chunk", "tool.started"]
        for thread in run_threads():
            thread.join(CANCEL_BOUND)
        assert time.monotonic() - began < CANCEL_BOUND
        assert run_threads() == []  # the run's thread is gone
        (waiting,) = served.waiting
        assert waiting.stopped.is_set()  # its tool saw the signal
        result = served.bodies[0].result  # and its result is kept
        assert result.status == "cancelled"
        assert al.open_tool_calls(result.messages) == (al.ToolCall("call-1", "wait", {}),)
        assert waiting.model.call_count == 1
