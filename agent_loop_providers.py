# agent_loop_providers.py 1.5.0: streaming provider adapters for agent_loop.py.
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

- The wire formats, sans-IO, are the companion ``agent_loop_wire.py`` (bytes in, events
  out, no socket, no policy): the request bodies, ``check_response_head()``,
  ``ServerSentEvents``, ``OpenAIAnswer`` and ``AnthropicAnswer``, and the errors they
  raise, ``ProviderError`` and ``ProviderProtocolError``. This module imports them and
  re-exports the names it always exported, so ``agent_loop_providers.OpenAIAnswer`` is
  ``agent_loop_wire.OpenAIAnswer``.
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

import contextlib
import copy
import errno
import functools
import http.client
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
    Tuple,
    Type,
    Union,
    cast,
)

import agent_loop as al
import agent_loop_wire as wire
from agent_loop_wire import (
    ANTHROPIC_VERSION,
    MAX_EVENT_SIZE,
    AnthropicAnswer,
    OpenAIAnswer,
    ProviderError,
    ProviderProtocolError,
    ServerSentEvent,
    ServerSentEvents,
    anthropic_request_body,
    check_response_head,
    openai_request_body,
)

__version__ = "1.5.0"

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
    # The wire formats, sans-IO, in the order an exchange uses them (agent_loop_wire's)
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

_USER_AGENT: Final = f"agent_loop_providers/{__version__}"
"""Sent with every request, so a provider's logs can tell this client."""
_READ_SIZE: Final = 65_536
"""Most bytes one read returns; a read returns as soon as any byte is there."""
_ERROR_BODY_LIMIT: Final = 65_536
"""Most bytes of an error response read for its message."""
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
_SERVER_RAISED: Final = "internal_server_error"
"""The ``error_type`` of an HTTP 500 whose body says the server raised an exception
(llama-cpp-python's server says so): the same request raises again, so it is not retried."""


# --- Public classes: what fails (ProviderError and ProviderProtocolError: agent_loop_wire)


class ProviderConnectionError(ProviderError):
    """The network failed: a connection that could not be made, that broke, or that sent
    nothing for ``timeout`` seconds. What a transport raises when another attempt may
    meet something else."""


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


_DeltaKind = Type[Union[al.TextDelta, al.ThinkingDelta]]
"""A chunk class that streams text: TextDelta, or ThinkingDelta."""

_Reader = Union[OpenAIAnswer, AnthropicAnswer]
"""What reads an answer's bytes: agent_loop_wire's reader for the model's format."""

_Options = Union[Mapping[str, Any], Callable[[al.ModelRequest], Optional[Mapping[str, Any]]], None]
"""What ``options`` may be: one mapping for every request, or a function of the request."""


# --- Public classes: the models, and the socket loop they share ---------------------


class _StreamingModel:
    """What both adapters share: arguments, and the one stream() around the exchange."""

    _provider_name: str = ""
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
        self.model = wire.check_model_name(model)
        self.base_url = _checked_base_url(base_url)
        if api_key is not None and not isinstance(api_key, str):
            raise TypeError(f"api_key must be a str or None, got {type(api_key).__name__}")
        self.api_key = api_key
        self.system = wire.check_system_prompt(system)
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool):
            raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__}")
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
        self.timeout = float(timeout)
        if not (options is None or isinstance(options, Mapping) or callable(options)):
            raise TypeError(
                "options must be a mapping or None, or a function of the request; "
                f"got {type(options).__name__}"
            )
        self.options: Union[Dict[str, Any], Callable[[al.ModelRequest], Any]] = (
            options if callable(options) else wire.check_options(options, self._owned_keys)
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
        self.accept_truncated = wire.check_flag(accept_truncated, "accept_truncated")
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

    @property
    def provider_name(self) -> str:
        """The provider's format, as the GenAI conventions name it: ``"openai"`` (every
        Chat Completions server) or ``"anthropic"``; read-only."""
        return self._provider_name

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
        is closed) and looks at the signal every al.WATCH_SECONDS (50 ms): a cancelled
        wait raises within that, and nothing was sent.
        """
        if self._slots is None:
            yield
            return
        while not self._slots.acquire(timeout=al.WATCH_SECONDS):
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
        return wire.check_options(self.options(request), self._owned_keys, "what options returns")

    def _key(self) -> Optional[str]:
        """The API key: the argument, else the environment at request time; '' is none."""
        key = self.api_key if self.api_key is not None else os.environ.get(self._key_variable)
        return key or None

    def _answer(self, request: al.ModelRequest, url: str) -> _Reader:
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

    The arguments, checked, are its attributes of the same names (``model``: the name
    sent; ``base_url``: without its trailing /; ``timeout`` as a float...), which the
    spans read; ``provider_name`` is ``"openai"``.

    Raises TypeError or ValueError, naming the parameter, for an argument it cannot use.
    """

    _provider_name = "openai"
    _key_variable = "OPENAI_API_KEY"
    _owned_keys = wire.OPENAI_OWNED_KEYS

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
        self.require_finish_reason = wire.check_flag(
            require_finish_reason, "require_finish_reason"
        )

    def _answer(self, request: al.ModelRequest, url: str) -> _Reader:
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
    and ``transport`` as for ``OpenAIChatModel``; so are its attributes, and
    ``provider_name`` is ``"anthropic"``.

    Raises TypeError or ValueError, naming the parameter, for an argument it cannot use.
    """

    _provider_name = "anthropic"
    _key_variable = "ANTHROPIC_API_KEY"
    _owned_keys = wire.ANTHROPIC_OWNED_KEYS

    def __init__(
        self,
        model: str,
        *,
        base_url: str = "https://api.anthropic.com",
        api_key: Optional[str] = None,
        system: Optional[str] = None,
        max_tokens: int = wire.ANTHROPIC_MAX_TOKENS,
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
        self.max_tokens = wire.check_max_tokens(max_tokens)
        self.thinking = wire.check_thinking_setting(thinking)

    def _answer(self, request: al.ModelRequest, url: str) -> _Reader:
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
                f"closed it, {wire.SERVER_LOG_HINT})"
            )
            raise self._failure(broke) from None
        if not data and self.signal.is_set():  # the end the watcher's shutdown made
            raise self._cancelled()
        return data

    def close(self) -> None:
        """Closes the connection; the watcher sees it and ends within al.WATCH_SECONDS."""
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
            lookup.join(al.WATCH_SECONDS)
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
                ready = selector.select(min(al.WATCH_SECONDS, left))
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
            if self.signal.wait(al.WATCH_SECONDS):
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


if __name__ == "__main__":
    # The command line moved in 1.3.0: say where, to anyone with the old habit.
    raise SystemExit("agent_loop_providers.py has no command line: run python agent_loop_cli.py")
