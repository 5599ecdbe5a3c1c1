"""Tests of agent_loop_providers.py through a socket or a process: the default transport.

The layer tested here is the default transport (``transport=None``: the socket, the
timeout, the cancellation watch) under the socket loop's retries. What needs a socket
(connecting, timeouts, cancellation, TLS, retries over the network, HTTP failures,
closing) runs against loop_testing_providers' fixture server (a local ``http.server`` on 127.0.0.1
and a free port, in a thread, started and stopped whatever happens), plain or TLS with a
CA and certificates that the ``openssl`` command makes at test time (a missing openssl
fails the TLS tests). Integration tests, marked ``llmock``, run both adapters through
``run_agent_loop`` against an ``llmock serve`` subprocess; they skip where llmock is not
importable, unless ``AGENT_LOOP_REQUIRE_LLMOCK=1`` (set by tox's llmock env) turns the
skip into a failure. No test reaches beyond 127.0.0.1. The wire formats themselves are
tested in test_agent_loop_providers.py and test_agent_loop_providers_failures.py, the
retry rule on canned exchanges in test_agent_loop_providers_retries.py, the command line
in test_agent_loop_cli.py; the builders these files use, and the fixture
server, are in loop_testing_providers.py.
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import importlib.util
import json
import logging
import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import (
    Any,
    Callable,
    ContextManager,
    Dict,
    Iterator,
    List,
    Optional,
    Tuple,
)

import pytest

import agent_loop as al
import agent_loop_providers as providers
from loop_testing_providers import (
    DONE,
    OPENAI_TEXT_STREAM,
    OPENAI_TOOL_STREAM,
    PROVIDERS,
    REQUEST_HISTORY,
    ROLE,
    SERVER_BOUND,
    SPECS,
    STOP,
    AnyModel,
    Hurried,
    Reply,
    Server,
    answer_parts,
    anthropic_sent_result,
    assert_stream_error,
    backoff_bounds,
    canned_openai,
    chunk_texts,
    eventually,
    free_port,
    in_pieces,
    logged_delay,
    openai_chunk,
    posted,
    request,
    retry_logs,
    server_process,
    serving,
    settle_prompt,
    stream,
)

_WATCHER = "agent_loop_providers watch"
_BOUND = 10.0
"""Seconds any wait in a test may last at most: nothing hangs."""


# --- The fixture server (loop_testing_providers.serving) -------------------------------


@pytest.fixture
def server() -> Iterator[Server]:
    with serving() as state:
        yield state


def _watchers_end() -> bool:
    """True once no watcher thread is left (each ends within 50 ms of its stream; the
    generous bound also covers watchers of earlier tests and a loaded machine)."""
    return eventually(
        lambda: not any(thread.name == _WATCHER for thread in threading.enumerate()),
        SERVER_BOUND,
    )


# --- Builders -----------------------------------------------------------------------


def failure(
    model: al.Model, model_request: Optional[al.ModelRequest] = None
) -> providers.ProviderError:
    """The ProviderError that one model stream raises."""
    with pytest.raises(providers.ProviderError) as caught:
        stream(model, model_request)
    return caught.value


def openai(server: Server, **arguments: Any) -> providers.OpenAIChatModel:
    arguments.setdefault("timeout", 0.5)
    arguments.setdefault("retries", 0)  # the retry tests set their own
    return providers.OpenAIChatModel("test-model", base_url=server.url + "/v1", **arguments)


def anthropic(server: Server, **arguments: Any) -> providers.AnthropicMessagesModel:
    arguments.setdefault("timeout", 0.5)
    arguments.setdefault("retries", 0)
    return providers.AnthropicMessagesModel("test-model", base_url=server.url, **arguments)


def served(provider: str, server: Server, **arguments: Any) -> AnyModel:
    """The provider's model for the fixture server."""
    if provider == "openai":
        return openai(server, **arguments)
    return anthropic(server, **arguments)


def cancelled_within(
    model: al.Model, delay: float = 0.2, after: Callable[[], bool] = lambda: True
) -> float:
    """Runs model, sets the signal delay after after() holds; the seconds the run then took."""
    signal = threading.Event()
    set_at: List[float] = []

    def cancel() -> None:
        assert eventually(after)
        time.sleep(delay)
        set_at.append(time.monotonic())
        signal.set()

    canceller = threading.Thread(target=cancel)
    canceller.start()
    _, result = settle_prompt(model, signal=signal)
    ended = time.monotonic()
    canceller.join(_BOUND)
    assert result.status == "cancelled", result.error
    return ended - set_at[0]


# --- The exchange: a request and an answer through the socket -----------------------


class TestExchange:
    """What the wire format makes and reads goes through the socket as it is."""

    def test_what_the_server_receives(self, server: Server) -> None:
        # Through a socket: the path, the headers and the body arrive as posted.
        server.script(Reply([OPENAI_TEXT_STREAM]))
        model = openai(server, api_key="sk-x", options={"temperature": 0})
        stream(model, request(REQUEST_HISTORY, SPECS))
        sent = server.requests[0]
        twin = canned_openai(api_key="sk-x", options={"temperature": 0})  # the same model
        expected = posted(twin, request(REQUEST_HISTORY, SPECS))
        assert sent["path"] == "/v1/chat/completions"
        assert sent["body"] == expected["body"]
        for name, value in expected["headers"].items():
            assert sent["headers"][name] == value
        assert sent["headers"]["host"] == server.url[len("http://") :]

    @PROVIDERS
    def test_the_first_delta_arrives_while_the_server_holds_the_rest(
        self, server: Server, provider: str
    ) -> None:
        parts = answer_parts(provider, ["Hel", "lo"])
        head = parts[:1] if provider == "openai" else parts[:3]
        server.script(Reply(head, stall=True))
        model = served(provider, server, timeout=_BOUND)
        generator = model.stream(request(), threading.Event())
        assert next(generator) == al.TextDelta("request-001", "Hel")
        generator.close()
        assert server.disconnected.wait(_BOUND)


# --- Retries ------------------------------------------------------------------------


CHUNKED = (("Content-Type", "text/event-stream"), ("Transfer-Encoding", "chunked"))
"""The head of a chunked stream whose framing a test writes by hand."""
STREAM = Reply([openai_chunk({"content": "5"}), STOP, DONE])
BUSY = Reply([b"busy"], status=503)


