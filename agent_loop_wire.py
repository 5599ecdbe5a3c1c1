# agent_loop_wire.py 1.5.0: the providers' wire formats, sans-IO, for agent_loop.py.
# One file, standard library only; copy it next to agent_loop.py. Home: the agent_loop repository.
"""The wire formats of the Agent Loop's providers, sans-IO: bytes in, events out.

h11's way: nothing here opens a socket, reads a clock it is not given, sleeps, retries or
logs. Each part turns bytes into values, or values into bytes, and says what it refuses
by raising this module's errors; what a failure means (another attempt, a failed run) is
decided by whoever moves the bytes (``agent_loop_providers``' socket loop, or
``agent_loop_mcp``'s transports, which read their event streams with
``ServerSentEvents``).

In the order an exchange uses them:

- ``openai_request_body()`` and ``anthropic_request_body()`` make a request's body from a
  ``ModelRequest`` (the ``check_*`` functions are their argument checks, public so that a
  model object checks its own arguments with the same words);
- ``check_response_head()`` reads the response's status and headers: an HTTP error is a
  ``ProviderError`` with the provider's status, Retry-After, error type and code, and
  ``context_exceeded`` when the provider refused the request as longer than its context;
- ``ServerSentEvents`` turns bytes into server-sent events (the WHATWG rules);
- ``ResponseIds`` picks the ids of an answer and of its calls (unique in the transcript,
  deterministic);
- ``OpenAIAnswer`` and ``AnthropicAnswer`` turn the body's bytes into the model's chunks,
  then its ``ModelResponse`` (with the provider's own response id).

What they refuse is a ``ProviderProtocolError`` (malformed or incomplete bytes) or a
``ProviderError`` (what the provider said: an HTTP error, an error event, a cut answer,
whose ``finish_reason`` says what cut it). ``agent_loop_providers`` imports every name
here and re-exports the ones it always exported; its models, retries, pacing and socket
are built on them. What is sent, read, accepted and refused is stated in docs/models.md.
"""

from __future__ import annotations

import codecs
import datetime
import email.utils
import itertools
import json
import math
import time
from dataclasses import dataclass
from typing import (
    AbstractSet,
    Any,
    Callable,
    Dict,
    Final,
    Iterator,
    List,
    Mapping,
    Optional,
    Set,
    Type,
    Union,
    cast,
)

import agent_loop as al

__version__ = "1.5.0"

__all__ = [
    # What fails
    "ProviderError",
    "ProviderProtocolError",
    # Request bodies, and their argument checks
    "openai_request_body",
    "anthropic_request_body",
    "ANTHROPIC_VERSION",
    "ANTHROPIC_MAX_TOKENS",
    "OPENAI_OWNED_KEYS",
    "ANTHROPIC_OWNED_KEYS",
    "check_model_name",
    "check_system_prompt",
    "check_max_tokens",
    "check_thinking_setting",
    "check_options",
    "check_flag",
    # The response's head
    "check_response_head",
    "SERVER_LOG_HINT",
    # Event streams
    "ServerSentEvent",
    "ServerSentEvents",
    "MAX_EVENT_SIZE",
    # Answers
    "ResponseIds",
    "OpenAIAnswer",
    "AnthropicAnswer",
]


# --- Constants ----------------------------------------------------------------------

ANTHROPIC_VERSION: Final = "2023-06-01"
"""The ``anthropic-version`` header: the Messages API version this adapter speaks."""
ANTHROPIC_MAX_TOKENS: Final = 4096
"""Anthropic's ``max_tokens`` when none is given (the API requires one)."""
MAX_EVENT_SIZE: Final = 1 << 20
"""Most characters in one line, or in one event's data, of an event stream (1 MiB): a
server that never ends a line or an event cannot fill the memory."""
OPENAI_OWNED_KEYS: Final = frozenset({"model", "messages", "stream", "tools"})
"""Chat Completions body keys the body builder sets itself: ``options`` may not set them."""
ANTHROPIC_OWNED_KEYS: Final = OPENAI_OWNED_KEYS | {"system", "max_tokens", "thinking"}
"""Messages body keys the body builder sets itself: ``options`` may not set them."""
SERVER_LOG_HINT: Final = "the server failed on this request: its log says why"
"""What an HTTP 500, or a stream cut after its head, most likely means (errors say it)."""
_EXCERPT: Final = 200
"""Most characters of a body or an event quoted in an error message."""
_STREAM_OPTIONS: Final = {"include_usage": True}
"""OpenAI's request for the usage chunk; ``options`` may replace it (None: not sent)."""
_ANTHROPIC_USAGE: Final = (
    ("input_tokens", "input_tokens"),
    ("output_tokens", "output_tokens"),
    ("cache_read_input_tokens", "cache_read_tokens"),
    ("cache_creation_input_tokens", "cache_write_tokens"),
)
"""Anthropic's usage keys, and the ``Usage`` field each one is."""
_OPENAI_CUT: Final = {
    "length": "the token limit",
    "content_filter": "the provider's content filter",
}
"""OpenAI finish reasons that say the answer is incomplete, and what each means."""
_ANTHROPIC_CUT: Final = {
    "max_tokens": "the max_tokens limit",
    "refusal": "the provider's safety classifier",
    "pause_turn": "a paused turn, which this adapter does not resume",
    "model_context_window_exceeded": "the model's context window",
}
"""Anthropic stop reasons that say the answer is incomplete, and what each means."""
_TOKEN_LIMITS: Final = frozenset({"length", "max_tokens"})
"""The cuts that ``accept_truncated`` may accept: the answer's token limit."""
_CONCURRENCY_HINT: Final = (
    "more requests at once than the server serves (it ends an answer it interrupts so): "
    "share one model object, built with max_concurrency=N (N: what the server serves at "
    "once), among every run"
)
"""The likely cause of an OpenAI answer that ends without a ``finish_reason``."""
_CONTEXT_CODES: Final = frozenset({"context_length_exceeded"})
"""Error codes that say the request is longer than the model's context: OpenAI's, which
llama-cpp-python's server and llmock send too."""
_CONTEXT_TYPES: Final = frozenset({"exceed_context_size_error"})
"""Error types that say so: llama.cpp's own server (``llama-server``)."""
_CONTEXT_MESSAGES: Final = ("prompt is too long",)
"""Error messages that start so say so: Anthropic's (``invalid_request_error``)."""


# --- What fails -------------------------------------------------------------------------


