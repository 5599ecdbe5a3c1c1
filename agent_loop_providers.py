# agent_loop_providers.py 1.4.0: streaming provider adapters for agent_loop.py.
# One file, standard library only; copy it next to agent_loop.py. Home: the agent_loop repository.
"""Real models for the Agent Loop: OpenAI-compatible and Anthropic streaming APIs.

``OpenAIChatModel`` posts to ``{base_url}/chat/completions`` (OpenAI, and every server
that speaks its Chat Completions format: Ollama, llama.cpp, vLLM, LM Studio...) and
``AnthropicMessagesModel`` to ``{base_url}/v1/messages``. Both are the loop's ``Model``:
``stream(request, signal)`` yields ``TextDelta``, ``ThinkingDelta`` and ``ToolCallChunk``
chunks as they arrive and returns the ``ModelResponse``; a failure raises a
``ProviderError`` from the generator, and the run fails ``MODEL_STREAM_ERROR``. What is
sent, read, accepted, refused and retried is stated once, in docs/models.md, "Plugging in a
real model"; how long answers are paced, in ``_Pacer``.

Three layers, from the bytes up:

- The wire formats, sans-IO (h11's way: bytes in, events out, no socket, no policy):
  ``openai_request_body()`` and ``anthropic_request_body()`` make a request's body,
  ``check_response_head()`` reads the response's status and headers,
  ``ServerSentEvents`` turns bytes into events, and ``OpenAIAnswer`` and
  ``AnthropicAnswer`` turn bytes into the model's chunks, then its response. What they
  refuse is a ``ProviderProtocolError`` (malformed or incomplete bytes) or a
  ``ProviderError`` (what the provider said: an HTTP error, an error event, a cut answer).
- The transport: a ``Transport`` sends the request and returns the ``Exchange``, the
  response's head and then its body, bytes at a time. The default (``transport=None``)
  is ``_Exchange``, the one place with a socket: http.client on a socket made here, the
  timeout and the cancellation watch. What fails on the network is a
  ``ProviderConnectionError``.
- The socket loop, ``stream()``: attempts around those two, each in a
  ``max_concurrency`` slot, none sent while an HTTP 429's Retry-After pauses the model
  object. It alone decides whether another attempt is made, from the
  error's type and status (``_transient()``), and it alone logs.

The command line, an agent with a few small tools against any endpoint, is the
companion ``agent_loop_cli.py``: ``python agent_loop_cli.py --help``.
"""

from __future__ import annotations

import codecs
import contextlib
import copy
import datetime
import email.utils
import errno
import functools
import http.client
import itertools
import json
import logging
import math
import os
import random
import selectors
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import (
    AbstractSet,
    Any,
    Callable,
    Dict,
    Final,
    Generator,
    Iterator,
    List,
    Mapping,
    Optional,
    Protocol,
    Set,
    Tuple,
    Type,
    Union,
    cast,
)

import agent_loop as al

__version__ = "1.4.0"

__all__ = [
    # The models
    "OpenAIChatModel",
    "AnthropicMessagesModel",
    # What fails
    "ProviderError",
    "ProviderConnectionError",
    "ProviderProtocolError",
    # The transport seam
    "Transport",
    "Exchange",
    # The wire formats, sans-IO, in the order an exchange uses them
    "openai_request_body",
    "anthropic_request_body",
    "ANTHROPIC_VERSION",
    "check_response_head",
    "ServerSentEvent",
    "ServerSentEvents",
    "MAX_EVENT_SIZE",
    "OpenAIAnswer",
    "AnthropicAnswer",
]

# Retries and accepted cut answers are logged, by stream() only; a child of the loop's
# logger, which has a NullHandler: nothing is printed unless the application configures
# logging.
_logger = logging.getLogger("agent_loop.providers")


# --- Constants ----------------------------------------------------------------------

ANTHROPIC_VERSION: Final = "2023-06-01"
"""The ``anthropic-version`` header: the Messages API version this adapter speaks."""
MAX_EVENT_SIZE: Final = 1 << 20
"""Most characters in one line, or in one event's data, of an event stream (1 MiB): a
server that never ends a line or an event cannot fill the memory."""
_MAX_TOKENS: Final = 4096
"""Anthropic's ``max_tokens`` when none is given (the API requires one)."""
_USER_AGENT: Final = f"agent_loop_providers/{__version__}"
"""Sent with every request, so a provider's logs can tell this client."""
_READ_SIZE: Final = 65_536
"""Most bytes one read returns; a read returns as soon as any byte is there."""
_WATCH_INTERVAL: Final = 0.05
"""Seconds between two looks at the signal: cancellation closes within about this."""
_ERROR_BODY_LIMIT: Final = 65_536
"""Most bytes of an error response read for its message."""
_EXCERPT: Final = 200
"""Most characters of a body or an event quoted in an error message."""
_PACED_FROM: Final = al.MAX_STEP_CHUNKS // 2
"""Chunks of a step yielded delta by delta; after them, text is coalesced (512)."""
_DOUBLING: Final = 32
"""Chunks after which the coalesced text's minimum size doubles."""
_RETRIED_STATUSES: Final = frozenset({408, 409, 429, *range(500, 600)})
"""HTTP statuses that say "try again": timeout, conflict, rate limit, server errors."""
_BACKOFF_START: Final = 0.5
"""Seconds before the first retry when the server does not say; doubled for each next."""
_BACKOFF_CAP: Final = 8.0
"""Most seconds of one backoff."""
_RETRY_AFTER_LIMIT: Final = 60.0
"""Most seconds of a server's Retry-After that is waited for; a longer one fails the run."""
_OPENAI_OWNED: Final = frozenset({"model", "messages", "stream", "tools"})
"""Chat Completions body keys the adapter sets itself: ``options`` may not set them."""
_ANTHROPIC_OWNED: Final = _OPENAI_OWNED | {"system", "max_tokens", "thinking"}
"""Messages body keys the adapter sets itself: ``options`` may not set them."""
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
_SERVER_LOG_HINT: Final = "the server failed on this request: its log says why"
"""What an HTTP 500, or a stream cut after its head, most likely means."""
_SERVER_RAISED: Final = "internal_server_error"
"""The ``error_type`` of an HTTP 500 whose body says the server raised an exception
(llama-cpp-python's server says so): the same request raises again, so it is not retried."""


