"""Tests of agent_loop_providers.py: the socket loop around the wire formats.

The transport seam (each attempt one exchange, closed whichever way it ends), the one
rule of retries (``_transient()``: which failures, how long a wait, none after a chunk),
and the pauses shared by a model object's attempts: the ``max_concurrency`` slots and an
HTTP 429's Retry-After. Canned exchanges through ``transport=`` (loop_testing_providers.py);
no socket: the same rules over a real connection are in
test_agent_loop_providers_connection.py.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
from typing import Any, Dict, List, Mapping, Optional, Tuple, cast

import pytest

import agent_loop as al
import agent_loop_providers as providers
from loop_testing_providers import (
    CANNED_URL,
    DONE,
    DONE_HINT,
    END_HINT,
    MESSAGE_START,
    MODEL_CLASSES,
    OPENAI_TEXT_STREAM,
    PROVIDERS,
    ROLE,
    STOP,
    AnyModel,
    Attempt,
    Canned,
    CannedTransport,
    Hurried,
    answer_parts,
    anthropic_delta,
    anthropic_end,
    anthropic_text,
    assert_stream_error,
    backoff_bounds,
    canned_model,
    canned_openai,
    chunk_texts,
    exchanges,
    logged_delay,
    openai_chunk,
    request,
    retry_logs,
    settle_prompt,
    sse,
    stream,
)

# --- The transport seam, and the one rule of retries ------------------------------------


LONG_WAIT = {"Retry-After": "61"}
NOT_RETRIED = "busy (Retry-After: 61 s) (not retried: the Retry-After is more than 60 s)"
OVERLOADED_EVENT = sse(
    {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, "error"
)


def retried_once(first: Canned, provider: str = "openai") -> Tuple[al.RunResult, AnyModel]:
    """A run whose first attempt meets first and whose second would answer "Done.", with
    one retry allowed: its result, and its model (whose exchanges say what was opened)."""
    model = canned_model(provider, first, answer_parts(provider, ["Done."]), retries=1)
    return settle_prompt(model, signal=Hurried())[1], model


class TestTheTransportSeam:
    """transport=: what sends the requests; None is the default, over a socket."""

    @PROVIDERS
    def test_the_default_is_none_and_a_transport_is_kept(self, provider: str) -> None:
        assert MODEL_CLASSES[provider]("m").transport is None
        transport = CannedTransport()
        assert MODEL_CLASSES[provider]("m", transport=transport).transport is transport

    @pytest.mark.parametrize("transport", [1, "http", object()])
    def test_a_transport_that_is_not_callable(self, transport: Any) -> None:
        with pytest.raises(TypeError, match="transport must be None or a callable"):
            providers.OpenAIChatModel("m", transport=transport)

    @PROVIDERS
    def test_each_attempt_opens_one_exchange_and_closes_it(self, provider: str) -> None:
        result, model = retried_once(Canned([b"busy"], status=503), provider)
        assert (result.status, result.final_text) == ("completed", "Done."), result.error
        assert [exchange.closes for exchange in exchanges(model)] == [1, 1]
        first, second = exchanges(model)
        assert first.url == second.url == CANNED_URL[provider]
        assert first.body == second.body  # the same request, sent again

    def test_a_failed_open_closes_nothing_of_the_models(self) -> None:
        refused = Canned(failure=providers.ProviderConnectionError("cannot connect to u: no"))
        result, model = retried_once(refused)
        assert result.status == "completed", result.error
        assert [exchange.closes for exchange in exchanges(model)] == [0, 1]

    def test_the_consumers_close_closes_the_exchange(self) -> None:
        model = canned_openai([openai_chunk({"content": "Hi"}), openai_chunk({"content": "!"})])
        generator = model.stream(request(), threading.Event())
        assert next(generator) == al.TextDelta("request-001", "Hi")
        generator.close()
        assert exchanges(model)[0].closes == 1

    def test_the_transport_gets_the_request_and_the_runs_signal(self) -> None:
        got: List[Tuple[str, Dict[str, str], bytes, Any]] = []

        def transport(
            url: str, headers: Mapping[str, str], body: bytes, signal: al.Signal
        ) -> Canned:
            got.append((url, dict(headers), body, signal))
            return Canned([OPENAI_TEXT_STREAM])

        model = providers.OpenAIChatModel("m", base_url="http://h/v1", transport=transport)
        signal = threading.Event()
        _, response = stream(model, request(), signal)
        assert response.content == (al.TextBlock("Hello, world"),)
        ((url, headers, body, given),) = got
        assert (url, given) == ("http://h/v1/chat/completions", signal)
        assert headers["Accept"] == "text/event-stream"
        assert body == providers.openai_request_body(request(), "m")

    def test_an_error_body_is_read_up_to_64_kib(self) -> None:
        big = Canned([b"x" * 65_536, b"more"], status=500)
        result, _ = retried_once(big)
        assert result.status == "completed", result.error
        assert big.reads == 1  # the limit was reached: the rest is not read

    @pytest.mark.parametrize(
        ("parts", "body", "reads"),
        [
            pytest.param([b"ab", b"cd"], b"abcd", 3, id="every-read-joined-to-the-end"),
            pytest.param(
                [b"x" * 65_535, b"yz", b"unread"], b"x" * 65_535 + b"y", 2, id="cut-at-64-kib"
            ),
            pytest.param(
                [b"x" * 40_000, b"y" * 40_000, b"unread"],
                b"x" * 40_000 + b"y" * 25_536,
                2,
                id="the-reads-are-summed",
            ),
        ],
    )
    def test_the_error_body_is_its_reads_up_to_64_kib(
        self, parts: List[bytes], body: bytes, reads: int
    ) -> None:
        exchange = Canned(parts, status=500)
        assert providers._error_body(exchange) == body
        assert exchange.reads == reads

    def test_an_error_body_that_cannot_be_read_is_no_body(self) -> None:
        class Broken(Canned):
            def read(self) -> bytes:
                raise providers.ProviderConnectionError("the connection to u broke")

        _, result = settle_prompt(canned_openai(Broken(status=401)))
        assert_stream_error(result, "answered HTTP 401 Unauthorized: (no body)")


# Answers that the server did not finish: the parts before the text (none: no chunk), the
# unfinished end, and what the error says after the URL.
UNFINISHED = [
    pytest.param(
        "openai",
        [ROLE],
        [DONE],
        f"ended with data: [DONE] but no finish_reason: the answer is incomplete {DONE_HINT}",
        id="openai-end-marker-without-finish",
    ),
    pytest.param(
        "openai",
        [ROLE],
        [],
        f"ended before data: [DONE] and without a finish_reason: the answer is incomplete "
        f"{END_HINT}",
        id="openai-end-of-input-without-finish",
    ),
    pytest.param(
        "openai",
        [ROLE],
        [STOP],
        "ended before data: [DONE]: the answer is incomplete",
        id="openai-end-of-input-after-the-finish",
    ),
    pytest.param(
        "anthropic",
        [MESSAGE_START, anthropic_text(0)[0]],
        [],
        "ended before message_stop: the answer is incomplete",
        id="anthropic-end-of-input",
    ),
]
TEXT = {
    "openai": openai_chunk({"content": "Hal"}),
    "anthropic": anthropic_delta(0, type="text_delta", text="Hal"),
}


class TestWhatIsRetried:
    """The one rule, decided by the socket loop from the error's type and the status:
    retried before the first chunk, as many times as retries says."""

    @pytest.mark.parametrize(
        ("status", "retried"),
        [
            *[(400, False), (401, False), (404, False), (407, False), (408, True), (409, True)],
            *[(410, False), (422, False), (429, True), (499, False), (500, True), (503, True)],
            *[(529, True), (599, True), (301, False), (304, False)],
        ],
    )
    def test_which_statuses_are_retried(self, status: int, retried: bool) -> None:
        result, model = retried_once(Canned([b"no"], status=status))
        assert (result.status == "completed") is retried, result.error
        assert cast(CannedTransport, model.transport).opened == 1 + retried
        if not retried:
            assert assert_stream_error(result, f"HTTP {status}").status == status

    @pytest.mark.parametrize(
        ("provider", "first", "retried", "kind"),
        [
            pytest.param(
                "openai",
                Canned(failure=providers.ProviderConnectionError("cannot connect to u: refused")),
                True,
                providers.ProviderConnectionError,
                id="a-connection-that-cannot-be-made",
            ),
            pytest.param(
                "openai",
                Canned([providers.ProviderConnectionError("the connection to u broke")]),
                True,
                providers.ProviderConnectionError,
                id="a-connection-that-breaks-after-the-head",
            ),
            pytest.param(
                "anthropic",
                Canned([MESSAGE_START]),
                True,
                providers.ProviderProtocolError,
                id="an-incomplete-answer",
            ),
            pytest.param(
                "anthropic",
                Canned([MESSAGE_START, OVERLOADED_EVENT]),
                True,
                providers.ProviderError,
                id="an-overloaded-error-event",
            ),
            pytest.param(
                "anthropic",
                Canned(
                    [MESSAGE_START, sse({"type": "error", "error": {"type": "overloaded_error"}})]
                ),
                True,
                providers.ProviderError,
                id="an-overloaded-error-event-without-a-message",
            ),
            pytest.param(
                "anthropic",
                Canned([MESSAGE_START, sse({"type": "error", "error": {"type": "api_error"}})]),
                False,
                providers.ProviderError,
                id="another-error-event",
            ),
            pytest.param(
                "openai",
                Canned([b"data: {oops\n\n"]),
                False,
                providers.ProviderProtocolError,
                id="a-malformed-event",
            ),
            pytest.param(
                "openai",
                Canned([b"{}"], headers={"Content-Type": "application/json"}),
                False,
                providers.ProviderProtocolError,
                id="an-answer-in-json",
            ),
            pytest.param(
                "anthropic",
                Canned([MESSAGE_START, *anthropic_end("refusal")]),
                False,
                providers.ProviderError,
                id="a-cut-answer",
            ),
            pytest.param(
                "openai",
                Canned(failure=providers.ProviderError("cannot connect to u: the certificate")),
                False,
                providers.ProviderError,
                id="what-the-transport-says-would-come-again",
            ),
        ],
    )
    def test_which_failures_are_retried(
        self, provider: str, first: Canned, retried: bool, kind: type
    ) -> None:
        first = copy.deepcopy(first)  # a parameter is made once: each run reads its own
        result, model = retried_once(first, provider)
        assert (result.status == "completed") is retried, result.error
        assert cast(CannedTransport, model.transport).opened == 1 + retried
        if not retried:
            assert type(assert_stream_error(result)) is kind

    def test_the_backoff_doubles_from_half_a_second_to_at_most_8_with_jitter(self) -> None:
        busy = [Canned([b"busy"], status=503) for _ in range(7)]
        signal = Hurried()
        _, result = settle_prompt(canned_openai(*busy, retries=6), signal=signal)
        assert_stream_error(result, "HTTP 503", "(after 6 retries)")
        assert len(signal.waits) == 6
        for retried, waited in enumerate(signal.waits):
            low, high = backoff_bounds(retried)
            assert waited is not None
            # Inclusive: float rounding of 1 - j/4 gives exactly 0.75 for a jitter j just
            # below 1 (1 - 2**-53), so a wait may equal the lower bound.
            assert low <= waited <= high, (retried, waited)

    @pytest.mark.parametrize(
        ("retries", "heads", "waits", "said"),
        [
            pytest.param(1, [{"Retry-After": "0.25"}], [0.25], None, id="seconds"),
            pytest.param(1, [{"retry-after-ms": "20"}], [0.02], None, id="milliseconds"),
            pytest.param(1, [{"Retry-After": "60"}], [60.0], None, id="60-s-is-waited-for"),
            pytest.param(2, [LONG_WAIT], [], NOT_RETRIED, id="61-s-is-not-waited-for"),
            pytest.param(2, [{}, LONG_WAIT], [None], NOT_RETRIED, id="after-a-retry"),
            pytest.param(
                0, [LONG_WAIT], [], "busy (Retry-After: 61 s)", id="retries-0-say-nothing"
            ),
            pytest.param(
                0, [{"Retry-After": "1"}], [], "(Retry-After: 1 s)", id="retries-0-turn-them-off"
            ),
        ],
    )
    def test_the_wait_is_the_servers_retry_after_up_to_60_s(
        self,
        caplog: pytest.LogCaptureFixture,
        retries: int,
        heads: List[Dict[str, str]],
        waits: List[Optional[float]],
        said: Optional[str],
    ) -> None:
        """Each wait is the server's (None: the backoff's), as logged; a failed run says the
        last Retry-After, and that it was not waited for when it was over 60 s."""
        busy = [Canned([b"busy"], status=429, headers=head) for head in heads]
        model, signal = canned_openai(*busy, [OPENAI_TEXT_STREAM], retries=retries), Hurried()
        with caplog.at_level(logging.WARNING):
            _, result = settle_prompt(model, signal=signal)
        logged = retry_logs(caplog)
        assert len(signal.waits) == len(logged) == len(waits)
        for retried, (wait, waited, line) in enumerate(zip(waits, signal.waits, logged)):
            low, high = backoff_bounds(retried) if wait is None else (wait, wait)
            assert low <= cast(float, waited) <= high
            assert low <= logged_delay(line) <= high  # the log rounds to 3 digits
        assert cast(CannedTransport, model.transport).opened == len(heads) + (said is None)
        if said is None:
            assert result.status == "completed", result.error
        else:
            error = assert_stream_error(result, "HTTP 429", kind=providers.ProviderError)
            assert str(error).endswith(said)
            assert (error.status, error.retry_after) == (429, float(heads[-1]["Retry-After"]))

    def test_nothing_is_retried_after_the_first_chunk(self) -> None:
        first = Canned([MESSAGE_START, *anthropic_text(0, "Hi")[:2], OVERLOADED_EVENT])
        result, model = retried_once(first, "anthropic")
        assert_stream_error(result, "overloaded_error: Overloaded")
        assert cast(CannedTransport, model.transport).opened == 1

    def test_a_transport_may_raise_one_error_twice(self) -> None:
        # The error of the last attempt is said with its retries, on a copy of it.
        shared = providers.ProviderConnectionError("cannot connect to u: refused")
        model = canned_openai(Canned(failure=shared), Canned(failure=shared), retries=1)
        _, result = settle_prompt(model, signal=Hurried())
        error = assert_stream_error(
            result, "refused (after 1 retry)", kind=providers.ProviderConnectionError
        )
        assert error is not shared
        assert str(shared) == "cannot connect to u: refused"

    @pytest.mark.parametrize(("provider", "head", "end", "words"), UNFINISHED)
    @pytest.mark.parametrize("when", ["before-a-chunk", "retries-spent", "after-a-chunk"])
    def test_an_unfinished_answer_is_retried_only_before_any_chunk(
        self,
        provider: str,
        head: List[bytes],
        end: List[bytes],
        words: str,
        when: str,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """Nothing was yielded: as after a broken connection, the answer is asked for again,
        as many times as retries says. Once a chunk was yielded, the loop has reported it:
        no retry."""
        unfinished = [*head, *([TEXT[provider]] if when == "after-a-chunk" else []), *end]
        attempts = [Canned(unfinished) for _ in range(3 if when == "retries-spent" else 1)]
        done = Canned(answer_parts(provider, ["Done."]))
        retries = 1 if when == "before-a-chunk" else 2
        model = canned_model(provider, *attempts, done, retries=retries)
        with caplog.at_level(logging.WARNING):
            events, result = settle_prompt(model, signal=Hurried())
        said = f"the stream from {CANNED_URL[provider]} {words}"
        assert [bool(attempt.reads) for attempt in attempts] == [True] * len(attempts)
        assert bool(done.reads) is (when == "before-a-chunk")
        if when == "before-a-chunk":
            assert (result.status, result.final_text) == ("completed", "Done."), result.error
            (logged,) = retry_logs(caplog)
            assert f"attempt 1 of 2 failed ({said})" in logged
        elif when == "retries-spent":
            error = assert_stream_error(result, f"{said} (after 2 retries)")
            assert type(error) is providers.ProviderProtocolError
            assert len(result.messages) == 1
        else:
            error = assert_stream_error(result, said)
            assert "(after" not in str(error)
            assert chunk_texts(events) == ["Hal"]

    def test_without_require_finish_reason_the_end_of_input_is_still_incomplete(self) -> None:
        model = canned_openai([openai_chunk({"content": "Hal"})], require_finish_reason=False)
        _, result = settle_prompt(model)
        assert_stream_error(result, "ended before data: [DONE] and without a finish_reason")


def server_raised(error_type: str) -> Canned:
    """An HTTP 500 whose JSON body names error_type, as llama-cpp-python's server answers
    a request it raised an exception on (with the exception's text, here empty)."""
    body = json.dumps({"error": {"message": "", "type": error_type, "param": None}})
    return Canned([body.encode()], status=500, headers={"Content-Type": "application/json"})


class TestAServerThatFailed:
    """An HTTP 500 says the server failed and that its log says why; one whose body says
    the server raised an exception (internal_server_error) is not retried."""

    @pytest.mark.parametrize(
        ("error_type", "retried"),
        [("internal_server_error", False), ("server_error", True), ("api_error", True)],
    )
    def test_a_500_that_says_the_server_raised_is_not_retried(
        self, error_type: str, retried: bool
    ) -> None:
        result, model = retried_once(server_raised(error_type))
        assert cast(CannedTransport, model.transport).opened == 1 + retried
        if retried:
            assert result.status == "completed", result.error
        else:
            error = assert_stream_error(
                result,
                "answered HTTP 500 Internal Server Error: internal_server_error:  (the server "
                "failed on this request: its log says why) (not retried: the server says it "
                "raised an exception (internal_server_error))",
            )
            assert (error.status, error.error_type) == (500, "internal_server_error")

    @pytest.mark.parametrize("status", [499, 500, 501])
    def test_only_a_500_points_to_the_servers_log(self, status: int) -> None:
        _, result = settle_prompt(canned_openai(Canned([b"oops"], status=status)))
        said = "(the server failed on this request: its log says why)" in str(
            assert_stream_error(result, f"HTTP {status}")
        )
        assert said is (status == 500)


class Cancelling(threading.Event):
    """A run's signal that is set by the first wait asked of it (which returns True)."""

    def wait(self, timeout: Optional[float] = None) -> bool:
        self.set()
        return True


def paused_by(status: int, headers: Mapping[str, str], *then: Attempt) -> AnyModel:
    """A model whose first run met status with headers (and failed: no retries), with
    the attempts then for the runs after it."""
    model = canned_openai(Canned([b"slow down"], status=status, headers=headers), *then)
    _, first = settle_prompt(model, signal=Hurried())
    assert_stream_error(first, f"HTTP {status}")
    return model


class TestARateLimitPausesTheModel:
    """An HTTP 429 with a Retry-After pauses every attempt of that model object (across
    threads and runs) until then: none sends before it. The waits are recorded by a
    Hurried signal (which waits 10 ms at most); each is the pause left, within a generous
    second of what the server said."""

    @pytest.mark.parametrize(
        ("status", "headers", "waited"),
        [
            pytest.param(429, {"Retry-After": "30"}, 30.0, id="429-retry-after-30-s"),
            pytest.param(429, {"Retry-After-Ms": "2500"}, 2.5, id="429-retry-after-ms"),
            pytest.param(429, {"Retry-After": "60"}, 60.0, id="429-60-s-the-limit"),
            pytest.param(429, {"Retry-After": "0"}, None, id="429-a-pause-already-over"),
            pytest.param(429, {}, None, id="429-without-retry-after"),
            pytest.param(503, {"Retry-After": "30"}, None, id="503-is-no-rate-limit"),
        ],
    )
    def test_the_next_run_waits_until_the_servers_retry_after(
        self, status: int, headers: Mapping[str, str], waited: Optional[float]
    ) -> None:
        model = paused_by(status, headers, [OPENAI_TEXT_STREAM])
        signal = Hurried()
        _, result = settle_prompt(model, signal=signal)
        assert result.status == "completed", result.error
        if waited is None:
            assert signal.waits == []
        else:
            (wait,) = signal.waits
            assert wait is not None
            assert waited - 1.0 < wait <= waited, wait

    def test_a_pause_over_60_s_fails_the_next_run_without_sending(self) -> None:
        unused = Canned([OPENAI_TEXT_STREAM])
        model = paused_by(429, {"Retry-After": "61"}, unused)
        signal = Hurried()
        _, result = settle_prompt(model, signal=signal)
        error = assert_stream_error(
            result,
            "the request to http://canned/v1/chat/completions was not sent: the server's "
            "Retry-After (HTTP 429) pauses this model for ",
            " s more, more than 60 s",
        )
        assert error.status == 429
        assert error.retry_after is not None
        assert 60.0 < error.retry_after <= 61.0
        assert (signal.waits, unused.reads, cast(CannedTransport, model.transport).opened) == (
            [],
            0,
            1,
        )

    def test_the_runs_signal_cancels_the_wait_and_nothing_is_sent(self) -> None:
        unused = Canned([OPENAI_TEXT_STREAM])
        model = paused_by(429, {"Retry-After": "30"}, unused)
        with pytest.raises(providers.ProviderError) as caught:
            stream(model, signal=Cancelling())
        assert str(caught.value) == (
            "the request to http://canned/v1/chat/completions was cancelled while it waited "
            "for the server's Retry-After (HTTP 429)"
        )
        _, result = settle_prompt(model, signal=Cancelling())
        assert result.status == "cancelled"
        assert cast(CannedTransport, model.transport).opened == 1

    def test_each_model_object_has_its_own_pause(self) -> None:
        paused_by(429, {"Retry-After": "30"})
        other = canned_openai([OPENAI_TEXT_STREAM])
        signal = Hurried()
        _, result = settle_prompt(other, signal=signal)
        assert (result.status, signal.waits) == ("completed", [])

    def test_a_later_end_is_kept(self) -> None:
        # Two 429s: the pause ends at the later of the two ends, whichever came last.
        model = paused_by(
            429,
            {"Retry-After": "40"},
            Canned([b"slow"], status=429, headers={"Retry-After": "10"}),
            [OPENAI_TEXT_STREAM],
        )
        first, second = Hurried(), Hurried()
        settle_prompt(model, signal=first)  # waits the 40 s pause, then meets the 10 s 429
        _, result = settle_prompt(model, signal=second)
        assert result.status == "completed", result.error
        (wait,) = second.waits
        assert wait is not None
        assert 39.0 < wait <= 40.0, wait


@pytest.mark.parametrize(
    ("provider", "url", "headers"),
    [
        (
            "openai",
            "http://canned/v1/chat/completions",
            {
                "Content-Type": "application/json",
                "Accept": "text/event-stream",
                "User-Agent": f"agent_loop_providers/{providers.__version__}",
                "Authorization": "Bearer k",
            },
        ),
        (
            "anthropic",
            "http://canned/v1/messages",
            {
                "Content-Type": "application/json",
                "Accept": "text/event-stream",
                "User-Agent": f"agent_loop_providers/{providers.__version__}",
                "anthropic-version": "2023-06-01",
                "x-api-key": "k",
            },
        ),
    ],
)
def test_the_transport_gets_the_url_and_the_headers_as_spelled(
    provider: str, url: str, headers: Dict[str, str]
) -> None:
    sent: List[Tuple[str, Dict[str, str]]] = []

    def recording(to: str, given: Mapping[str, str], body: bytes, signal: al.Signal) -> Canned:
        sent.append((to, dict(given)))
        return Canned(answer_parts(provider, ["Hi."]))

    base_url = {"openai": "http://canned/v1", "anthropic": "http://canned"}[provider]
    model = MODEL_CLASSES[provider]("m", base_url=base_url, api_key="k", transport=recording)
    stream(model)
    assert sent == [(url, headers)]