class ProviderError(Exception):
    """A provider request failed; the message says what happened and where.

    ``status`` is the HTTP status when the provider answered with one outside 200-299
    (>= 400, or a redirect...), else None.
    ``retry_after`` is the provider's Retry-After in seconds, when it sent one, else None.
    ``error_type`` is the provider's own name for its error, the ``type`` of the error
    object in an error body or an error event (``overloaded_error``,
    ``rate_limit_error``...), when it named one, else None.
    ``code`` is the provider's error code, the error object's ``code`` when it is a
    string (OpenAI's ``context_length_exceeded``, ``rate_limit_exceeded``...), else None.
    ``context_exceeded`` is True when the provider refused the request as longer than the
    model's context (the code ``context_length_exceeded``, which OpenAI, llama-cpp-python's
    server and llmock send; llama.cpp's type ``exceed_context_size_error``; Anthropic's
    message "prompt is too long...") or cut the answer at it (Anthropic's stop reason
    ``model_context_window_exceeded``): a shorter request may pass.
    ``finish_reason`` is the provider's finish or stop reason when it cut the answer
    (``length``, ``content_filter``, ``max_tokens``, ``refusal``...), else None.
    ``usage`` is the ``Usage`` the provider reported for the answer that then failed (it
    may bill a cut, broken or refused answer), else None; ``RunResult.usage`` counts
    only the responses a run appended, so a failed answer's cost is here alone.

    A ``ProviderError`` itself is what the provider said (an HTTP error, an error event,
    a cut answer), or (raised by agent_loop_providers) a certificate that did not verify
    or a cancellation; its subclasses say what else failed: ``ProviderProtocolError``
    (the bytes) and agent_loop_providers' ``ProviderConnectionError`` (the network).
    """

    def __init__(
        self,
        message: str,
        *,
        status: Optional[int] = None,
        retry_after: Optional[float] = None,
        error_type: Optional[str] = None,
        usage: Optional[al.Usage] = None,
        code: Optional[str] = None,
        context_exceeded: bool = False,
        finish_reason: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.error_type = error_type
        self.usage = usage
        self.code = code
        self.context_exceeded = context_exceeded
        self.finish_reason = finish_reason


class ProviderProtocolError(ProviderError):
    """The bytes are not a complete answer: malformed, or incomplete.

    Malformed: not UTF-8, a line or an event over ``MAX_EVENT_SIZE``, data that is not a
    JSON object, an event out of place, a field of the wrong type, tool-call arguments
    that are not a JSON object, an answer in JSON instead of an event stream.
    ``incomplete`` is True when the bytes ended before the answer did (no end marker, or
    OpenAI's ``[DONE]`` without a ``finish_reason``): what came was right, as far as it
    went. ``status``, ``retry_after``, ``code`` and ``finish_reason`` are None.
    """

    def __init__(
        self, message: str, *, incomplete: bool = False, usage: Optional[al.Usage] = None
    ) -> None:
        super().__init__(message, usage=usage)
        self.incomplete = incomplete


_Block = Union[al.TextBlock, al.ThinkingBlock, al.ToolCall]
"""A block of a response's content."""

_DeltaKind = Type[Union[al.TextDelta, al.ThinkingDelta]]
"""A chunk class that streams text: TextDelta, or ThinkingDelta."""


# --- Argument checks: each parameter is checked by one function, wherever it enters ------


def check_model_name(model: object) -> str:
    """Returns ``model``, the provider's model name; raises TypeError unless it is a str,
    ValueError when it is empty."""
    if not isinstance(model, str):
        raise TypeError(f"model must be a str, got {type(model).__name__}")
    if not model:
        raise ValueError("model must name the provider's model, got ''")
    return model


def check_system_prompt(system: object) -> Optional[str]:
    """Returns ``system``, the system prompt (a str, or None); raises TypeError otherwise."""
    if system is not None and not isinstance(system, str):
        raise TypeError(f"system must be a str or None, got {type(system).__name__}")
    return system


def check_flag(value: object, name: str) -> bool:
    """Returns ``value``; raises TypeError, naming the parameter ``name``, unless it is a
    bool."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_max_tokens(max_tokens: object) -> int:
    """Returns ``max_tokens``, Anthropic's token budget for the answer; raises TypeError
    unless it is an int, ValueError when it is below 1."""
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        raise TypeError(f"max_tokens must be an int, got {type(max_tokens).__name__}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens}")
    return max_tokens


def check_thinking_setting(thinking: object) -> Optional[Dict[str, Any]]:
    """Returns Anthropic's thinking setting as it is sent: None (none), ``{"type":
    "adaptive"}`` for ``"adaptive"``, or a plain copy of the API's mapping (JSON with a
    ``type``). Raises TypeError or ValueError for anything else."""
    if thinking is None:
        return None
    if thinking == "adaptive":
        return {"type": "adaptive"}
    if isinstance(thinking, str):
        raise ValueError(
            f"thinking must be None, 'adaptive' or the API's mapping (e.g. "
            f"{{'type': 'enabled', 'budget_tokens': 2048}}), got {thinking!r}"
        )
    if not isinstance(thinking, Mapping):
        raise TypeError(
            f"thinking must be None, 'adaptive' or a mapping, got {type(thinking).__name__}"
        )
    setting = check_options(thinking, frozenset(), "thinking")
    if not isinstance(setting.get("type"), str):
        raise ValueError(
            f"thinking must say its 'type' (e.g. 'enabled', with 'budget_tokens'), got {setting!r}"
        )
    return setting


def check_options(
    options: object, owned_keys: AbstractSet[str], what: str = "options"
) -> Dict[str, Any]:
    """Returns ``options`` as a plain copy ({} for None): a JSON object none of whose keys
    is in ``owned_keys`` (the body builder's own, ``OPENAI_OWNED_KEYS`` or
    ``ANTHROPIC_OWNED_KEYS``). Raises TypeError for what is not a mapping of plain JSON,
    ValueError for an owned key; the messages call it ``what``."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(f"{what} must be a mapping or None; got {type(options).__name__}")
    try:
        plain = json.loads(json.dumps(dict(options), allow_nan=False))
    except (TypeError, ValueError) as error:
        raise TypeError(f"{what} must be plain JSON: {error}") from None
    owned = sorted(key for key in plain if key in owned_keys)
    if owned:
        raise ValueError(
            f"{what} may not set {', '.join(owned)}: the adapter sets them (use its arguments)"
        )
    return dict(plain)


def _checked_request(request: object) -> al.ModelRequest:
    if not isinstance(request, al.ModelRequest):
        raise TypeError(f"request must be a ModelRequest, got {type(request).__name__}")
    return request


# --- Wire formats: the response's head ------------------------------------------------