class TestRetries:
    """Transient failures before the first chunk are retried, waiting as the server says."""

    def test_failures_then_success_with_the_backoff_doubling(
        self, server: Server, caplog: pytest.LogCaptureFixture
    ) -> None:
        server.script(Reply([b"{}"], status=500), BUSY, STREAM)
        with caplog.at_level(logging.WARNING):
            _, result = settle_prompt(openai(server, retries=2), signal=Hurried())
        assert (result.status, result.final_text) == ("completed", "5")
        assert len(server.requests) == 3
        first, second = retry_logs(caplog)
        assert first.startswith(
            f"request-001: attempt 1 of 3 failed ({server.url}/v1/chat/completions answered "
            "HTTP 500 Internal Server Error: {} (the server failed on this request: its log "
            "says why)); retrying in "
        )
        assert second.startswith(
            f"request-001: attempt 2 of 3 failed ({server.url}/v1/chat/completions answered "
            "HTTP 503 Service Unavailable: busy); retrying in "
        )
        for retried, line in enumerate([first, second]):
            low, high = backoff_bounds(retried)
            assert low <= logged_delay(line) <= high  # the log rounds to 3 digits

    def test_a_refused_connection_is_retried(self, caplog: pytest.LogCaptureFixture) -> None:
        url = f"http://127.0.0.1:{free_port()}/v1"
        model = providers.OpenAIChatModel("m", base_url=url, retries=2)
        with caplog.at_level(logging.WARNING):
            _, result = settle_prompt(model, signal=Hurried())
        refused = f"[Errno {errno.ECONNREFUSED}] {os.strerror(errno.ECONNREFUSED)}"
        assert_stream_error(
            result,
            f"cannot connect to {url}/chat/completions: ConnectionRefusedError: {refused}",
            "(after 2 retries)",
            kind=providers.ProviderConnectionError,
        )
        assert len(retry_logs(caplog)) == 2

    def test_a_hang_up_before_the_head_is_retried(self, server: Server) -> None:
        server.script(Reply(hang_up=True), STREAM)
        _, result = settle_prompt(openai(server, retries=1), signal=Hurried())
        assert result.status == "completed", result.error

    @pytest.mark.parametrize(
        "broken",
        [
            pytest.param(Reply([b"40\r\ndata: {"], headers=CHUNKED), id="the-connection-breaks"),
            pytest.param(Reply([ROLE], stall=True), id="no-byte-for-the-timeout"),
        ],
    )
    def test_a_stream_that_breaks_after_the_head_before_any_chunk_is_retried(
        self, server: Server, broken: Reply
    ) -> None:
        server.script(broken, STREAM)
        # The timeout also bounds the healthy retry's connection and head: 2 s leaves a
        # loaded machine room for them (the stall waits it out once).
        _, result = settle_prompt(openai(server, retries=1, timeout=2.0), signal=Hurried())
        assert (result.status, result.final_text) == ("completed", "5"), result.error
        assert len(server.requests) == 2

    @pytest.mark.parametrize(
        ("broken", "timeout", "words"),
        [
            # No attempt waits for the timeout here; it only bounds each head, so it is
            # generous: a head later than 0.3 s on a loaded machine said "sent nothing".
            pytest.param(
                Reply([b"40\r\ndata: {"], headers=CHUNKED),
                2.0,
                "broke: IncompleteRead",
                id="the-connection-breaks",
            ),
            pytest.param(
                Reply([ROLE], stall=True),
                0.3,
                "sent nothing for 0.3 s",
                id="no-byte-for-the-timeout",
            ),
        ],
    )
    def test_a_stream_that_breaks_before_any_chunk_fails_once_the_retries_are_spent(
        self, server: Server, broken: Reply, timeout: float, words: str
    ) -> None:
        server.script(broken, broken, broken)
        _, result = settle_prompt(openai(server, retries=2, timeout=timeout), signal=Hurried())
        assert_stream_error(result, words, "(after 2 retries)")
        assert len(server.requests) == 3

    def test_a_cancel_during_the_wait_ends_the_run_at_once(self, server: Server) -> None:
        server.script(Reply([b"busy"], status=503, headers=(("Retry-After", "5"),)), STREAM)
        model = openai(server, retries=2)
        # the bound: a cancelled wait returns at once
        assert cancelled_within(model, after=lambda: bool(server.requests)) < 0.25
        assert len(server.requests) == 1


# --- A limit on concurrent answers ---------------------------------------------------


def settled_within_bound(model: al.Model) -> al.RunResult:
    """A run of model, cancelled after _BOUND seconds: a slot never given back fails the
    test instead of hanging it."""
    signal = threading.Event()
    timer = threading.Timer(_BOUND, signal.set)
    timer.start()
    try:
        return settle_prompt(model, signal=signal)[1]
    finally:
        timer.cancel()


def in_threads(model: al.Model, runs: int) -> Tuple[List[threading.Thread], List[al.RunResult]]:
    """runs runs of model, each in a thread of its own (started) and bounded; their
    results."""
    results: List[al.RunResult] = []

    def run() -> None:
        results.append(settled_within_bound(model))

    threads = [threading.Thread(target=run) for _ in range(runs)]
    for thread in threads:
        thread.start()
    return threads, results


