# agent_loop_providers.py 1.0.0: streaming provider adapters for agent_loop.py.
# One file, standard library only; copy it next to agent_loop.py. Home: the agent_loop repository.
"""Real models for the Agent Loop: OpenAI-compatible and Anthropic streaming APIs.

``OpenAIChatModel`` posts to ``{base_url}/chat/completions`` (OpenAI, and every server
that speaks its Chat Completions format: Ollama, llama.cpp, vLLM, LM Studio...) and
``AnthropicMessagesModel`` posts to ``{base_url}/v1/messages``. Both implement the
loop's ``Model`` protocol: ``stream(request, signal)`` returns a generator that yields
``TextDelta`` and ``ToolCallChunk`` chunks as they arrive and returns the terminal
``ModelResponse``. Any failure raises ``ProviderError`` from that generator, which the
loop turns into a ``failed`` run with ``MODEL_STREAM_ERROR`` (the exception itself is
kept in ``result.error.exception``, so a caller can back off on ``retry_after``).

Rules:

- The transcript is converted exactly, both ways. A user message is a user turn; an
  assistant message is one assistant turn with its text (blocks concatenated) and its
  tool calls (arguments as JSON); a tool result is linked to its call by the call's id
  as it is in the transcript. OpenAI: one ``tool`` message per result (the format has no
  error flag: the content says what went wrong). Anthropic: consecutive results are
  merged into one user turn of ``tool_result`` blocks, each with its ``is_error``.
  ``request.tools`` become the provider's tool definitions; ``system`` is the system
  prompt (the transcript has no system role); ``options`` is merged into the body last,
  and may not set what the adapter owns (model, messages, stream, tools; for Anthropic
  also system and max_tokens, which are arguments).
- Streaming: each text delta is yielded as one ``TextDelta`` when it arrives (empty text
  is not yielded), and each tool call as one ``ToolCallChunk`` as soon as its arguments
  are complete: OpenAI, when the next call or text begins or the choice finishes;
  Anthropic, at its ``content_block_stop``. The response holds the same blocks in the
  same order (adjacent text joined); its stop reason is ``toolCall`` when it holds calls,
  else ``stop``, whatever the provider said (some servers say ``stop`` for tool calls).
  Empty arguments (``""``, a tool without parameters) mean ``{}``. The loop's limits
  hold: an answer streamed in more than ``MAX_STEP_CHUNKS`` (1,024) deltas, or with more
  than ``MAX_STEP_TEXT`` characters, fails the run with ``MODEL_PROTOCOL_ERROR``; bound the
  answer with the provider's token limit (``options={"max_tokens": ...}``, or Anthropic's
  ``max_tokens``).
- Ids are unique in the transcript, whatever the provider sends (some servers send
  ``call_0`` in every response), and deterministic, so a recorded run replays exactly.
  The response to ``request-NNN`` is ``response-NNN`` (``response-`` + the request id
  for another request id). A tool call keeps the provider's id when that id is a
  non-empty string that the transcript and this response do not use yet; otherwise it
  is ``<response id>-call-<n>``, n counting the response's calls from 1. Either id takes
  the first free suffix ``-2``, ``-3``... when it is taken. The transcript's ids are what
  later requests send back to the provider.
- Completeness: the provider's end marker decides, not its finish reason. An answer is
  complete when ``data: [DONE]`` (OpenAI) or ``message_stop`` (Anthropic) arrives;
  Ollama ends complete answers with ``finish_reason: null`` and ``[DONE]``, and that is a
  complete answer. Nothing is accepted without the marker. A ``ProviderError`` names
  what happened for each of: an HTTP status >= 400 (the status, the provider's own error
  text, Retry-After: ``retry-after-ms`` or ``retry-after`` in seconds; a date is not
  read), a connection that cannot be made (the address), no byte for
  ``timeout`` seconds, a stream that ends before its marker, an error event in the
  stream (OpenAI-compatible servers send ``data: {"error": ...}``; Anthropic sends
  ``event: error``), a malformed event, tool-call arguments that are not a JSON object,
  and an answer the provider says was cut: OpenAI ``finish_reason`` ``length`` or
  ``content_filter``; Anthropic ``stop_reason`` ``max_tokens``, ``refusal``,
  ``pause_turn`` or ``model_context_window_exceeded``. There are no retries.
- Ignored, as not part of an answer: comment lines and ``id:``/``retry:`` fields of the
  event stream; OpenAI choices other than index 0, chunks whose choices list is empty (usage),
  fields other than ``content``, ``refusal`` (kept as text: it is the answer) and
  ``tool_calls``; Anthropic ``ping``, unknown event types, and content blocks other than
  ``text`` and ``tool_use`` (``thinking``, ``redacted_thinking``, server tools...) with
  their deltas. Events after the end marker are not read: the connection is closed.
- Cancellation: while the generator waits on the network, a watcher thread waits on the
  signal (in slices of 50 ms, so that it ends with the stream) and, once it is set, shuts
  the socket down, so the blocked read returns at once and the run ends ``cancelled``.
  The connection is closed whichever way the step ends, the consumer's ``close()``
  included, and the watcher ends with it. Connecting (DNS and TCP) is bounded by
  ``timeout`` but not watched.
- ``api_key=None`` reads ``OPENAI_API_KEY`` or ``ANTHROPIC_API_KEY`` at request time; with
  no key, none is sent (local servers need none).

The wire formats are sans-IO: ``_ServerEvents`` turns received bytes into server-sent
events, ``_OpenAIAnswer`` and ``_AnthropicAnswer`` turn those into blocks, and
``_openai_body()`` / ``_anthropic_body()`` turn a request into a body, all testable from
byte strings alone. ``_Exchange`` is the one place with a socket, a timeout and the
cancellation watch.

Run ``python agent_loop_providers.py --help`` for the command line: an agent with the
demonstration's tools, against any endpoint.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import http.client
import json
import math
import os
import signal as os_signal
import socket
import sys
import threading
import urllib.parse
from dataclasses import dataclass
from typing import (
    AbstractSet,
    Any,
    Callable,
    Dict,
    Final,
    Generator,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
    cast,
)

import agent_loop as al

__version__ = "1.0.0"

__all__ = ["OpenAIChatModel", "AnthropicMessagesModel", "ProviderError"]


# --- Constants ----------------------------------------------------------------------

ANTHROPIC_VERSION: Final = "2023-06-01"
"""The ``anthropic-version`` header: the Messages API version this adapter speaks."""
_USER_AGENT: Final = f"agent_loop_providers/{__version__}"
"""Sent with every request, so a provider's logs can tell this client."""
_READ_SIZE: Final = 65_536
"""Most bytes one read returns; a read returns as soon as any byte is there."""
_WATCH_INTERVAL: Final = 0.05
"""Seconds between two looks at the signal: cancellation closes within about this."""
_ERROR_BODY_LIMIT: Final = 65_536
"""Most bytes of an error response read for its message."""
_EVENT_LIMIT: Final = 1 << 20
"""Most characters in one line, or in one event's data, of an event stream (1 MiB)."""
_EXCERPT: Final = 200
"""Most characters of a body or an event quoted in an error message."""
_OPENAI_OWNED: Final = frozenset({"model", "messages", "stream", "tools"})
"""Chat Completions body keys the adapter sets itself: ``options`` may not set them."""
_ANTHROPIC_OWNED: Final = _OPENAI_OWNED | {"system", "max_tokens"}
"""Messages body keys the adapter sets itself: ``options`` may not set them."""
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


