# agent_loop_mcp.py 1.2.0: tools from MCP servers for agent_loop.py.
# Standard library only; copy it next to agent_loop.py and agent_loop_wire.py (which reads
# its event streams). Home: the agent_loop repository.
"""Tools from MCP servers (the Model Context Protocol) for the Agent Loop.

``StdioServer(command)`` runs a server as a process and speaks MCP over its standard
input and output; ``HttpServer(url)`` speaks MCP's Streamable HTTP transport. Both are
context managers whose ``.tools()`` are agent_loop ``Tool`` objects calling the server::

    with StdioServer(["python", "server.py"]) as server:
        tools = agent_loop.ToolRegistry(server.tools())
        result = agent_loop.settle_run(agent_loop.run_agent_loop(..., tools=tools))

In the order of this file: the limits; ``McpProtocol``, MCP's rules sans-IO (the
handshake, requests numbered by one counter and answered by id, deadlines that progress
moves, progress reported, cancellation (over HTTP, held until its request is written),
expiry, HTTP's session and its end: messages in, messages and answers out, the time given
as an argument); ``_SessionIO``, the I/O both transports share around it (callers that
wait, watching their run's signal; tools whose calls yield their progress);
``render_tool_result``, the sans-IO rendering of a result (values in and out); then each
transport, a pipe or socket loop that only moves bytes: ``StdioServer``, and
``HttpServer``, whose event streams are read by agent_loop_wire's ``ServerSentEvents``.
What the client does, and its rules, are in docs/mcp.md; the specification's words are
quoted at the checks (``# MCP: "..."``).
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import itertools
import json
import logging
import math
import os
import queue
import signal as signals
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse
import weakref
from dataclasses import dataclass
from typing import (
    IO,
    Any,
    Callable,
    Dict,
    Final,
    Generator,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
    cast,
)

import agent_loop
import agent_loop_wire as wire

__version__ = "1.2.0"

__all__ = [
    "StdioServer",
    "HttpServer",
    "McpError",
    "McpProtocol",
    "Answer",
    "Outgoing",
    "Progress",
    "ToolsChanged",
    "Unreadable",
    "SessionEvent",
    "render_tool_result",
    "PROTOCOL_VERSIONS",
    "MAX_MESSAGE_BYTES",
    "MAX_RESULT_TEXT",
    "MAX_TOOLS",
    "MAX_TOOL_PAGES",
    "MAX_PROGRESS_TIMEOUTS",
    "STDERR_TAIL_BYTES",
    "CLOSE_GRACE_SECONDS",
]

_logger = logging.getLogger("agent_loop.mcp")
_logger.addHandler(logging.NullHandler())

# --- Limits -----------------------------------------------------------------------------

# The handshake's versions, newest first: the first is offered, any is accepted.
PROTOCOL_VERSIONS: Final = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
# One message from a server, in bytes: room for an image of a few megabytes in base64.
MAX_MESSAGE_BYTES: Final = 8 * 1024 * 1024
# Code points of one tool result's content, as the model gets it.
MAX_RESULT_TEXT: Final = 65_536
# Tools of one server, and tools/list pages: a server that pages forever is refused.
MAX_TOOLS: Final = 1024
MAX_TOOL_PAGES: Final = 64
# MCP: "implementations SHOULD always enforce a maximum timeout, regardless of progress
# notifications": a request that reports progress still ends after this many timeouts.
MAX_PROGRESS_TIMEOUTS: Final = 10
# The end of a server's standard error that errors quote.
STDERR_TAIL_BYTES: Final = 4096
# Each wait of close(): for the server to exit once its input is closed, then after SIGTERM.
CLOSE_GRACE_SECONDS: Final = 2.0
# A waiting call looks at the run's signal every agent_loop.WATCH_SECONDS (50 ms).

_CLIENT_INFO: Final = {"name": "agent_loop_mcp", "version": __version__}
_METHOD_NOT_FOUND: Final = -32601
_READ_SIZE: Final = 65536  # bytes of an event stream read at once
_ERROR_EXCERPT: Final = 1000  # characters of a server's text that an error quotes


class McpError(Exception):
    """A server that cannot be used: it did not start, the handshake or ``tools/list``
    failed, one of its tools cannot be built, or the session is closed."""


# --- MCP's rules, sans-IO -----------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """A request's end: its ``result`` (a JSON object), or ``failure``, the sentence that
    says why it failed (then ``result`` is None)."""

    request_id: int
    method: str
    result: Optional[Dict[str, Any]] = None
    failure: Optional[str] = None
    __hash__ = None  # type: ignore[assignment]  # it holds a mapping


@dataclass(frozen=True)
class Outgoing:
    """A message for the server that the rules produced (a cancel, an answer to its ping)."""

    message: Dict[str, Any]
    __hash__ = None  # type: ignore[assignment]  # it holds a mapping


@dataclass(frozen=True)
class Progress:
    """A pending ``tools/call``'s progress, as its server reported it: ``progress`` holds
    ``progress`` (a number), and ``total`` (a number) and ``message`` (a str) when the
    server sent them; what the call's tool yields as a ``tool.progress`` event."""

    request_id: int
    progress: Dict[str, Any]
    __hash__ = None  # type: ignore[assignment]  # it holds a mapping


@dataclass(frozen=True)
class ToolsChanged:
    """The server said its list of tools changed: a list kept from before is stale."""


@dataclass(frozen=True)
class Unreadable:
    """A message that could not be read, named as the errors name it; it changed nothing."""

    what: str


SessionEvent = Union[Answer, Outgoing, Progress, ToolsChanged, Unreadable]
"""What ``McpProtocol`` returns: requests that ended, messages to send, and what happened."""