def check_response_head(
    url: str,
    status: int,
    reason: str,
    headers: Mapping[str, str],
    body: Callable[[], bytes],
    now: Optional[float] = None,
) -> None:
    """Checks that a response's head starts an event stream; raises what it says otherwise.

    ``headers`` are the response's, by lower-case name; ``body()`` returns the error
    body (as much of it as you read: this module reads 64 KiB), called only when an
    error needs it; ``now`` (seconds since the epoch; None: ``time.time()``) dates a
    Retry-After given as an HTTP date. ``url`` names the request in the message.

    Raises ProviderError for a status >= 400 (with ``status``, the provider's text and
    ``error_type``, and ``retry_after`` from ``retry-after-ms``, else ``retry-after`` in
    seconds or as an HTTP date) and for another status outside 200-299 (a redirect's
    ``Location`` is named: it is not followed), ProviderProtocolError for a 2xx answer
    in JSON instead of an event stream.
    """
    if status >= 400:
        retry_after = _retry_after(headers, time.time() if now is None else now)
        said = _ErrorText.read(_decoded(body()))
        message = f"{url} answered HTTP {status} {reason}: {said.text}"
        if status == 500:
            message += f" ({SERVER_LOG_HINT})"
        if retry_after is not None:
            message += f" (Retry-After: {retry_after:g} s)"
        raise said.error(message, status=status, retry_after=retry_after)
    if not 200 <= status < 300:  # a redirect (not followed), or another status: no stream
        location = headers.get("location")
        where = f" (Location: {location}; redirects are not followed)" if location else ""
        raise ProviderError(
            f"{url} answered HTTP {status} {reason}, not an event stream{where}", status=status
        )
    if headers.get("content-type", "").startswith("application/json"):
        raise ProviderProtocolError(
            f"{url} answered with JSON, not an event stream: {_excerpt(_decoded(body()))}"
        )


def _decoded(body: bytes) -> str:
    return body.decode("utf-8", "replace")


def _retry_after(headers: Mapping[str, str], now: float) -> Optional[float]:
    """Retry-After in seconds: ``retry-after-ms``, else ``retry-after``, else None.

    ``retry-after`` is seconds or an HTTP date (a date in the past is 0 s). A value that
    is neither, negative or not finite is not read.
    """
    milliseconds = _seconds(headers.get("retry-after-ms"))
    if milliseconds is not None:
        return milliseconds / 1000.0
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _seconds(value)
    if seconds is not None:
        return seconds
    try:
        date = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):  # overflow: a year of many digits
        return None
    if date.tzinfo is None:  # "-0000": the date is in UTC all the same
        date = date.replace(tzinfo=datetime.timezone.utc)
    return max(date.timestamp() - now, 0.0)


def _seconds(value: Optional[str]) -> Optional[float]:
    """A header's number, when it is one that is finite and >= 0."""
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


@dataclass(frozen=True)
class _ErrorText:
    """What a provider's error body or error event says: its text, type, code and message."""

    text: str  # the error's message, with its type; else the body's excerpt
    error_type: Optional[str] = None
    code: Optional[str] = None
    message: str = ""  # the error object's own message ("" when it has none)

    @classmethod
    def read(cls, body: str) -> _ErrorText:
        """The provider's own error text (its ``error.message``, with the type; else the
        body), and its error type and code, when it named them."""
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):  # not JSON, or nested too deeply to read
            return cls(_excerpt(body) or "(no body)")
        error = data.get("error", data) if isinstance(data, dict) else data
        if isinstance(error, str):
            return cls(error, message=error)
        if not isinstance(error, dict):
            return cls(_excerpt(body))
        kind, code, message = error.get("type"), error.get("code"), error.get("message")
        kind = kind if isinstance(kind, str) else None
        code = code if isinstance(code, str) else None  # llama.cpp's is the HTTP status
        if not isinstance(message, str):
            return cls(_excerpt(body), kind, code)
        return cls(message if kind is None else f"{kind}: {message}", kind, code, message)

    def error(self, message: str, **fields: Any) -> ProviderError:
        """The ProviderError that says ``message``, with what this error text names."""
        exceeded = (
            self.code in _CONTEXT_CODES
            or self.error_type in _CONTEXT_TYPES
            or self.message.lower().startswith(_CONTEXT_MESSAGES)
        )
        return ProviderError(
            message,
            error_type=self.error_type,
            code=self.code,
            context_exceeded=exceeded,
            **fields,
        )