class TestMaxConcurrency:
    """max_concurrency=N: at most N answers of one model object stream at once."""

    @pytest.mark.parametrize(
        ("provider", "limit", "runs", "streaming"),
        [
            pytest.param("openai", None, 4, 4, id="no-limit-all-at-once"),
            pytest.param("openai", 2, 4, 2, id="two-of-four"),
            pytest.param("anthropic", 1, 3, 1, id="one-of-three"),
        ],
    )
    def test_at_most_n_answers_stream_at_once_across_threads_and_runs(
        self, server: Server, provider: str, limit: Optional[int], runs: int, streaming: int
    ) -> None:
        parts = answer_parts(provider, ["Hi"])
        server.script(*[Reply(parts, held=True) for _ in range(runs)])
        model = served(provider, server, max_concurrency=limit, timeout=_BOUND)
        threads, results = in_threads(model, runs)
        try:
            assert eventually(lambda: server.holding == streaming)
            time.sleep(0.2)  # room for a run that would break the limit to connect
            assert (server.holding, server.connections) == (streaming, streaming)
        finally:
            for _ in range(runs):
                server.go.release()
            for thread in threads:
                thread.join(_BOUND)
        assert [result.final_text for result in results] == ["Hi"] * runs
        assert (server.peak, server.connections) == (streaming, runs)

    @pytest.mark.parametrize("how", ["fails", "is-closed", "is-cancelled"])
    def test_a_slot_is_given_back_when_its_stream_ends_otherwise(
        self, server: Server, how: str
    ) -> None:
        model = openai(server, max_concurrency=1, timeout=_BOUND)
        if how == "fails":
            server.script(BUSY, STREAM)
            assert_stream_error(settle_prompt(model)[1], "HTTP 503")
        elif how == "is-closed":  # a consumer that walks away
            server.script(Reply(STREAM.parts, held=True), STREAM)
            holder = model.stream(request(), threading.Event())
            assert next(holder) == al.TextDelta("request-001", "5")
            holder.close()
        else:
            server.script(Reply(STREAM.parts, held=True), STREAM)
            assert cancelled_within(model, after=lambda: server.holding == 1) < 0.25
        result = settled_within_bound(model)
        assert (result.status, result.final_text) == ("completed", "5"), result.error
        assert server.connections == 2

    def test_waiting_for_a_slot_is_cancelled_at_once_and_sends_nothing(
        self, server: Server
    ) -> None:
        server.script(Reply(STREAM.parts, held=True))
        model = openai(server, max_concurrency=1, timeout=_BOUND)
        holder = model.stream(request(), threading.Event())
        try:
            assert next(holder) == al.TextDelta("request-001", "5")
            assert cancelled_within(model, delay=0.1) < 0.25
            waiting = threading.Event()
            waiting.set()
            with pytest.raises(providers.ProviderError) as caught:
                stream(model, signal=waiting)
            assert str(caught.value) == (
                f"the request to {server.url}/v1/chat/completions was cancelled while it "
                "waited for a slot (max_concurrency=1)"
            )
            assert (server.connections, len(server.requests)) == (1, 1)
        finally:
            holder.close()

    def test_a_retrys_wait_holds_no_slot(self, server: Server) -> None:
        server.script(Reply([b"busy"], status=503, headers=(("Retry-After", "5"),)), STREAM)
        model = openai(server, max_concurrency=1, retries=1)
        waiting = threading.Event()  # set at the end: the first run's wait ends at once
        first = threading.Thread(target=settle_prompt, args=(model,), kwargs={"signal": waiting})
        first.start()
        try:
            assert eventually(lambda: len(server.requests) == 1)
            result = settled_within_bound(model)  # while the first run waits 5 s
            assert (result.status, result.final_text) == ("completed", "5"), result.error
        finally:
            waiting.set()
            first.join(_BOUND)
        assert len(server.requests) == 2


# --- Connecting, watched ----------------------------------------------------------------


@pytest.fixture
def blackhole() -> Iterator[str]:
    """A port on 127.0.0.1 whose connections never complete: a full accept queue."""
    listener = socket.socket()
    fillers: List[socket.socket] = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        for _ in range(4):  # fill the queue: later SYNs are dropped, connect() waits
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


@pytest.fixture
def silent() -> Iterator[str]:
    """A port on 127.0.0.1 that accepts connections and never sends a byte."""
    listener = socket.socket()
    accepted: List[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.02)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    thread = threading.Thread(target=accept)
    thread.start()
    try:
        yield f"https://127.0.0.1:{listener.getsockname()[1]}/v1"
    finally:
        stop.set()
        thread.join(_BOUND)
        for sock in accepted:
            sock.close()
        listener.close()


