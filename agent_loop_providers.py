# agent_loop_providers.py 1.1.0: streaming provider adapters for agent_loop.py.
# One file, standard library only; copy it next to agent_loop.py. Home: the agent_loop repository.
"""Real models for the Agent Loop: OpenAI-compatible and Anthropic streaming APIs.

``OpenAIChatModel`` posts to ``{base_url}/chat/completions`` (OpenAI, and every server
that speaks its Chat Completions format: Ollama, llama.cpp, vLLM, LM Studio...) and
``AnthropicMessagesModel`` posts to ``{base_url}/v1/messages``. Both implement the
loop's ``Model`` protocol: ``stream(request, signal)`` returns a generator that yields
``TextDelta`` and ``ToolCallChunk`` chunks as they arrive and returns the terminal
``ModelResponse``. Any failure raises ``ProviderError`` from that generator, which the
loop turns into a ``failed`` run with ``MODEL_STREAM_ERROR``; ``result.error.exception``
is that ``ProviderError`` (with ``status`` and ``retry_after``) in the run's own
result. It is None for the loop's protocol errors (``MODEL_PROTOCOL_ERROR``) and in a
result read back with ``event_from_dict``: an exception is not part of the JSON.

Rules:

- The transcript is converted exactly, both ways. A user message is a user turn; an
  assistant message is one assistant turn with its text (blocks concatenated) and its
  tool calls (arguments as JSON); OpenAI: a turn with only tool calls has ``"content":
  ""`` (the spec allows null, but llama.cpp's and llama-cpp-python's servers refuse
  null and a missing content; every server takes ""). A tool result is linked to its
  call by the call's id as it is in the transcript. OpenAI: one ``tool`` message per
  result (the format has no error flag: the content says what went wrong). Anthropic:
  consecutive results are merged into one user turn of ``tool_result`` blocks, each
  with its ``is_error``; an assistant turn with no text and no call is not sent (the
  API refuses it), nor is an empty text block. ``request.tools`` become the provider's
  tool definitions; ``system`` is the system prompt (the transcript has no system
  role).
- ``options`` is merged into the body last: a mapping, the same for every request, or a
  function of the ``ModelRequest`` that returns that request's mapping (or None), e.g.
  to force a tool on the first request only. Either way it must be plain JSON and may
  not set what the adapter owns (model, messages, stream, tools; for Anthropic also
  system and max_tokens, which are arguments): a mapping is checked when the model is
  built, a function's result for each request (a bad one raises TypeError or
  ValueError from the stream, and the run fails ``MODEL_STREAM_ERROR``).
- Streaming: text is yielded as ``TextDelta`` chunks, each tool call as one
  ``ToolCallChunk`` once its arguments are complete: OpenAI, when the next call, text
  or the choice's finish arrives (the format has no end-of-call marker); Anthropic, at
  its ``content_block_stop``. The response holds the same blocks in the same order
  (adjacent text joined); its stop reason is ``toolCall`` when it holds calls, else
  ``stop``, whatever the provider said (some servers say ``stop`` for tool calls).
  Empty arguments (``""``, a tool without parameters) mean ``{}``.
- Long answers fit the loop's limits (``MAX_STEP_CHUNKS`` 1,024 chunks and
  ``MAX_STEP_TEXT`` 65,536 code points per step), by coalescing text once half the
  chunk budget is spent: while fewer than 512 chunks of the step were yielded, each
  text delta is yielded as it arrives (so the first delta at once, and an answer of up
  to 512 deltas delta by delta); after that, text is buffered and yielded once the
  buffer holds at least 2 code points, a minimum that doubles every 32 chunks (4 once
  544 chunks were yielded, 8 once 576, ... 1,024 once 800); buffered text is always
  yielded before a tool call and at the end of the answer. Guarantee: an answer of
  text alone takes at most 832 chunks (65,536 code points in one-character events take
  exactly 832), and an answer of up to 65,536 code points with up to 96 tool calls, in
  any order, takes at most 1,024 chunks (each call costs at most two: itself and the
  text it flushes). An answer with more text than ``MAX_STEP_TEXT``,
  or too many tool calls, still fails the run with ``MODEL_PROTOCOL_ERROR``. The
  provider's token limit (``options={"max_tokens": ...}``, Anthropic's ``max_tokens``)
  does not shorten a failing answer into a passing one: an answer that reaches it is
  cut, and fails (see ``accept_truncated``).
- Ids are unique in the transcript, whatever the provider sends (some servers send
  ``call_0`` in every response), and deterministic, so a recorded run replays exactly.
  The response to ``request-NNN`` is ``response-NNN`` (``response-`` + the request id
  for another request id). A tool call keeps the provider's id when that id is a
  non-empty string that the transcript and this response do not use yet; otherwise it
  is ``<response id>-call-<n>``, where n is the call's position among the response's
  calls (1 for the first, 2 for the second...). Either id takes the first free suffix
  ``-2``, ``-3``... when it is taken. The transcript's ids are what later requests
  send back to the provider.
- Completeness is decided by the wire format, not the socket: an answer is complete
  when its end marker arrives, ``data: [DONE]`` (OpenAI) or ``message_stop``
  (Anthropic), whatever the finish reason said; Ollama ends complete answers with
  ``finish_reason: null`` and ``[DONE]``, and that is a complete answer. The end of
  the input before the marker is an incomplete answer, and ``response()`` refuses an
  answer without its marker. A ``ProviderError`` names what happened for each of: an
  HTTP status >= 400 (the status, the provider's own error text, Retry-After), an
  answer in JSON instead of an event stream, a connection that cannot be made (the
  address and the cause: the name lookup, the TCP connection, a TLS certificate that
  did not verify...), no byte for ``timeout`` seconds, a stream that ends before its
  marker, an error event in the stream (OpenAI-compatible servers send ``data:
  {"error": ...}``; Anthropic sends ``event: error``), a malformed event, tool-call
  arguments that are not a JSON object, and an answer the provider says was cut:
  OpenAI ``finish_reason`` ``length`` or ``content_filter``; Anthropic
  ``stop_reason`` ``max_tokens``, ``refusal``, ``pause_turn`` or
  ``model_context_window_exceeded``.
- ``accept_truncated=True`` accepts an answer cut by the token limit (OpenAI
  ``length``, Anthropic ``max_tokens``) when its last block is text: the text so far is
  the model's answer (stop reason ``stop``), and a warning is logged. An answer cut
  while a tool call was being written, or with no text, a refusal, a content filter,
  or any other cut still fails.
- Retries: ``retries`` (default 2, as the official SDKs; 0 turns them off) more
  attempts are made when the request fails before the first chunk of the answer was
  yielded, and only then (once the loop reported a chunk, a failure fails the run).
  Retried: a connection that cannot be made, or that breaks or times out before the
  response's head arrives; HTTP 408, 409, 429 and 500-599 (Anthropic's 529 included);
  and an Anthropic ``overloaded_error`` event that arrives before any chunk. The wait
  is what the server says (``retry-after-ms``, else ``retry-after`` in seconds or as
  an HTTP date), else an exponential backoff: 0.5 s, doubling, at most 8 s, each
  shortened by a random jitter of up to a quarter. A Retry-After of more than 60 s is
  not waited for: the run fails with that error at once (``retry_after`` kept). The
  wait is ``signal.wait(delay)``, so a signal set during it ends the run
  ``cancelled`` at once. Each retry is logged (warning) on the ``agent_loop.providers``
  logger, with the attempt, the cause and the delay; the module adds no handler. The
  error of the last attempt fails the run, its message saying how many retries were
  made.
- Dropped, as not part of an answer: comment lines and ``id:``/``retry:`` fields of the
  event stream, and an event still open at the end of the input; OpenAI choices other
  than index 0, chunks whose choices list is empty (usage), and delta fields other than
  ``content``, ``refusal`` (kept as text: it is the answer) and ``tool_calls`` (e.g.
  ``reasoning_content``); Anthropic ``message_start``, ``ping``, unknown event types,
  the usage and stop sequence of ``message_delta``, and content blocks other than
  ``text`` and ``tool_use`` (``thinking``, ``redacted_thinking``, server tools...)
  with their deltas. Dropped means read, checked as JSON, and not kept anywhere: no
  chunk, no block, no log. Events after the end marker are not read: the connection
  is closed.
- Cancellation is watched from the first byte to the last: the name lookup runs in a
  daemon thread that the stream waits for in slices of 50 ms (``getaddrinfo`` cannot
  be interrupted: a lookup that hangs is left to end on its own), the TCP connection
  and the TLS handshake are made without blocking, in slices of 50 ms, and once the
  request is sent a watcher thread waits on the signal (in slices of 50 ms, so that it
  ends with the stream) and shuts the socket down when it is set, so the blocked read
  returns at once. A signal set at any point ends the step ``cancelled`` within about
  50 ms. The connection is closed whichever way the step ends, the consumer's
  ``close()`` included, and the watcher ends with it.
- ``timeout`` bounds each wait: the name lookup, each connection attempt, the TLS
  handshake, and every wait for a byte of the response.
- HTTPS: ``ssl_context=None`` uses ``ssl.create_default_context()``, which verifies
  the server's certificate against the system's CAs and its host name; pass an
  ``ssl.SSLContext`` for a private CA.
- ``api_key=None`` reads ``OPENAI_API_KEY`` or ``ANTHROPIC_API_KEY`` at request time; with
  no key, none is sent (local servers need none).

The wire formats are sans-IO: ``_ServerEvents`` turns received bytes into server-sent
events (``feed(b"")`` is the end of the input), ``_OpenAIAnswer`` and
``_AnthropicAnswer`` turn those into blocks and decide completeness, ``_head_error()``
reads the status and headers that decide an error, ``_retry_after()`` reads the
Retry-After headers, and ``_openai_body()`` / ``_anthropic_body()`` turn a request into
a body, all testable from values alone. ``_Pacer`` is the coalescing policy.
``_Exchange`` is the one place with a socket, the timeout and the cancellation watch.

Run ``python agent_loop_providers.py --help`` for the command line: an agent with a
few small tools (add, multiply, weather), against any endpoint, printing the answer as
it streams.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import datetime
import email.utils
import errno
import http.client
import json
import logging
import math
import os
import random
import selectors
import signal as os_signal
import socket
import ssl
import sys
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
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    TextIO,
    Tuple,
    Union,
    cast,
)

import agent_loop as al

__version__ = "1.1.0"

__all__ = ["OpenAIChatModel", "AnthropicMessagesModel", "ProviderError"]

# Retries and accepted cut answers are logged; a child of the loop's logger, which has a
# NullHandler: nothing is printed unless the application configures logging.
_logger = logging.getLogger("agent_loop.providers")


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
_TOKEN_LIMITS: Final = frozenset({"length", "max_tokens"})
"""The cuts that ``accept_truncated`` may accept: the answer's token limit."""