# --- Public classes: what fails -------------------------------------------------------


class ProviderError(Exception):
    """A provider request failed; the message says what happened and where.

    ``status`` is the HTTP status when the provider answered with one outside 200-299
    (>= 400, or a redirect...), else None.
    ``retry_after`` is the provider's Retry-After in seconds, when it sent one, else None.
    ``error_type`` is the provider's own name for its error, the ``type`` of the error
    object in an error body or an error event (``overloaded_error``,
    ``rate_limit_error``...), when it named one, else None.
    ``usage`` is the ``Usage`` the provider reported for the answer that then failed (it
    may bill a cut, broken or refused answer), else None; ``RunResult.usage`` counts
    only the responses a run appended, so a failed answer's cost is here alone.

    A ``ProviderError`` itself is what the provider said (an HTTP error, an error event,
    a cut answer), a certificate that did not verify, or a cancellation; its subclasses
    say what else failed: ``ProviderConnectionError`` (the network) and
    ``ProviderProtocolError`` (the bytes).
    """

    def __init__(
        self,
        message: str,
        *,
        status: Optional[int] = None,
        retry_after: Optional[float] = None,
        error_type: Optional[str] = None,
        usage: Optional[al.Usage] = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.error_type = error_type
        self.usage = usage


class ProviderConnectionError(ProviderError):
    """The network failed: a connection that could not be made, that broke, or that sent
    nothing for ``timeout`` seconds. What a transport raises when another attempt may
    meet something else."""


class ProviderProtocolError(ProviderError):
    """The bytes are not a complete answer: malformed, or incomplete.

    Malformed: not UTF-8, a line or an event over ``MAX_EVENT_SIZE``, data that is not a
    JSON object, an event out of place, a field of the wrong type, tool-call arguments
    that are not a JSON object, an answer in JSON instead of an event stream.
    ``incomplete`` is True when the bytes ended before the answer did (no end marker, or
    OpenAI's ``[DONE]`` without a ``finish_reason``): what came was right, as far as it
    went. ``status`` and ``retry_after`` are None.
    """

    def __init__(
        self, message: str, *, incomplete: bool = False, usage: Optional[al.Usage] = None
    ) -> None:
        super().__init__(message, usage=usage)
        self.incomplete = incomplete


# --- Public classes: the transport seam -----------------------------------------------


class Exchange(Protocol):
    """One request's response as a transport returns it: its head read, its body to read.

    ``read()`` returns the next bytes of the body as soon as there are any, and b"" at
    its end; it raises ``ProviderConnectionError`` when the connection breaks or sends
    nothing for too long, and ``ProviderError`` once the run's signal is set (a
    cancellation). ``close()`` ends the exchange whatever its state; it may be called
    more than once.
    """

    @property
    def status(self) -> int:
        """The response's HTTP status."""

    @property
    def reason(self) -> str:
        """The status line's reason phrase ("" when there is none)."""

    @property
    def headers(self) -> Mapping[str, str]:
        """The response's headers, by lower-case name."""

    def read(self) -> bytes:
        """The next bytes of the body, as soon as there are any; b"" at its end."""

    def close(self) -> None:
        """Closes the connection; safe at any point, more than once."""


class Transport(Protocol):
    """What a model sends its requests with: ``transport(url, headers, body, signal)``.

    It POSTs ``body`` (bytes) to ``url`` with ``headers``, reads the response's head and
    returns the ``Exchange``; each attempt calls it once. It watches ``signal`` (the
    run's: a ``threading.Event`` or the like). It raises ``ProviderConnectionError`` for
    a connection that cannot be made or that fails before the head, and
    ``ProviderError`` for what another attempt would meet again (a certificate that does
    not verify) or for a cancellation; when it raises, it has closed what it opened.
    It makes no decision on the response's status: the model does.
    """

    def __call__(
        self, url: str, headers: Mapping[str, str], body: bytes, signal: al.Signal, /
    ) -> Exchange:
        """Sends the request and returns the exchange, its head read."""


_Block = Union[al.TextBlock, al.ThinkingBlock, al.ToolCall]
"""A block of a response's content."""

_DeltaKind = Type[Union[al.TextDelta, al.ThinkingDelta]]
"""A chunk class that streams text: TextDelta, or ThinkingDelta."""

_Options = Union[Mapping[str, Any], Callable[[al.ModelRequest], Optional[Mapping[str, Any]]], None]
"""What ``options`` may be: one mapping for every request, or a function of the request."""


# --- Public classes: the models, and the socket loop they share ---------------------


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
        options: _Options,
        retries: int,
        ssl_context: Optional[ssl.SSLContext],
        accept_truncated: bool,
        max_concurrency: Optional[int],
        transport: Optional[Transport],
    ) -> None:
        self.model = _checked_model(model)
        self.base_url = _checked_base_url(base_url)
        if api_key is not None and not isinstance(api_key, str):
            raise TypeError(f"api_key must be a str or None, got {type(api_key).__name__}")
        self.api_key = api_key
        self.system = _checked_system(system)
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool):
            raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__}")
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
        self.timeout = float(timeout)
        self.options: Union[Dict[str, Any], Callable[[al.ModelRequest], Any]] = (
            options
            if callable(options)
            else _checked_options(options, self._owned_keys, or_function=True)
        )
        if not isinstance(retries, int) or isinstance(retries, bool):
            raise TypeError(f"retries must be an int, got {type(retries).__name__}")
        if retries < 0:
            raise ValueError(f"retries must be an int >= 0 (0: no retries), got {retries}")
        self.retries = retries
        if ssl_context is not None and not isinstance(ssl_context, ssl.SSLContext):
            raise TypeError(
                f"ssl_context must be an ssl.SSLContext or None, got {type(ssl_context).__name__}"
            )
        self.ssl_context = ssl_context
        self.accept_truncated = _checked_bool(accept_truncated, "accept_truncated")
        if max_concurrency is not None and (
            not isinstance(max_concurrency, int) or isinstance(max_concurrency, bool)
        ):
            raise TypeError(f"max_concurrency must be an int or None, got {max_concurrency!r}")
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(
                f"max_concurrency must be an int >= 1 (None: no limit), got {max_concurrency!r}"
            )
        self.max_concurrency = max_concurrency
        # The model object's slots, shared by every thread and run that streams from it.
        self._slots = None if max_concurrency is None else threading.Semaphore(max_concurrency)
        # Until when (time.monotonic()) a 429's Retry-After pauses every attempt of this
        # model object, across threads and runs; the lock keeps the latest end.
        self._paused_until = 0.0
        self._pause_lock = threading.Lock()
        if transport is not None and not callable(transport):
            raise TypeError(
                "transport must be None or a callable (url, headers, body, signal) -> "
                f"Exchange, got {type(transport).__name__}"
            )
        self.transport = transport

    def stream(
        self, request: al.ModelRequest, signal: al.Signal
    ) -> Generator[al.ModelChunk, None, al.ModelResponse]:
        """Streams the answer to one request; the generator returns the response.

        Raises ProviderError from the generator when the answer is not complete.
        Each attempt holds a slot, waits out the model's pause (an HTTP 429's Retry-After,
        _wait_for_pause()), opens an exchange, checks its head and feeds its bytes to the
        answer, pacing the chunks; a failure before the first chunk is retried when
        _transient() says so. A read's chunks are yielded once the whole read is parsed:
        an error event in the same read as deltas drops them, and when no chunk was
        yielded before, the request is retried.
        """
        url, headers, body = self._post(request)
        retried = 0
        waited_until = 0.0  # the end of this stream's own retry wait (time.monotonic())
        while True:
            # A slot for each attempt: a retry's wait holds none.
            with self._slot(signal, url):
                self._wait_for_pause(signal, url, waited_until)
                answer = self._answer(request, url)
                pacer = _Pacer(request.id)
                try:
                    # Closed whichever way the attempt ends, the consumer's close() included.
                    with contextlib.closing(self._open(url, headers, body, signal)) as exchange:
                        check_response_head(
                            url,
                            exchange.status,
                            exchange.reason,
                            exchange.headers,
                            functools.partial(_error_body, exchange),
                        )
                        while not answer.done:
                            for chunk in answer.feed(exchange.read()):
                                yield from pacer.paced(chunk)
                        yield from pacer.flushed()
                    if answer.truncated is not None:
                        _logger.warning(
                            "%s: the answer was cut by %s; accepted as the model's answer "
                            "(accept_truncated=True)",
                            request.id,
                            answer.truncated,
                        )
                    return answer.response()
                except ProviderError as error:
                    error.usage = answer.reported_usage()  # what the failed answer cost
                    if error.status == 429 and error.retry_after is not None:
                        self._pause(error.retry_after)
                    delay = self._retry_delay(error, retried, pacer.yielded)
                    if delay is None:
                        raise _after_retries(error, retried, self.retries) from None
                    failure = error  # the except clause unbinds its name
            retried += 1
            _logger.warning(
                "%s: attempt %d of %d failed (%s); retrying in %.3g s",
                request.id,
                retried,
                self.retries + 1,
                failure,
                delay,
            )
            waited_until = time.monotonic() + delay
            if signal.wait(delay):
                raise ProviderError(f"the request to {url} was cancelled during a retry's wait")

    def _open(
        self, url: str, headers: Mapping[str, str], body: bytes, signal: al.Signal
    ) -> Exchange:
        """The exchange, its head read: from the transport given, else from _Exchange."""
        if self.transport is not None:
            return self.transport(url, headers, body, signal)
        exchange = _Exchange(url, headers, body, self.timeout, signal, self.ssl_context)
        try:
            exchange.open()
        except BaseException:
            exchange.close()
            raise
        return exchange

    @contextlib.contextmanager
    def _slot(self, signal: al.Signal, url: str) -> Iterator[None]:
        """One of the max_concurrency slots, held while the block runs (no limit: none).

        The wait has no time limit (a slot frees when an answer holding it ends, fails or
        is closed) and looks at the signal every _WATCH_INTERVAL (50 ms): a cancelled
        wait raises within that, and nothing was sent.
        """
        if self._slots is None:
            yield
            return
        while not self._slots.acquire(timeout=_WATCH_INTERVAL):
            if signal.is_set():
                raise ProviderError(
                    f"the request to {url} was cancelled while it waited for a slot "
                    f"(max_concurrency={self.max_concurrency})"
                )
        try:
            yield
        finally:
            self._slots.release()

    def _pause(self, seconds: float) -> None:
        """Pauses every attempt of this model object for seconds from now (a later end
        kept)."""
        until = time.monotonic() + seconds
        with self._pause_lock:
            self._paused_until = max(self._paused_until, until)

    def _wait_for_pause(self, signal: al.Signal, url: str, waited_until: float) -> None:
        """Waits until the model's pause, as it is now, is over; the signal cancels it.

        Nothing to wait for when the pause ends by waited_until (this stream's own retry
        wait covered it). A pause of more than _RETRY_AFTER_LIMIT from now is not waited
        for: the attempt fails without sending, as its own Retry-After would.
        """
        paused_until = self._paused_until
        remaining = paused_until - time.monotonic()
        if paused_until <= waited_until or remaining <= 0:
            return
        if remaining > _RETRY_AFTER_LIMIT:
            raise ProviderError(
                f"the request to {url} was not sent: the server's Retry-After (HTTP 429) "
                f"pauses this model for {remaining:.3g} s more, more than "
                f"{_RETRY_AFTER_LIMIT:g} s",
                status=429,
                retry_after=remaining,
            )
        if signal.wait(remaining):
            raise ProviderError(
                f"the request to {url} was cancelled while it waited for the server's "
                f"Retry-After (HTTP 429)"
            )

    def _retry_delay(self, error: ProviderError, retried: int, yielded: int) -> Optional[float]:
        """Seconds to wait before the next attempt, or None: the error fails the run."""
        if yielded or retried >= self.retries or not _transient(error):
            return None
        if error.retry_after is None:
            return _backoff(retried, random.random())
        if error.retry_after > _RETRY_AFTER_LIMIT:
            return None
        return error.retry_after

    def _options(self, request: al.ModelRequest) -> Dict[str, Any]:
        """This request's options: the mapping, or what the function returns, checked."""
        if isinstance(self.options, dict):
            return self.options
        return _checked_options(self.options(request), self._owned_keys, "what options returns")

    def _key(self) -> Optional[str]:
        """The API key: the argument, else the environment at request time; '' is none."""
        key = self.api_key if self.api_key is not None else os.environ.get(self._key_variable)
        return key or None

    def _answer(self, request: al.ModelRequest, url: str) -> _Answer:
        raise NotImplementedError  # pragma: no cover (both subclasses define it)

    def _post(self, request: al.ModelRequest) -> Tuple[str, Dict[str, str], bytes]:
        raise NotImplementedError  # pragma: no cover (both subclasses define it)