# --- Public classes -----------------------------------------------------------------


class ProviderError(Exception):
    """A provider request failed; the message says what happened and where.

    ``status`` is the HTTP status when the provider answered with one >= 400, else None.
    ``retry_after`` is the provider's Retry-After in seconds, when it sent one, else None.
    """

    def __init__(
        self, message: str, *, status: Optional[int] = None, retry_after: Optional[float] = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


_Block = Union[str, al.ToolCall]
"""What a wire format yields: text, or a complete tool call."""


class _StreamingModel:
    """What both adapters share: arguments, and the one stream() around the exchange."""

    _key_variable: str = ""
    _owned_keys: AbstractSet[str] = frozenset()

    def __init__(
        self,
        model: str,
        base_url: str,
        api_key: Optional[str],
        system: Optional[str],
        timeout: float,
        options: Optional[Mapping[str, Any]],
    ) -> None:
        if not isinstance(model, str):
            raise TypeError(f"model must be a str, got {type(model).__name__}")
        if not model:
            raise ValueError("model must name the provider's model, got ''")
        self.model = model
        self.base_url = _checked_base_url(base_url)
        if api_key is not None and not isinstance(api_key, str):
            raise TypeError(f"api_key must be a str or None, got {type(api_key).__name__}")
        self.api_key = api_key
        if system is not None and not isinstance(system, str):
            raise TypeError(f"system must be a str or None, got {type(system).__name__}")
        self.system = system
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool):
            raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__}")
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
        self.timeout = float(timeout)
        self.options = _checked_options(options, self._owned_keys)

    def stream(
        self, request: al.ModelRequest, signal: al.Signal
    ) -> Generator[al.ModelChunk, None, al.ModelResponse]:
        """Streams the answer to one request; the generator returns the response.

        Raises ProviderError from the generator when the answer is not complete.
        """
        answer = self._answer(request)
        url, headers, body = self._post(request)
        exchange = _Exchange(url, headers, body, self.timeout, signal)
        try:
            exchange.open()
            while not answer.done:
                data = exchange.read()
                if not data:
                    raise answer.incomplete()
                for block in answer.feed(data):
                    if isinstance(block, str):
                        yield al.TextDelta(request.id, block)
                    else:
                        yield al.ToolCallChunk(request.id, block)
        finally:
            exchange.close()
        return answer.response()

    def _key(self) -> Optional[str]:
        """The API key: the argument, else the environment at request time; '' is none."""
        key = self.api_key if self.api_key is not None else os.environ.get(self._key_variable)
        return key or None

    def _answer(self, request: al.ModelRequest) -> _Answer:
        raise NotImplementedError  # pragma: no cover (both subclasses define it)

    def _post(self, request: al.ModelRequest) -> Tuple[str, Dict[str, str], bytes]:
        raise NotImplementedError  # pragma: no cover (both subclasses define it)