def _excerpt(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _EXCERPT else text[:_EXCERPT] + "..."


# --- Wire formats: server-sent events ------------------------------------------------


@dataclass(frozen=True)
class ServerSentEvent:
    """One dispatched server-sent event: its type (``event:``, "" when none) and its data
    (its ``data:`` lines joined with LF)."""

    event: str
    data: str


class ServerSentEvents:
    """The event-stream parser, sans-IO: ``feed(bytes)`` returns the events they complete.

    It follows the WHATWG rules ("event stream interpretation"), as the official SDKs do;
    both companions read their event streams with it (agent_loop_mcp.py too). Bytes are
    decoded as UTF-8 (a leading byte order mark dropped), also when a character is split
    across reads. Lines end with CRLF, CR or LF, also split across reads; a line that
    starts with ':' is a comment; a line without a colon is a field with an empty value;
    one space after the colon is dropped; ``data:`` lines accumulate, joined with LF (an
    empty one too: ``data:`` alone is an event whose data is ""); ``event:`` names the
    event; a blank line dispatches the event when it has a ``data`` line. Other fields
    (``id:``, ``retry:``) are ignored. ``feed(b"")`` is the end of the input: an event or
    a line still open is dropped (only a blank line dispatches).

    Raises ProviderProtocolError for bytes that are not UTF-8 (a character cut by the
    end of the input included), and for a line, or an event's data, longer than
    ``max_size`` characters (``MAX_EVENT_SIZE`` unless given; counted as the lines come,
    so that a server that never ends a line or an event cannot fill the memory).
    """

    def __init__(self, max_size: int = MAX_EVENT_SIZE) -> None:
        if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
            raise TypeError(f"max_size must be an int >= 1, got {max_size!r}")
        self.max_size = max_size
        # utf-8-sig: a byte order mark at the start is dropped, as the WHATWG rules say.
        self._decoder = codecs.getincrementaldecoder("utf-8-sig")()
        self._pending: List[str] = []  # the start of a line that has not ended yet, in parts
        self._pending_size = 0
        self._skip_line_feed = False  # the last read ended with a CR
        self._event = ""
        self._data: List[str] = []
        self._size = 0  # the characters of the data joined: kept as lines come, not summed

    def feed(self, data: bytes) -> List[ServerSentEvent]:
        """The events that these bytes complete, in order; b"" ends the input."""
        try:
            text = self._decoder.decode(data, final=not data)
        except UnicodeDecodeError as error:
            raise ProviderProtocolError(
                f"malformed event stream: it is not UTF-8 ({error})"
            ) from None
        if not data:  # the end: what is still open is dropped
            self._pending = []
            self._pending_size = 0
            self._skip_line_feed = False
            self._event = ""
            self._data = []
            self._size = 0
            return []
        if self._skip_line_feed and text.startswith("\n"):
            text = text[1:]  # the LF of a CRLF that the last read ended in the middle of
        self._skip_line_feed = text.endswith("\r")
        # Only the new text is split: the start of the open line holds no line end.
        lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        rest = lines.pop()
        if lines:
            lines[0] = "".join(self._pending) + lines[0]
            self._pending, self._pending_size = [], 0
        self._pending.append(rest)
        self._pending_size += len(rest)
        if self._pending_size > self.max_size:
            raise ProviderProtocolError(
                f"malformed event stream: a line longer than {self.max_size:,}"
            )
        events: List[ServerSentEvent] = []
        for line in lines:
            if not line:
                if self._data:
                    events.append(ServerSentEvent(self._event, "\n".join(self._data)))
                self._event = ""
                self._data = []
                self._size = 0
                continue
            name, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if name == "data":
                if self._data:  # the LF that joins it to the line before: empty lines count
                    self._size += 1
                self._size += len(value)
                self._data.append(value)
                if self._size > self.max_size:
                    raise ProviderProtocolError(
                        f"malformed event stream: an event longer than {self.max_size:,}"
                    )
            elif name == "event":
                self._event = value
            # A comment (no name) and the id and retry fields change nothing here.
        return events


# --- Wire formats: ids and the answer -------------------------------------------------


class ResponseIds:
    """The ids of one answer to ``request`` and of its tool calls: unique in the request's
    transcript, and deterministic (docs/models.md's rule).

    ``response_id`` is ``response-NNN`` for the loop's ``request-NNN`` (``response-`` and
    the request id for another id), or the first of ``-2``, ``-3``... after it whose
    assistant message id is free. ``call_id(provider_id)`` is the id of the response's
    next call: the provider's own when it is a str that is free, else
    ``{response_id}-call-N`` (N counts the calls), made free the same way. Raises
    TypeError for a request that is not a ``ModelRequest``.
    """

    def __init__(self, request: al.ModelRequest) -> None:
        request = _checked_request(request)
        self.message_ids: Set[str] = set()
        self.call_ids: Set[str] = set()
        for message in request.messages:
            self.message_ids.add(message.id)
            if isinstance(message, al.AssistantMessage):
                for block in message.content:
                    if isinstance(block, al.ToolCall):
                        self.call_ids.add(block.id)
        number = al.request_number(request.id)
        base = request.id if number is None else f"{number:03d}"
        self.response_id = _free("response-" + base, self._response_taken)
        self.calls = 0

    def call_id(self, provider_id: object) -> str:
        """The id for the response's next tool call, the provider's when it is free; it is
        taken from then on."""
        self.calls += 1
        if isinstance(provider_id, str) and provider_id and not self._call_taken(provider_id):
            chosen = provider_id
        else:
            chosen = _free(f"{self.response_id}-call-{self.calls}", self._call_taken)
        self.call_ids.add(chosen)
        return chosen

    def _response_taken(self, candidate: str) -> bool:
        return al.assistant_message_id(candidate) in self.message_ids

    def _call_taken(self, candidate: str) -> bool:
        return candidate in self.call_ids or al.tool_result_id(candidate) in self.message_ids


def _free(base: str, taken: Callable[[str], bool]) -> str:
    """base, or the first of base-2, base-3... that is not taken."""
    candidate, suffix = base, 1
    while taken(candidate):
        suffix += 1
        candidate = f"{base}-{suffix}"
    return candidate


class _Answer:
    """What both answers share: bytes in, the model's chunks out, then the response.

    ``feed(data)`` returns the chunks that the bytes complete: a TextDelta or a
    ThinkingDelta per non-empty delta, a ToolCallChunk per complete call. ``feed(b"")``
    is the end of the input. ``done`` is True once the answer's end came (the bytes
    after it are not read). ``response()`` is the terminal ModelResponse: the blocks in
    the provider's order, its usage, and a stop reason that is ``toolCall`` when it
    holds calls, else ``stop``. ``reported_usage()`` is the usage reported so far (None:
    none), also of an answer that failed. ``truncated`` says what cut an answer that
    ``accept_truncated`` accepted, else None. The ids of the response and of its calls
    are unique in ``request``'s transcript.
    """

    end_marker = ""

    def __init__(self, request: al.ModelRequest, accept_truncated: bool, url: str) -> None:
        self._request = _checked_request(request)
        self._accept_truncated = check_flag(accept_truncated, "accept_truncated")
        if not isinstance(url, str):
            raise TypeError(f"url must be a str, got {type(url).__name__}")
        self._source = f" from {url}" if url else ""  # for the incomplete-answer error
        self._ids = ResponseIds(request)
        self._events = ServerSentEvents()
        self._chunks: List[al.ModelChunk] = []  # every chunk fed so far, in order
        self._counts: Dict[str, int] = {}  # the Usage fields the provider reported
        self.done = False
        self.truncated: Optional[str] = None
        self._provider_id: Optional[str] = None  # the provider's own id of the answer

    def feed(self, data: bytes) -> List[al.ModelChunk]:
        """The chunks these bytes complete; nothing once the answer's end came.

        ``feed(b"")`` ends the input: it raises ProviderProtocolError (``incomplete``)
        unless the end came. When it raises, the chunks these bytes completed before the
        failure are not returned. Raises ProviderProtocolError for what is malformed (JSON
        nested too deeply for the json module included), and ProviderError for an error
        event and for an answer the provider says was cut.
        """
        out: List[al.ModelChunk] = []
        for event in self._events.feed(data):
            if self.done:
                break
            if event.event == "error":
                raise _stream_error(event.data)
            try:
                self._event(event, out)
            except RecursionError:  # json's C code recurses once per level of nesting
                raise ProviderProtocolError(
                    "malformed event: JSON nested too deeply to read (in the event's data "
                    "or in a tool call's arguments)"
                ) from None
        self._chunks.extend(out)
        if not data and not self.done:
            raise self._incomplete()
        return out

    def response(self) -> al.ModelResponse:
        """The terminal response; raises ProviderProtocolError (``incomplete``) before the
        answer's end."""
        if not self.done:
            raise self._incomplete()
        content = self._content()
        has_calls = any(isinstance(block, al.ToolCall) for block in content)
        return al.ModelResponse(
            self._ids.response_id,
            self._request.id,
            content,
            "toolCall" if has_calls else "stop",
            self.reported_usage(),
            provider_response_id=self._provider_id,
        )

    def reported_usage(self) -> Optional[al.Usage]:
        """The usage the provider reported so far, or None when it reported none."""
        return al.Usage(**self._counts) if self._counts else None

    def _content(self) -> List[_Block]:
        raise NotImplementedError  # pragma: no cover (both subclasses define it)

    def _event(self, event: ServerSentEvent, out: List[al.ModelChunk]) -> None:
        raise NotImplementedError  # pragma: no cover (both subclasses define it)

    def _incomplete(self) -> ProviderError:
        """The input ended before the end marker."""
        return _incomplete(f"the stream{self._source} ended before {self.end_marker}")

    def _cut(
        self, field: str, reason: str, meaning: str, out: List[al.ModelChunk]
    ) -> Optional[ProviderError]:
        """The provider says the answer was cut: the error, or None for a text answer
        accepted as it is (``truncated`` says what cut it).

        With accept_truncated, an answer whose last chunk is text, cut by the token
        limit, is the model's answer. Anything else is an error.
        """
        last = out[-1] if out else self._chunks[-1] if self._chunks else None
        if self._accept_truncated and reason in _TOKEN_LIMITS and type(last) is al.TextDelta:
            self.truncated = f"{meaning} ({field} {reason!r})"
            return None
        return _cut_error(f"the answer was cut: {field} {reason!r} ({meaning})", reason)

    def _provider_response_id(self, value: object) -> None:
        """The provider's own id of the answer, the first one given (a str, not "")."""
        if self._provider_id is None and isinstance(value, str) and value:
            self._provider_id = value

    def _call(self, provider_id: object, name: object, arguments: str) -> al.ToolCall:
        """A complete tool call: its name checked, its arguments a JSON object ('' is {})."""
        if not isinstance(name, str) or not name:
            raise ProviderProtocolError(
                f"malformed event stream: a tool call has no name ({name!r})"
            )
        try:
            value = json.loads(arguments) if arguments.strip() else {}
        except ValueError as error:
            raise ProviderProtocolError(
                f"tool call {name!r} has arguments that are not JSON ({error}): "
                f"{_excerpt(arguments)}"
            ) from None
        if not isinstance(value, dict):
            raise ProviderProtocolError(
                f"tool call {name!r} has arguments that are not a JSON object: "
                f"{_excerpt(arguments)}"
            )
        return al.ToolCall(self._ids.call_id(provider_id), name, value)


def _count(usage: Mapping[str, Any], key: str, data: Mapping[str, Any]) -> Optional[int]:
    """A token count of a usage object: None when absent or null, else an int >= 0."""
    value = usage.get(key)
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise _malformed(f"usage {key} is not an int >= 0", data)
    return value


def _usage_object(value: object, what: str, data: Mapping[str, Any]) -> Mapping[str, Any]:
    """A usage object or its details: {} when absent or null, else a JSON object."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _malformed(f"{what} is not an object", data)
    return value


_decode_json: Final = json.JSONDecoder().decode
"""json.loads() without its argument checks: a third less per event, and events are many."""


def _json_object(data: str) -> Dict[str, Any]:
    """An event's data as a JSON object, or the malformed-event failure."""
    try:
        value = _decode_json(data)
    except ValueError:
        raise ProviderProtocolError(
            f"malformed event: its data is not JSON: {_excerpt(data)}"
        ) from None
    if not isinstance(value, dict):
        raise ProviderProtocolError(
            f"malformed event: its data is not a JSON object: {_excerpt(data)}"
        )
    return value


def _incomplete(what: str, hint: str = "") -> ProviderProtocolError:
    """An answer the server did not finish: the bytes ended before the answer did."""
    return ProviderProtocolError(f"{what}: the answer is incomplete{hint}", incomplete=True)


def _malformed(what: str, data: Mapping[str, Any]) -> ProviderProtocolError:
    return ProviderProtocolError(f"malformed event: {what}: {_excerpt(json.dumps(data))}")


def _cut_error(message: str, reason: str) -> ProviderError:
    """An answer the provider cut: its finish or stop reason says why."""
    exceeded = reason == "model_context_window_exceeded"
    return ProviderError(message, finish_reason=reason, context_exceeded=exceeded)


def _stream_error(data: str) -> ProviderError:
    """An error event inside the stream: the provider's own text, and its error type."""
    said = _ErrorText.read(data)
    return said.error(f"the stream reported an error: {said.text}")


# --- Wire formats: OpenAI Chat Completions -------------------------------------------


def openai_request_body(
    request: al.ModelRequest,
    model: str,
    *,
    system: Optional[str] = None,
    options: Optional[Mapping[str, Any]] = None,
) -> bytes:
    """The Chat Completions request body (UTF-8 JSON) for a ModelRequest, streamed.

    ``model`` names the provider's model; ``system`` is the system prompt; ``options``
    (plain JSON) is merged into the body last, and may not set ``model``, ``messages``,
    ``stream`` or ``tools``. The body asks for the usage chunk (``stream_options``),
    unless ``options`` replaces it (None: none). POST it to ``{base_url}/chat/completions``
    with ``Content-Type: application/json`` (and ``Authorization: Bearer <key>``); read
    the answer with ``OpenAIAnswer``.

    Raises TypeError or ValueError, naming the parameter, for an argument it cannot use.
    """
    request = _checked_request(request)
    model = check_model_name(model)
    system = check_system_prompt(system)
    options = check_options(options, OPENAI_OWNED_KEYS)
    messages: List[Dict[str, Any]] = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    for message in request.messages:
        if isinstance(message, al.UserMessage):
            messages.append({"role": "user", "content": message.content})
        elif isinstance(message, al.AssistantMessage):
            # "" when there is no text: llama.cpp's servers refuse null and a missing content.
            # Thinking is not sent: DeepSeek refuses reasoning_content in input.
            turn: Dict[str, Any] = {
                "role": "assistant",
                "content": al.text_from_assistant(message),
            }
            calls = [block for block in message.content if isinstance(block, al.ToolCall)]
            if calls:
                turn["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {
                            "name": call.name,
                            "arguments": json.dumps(call.plain_arguments(), ensure_ascii=False),
                        },
                    }
                    for call in calls
                ]
            messages.append(turn)
        else:
            messages.append(
                {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
            )
    body: Dict[str, Any] = {
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": dict(_STREAM_OPTIONS),
    }
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": spec.name,
                    "description": spec.description,
                    "parameters": spec.to_dict()["parameters"],
                },
            }
            for spec in request.tools
        ]
    body.update(options)
    if body["stream_options"] is None:  # a server that refuses the field (Mistral's)
        del body["stream_options"]
    return json.dumps(body, ensure_ascii=False).encode("utf-8")