class McpProtocol:
    """MCP's rules for one client session, sans-IO: messages in, messages and answers out.

    The transport moves bytes and the caller gives the time (``now``, seconds of a
    monotonic clock): nothing here reads a clock, blocks or sends. ``request()`` numbers a
    request from one counter, keeps it pending with its deadline (``timeout`` seconds),
    and returns the message to send. ``receive(data, now)`` reads one message from the
    server: an answer ends its request (by id; an answer to no pending request is
    ignored), ``notifications/progress`` moves a pending call's deadline and is a
    ``Progress``, ``notifications/tools/list_changed`` is ``ToolsChanged``, a ``ping`` is
    answered and any other request refused. ``cancel()`` ends a pending request and
    produces its ``notifications/cancelled``; ``expire(now)`` does so for every request
    past its deadline; ``lose()`` ends them all, and every later request. Each returns a
    list of ``SessionEvent``: ``Answer`` for each request that ended, ``Outgoing`` for each
    message to send, in order.

    ``posts=True`` is Streamable HTTP, where each message is a POST of its own: a request
    counts as written only once the transport says so (``writing()``, then
    ``written()``), and a cancel that comes before is held until then, or dropped when the
    request is never written. There, ``session_id`` is the server's ``Mcp-Session-Id``
    (``start_session()``), and ``http_error()`` ends a request the server answered with an
    HTTP error, the session with it on a 404.
    """

    def __init__(self, timeout: float, *, posts: bool = False) -> None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__}")
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
        self.timeout = float(timeout)
        self.posts = posts
        self.protocol_version: Optional[str] = None  # once the handshake is done
        self.session_id: Optional[str] = None  # HTTP: the server's Mcp-Session-Id
        self.lost: Optional[str] = None  # why the session ended, once it has
        self._ids = itertools.count(1)
        self._pending: Dict[int, _Pending] = {}
        self._unwritten: Dict[int, Optional[Dict[str, Any]]] = {}  # HTTP: id -> held cancel
        self._unread: Optional[str] = None  # the last message that could not be read

    # Requests ----------------------------------------------------------------------------

    def initialize(self, now: float) -> Tuple[int, Dict[str, Any]]:
        """The ``initialize`` request: its id and its message."""
        # MCP: "The initialization phase MUST be the first interaction between client and
        # server."
        params = {
            "protocolVersion": PROTOCOL_VERSIONS[0],
            "capabilities": {},
            "clientInfo": dict(_CLIENT_INFO),
        }
        return self.request("initialize", params, now)

    def initialized(self, answer: Answer) -> Dict[str, Any]:
        """Reads ``initialize``'s answer; returns the ``notifications/initialized`` to send.

        Raises McpError for a failed answer or a protocol version this client does not speak.
        """
        if answer.result is None:
            raise McpError(answer.failure)
        version = answer.result.get("protocolVersion")
        # MCP: "If the client does not support the version in the server's response, it
        # SHOULD disconnect."
        if version not in PROTOCOL_VERSIONS:
            raise McpError(
                f"the server answered initialize with protocol version {version!r}; "
                f"this client speaks {', '.join(PROTOCOL_VERSIONS)}"
            )
        self.protocol_version = version
        # MCP: "After successful initialization, the client MUST send an initialized
        # notification to indicate it is ready to begin normal operations"
        return _notification("notifications/initialized")

    def request(
        self, method: str, params: Optional[Dict[str, Any]], now: float
    ) -> Tuple[int, Dict[str, Any]]:
        """A new request, pending from ``now``: its id and its message.

        Raises McpError once the session is lost (``lost`` says why).
        """
        if self.lost is not None:
            raise McpError(self.lost)
        request_id = next(self._ids)
        self._pending[request_id] = _Pending(method, now, now + self.timeout)
        if self.posts:
            self._unwritten[request_id] = None  # no cancel held yet
        message: Dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if method == "tools/call":
            # MCP: "When a party wants to receive progress updates for a request, it
            # includes a progressToken in the request metadata." The id is unique among
            # the requests in flight, as a token must be.
            params = {**(params or {}), "_meta": {"progressToken": request_id}}
        if params is not None:
            message["params"] = params
        return request_id, message

    def deadline(self, request_id: int) -> Optional[float]:
        """When a pending request times out; None once it has ended."""
        pending = self._pending.get(request_id)
        return None if pending is None else pending.deadline

    def pending(self) -> Tuple[int, ...]:
        """The ids of the requests waiting for their answer, oldest first."""
        return tuple(self._pending)

    def writing(self, request_id: int) -> bool:
        """HTTP: whether to write the request now; False when it ended before it was
        written (it is then never written, and a cancel held for it is dropped)."""
        if request_id in self._pending:
            return True
        self._unwritten.pop(request_id, None)
        return False

    def written(self, request_id: int) -> List[SessionEvent]:
        """HTTP: the request is written; the cancel held for it, if any, is to go now."""
        held = self._unwritten.pop(request_id, None)
        return [] if held is None else [Outgoing(held)]

    def cancel(self, request_id: int, reason: str, why: str) -> List[SessionEvent]:
        """Ends a pending request (its failure: its method, then ``why``) and produces its
        ``notifications/cancelled`` with ``reason``; nothing when it has ended already.

        The notice asks; it does not stop the server: MCP: "Receivers MAY ignore
        cancellation notifications if: ... The request cannot be cancelled".
        """
        pending = self._pending.pop(request_id, None)
        # MCP: "Cancellation notifications MUST only reference requests that: Were
        # previously issued in the same direction; Are believed to still be in-progress"
        if pending is None:
            return []  # it was answered first: there is nothing to cancel
        events: List[SessionEvent] = [
            Answer(request_id, pending.method, None, f"{pending.method} {why}")
        ]
        # MCP: "The `initialize` request MUST NOT be cancelled by clients"
        if pending.method == "initialize":
            return events
        params = {"requestId": request_id, "reason": reason}
        notice = _notification("notifications/cancelled", params)
        if request_id in self._unwritten:
            # MCP: "Cancellation notifications MUST only reference requests that: Were
            # previously issued in the same direction": posted on another connection
            # before its request is written, the notice could reach the server first and
            # be ignored. It is held until written() (or dropped, by writing()).
            self._unwritten[request_id] = notice
        else:
            events.append(Outgoing(notice))
        return events

    def expire(self, now: float) -> List[SessionEvent]:
        """Cancels every request whose deadline has come by ``now``."""
        events: List[SessionEvent] = []
        for request_id, pending in list(self._pending.items()):
            if now < pending.deadline:
                continue
            # MCP: "When the request has not received a success or error response within
            # the timeout period, the sender SHOULD issue a cancellation notification for
            # that request and stop waiting for a response."
            why = f"got no answer within {now - pending.started:.3g} s, and was cancelled"
            if self._unread is not None:
                why += f" (the server sent {self._unread})"
            events += self.cancel(request_id, "timed out", why)
        return events

    def fail(self, why: str) -> List[SessionEvent]:
        """Ends every pending request with ``why`` (any of them may have been answered by
        what was lost); no cancel is sent."""
        events: List[SessionEvent] = [
            Answer(request_id, pending.method, None, f"{pending.method} {why}")
            for request_id, pending in self._pending.items()
        ]
        self._pending.clear()
        return events

    def end(self, request_id: int, failure: str) -> List[SessionEvent]:
        """Ends a pending request with the failure its transport saw (its exchange broke);
        no cancel is sent (one held is dropped); nothing when it has ended already."""
        self._unwritten.pop(request_id, None)
        pending = self._pending.pop(request_id, None)
        return [] if pending is None else [Answer(request_id, pending.method, None, failure)]

    # HTTP's session ----------------------------------------------------------------------

    def start_session(self, session_id: Optional[str]) -> Optional[str]:
        """HTTP: the ``Mcp-Session-Id`` of initialize's answer (None: the server keeps no
        session); returns what is wrong with it, or None once it is kept."""
        if session_id is None:
            return None
        # MCP: "The session ID MUST only contain visible ASCII characters (ranging from
        # 0x21 to 0x7E)."
        if not session_id or not all(0x21 <= ord(c) <= 0x7E for c in session_id):
            return f"the server gave a session id that is not visible ASCII: {session_id!r}"
        self.session_id = session_id
        return None

    def http_error(
        self, request_id: int, status: int, body: Callable[[], str]
    ) -> List[SessionEvent]:
        """HTTP: the server answered a request with ``status`` (not 200): the request fails,
        quoting ``body()`` (called only when the failure quotes it); a 404 while the
        session has an id ends the session, so that the next request opens a new one
        (``protocol_version`` and ``session_id`` are None)."""
        if status == 404 and self.session_id is not None:
            # MCP: "When a client receives HTTP 404 in response to a request containing an
            # MCP-Session-Id, it MUST start a new session"
            self.session_id = None
            self.protocol_version = None
            why = "the server ended the session (HTTP 404); the next request opens a new one"
        else:
            why = f"HTTP {status}: {body()}"
        pending = self._pending.get(request_id)
        return [] if pending is None else self.end(request_id, f"{pending.method}: {why}")

    def lose(self, reason: str) -> List[SessionEvent]:
        """The connection is gone: every pending request fails, and so does every later
        one (the first reason is kept)."""
        self.lost = self.lost or reason
        self._unwritten.clear()  # nothing more is written
        return self.fail(f"did not finish: {reason}")

    # What the server sends -----------------------------------------------------------------

    def receive(self, data: bytes, now: float, origin: Optional[int] = None) -> List[SessionEvent]:
        """Reads one message from the server (a line, a body, an event's data).

        ``origin`` is the request whose own exchange carried it (HTTP): a message there that
        cannot be read fails that request. Elsewhere (stdio) it is dropped, as servers
        print banners, and the next timeout names it.
        """
        try:
            message = json.loads(data, parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as error:
            return self._unreadable(
                f"a message that is not JSON ({error}): {_excerpt(data)}", origin
            )
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return self._unreadable(
                f"a message that is not JSON-RPC 2.0: {_excerpt(data)}", origin
            )
        if "method" in message:
            return self._server_message(message, now)
        request_id = message.get("id")
        # Our ids are ints; a bool is not one (True would be request 1).
        pending = self._pending.pop(request_id, None) if type(request_id) is int else None
        if pending is None:
            # MCP: "The sender of the cancellation notification SHOULD ignore any response
            # to the request that arrives afterward"
            return []
        assert type(request_id) is int
        result, fault = message.get("result"), message.get("error")
        if isinstance(result, dict):
            return [Answer(request_id, pending.method, result)]
        if isinstance(fault, dict):
            why = f"{pending.method} failed: {_error_text(fault)}"
        else:
            why = f"{pending.method}: the server's answer is malformed: {_excerpt(data)}"
        return [Answer(request_id, pending.method, None, why)]

    def _server_message(self, message: Dict[str, Any], now: float) -> List[SessionEvent]:
        """A request or a notification from the server."""
        method = message["method"]
        params = message.get("params")
        if "id" in message:
            if method == "ping":
                # MCP: "The receiver MUST respond promptly with an empty response"
                return [Outgoing({"jsonrpc": "2.0", "id": message["id"], "result": {}})]
            error = {"code": _METHOD_NOT_FOUND, "message": f"Method not found: {method}"}
            return [Outgoing({"jsonrpc": "2.0", "id": message["id"], "error": error})]
        if method == "notifications/progress" and isinstance(params, dict):
            token = params.get("progressToken")
            # MCP: "Progress notifications MUST only reference tokens that: Were provided
            # in an active request": any other is ignored.
            pending = self._pending.get(token) if type(token) is int else None
            if pending is not None and pending.method == "tools/call":
                assert type(token) is int
                # MCP: "Implementations MAY choose to reset the timeout clock when
                # receiving a progress notification corresponding to the request" and
                # "SHOULD always enforce a maximum timeout, regardless of progress
                # notifications".
                pending.deadline = min(
                    now + self.timeout, pending.started + MAX_PROGRESS_TIMEOUTS * self.timeout
                )
                return pending.reported(token, params)
        elif method == "notifications/tools/list_changed":
            return [ToolsChanged()]
        return []

    def _unreadable(self, what: str, origin: Optional[int]) -> List[SessionEvent]:
        """A message that cannot be read: it fails its request (HTTP), else is only named."""
        self._unread = what
        events: List[SessionEvent] = [Unreadable(what)]
        pending = self._pending.pop(origin, None) if origin is not None else None
        if origin is not None and pending is not None:
            events.append(
                Answer(origin, pending.method, None, f"{pending.method}: the server sent {what}")
            )
        return events


McpSession = McpProtocol
"""The 1.4 name of ``McpProtocol``, kept so that 1.4 code runs; removed in 2.0."""


@dataclass
class _Pending:
    """A request waiting for its answer: its method, when it was sent, its deadline, and
    the last progress its server reported."""

    method: str
    started: float
    deadline: float
    progress: float = -math.inf

    def reported(self, request_id: int, params: Dict[str, Any]) -> List[SessionEvent]:
        """A progress notification's values, as a Progress; none when they are malformed
        or do not increase."""
        # MCP: the notification holds "The current progress value so far; An optional
        # "total" value; An optional "message" value", and "The progress and the total
        # values MAY be floating point."
        value, total, message = params.get("progress"), params.get("total"), params.get("message")
        if not (_number(value) and (total is None or _number(total))):
            return []
        if message is not None and not isinstance(message, str):
            return []
        # MCP: "The progress value MUST increase with each notification, even if the
        # total is unknown": one that does not is not reported (it still moved the deadline).
        current = cast(float, value)  # a number: _number() says so
        if current <= self.progress:
            return []
        self.progress = current
        progress = {"progress": value, "total": total, "message": message}
        return [Progress(request_id, {k: v for k, v in progress.items() if v is not None})]


def _number(value: object) -> bool:
    """A finite JSON number (a bool is none)."""
    return type(value) in (int, float) and math.isfinite(cast(float, value))


def _notification(method: str, params: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """A JSON-RPC notification (a message without an id)."""
    message: Dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    return message


# --- What both transports share: the I/O around the rules ----------------------------------


class _Failure(Exception):
    """One request failed; the public boundary makes it an McpError or a ToolError."""


class _Waiter:
    """A caller waiting for its request's answer, and the progress reported meanwhile."""

    def __init__(self, request_id: int, method: str) -> None:
        self.id = request_id
        self.method = method
        self.done = threading.Event()  # the answer is set
        self.woken = threading.Event()  # the answer, or progress, came
        self.answer: Optional[Answer] = None
        self.progress: List[Dict[str, Any]] = []  # reported, not yet yielded


_S = TypeVar("_S", bound="_SessionIO")
_T = TypeVar("_T")


class _SessionIO:
    """An MCP client session's I/O: the rules (``McpProtocol``) under a lock, the callers'
    waits, the tools and their results.

    A transport subclass starts the connection (``_connect``), sends one message
    (``_send``), hands every message it reads to ``_receive``, and ends (``_disconnect``).
    """

    _caches_tools: bool = True

    def __init__(self, where: str, timeout: float, posts: bool = False) -> None:
        self.protocol = McpProtocol(timeout, posts=posts)  # checks the timeout
        self.where = where
        self._lock = threading.Lock()  # the rules, the waiters, the flags
        self._open_lock = threading.Lock()  # one handshake at a time
        self._close_lock = threading.Lock()  # a second close() waits for the first
        self._waiters: Dict[int, _Waiter] = {}
        self._closed = False
        self._tools: Optional[List[agent_loop.Tool]] = None  # kept until the list changes
        self._changes = 0  # list_changed notifications so far

    @property
    def timeout(self) -> float:
        """The seconds each request waits for its answer (the rules' ``timeout``)."""
        return self.protocol.timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self.protocol.timeout = seconds

    @property
    def protocol_version(self) -> Optional[str]:
        """The protocol version the server answered the handshake with (None before)."""
        return self.protocol.protocol_version

    # Public surface ----------------------------------------------------------------------

    def __enter__(self: _S) -> _S:
        try:
            self._open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def tools(self) -> List[agent_loop.Tool]:
        """Returns the server's tools as agent_loop Tools (a new list each time).

        Opens the session first if it is not open. Raises McpError when the server cannot
        be reached or started, the handshake fails, ``tools/list`` fails or pages past
        the limits, a tool cannot be built (the message names it), or the session is
        lost (the server exited).
        """
        self._open()
        # The list is read without the open lock: a call of another thread that waits for
        # it would wait for the whole tools/list, deaf to its run's signal.
        with self._lock:
            lost = self.protocol.lost
            cached = self._tools if self._caches_tools else None
            changes = self._changes
        if lost is not None:  # a kept list would name tools that can no longer run
            raise McpError(f"{self.where}: {lost}")
        if cached is None:
            cached = self._list_tools()
            with self._lock:
                # A change announced while the list was read: the next call lists again.
                if self._changes == changes:
                    self._tools = cached
        return list(cached)

    def close(self) -> None:
        """Ends the session: calls in flight end with an error result, and the server's
        process (stdio) ends or its session is deleted (HTTP). Safe to call again, from
        any thread: it returns once the session has ended."""
        with self._close_lock:
            with self._lock:
                self._closed = True
            self._lose("the session was closed")
            self._disconnect()

    # The session -------------------------------------------------------------------------

    def _open(self, signal: Optional[agent_loop.Signal] = None) -> None:
        """Opens the session unless it is open; a call waiting for another thread's
        handshake looks at its signal every ``agent_loop.WATCH_SECONDS``."""
        while not self._open_lock.acquire(timeout=agent_loop.WATCH_SECONDS):
            if signal is not None and signal.is_set():
                raise _Failure("tools/call was cancelled with the run before it was sent")
        try:
            self._handshake()
        finally:
            self._open_lock.release()

    def _handshake(self) -> None:
        """Starts the connection and makes the handshake, once (under the open lock)."""
        if self._closed:
            raise McpError(f"{self.where}: the MCP session is closed")
        if self.protocol.protocol_version is not None:
            return  # open (an HTTP 404 that ended the session made it None again)
        try:
            self._connect()
            answer = _finished(self._exchange(self.protocol.initialize, None))
            self._send(self.protocol.initialized(answer), None)
        except (_Failure, McpError) as failure:
            self.close()
            raise McpError(f"{self.where}: {failure}") from None

    def _list_tools(self) -> List[agent_loop.Tool]:
        """tools/list, page after page, each tool built as an agent_loop Tool."""
        listed: List[Dict[str, Any]] = []
        cursor: Optional[str] = None
        for _ in range(MAX_TOOL_PAGES):
            try:
                page = self._request("tools/list", None if cursor is None else {"cursor": cursor})
            except _Failure as failure:
                raise McpError(f"{self.where}: {failure}") from None
            tools = page.get("tools")
            if not isinstance(tools, list):
                raise McpError(f"{self.where}: tools/list answered without a list of tools")
            listed.extend(tools)
            if len(listed) > MAX_TOOLS:
                raise McpError(f"{self.where}: the server lists more than {MAX_TOOLS} tools")
            cursor = page.get("nextCursor")
            # MCP: "Treat a missing nextCursor as the end of results"
            if cursor is None:
                return [self._tool(description) for description in listed]
            if not isinstance(cursor, str):
                raise McpError(f"{self.where}: tools/list gave a nextCursor that is not a str")
        raise McpError(f"{self.where}: tools/list goes on for more than {MAX_TOOL_PAGES} pages")

    def _tool(self, description: object) -> agent_loop.Tool:
        """One listed tool as an agent_loop Tool whose execute calls tools/call."""
        if not isinstance(description, dict) or not isinstance(description.get("name"), str):
            raise McpError(
                f"{self.where}: tools/list holds a tool without a name: {_excerpt(description)}"
            )
        name: str = description["name"]

        # The tool holds the server: a registry in use keeps its server (and process) alive.
        # A generator: what it yields are the call's tool.progress events.
        def execute(
            arguments: Dict[str, Any], signal: agent_loop.Signal
        ) -> Generator[Dict[str, Any], None, str]:
            return (yield from self._call_tool(name, arguments, signal))

        # MCP's Tool.title, "a human-readable name", goes with the hints: the model is sent
        # neither (annotations.title is the older place of the same name).
        annotations = description.get("annotations", {})
        if isinstance(annotations, dict) and "title" in description:
            annotations = {**annotations, "title": description["title"]}
        try:
            return agent_loop.Tool(
                name,
                description.get("description") or "",
                description.get("inputSchema"),  # type: ignore[arg-type]  # Tool checks it
                execute,
                annotations=annotations,
            )
        except (TypeError, ValueError) as error:
            raise McpError(f"{self.where}: tool {name!r} cannot be used: {error}") from None

    def _call_tool(
        self, name: str, arguments: Dict[str, Any], signal: agent_loop.Signal
    ) -> Generator[Dict[str, Any], None, str]:
        """tools/call for one tool call: yields its progress, returns its content; raises
        ToolError for any failure."""
        try:
            self._open(signal)
            answer = yield from self._requesting(
                "tools/call", {"name": name, "arguments": arguments}, signal
            )
            content, is_error = render_tool_result(answer)
        except (McpError, _Failure) as failure:
            raise agent_loop.ToolError(f"MCP tool {name!r}: {failure}") from None
        except ValueError as malformed:
            raise agent_loop.ToolError(
                f"MCP tool {name!r}: the server's result is malformed: {malformed}"
            ) from None
        # MCP: "Clients SHOULD provide tool execution errors to language models to enable
        # self-correction."
        if is_error:
            raise agent_loop.ToolError(content or f"MCP tool {name!r} failed and said nothing")
        return content

    # Requests: the rules decide, this moves messages and waits -------------------------------

    def _request(self, method: str, params: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        """Sends one request and waits for its result; raises _Failure naming what failed."""
        return _finished(self._requesting(method, params, None))

    def _requesting(
        self,
        method: str,
        params: Optional[Dict[str, Any]],
        signal: Optional[agent_loop.Signal],
    ) -> Generator[Dict[str, Any], None, Dict[str, Any]]:
        """Sends one request, yields its progress and returns its result; raises _Failure
        naming what failed."""
        start = functools.partial(self.protocol.request, method, params)
        answer = yield from self._exchange(start, signal)
        if answer.result is None:
            raise _Failure(answer.failure)
        return answer.result

    def _exchange(
        self,
        start: Callable[[float], Tuple[int, Dict[str, Any]]],
        signal: Optional[agent_loop.Signal],
    ) -> Generator[Dict[str, Any], None, Answer]:
        """Starts a request (``start(now)`` gives its id and message), sends it, yields its
        progress and returns its answer."""
        with self._lock:
            try:
                request_id, message = start(time.monotonic())
            except McpError as lost:
                raise _Failure(str(lost)) from None
            waiter = _Waiter(request_id, message["method"])
            self._waiters[request_id] = waiter
        self._send(message, waiter)
        yield from self._wait(waiter, signal)
        assert waiter.answer is not None
        return waiter.answer

    def _wait(
        self, waiter: _Waiter, signal: Optional[agent_loop.Signal]
    ) -> Iterator[Dict[str, Any]]:
        """Waits for an answer, yielding the progress reported meanwhile; asks the rules to
        expire it at its deadline (which progress moves), or to cancel it once the signal
        is set or the caller stops reading (the run's loop closes a cancelled tool)."""
        try:
            while True:
                with self._lock:
                    reported, waiter.progress = waiter.progress, []
                    waiter.woken.clear()
                    deadline = self.protocol.deadline(waiter.id)
                yield from reported
                if deadline is None:
                    return  # it has ended: its answer is set
                now = time.monotonic()
                if now >= deadline:
                    self._apply(self.protocol.expire)
                elif waiter.woken.wait(min(agent_loop.WATCH_SECONDS, deadline - now)):
                    continue
                elif signal is not None and signal.is_set():
                    self._cancel(waiter)
        finally:
            if not waiter.done.is_set():  # closed while it waited
                self._cancel(waiter)

    def _cancel(self, waiter: _Waiter) -> None:
        """The run was cancelled: the rules cancel the request (nothing once it ended)."""
        self._apply(
            lambda now: self.protocol.cancel(
                waiter.id, "the run was cancelled", "was cancelled with the run"
            )
        )

    def _receive(self, data: bytes, origin: Optional[_Waiter] = None) -> None:
        """One message as read (a line, a body, an event's data), to the rules."""
        self._apply(
            lambda now: self.protocol.receive(data, now, None if origin is None else origin.id)
        )

    def _fail(self, why: str) -> None:
        """Every request in flight fails (what was lost may have answered any of them)."""
        self._apply(lambda now: self.protocol.fail(why))

    def _lose(self, reason: str) -> None:
        """The connection is gone: every request in flight fails, and so will the next."""
        self._apply(lambda now: self.protocol.lose(reason))

    def _apply(self, step: Callable[[float], List[SessionEvent]]) -> None:
        """Runs one step of the rules with the time, and does what its events say: an
        answer goes to its waiter, a message to the server, a change of tools to the list."""
        sends: List[Dict[str, Any]] = []
        ended: List[_Waiter] = []  # the waiters of the requests that failed
        with self._lock:
            for event in step(time.monotonic()):
                if isinstance(event, Answer):
                    # Every pending request has its waiter: both are made under this lock.
                    waiter = self._waiters.pop(event.request_id)
                    waiter.answer = event
                    waiter.done.set()
                    waiter.woken.set()
                    if event.result is None:
                        ended.append(waiter)
                elif isinstance(event, Outgoing):
                    sends.append(event.message)  # the rules hold a cancel until it may go
                elif isinstance(event, Progress):
                    waiter = self._waiters[event.request_id]
                    waiter.progress.append(event.progress)
                    waiter.woken.set()
                elif isinstance(event, ToolsChanged):
                    self._tools = None
                    self._changes += 1
                else:
                    _logger.warning("%s: dropped %s", self.where, event.what)
        for failed in ended:
            self._abandon(failed)  # nobody reads its answer any more
        for message in sends:
            self._send(message, None, True)

    # Transport hooks ---------------------------------------------------------------------

    def _connect(self) -> None:
        """Starts the connection (stdio: the process)."""

    def _send(
        self, message: Dict[str, Any], waiter: Optional[_Waiter], background: bool = False
    ) -> None:
        """Sends one message; a request's answer goes to ``_receive``."""

    def _abandon(self, waiter: _Waiter) -> None:
        """Stops whatever still reads a request's answer (HTTP: its connection)."""

    def _disconnect(self) -> None:
        """Ends the connection (stdio: the process; HTTP: the session)."""


def _finished(steps: Generator[Any, None, _T]) -> _T:
    """What a generator returns, its yields dropped (a request that reports no progress)."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _excerpt(value: object) -> str:
    """A bounded quote of a server's words, for an error message."""
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else repr(value)
    if len(text) > _ERROR_EXCERPT:
        return f"{text[:_ERROR_EXCERPT]}... ({len(text) - _ERROR_EXCERPT} more characters)"
    return text


def _error_text(error: Dict[str, Any]) -> str:
    """A JSON-RPC error object as one line: its code and message (data quoted when given)."""
    text = f"JSON-RPC error {error.get('code')!r}: {error.get('message')!r}"
    if "data" in error:
        text += f" ({_excerpt(error['data'])})"
    return text


# --- Results ----------------------------------------------------------------------------


def render_tool_result(result: object) -> Tuple[str, bool]:
    """Returns the content the model gets for a ``tools/call`` result, and its error flag.

    Text blocks are the text. Every other block is one line in brackets: ``[image:
    image/png, 5120 bytes, not shown]`` (audio the same), ``[resource link: URI (name,
    mimeType): description]`` (the parts the block has), an embedded text resource as
    ``[resource: URI]`` then its text, a binary one as ``[resource: URI, mimeType, N
    bytes, not shown]``, and a block of another type as ``[TYPE content, not shown]``.
    Blocks are joined by newlines. With no blocks, ``structuredContent`` (when given) is
    the content, as compact JSON. The content is at most ``MAX_RESULT_TEXT`` code points,
    then a note: ``[agent_loop_mcp: N more characters of this result were cut]``.

    Raises ValueError, naming the field, for a result that is not an object, content
    that is not a list, a block that is not an object, or a field of the wrong type.
    """
    if not isinstance(result, dict):
        raise ValueError(f"a tools/call result must be an object, got {_excerpt(result)}")
    blocks = result.get("content", [])
    is_error = result.get("isError", False)
    if not isinstance(blocks, list):
        raise ValueError("content must be a list of content blocks")
    if not isinstance(is_error, bool):
        raise ValueError("isError must be true or false")
    text = _BoundedText(MAX_RESULT_TEXT)
    for index, block in enumerate(blocks):
        if index:
            text.add("\n")
        text.add(_rendered_block(block, index))
    if not blocks and "structuredContent" in result:
        text.add(
            json.dumps(result["structuredContent"], separators=(",", ":"), ensure_ascii=False)
        )
    return text.value(), is_error


def _rendered_block(block: object, index: int) -> str:
    """One content block as the model reads it."""
    if not isinstance(block, dict):
        raise ValueError(f"content[{index}] must be an object")
    where = f"content[{index}]"
    kind = _field(block, "type", where)
    if kind == "text":
        return _field(block, "text", where)
    if kind in ("image", "audio"):
        mime = _field(block, "mimeType", where)
        return f"[{kind}: {mime}, {_size(block, 'data', where)}, not shown]"
    if kind == "resource_link":
        uri = _field(block, "uri", where)
        about = [_field(block, key, where, "") for key in ("name", "mimeType")]
        about = [part for part in about if part]
        description = _field(block, "description", where, "")
        return (
            f"[resource link: {uri}"
            + (f" ({', '.join(about)})" if about else "")
            + (f": {description}" if description else "")
            + "]"
        )
    if kind == "resource":
        resource = block.get("resource")
        if not isinstance(resource, dict):
            raise ValueError(f"{where}.resource must be an object")
        where += ".resource"
        uri = _field(resource, "uri", where)
        if "text" in resource:
            return f"[resource: {uri}]\n{_field(resource, 'text', where)}"
        mime = _field(resource, "mimeType", where, "")
        named = f"{uri}, {mime}" if mime else uri
        return f"[resource: {named}, {_size(resource, 'blob', where)}, not shown]"
    return f"[{kind} content, not shown]"


def _field(block: Dict[str, Any], key: str, where: str, default: Optional[str] = None) -> str:
    """A str field of a block; a missing one is the default, or a ValueError without one."""
    value = block.get(key, default)
    if not isinstance(value, str):
        raise ValueError(f"{where}.{key} must be a str, got {_excerpt(value)}")
    return value


def _size(block: Dict[str, Any], key: str, where: str) -> str:
    """How many bytes a base64 field decodes to, without decoding it."""
    data = _field(block, key, where)
    return f"{len(data) * 3 // 4 - data[-2:].count('=')} bytes"


class _BoundedText:
    """Text gathered up to a limit; what does not fit is counted, not kept."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: List[str] = []
        self.length = 0
        self.cut = 0

    def add(self, text: str) -> None:
        room = self.limit - self.length
        if len(text) > room:
            self.cut += len(text) - room
            text = text[:room]
        self.parts.append(text)
        self.length += len(text)

    def value(self) -> str:
        text = "".join(self.parts)
        if self.cut:
            text += f"\n[agent_loop_mcp: {self.cut} more characters of this result were cut]"
        return text


# --- stdio ------------------------------------------------------------------------------


class StdioServer(_SessionIO):
    """An MCP server run as a process, spoken to over its standard input and output.

    ``command`` is the server's argv, a sequence of str (no shell: ``shlex.split(line)``
    makes one from a command line); ``env`` and ``cwd`` are ``subprocess.Popen``'s (None
    inherits this process's). ``timeout`` is the seconds each request waits for its
    answer. The process starts at ``with`` or at the first ``tools()``.

    Raises TypeError or ValueError for a command, env, cwd or timeout of the wrong kind.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[Union[str, os.PathLike[str]]] = None,
        timeout: float = 30.0,
    ) -> None:
        if isinstance(command, (str, bytes)) or not isinstance(command, Sequence):
            raise TypeError(
                "command must be the server's argv, a sequence of str (no shell is used), "
                f"got {type(command).__name__}; e.g. ['python', 'server.py'] or shlex.split(line)"
            )
        argv = tuple(command)
        if not argv or not all(isinstance(part, str) for part in argv):
            raise TypeError(f"command must be a non-empty sequence of str, got {argv!r}")
        if env is not None and not (
            isinstance(env, Mapping)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
        ):
            raise TypeError("env must be a mapping of str to str, or None")
        if cwd is not None and not isinstance(cwd, (str, os.PathLike)):
            raise TypeError(f"cwd must be a path, or None, got {type(cwd).__name__}")
        super().__init__(f"MCP server {argv[0]!r}", timeout)
        self.command = argv
        self.env = None if env is None else dict(env)
        self.cwd = cwd
        self._process: Optional[subprocess.Popen[bytes]] = None
        self._outbox: queue.Queue[Optional[bytes]] = queue.Queue()
        self._stderr_tail = bytearray()
        self._stderr_reader: Optional[threading.Thread] = None
        # The threads hold a weak reference to the server, and the finalizer none, so that a
        # server dropped without close() is collected, and its process ended, all the same.
        self._holder: List[Optional[subprocess.Popen[bytes]]] = [None]
        weakref.finalize(self, _end_process, self._holder, self._outbox)

    def _connect(self) -> None:
        try:
            process = subprocess.Popen(
                self.command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self.env,
                cwd=self.cwd,
                # Its own process group, so that close() ends what the server started too.
                start_new_session=True,
            )
        except (OSError, ValueError) as error:
            raise _Failure(f"could not start {list(self.command)}: {error}") from None
        self._process = self._holder[0] = process
        assert process.stdin
        assert process.stdout
        assert process.stderr
        self._stderr_reader = _start(_drain_errors, process.stderr, self._stderr_tail, self._lock)
        _start(_write_input, process.stdin, self._outbox)
        _start(_read_output, process.stdout, weakref.ref(self))

    def _send(
        self, message: Dict[str, Any], waiter: Optional[_Waiter], background: bool = False
    ) -> None:
        # MCP: "Messages are delimited by newlines, and MUST NOT contain embedded
        # newlines." json.dumps escapes every newline inside strings.
        line = json.dumps(message, separators=(",", ":"), ensure_ascii=False) + "\n"
        # A writer thread writes: a server that does not read its input never blocks a caller.
        self._outbox.put(line.encode("utf-8"))

    def _exit_reason(self) -> str:
        """Why the output ended: the exit status if the server exits, and its last stderr."""
        assert self._process is not None
        assert self._stderr_reader is not None
        try:
            status = self._process.wait(CLOSE_GRACE_SECONDS)
            reason = f"the server exited with status {status}"
        except subprocess.TimeoutExpired:
            reason = "the server closed its output"
        self._stderr_reader.join(CLOSE_GRACE_SECONDS)  # its tail is complete
        with self._lock:
            tail = self._stderr_tail.decode("utf-8", "replace").strip()
        if tail:
            reason += f"; its standard error ends with: {tail[-_ERROR_EXCERPT:]}"
        return reason

    def _disconnect(self) -> None:
        # Not the finalizer, which runs once: a close() that meets a handshake under way
        # comes before its process starts, and that handshake's own close() ends it.
        _end_process(self._holder, self._outbox)


def _start(target: Callable[..., None], *args: object) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def _read_output(stream: IO[bytes], server: weakref.ref[StdioServer]) -> None:
    """The reader thread: every line the server writes, each bounded, to the session."""
    with stream:
        for line in _bounded_lines(stream, MAX_MESSAGE_BYTES):
            session = server()
            if session is None:
                return  # collected: its finalizer ends the process
            if line is None:
                why = (
                    f"failed: the server sent a message of more than {MAX_MESSAGE_BYTES} "
                    "bytes, which was dropped"
                )
                session._fail(why)
            elif line.strip():
                session._receive(line)
            del session  # no strong reference while the next line is awaited
        session = server()
        if session is not None:
            reason = session._exit_reason()
            session._lose(reason)


def _drain_errors(stream: IO[bytes], tail: bytearray, lock: threading.Lock) -> None:
    """Reads the server's standard error to its end, so its pipe never fills; keeps the tail."""
    with stream:
        for data in iter(lambda: stream.read1(65536), b""):  # type: ignore[attr-defined]
            with lock:
                tail += data
                del tail[:-STDERR_TAIL_BYTES]


def _write_input(stream: IO[bytes], outbox: queue.Queue[Optional[bytes]]) -> None:
    """The writer thread: one message after the other, until None or a broken pipe."""
    try:
        for data in iter(outbox.get, None):
            stream.write(data)
            stream.flush()
    except OSError:
        pass  # the process is gone: the reader sees the end of its output
    finally:
        with contextlib.suppress(OSError):
            stream.close()


def _bounded_lines(stream: IO[bytes], limit: int) -> Iterator[Optional[bytes]]:
    """Lines of at most ``limit`` bytes (without the newline); None for a longer line,
    which is read to its end in pieces and not kept."""
    while True:
        line = stream.readline(limit + 1)
        if not line:
            return
        if line.endswith(b"\n"):
            yield line[:-1]
            continue
        if len(line) <= limit:
            yield line  # the last line, without its newline
            return
        while line and not line.endswith(b"\n"):
            line = stream.readline(65536)
        yield None


def _end_process(
    holder: List[Optional[subprocess.Popen[bytes]]], outbox: queue.Queue[Optional[bytes]]
) -> None:
    """Ends a server process and what it started.

    MCP: "the client SHOULD initiate shutdown by: 1. First, closing the input stream to
    the child process (the server) 2. Waiting for the server to exit, or sending SIGTERM
    if the server does not exit within a reasonable time 3. Sending SIGKILL if the server
    does not exit within a reasonable time after SIGTERM"
    """
    outbox.put(None)  # the writer closes the server's input once what was sent is written
    process = holder[0]
    if process is None:
        return
    for stop in (signals.SIGTERM, signals.SIGKILL):
        try:
            process.wait(CLOSE_GRACE_SECONDS)
            break
        except subprocess.TimeoutExpired:
            _signal_group(process, stop)
    # What the server started and left behind goes too: its group outlives it otherwise.
    _signal_group(process, signals.SIGKILL)
    process.wait()
    holder[0] = None  # ended: a later call signals no group (its id may be reused)


def _signal_group(process: subprocess.Popen[bytes], number: int) -> None:
    """Sends a signal to the server's process group (it leads one: start_new_session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone
        os.killpg(process.pid, number)


# --- Streamable HTTP ----------------------------------------------------------------------


_OWNED_HEADERS: Final = (
    "accept",
    "content-type",
    "mcp-session-id",
    "mcp-protocol-version",
    "content-length",
    "host",
)


class HttpServer(_SessionIO):
    """An MCP server at a Streamable HTTP endpoint (``https://host/mcp``).

    Each message is one POST; an answer is JSON or an event stream. The session id the
    server gives at initialize (``Mcp-Session-Id``) is sent with every later request,
    with ``MCP-Protocol-Version``; ``close()`` sends DELETE to end the session.
    ``headers`` are sent with every request (``Authorization``...); ``ssl_context`` is
    for HTTPS (None: ``ssl.create_default_context()``). ``timeout`` bounds each request:
    the connection, and the wait for its answer.

    Raises TypeError or ValueError for a url, headers, ssl_context or timeout of the
    wrong kind.
    """

    _caches_tools = False

    def __init__(
        self,
        url: str,
        *,
        headers: Optional[Mapping[str, str]] = None,
        timeout: float = 30.0,
        ssl_context: Optional[ssl.SSLContext] = None,
    ) -> None:
        if not isinstance(url, str):
            raise TypeError(f"url must be a str, got {type(url).__name__}")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must be an http:// or https:// URL with a host, got {url!r}")
        if headers is not None and not (
            isinstance(headers, Mapping)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
        ):
            raise TypeError("headers must be a mapping of str to str, or None")
        owned = [name for name in headers or {} if name.lower() in _OWNED_HEADERS]
        if owned:
            raise ValueError(f"headers may not set {owned}: the client sets them")
        if ssl_context is not None and not isinstance(ssl_context, ssl.SSLContext):
            raise TypeError(
                f"ssl_context must be an ssl.SSLContext, got {type(ssl_context).__name__}"
            )
        super().__init__(f"MCP server {url}", timeout, posts=True)
        self.url = url
        self.headers = dict(headers or {})
        self._parts = parts
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._ssl_context = ssl_context
        # The connection of each request being posted: _abandon shuts it down.
        self._connections: Dict[int, http.client.HTTPConnection] = {}

    def _connect(self) -> None:
        pass  # every message is a request of its own

    def _connection(self) -> http.client.HTTPConnection:
        port = self._parts.port
        if self._parts.scheme == "https":
            context = self._ssl_context or ssl.create_default_context()
            return http.client.HTTPSConnection(
                self._parts.hostname or "", port, timeout=self.timeout, context=context
            )
        return http.client.HTTPConnection(self._parts.hostname or "", port, timeout=self.timeout)

    def _request_headers(self) -> Dict[str, str]:
        # MCP: "The client MUST include an Accept header, listing both application/json
        # and text/event-stream as supported content types."
        headers = {
            **self.headers,
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        }
        session_id = self.protocol.session_id
        if session_id is not None:
            # MCP: "clients using the Streamable HTTP transport MUST include it in the
            # MCP-Session-Id header on all of their subsequent HTTP requests."
            headers["Mcp-Session-Id"] = session_id
        if self.protocol_version is not None:
            # MCP: "the client MUST include the MCP-Protocol-Version: <protocol-version>
            # HTTP header on all subsequent requests to the MCP server"
            headers["MCP-Protocol-Version"] = self.protocol_version
        return headers

    def _send(
        self, message: Dict[str, Any], waiter: Optional[_Waiter], background: bool = False
    ) -> None:
        # MCP: "Every JSON-RPC message sent from the client MUST be a new HTTP POST request
        # to the MCP endpoint."
        body = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if waiter is None and not background:  # initialized: it must arrive before the next
            problem = self._post(body, None)
            if problem is not None:
                raise _Failure(problem)
            return
        thread = threading.Thread(target=self._post, args=(body, waiter), daemon=True)
        thread.start()

    def _post(self, body: bytes, waiter: Optional[_Waiter]) -> Optional[str]:
        """One POST and its answer: a request's failure settles it; a notification's is
        returned. A request that ends (cancelled, timed out, closed) before it is written
        is not sent (the rules decide: writing(), written())."""
        connection = self._connection()
        problem: Optional[str] = None
        # One exit, after the finally: a return inside the try gives 3.8 arcs that never run.
        try:
            if waiter is None:
                connection.request("POST", self._path, body, self._request_headers())
                problem = self._answer(connection.getresponse(), None)
            elif self._sending(waiter, connection):
                connection.request("POST", self._path, body, self._request_headers())
                self._apply(lambda now: self.protocol.written(waiter.id))  # a held cancel
                if not waiter.done.is_set():  # else nobody waits for the answer
                    problem = self._answer(connection.getresponse(), waiter)
        except (OSError, http.client.HTTPException) as error:
            problem = f"the HTTP exchange failed: {type(error).__name__}: {error}"
        finally:
            connection.close()
            if waiter is not None:
                with self._lock:
                    self._connections.pop(waiter.id, None)
        if problem is not None and waiter is not None:
            failure = f"{waiter.method}: {problem}"
            self._apply(lambda now: self.protocol.end(waiter.id, failure))
        return problem

    def _answer(
        self, response: http.client.HTTPResponse, waiter: Optional[_Waiter]
    ) -> Optional[str]:
        """Reads one POST's answer; returns what went wrong, or None."""
        status = response.status
        if waiter is None:
            # MCP: "If the server accepts the input, the server MUST return HTTP status
            # code 202 Accepted with no body."
            return (
                None
                if status == 202
                else f"HTTP {status} for a notification: {_body_excerpt(response)}"
            )
        if status != 200:  # the rules say what it means (a 404 may end the session)
            said = functools.partial(_body_excerpt, response)
            self._apply(lambda now: self.protocol.http_error(waiter.id, status, said))
            return None
        if waiter.method == "initialize":
            with self._lock:
                problem = self.protocol.start_session(response.getheader("Mcp-Session-Id"))
            if problem is not None:
                return problem
        kind = (response.getheader("Content-Type") or "").split(";")[0].strip().lower()
        # MCP: "the server MUST either return Content-Type: text/event-stream, to initiate an
        # SSE stream, or Content-Type: application/json, to return one JSON object. The
        # client MUST support both these cases."
        if kind == "application/json":
            length = response.getheader("Content-Length")
            if length is not None and length.isdigit() and int(length) > MAX_MESSAGE_BYTES:
                return f"the answer has {length} bytes, more than {MAX_MESSAGE_BYTES}"
            data = response.read(MAX_MESSAGE_BYTES + 1)
            if len(data) > MAX_MESSAGE_BYTES:
                return f"the answer has more than {MAX_MESSAGE_BYTES} bytes"
            self._receive(data, waiter)
        elif kind == "text/event-stream":
            stream = wire.ServerSentEvents(MAX_MESSAGE_BYTES)
            while True:
                try:
                    data = response.read1(_READ_SIZE)
                except http.client.IncompleteRead:
                    data = b""  # a chunked body cut off: the stream ended (named below)
                try:
                    events = stream.feed(data)
                except wire.ProviderProtocolError as malformed:
                    return f"the answer's stream is {malformed}"
                for event in events:
                    # MCP: "The server SHOULD immediately send an SSE event consisting of an
                    # event ID and an empty data field in order to prime the client to
                    # reconnect": that event is no message.
                    if not event.data:
                        continue
                    self._receive(event.data.encode("utf-8"), waiter)
                    # MCP: "After the JSON-RPC response has been sent, the server SHOULD
                    # terminate the SSE stream." Whatever comes after it is not read.
                    if waiter.done.is_set():
                        return None
                if not data:
                    break
        else:
            return f"the answer's Content-Type is {kind or 'missing'}, not JSON or an event stream"
        if not waiter.done.is_set():
            # A server that exits mid-stream looks the same as one that ends its stream
            # early (a cut chunked body is read as its end): name both.
            return (
                "the answer ended before the response: the server closed the stream or went "
                "away (resuming a stream is not supported)"
            )
        return None

    def _sending(self, waiter: _Waiter, connection: http.client.HTTPConnection) -> bool:
        """Connects for a request unless it has ended; False when it is not to be sent."""
        with self._lock:
            if not self.protocol.writing(waiter.id):
                return False  # ended before it connected
            self._connections[waiter.id] = connection  # from now on, _abandon shuts it down
        connection.connect()
        # The wait bounds the read (its deadline, the signal and close() shut the socket
        # down): the socket's own timeout, past the longest wait, only catches a read that
        # nobody waits for any more.
        assert connection.sock is not None
        connection.sock.settimeout(MAX_PROGRESS_TIMEOUTS * self.timeout + self.timeout)
        with self._lock:
            return self.protocol.writing(waiter.id)  # ended while it connected: not written

    def _abandon(self, waiter: _Waiter) -> None:
        with self._lock:
            connection = self._connections.get(waiter.id)
        if connection is not None and connection.sock is not None:
            with contextlib.suppress(OSError):
                connection.sock.shutdown(socket.SHUT_RDWR)  # the blocked read returns now

    def _disconnect(self) -> None:
        if self.protocol.session_id is None:
            return
        # MCP: "Clients that no longer need a particular session ... SHOULD send an HTTP
        # DELETE to the MCP endpoint with the MCP-Session-Id header"
        connection = self._connection()
        try:
            connection.request("DELETE", self._path, headers=self._request_headers())
            connection.getresponse().read(_ERROR_EXCERPT)
        except (OSError, http.client.HTTPException):
            pass  # the server is gone: so is the session
        finally:
            connection.close()
            self.protocol.session_id = None


def _body_excerpt(response: http.client.HTTPResponse) -> str:
    return _excerpt(response.read(_ERROR_EXCERPT + 1)) or "(no body)"