class OpenAIChatModel(_StreamingModel):
    """A model behind an OpenAI-compatible Chat Completions endpoint, streamed.

    Posts to ``{base_url}/chat/completions`` with ``stream: true``. ``api_key=None`` reads
    ``OPENAI_API_KEY`` at request time and sends no key when there is none. ``system`` is
    the system prompt; ``options`` (temperature, max_tokens...) is merged into the body.
    ``timeout`` bounds connecting and every wait for a byte, in seconds.

    Raises TypeError or ValueError, naming the parameter, for an argument it cannot use.
    """

    _key_variable = "OPENAI_API_KEY"
    _owned_keys = _OPENAI_OWNED

    def __init__(
        self,
        model: str,
        *,
        base_url: str = "https://api.openai.com/v1",
        api_key: Optional[str] = None,
        system: Optional[str] = None,
        timeout: float = 60.0,
        options: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__(model, base_url, api_key, system, timeout, options)

    def _answer(self, request: al.ModelRequest) -> _Answer:
        return _OpenAIAnswer(request)

    def _post(self, request: al.ModelRequest) -> Tuple[str, Dict[str, str], bytes]:
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "User-Agent": _USER_AGENT,
        }
        key = self._key()
        if key is not None:
            headers["Authorization"] = "Bearer " + key
        body = _openai_body(request, self.model, self.system, self.options)
        return self.base_url + "/chat/completions", headers, body


class AnthropicMessagesModel(_StreamingModel):
    """A model behind Anthropic's Messages API, streamed.

    Posts to ``{base_url}/v1/messages`` with ``stream: true`` and the ``anthropic-version``
    header. ``api_key=None`` reads ``ANTHROPIC_API_KEY`` at request time and sends no key
    when there is none. ``system`` is the system prompt, ``max_tokens`` the answer's token
    budget (an answer that reaches it fails the run); ``options`` (temperature...) is
    merged into the body. ``timeout`` bounds connecting and every wait for a byte.

    Raises TypeError or ValueError, naming the parameter, for an argument it cannot use.
    """

    _key_variable = "ANTHROPIC_API_KEY"
    _owned_keys = _ANTHROPIC_OWNED

    def __init__(
        self,
        model: str,
        *,
        base_url: str = "https://api.anthropic.com",
        api_key: Optional[str] = None,
        system: Optional[str] = None,
        max_tokens: int = 4096,
        timeout: float = 60.0,
        options: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__(model, base_url, api_key, system, timeout, options)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
            raise TypeError(f"max_tokens must be an int, got {type(max_tokens).__name__}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens}")
        self.max_tokens = max_tokens

    def _answer(self, request: al.ModelRequest) -> _Answer:
        return _AnthropicAnswer(request)

    def _post(self, request: al.ModelRequest) -> Tuple[str, Dict[str, str], bytes]:
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "User-Agent": _USER_AGENT,
            "anthropic-version": ANTHROPIC_VERSION,
        }
        key = self._key()
        if key is not None:
            headers["x-api-key"] = key
        body = _anthropic_body(request, self.model, self.system, self.max_tokens, self.options)
        return self.base_url + "/v1/messages", headers, body


def _checked_base_url(base_url: object) -> str:
    """base_url: an http(s) URL with a host, no query or fragment; the trailing / dropped."""
    if not isinstance(base_url, str):
        raise TypeError(f"base_url must be a str, got {type(base_url).__name__}")
    parts = urllib.parse.urlsplit(base_url)
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.query
        or parts.fragment
    ):
        raise ValueError(
            f"base_url must be an http:// or https:// URL with a host and no query, "
            f"got {base_url!r}"
        )
    try:
        _ = parts.port  # urlsplit checks the port only when it is read
    except ValueError:
        raise ValueError(f"base_url has an invalid port: {base_url!r}") from None
    return base_url.rstrip("/")