class _SlowLookup:
    """getaddrinfo for the name slow.test that waits until released (or fails, if told);
    each lookup of it is recorded in ``lookups``: the thread's name, whether it is a
    daemon, and the keyword arguments."""

    def __init__(self, error: Optional[OSError] = None) -> None:
        self.real = socket.getaddrinfo
        self.release = threading.Event()
        self.error = error
        self.lookups: List[Tuple[str, bool, Dict[str, Any]]] = []

    def __call__(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "slow.test":
            return self.real(host, port, *args, **kwargs)
        if kwargs.get("flags", 0) & socket.AI_NUMERICHOST:
            raise socket.gaierror(socket.EAI_NONAME, "not a numeric host")
        thread = threading.current_thread()
        self.lookups.append((thread.name, thread.daemon, kwargs))
        if self.error is not None:
            raise self.error
        self.release.wait(_BOUND)
        return self.real("127.0.0.1", port, *args, **kwargs)


@pytest.fixture
def slow_lookup(monkeypatch: pytest.MonkeyPatch) -> Iterator[_SlowLookup]:
    lookup = _SlowLookup()
    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    try:
        yield lookup
    finally:
        lookup.release.set()


class TestConnecting:
    """The name lookup, the TCP connection and the TLS handshake are watched and bounded.

    The stated bound: a signal set while connecting ends the run within 0.25 s.
    """

    def test_a_cancel_while_the_tcp_connection_waits(self, blackhole: str) -> None:
        model = providers.OpenAIChatModel("m", base_url=blackhole, timeout=_BOUND, retries=0)
        assert cancelled_within(model) < 0.25

    def test_a_tcp_connection_that_takes_longer_than_the_timeout(self, blackhole: str) -> None:
        model = providers.OpenAIChatModel("m", base_url=blackhole, timeout=0.3, retries=0)
        started = time.monotonic()
        _, result = settle_prompt(model)
        # The timeout, then a generous bound for a loaded machine: it ended by the timeout.
        assert 0.3 <= time.monotonic() - started < 0.3 + 5.0
        assert_stream_error(
            result, f"cannot connect to {blackhole}", "connecting took more than 0.3 s"
        )

    def test_a_cancel_while_the_name_lookup_hangs(self, slow_lookup: _SlowLookup) -> None:
        model = providers.AnthropicMessagesModel(
            "m", base_url="http://slow.test:9", timeout=_BOUND, retries=0
        )
        assert cancelled_within(model) < 0.25

    def test_a_name_lookup_that_takes_longer_than_the_timeout(
        self, slow_lookup: _SlowLookup
    ) -> None:
        model = providers.OpenAIChatModel(
            "m", base_url="http://slow.test:9/v1", timeout=0.2, retries=0
        )
        _, result = settle_prompt(model)
        assert_stream_error(result, "the name lookup of slow.test took more than 0.2 s")

    def test_a_name_lookup_that_fails(self, monkeypatch: pytest.MonkeyPatch) -> None:
        lookup = _SlowLookup(socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
        monkeypatch.setattr(socket, "getaddrinfo", lookup)
        model = providers.OpenAIChatModel("m", base_url="http://slow.test:9/v1", retries=0)
        _, result = settle_prompt(model)
        assert_stream_error(
            result,
            "cannot connect to http://slow.test:9/v1/chat/completions: the name lookup failed: ",
            "Name or service not known",
        )

    def test_a_failure_without_a_message_is_named_by_its_type(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(socket, "getaddrinfo", _SlowLookup(OSError()))
        model = providers.OpenAIChatModel("m", base_url="http://slow.test:9/v1", retries=0)
        _, result = settle_prompt(model)
        error = assert_stream_error(result, kind=providers.ProviderConnectionError)
        assert str(error).endswith(": the name lookup failed: OSError")

    def test_a_name_that_is_looked_up(self, server: Server, slow_lookup: _SlowLookup) -> None:
        slow_lookup.release.set()
        server.script(Reply([OPENAI_TEXT_STREAM]))
        port = server.url.rsplit(":", 1)[1]
        model = providers.OpenAIChatModel("m", base_url=f"http://slow.test:{port}/v1")
        _, response = stream(model)
        assert response.content == (al.TextBlock("Hello, world"),)
        assert server.requests[0]["headers"]["host"] == f"slow.test:{port}"
        # Looked up once, for TCP, in a daemon thread of its own (which a hang leaves).
        assert slow_lookup.lookups == [
            ("agent_loop_providers lookup", True, {"type": socket.SOCK_STREAM})
        ]

    def test_the_next_address_is_tried(
        self, server: Server, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        port = int(server.url.rsplit(":", 1)[1])
        real = socket.getaddrinfo
        # The closed address: a port bound but not listening, held for the whole test. A
        # connection to it is refused, and no other process can take the port meanwhile.
        with socket.socket() as refusing:
            refusing.bind(("127.0.0.1", 0))
            closed = refusing.getsockname()

            def two_addresses(host: Any, *args: Any, **kwargs: Any) -> Any:
                if host != "two.test":
                    return real(host, *args, **kwargs)
                if kwargs.get("flags", 0) & socket.AI_NUMERICHOST:
                    raise socket.gaierror(socket.EAI_NONAME, "not a numeric host")
                family, kind, protocol, name, _ = real("127.0.0.1", port, **kwargs)[0]
                return [
                    (family, kind, protocol, name, closed),
                    (family, kind, protocol, name, ("127.0.0.1", port)),
                ]

            monkeypatch.setattr(socket, "getaddrinfo", two_addresses)
            server.script(Reply([OPENAI_TEXT_STREAM]))
            model = providers.OpenAIChatModel("m", base_url=f"http://two.test:{port}/v1")
            _, response = stream(model)
        assert response.content == (al.TextBlock("Hello, world"),)

    def test_an_address_that_fails_at_once(self) -> None:
        # The kernel refuses a TCP connection to the broadcast address without a packet.
        model = providers.OpenAIChatModel("m", base_url="http://255.255.255.255:9/v1", retries=0)
        _, result = settle_prompt(model)
        error = assert_stream_error(
            result, "cannot connect to http://255.255.255.255:9/v1/chat/completions: "
        )
        # The error of the kernel's refusal, with its number and text (which one varies).
        assert re.search(r": OSError: \[Errno \d+\] \w[^:]*$", str(error)), str(error)
        number = int(str(error).split("[Errno ")[1].split("]")[0])
        assert str(error).endswith(f"[Errno {number}] {os.strerror(number)}")

    def test_a_cancel_while_the_tls_handshake_waits(self, silent: str) -> None:
        model = providers.OpenAIChatModel("m", base_url=silent, timeout=_BOUND, retries=0)
        assert cancelled_within(model) < 0.25

    def test_a_tls_handshake_that_takes_longer_than_the_timeout(self, silent: str) -> None:
        model = providers.OpenAIChatModel("m", base_url=silent, timeout=0.3, retries=0)
        _, result = settle_prompt(model)
        assert_stream_error(
            result, "the TLS handshake failed", "the TLS handshake took more than 0.3 s"
        )


# --- HTTPS --------------------------------------------------------------------------


@dataclass(frozen=True)
class Certificates:
    """A test CA, and two server certificates it signed: for 127.0.0.1, for another name."""

    ca: Path
    good: Tuple[Path, Path]  # certificate, key: IP:127.0.0.1
    other: Tuple[Path, Path]  # certificate, key: DNS:other.test only


def _openssl(*arguments: str) -> None:
    subprocess.run(["openssl", *arguments], check=True, capture_output=True, timeout=_BOUND)


@pytest.fixture(scope="session")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    """Made with the openssl command at test time, into a temporary directory."""
    try:
        _openssl("version")
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.fail(f"the TLS tests need the openssl command: {error}")
    folder = tmp_path_factory.mktemp("tls")
    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req", "-x509", *curve, "-keyout", str(folder / "ca.key"), "-out", str(folder / "ca.pem"),
        "-days", "2", "-subj", "/CN=agent_loop test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip

    def server_certificate(name: str, alternative: str) -> Tuple[Path, Path]:
        extensions = folder / f"{name}.cnf"
        extensions.write_text(
            f"subjectAltName={alternative}\nbasicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
            "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
        )
        key, request_file, certificate = (
            folder / f"{name}.{end}" for end in ("key", "csr", "pem")
        )
        _openssl(
            "req", *curve, "-keyout", str(key), "-out", str(request_file), "-subj", f"/CN={name}"
        )
        _openssl(
            "x509", "-req", "-in", str(request_file), "-CA", str(folder / "ca.pem"),
            "-CAkey", str(folder / "ca.key"), "-CAcreateserial", "-out", str(certificate),
            "-days", "2", "-extfile", str(extensions),
        )  # fmt: skip
        return certificate, key

    return Certificates(
        folder / "ca.pem",
        server_certificate("good", "IP:127.0.0.1"),
        server_certificate("other", "DNS:other.test"),
    )


def _tls_server(pair: Tuple[Path, Path]) -> ContextManager[Server]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(pair[0]), str(pair[1]))
    return serving(context)


def trusting(certificates: Certificates) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certificates.ca))


class TestHTTPS:
    """Both adapters over TLS on 127.0.0.1; the certificate and host name are verified."""

    @PROVIDERS
    def test_both_adapters_stream_through_https(
        self, certificates: Certificates, provider: str
    ) -> None:
        with _tls_server(certificates.good) as tls:
            assert tls.url.startswith("https://127.0.0.1:")
            tls.script(Reply(answer_parts(provider, ["Hello", " over TLS"])))
            context = trusting(certificates)
            model = served(provider, tls, ssl_context=context)
            chunks, response = stream(model)
            assert response.content == (al.TextBlock("Hello over TLS"),)
            assert len(chunks) == 2
            assert tls.requests[0]["headers"]["host"] == tls.url[len("https://") :]

    @PROVIDERS
    def test_the_default_context_refuses_an_unknown_ca(
        self, certificates: Certificates, provider: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        with _tls_server(certificates.good) as tls:
            model = served(provider, tls, retries=2)
            with caplog.at_level(logging.WARNING):
                _, result = settle_prompt(model)
            error = assert_stream_error(
                result, f"cannot connect to {tls.url}", "TLS certificate did not verify"
            )
            assert type(error) is providers.ProviderError  # not a connection failure
            assert error.status is None
            assert tls.requests == []
        assert retry_logs(caplog) == []  # the same certificate would come back: not retried

    def test_a_host_name_mismatch_is_refused(self, certificates: Certificates) -> None:
        with _tls_server(certificates.other) as tls:
            _, result = settle_prompt(anthropic(tls, ssl_context=trusting(certificates)))
            assert_stream_error(result, "TLS certificate did not verify", "mismatch")
            assert tls.requests == []

    def test_https_to_a_plain_http_server(self, server: Server) -> None:
        url = server.url.replace("http://", "https://") + "/v1"
        model = providers.OpenAIChatModel("m", base_url=url, retries=0)
        _, result = settle_prompt(model)
        assert_stream_error(result, f"cannot connect to {url}", "the TLS handshake failed")


class TestHTTPFailures:
    """Status, connection and timeout failures name the status, the address, the wait."""

    def test_an_error_body_that_never_arrives(self, server: Server) -> None:
        headers = (("Content-Type", "application/json"), ("Content-Length", "100"))
        server.script(Reply([b"{"], status=500, headers=headers, stall=True))
        error = failure(openai(server, timeout=0.2))
        assert str(error).endswith(
            "answered HTTP 500 Internal Server Error: (no body) (the server failed on this "
            "request: its log says why)"
        )

    def test_chunked_transfer_encoding_split_anywhere(self, server: Server) -> None:
        server.script(Reply(in_pieces(OPENAI_TOOL_STREAM), chunked=True))
        chunks, _ = stream(openai(server))
        calls = [chunk.tool_call.id for chunk in chunks if isinstance(chunk, al.ToolCallChunk)]
        assert calls == ["call_A", "call_B"]

    def test_a_server_that_hangs_up(self, server: Server) -> None:
        server.script(Reply(hang_up=True))
        _, result = settle_prompt(anthropic(server))
        assert_stream_error(result, "the request to", "failed: RemoteDisconnected")

    def test_a_chunked_stream_cut_inside_a_chunk(self, server: Server) -> None:
        # Chunked framing written by hand: the body stops inside a chunk of 0x40 bytes.
        server.script(Reply([b"40\r\ndata: {"], headers=CHUNKED))
        _, result = settle_prompt(openai(server))
        assert_stream_error(
            result,
            "the connection to",
            "broke: IncompleteRead",
            kind=providers.ProviderConnectionError,
        )

    @pytest.mark.parametrize(
        ("reply", "chunks"),
        [
            pytest.param(Reply([OPENAI_TEXT_STREAM], before_head=2.0), 0, id="no-head"),
            pytest.param(Reply([openai_chunk({"content": "Hi"})], stall=True), 1, id="mid-stream"),
        ],
    )
    def test_no_byte_for_timeout_seconds(self, server: Server, reply: Reply, chunks: int) -> None:
        server.script(reply)
        started = time.monotonic()
        events, result = settle_prompt(openai(server, timeout=0.3))
        # The timeout, then a generous bound for a loaded machine: it ended by the timeout.
        assert 0.3 <= time.monotonic() - started < 0.3 + 5.0
        assert_stream_error(
            result, "sent nothing for 0.3 s", kind=providers.ProviderConnectionError
        )
        assert [event.type for event in events].count("model.chunk") == chunks
        assert len(result.messages) == 1

    def test_pauses_shorter_than_the_timeout_are_fine(self, server: Server) -> None:
        parts = [openai_chunk({"content": "a"}), openai_chunk({"content": "b"}), STOP, DONE]
        # A generous timeout: a loaded machine may add a scheduling gap to each pause, and
        # 0.15 s is still much shorter than 5 s.
        server.script(Reply(parts, pause=0.15))
        _, result = settle_prompt(openai(server, timeout=5.0))
        assert result.status == "completed"
        assert result.final_text == "ab"


class TestCancellation:
    """A set signal closes the connection at once; so does the consumer's close()."""

    @pytest.mark.parametrize(
        "reply",
        [
            pytest.param(Reply(before_head=_BOUND), id="before-the-head"),
            pytest.param(Reply([openai_chunk({"content": "Hi"})], stall=True), id="mid-stream"),
            pytest.param(Reply([b"5\r\ndata:\r\n"], stall=True, headers=CHUNKED), id="chunked"),
        ],
    )
    def test_within_a_quarter_second_even_if_the_server_sends_nothing(
        self, server: Server, reply: Reply
    ) -> None:
        server.script(reply)
        assert cancelled_within(openai(server, timeout=_BOUND)) < 0.25
        assert server.disconnected.wait(_BOUND)
        assert _watchers_end()

    @pytest.mark.parametrize(
        "reply",
        [
            pytest.param(Reply(before_head=_BOUND), id="before-the-head"),
            pytest.param(Reply([openai_chunk({"content": "Hi"})], stall=True), id="mid-stream"),
        ],
    )
    def test_a_cancel_is_said_as_such_not_as_the_connection_it_broke(
        self, server: Server, reply: Reply
    ) -> None:
        server.script(reply)
        signal = threading.Event()
        timer = threading.Timer(0.2, signal.set)
        timer.start()
        try:
            with pytest.raises(providers.ProviderError, match="was cancelled"):
                stream(openai(server, timeout=_BOUND), signal=signal)
        finally:
            timer.cancel()

    def test_a_signal_set_before_connecting(self, server: Server) -> None:
        signal = threading.Event()
        signal.set()
        with pytest.raises(providers.ProviderError, match="was cancelled"):
            stream(openai(server), signal=signal)
        assert server.requests == []

    def test_the_consumers_close_closes_the_connection(self, server: Server) -> None:
        server.script(Reply([openai_chunk({"content": "Hi"})], stall=True))
        run = al.run_agent_loop(
            messages=[al.UserMessage("u", "Hi")],
            model=openai(server, timeout=_BOUND),
            tools=al.ToolRegistry(),
            max_steps=1,
        )
        assert next(run).type == "message.accepted"
        assert next(run).type == "model.chunk"
        run.close()
        assert server.disconnected.wait(1.0)
        assert _watchers_end()

    def test_watchers_end_after_complete_and_failed_streams(self, server: Server) -> None:
        server.script(Reply([OPENAI_TEXT_STREAM]), Reply([b"x"], status=500))
        stream(openai(server))
        failure(openai(server))
        assert _watchers_end()


# --- Integration: llmock ------------------------------------------------------------

_LLMOCK_REQUIRED = os.environ.get("AGENT_LOOP_REQUIRE_LLMOCK") == "1"
_HAS_LLMOCK = importlib.util.find_spec("llmock") is not None


@dataclass
class LLMock:
    """An ``llmock serve`` subprocess and its admin API."""

    url: str

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        call = urllib.request.Request(self.url + path, data=data, method=method)
        call.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(call, timeout=_BOUND) as answer:
            return json.loads(answer.read())

    def scenario(self, *behaviors: Dict[str, Any]) -> None:
        self.admin("POST", "/_llmock/scenario", {"behaviors": list(behaviors)})

    def requests(self) -> List[Dict[str, Any]]:
        records: List[Dict[str, Any]] = self.admin("GET", "/_llmock/requests")["requests"]
        return records

    def openai(self, **arguments: Any) -> providers.OpenAIChatModel:
        arguments.setdefault("timeout", 5.0)
        arguments.setdefault("retries", 0)  # the retry tests set their own
        return providers.OpenAIChatModel("gpt-4o", base_url=self.url + "/v1", **arguments)

    def anthropic(self, **arguments: Any) -> providers.AnthropicMessagesModel:
        arguments.setdefault("timeout", 5.0)
        arguments.setdefault("retries", 0)
        return providers.AnthropicMessagesModel(
            "claude-sonnet-4-6", base_url=self.url + "/anthropic", **arguments
        )


@contextlib.contextmanager
def llmock_serving(*options: str) -> Iterator[LLMock]:
    """An ``llmock serve`` subprocess with these options, stopped whatever happens."""
    if not _HAS_LLMOCK:
        if _LLMOCK_REQUIRED:
            pytest.fail("AGENT_LOOP_REQUIRE_LLMOCK=1 but llmock is not importable")
        pytest.skip("llmock (Python >= 3.10) is not installed: run `tox -e llmock`")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "llmock.cli", "serve", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--log-level", "warning", *options]
    with server_process("llmock serve", command, url + "/health", start_bound=30.0):
        yield LLMock(url)


@pytest.fixture(scope="module")
def llmock_process() -> Iterator[LLMock]:
    with llmock_serving() as served:
        yield served


@pytest.mark.llmock
class TestContextWindow:
    """llmock --context-window: a request refused as longer than the context."""

    @PROVIDERS
    def test_a_request_longer_than_the_context_is_told_from_other_refusals(
        self, provider: str
    ) -> None:
        """llmock --context-window N refuses a longer prompt as each provider does (HTTP 400:
        OpenAI's code context_length_exceeded; Anthropic's "prompt is too long"); a prompt
        within it is answered."""
        with llmock_serving("--context-window", "50") as served:
            model = _model(served, provider)
            short = stream(model, request([al.UserMessage("user-001", "Hi.")]))
            assert short[1].stop_reason == "stop"
            with pytest.raises(providers.ProviderError) as caught:
                stream(model, request([al.UserMessage("user-001", "word " * 300)]))
        code = "context_length_exceeded" if provider == "openai" else None
        error = caught.value
        assert (error.status, error.code, error.context_exceeded) == (400, code, True)


@pytest.fixture
def mock(llmock_process: LLMock) -> LLMock:
    llmock_process.admin("POST", "/_llmock/reset", {})
    return llmock_process


def _model(mock: LLMock, provider: str, **arguments: Any) -> al.Model:
    return mock.openai(**arguments) if provider == "openai" else mock.anthropic(**arguments)


@pytest.mark.llmock
class TestLLMock:
    """Both adapters through run_agent_loop against llmock 0.2.2's real servers."""

    @PROVIDERS
    def test_a_tool_round_trip(self, mock: LLMock, provider: str) -> None:
        mock.scenario(
            {
                "type": "reply",
                "text": "Adding.",
                "tool_calls": [{"name": "add", "arguments": {"left": 20, "right": 22}}],
            },
            {"type": "reply", "text": "The sum is 42."},
        )
        events, result = settle_prompt(
            _model(mock, provider, system="Be brief."), "Add 20 and 22."
        )
        assert result.status == "completed", result.error
        assert result.final_text == "The sum is 42."
        assert result.messages[2].content == '{"sum":42}'
        texts = [text for text in chunk_texts(events) if isinstance(text, str)]
        assert "".join(texts) == "Adding.The sum is 42."
        first, second = mock.requests()
        assert first["body"]["stream"] is True
        assert first["status"] == 200
        call = result.messages[1].content[-1]
        assert isinstance(call, al.ToolCall)
        if provider == "openai":
            assert first["path"] == "/v1/chat/completions"
            assert first["body"]["messages"][0] == {"role": "system", "content": "Be brief."}
            result_turn = {"role": "tool", "tool_call_id": call.id, "content": '{"sum":42}'}
            assert second["body"]["messages"][-1] == result_turn
        else:
            assert first["path"] == "/anthropic/v1/messages"
            assert first["body"]["system"] == "Be brief."
            assert second["body"]["messages"][-1]["content"] == [
                anthropic_sent_result(call.id, '{"sum":42}', False)
            ]

    @PROVIDERS
    def test_two_calls_and_a_recoverable_tool_error(self, mock: LLMock, provider: str) -> None:
        mock.scenario(
            {
                "type": "reply",
                "tool_calls": [
                    {"name": "multiply", "arguments": {"left": 6, "right": 7}},
                    {"name": "weather", "arguments": {"city": "Atlantis"}},
                ],
            },
            {"type": "reply", "text": "42, and no weather."},
        )
        _, result = settle_prompt(_model(mock, provider))
        assert result.status == "completed", result.error
        roles = ["user", "assistant", "toolResult", "toolResult", "assistant"]
        assert [message.role for message in result.messages] == roles
        assert isinstance(result.messages[3], al.ToolResultMessage)
        assert result.messages[3].is_error
        sent = mock.requests()[1]["body"]["messages"]
        if provider == "anthropic":  # both results in one user turn
            assert [block["is_error"] for block in sent[-1]["content"]] == [False, True]
        else:  # a turn of tool calls only: "" as its content, which every server takes
            assert sent[1]["content"] == ""

    @PROVIDERS
    @pytest.mark.parametrize("status", [429, 500])
    def test_http_errors_keep_retry_after(self, mock: LLMock, provider: str, status: int) -> None:
        mock.scenario({"type": "fail", "status": status, "retry_after": 3})
        _, result = settle_prompt(_model(mock, provider))
        error = assert_stream_error(result, f"HTTP {status}")
        assert (error.status, error.retry_after) == (status, 3.0)
        assert mock.requests()[0]["status"] == status

    @PROVIDERS
    @pytest.mark.parametrize(
        ("behaviors", "timeout", "words"),
        [
            *[
                pytest.param(
                    [
                        {"type": "reply", "text": "one two three four five six"},
                        {"type": "stream_fault", "kind": kind, "after_chunks": 3, **more},
                    ],
                    timeout,
                    words,
                    id=kind,
                )
                for kind, more, timeout, words in [
                    ("disconnect", {}, 5.0, "broke"),
                    ("truncate", {}, 5.0, "ended before"),
                    ("malformed", {}, 5.0, "malformed event"),
                    ("stall", {"stall_seconds": 5}, 0.3, "sent nothing for 0.3 s"),
                ]
            ],
            pytest.param(
                [{"type": "reply", "text": "late"}, {"type": "slow_first_token", "seconds": 2}],
                0.3,
                "sent nothing for 0.3 s",
                id="slow-first-token",
            ),
            pytest.param(
                [{"type": "tool_fault", "kind": "malformed_arguments"}],
                5.0,
                "has arguments that are not JSON",
                id="malformed-arguments",
            ),
        ],
    )
    def test_stream_faults(
        self, mock: LLMock, provider: str, behaviors: List[Any], timeout: float, words: str
    ) -> None:
        mock.scenario(*behaviors)
        _, result = settle_prompt(_model(mock, provider, timeout=timeout))
        assert_stream_error(result, words)
        assert len(result.messages) == 1

    @PROVIDERS
    def test_a_stall_is_cancelled_within_a_quarter_second(
        self, mock: LLMock, provider: str
    ) -> None:
        mock.scenario(
            {"type": "reply", "text": "one two three"},
            {"type": "stream_fault", "kind": "stall", "after_chunks": 2, "stall_seconds": 5},
        )
        assert cancelled_within(_model(mock, provider, timeout=_BOUND), delay=0.3) < 0.25

    @PROVIDERS
    def test_slow_first_token_within_the_timeout(self, mock: LLMock, provider: str) -> None:
        mock.scenario(
            {"type": "reply", "text": "late"}, {"type": "slow_first_token", "seconds": 0.3}
        )
        _, result = settle_prompt(_model(mock, provider, timeout=2.0))
        assert result.status == "completed"
        assert result.final_text == "late"

    @PROVIDERS
    def test_a_failure_then_a_reply_is_retried(
        self, mock: LLMock, provider: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        mock.scenario({"type": "fail", "status": 500}, {"type": "reply", "text": "Recovered."})
        model = _model(mock, provider, retries=2)
        with caplog.at_level(logging.WARNING):
            _, result = settle_prompt(model, signal=Hurried())
        assert result.status == "completed", result.error
        assert result.final_text == "Recovered."
        assert [record["status"] for record in mock.requests()] == [500, 200]
        assert len(retry_logs(caplog)) == 1

    @PROVIDERS
    def test_a_429_waits_its_retry_after(
        self, mock: LLMock, provider: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        mock.scenario(
            {"type": "fail", "status": 429, "retry_after": 0.2},
            {"type": "reply", "text": "After the wait."},
        )
        started = time.monotonic()
        with caplog.at_level(logging.WARNING):
            _, result = settle_prompt(_model(mock, provider, retries=1))
        assert time.monotonic() - started >= 0.2
        assert result.status == "completed", result.error
        assert retry_logs(caplog)[0].endswith("retrying in 0.2 s")

    @PROVIDERS
    def test_a_long_answer_completes(self, mock: LLMock, provider: str) -> None:
        words = " ".join(f"w{number}" for number in range(2000))
        mock.scenario({"type": "reply", "text": words})
        events, result = settle_prompt(_model(mock, provider))
        assert result.status == "completed", result.error
        assert result.final_text == words
        assert sum(event.type == "model.chunk" for event in events) <= al.MAX_STEP_CHUNKS

    @PROVIDERS
    def test_usage_is_asked_for_and_is_what_llmock_counts(
        self, mock: LLMock, provider: str
    ) -> None:
        reply = {"type": "reply", "text": "The sum is 42, as asked."}
        mock.scenario(reply, reply)  # the second for the same request, not streamed
        arguments: Dict[str, Any] = {"system": "Be brief."}
        if provider == "anthropic":  # llmock takes the setting (and sends no thinking)
            arguments["thinking"] = {"type": "enabled", "budget_tokens": 1024}
        _, result = settle_prompt(_model(mock, provider, **arguments), "Add 20 and 22.")
        assert result.status == "completed", result.error
        sent = mock.requests()[0]["body"]
        # The same body, not streamed: llmock's own count of this request.
        body = {key: value for key, value in sent.items() if key != "stream_options"}
        body["stream"] = False
        path = "/v1/chat/completions" if provider == "openai" else "/anthropic/v1/messages"
        counted = mock.admin("POST", path, body)["usage"]
        if provider == "openai":
            assert sent["stream_options"] == {"include_usage": True}
            expected = al.Usage(counted["prompt_tokens"], counted["completion_tokens"])
        else:
            assert sent["thinking"] == {"type": "enabled", "budget_tokens": 1024}
            expected = al.Usage(counted["input_tokens"], counted["output_tokens"])
        assert expected.input_tokens  # counted, not 0
        assert expected.output_tokens
        assistant = result.messages[1]
        assert isinstance(assistant, al.AssistantMessage)
        assert assistant.usage == expected  # llmock reports no cache or reasoning counts
        assert result.usage == expected

    @PROVIDERS
    @pytest.mark.parametrize("accept_truncated", [True, False])
    def test_a_cut_answer(self, mock: LLMock, provider: str, accept_truncated: bool) -> None:
        mock.scenario({"type": "reply", "text": "cut short", "finish_reason": "length"})
        _, result = settle_prompt(_model(mock, provider, accept_truncated=accept_truncated))
        if accept_truncated:
            assert result.status == "completed", result.error
            assert result.final_text == "cut short"
        else:
            assert_stream_error(result, "the answer was cut")


# --- The default transport's parts ----------------------------------------------------


class TestTheDefaultExchange:
    """_Exchange, the one place with a socket: what it is made of, before and after open()."""

    @pytest.mark.parametrize(
        ("url", "host", "port", "tls"),
        [
            ("https://api.example.com/v1/messages", "api.example.com", 443, True),
            ("http://localhost/v1/chat/completions", "localhost", 80, False),
            ("http://127.0.0.1:8080/v1/chat/completions", "127.0.0.1", 8080, False),
            ("https://h:8443/v1", "h", 8443, True),
            ("http://:8080/v1", "", 8080, False),
        ],
    )
    def test_the_address_the_default_ports_and_the_state_before_open(
        self, url: str, host: str, port: int, tls: bool
    ) -> None:
        context = ssl.create_default_context()
        exchange = providers._Exchange(url, {}, b"", 2.5, threading.Event(), context)
        try:
            assert (exchange.host, exchange.port, exchange.tls) == (host, port, tls)
            assert (exchange.connection.host, exchange.connection.port) == (host, port)
            assert exchange.connection.timeout == 2.5
            assert (exchange.status, exchange.reason, exchange.headers) == (0, "", {})
            assert exchange.response is None
            assert isinstance(exchange.connection, http.client.HTTPSConnection) is tls
            if tls:  # the context given, not one http.client would make
                assert exchange.context is context
                assert exchange.connection._context is context  # type: ignore[attr-defined]
            else:
                assert exchange.context is None
        finally:
            exchange.close()

    def test_https_without_a_context_shares_one_default_context(self) -> None:
        providers._default_contexts.clear()
        first = providers._Exchange("https://h/v1", {}, b"", 1.0, threading.Event(), None)
        second = providers._Exchange("https://g/v1", {}, b"", 1.0, threading.Event(), None)
        assert isinstance(first.context, ssl.SSLContext)
        assert first.context is second.context
        assert providers._default_contexts == [first.context]

    def test_open_starts_one_daemon_watcher_that_ends_with_close(self, server: Server) -> None:
        server.script(STREAM)
        before = set(threading.enumerate())
        exchange = providers._Exchange(
            server.url + "/v1/chat/completions", {}, b"{}", _BOUND, threading.Event(), None
        )
        exchange.open()
        try:
            (watcher,) = [
                thread
                for thread in threading.enumerate()
                if thread not in before and thread.name == "agent_loop_providers watch"
            ]
            assert watcher.daemon
            assert exchange.status == 200
        finally:
            exchange.close()
        watcher.join(_BOUND)
        assert not watcher.is_alive()

    def test_a_host_without_an_address_cannot_be_connected(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        exchange = providers._Exchange("http://h:9/v1", {}, b"", 1.0, threading.Event(), None)
        monkeypatch.setattr(exchange, "_addresses", list)
        with pytest.raises(providers.ProviderConnectionError) as caught:
            exchange.open()
        assert str(caught.value) == "cannot connect to http://h:9/v1: OSError: no address for h"

    def test_what_stops_the_handshakes_wait_is_raised_as_it_is(
        self, silent: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # A cancellation (here any ProviderError) during the TLS handshake's wait is not a
        # failed handshake: it passes through, and the TLS socket is closed.
        exchange = providers._Exchange(silent, {}, b"", _BOUND, threading.Event(), None)
        waits = exchange._wait_for
        seen: List[socket.socket] = []

        def wait_for(sock: socket.socket, event: int, what: str, deadline: float) -> None:
            if what == "the TLS handshake":
                seen.append(sock)
                raise providers.ProviderError("stopped")
            waits(sock, event, what, deadline)

        monkeypatch.setattr(exchange, "_wait_for", wait_for)
        with pytest.raises(providers.ProviderError) as caught:
            exchange.open()
        assert (type(caught.value), str(caught.value)) == (providers.ProviderError, "stopped")
        (tls,) = seen
        assert isinstance(tls, ssl.SSLSocket)
        assert tls.fileno() == -1  # closed