class OpenAIAnswer(_Answer):
    """One streamed Chat Completions answer to ``request``, sans-IO: bytes in, chunks out.

    ``feed(data)`` takes the response body's bytes as they arrive and returns the chunks
    they complete (``choices[0].delta``'s text, thinking and tool-call fragments; a call
    is complete when something else begins); ``feed(b"")`` ends the input. A ``feed()``
    that raises returns nothing: the deltas its bytes held before the failing event are
    dropped with it (``stream()`` then retries the request when it had yielded no chunk).
    ``done`` is True at ``data: [DONE]`` after a ``finish_reason`` (at ``[DONE]`` alone with
    ``require_finish_reason=False``); then ``response()`` is the ModelResponse, with the
    usage chunk's counts. ``reported_usage()`` is the usage reported so far, also of a
    failed answer; ``truncated`` says what cut an answer that was accepted, else None.
    ``accept_truncated=True`` accepts an answer cut by the token limit that ends in text;
    ``url`` names the stream in the incomplete-answer error.

    ``feed()`` raises ProviderProtocolError for malformed or incomplete bytes, and
    ProviderError for an error event and for a cut answer (``length``,
    ``content_filter``: at ``[DONE]``, or at the end of the input, once the usage chunk
    after the finish was read, so that the failed answer's usage is known).
    """

    end_marker = "data: [DONE]"

    def __init__(
        self,
        request: al.ModelRequest,
        *,
        accept_truncated: bool = False,
        require_finish_reason: bool = True,
        url: str = "",
    ) -> None:
        super().__init__(request, accept_truncated, url)
        self._require_finish_reason = check_flag(require_finish_reason, "require_finish_reason")
        # Tool calls being streamed, by index: [provider id, name, argument fragments].
        self._open_calls: Dict[int, List[Any]] = {}
        self._closed_indexes: Set[int] = set()
        self._finish: Optional[str] = None  # choice 0's finish_reason, once it came
        self._failure: Optional[ProviderError] = None  # a cut, raised at the end

    def _content(self) -> List[_Block]:
        """The chunks as blocks: adjacent text joined, adjacent thinking joined."""
        content: List[_Block] = []
        for kind, run in itertools.groupby(self._chunks, type):
            # The casts do nothing at run time (and their mutants neither).
            if kind is al.ToolCallChunk:
                calls = cast(Iterator[al.ToolCallChunk], run)  # pragma: no mutate
                content.extend(chunk.tool_call for chunk in calls)
            elif kind is al.TextDelta:
                texts = cast(Iterator[al.TextDelta], run)  # pragma: no mutate
                content.append(al.TextBlock("".join(chunk.text for chunk in texts)))
            else:
                thinkings = cast(Iterator[al.ThinkingDelta], run)  # pragma: no mutate
                thinking = "".join(chunk.thinking for chunk in thinkings)
                content.append(al.ThinkingBlock(thinking))
        return content

    def _event(self, event: ServerSentEvent, out: List[al.ModelChunk]) -> None:
        if event.data == "[DONE]":
            if self._failure is not None:
                raise self._failure
            if self._finish is None and self._require_finish_reason:
                # llama-cpp-python's server ends a stream it interrupts (another request
                # came) with [DONE] right after the last chunk it sent, and no finish.
                raise _incomplete(
                    f"the stream{self._source} ended with {self.end_marker} but no finish_reason",
                    f" (likely cause: {_CONCURRENCY_HINT}; for a server that never sends a "
                    "finish_reason: require_finish_reason=False)",
                )
            self._close_calls(out)
            self.done = True
            return
        data = _json_object(event.data)
        if data.get("error") is not None:
            raise _stream_error(event.data)
        self._provider_response_id(data.get("id"))  # every chunk has it: chatcmpl-...
        choices = data.get("choices")
        if not isinstance(choices, list):
            raise _malformed("a chunk without a choices list", data)
        for choice in choices:
            if not isinstance(choice, dict) or not isinstance(choice.get("delta", {}), dict):
                raise _malformed("a choice that is not an object with a delta object", data)
            if choice.get("index", 0) == 0 and self._failure is None:  # a cut answer ended
                self._choice(choice, data, out)
        usage = data.get("usage")
        if usage is not None:  # the usage chunk; other chunks have none, or null
            self._usage(usage, data)

    def _choice(
        self, choice: Dict[str, Any], data: Dict[str, Any], out: List[al.ModelChunk]
    ) -> None:
        delta = choice.get("delta", {})
        # llama.cpp, vLLM and DeepSeek say reasoning_content; OpenRouter says reasoning.
        thinking = delta.get("reasoning_content")
        if thinking is None or thinking == "":  # an empty one says nothing: read the other
            thinking = delta.get("reasoning")
        if thinking is not None:
            self._piece(al.ThinkingDelta, thinking, "reasoning", data, out)
        for key in ("content", "refusal"):
            text = delta.get(key)
            if text is not None:
                self._piece(al.TextDelta, text, key, data, out)
        fragments = delta.get("tool_calls")
        if fragments is not None:
            if not isinstance(fragments, list):
                raise _malformed("delta.tool_calls is not a list", data)
            for position, fragment in enumerate(fragments):
                self._fragment(position, fragment, data, out)
        finish = choice.get("finish_reason")
        if finish is None or finish == "":  # "" says nothing, as null does
            return
        if not isinstance(finish, str):
            raise _malformed("a finish_reason that is not a string", data)
        self._finish = finish
        if finish in _OPENAI_CUT:
            if self._open_calls:  # a call being written when the answer was cut
                self._failure = _cut_error(
                    f"the answer was cut: finish_reason {finish!r} "
                    f"({_OPENAI_CUT[finish]}) while a tool call was streamed",
                    finish,
                )
                return
            self._failure = self._cut("finish_reason", finish, _OPENAI_CUT[finish], out)
        self._close_calls(out)  # none is open after a cut

    def _incomplete(self) -> ProviderError:
        """The input ended before [DONE]: the cut, if one came, else a broken stream."""
        if self._failure is not None:
            return self._failure
        if self._finish is None:
            return _incomplete(
                f"the stream{self._source} ended before {self.end_marker} and without a "
                f"finish_reason",
                f" (the server stopped sending: {SERVER_LOG_HINT}; or {_CONCURRENCY_HINT})",
            )
        return super()._incomplete()

    def _piece(
        self,
        kind: _DeltaKind,
        text: object,
        key: str,
        data: Dict[str, Any],
        out: List[al.ModelChunk],
    ) -> None:
        """A piece of text or thinking: it ends the calls being streamed."""
        if not isinstance(text, str):
            raise _malformed(f"delta.{key} is not a string", data)
        if text:
            if self._open_calls:  # a call is complete once something else begins
                self._close_calls(out)
            out.append(kind(self._request.id, text))

    def _fragment(
        self, position: int, fragment: object, data: Dict[str, Any], out: List[al.ModelChunk]
    ) -> None:
        """One piece of a tool call: its id and name come first, then argument text."""
        if not isinstance(fragment, dict):
            raise _malformed("a tool-call fragment that is not an object", data)
        index = fragment.get("index", position)
        function = fragment.get("function", {})
        if not isinstance(index, int) or not isinstance(function, dict):
            raise _malformed("a tool-call fragment without an int index or a function", data)
        if index in self._closed_indexes:
            raise _malformed(f"tool call {index} continues after it was complete", data)
        if index not in self._open_calls:
            self._close_calls(out)  # the next call began: the ones before are complete
            self._open_calls[index] = [None, None, []]
        call = self._open_calls[index]
        if fragment.get("id"):
            call[0] = fragment["id"]
        if function.get("name"):
            call[1] = function["name"]
        arguments = function.get("arguments")
        if arguments is not None:
            if not isinstance(arguments, str):
                raise _malformed("tool-call arguments that are not a string", data)
            call[2].append(arguments)

    def _close_calls(self, out: List[al.ModelChunk]) -> None:
        for index, (provider_id, name, arguments) in self._open_calls.items():
            self._closed_indexes.add(index)
            call = self._call(provider_id, name, "".join(arguments))
            out.append(al.ToolCallChunk(self._request.id, call))
        self._open_calls.clear()

    def _usage(self, value: object, data: Dict[str, Any]) -> None:
        """The request's usage: the last usage object replaces any before it."""
        usage = _usage_object(value, "usage", data)
        prompt = _count(usage, "prompt_tokens", data)
        details = _usage_object(usage.get("prompt_tokens_details"), "prompt details", data)
        cached = _count(details, "cached_tokens", data)
        reasoning_details = _usage_object(
            usage.get("completion_tokens_details"), "completion details", data
        )
        if prompt is not None and cached is not None and cached > prompt:
            raise _malformed("usage with more cached tokens than prompt tokens", data)
        fields = {
            # prompt_tokens includes the cached tokens; Usage counts them apart.
            "input_tokens": prompt if prompt is None or cached is None else prompt - cached,
            "output_tokens": _count(usage, "completion_tokens", data),
            "cache_read_tokens": cached,
            "reasoning_tokens": _count(reasoning_details, "reasoning_tokens", data),
        }
        self._counts = {name: count for name, count in fields.items() if count is not None}


