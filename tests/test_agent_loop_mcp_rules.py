"""MCP's rules, sans-IO: agent_loop_mcp.McpProtocol tested with bytes, dicts and a fake
clock (the time is an argument: nothing here sleeps or waits).

Contents
    TestHandshake: initialize first, the versions spoken, initialized after it
    TestRequests: one counter, answers by id, errors, malformed answers, late answers
    TestProgressAndExpiry: a deadline per request, progress restarts it up to a cap and is
        reported (a table of notifications)
    TestCancellation: notifications/cancelled, never for initialize, nothing after the answer
    TestHttp: a cancel goes after its request is written, and is dropped if it never was;
        the session id, and a 404 that ends the session
    TestServerMessages: ping, other requests refused, list_changed, unreadable messages
    TestLoss: a lost session fails every request in flight and every later one
"""

from __future__ import annotations

import json
from typing import Any, Dict

import pytest

import agent_loop_mcp as mcp

TIMEOUT = 10.0


def wire(message: Dict[str, Any]) -> bytes:
    return json.dumps(message).encode("utf-8")


def result(request_id: object, value: Dict[str, Any]) -> bytes:
    return wire({"jsonrpc": "2.0", "id": request_id, "result": value})


def cancel_of(request_id: int, reason: str) -> mcp.Outgoing:
    params = {"requestId": request_id, "reason": reason}
    return mcp.Outgoing({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params})


def progress(token: object, **values: Any) -> bytes:
    params = {"progressToken": token, "progress": 1, **values}
    return wire({"jsonrpc": "2.0", "method": "notifications/progress", "params": params})


def opened(now: float = 0.0, posts: bool = False) -> mcp.McpProtocol:
    """A session past its handshake."""
    session = mcp.McpProtocol(TIMEOUT, posts=posts)
    if posts:
        session.written(1)
    request_id, _ = session.initialize(now)
    [answer] = session.receive(result(request_id, {"protocolVersion": "2025-06-18"}), now)
    assert isinstance(answer, mcp.Answer)
    session.initialized(answer)
    return session


def call(session: mcp.McpProtocol, now: float = 0.0) -> int:
    request_id, _ = session.request("tools/call", {"name": "t", "arguments": {}}, now)
    return request_id


class TestHandshake:
    def test_initialize_offers_the_newest_version_and_declares_no_capabilities(self) -> None:
        session = mcp.McpProtocol(TIMEOUT)
        request_id, message = session.initialize(0.0)
        assert message == {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "initialize",
            "params": {
                "protocolVersion": mcp.PROTOCOL_VERSIONS[0],
                "capabilities": {},
                "clientInfo": {"name": "agent_loop_mcp", "version": mcp.__version__},
            },
        }

    @pytest.mark.parametrize("version", mcp.PROTOCOL_VERSIONS)
    def test_every_version_it_speaks_is_accepted(self, version: str) -> None:
        session = mcp.McpProtocol(TIMEOUT)
        request_id, _ = session.initialize(0.0)
        [answer] = session.receive(result(request_id, {"protocolVersion": version}), 0.0)
        assert isinstance(answer, mcp.Answer)
        assert session.initialized(answer) == {
            "jsonrpc": "2.0",
            "method": "notifications/initialized",
        }
        assert session.protocol_version == version

    @pytest.mark.parametrize("version", ["2099-01-01", None, 5])
    def test_another_version_is_refused(self, version: object) -> None:
        session = mcp.McpProtocol(TIMEOUT)
        request_id, _ = session.initialize(0.0)
        [answer] = session.receive(result(request_id, {"protocolVersion": version}), 0.0)
        assert isinstance(answer, mcp.Answer)
        with pytest.raises(mcp.McpError, match=f"protocol version {version!r}; this client"):
            session.initialized(answer)
        assert session.protocol_version is None  # nothing changed

    def test_a_failed_initialize_is_refused(self) -> None:
        session = mcp.McpProtocol(TIMEOUT)
        request_id, _ = session.initialize(0.0)
        error = {"code": -32602, "message": "Unsupported"}
        [answer] = session.receive(wire({"jsonrpc": "2.0", "id": request_id, "error": error}), 0)
        assert isinstance(answer, mcp.Answer)
        with pytest.raises(mcp.McpError, match="initialize failed: JSON-RPC error -32602"):
            session.initialized(answer)

    @pytest.mark.parametrize(
        ("timeout", "error"),
        [(0, ValueError), (-1, ValueError), (float("inf"), ValueError), (True, TypeError),
         ("1", TypeError)],
    )  # fmt: skip
    def test_the_timeout_is_a_positive_finite_number(self, timeout: Any, error: type) -> None:
        with pytest.raises(error, match="timeout must be"):
            mcp.McpProtocol(timeout)