def _transient(error: ProviderError) -> bool:
    """Whether another attempt may meet something else: the one statement, in code, of
    which failures are retried (docs/models.md says it in words)."""
    if isinstance(error, ProviderConnectionError):  # not made, broken, silent
        return True
    if isinstance(error, ProviderProtocolError):  # malformed bytes come back the same
        return error.incomplete
    if error.status is not None:  # a 500 that says the server raised will raise again
        return error.status in _RETRIED_STATUSES and not _raised(error)
    # An error event: Anthropic's overloaded_error is its HTTP 529, sent after the head.
    return error.error_type == "overloaded_error"


def _raised(error: ProviderError) -> bool:
    """Whether the server says it raised an exception on the request: an HTTP 500 whose
    error body's type is internal_server_error."""
    return error.status == 500 and error.error_type == _SERVER_RAISED


def _backoff(retried: int, jitter: float) -> float:
    """The wait before retry number retried + 1: 0.5 s doubled per retry, capped, jittered.

    ``jitter`` is in [0, 1); it shortens the wait by up to a quarter, so that clients
    that failed together do not retry together.
    """
    return min(_BACKOFF_START * 2.0**retried, _BACKOFF_CAP) * (1.0 - 0.25 * jitter)


def _after_retries(error: ProviderError, retried: int, retries: int) -> ProviderError:
    """The error that fails the run: as raised, or saying why no more retries were made."""
    # At exactly the limit, a transient error was retried while retries were left: the
    # comparison's mutant (>=) changes nothing that can be seen.
    retry_after = error.retry_after
    long_wait = retry_after is not None and retry_after > _RETRY_AFTER_LIMIT  # pragma: no mutate
    if _transient(error) and long_wait and retried < retries:
        note = f"not retried: the Retry-After is more than {_RETRY_AFTER_LIMIT:g} s"
    elif _raised(error):
        note = f"not retried: the server says it raised an exception ({_SERVER_RAISED})"
    elif retried:
        note = f"after {retried} retr{'y' if retried == 1 else 'ies'}"
    else:
        return error
    # A copy, of the same type and attributes: a transport may raise one error twice.
    said = copy.copy(error)
    said.args = (f"{error} ({note})",)
    return said


