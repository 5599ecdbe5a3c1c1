"""Tests of agent_loop_wire.py, the providers' sans-IO wire layer, from bytes alone.

In the module's order: the response's head (``check_response_head()``: statuses, the
provider's error text, type and code, a refusal of a request longer than the context,
Retry-After), the event-stream parser (``ServerSentEvents``: one table of vectors written
from the WHATWG HTML standard, "9.2.6 Interpreting an event stream", each fed whole and
split at every byte, then the limits), the ids (``ResponseIds``), and what the answer
readers say of the provider's own response id. The readers' broken-answer table (with
what each refusal carries: a cut's ``finish_reason`` too), and everything a model object
does with them, are in the providers' test files.
"""

from __future__ import annotations

import email.utils
import time
from typing import Dict, List, Optional, Tuple

import pytest

import agent_loop as al
import agent_loop_wire as wire
from loop_testing import AT_LIMIT, OVER_LIMIT
from loop_testing_providers import (
    DONE,
    MESSAGE_START,
    STOP,
    anthropic_end,
    anthropic_text,
    openai_chunk,
    request,
    sse,
)
from loop_testing_providers import (
    parsed as answered,
)

# --- The response's head ------------------------------------------------------------------


def unread() -> bytes:
    raise AssertionError("this body is not read")