# --- Wire formats: Anthropic Messages --------------------------------------------------


def anthropic_request_body(
    request: al.ModelRequest,
    model: str,
    *,
    system: Optional[str] = None,
    max_tokens: int = ANTHROPIC_MAX_TOKENS,
    thinking: Union[Mapping[str, Any], str, None] = None,
    options: Optional[Mapping[str, Any]] = None,
) -> bytes:
    """The Messages request body (UTF-8 JSON) for a ModelRequest, streamed.

    ``model`` names the provider's model; ``system`` is the system prompt;
    ``max_tokens`` the answer's token budget; ``thinking`` None (no setting),
    ``"adaptive"`` or the API's mapping; ``options`` (plain JSON) is merged into the
    body last, and may not set ``model``, ``messages``, ``stream``, ``tools``,
    ``system``, ``max_tokens`` or ``thinking``. Each assistant turn is its blocks as the
    API returned them, in their order; consecutive tool results share a user turn. POST
    it to ``{base_url}/v1/messages`` with ``Content-Type: application/json``,
    ``anthropic-version: ANTHROPIC_VERSION`` (and ``x-api-key``); read the answer with
    ``AnthropicAnswer``.

    Raises TypeError or ValueError, naming the parameter, for an argument it cannot use.
    """
    request = _checked_request(request)
    model = check_model_name(model)
    system = check_system_prompt(system)
    max_tokens = check_max_tokens(max_tokens)
    setting = check_thinking_setting(thinking)
    options = check_options(options, ANTHROPIC_OWNED_KEYS)
    messages: List[Dict[str, Any]] = []
    results: Optional[List[Dict[str, Any]]] = None  # the user turn that results join
    for message in request.messages:
        if isinstance(message, al.ToolResultMessage):
            if results is None:  # the first of consecutive results opens a user turn
                results = []
                messages.append({"role": "user", "content": results})
            results.append(
                {
                    "type": "tool_result",
                    "tool_use_id": message.tool_call_id,
                    "content": message.content,
                    "is_error": message.is_error,
                }
            )
            continue
        results = None
        if isinstance(message, al.UserMessage):
            messages.append({"role": "user", "content": message.content})
            continue
        content: List[Dict[str, Any]] = []
        for block in message.content:
            if isinstance(block, al.TextBlock):
                if block.text:  # the API refuses empty text blocks
                    content.append({"type": "text", "text": block.text})
            elif isinstance(block, al.ThinkingBlock):
                # The API wants thinking back unchanged, and refuses it without its
                # signature: unsigned thinking came from another provider, not from Claude.
                if not block.signature:
                    continue
                if block.redacted:
                    content.append({"type": "redacted_thinking", "data": block.signature})
                else:
                    content.append(
                        {
                            "type": "thinking",
                            "thinking": block.thinking,
                            "signature": block.signature,
                        }
                    )
            else:
                content.append(
                    {
                        "type": "tool_use",
                        "id": block.id,
                        "name": block.name,
                        "input": block.plain_arguments(),
                    }
                )
        if content:  # an empty answer has nothing to send, and the API refuses an empty turn
            messages.append({"role": "assistant", "content": content})
    body: Dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "messages": messages,
        "stream": True,
    }
    if system is not None:
        body["system"] = system
    if setting is not None:
        body["thinking"] = setting
    if request.tools:
        body["tools"] = [
            {
                "name": spec.name,
                "description": spec.description,
                "input_schema": spec.to_dict()["parameters"],
            }
            for spec in request.tools
        ]
    body.update(options)
    return json.dumps(body, ensure_ascii=False).encode("utf-8")