def _error_body(exchange: Exchange) -> bytes:
    """The body of an answer that is not a stream (its first _ERROR_BODY_LIMIT bytes),
    or b"" when it cannot be read."""
    parts: List[bytes] = []
    size = 0
    try:
        while size < _ERROR_BODY_LIMIT:
            data = exchange.read()
            if not data:
                break
            parts.append(data)
            size += len(data)
    except ProviderError:
        return b""
    return b"".join(parts)[:_ERROR_BODY_LIMIT]


class _Pacer:
    """Which chunks to yield, and when, so that long answers fit the loop's limits: the
    one statement of the pacing rule (the module docstring and docs/models.md point here).

    ``yielded`` counts the step's chunks. While it is below _PACED_FROM (512), each chunk
    is yielded as it comes: the first delta at once, and an answer of up to 512 deltas
    delta by delta. After that, text and thinking are buffered (one kind at a time: the
    other kind flushes the buffer first) and yielded once the buffer holds the minimum,
    2 code points doubled every _DOUBLING (32) chunks: 4 once 544 chunks were yielded, 8
    once 576, ... 1,024 once 800, 2,048 once 832. Thinking counts as text does (every
    chunk counts, and it fills the same minimum). A tool call flushes the buffer before
    it; ``flushed()`` at the end of the answer yields what is left.

    What that guarantees: an answer of up to MAX_STEP_TEXT (65,536) code points of text
    takes at most 832 chunks (65,536 in one-character events take exactly 832), and with
    as many of thinking too, at most 864 (as many of each in one-character events,
    thinking first, take exactly 864); each tool call adds at most two chunks (itself and
    the buffer it flushes) and each change between thinking and text one. So an answer
    within the loop's limits fits in MAX_STEP_CHUNKS (1,024) when its calls cost at most
    192 chunks without thinking (96 calls), and when its calls and changes cost at most
    160 with the most thinking (80 calls, say).
    """

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.yielded = 0
        self.buffered: List[str] = []
        self.size = 0
        self.kind: _DeltaKind = al.TextDelta  # the kind of what is buffered

    def paced(self, chunk: al.ModelChunk) -> Tuple[al.ModelChunk, ...]:
        """The chunks to yield now for this one: it, none (buffered), or more."""
        if self.yielded < _PACED_FROM:  # nothing is buffered before _PACED_FROM
            self.yielded += 1
            return (chunk,)
        if type(chunk) is al.ToolCallChunk:
            flushed = self.flushed()
            self.yielded += 1
            return (*flushed, chunk)
        flushed = () if type(chunk) is self.kind else self.flushed()
        if type(chunk) is al.TextDelta:
            self.kind = al.TextDelta
            text = chunk.text
        else:
            self.kind = al.ThinkingDelta
            text = cast(al.ThinkingDelta, chunk).thinking
        self.buffered.append(text)
        self.size += len(text)
        if self.size < 2 << ((self.yielded - _PACED_FROM) // _DOUBLING):
            return flushed
        return (*flushed, *self.flushed())

    def flushed(self) -> Tuple[al.ModelChunk, ...]:
        """The buffer as one chunk, or no chunk when it is empty."""
        if not self.buffered:
            return ()
        text = "".join(self.buffered)
        self.buffered = []
        self.size = 0
        self.yielded += 1
        return (self.kind(self.request_id, text),)


class OpenAIChatModel(_StreamingModel):
    """A model behind an OpenAI-compatible Chat Completions endpoint, streamed.

    Posts ``openai_request_body()`` to ``{base_url}/chat/completions`` and reads the
    answer with ``OpenAIAnswer``. ``api_key=None`` reads ``OPENAI_API_KEY`` at request
    time and sends no key when there is none. ``system`` is the system prompt;
    ``options`` (temperature, max_tokens, tool_choice...) is merged into the body: a
    mapping, or a function of the request that returns one (``{"stream_options": None}``
    sends no stream options, for a server that refuses them).
    ``timeout`` bounds each wait (name lookup, connection, TLS handshake, every byte),
    in seconds. ``retries`` more attempts are made for a transient failure before the
    first chunk; ``ssl_context`` verifies HTTPS (None: the system's CAs);
    ``accept_truncated=True`` accepts an answer cut by the token limit that ends in text.
    ``max_concurrency=N`` lets at most N answers of this model object stream at once,
    across threads and runs (None: no limit): build the model once and share it. A run
    that stops being read holds its slot until it is closed or collected. An HTTP 429
    with a Retry-After pauses every attempt of this object until then.
    ``require_finish_reason=False`` accepts
    an answer that ends with ``[DONE]`` but no ``finish_reason``, for a server that
    never sends one; by default such an answer is incomplete (a server that interrupts
    a stream ends it so). ``transport`` sends the requests (a ``Transport``); None is
    the standard library's HTTP over a socket made and watched here, which ``timeout``
    and ``ssl_context`` configure (a transport given brings its own).

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
        options: _Options = None,
        retries: int = 2,
        ssl_context: Optional[ssl.SSLContext] = None,
        accept_truncated: bool = False,
        max_concurrency: Optional[int] = None,
        require_finish_reason: bool = True,
        transport: Optional[Transport] = None,
    ) -> None:
        super().__init__(
            model,
            base_url,
            api_key,
            system,
            timeout,
            options,
            retries,
            ssl_context,
            accept_truncated,
            max_concurrency,
            transport,
        )
        self.require_finish_reason = _checked_bool(require_finish_reason, "require_finish_reason")

    def _answer(self, request: al.ModelRequest, url: str) -> _Answer:
        return OpenAIAnswer(
            request,
            accept_truncated=self.accept_truncated,
            require_finish_reason=self.require_finish_reason,
            url=url,
        )

    def _post(self, request: al.ModelRequest) -> Tuple[str, Dict[str, str], bytes]:
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "User-Agent": _USER_AGENT,
        }
        key = self._key()
        if key is not None:
            headers["Authorization"] = "Bearer " + key
        body = openai_request_body(
            request, self.model, system=self.system, options=self._options(request)
        )
        return self.base_url + "/chat/completions", headers, body


class AnthropicMessagesModel(_StreamingModel):
    """A model behind Anthropic's Messages API, streamed.

    Posts ``anthropic_request_body()`` to ``{base_url}/v1/messages`` with the
    ``anthropic-version`` header and reads the answer with ``AnthropicAnswer``.
    ``api_key=None`` reads ``ANTHROPIC_API_KEY`` at request time and sends no key when
    there is none. ``system`` is the system prompt, ``max_tokens`` the answer's token
    budget (an answer that reaches it fails the run, unless ``accept_truncated=True``
    and it ends in text); ``thinking`` the extended-thinking setting: None sends none,
    a mapping is the API's own, sent as given (``{"type": "enabled", "budget_tokens":
    2048}``: the API wants a budget of at least 1,024, below ``max_tokens``),
    ``"adaptive"`` is ``{"type": "adaptive"}``. ``options`` (temperature,
    tool_choice...) is merged into the body: a mapping, or a function of the request
    that returns one. ``timeout``, ``retries``, ``ssl_context``, ``max_concurrency``
    and ``transport`` as for ``OpenAIChatModel``.

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
        max_tokens: int = _MAX_TOKENS,
        thinking: Union[Mapping[str, Any], str, None] = None,
        timeout: float = 60.0,
        options: _Options = None,
        retries: int = 2,
        ssl_context: Optional[ssl.SSLContext] = None,
        accept_truncated: bool = False,
        max_concurrency: Optional[int] = None,
        transport: Optional[Transport] = None,
    ) -> None:
        super().__init__(
            model,
            base_url,
            api_key,
            system,
            timeout,
            options,
            retries,
            ssl_context,
            accept_truncated,
            max_concurrency,
            transport,
        )
        self.max_tokens = _checked_max_tokens(max_tokens)
        self.thinking = _checked_thinking(thinking)

    def _answer(self, request: al.ModelRequest, url: str) -> _Answer:
        return AnthropicAnswer(request, accept_truncated=self.accept_truncated, url=url)

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
        body = anthropic_request_body(
            request,
            self.model,
            system=self.system,
            max_tokens=self.max_tokens,
            thinking=self.thinking,
            options=self._options(request),
        )
        return self.base_url + "/v1/messages", headers, body