class TestHead:
    """The status and headers that decide an error, read by check_response_head()."""

    def error(
        self, status: int, headers: Dict[str, str], body: str = "", now: float = 0.0
    ) -> wire.ProviderError:
        with pytest.raises(wire.ProviderError) as caught:
            wire.check_response_head("http://h/x", status, "Reason", headers, body.encode, now)
        return caught.value

    @pytest.mark.parametrize("status", [200, 201, 299])
    @pytest.mark.parametrize(
        "content_type", ["text/event-stream", "text/event-stream; charset=x", ""]
    )
    def test_a_2xx_stream_is_no_error_and_its_body_is_not_read(
        self, status: int, content_type: str
    ) -> None:
        headers = {"content-type": content_type}
        wire.check_response_head("u", status, "OK", headers, unread)  # no error

    @pytest.mark.parametrize(
        ("status", "headers", "said"),
        [
            pytest.param(
                301,
                {"location": "https://h/y", "content-type": "text/event-stream"},
                " (Location: https://h/y; redirects are not followed)",
                id="redirect",
            ),
            pytest.param(
                307,
                {"location": "/x2"},
                " (Location: /x2; redirects are not followed)",
                id="temporary",
            ),
            pytest.param(304, {}, "", id="no-location"),
            pytest.param(199, {}, "", id="below-200"),
            pytest.param(399, {}, "", id="399"),
        ],
    )
    def test_a_status_outside_2xx_is_an_error_naming_it(
        self, status: int, headers: Dict[str, str], said: str
    ) -> None:
        with pytest.raises(wire.ProviderError) as caught:
            wire.check_response_head("http://h/x", status, "Reason", headers, unread, 0.0)
        error = caught.value
        assert str(error) == f"http://h/x answered HTTP {status} Reason, not an event stream{said}"
        assert type(error) is wire.ProviderError
        assert (error.status, error.retry_after, error.error_type) == (status, None, None)

    def test_an_http_500_points_to_the_servers_log(self) -> None:
        error = self.error(500, {}, "boom")
        assert str(error) == f"http://h/x answered HTTP 500 Reason: boom ({wire.SERVER_LOG_HINT})"

    def test_json_instead_of_a_stream_is_a_protocol_error(self) -> None:
        error = self.error(200, {"content-type": "application/json"}, '{"choices": []}')
        assert str(error) == 'http://h/x answered with JSON, not an event stream: {"choices": []}'
        assert isinstance(error, wire.ProviderProtocolError)
        assert (error.status, error.retry_after, error.incomplete) == (None, None, False)

    @pytest.mark.parametrize(
        ("body", "text", "error_type"),
        [
            pytest.param(
                '{"type": "error", "error": {"type": "authentication_error", '
                '"message": "invalid x-api-key"}}',
                "authentication_error: invalid x-api-key",
                "authentication_error",
                id="anthropic",
            ),
            pytest.param(
                '{"error": {"message": "model not found"}}', "model not found", None, id="no-type"
            ),
            pytest.param(
                '{"error": {"type": "server_error"}}',
                '{"error": {"type": "server_error"}}',
                "server_error",
                id="type-without-message",
            ),
            pytest.param(
                '{"error": "model \'x\' not found"}', "model 'x' not found", None, id="ollama"
            ),
            pytest.param('{"message": "Unauthorized"}', "Unauthorized", None, id="message"),
            pytest.param('{"detail": "nope"}', '{"detail": "nope"}', None, id="other-json"),
            pytest.param("[1]", "[1]", None, id="array"),
            pytest.param("", "(no body)", None, id="empty"),
            pytest.param("x" * 300, "x" * 200 + "...", None, id="long"),
            pytest.param("x" * 200, "x" * 200, None, id="200-characters-are-kept-whole"),
            pytest.param("x" * 201, "x" * 200 + "...", None, id="201-are-cut"),
            pytest.param(
                '{"error": {"type": 5, "message": "m"}}', "m", None, id="a-type-that-is-no-str"
            ),
            pytest.param("[" * 40_000, "[" * 200 + "...", None, id="nested-too-deeply"),
            pytest.param("caf\udce9", "caf\ufffd", None, id="not-utf-8"),
        ],
    )
    def test_the_provider_error_text_and_type(
        self, body: str, text: str, error_type: Optional[str]
    ) -> None:
        raw = body.encode("utf-8", "surrogateescape")  # not-utf-8: a lone byte 0xe9
        with pytest.raises(wire.ProviderError) as caught:
            wire.check_response_head("http://h/x", 401, "Reason", {}, lambda: raw, 0.0)
        assert str(caught.value) == f"http://h/x answered HTTP 401 Reason: {text}"
        assert (caught.value.status, caught.value.error_type) == (401, error_type)

    @pytest.mark.parametrize(
        ("headers", "retry_after"),
        [
            pytest.param({"retry-after-ms": "1500", "retry-after": "2"}, 1.5, id="ms-first"),
            pytest.param({"retry-after": "0.25"}, 0.25, id="seconds"),
            pytest.param({"retry-after": "0"}, 0.0, id="zero"),
            pytest.param({"retry-after-ms": "x", "retry-after": "3"}, 3.0, id="bad-ms"),
            pytest.param({"retry-after": "Wed, 21 Oct 2015 07:28:30 GMT"}, 30.0, id="date"),
            pytest.param({"retry-after": "Wed, 21 Oct 2015 07:28:30 -0000"}, 30.0, id="utc"),
            pytest.param({"retry-after": "Wed, 21 Oct 2015 07:27:00 GMT"}, 0.0, id="past"),
            pytest.param({"retry-after": "soon"}, None, id="text"),
            pytest.param(
                {"retry-after": "Wed, 21 Oct 99999999999 07:28:30 GMT"}, None, id="huge-year"
            ),
            pytest.param(
                {"retry-after": "Wed, 21 Oct 2015 99999999999:28:30 GMT"}, None, id="huge-hour"
            ),
            pytest.param({"retry-after": ""}, None, id="empty"),
            pytest.param({"retry-after": "-1", "retry-after-ms": "nan"}, None, id="negative"),
            pytest.param({"retry-after": "inf"}, None, id="infinite"),
            pytest.param({}, None, id="none"),
        ],
    )
    def test_retry_after_forms(
        self, headers: Dict[str, str], retry_after: Optional[float]
    ) -> None:
        now = email.utils.parsedate_to_datetime("Wed, 21 Oct 2015 07:28:00 GMT").timestamp()
        error = self.error(503, headers, "busy", now)
        assert (error.status, error.retry_after) == (503, retry_after)
        said = "" if retry_after is None else f" (Retry-After: {retry_after:g} s)"
        assert str(error) == f"http://h/x answered HTTP 503 Reason: busy{said}"

    def test_a_utc_date_does_not_depend_on_the_local_time_zone(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # "-0000" parses to a date without a zone: it is UTC, not the machine's local time.
        now = email.utils.parsedate_to_datetime("Wed, 21 Oct 2015 07:28:00 GMT").timestamp()
        monkeypatch.setenv("TZ", "Asia/Tokyo")
        time.tzset()
        try:
            error = self.error(503, {"retry-after": "Wed, 21 Oct 2015 07:28:30 -0000"}, "", now)
        finally:
            monkeypatch.undo()
            time.tzset()
        assert error.retry_after == 30.0

    def test_now_is_the_clock_when_not_given(self) -> None:
        # A date a day ahead: about 86,400 s from now, whatever the clock says.
        ahead = email.utils.formatdate(time.time() + 86_400, usegmt=True)
        with pytest.raises(wire.ProviderError) as caught:
            wire.check_response_head("u", 429, "", {"retry-after": ahead}, lambda: b"busy")
        assert caught.value.retry_after is not None
        assert 86_300 < caught.value.retry_after <= 86_400


# --- Server-sent events ------------------------------------------------------------------

Event = Tuple[str, str]  # (event type, data)

VECTORS: List[Tuple[str, bytes, List[Event]]] = [
    # WHATWG: "Once the end of the file is reached, any pending data must be discarded.
    # (If the file ends in the middle of an event, before the final empty line, the
    # incomplete event is not dispatched.)"
    ("a stream that ends mid-event", b"data: one\n\ndata: two\n", [("", "one")]),
    ("a stream that ends mid-line", b"data: one\n\ndata: tw", [("", "one")]),
    # WHATWG: "Lines must be separated by either a U+000D CARRIAGE RETURN U+000A LINE FEED
    # (CRLF) character pair, a single U+000A LINE FEED (LF) character, or a single U+000D
    # CARRIAGE RETURN (CR) character."
    ("CR-only line ends", b"data: a\r\rdata: b\r\r", [("", "a"), ("", "b")]),
    ("LF-only line ends", b"data: a\n\ndata: b\n\n", [("", "a"), ("", "b")]),
    ("CRLF line ends", b"data: a\r\n\r\ndata: b\r\n\r\n", [("", "a"), ("", "b")]),
    ("mixed line ends", b"data: a\r\ndata: b\rdata: c\n\r\n", [("", "a\nb\nc")]),
    # WHATWG: data "Append the field value to the data buffer, then append a single U+000A
    # LINE FEED (LF) character"; at dispatch "If the data buffer's last character is a
    # U+000A LINE FEED (LF) character, then remove the last character": "data:" alone
    # leaves "\n", which is not empty, so an event with data "" is dispatched.
    ("data with an empty value", b"data:\n\n", [("", "")]),
    ("data with one space only", b"data: \n\n", [("", "")]),
    ("empty data lines count", b"data:\ndata:\n\n", [("", "\n")]),
    # WHATWG: "The UTF-8 decode algorithm strips one leading UTF-8 Byte Order Mark (BOM),
    # if any."
    ("a leading byte order mark", b"\xef\xbb\xbfdata: a\n\n", [("", "a")]),
    ("a second byte order mark is kept", b"\xef\xbb\xbf\xef\xbb\xbfdata: a\n\n", []),
    # WHATWG: "If the line starts with a U+003A COLON character (:) Ignore the line."
    ("comments", b": keep-alive\ndata: a\n: more\n\n:\n\n", [("", "a")]),
    # WHATWG: "If the field name is "id"": the last event ID; "retry": the reconnection
    # time. Neither makes data, and a block with only them dispatches nothing.
    ("id and retry", b"id: 7\nretry: 1000\ndata: a\n\nid: 8\n\nretry: 5\n\n", [("", "a")]),
    ("event names the type", b"event: ping\ndata: a\n\ndata: b\n\n", [("ping", "a"), ("", "b")]),
    ("an event without data is none", b"event: ping\n\n", []),
    ("a blank line resets the type", b"event: a\n\ndata: b\n\n", [("", "b")]),
    ("multi-line data", b"data: one\ndata: two\ndata:three\n\n", [("", "one\ntwo\nthree")]),
    # WHATWG: "Otherwise, the string is not empty but does not contain a U+003A COLON
    # character (:) Process the field using ... the whole line as the field name, and the
    # empty string as the field value."
    ("a field without a colon", b"data\n\n", [("", "")]),
    ("an unknown field is ignored", b"foo: bar\ndata: a\nfoo\n\n", [("", "a")]),
    # WHATWG: "If value starts with a U+0020 SPACE character, remove it from value."
    ("only one space is dropped", b"data:  a \n\n", [("", " a ")]),
    ("a colon in the value", b'data: {"a":1}\n\n', [("", '{"a":1}')]),
    ("UTF-8 text", "data: \u00e9t\u00e9 \u2603\n\n".encode(), [("", "\u00e9t\u00e9 \u2603")]),
]


def parsed(chunks: List[bytes]) -> List[Event]:
    stream = wire.ServerSentEvents()
    events = [event for chunk in chunks for event in stream.feed(chunk)]
    assert stream.feed(b"") == []  # the end dispatches nothing
    return [(event.event, event.data) for event in events]


@pytest.mark.parametrize(("name", "stream", "expected"), VECTORS, ids=[v[0] for v in VECTORS])
def test_the_event_stream_is_read_as_whatwg_says(
    name: str, stream: bytes, expected: List[Event]
) -> None:
    assert parsed([stream]) == expected
    assert parsed([stream[i : i + 1] for i in range(len(stream))]) == expected  # every byte
    for cut in range(len(stream) + 1):  # and every cut in two
        assert parsed([stream[:cut], stream[cut:]]) == expected


def test_a_crlf_cut_between_reads_is_one_line_end() -> None:
    stream = wire.ServerSentEvents()
    assert stream.feed(b"data: a\r") == []
    assert [event.data for event in stream.feed(b"\n\r")] == ["a"]
    assert stream.feed(b"\n") == []  # the LF of the CRLF that ended the event
    assert [event.data for event in stream.feed(b"data: b\n\n")] == ["b"]


@pytest.mark.parametrize("max_size", [8, None], ids=["given", "the-default"])
@pytest.mark.parametrize("fits", [AT_LIMIT, OVER_LIMIT])
def test_a_line_or_an_event_over_max_size_is_refused(max_size: Optional[int], fits: bool) -> None:
    """A line that has not ended yet, and an event's data joined (its LF counts)."""
    size, more = max_size or wire.MAX_EVENT_SIZE, 0 if fits else 1
    line = b"data:" + b"x" * (size - 5 + more)
    half = size // 2
    event = b"data: " + b"y" * half + b"\ndata: " + b"y" * (size - half - 1 + more) + b"\n"
    for start, end, data, what in [
        (line, b"\n\n", size - 5, "a line"),
        (event, b"\n", size, "an event"),
    ]:
        parser = wire.ServerSentEvents() if max_size is None else wire.ServerSentEvents(max_size)
        if fits:
            assert parser.feed(start) == []
            assert [len(event.data) for event in parser.feed(end)] == [data]
        else:
            with pytest.raises(wire.ProviderProtocolError, match=f"{what} longer than {size:,}$"):
                parser.feed(start)


@pytest.mark.parametrize("max_size", [0, True, 1.5, "8"])
def test_max_size_is_an_int_of_at_least_one(max_size: object) -> None:
    with pytest.raises(TypeError, match="max_size must be an int >= 1"):
        wire.ServerSentEvents(max_size)  # type: ignore[arg-type]


def test_bytes_that_are_not_utf8_are_refused() -> None:
    with pytest.raises(wire.ProviderProtocolError, match="not UTF-8"):
        wire.ServerSentEvents().feed(b"data: \xff\n\n")


class TestServerEvents:
    """The event-stream parser, from byte strings alone."""

    def parse(self, *reads: bytes) -> List[Tuple[str, str]]:
        parser = wire.ServerSentEvents()
        return [(event.event, event.data) for data in reads for event in parser.feed(data)]

    def test_the_end_of_the_input_drops_what_is_open(self) -> None:
        parser = wire.ServerSentEvents()
        assert parser.feed(b"event: x\ndata: a\ndata: b") == []
        assert parser.feed(b"") == []
        assert parser.feed(b"data: c\n\n") == [wire.ServerSentEvent("", "c")]  # none before

    def test_a_character_cut_by_the_end_of_the_input_is_malformed(self) -> None:
        parser = wire.ServerSentEvents()
        assert parser.feed("data: \u00e9".encode()[:-1]) == []
        with pytest.raises(wire.ProviderProtocolError, match="not UTF-8"):
            parser.feed(b"")

    def test_a_long_run_of_empty_data_lines_is_an_oversized_event(self) -> None:
        # A server that sends "data:" lines forever: the limit ends it, a read at a time.
        lines = b"data:\n" * (wire.MAX_EVENT_SIZE + 2)
        reads = [lines[start : start + 65_536] for start in range(0, len(lines), 65_536)]
        assert self.parse(*reads[:-1], reads[-1][: -len(b"data:\n")], b"\n") == [
            ("", "\n" * wire.MAX_EVENT_SIZE)
        ]
        with pytest.raises(
            wire.ProviderError, match="malformed event stream: an event longer than 1,048,576"
        ):
            self.parse(*reads)

    def test_the_size_starts_again_after_each_event_and_at_the_end_of_the_input(self) -> None:
        # An event of the limit's size, twice: the first one's size is not counted in the
        # second's, dispatched or dropped at the end of the input.
        full = b"data: " + b"z" * wire.MAX_EVENT_SIZE + b"\n"
        parser = wire.ServerSentEvents()
        assert [len(event.data) for event in parser.feed(full + b"\n" + full + b"\n")] == [
            wire.MAX_EVENT_SIZE,
            wire.MAX_EVENT_SIZE,
        ]
        assert parser.feed(full) == []
        assert parser.feed(b"") == []  # dropped
        assert len(parser.feed(full + b"\n")[0].data) == wire.MAX_EVENT_SIZE

    def test_events_are_frozen_values(self) -> None:
        event = wire.ServerSentEvent("message_stop", "{}")
        assert event == wire.ServerSentEvent("message_stop", "{}")
        with pytest.raises(AttributeError):
            event.data = "x"  # type: ignore[misc]


# --- What a refusal says -----------------------------------------------------------------

LLAMA_CPP = (
    '{"error": {"code": 400, "message": "request (4476 tokens) exceeds the available '
    'context size (4096 tokens)", "type": "exceed_context_size_error"}}'
)
# Each provider's error body: its code (a str, else None), and whether it says that the
# request is longer than the model's context; a swapped reading fails its row.
ERROR_BODIES = [
    pytest.param(
        '{"error": {"message": "This model\'s maximum context length is 50 tokens.", "type": '
        '"invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}',
        "context_length_exceeded",
        True,
        id="openai-llama-cpp-python-llmock",
    ),
    pytest.param(LLAMA_CPP, None, True, id="llama-cpp-server"),
    pytest.param(
        '{"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is '
        'too long: 208154 tokens > 200000 maximum"}}',
        None,
        True,
        id="anthropic",
    ),
    pytest.param(
        '{"error": {"message": "Rate limit", "type": "requests", "code": "rate_limit_exceeded"}}',
        "rate_limit_exceeded",
        False,
        id="another-code",
    ),
    pytest.param(
        '{"error": {"type": "invalid_request_error", "message": "bad"}}',
        None,
        False,
        id="another-refusal",
    ),
    pytest.param(
        '{"error": {"code": "context_length_exceeded"}}',
        "context_length_exceeded",
        True,
        id="code-without-message",
    ),
    pytest.param('{"error": "prompt is too long"}', None, True, id="a-str-error"),
    pytest.param("prompt is too long", None, False, id="not-json"),
]


class TestWhatARefusalSays:
    """The provider's error code, a request longer than the context, and the provider's
    own id of an answer. (A cut's finish_reason: the broken-answer table of
    test_agent_loop_providers_failures.py.)"""

    @pytest.mark.parametrize(("body", "code", "exceeded"), ERROR_BODIES)
    def test_a_refusal_says_its_code_and_whether_the_request_exceeded_the_context(
        self, body: str, code: Optional[str], exceeded: bool
    ) -> None:
        with pytest.raises(wire.ProviderError) as caught:
            wire.check_response_head("http://h/x", 400, "Bad Request", {}, body.encode, 0.0)
        assert (caught.value.code, caught.value.context_exceeded) == (code, exceeded)
        assert caught.value.finish_reason is None
        # The same words in an error event say the same.
        answer = wire.OpenAIAnswer(request())
        with pytest.raises(wire.ProviderError) as event:
            answer.feed(b"event: error\ndata: " + body.encode() + b"\n\n")
        assert (event.value.code, event.value.context_exceeded) == (code, exceeded)

    @pytest.mark.parametrize(
        ("provider", "parts", "provider_id"),
        [
            ("openai", [openai_chunk({"content": "Hi"}), STOP, DONE], "chatcmpl-1"),
            (
                "openai",
                [sse({"choices": [{"delta": {"content": "Hi"}, "finish_reason": "stop"}]}), DONE],
                None,
            ),
            (
                "openai",
                [sse({"id": 7, "choices": []}), openai_chunk({}, "stop"), DONE],
                "chatcmpl-1",
            ),
            ("anthropic", [MESSAGE_START, *anthropic_text(0, "Hi"), *anthropic_end()], "msg_1"),
            ("anthropic", [*anthropic_text(0, "Hi"), *anthropic_end()], None),
        ],
        ids=["openai", "openai-without", "openai-first-str", "anthropic", "anthropic-without"],
    )
    def test_the_response_carries_the_providers_own_id(
        self, provider: str, parts: List[bytes], provider_id: Optional[str]
    ) -> None:
        answer = (
            wire.OpenAIAnswer(request())
            if provider == "openai"
            else wire.AnthropicAnswer(request())
        )
        _, response = answered(answer, *parts)
        assert response.provider_response_id == provider_id
        assert response.id == "response-001"  # the loop's own id is the library's, as before


# --- Ids ---------------------------------------------------------------------------------


class TestIds:
    """ResponseIds: unique in the transcript, deterministic."""

    def test_response_ids_are_free_in_the_transcript_and_take_the_providers_when_free(
        self,
    ) -> None:
        taken = al.AssistantMessage("message-response-001", [al.ToolCall("call_1", "add", {})])
        ids = wire.ResponseIds(request(messages=[al.UserMessage("user-001", "hi"), taken]))
        assert ids.response_id == "response-001-2"  # response-001 is taken
        assert [ids.call_id("call_1"), ids.call_id("call_2"), ids.call_id(None)] == [
            "response-001-2-call-1",  # the provider's is taken
            "call_2",
            "response-001-2-call-3",
        ]
        with pytest.raises(TypeError, match="request must be a ModelRequest, got str"):
            wire.ResponseIds("request-001")  # type: ignore[arg-type]