class _OpenBlock:
    """An Anthropic content block being streamed: its type, its pieces, its signature."""

    def __init__(self, kind: str, start: Dict[str, Any]) -> None:
        self.kind = kind  # text, thinking, redacted_thinking, tool_use, or "" (not kept)
        self.start = start  # the content_block of content_block_start
        self.pieces: List[str] = []  # text, thinking, or tool_use's partial JSON
        self.signature: Optional[str] = None


class AnthropicAnswer(_Answer):
    """One streamed Messages answer to ``request``, sans-IO: bytes in, chunks out.

    ``feed(data)`` takes the response body's bytes as they arrive and returns the chunks
    they complete (content blocks started, extended by deltas, stopped: text and
    thinking deltas as they come, a tool call at its ``content_block_stop``);
    ``feed(b"")`` ends the input. ``done`` is True at ``message_stop`` (every block
    stopped before it); then ``response()`` is the ModelResponse, each block in the
    provider's order, with the usage of ``message_start`` and ``message_delta``.
    ``reported_usage()`` is the usage reported so far, also of a failed answer;
    ``truncated`` says what cut an answer that was accepted, else None.
    ``accept_truncated=True`` accepts an answer cut by the token limit that ends in
    text; ``url`` names the stream in the incomplete-answer error.

    ``feed()`` raises ProviderProtocolError for malformed or incomplete bytes, and
    ProviderError for an error event and for a cut answer (``max_tokens``, ``refusal``,
    ``pause_turn``, ``model_context_window_exceeded``: at its ``message_delta``).
    """

    end_marker = "message_stop"

    def __init__(
        self, request: al.ModelRequest, *, accept_truncated: bool = False, url: str = ""
    ) -> None:
        super().__init__(request, accept_truncated, url)
        self._open_blocks: Dict[int, _OpenBlock] = {}
        # The stopped blocks by index (None: nothing kept), so that content keeps the
        # provider's order.
        self._stopped: Dict[int, Optional[_Block]] = {}

    def _content(self) -> List[_Block]:
        return [block for _, block in sorted(self._stopped.items()) if block is not None]

    def _event(self, event: ServerSentEvent, out: List[al.ModelChunk]) -> None:
        data = _json_object(event.data)
        kind = data.get("type")
        if kind == "error":
            raise _stream_error(event.data)
        if kind == "content_block_start":
            self._start(data, out)
        elif kind == "content_block_delta":
            self._delta(data, out)
        elif kind == "content_block_stop":
            index = self._index(data, known=True)
            self._stop(index, self._open_blocks.pop(index), data, out)
        elif kind == "message_start":
            message = _usage_object(data.get("message"), "message_start's message", data)
            self._provider_response_id(message.get("id"))  # msg_...
            self._usage(message.get("usage"), data)
        elif kind == "message_delta":
            delta = data.get("delta")
            if not isinstance(delta, dict):
                raise _malformed("message_delta without a delta object", data)
            self._usage(data.get("usage"), data)
            reason = delta.get("stop_reason")
            if reason is not None and not isinstance(reason, str):
                raise _malformed("a stop_reason that is not a string", data)
            if reason in _ANTHROPIC_CUT:  # the usage of this event is read already
                failure = self._cut("stop_reason", reason, _ANTHROPIC_CUT[reason], out)
                if failure is not None:
                    raise failure
        elif kind == "message_stop":
            if self._open_blocks:  # a block without its stop was cut: it is no answer
                raise _malformed(
                    f"message_stop before block {min(self._open_blocks)} stopped", data
                )
            self.done = True
        # ping and event types added later carry no content.

    def _start(self, data: Dict[str, Any], out: List[al.ModelChunk]) -> None:
        index = self._index(data, known=False)
        start = data.get("content_block")
        if not isinstance(start, dict):
            raise _malformed("content_block_start without a content_block object", data)
        kind = start.get("type")
        if kind not in ("text", "thinking", "redacted_thinking", "tool_use"):
            kind = ""  # pragma: no mutate (server tools...: not the answer; None is as falsy)
        block = self._open_blocks[index] = _OpenBlock(kind, start)
        if kind == "text":
            self._piece(block, al.TextDelta, start.get("text", ""), data, out)
        elif kind == "thinking":
            self._piece(block, al.ThinkingDelta, start.get("thinking", ""), data, out)
            self._signature(block, start.get("signature"), data)

    def _delta(self, data: Dict[str, Any], out: List[al.ModelChunk]) -> None:
        block = self._open_blocks[self._index(data, known=True)]
        delta = data.get("delta")
        if not isinstance(delta, dict):
            raise _malformed("content_block_delta without a delta object", data)
        kind = delta.get("type")
        if not block.kind:  # a block that is not kept (server_tool_use...): any delta
            return
        if kind == "text_delta":
            if block.kind != "text":
                raise _malformed("text_delta for a block that is not text", data)
            self._piece(block, al.TextDelta, delta.get("text"), data, out)
        elif kind == "thinking_delta":
            if block.kind != "thinking":
                raise _malformed("thinking_delta for a block that is not thinking", data)
            self._piece(block, al.ThinkingDelta, delta.get("thinking"), data, out)
        elif kind == "signature_delta":
            if block.kind != "thinking":
                raise _malformed("signature_delta for a block that is not thinking", data)
            self._signature(block, delta.get("signature"), data)
        elif kind == "input_json_delta":
            fragment = delta.get("partial_json")
            if block.kind != "tool_use" or not isinstance(fragment, str):
                raise _malformed("input_json_delta without a tool_use block or partial_json", data)
            block.pieces.append(fragment)
        # citations_delta and delta types added later: not the answer.

    def _stop(
        self, index: int, block: _OpenBlock, data: Dict[str, Any], out: List[al.ModelChunk]
    ) -> None:
        """A block is complete: what the response keeps of it, in its place."""
        kept: Optional[_Block] = None
        if block.kind == "text":
            text = "".join(block.pieces)
            kept = al.TextBlock(text) if text else None  # an empty one is not sent back
        elif block.kind == "thinking":
            kept = al.ThinkingBlock("".join(block.pieces), block.signature)
        elif block.kind == "redacted_thinking":
            redacted = block.start.get("data")
            if not isinstance(redacted, str) or not redacted:
                raise _malformed("a redacted_thinking block without its data", data)
            kept = al.ThinkingBlock("", redacted, redacted=True)
        elif block.kind == "tool_use":
            start = block.start.get("input", {})
            arguments = "".join(block.pieces) if block.pieces else json.dumps(start)
            kept = self._call(block.start.get("id"), block.start.get("name"), arguments)
            out.append(al.ToolCallChunk(self._request.id, kept))
        self._stopped[index] = kept

    def _index(self, data: Dict[str, Any], *, known: bool) -> int:
        """The event's block index: a started one for deltas and stops, a new one to start."""
        index = data.get("index")
        started = index in self._open_blocks
        if not isinstance(index, int) or started is not known or index in self._stopped:
            state = "started" if known else "new"
            raise _malformed(f"an index that is not a {state} block's", data)
        return index

    def _piece(
        self,
        block: _OpenBlock,
        kind: _DeltaKind,
        text: object,
        data: Dict[str, Any],
        out: List[al.ModelChunk],
    ) -> None:
        """A piece of a text or thinking block: kept in the block, and streamed."""
        if not isinstance(text, str):
            raise _malformed(f"{block.kind} that is not a string", data)
        if text:
            block.pieces.append(text)
            out.append(kind(self._request.id, text))

    def _signature(self, block: _OpenBlock, signature: object, data: Dict[str, Any]) -> None:
        """A thinking block's signature: the last one given ("" is none)."""
        if signature is None:
            return
        if not isinstance(signature, str):
            raise _malformed("a signature that is not a string", data)
        block.signature = signature or None

    def _usage(self, value: object, data: Dict[str, Any]) -> None:
        """The counts of a usage object; they are cumulative: the last of each key wins."""
        usage = _usage_object(value, "usage", data)
        for key, name in _ANTHROPIC_USAGE:
            count = _count(usage, key, data)
            if count is not None:
                self._counts[name] = count