class TestRequests:
    def test_requests_are_numbered_by_one_counter_and_answered_by_id(self) -> None:
        session = opened()
        first, message = session.request("tools/list", None, 1.0)
        second, _ = session.request("tools/list", {"cursor": "2"}, 1.0)
        assert (first, second) == (2, 3)  # initialize was 1
        assert message == {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        assert session.pending() == (2, 3)
        assert session.receive(result(3, {"tools": []}), 2.0) == [
            mcp.Answer(3, "tools/list", {"tools": []})
        ]
        assert session.pending() == (2,)

    def test_a_call_carries_its_id_as_progress_token(self) -> None:
        session = opened()
        request_id, message = session.request("tools/call", {"name": "t", "arguments": {}}, 0)
        assert message["params"] == {
            "name": "t",
            "arguments": {},
            "_meta": {"progressToken": request_id},
        }

    def test_a_jsonrpc_error_fails_its_request(self) -> None:
        session = opened()
        request_id = call(session)
        error = {"code": -32000, "message": "no", "data": {"why": 1}}
        message = wire({"jsonrpc": "2.0", "id": request_id, "error": error})
        assert session.receive(message, 0.0) == [
            mcp.Answer(
                request_id,
                "tools/call",
                None,
                "tools/call failed: JSON-RPC error -32000: 'no' ({'why': 1})",
            )
        ]

    @pytest.mark.parametrize("body", [{"result": [1]}, {"result": None}, {}])
    def test_an_answer_that_is_no_result_fails_its_request(self, body: Dict[str, Any]) -> None:
        session = opened()
        request_id = call(session)
        [answer] = session.receive(wire({"jsonrpc": "2.0", "id": request_id, **body}), 0.0)
        assert isinstance(answer, mcp.Answer)
        assert answer.result is None
        assert answer.failure is not None
        assert answer.failure.startswith("tools/call: the server's answer is malformed")

    @pytest.mark.parametrize("request_id", [99, True, "2", None, [2], 2.0])
    def test_an_answer_to_no_pending_request_changes_nothing(self, request_id: object) -> None:
        session = opened()
        call(session)
        assert session.receive(result(request_id, {}), 0.0) == []
        assert session.pending() == (2,)


class TestProgressAndExpiry:
    def test_a_request_expires_at_its_deadline_and_is_cancelled(self) -> None:
        session = opened()
        request_id = call(session, now=100.0)
        assert session.deadline(request_id) == 100.0 + TIMEOUT
        assert session.expire(100.0 + TIMEOUT - 0.001) == []  # one side of the deadline
        assert session.expire(100.0 + TIMEOUT) == [  # and the other
            mcp.Answer(
                request_id,
                "tools/call",
                None,
                "tools/call got no answer within 10 s, and was cancelled",
            ),
            cancel_of(request_id, "timed out"),
        ]
        assert session.deadline(request_id) is None
        assert session.receive(result(request_id, {}), 111.0) == []  # a late answer is ignored

    def test_progress_restarts_the_wait(self) -> None:
        session = opened()
        request_id = call(session, now=0.0)
        session.receive(progress(request_id), 8.0)
        assert session.deadline(request_id) == 18.0
        assert session.expire(17.9) == []

    # MCP: the notification holds "The current progress value so far; An optional "total"
    # value; An optional "message" value"; "The progress value MUST increase with each
    # notification"; "The progress and the total values MAY be floating point."
    @pytest.mark.parametrize(
        ("values", "reported"),
        [
            ({}, {"progress": 1}),
            ({"progress": 0.5, "total": 2.5, "message": "half"},
             {"progress": 0.5, "total": 2.5, "message": "half"}),
            ({"total": None, "message": None}, {"progress": 1}),
            ({"progress": "1"}, None),
            ({"progress": True}, None),
            ({"progress": [1]}, None),
            ({"total": "2"}, None),
            ({"message": 5}, None),
        ],
        ids=["progress", "all", "nulls", "str", "bool", "list", "total-str", "message-int"],
    )  # fmt: skip
    def test_a_calls_progress_is_reported_as_the_server_sent_it(
        self, values: Dict[str, Any], reported: Any
    ) -> None:
        session = opened()
        request_id = call(session, now=0.0)
        expected = [] if reported is None else [mcp.Progress(request_id, reported)]
        assert session.receive(progress(request_id, **values), 8.0) == expected
        assert session.deadline(request_id) == 18.0  # each moves the deadline all the same

    def test_progress_that_does_not_increase_is_not_reported(self) -> None:
        session = opened()
        request_id = call(session, now=0.0)
        sent = [session.receive(progress(request_id, progress=n), 1.0) for n in (1, 1, 0, 2)]
        assert sent == [[mcp.Progress(request_id, {"progress": 1})], [], [],
                        [mcp.Progress(request_id, {"progress": 2})]]  # fmt: skip

    def test_progress_does_not_extend_a_call_past_max_progress_timeouts(self) -> None:
        session = opened()
        request_id = call(session, now=0.0)
        cap = mcp.MAX_PROGRESS_TIMEOUTS * TIMEOUT
        for now in range(5, int(cap) + 20, 5):
            session.receive(progress(request_id), float(now))
        assert session.deadline(request_id) == cap
        [answer, _cancel] = session.expire(cap)
        assert isinstance(answer, mcp.Answer)
        assert answer.failure == f"tools/call got no answer within {cap:.3g} s, and was cancelled"

    @pytest.mark.parametrize("token", [99, "2", True, None])
    def test_progress_for_no_request_in_flight_is_ignored(self, token: object) -> None:
        session = opened()
        request_id = call(session, now=0.0)
        assert session.receive(progress(token), 5.0) == []
        assert session.deadline(request_id) == TIMEOUT

    def test_progress_only_moves_a_call(self) -> None:
        session = opened()
        listing, _ = session.request("tools/list", None, 0.0)
        session.receive(progress(listing), 5.0)
        assert session.deadline(listing) == TIMEOUT

    def test_a_timeout_names_the_last_message_that_could_not_be_read(self) -> None:
        session = opened()
        request_id = call(session, now=0.0)
        assert session.receive(b"Server ready!", 1.0) == [
            mcp.Unreadable(
                "a message that is not JSON (Expecting value: line 1 column 1 (char 0)): "
                "Server ready!"
            )
        ]
        [answer, _] = session.expire(TIMEOUT)
        assert isinstance(answer, mcp.Answer)
        assert answer.failure is not None
        assert answer.failure.endswith(
            "and was cancelled (the server sent a message that is not JSON "
            "(Expecting value: line 1 column 1 (char 0)): Server ready!)"
        )
        assert answer.request_id == request_id


class TestCancellation:
    def test_a_cancel_ends_the_request_and_tells_the_server(self) -> None:
        session = opened()
        request_id = call(session)
        assert session.cancel(
            request_id, "the run was cancelled", "was cancelled with the run"
        ) == [
            mcp.Answer(request_id, "tools/call", None, "tools/call was cancelled with the run"),
            cancel_of(request_id, "the run was cancelled"),
        ]
        assert session.pending() == ()
        # MCP: "The sender of the cancellation notification SHOULD ignore any response to
        # the request that arrives afterward"
        assert session.receive(result(request_id, {"content": []}), 1.0) == []

    def test_a_cancel_after_the_answer_sends_nothing(self) -> None:
        session = opened()
        request_id = call(session)
        session.receive(result(request_id, {}), 0.0)
        assert session.cancel(request_id, "timed out", "x") == []

    def test_initialize_is_never_cancelled(self) -> None:
        session = mcp.McpProtocol(TIMEOUT)
        request_id, _ = session.initialize(0.0)
        [answer] = session.expire(TIMEOUT)
        assert answer == mcp.Answer(
            request_id,
            "initialize",
            None,
            "initialize got no answer within 10 s, and was cancelled",
        )

    def test_the_next_request_after_a_cancel_works(self) -> None:
        session = opened()
        session.cancel(call(session), "the run was cancelled", "was cancelled with the run")
        request_id = call(session)
        assert session.receive(result(request_id, {"content": []}), 0.0) == [
            mcp.Answer(request_id, "tools/call", {"content": []})
        ]


class TestHttp:
    def test_a_cancel_goes_after_its_request_is_written(self) -> None:
        session = opened(posts=True)
        request_id = call(session)
        assert session.writing(request_id)
        [answer] = session.cancel(request_id, "timed out", "was cancelled")  # held
        assert answer == mcp.Answer(request_id, "tools/call", None, "tools/call was cancelled")
        assert session.written(request_id) == [cancel_of(request_id, "timed out")]
        assert session.written(request_id) == []  # it went once

    @pytest.mark.parametrize("ended", ["before-connecting", "while-connecting", "write-failed"])
    def test_a_cancel_is_dropped_if_its_request_never_was_written(self, ended: str) -> None:
        session = opened(posts=True)
        request_id = call(session)
        if ended == "while-connecting":
            assert session.writing(request_id)  # connecting
        session.cancel(request_id, "timed out", "was cancelled")
        if ended == "write-failed":
            assert session.end(request_id, "tools/call: broke") == []  # it had ended
        else:
            assert not session.writing(request_id)  # so it is never written
        assert session.written(request_id) == []  # and the cancel held for it is gone

    def test_over_stdio_a_cancel_goes_at_once(self) -> None:
        session = opened()
        request_id = call(session)
        [_, cancel] = session.cancel(request_id, "timed out", "was cancelled")
        assert cancel == cancel_of(request_id, "timed out")

    def test_a_written_request_is_cancelled_at_once(self) -> None:
        session = opened(posts=True)
        request_id = call(session)
        assert session.written(request_id) == []
        [_, cancel] = session.cancel(request_id, "timed out", "was cancelled")
        assert cancel == cancel_of(request_id, "timed out")

    def test_a_lost_session_holds_no_cancel(self) -> None:
        session = opened(posts=True)
        request_id = call(session)
        session.lose("closed")
        assert session.written(request_id) == []

    # MCP: "The session ID MUST only contain visible ASCII characters (ranging from 0x21
    # to 0x7E)."
    @pytest.mark.parametrize(
        ("session_id", "kept"),
        [("abc-1", "abc-1"), ("\x21\x7e", "\x21\x7e"), (None, None), ("", None),
         ("a b", None), ("\x7f", None), ("é", None)],
        ids=["plain", "bounds", "none", "empty", "space", "over", "non-ascii"],
    )  # fmt: skip
    def test_a_session_id_is_kept_only_when_it_is_visible_ascii(
        self, session_id: Any, kept: Any
    ) -> None:
        session = mcp.McpProtocol(TIMEOUT, posts=True)
        problem = session.start_session(session_id)
        assert session.session_id == kept
        assert (problem is None) is (kept is not None or session_id is None)

    @pytest.mark.parametrize("session_id", ["s-1", None])
    def test_http_404_with_a_session_id_ends_the_session(self, session_id: Any) -> None:
        session = opened(posts=True)
        session.start_session(session_id)
        request_id = call(session)
        [answer] = session.http_error(request_id, 404, lambda: "Not Found")
        assert isinstance(answer, mcp.Answer)
        if session_id is None:  # no session to end: an HTTP error like any other
            assert answer.failure == "tools/call: HTTP 404: Not Found"
            assert session.protocol_version is not None
            return
        # MCP: "When a client receives HTTP 404 in response to a request containing an
        # MCP-Session-Id, it MUST start a new session"
        assert answer.failure == (
            "tools/call: the server ended the session (HTTP 404); the next request opens a new one"
        )
        assert (session.session_id, session.protocol_version) == (None, None)

    def test_an_http_error_of_a_request_that_ended_changes_nothing(self) -> None:
        session = opened(posts=True)
        request_id = call(session)
        session.cancel(request_id, "timed out", "was cancelled")
        assert session.http_error(request_id, 500, lambda: "boom") == []


class TestServerMessages:
    def test_a_ping_is_answered_and_other_requests_are_refused(self) -> None:
        session = opened()
        ping = wire({"jsonrpc": "2.0", "id": "p", "method": "ping"})
        assert session.receive(ping, 0.0) == [
            mcp.Outgoing({"jsonrpc": "2.0", "id": "p", "result": {}})
        ]
        ask = wire({"jsonrpc": "2.0", "id": 7, "method": "sampling/createMessage"})
        assert session.receive(ask, 0.0) == [
            mcp.Outgoing(
                {
                    "jsonrpc": "2.0",
                    "id": 7,
                    "error": {
                        "code": -32601,
                        "message": "Method not found: sampling/createMessage",
                    },
                }
            )
        ]

    def test_list_changed_is_tools_changed(self) -> None:
        session = opened()
        changed = wire({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        assert session.receive(changed, 0.0) == [mcp.ToolsChanged()]
        other = wire({"jsonrpc": "2.0", "method": "notifications/message", "params": {}})
        assert session.receive(other, 0.0) == []

    @pytest.mark.parametrize(
        ("data", "words"),
        [
            (b"not json", "a message that is not JSON"),
            (b"NaN", "a message that is not JSON (NaN is not JSON)"),
            (b"[" * 100_000, "a message that is not JSON"),
            (b"[1]", "a message that is not JSON-RPC 2.0"),
            (b'{"jsonrpc": "1.0", "id": 2, "result": {}}', "a message that is not JSON-RPC 2.0"),
        ],
    )
    def test_an_unreadable_message_changes_nothing(self, data: bytes, words: str) -> None:
        session = opened()
        request_id = call(session)
        [event] = session.receive(data, 0.0)
        assert isinstance(event, mcp.Unreadable)
        assert event.what.startswith(words)
        assert session.pending() == (request_id,)
        assert session.deadline(request_id) == TIMEOUT

    def test_an_unreadable_answer_fails_the_request_whose_exchange_carried_it(self) -> None:
        session = opened()
        request_id = call(session)
        events = session.receive(b"<html>", 0.0, origin=request_id)
        assert events[1] == mcp.Answer(
            request_id,
            "tools/call",
            None,
            "tools/call: the server sent a message that is not JSON "
            "(Expecting value: line 1 column 1 (char 0)): <html>",
        )
        assert session.receive(b"<html>", 0.0, origin=request_id)[1:] == []  # it has ended


class TestLoss:
    def test_a_lost_session_fails_every_request_and_every_later_one(self) -> None:
        session = opened()
        first, second = call(session), call(session)
        assert session.lose("the server exited with status 1") == [
            mcp.Answer(
                first,
                "tools/call",
                None,
                "tools/call did not finish: the server exited with status 1",
            ),
            mcp.Answer(
                second,
                "tools/call",
                None,
                "tools/call did not finish: the server exited with status 1",
            ),
        ]
        session.lose("another reason")
        assert session.lost == "the server exited with status 1"  # the first is kept
        with pytest.raises(mcp.McpError, match="the server exited with status 1"):
            call(session)

    def test_a_failure_of_what_was_read_fails_every_request_but_not_the_session(self) -> None:
        session = opened()
        request_id = call(session)
        assert session.fail("failed: too big") == [
            mcp.Answer(request_id, "tools/call", None, "tools/call failed: too big")
        ]
        assert session.lost is None
        call(session)

    def test_end_fails_one_request_without_a_cancel(self) -> None:
        session = opened()
        first, second = call(session), call(session)
        assert session.end(first, "tools/call: HTTP 500") == [
            mcp.Answer(first, "tools/call", None, "tools/call: HTTP 500")
        ]
        assert session.end(first, "again") == []
        assert session.pending() == (second,)


def test_events_that_hold_a_mapping_are_not_hashable() -> None:
    with pytest.raises(TypeError):
        hash(mcp.Answer(1, "tools/call", {}))
    with pytest.raises(TypeError):
        hash(mcp.Outgoing({}))
    assert hash(mcp.ToolsChanged()) == hash(mcp.ToolsChanged())
    with pytest.raises(TypeError):
        hash(mcp.Progress(1, {}))
