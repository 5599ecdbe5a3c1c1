"""The one event-stream parser both companions read with (agent_loop_providers'
``ServerSentEvents``, which agent_loop_mcp.py imports), against one table of vectors
written from the WHATWG HTML standard, "9.2.6 Interpreting an event stream".

Each vector is fed whole, and split at every byte (so that a CRLF, a UTF-8 character
and the byte order mark are cut across reads), then ended with ``feed(b"")``.
"""

from __future__ import annotations

from typing import List, Tuple

import pytest

import agent_loop_providers as providers

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
    stream = providers.ServerSentEvents()
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
    stream = providers.ServerSentEvents()
    assert stream.feed(b"data: a\r") == []
    assert [event.data for event in stream.feed(b"\n\r")] == ["a"]
    assert stream.feed(b"\n") == []  # the LF of the CRLF that ended the event
    assert [event.data for event in stream.feed(b"data: b\n\n")] == ["b"]


@pytest.mark.parametrize(
    ("size", "fails"),
    [pytest.param(8, False, id="at-limit"), pytest.param(9, True, id="over-limit")],
)
def test_an_event_or_a_line_over_max_size_is_refused(size: int, fails: bool) -> None:
    # An event's data joined (its LF counts), and a line that has not ended yet.
    for stream in (b"data: xxxx\ndata: " + b"x" * (size - 5) + b"\n\n", b":" * size):
        parser = providers.ServerSentEvents(max_size=8)
        if fails:
            with pytest.raises(providers.ProviderProtocolError, match="longer than 8"):
                parser.feed(stream)
        else:
            parser.feed(stream)


@pytest.mark.parametrize("max_size", [0, True, 1.5, "8"])
def test_max_size_is_an_int_of_at_least_one(max_size: object) -> None:
    with pytest.raises(TypeError, match="max_size must be an int >= 1"):
        providers.ServerSentEvents(max_size)  # type: ignore[arg-type]


def test_bytes_that_are_not_utf8_are_refused() -> None:
    with pytest.raises(providers.ProviderProtocolError, match="not UTF-8"):
        providers.ServerSentEvents().feed(b"data: \xff\n\n")