# --- Public classes -----------------------------------------------------------------


class ProviderError(Exception):
    """A provider request failed; the message says what happened and where.

    ``status`` is the HTTP status when the provider answered with one >= 400, else None.
    ``retry_after`` is the provider's Retry-After in seconds, when it sent one, else None.
    """

    # Whether a retry may help (a connection failure, a retried status, an overload):
    # set where the error is made, read by stream() only.
    _transient = False

    def __init__(
        self, message: str, *, status: Optional[int] = None, retry_after: Optional[float] = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


_Block = Union[str, al.ToolCall]
"""What a wire format yields: text, or a complete tool call."""

_Options = Union[Mapping[str, Any], Callable[[al.ModelRequest], Optional[Mapping[str, Any]]], None]
"""What ``options`` may be: one mapping for every request, or a function of the request."""


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
        self.options: Union[Dict[str, Any], Callable[[al.ModelRequest], Any]] = (
            options if callable(options) else _checked_options(options, self._owned_keys)
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
        if not isinstance(accept_truncated, bool):
            raise TypeError(
                f"accept_truncated must be a bool, got {type(accept_truncated).__name__}"
            )
        self.accept_truncated = accept_truncated
        # Tests shorten the backoff through these; nothing else should set them.
        self._backoff_start = _BACKOFF_START
        self._jitter: Callable[[], float] = random.random

    def stream(
        self, request: al.ModelRequest, signal: al.Signal
    ) -> Generator[al.ModelChunk, None, al.ModelResponse]:
        """Streams the answer to one request; the generator returns the response.

        Raises ProviderError from the generator when the answer is not complete.
        """
        url, headers, body = self._post(request)
        retried = 0
        while True:
            answer = self._answer(request)
            pacer = _Pacer()
            exchange = self._exchange(url, headers, body, signal)
            try:
                exchange.open()
                while not answer.done:
                    for block in answer.feed(exchange.read()):
                        # Text as the pacing says; before a tool call, the buffered text.
                        text = pacer.text(block) if isinstance(block, str) else pacer.flush()
                        if text is not None:
                            yield al.TextDelta(request.id, text)
                        if isinstance(block, al.ToolCall):
                            pacer.count_call()
                            yield al.ToolCallChunk(request.id, block)
                text = pacer.flush()
                if text is not None:
                    yield al.TextDelta(request.id, text)
                return answer.response()
            except ProviderError as error:
                delay = self._retry_delay(error, retried, pacer.yielded)
                if delay is None:
                    raise _after_retries(error, retried, self.retries) from None
                failure = error  # the except clause unbinds its name
            finally:
                exchange.close()
            retried += 1
            _logger.warning(
                "%s: attempt %d of %d failed (%s); retrying in %.3g s",
                request.id,
                retried,
                self.retries + 1,
                failure,
                delay,
            )
            if signal.wait(delay):
                raise ProviderError(f"the request to {url} was cancelled during a retry's wait")

    def _retry_delay(self, error: ProviderError, retried: int, yielded: int) -> Optional[float]:
        """Seconds to wait before the next attempt, or None: the error fails the run."""
        if not error._transient or yielded or retried >= self.retries:
            return None
        if error.retry_after is None:
            return _backoff(self._backoff_start, retried, self._jitter())
        if error.retry_after > _RETRY_AFTER_LIMIT:
            return None
        return error.retry_after

    def _exchange(
        self, url: str, headers: Dict[str, str], body: bytes, signal: al.Signal
    ) -> _Exchange:
        return _Exchange(url, headers, body, self.timeout, signal, self.ssl_context)

    def _options(self, request: al.ModelRequest) -> Dict[str, Any]:
        """This request's options: the mapping, or what the function returns, checked."""
        if isinstance(self.options, dict):
            return self.options
        return _checked_options(self.options(request), self._owned_keys, "what options returns")

    def _key(self) -> Optional[str]:
        """The API key: the argument, else the environment at request time; '' is none."""
        key = self.api_key if self.api_key is not None else os.environ.get(self._key_variable)
        return key or None

    def _answer(self, request: al.ModelRequest) -> _Answer:
        raise NotImplementedError  # pragma: no cover (both subclasses define it)

    def _post(self, request: al.ModelRequest) -> Tuple[str, Dict[str, str], bytes]:
        raise NotImplementedError  # pragma: no cover (both subclasses define it)


def _backoff(start: float, retried: int, jitter: float) -> float:
    """The wait before retry number retried + 1: start doubled per retry, capped, jittered.

    ``jitter`` is in [0, 1); it shortens the wait by up to a quarter, so that clients
    that failed together do not retry together.
    """
    return min(start * 2.0**retried, _BACKOFF_CAP) * (1.0 - 0.25 * jitter)


def _after_retries(error: ProviderError, retried: int, retries: int) -> ProviderError:
    """The error that fails the run: as raised, or saying why no more retries were made."""
    long_wait = error.retry_after is not None and error.retry_after > _RETRY_AFTER_LIMIT
    if error._transient and long_wait and retried < retries:
        note = f"not retried: the Retry-After is more than {_RETRY_AFTER_LIMIT:g} s"
    elif retried:
        note = f"after {retried} retr{'y' if retried == 1 else 'ies'}"
    else:
        return error
    wrapped = ProviderError(
        f"{error} ({note})", status=error.status, retry_after=error.retry_after
    )
    wrapped._transient = error._transient
    return wrapped


class _Pacer:
    """The coalescing policy of the module docstring: what text to yield, and when.

    ``yielded`` counts the step's chunks. While it is below _PACED_FROM, each text delta
    is yielded as it comes; after that, text is buffered until it holds the minimum,
    2 code points doubled every _DOUBLING chunks. ``flush()`` yields what is buffered:
    before a tool call and at the end of the answer.
    """

    def __init__(self) -> None:
        self.yielded = 0
        self.buffered: List[str] = []
        self.size = 0

    def text(self, text: str) -> Optional[str]:
        """The text to yield for this delta now, or None while it is buffered."""
        if self.yielded < _PACED_FROM:  # nothing is buffered before _PACED_FROM
            self.yielded += 1
            return text
        self.buffered.append(text)
        self.size += len(text)
        if self.size < 2 << ((self.yielded - _PACED_FROM) // _DOUBLING):
            return None
        return self.flush()

    def flush(self) -> Optional[str]:
        """The buffered text as one chunk, or None when nothing is buffered."""
        if not self.buffered:
            return None
        text = "".join(self.buffered)
        self.buffered = []
        self.size = 0
        self.yielded += 1
        return text

    def count_call(self) -> None:
        """A tool call is yielded: one more chunk."""
        self.yielded += 1


class OpenAIChatModel(_StreamingModel):
    """A model behind an OpenAI-compatible Chat Completions endpoint, streamed.

    Posts to ``{base_url}/chat/completions`` with ``stream: true``. ``api_key=None`` reads
    ``OPENAI_API_KEY`` at request time and sends no key when there is none. ``system`` is
    the system prompt; ``options`` (temperature, max_tokens, tool_choice...) is merged
    into the body: a mapping, or a function of the request that returns one.
    ``timeout`` bounds each wait (name lookup, connection, TLS handshake, every byte),
    in seconds. ``retries`` more attempts are made for a transient failure before the
    first chunk; ``ssl_context`` verifies HTTPS (None: the system's CAs);
    ``accept_truncated=True`` accepts a text answer cut by the token limit.

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
        )

    def _answer(self, request: al.ModelRequest) -> _Answer:
        return _OpenAIAnswer(request, self.accept_truncated)

    def _post(self, request: al.ModelRequest) -> Tuple[str, Dict[str, str], bytes]:
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "User-Agent": _USER_AGENT,
        }
        key = self._key()
        if key is not None:
            headers["Authorization"] = "Bearer " + key
        body = _openai_body(request, self.model, self.system, self._options(request))
        return self.base_url + "/chat/completions", headers, body


class AnthropicMessagesModel(_StreamingModel):
    """A model behind Anthropic's Messages API, streamed.

    Posts to ``{base_url}/v1/messages`` with ``stream: true`` and the ``anthropic-version``
    header. ``api_key=None`` reads ``ANTHROPIC_API_KEY`` at request time and sends no key
    when there is none. ``system`` is the system prompt, ``max_tokens`` the answer's token
    budget (an answer that reaches it fails the run, unless ``accept_truncated=True``
    and it ends in text); ``options`` (temperature, tool_choice...) is merged into the
    body: a mapping, or a function of the request that returns one. ``timeout``,
    ``retries`` and ``ssl_context`` as for ``OpenAIChatModel``.

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
        options: _Options = None,
        retries: int = 2,
        ssl_context: Optional[ssl.SSLContext] = None,
        accept_truncated: bool = False,
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
        )
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
            raise TypeError(f"max_tokens must be an int, got {type(max_tokens).__name__}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens}")
        self.max_tokens = max_tokens

    def _answer(self, request: al.ModelRequest) -> _Answer:
        return _AnthropicAnswer(request, self.accept_truncated)

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
        body = _anthropic_body(
            request, self.model, self.system, self.max_tokens, self._options(request)
        )
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


def _checked_options(
    options: object, owned_keys: AbstractSet[str], what: str = "options"
) -> Dict[str, Any]:
    """options: a JSON object whose keys the adapter does not own; kept as a plain copy."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(
            f"{what} must be a mapping, None, or a function of the request; "
            f"got {type(options).__name__}"
        )
    try:
        copy = json.loads(json.dumps(dict(options), allow_nan=False))
    except (TypeError, ValueError) as error:
        raise TypeError(f"{what} must be plain JSON: {error}") from None
    owned = sorted(key for key in copy if key in owned_keys)
    if owned:
        raise ValueError(
            f"{what} may not set {', '.join(owned)}: the adapter sets them (use its arguments)"
        )
    return dict(copy)


# --- The exchange: the one place with a socket -------------------------------------


_default_contexts: List[ssl.SSLContext] = []
"""ssl.create_default_context(), made at the first HTTPS request and shared (thread-safe)."""


def _default_context() -> ssl.SSLContext:
    if not _default_contexts:
        _default_contexts.append(ssl.create_default_context())
    return _default_contexts[0]


class _Exchange:
    """One POST and its streamed response: the timeout and the cancellation watch.

    ``open()`` connects (watched), sends and reads the head; a head that decides an
    error raises. ``read()`` returns the next bytes as soon as there are any, b"" at the
    end. ``close()`` closes the connection and ends the watcher; it is safe to call at
    any point, more than once.
    """

    def __init__(
        self,
        url: str,
        headers: Dict[str, str],
        body: bytes,
        timeout: float,
        signal: al.Signal,
        ssl_context: Optional[ssl.SSLContext],
    ) -> None:
        self.url = url
        self.headers = headers
        self.body = body
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
        self.finished = threading.Event()

    def open(self) -> None:
        """Connects, sends the request and reads the response's head."""
        sock = self._connected()
        self.connection.sock = sock
        threading.Thread(
            target=self._watch, args=(sock,), name="agent_loop_providers watch", daemon=True
        ).start()
        try:
            self.connection.request("POST", self.path, self.body, self.headers)
            response = self.connection.getresponse()
        except socket.timeout:
            raise self._failure(f"{self.url} sent nothing for {self.timeout:g} s") from None
        except (OSError, http.client.HTTPException) as error:
            raise self._failure(f"the request to {self.url} failed: {_described(error)}") from None
        self.response = response
        headers = {name.lower(): value for name, value in response.getheaders()}
        failure = _head_error(
            self.url,
            response.status,
            response.reason,
            headers,
            lambda: _error_body(response),
            time.time(),
        )
        if failure is not None:
            raise failure

    def read(self) -> bytes:
        """The next bytes of the response body (b"" at its end)."""
        response = cast(http.client.HTTPResponse, self.response)  # open() succeeded
        try:
            data = response.read1(_READ_SIZE)
        except socket.timeout:
            raise self._failure(f"{self.url} sent nothing for {self.timeout:g} s", False) from None
        except (OSError, http.client.HTTPException) as error:
            raise self._failure(
                f"the connection to {self.url} broke: {_described(error)}", False
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

    def _connected(self) -> socket.socket:
        """A socket connected to the host (TLS done for https), every wait watched."""
        addresses = self._addresses()
        failure: OSError = OSError(f"no address for {self.host}")
        for family, kind, protocol, _, address in addresses:
            sock = socket.socket(family, kind, protocol)
            try:
                sock.setblocking(False)
                code = sock.connect_ex(address)
                if code not in (errno.EINPROGRESS, errno.EWOULDBLOCK, 0):
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
            if time.monotonic() >= deadline:
                raise self._connect_failure(
                    f"the name lookup of {self.host} took more than {self.timeout:g} s"
                )
        if isinstance(found[0], OSError):
            raise self._connect_failure(f"the name lookup failed: {_described(found[0])}")
        return cast(List[Any], found[0])

    def _handshake(self, sock: socket.socket) -> ssl.SSLSocket:
        """The TLS handshake, without blocking; the certificate and host name verified."""
        context = cast(ssl.SSLContext, self.context)  # set for https
        tls = context.wrap_socket(sock, server_hostname=self.host, do_handshake_on_connect=False)
        deadline = time.monotonic() + self.timeout  # for the whole handshake
        try:
            while True:
                try:
                    tls.do_handshake()
                    return tls
                except ssl.SSLWantReadError:
                    self._wait_for(tls, selectors.EVENT_READ, "the TLS handshake", deadline)
                except ssl.SSLWantWriteError:  # pragma: no cover (a full send buffer)
                    self._wait_for(tls, selectors.EVENT_WRITE, "the TLS handshake", deadline)
        except ssl.SSLCertVerificationError as error:
            tls.close()
            raise ProviderError(  # not transient: the same certificate comes back
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
        with selectors.DefaultSelector() as selector:
            selector.register(sock, event)
            while True:
                ready = selector.select(min(_WATCH_INTERVAL, max(deadline - time.monotonic(), 0)))
                if self.signal.is_set():
                    raise self._cancelled()
                if ready:
                    return
                if time.monotonic() >= deadline:
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

    def _connect_failure(self, cause: str) -> ProviderError:
        """The connection could not be made: worth a retry."""
        error = ProviderError(f"cannot connect to {self.url}: {cause}")
        error._transient = True
        return error

    def _failure(self, message: str, transient: bool = True) -> ProviderError:
        """A network failure, or the cancellation that caused it."""
        if self.signal.is_set():
            return self._cancelled()
        error = ProviderError(message)
        error._transient = transient
        return error

    def _cancelled(self) -> ProviderError:
        return ProviderError(f"the request to {self.url} was cancelled")


def _head_error(
    url: str,
    status: int,
    reason: str,
    headers: Mapping[str, str],
    body: Callable[[], str],
    now: float,
) -> Optional[ProviderError]:
    """The error that a response's status and headers decide, or None for a stream.

    ``headers`` has lower-case names; ``body()`` reads the error body when one is needed;
    ``now`` (seconds since the epoch) dates a Retry-After given as an HTTP date.
    """
    if status >= 400:
        retry_after = _retry_after(headers, now)
        message = f"{url} answered HTTP {status} {reason}: {_error_text(body())}"
        if retry_after is not None:
            message += f" (Retry-After: {retry_after:g} s)"
        error = ProviderError(message, status=status, retry_after=retry_after)
        error._transient = status in _RETRIED_STATUSES
        return error
    if headers.get("content-type", "").startswith("application/json"):
        return ProviderError(f"{url} answered with JSON, not an event stream: {_excerpt(body())}")
    return None


def _error_body(response: http.client.HTTPResponse) -> str:
    """The body of an answer that is not a stream, or '' when it cannot be read."""
    try:
        data = response.read(_ERROR_BODY_LIMIT)
    except (OSError, http.client.HTTPException):
        return ""
    return data.decode("utf-8", "replace")


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
    except (TypeError, ValueError, IndexError):
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
    data). Other fields are ignored. ``feed(b"")`` is the end of the input: a character
    cut by it is malformed, and an event or a line still open is dropped (the WHATWG
    rules: only a blank line dispatches).
    """

    def __init__(self) -> None:
        # utf-8-sig: a byte order mark at the start is dropped, as the WHATWG rules say.
        self.decoder = codecs.getincrementaldecoder("utf-8-sig")()
        self.pending = ""  # the start of a line that has not ended yet
        self.skip_line_feed = False  # the last read ended with a CR
        self.event = ""
        self.data: List[str] = []

    def feed(self, data: bytes) -> List[_ServerEvent]:
        """The events that these bytes complete, in order; b"" ends the input."""
        try:
            text = self.decoder.decode(data, final=not data)
        except UnicodeDecodeError as error:
            raise ProviderError(f"malformed event stream: it is not UTF-8 ({error})") from None
        if not data:  # the end: what is still open is dropped
            self.pending = ""
            self.skip_line_feed = False
            self.event = ""
            self.data = []
            return []
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
    """One streamed answer, sans-IO: bytes in, complete blocks out, then the response.

    ``feed(data)`` returns the blocks that the bytes complete; ``feed(b"")`` is the end
    of the input, and raises unless the end marker came. ``done`` is True once it came.
    ``response()`` is the terminal response, refused without the marker.
    """

    end_marker = ""

    def __init__(self, request: al.ModelRequest, accept_truncated: bool = False) -> None:
        self.request = request
        self.accept_truncated = accept_truncated
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
        if not data and not self.done:
            raise self._incomplete()
        return out

    def response(self) -> al.ModelResponse:
        """The terminal response: the streamed blocks, adjacent text joined."""
        if not self.done:
            raise self._incomplete()
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

    def _incomplete(self) -> ProviderError:
        return ProviderError(
            f"the stream ended before {self.end_marker}: the answer is incomplete"
        )

    def _cut(self, field: str, reason: str, meaning: str, out: List[_Block]) -> None:
        """The provider says the answer was cut: fail, or accept a text answer so far.

        With accept_truncated, an answer whose last block is text, cut by the token
        limit, is the model's answer; it is logged. Anything else raises.
        """
        last = out[-1] if out else self.blocks[-1] if self.blocks else None
        if self.accept_truncated and reason in _TOKEN_LIMITS and isinstance(last, str):
            _logger.warning(
                "%s: the answer was cut by %s (%s %r); accepted as the model's answer "
                "(accept_truncated=True)",
                self.request.id,
                meaning,
                field,
                reason,
            )
            return
        raise ProviderError(f"the answer was cut: {field} {reason!r} ({meaning})")

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
    """An error event inside the stream: the provider's own text.

    Anthropic's ``overloaded_error`` is worth a retry (when no chunk was yielded yet).
    """
    text = _error_text(data)
    error = ProviderError(f"the stream reported an error: {text}")
    error._transient = text.startswith("overloaded_error:")
    return error


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
            # "" when there is no text: llama.cpp's servers refuse null and a missing content.
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

    def __init__(self, request: al.ModelRequest, accept_truncated: bool = False) -> None:
        super().__init__(request, accept_truncated)
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
                if self.open_calls:  # a call being written when the answer was cut
                    raise ProviderError(
                        f"the answer was cut: finish_reason {finish!r} "
                        f"({_OPENAI_CUT[finish]}) while a tool call was streamed"
                    )
                self._cut("finish_reason", finish, _OPENAI_CUT[finish], out)
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

    def __init__(self, request: al.ModelRequest, accept_truncated: bool = False) -> None:
        super().__init__(request, accept_truncated)
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
                self._cut("stop_reason", reason, _ANTHROPIC_CUT[reason], out)
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


def _command_line_tools() -> al.ToolRegistry:
    """The command line's tools; the weather station in Atlantis is missing, on purpose."""

    def add(left: float, right: float) -> Dict[str, float]:
        """Adds two numbers."""
        return {"sum": left + right}

    def multiply(left: float, right: float) -> Dict[str, float]:
        """Multiplies two numbers."""
        return {"product": left * right}

    def weather(city: str) -> str:
        """Reports the weather in a city."""
        stations = {"Lisbon": "sunny, 19 C", "Oslo": "snow, -3 C"}
        if city not in stations:
            raise al.ToolError(f"no weather station in {city}")
        return stations[city]

    return al.ToolRegistry([al.Tool.from_function(fn) for fn in (add, multiply, weather)])


class _Printer:
    """The readable output: text as it streams, a line per tool call and result, the result."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.in_line = False  # streamed text left the cursor inside a line

    def event(self, event: al.Event) -> None:
        payload = event.payload
        if event.type == "model.chunk":
            chunk = payload["chunk"]
            if isinstance(chunk, al.TextDelta):
                self.out.write(chunk.text)
                self.in_line = not chunk.text.endswith("\n")
                self.out.flush()
                return
            call = chunk.tool_call
            arguments = json.dumps(call.plain_arguments(), ensure_ascii=False)
            self.line(f"-> {call.name}({arguments}) [{call.id}]")
        elif event.type == "tool.finished":
            result = payload["tool_result"]
            outcome = "error" if result.is_error else "ok"
            self.line(f"<- {result.tool_name} {outcome}: {result.content}")
        elif event.type == "run.finished":
            self.result(payload["result"])
        # message.accepted and tool.started: the text and the calls are already shown.

    def result(self, result: al.RunResult) -> None:
        self.line(
            f"result: {result.status}, {result.steps} step(s), {len(result.messages)} messages"
        )
        if result.max_steps is not None:
            self.line(f"the budget of {result.max_steps} step(s) ended the run")
        if result.error is not None:
            self.line(f"error: {result.error.code}: {result.error.message}")

    def line(self, text: str) -> None:
        if self.in_line:
            self.out.write("\n")
            self.in_line = False
        self.out.write(text + "\n")
        self.out.flush()


def _json_line(event: al.Event) -> None:
    print(json.dumps(event.to_dict(), ensure_ascii=False), flush=True)


def _steps(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 1 <= value <= al.MAX_AGENT_STEPS:
        raise argparse.ArgumentTypeError(f"{value} is not in 1..{al.MAX_AGENT_STEPS}")
    return value


def _at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is not >= {low}")
        return value

    return parse


_tokens = _at_least(1)
_retries = _at_least(0)


def _option(text: str) -> Tuple[str, Any]:
    key, equals, value = text.partition("=")
    if not key or not equals:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=JSON")
    try:
        return key, json.loads(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"the value of {key} is not JSON: {value!r}") from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs an agent with the command line's tools against a provider; prints the answer.

    Prints the answer's text as it streams, a line per tool call and per tool result,
    then the result; ``--json`` prints each event's ``to_dict()`` as one JSON line and
    nothing else. Returns 0 when the run completed, 1 otherwise. Ctrl-C sets the run's
    signal, so the run ends ``cancelled`` and its result is printed. Retries and
    accepted cut answers are logged on stderr. Bad options exit with status 2.
    """
    parser = argparse.ArgumentParser(
        prog="python agent_loop_providers.py",
        description=(
            "Runs the Agent Loop against a streaming model API, with a few tools (add, "
            "multiply, weather), and prints the answer as it streams, a line per tool call "
            "and per tool result, then the result. The API key comes from OPENAI_API_KEY "
            "or ANTHROPIC_API_KEY, if set. Ctrl-C cancels the run."
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
        "--max-tokens",
        type=_tokens,
        metavar="N",
        help="the answer's token limit (OpenAI: max_tokens in the body; Anthropic: 4096 "
        "unless given)",
    )
    parser.add_argument(
        "--option",
        type=_option,
        action="append",
        default=[],
        metavar="KEY=JSON",
        help='a field of the request body, e.g. temperature=0 or stop=["\\n"] (repeatable)',
    )
    parser.add_argument(
        "--retries",
        type=_retries,
        default=2,
        metavar="N",
        help="more attempts after a transient failure before the answer starts (default 2)",
    )
    parser.add_argument(
        "--accept-truncated",
        action="store_true",
        help="accept a text answer cut by the token limit (logged) instead of failing",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print each event as one JSON line (to_dict form), nothing else",
    )
    parser.add_argument("prompt", metavar="PROMPT", help="the user's message")
    options = parser.parse_args(argv)
    body = dict(options.option)
    arguments: Dict[str, Any] = {
        "base_url": options.base_url,
        "system": options.system,
        "retries": options.retries,
        "accept_truncated": options.accept_truncated,
    }
    model_class: Any = OpenAIChatModel
    if options.provider == "anthropic":
        model_class = AnthropicMessagesModel
        if options.max_tokens is not None:
            arguments["max_tokens"] = options.max_tokens
    elif options.max_tokens is not None:
        if "max_tokens" in body:
            parser.error("give max_tokens once: --max-tokens or --option max_tokens=...")
        body["max_tokens"] = options.max_tokens
    try:
        model = model_class(options.model, options=body, **arguments)
    except (TypeError, ValueError) as error:
        parser.error(str(error))
    signal = threading.Event()

    def interrupt(number: int, frame: object) -> None:
        signal.set()  # the run ends cancelled
        # A second Ctrl-C interrupts at once, whatever the run is doing (a tool, say).
        os_signal.signal(os_signal.SIGINT, previous)

    # Retries and accepted cut answers go to stderr, as warnings; only while main runs.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("warning: %(message)s"))
    _logger.addHandler(handler)
    previous = os_signal.signal(os_signal.SIGINT, interrupt)
    try:
        _, result = al.settle_run(
            al.run_agent_loop(
                messages=[al.UserMessage("user-001", options.prompt)],
                model=model,
                tools=_command_line_tools(),
                max_steps=options.max_steps,
                signal=signal,
            ),
            on_event=_json_line if options.json else _Printer(sys.stdout).event,
        )
    finally:
        os_signal.signal(os_signal.SIGINT, previous)
        _logger.removeHandler(handler)
    return 0 if result.status == "completed" else 1


if __name__ == "__main__":
    try:
        status = main()
        sys.stdout.flush()  # here, where a broken pipe can still be caught
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 1
    sys.exit(status)