# Argument checks: each parameter is checked by one function, wherever it enters.


def _checked_model(model: object) -> str:
    """model: the provider's model name, a non-empty str."""
    if not isinstance(model, str):
        raise TypeError(f"model must be a str, got {type(model).__name__}")
    if not model:
        raise ValueError("model must name the provider's model, got ''")
    return model


def _checked_system(system: object) -> Optional[str]:
    """system: the system prompt, a str, or None."""
    if system is not None and not isinstance(system, str):
        raise TypeError(f"system must be a str or None, got {type(system).__name__}")
    return system


def _checked_request(request: object) -> al.ModelRequest:
    if not isinstance(request, al.ModelRequest):
        raise TypeError(f"request must be a ModelRequest, got {type(request).__name__}")
    return request


def _checked_bool(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def _checked_max_tokens(max_tokens: object) -> int:
    """max_tokens: Anthropic's token budget for the answer, an int >= 1."""
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        raise TypeError(f"max_tokens must be an int, got {type(max_tokens).__name__}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens}")
    return max_tokens


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


def _checked_thinking(thinking: object) -> Optional[Dict[str, Any]]:
    """thinking: None, "adaptive", or the API's mapping (plain JSON with a "type")."""
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
    setting = _checked_options(thinking, frozenset(), "thinking")
    if not isinstance(setting.get("type"), str):
        raise ValueError(
            f"thinking must say its 'type' (e.g. 'enabled', with 'budget_tokens'), got {setting!r}"
        )
    return setting


def _checked_options(
    options: object, owned_keys: AbstractSet[str], what: str = "options", or_function: bool = False
) -> Dict[str, Any]:
    """options: a JSON object whose keys the adapter does not own; kept as a plain copy."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        function = ", or a function of the request" if or_function else ""
        raise TypeError(
            f"{what} must be a mapping or None{function}; got {type(options).__name__}"
        )
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


# --- The default transport: the one place with a socket ------------------------------


_default_contexts: List[ssl.SSLContext] = []
"""ssl.create_default_context(), made at the first HTTPS request and shared (thread-safe)."""


def _default_context() -> ssl.SSLContext:
    if not _default_contexts:
        _default_contexts.append(ssl.create_default_context())
    return _default_contexts[0]


class _Exchange:
    """The default transport's exchange: one POST and its streamed response, with the
    timeout and the cancellation watch.

    ``open()`` connects (watched), sends, and reads the head into ``status``, ``reason``
    and ``headers``. ``read()`` returns the next bytes as soon as there are any, b"" at
    the end. ``close()`` closes the connection and ends the watcher; it is safe to call
    at any point, more than once. What fails on the network raises
    ProviderConnectionError; a certificate that does not verify, and a cancellation,
    ProviderError.
    """

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        timeout: float,
        signal: al.Signal,
        ssl_context: Optional[ssl.SSLContext],
    ) -> None:
        self.url = url
        self.request_headers = headers
        self.request_body = body
        self.timeout = timeout
        self.signal = signal
        parts = urllib.parse.urlsplit(url)
        self.host = parts.hostname or ""
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        # The socket is made here (watched) and handed to http.client, which only speaks
        # HTTP on it: HTTPSConnection for https, so that the Host header has no :443, and
        # given the context, so that it makes no default context of its own.
        self.context: Optional[ssl.SSLContext] = None
        self.connection: http.client.HTTPConnection
        if self.tls:
            self.context = ssl_context if ssl_context is not None else _default_context()
            self.connection = http.client.HTTPSConnection(
                self.host, self.port, timeout=timeout, context=self.context
            )
        else:
            self.connection = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        self.path = parts.path
        self.response: Optional[http.client.HTTPResponse] = None
        self.status = 0
        self.reason = ""
        self.headers: Dict[str, str] = {}
        self.finished = threading.Event()

    def open(self) -> None:
        """Connects, sends the request and reads the response's head."""
        sock = self._connected()
        self.connection.sock = sock
        threading.Thread(
            target=self._watch, args=(sock,), name="agent_loop_providers watch", daemon=True
        ).start()
        try:
            self.connection.request(
                "POST", self.path, self.request_body, dict(self.request_headers)
            )
            response = self.connection.getresponse()
        except socket.timeout:
            raise self._failure(f"{self.url} sent nothing for {self.timeout:g} s") from None
        except (OSError, http.client.HTTPException) as error:
            raise self._failure(f"the request to {self.url} failed: {_described(error)}") from None
        self.response = response
        self.status = response.status
        self.reason = response.reason
        self.headers = {name.lower(): value for name, value in response.getheaders()}

    def read(self) -> bytes:
        """The next bytes of the response body (b"" at its end)."""
        # open() succeeded; a cast does nothing at run time (and its mutants neither).
        response = cast(http.client.HTTPResponse, self.response)  # pragma: no mutate
        try:
            data = response.read1(_READ_SIZE)
        except socket.timeout:
            raise self._failure(f"{self.url} sent nothing for {self.timeout:g} s") from None
        except (OSError, http.client.HTTPException) as error:
            broke = (
                f"the connection to {self.url} broke: {_described(error)} (if the server "
                f"closed it, {_SERVER_LOG_HINT})"
            )
            raise self._failure(broke) from None
        if not data and self.signal.is_set():  # the end the watcher's shutdown made
            raise self._cancelled()
        return data

    def close(self) -> None:
        """Closes the connection; the watcher sees it and ends within _WATCH_INTERVAL."""
        self.finished.set()
        self.connection.close()
        if self.response is not None:  # a response that will close holds the socket
            self.response.close()

    def _connected(self) -> socket.socket:
        """A socket connected to the host (TLS done for https), every wait watched."""
        addresses = self._addresses()
        failure: OSError = OSError(f"no address for {self.host}")
        for family, kind, protocol, _, address in addresses:
            # No mutants: the protocol is TCP's default, and a connection made at once (0)
            # is a loopback race no test can choose.
            sock = socket.socket(family, kind, protocol)  # pragma: no mutate
            try:
                sock.setblocking(False)
                code = sock.connect_ex(address)
                if code not in (errno.EINPROGRESS, errno.EWOULDBLOCK, 0):  # pragma: no mutate
                    raise OSError(code, os.strerror(code))
                deadline = time.monotonic() + self.timeout
                self._wait_for(sock, selectors.EVENT_WRITE, "connecting", deadline)
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:
                    raise OSError(code, os.strerror(code))
            except ProviderError:
                sock.close()
                raise
            except OSError as error:
                sock.close()
                failure = error
                continue
            try:
                if self.tls:
                    sock = self._handshake(sock)
                sock.settimeout(self.timeout)
            except BaseException:
                sock.close()  # a no-op once the TLS socket holds the connection
                raise
            return sock
        raise self._connect_failure(_described(failure))

    def _addresses(self) -> List[Any]:
        """The host's addresses; a name is looked up in a thread, watched."""
        try:  # an IP address needs no lookup, and no thread
            return socket.getaddrinfo(
                self.host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST
            )
        except socket.gaierror:
            pass
        found: List[Any] = []

        def look_up() -> None:
            try:
                found.append(socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM))
            except OSError as error:
                found.append(error)

        lookup = threading.Thread(target=look_up, name="agent_loop_providers lookup", daemon=True)
        lookup.start()
        deadline = time.monotonic() + self.timeout
        while True:
            # getaddrinfo cannot be interrupted: stop waiting for it, and let it end alone.
            lookup.join(_WATCH_INTERVAL)
            if self.signal.is_set():
                raise self._cancelled()
            if not lookup.is_alive():
                break
            # No mutant: > and >= meet the deadline a tick apart, the same wait.
            if time.monotonic() >= deadline:  # pragma: no mutate
                raise self._connect_failure(
                    f"the name lookup of {self.host} took more than {self.timeout:g} s"
                )
        if isinstance(found[0], OSError):
            raise self._connect_failure(f"the name lookup failed: {_described(found[0])}")
        return cast(List[Any], found[0])  # pragma: no mutate

    def _handshake(self, sock: socket.socket) -> ssl.SSLSocket:
        """The TLS handshake, without blocking; the certificate and host name verified."""
        context = cast(ssl.SSLContext, self.context)  # pragma: no mutate (set for https)
        tls = context.wrap_socket(
            sock,
            server_hostname=self.host,
            do_handshake_on_connect=False,  # pragma: no mutate (None is as false)
        )
        deadline = time.monotonic() + self.timeout  # for the whole handshake
        try:
            while True:
                try:
                    tls.do_handshake()
                    return tls
                except ssl.SSLWantReadError:
                    self._wait_for(tls, selectors.EVENT_READ, "the TLS handshake", deadline)
                except ssl.SSLWantWriteError:  # pragma: no cover (a full send buffer)
                    self._wait_for(  # pragma: no mutate block (never run by a test: above)
                        tls, selectors.EVENT_WRITE, "the TLS handshake", deadline
                    )
        except ssl.SSLCertVerificationError as error:
            tls.close()
            raise ProviderError(  # not a connection failure: the same certificate comes back
                f"cannot connect to {self.url}: the server's TLS certificate did not verify: "
                f"{error.verify_message}"
            ) from None
        except OSError as error:
            tls.close()
            raise self._connect_failure(f"the TLS handshake failed: {_described(error)}") from None
        except BaseException:
            tls.close()
            raise

    def _wait_for(self, sock: socket.socket, event: int, what: str, deadline: float) -> None:
        """Waits until sock is ready for event, in slices, looking at the signal.

        Raises socket.timeout once the deadline (time.monotonic()) has passed.
        """
        # No mutants on the slice and the deadline: a slice up to 50 ms too long, or a
        # deadline met one tick later, is the same wait.
        with selectors.DefaultSelector() as selector:
            selector.register(sock, event)
            while True:
                left = max(deadline - time.monotonic(), 0)  # pragma: no mutate
                ready = selector.select(min(_WATCH_INTERVAL, left))
                if self.signal.is_set():
                    raise self._cancelled()
                if ready:
                    return
                if time.monotonic() >= deadline:  # pragma: no mutate
                    raise socket.timeout(f"{what} took more than {self.timeout:g} s")

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

    def _connect_failure(self, cause: str) -> ProviderConnectionError:
        """The connection could not be made."""
        return ProviderConnectionError(f"cannot connect to {self.url}: {cause}")

    def _failure(self, message: str) -> ProviderError:
        """A network failure, or the cancellation that caused it."""
        if self.signal.is_set():
            return self._cancelled()
        return ProviderConnectionError(message)

    def _cancelled(self) -> ProviderError:
        return ProviderError(f"the request to {self.url} was cancelled")