def _checked_options(options: object, owned_keys: AbstractSet[str]) -> Dict[str, Any]:
    """options: a JSON object whose keys the adapter does not own; kept as a plain copy."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(f"options must be a mapping or None, got {type(options).__name__}")
    try:
        copy = json.loads(json.dumps(dict(options), allow_nan=False))
    except (TypeError, ValueError) as error:
        raise TypeError(f"options must be plain JSON: {error}") from None
    owned = sorted(key for key in copy if key in owned_keys)
    if owned:
        raise ValueError(
            f"options may not set {', '.join(owned)}: the adapter sets them (use its arguments)"
        )
    return dict(copy)


# --- The exchange: the one place with a socket -------------------------------------


class _Exchange:
    """One POST and its streamed response: the timeout and the cancellation watch.

    ``open()`` connects, sends and reads the status; a status >= 400 raises. ``read()``
    returns the next bytes as soon as there are any, b"" at the end. ``close()`` closes
    the connection and ends the watcher; it is safe to call at any point, more than once.
    """

    def __init__(
        self, url: str, headers: Dict[str, str], body: bytes, timeout: float, signal: al.Signal
    ) -> None:
        self.url = url
        self.headers = headers
        self.body = body
        self.timeout = timeout
        self.signal = signal
        parts = urllib.parse.urlsplit(url)
        connection_class = (
            http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        )
        self.connection = connection_class(parts.hostname or "", parts.port, timeout=timeout)
        self.path = parts.path
        self.response: Optional[http.client.HTTPResponse] = None
        self.finished = threading.Event()

    def open(self) -> None:
        """Connects, sends the request and reads the response's head."""
        try:
            self.connection.connect()
            if self.signal.is_set():  # set while connecting, which is not watched
                raise self._cancelled()
            threading.Thread(
                target=self._watch,
                args=(self.connection.sock,),
                name="agent_loop_providers watch",
                daemon=True,
            ).start()
            self.connection.request("POST", self.path, self.body, self.headers)
            response = self.connection.getresponse()
        except socket.timeout:
            raise self._failure(f"{self.url} sent nothing for {self.timeout:g} s") from None
        except ConnectionRefusedError as error:
            raise ProviderError(f"cannot connect to {self.url}: {error}") from None
        except (OSError, http.client.HTTPException) as error:
            raise self._failure(f"the request to {self.url} failed: {_described(error)}") from None
        self.response = response
        if response.status >= 400:
            raise _status_error(self.url, response, _error_body(response))
        if response.getheader("Content-Type", "").startswith("application/json"):
            raise ProviderError(
                f"{self.url} answered with JSON, not an event stream: "
                f"{_excerpt(_error_body(response))}"
            )

    def read(self) -> bytes:
        """The next bytes of the response body (b"" at its end)."""
        response = cast(http.client.HTTPResponse, self.response)  # open() succeeded
        try:
            data = response.read1(_READ_SIZE)
        except socket.timeout:
            raise self._failure(f"{self.url} sent nothing for {self.timeout:g} s") from None
        except (OSError, http.client.HTTPException) as error:
            raise self._failure(
                f"the connection to {self.url} broke: {_described(error)}"
            ) from None
        if not data and self.signal.is_set():  # the end the watcher's shutdown made
            raise self._cancelled()
        return data

    def close(self) -> None:
        """Closes the connection; the watcher sees it and ends within _WATCH_INTERVAL."""
        self.finished.set()
        self.connection.close()
        if self.response is not None:  # a response that will close holds the socket
            self.response.close()

    def _watch(self, connection: socket.socket) -> None:
        """The cancellation watch: shuts the socket down once the signal is set.

        A blocked read then returns at once. The socket may be closed by then: shutting
        down a closed socket raises, and the error is dropped.
        """
        while not self.finished.is_set():
            if self.signal.wait(_WATCH_INTERVAL):
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
                return

    def _failure(self, message: str) -> ProviderError:
        """A network failure, or the cancellation that caused it."""
        return self._cancelled() if self.signal.is_set() else ProviderError(message)

    def _cancelled(self) -> ProviderError:
        return ProviderError(f"the request to {self.url} was cancelled")


def _error_body(response: http.client.HTTPResponse) -> str:
    """The body of an answer that is not a stream, or '' when it cannot be read."""
    try:
        data = response.read(_ERROR_BODY_LIMIT)
    except (OSError, http.client.HTTPException):
        return ""
    return data.decode("utf-8", "replace")


def _status_error(url: str, response: http.client.HTTPResponse, body: str) -> ProviderError:
    """HTTP status >= 400: the status, the provider's own error text, its Retry-After."""
    retry_after = _retry_after(response)
    message = f"{url} answered HTTP {response.status} {response.reason}: {_error_text(body)}"
    if retry_after is not None:
        message += f" (Retry-After: {retry_after:g} s)"
    return ProviderError(message, status=response.status, retry_after=retry_after)