def _described(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


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
        text, error_type = _error_text(_decoded(body()))
        message = f"{url} answered HTTP {status} {reason}: {text}"
        if status == 500:
            message += f" ({_SERVER_LOG_HINT})"
        if retry_after is not None:
            message += f" (Retry-After: {retry_after:g} s)"
        raise ProviderError(message, status=status, retry_after=retry_after, error_type=error_type)
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


def _error_text(body: str) -> Tuple[str, Optional[str]]:
    """The provider's own error text (its ``error.message``, with the type; else the body)
    and its error type, when it named one."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, or nested too deeply to read
        return _excerpt(body) or "(no body)", None
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, str):
        return error, None
    kind = error.get("type") if isinstance(error, dict) else None
    kind = kind if isinstance(kind, str) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return (error["message"] if kind is None else f"{kind}: {error['message']}"), kind
    return _excerpt(body), kind


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


class _Ids:
    """The ids of docs/models.md's rule: unique in the transcript, and deterministic."""

    def __init__(self, request: al.ModelRequest) -> None:
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
        """The id for the response's next tool call, the provider's when it is free."""
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
        self._accept_truncated = _checked_bool(accept_truncated, "accept_truncated")
        if not isinstance(url, str):
            raise TypeError(f"url must be a str, got {type(url).__name__}")
        self._source = f" from {url}" if url else ""  # for the incomplete-answer error
        self._ids = _Ids(request)
        self._events = ServerSentEvents()
        self._chunks: List[al.ModelChunk] = []  # every chunk fed so far, in order
        self._counts: Dict[str, int] = {}  # the Usage fields the provider reported
        self.done = False
        self.truncated: Optional[str] = None

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
        return ProviderError(f"the answer was cut: {field} {reason!r} ({meaning})")

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


def _stream_error(data: str) -> ProviderError:
    """An error event inside the stream: the provider's own text, and its error type."""
    text, error_type = _error_text(data)
    return ProviderError(f"the stream reported an error: {text}", error_type=error_type)


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
    model = _checked_model(model)
    system = _checked_system(system)
    options = _checked_options(options, _OPENAI_OWNED)
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
        self._require_finish_reason = _checked_bool(require_finish_reason, "require_finish_reason")
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
                self._failure = ProviderError(
                    f"the answer was cut: finish_reason {finish!r} "
                    f"({_OPENAI_CUT[finish]}) while a tool call was streamed"
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
                f" (the server stopped sending: {_SERVER_LOG_HINT}; or {_CONCURRENCY_HINT})",
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
    max_tokens: int = _MAX_TOKENS,
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
    model = _checked_model(model)
    system = _checked_system(system)
    max_tokens = _checked_max_tokens(max_tokens)
    setting = _checked_thinking(thinking)
    options = _checked_options(options, _ANTHROPIC_OWNED)
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


if __name__ == "__main__":
    # The command line moved in 1.3.0: say where, to anyone with the old habit.
    raise SystemExit("agent_loop_providers.py has no command line: run python agent_loop_cli.py")