def _retry_after(response: http.client.HTTPResponse) -> Optional[float]:
    """Retry-After in seconds: ``retry-after-ms`` or ``retry-after`` as a number, else None."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = response.getheader(name)
        if value is None:
            continue
        try:
            seconds = float(value) / scale
        except ValueError:
            continue  # an HTTP date: not read
        if math.isfinite(seconds) and seconds >= 0:
            return seconds
    return None


def _error_text(body: str) -> str:
    """The provider's own error text: its ``error.message`` (with the type), else the body."""
    try:
        data = json.loads(body)
    except ValueError:
        return _excerpt(body) or "(no body)"
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        kind = error.get("type")
        return f"{kind}: {error['message']}" if isinstance(kind, str) else error["message"]
    if isinstance(error, str):
        return error
    return _excerpt(body)


def _excerpt(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _EXCERPT else text[:_EXCERPT] + "..."


def _described(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


# --- Wire formats: server-sent events ------------------------------------------------


@dataclass(frozen=True)
class _ServerEvent:
    """One dispatched server-sent event: its type (``event:``) and its data."""

    event: str
    data: str


class _ServerEvents:
    """The event-stream parser (the WHATWG rules the official SDKs follow), bytes in.

    Bytes are decoded as UTF-8 (a leading byte order mark dropped), also when a character
    is split across reads; a line or an event's data longer than _EVENT_LIMIT characters
    is refused, so a server that never ends a line cannot fill the memory. Lines end
    with CRLF, CR or LF, also split across reads; a line that starts with ':' is a
    comment; ``data:`` lines accumulate, joined with LF; ``event:`` names the event; one
    space after the colon is dropped; a blank line dispatches the event (when it has
    data). Other fields are ignored. An event still open at the end is dropped.
    """

    def __init__(self) -> None:
        # utf-8-sig: a byte order mark at the start is dropped, as the WHATWG rules say.
        self.decoder = codecs.getincrementaldecoder("utf-8-sig")()
        self.pending = ""  # the start of a line that has not ended yet
        self.skip_line_feed = False  # the last read ended with a CR
        self.event = ""
        self.data: List[str] = []

    def feed(self, data: bytes) -> List[_ServerEvent]:
        """The events that these bytes complete, in order."""
        try:
            text = self.decoder.decode(data)
        except UnicodeDecodeError as error:
            raise ProviderError(f"malformed event stream: it is not UTF-8 ({error})") from None
        if self.skip_line_feed and text.startswith("\n"):
            text = text[1:]  # the LF of a CRLF that the last read ended in the middle of
        self.skip_line_feed = text.endswith("\r")
        lines = (self.pending + text).replace("\r\n", "\n").replace("\r", "\n").split("\n")
        self.pending = lines.pop()
        if len(self.pending) > _EVENT_LIMIT:
            raise ProviderError(f"malformed event stream: a line longer than {_EVENT_LIMIT:,}")
        events: List[_ServerEvent] = []
        for line in lines:
            if not line:
                if self.data:
                    events.append(_ServerEvent(self.event, "\n".join(self.data)))
                self.event = ""
                self.data = []
                continue
            name, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if name == "data":
                self.data.append(value)
                if sum(map(len, self.data)) > _EVENT_LIMIT:
                    raise ProviderError(
                        f"malformed event stream: an event longer than {_EVENT_LIMIT:,}"
                    )
            elif name == "event":
                self.event = value
            # A comment (no name) and the id and retry fields change nothing here.
        return events


# --- Wire formats: ids and the answer -------------------------------------------------


class _Ids:
    """The id scheme of the module docstring: unique in the transcript, deterministic."""

    def __init__(self, request: al.ModelRequest) -> None:
        self.message_ids: Set[str] = set()
        self.call_ids: Set[str] = set()
        for message in request.messages:
            self.message_ids.add(message.id)
            if isinstance(message, al.AssistantMessage):
                for block in message.content:
                    if isinstance(block, al.ToolCall):
                        self.call_ids.add(block.id)
        prefix = "request-"
        number = request.id[len(prefix) :] if request.id.startswith(prefix) else request.id
        self.response_id = _free("response-" + number, self._response_taken)
        self.calls = 0

    def call_id(self, provider_id: object) -> str:
        """The id for the response's next tool call, the provider's when it is free."""
        self.calls += 1
        if isinstance(provider_id, str) and provider_id and not self._call_taken(provider_id):
            chosen = provider_id
        else:
            chosen = _free(f"{self.response_id}-call-{self.calls}", self._call_taken)
        self.call_ids.add(chosen)
        return chosen

    def _response_taken(self, candidate: str) -> bool:
        return "message-" + candidate in self.message_ids

    def _call_taken(self, candidate: str) -> bool:
        return candidate in self.call_ids or "tool-result-" + candidate in self.message_ids


def _free(base: str, taken: Callable[[str], bool]) -> str:
    """base, or the first of base-2, base-3... that is not taken."""
    candidate, suffix = base, 1
    while taken(candidate):
        suffix += 1
        candidate = f"{base}-{suffix}"
    return candidate


class _Answer:
    """One streamed answer, sans-IO: bytes in, complete blocks out, then the response."""

    end_marker = ""

    def __init__(self, request: al.ModelRequest) -> None:
        self.request = request
        self.ids = _Ids(request)
        self.events = _ServerEvents()
        self.blocks: List[_Block] = []
        self.done = False

    def feed(self, data: bytes) -> List[_Block]:
        """The blocks these bytes complete; nothing once the end marker was seen."""
        out: List[_Block] = []
        for event in self.events.feed(data):
            if self.done:
                break
            if event.event == "error":
                raise _stream_error(event.data)
            self._event(event, out)
        self.blocks.extend(out)
        return out

    def incomplete(self) -> ProviderError:
        """The stream ended before the end marker."""
        return ProviderError(
            f"the stream ended before {self.end_marker}: the answer is incomplete"
        )

    def response(self) -> al.ModelResponse:
        """The terminal response: the streamed blocks, adjacent text joined."""
        content: List[Union[al.TextBlock, al.ToolCall]] = []
        text: List[str] = []
        for block in self.blocks:
            if isinstance(block, str):
                text.append(block)
                continue
            if text:
                content.append(al.TextBlock("".join(text)))
                text = []
            content.append(block)
        if text:
            content.append(al.TextBlock("".join(text)))
        has_calls = any(isinstance(block, al.ToolCall) for block in content)
        return al.ModelResponse(
            self.ids.response_id, self.request.id, content, "toolCall" if has_calls else "stop"
        )

    def _event(self, event: _ServerEvent, out: List[_Block]) -> None:
        raise NotImplementedError  # pragma: no cover (both subclasses define it)

    def _call(self, provider_id: object, name: object, arguments: str) -> al.ToolCall:
        """A complete tool call: its name checked, its arguments a JSON object ('' is {})."""
        if not isinstance(name, str) or not name:
            raise ProviderError(f"malformed event stream: a tool call has no name ({name!r})")
        try:
            value = json.loads(arguments) if arguments.strip() else {}
        except ValueError as error:
            raise ProviderError(
                f"tool call {name!r} has arguments that are not JSON ({error}): "
                f"{_excerpt(arguments)}"
            ) from None
        if not isinstance(value, dict):
            raise ProviderError(
                f"tool call {name!r} has arguments that are not a JSON object: "
                f"{_excerpt(arguments)}"
            )
        return al.ToolCall(self.ids.call_id(provider_id), name, value)


_decode_json: Final = json.JSONDecoder().decode
"""json.loads() without its argument checks: a third less per event, and events are many."""


def _json_object(data: str) -> Dict[str, Any]:
    """An event's data as a JSON object, or the malformed-event failure."""
    try:
        value = _decode_json(data)
    except ValueError:
        raise ProviderError(f"malformed event: its data is not JSON: {_excerpt(data)}") from None
    if not isinstance(value, dict):
        raise ProviderError(f"malformed event: its data is not a JSON object: {_excerpt(data)}")
    return value


def _malformed(what: str, data: Mapping[str, Any]) -> ProviderError:
    return ProviderError(f"malformed event: {what}: {_excerpt(json.dumps(data))}")


def _stream_error(data: str) -> ProviderError:
    """An error event inside the stream: the provider's own text."""
    return ProviderError(f"the stream reported an error: {_error_text(data)}")


# --- Wire formats: OpenAI Chat Completions -------------------------------------------


def _openai_body(
    request: al.ModelRequest, model: str, system: Optional[str], options: Mapping[str, Any]
) -> bytes:
    """The Chat Completions request body for a ModelRequest."""
    messages: List[Dict[str, Any]] = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    for message in request.messages:
        if isinstance(message, al.UserMessage):
            messages.append({"role": "user", "content": message.content})
        elif isinstance(message, al.AssistantMessage):
            turn: Dict[str, Any] = {"role": "assistant", "content": None}
            text = al.text_from_assistant(message)
            calls = [block for block in message.content if isinstance(block, al.ToolCall)]
            if text or not calls:
                turn["content"] = text
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
    body: Dict[str, Any] = {"model": model, "messages": messages, "stream": True}
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
    return json.dumps(body, ensure_ascii=False).encode("utf-8")


class _OpenAIAnswer(_Answer):
    """Chat Completions chunks: ``choices[0].delta`` content and tool-call fragments."""

    end_marker = "data: [DONE]"

    def __init__(self, request: al.ModelRequest) -> None:
        super().__init__(request)
        # Tool calls being streamed, by index: [provider id, name, argument fragments].
        self.open_calls: Dict[int, List[Any]] = {}
        self.closed_indexes: Set[int] = set()

    def _event(self, event: _ServerEvent, out: List[_Block]) -> None:
        if event.data == "[DONE]":
            self._close_calls(out)
            self.done = True
            return
        data = _json_object(event.data)
        if data.get("error") is not None:
            raise _stream_error(event.data)
        choices = data.get("choices")
        if not isinstance(choices, list):
            raise _malformed("a chunk without a choices list", data)
        for choice in choices:
            if not isinstance(choice, dict) or not isinstance(choice.get("delta", {}), dict):
                raise _malformed("a choice that is not an object with a delta object", data)
            if choice.get("index", 0) == 0:
                self._choice(choice, data, out)

    def _choice(self, choice: Dict[str, Any], data: Dict[str, Any], out: List[_Block]) -> None:
        delta = choice.get("delta", {})
        for key in ("content", "refusal"):
            text = delta.get(key)
            if text is None:
                continue
            if not isinstance(text, str):
                raise _malformed(f"delta.{key} is not a string", data)
            if text:
                if self.open_calls:  # a call is complete once something else begins
                    self._close_calls(out)
                out.append(text)
        fragments = delta.get("tool_calls")
        if fragments is not None:
            if not isinstance(fragments, list):
                raise _malformed("delta.tool_calls is not a list", data)
            for position, fragment in enumerate(fragments):
                self._fragment(position, fragment, data, out)
        finish = choice.get("finish_reason")
        if finish is not None:
            if finish in _OPENAI_CUT:
                raise ProviderError(
                    f"the answer was cut: finish_reason {finish!r} ({_OPENAI_CUT[finish]})"
                )
            self._close_calls(out)

    def _fragment(
        self, position: int, fragment: object, data: Dict[str, Any], out: List[_Block]
    ) -> None:
        """One piece of a tool call: its id and name come first, then argument text."""
        if not isinstance(fragment, dict):
            raise _malformed("a tool-call fragment that is not an object", data)
        index = fragment.get("index", position)
        function = fragment.get("function", {})
        if not isinstance(index, int) or not isinstance(function, dict):
            raise _malformed("a tool-call fragment without an int index or a function", data)
        if index in self.closed_indexes:
            raise _malformed(f"tool call {index} continues after it was complete", data)
        if index not in self.open_calls:
            self._close_calls(out)  # the next call began: the ones before are complete
            self.open_calls[index] = [None, None, []]
        call = self.open_calls[index]
        if fragment.get("id"):
            call[0] = fragment["id"]
        if function.get("name"):
            call[1] = function["name"]
        arguments = function.get("arguments")
        if arguments is not None:
            if not isinstance(arguments, str):
                raise _malformed("tool-call arguments that are not a string", data)
            call[2].append(arguments)

    def _close_calls(self, out: List[_Block]) -> None:
        for index, (provider_id, name, arguments) in self.open_calls.items():
            self.closed_indexes.add(index)
            out.append(self._call(provider_id, name, "".join(arguments)))
        self.open_calls.clear()


# --- Wire formats: Anthropic Messages --------------------------------------------------


def _anthropic_body(
    request: al.ModelRequest,
    model: str,
    system: Optional[str],
    max_tokens: int,
    options: Mapping[str, Any],
) -> bytes:
    """The Messages request body for a ModelRequest; consecutive results share a turn."""
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


class _AnthropicAnswer(_Answer):
    """Messages stream events: content blocks started, extended by deltas, stopped."""

    end_marker = "message_stop"

    def __init__(self, request: al.ModelRequest) -> None:
        super().__init__(request)
        # Blocks by index: "text", [id, name, input, fragments] for tool_use, None ignored.
        self.open_blocks: Dict[int, Any] = {}

    def _event(self, event: _ServerEvent, out: List[_Block]) -> None:
        data = _json_object(event.data)
        kind = data.get("type")
        if kind == "error":
            raise _stream_error(event.data)
        if kind == "content_block_start":
            self._start(data, out)
        elif kind == "content_block_delta":
            self._delta(data, out)
        elif kind == "content_block_stop":
            block = self.open_blocks.pop(self._index(data, known=True))
            if isinstance(block, list):
                provider_id, name, start, fragments = block
                arguments = "".join(fragments) if fragments else json.dumps(start)
                out.append(self._call(provider_id, name, arguments))
        elif kind == "message_delta":
            delta = data.get("delta")
            if not isinstance(delta, dict):
                raise _malformed("message_delta without a delta object", data)
            reason = delta.get("stop_reason")
            if reason in _ANTHROPIC_CUT:
                raise ProviderError(
                    f"the answer was cut: stop_reason {reason!r} ({_ANTHROPIC_CUT[reason]})"
                )
        elif kind == "message_stop":
            if any(isinstance(block, list) for block in self.open_blocks.values()):
                raise _malformed("message_stop before a tool_use block stopped", data)
            self.done = True
        # message_start, ping and event types added later carry no content.

    def _start(self, data: Dict[str, Any], out: List[_Block]) -> None:
        index = self._index(data, known=False)
        block = data.get("content_block")
        if not isinstance(block, dict):
            raise _malformed("content_block_start without a content_block object", data)
        kind = block.get("type")
        if kind == "text":
            self.open_blocks[index] = "text"
            self._text(block.get("text", ""), data, out)
        elif kind == "tool_use":
            start = block.get("input", {})
            self.open_blocks[index] = [block.get("id"), block.get("name"), start, []]
        else:
            self.open_blocks[index] = None  # thinking and other blocks: not the answer

    def _delta(self, data: Dict[str, Any], out: List[_Block]) -> None:
        block = self.open_blocks[self._index(data, known=True)]
        delta = data.get("delta")
        if not isinstance(delta, dict):
            raise _malformed("content_block_delta without a delta object", data)
        kind = delta.get("type")
        if kind == "text_delta":
            if block != "text":
                raise _malformed("text_delta for a block that is not text", data)
            self._text(delta.get("text"), data, out)
        elif kind == "input_json_delta":
            fragment = delta.get("partial_json")
            if not isinstance(block, list) or not isinstance(fragment, str):
                raise _malformed("input_json_delta without a tool_use block or partial_json", data)
            block[3].append(fragment)
        # thinking_delta, signature_delta, citations_delta...: not the answer.

    def _index(self, data: Dict[str, Any], *, known: bool) -> int:
        """The event's block index: a started one for deltas and stops, a new one to start."""
        index = data.get("index")
        if not isinstance(index, int) or (index in self.open_blocks) is not known:
            state = "started" if known else "new"
            raise _malformed(f"an index that is not a {state} block's", data)
        return index

    def _text(self, text: object, data: Dict[str, Any], out: List[_Block]) -> None:
        if not isinstance(text, str):
            raise _malformed("text that is not a string", data)
        if text:
            out.append(text)


# --- The command line -----------------------------------------------------------------


def _steps(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 1 <= value <= al.MAX_AGENT_STEPS:
        raise argparse.ArgumentTypeError(f"{value} is not in 1..{al.MAX_AGENT_STEPS}")
    return value


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs an agent with the demonstration's tools against a provider; prints its events.

    Returns 0 when the run completed, 1 otherwise. Ctrl-C sets the run's signal, so the
    run ends ``cancelled`` and its result is printed. Bad options exit with status 2.
    """
    parser = argparse.ArgumentParser(
        prog="python agent_loop_providers.py",
        description=(
            "Runs the Agent Loop against a streaming model API, with the demonstration's "
            "tools (add, multiply, weather), and prints each event on one line, then the "
            "result. The API key comes from OPENAI_API_KEY or ANTHROPIC_API_KEY, if set. "
            "Ctrl-C cancels the run."
        ),
    )
    parser.add_argument("--provider", required=True, choices=("openai", "anthropic"))
    parser.add_argument(
        "--base-url",
        required=True,
        metavar="URL",
        help="e.g. http://localhost:11434/v1 (Ollama) or https://api.anthropic.com",
    )
    parser.add_argument("--model", required=True, metavar="NAME", help="the provider's model")
    parser.add_argument("--system", metavar="TEXT", help="the system prompt")
    parser.add_argument(
        "--max-steps",
        type=_steps,
        default=8,
        metavar="N",
        help=f"the step budget, 1..{al.MAX_AGENT_STEPS} (default 8)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print each event as one JSON line (to_dict form), nothing else",
    )
    parser.add_argument("prompt", metavar="PROMPT", help="the user's message")
    options = parser.parse_args(argv)
    model_class = OpenAIChatModel if options.provider == "openai" else AnthropicMessagesModel
    try:
        model = model_class(options.model, base_url=options.base_url, system=options.system)
    except ValueError as error:
        parser.error(str(error))
    signal = threading.Event()

    def interrupt(number: int, frame: object) -> None:
        signal.set()  # the run ends cancelled
        # Connecting is not watched: a second Ctrl-C interrupts even that, at once.
        os_signal.signal(os_signal.SIGINT, previous)

    previous = os_signal.signal(os_signal.SIGINT, interrupt)
    try:
        run = al.run_agent_loop(
            messages=[al.UserMessage("user-001", options.prompt)],
            model=model,
            tools=al._demo_tools(),
            max_steps=options.max_steps,
            signal=signal,
        )
        while True:
            try:
                event = next(run)
            except StopIteration as done:
                result: al.RunResult = done.value
                break
            line = json.dumps(event.to_dict(), ensure_ascii=False)
            print(line if options.json else al._demo_line(event), flush=True)
    finally:
        os_signal.signal(os_signal.SIGINT, previous)
    if not options.json:
        print(al._demo_result(result))
    return 0 if result.status == "completed" else 1


if __name__ == "__main__":
    try:
        status = main()
        sys.stdout.flush()  # here, where a broken pipe can still be caught
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 1
    sys.exit(status)
