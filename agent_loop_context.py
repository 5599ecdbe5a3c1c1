# agent_loop_context.py 1.0.0: a model whose requests fit a context window, for agent_loop.py.
# One file, standard library only; copy it next to agent_loop.py. Home: the agent_loop repository.
"""Context management for the Agent Loop: ``fit(model, window)`` is a model whose requests
fit a ``ContextWindow``.

The loop sends the whole transcript with every request; a long conversation outgrows any
model's context. The model that ``fit()`` returns stands between the loop and the model
and, before every request (the loop's requests inside a run too), sends the model a view
of the transcript that fits the window:

- The view is the transcript while it fits. Once it does not, the older messages are
  **folded**: replaced by one user message holding a summary of them, made once for the
  fold (by the model itself, a request asking for a summary, unless ``summarize=`` is
  given) and reused by every later request until the next fold; the next fold summarizes
  that summary and the messages it folds, so there is one summary in a view, first.
- The newest messages stay verbatim: as many as ``keep_recent_tokens`` holds, and at
  least the newest. A cut never falls between an assistant's tool call and its result:
  in every view, each tool result follows its call.
- Ids stay unique against the whole transcript, which the model did not see: a response
  id or a tool-call id of the answer that the transcript (or ``taken``) already uses is
  renamed (``-2``, ``-3``... appended), in the chunks and the response alike, so that the
  loop appends a valid message.
- Tokens: the input tokens the provider reported for the newest response in the view
  (``Usage.input_tokens`` of the newest assistant message that has it), plus an
  estimate of the messages after it; with none reported, the estimate of the whole
  request. The estimate is ``estimate_tokens()``: a quarter of the characters of each
  message's JSON form and of the tools' specs, rounded up. ``count_tokens=`` replaces
  all of it (it is given the view as a ``ModelRequest``).
- A request that cannot fit even with every older message folded fails: ``stream()``
  raises ``ContextOverflow`` naming the window, so the run fails ``MODEL_STREAM_ERROR``;
  nothing is ever cut silently.
- A provider's refusal of a request as longer than its context (an exception whose
  ``context_exceeded`` attribute is True, as ``agent_loop_providers.ProviderError`` has)
  before the answer's first chunk is answered by folding everything older than the
  newest messages and asking once more.

Each fold is recorded (``FittedModel.folds``, and ``on_fold`` when given): its summary,
how many messages it replaced, the tokens before and after, and the summary's usage.

This file uses only the public names of ``agent_loop``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import (
    Any,
    Callable,
    Container,
    Dict,
    Final,
    Generator,
    List,
    Optional,
    Sequence,
    Set,
    Tuple,
    cast,
)

import agent_loop as al

__version__ = "1.0.0"

__all__ = [
    "ContextWindow",
    "fit",
    "FittedModel",
    "Fold",
    "ContextOverflow",
    "estimate_tokens",
    "SUMMARY_PROMPT",
    "SUMMARY_HEADER",
]

CHARS_PER_TOKEN: Final = 4
"""The estimate's ratio: about four characters of English text or JSON to a token, as
OpenAI's guidance and llmock's own estimate have it."""

SUMMARY_PROMPT: Final = (
    "Summarize the conversation above for whoever continues it: what was asked, what "
    "was done and found, and what is still open. Reply with the summary only."
)
"""The user message that ends the request for a summary, after the messages it folds."""

SUMMARY_HEADER: Final = "A summary of the conversation before this point:\n\n"
"""What the view's summary message says before the summary itself."""


class ContextOverflow(Exception):
    """A request that does not fit its context window even with every older message
    folded; raised by ``FittedModel.stream()``, it fails the run ``MODEL_STREAM_ERROR``."""


@dataclass(frozen=True)
class ContextWindow:
    """What one model request may hold: ``max_tokens`` of input (leave room for the
    answer: a model's context holds both). ``keep_recent_tokens`` (default half of
    ``max_tokens``) is how much of the newest transcript a fold keeps verbatim;
    ``summarize(messages) -> str`` makes a fold's summary (default: the model is asked);
    ``count_tokens(request) -> int`` counts a request (default: see the module's doc).

    Raises TypeError or ValueError for a field it cannot take, naming it.
    """

    max_tokens: int
    keep_recent_tokens: Optional[int] = None
    summarize: Optional[Callable[[Tuple[al.Message, ...]], str]] = None
    count_tokens: Optional[Callable[[al.ModelRequest], int]] = None

    def __post_init__(self) -> None:
        if type(self.max_tokens) is not int or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        keep = self.max_tokens // 2 if self.keep_recent_tokens is None else self.keep_recent_tokens
        if type(keep) is not int or not 0 <= keep <= self.max_tokens:
            raise ValueError(
                f"keep_recent_tokens must be None or an int in 0..max_tokens "
                f"({self.max_tokens}), got {self.keep_recent_tokens!r}"
            )
        object.__setattr__(self, "keep_recent_tokens", keep)
        for name in ("summarize", "count_tokens"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise TypeError(f"{name} must be None or a function, got {type(value).__name__}")


@dataclass(frozen=True)
class Fold:
    """One fold: the summary message ``id`` and its ``summary``, which replaced the first
    ``messages`` messages of request ``request_id``'s transcript; the request's tokens
    before and the view's after; the usage of the summary request (None when
    ``summarize=`` made it, or the provider did not say)."""

    id: str
    summary: str
    messages: int
    tokens_before: int
    tokens_after: int
    request_id: str
    usage: Optional[al.Usage] = None

    def message(self) -> al.UserMessage:
        """The user message that stands for the folded messages in a view."""
        return al.UserMessage(self.id, SUMMARY_HEADER + self.summary)


def fit(
    model: al.Model,
    window: ContextWindow,
    *,
    taken: Container[str] = frozenset(),
    on_fold: Optional[Callable[[Fold], object]] = None,
) -> FittedModel:
    """Returns a model whose every request fits ``window`` (see the module's doc).

    ``taken`` holds ids that the transcript does not but that must stay unused (message
    and tool-call ids of a conversation's older messages, as a session has them);
    ``on_fold(fold)`` is called with each fold as it is made. Raises TypeError for a
    model without ``stream()`` or a window that is not a ``ContextWindow``.
    """
    if not callable(getattr(model, "stream", None)):
        raise TypeError(f"model must have a callable stream(), got {type(model).__name__}")
    if not isinstance(window, ContextWindow):
        raise TypeError(f"window must be a ContextWindow, got {type(window).__name__}")
    return FittedModel(model, window, taken, on_fold)


class FittedModel:
    """The model ``fit()`` returns: ``folds`` lists the folds it made, in order. It keeps
    the current fold between requests: use one per conversation, one request at a time."""

    def __init__(
        self,
        model: al.Model,
        window: ContextWindow,
        taken: Container[str],
        on_fold: Optional[Callable[[Fold], object]],
    ) -> None:
        self.model = model
        self.window = window
        self.taken = taken
        self.on_fold = on_fold
        self.folds: List[Fold] = []
        self._fold: Optional[Fold] = None  # the summary the views start with
        self._through = ""  # the id of the last message the current fold replaced
        self._sizes: Dict[str, Tuple[al.Message, int]] = {}  # estimates, by message id

    def stream(
        self, request: al.ModelRequest, signal: al.Signal
    ) -> Generator[al.ModelChunk, None, al.ModelResponse]:
        """Streams the answer to the view of ``request`` that fits the window; raises
        ``ContextOverflow`` when none does."""
        view = self._view(request, signal)
        names = _Renamer(request.messages, self.taken)
        try:
            stream = self._open(request, view, signal)
            first: Optional[al.ModelChunk] = next(stream)
        except StopIteration as done:  # an answer without a chunk
            return cast(al.ModelResponse, names.response(done.value))
        except Exception as error:
            # A refusal before the answer began: fold what is older and ask once more.
            if getattr(error, "context_exceeded", False) is not True:
                raise
            view = self._folded(request, signal, view, forced=error)
            stream = self._open(request, view, signal)
            first = None
        try:
            while True:
                try:
                    chunk = next(stream) if first is None else first
                except StopIteration as done:
                    return cast(al.ModelResponse, names.response(done.value))
                first = None
                yield names.chunk(chunk)
        finally:
            stream.close()

    # --- The view ----------------------------------------------------------------------

    def _open(
        self, request: al.ModelRequest, view: List[al.Message], signal: al.Signal
    ) -> Generator[al.ModelChunk, None, al.ModelResponse]:
        """The model's stream of the view, as a request of the loop's id."""
        return self.model.stream(al.ModelRequest(request.id, tuple(view), request.tools), signal)

    def _view(self, request: al.ModelRequest, signal: al.Signal) -> List[al.Message]:
        """The messages to send: the current fold's view if it fits, else a new fold's."""
        view = self._compose(request.messages, self._kept_from(request.messages))
        tokens = self._tokens(request, view, reported=True)
        if tokens > self.window.max_tokens:
            view = self._folded(request, signal, view, before=tokens)
        kept = {message.id for message in view}  # estimates of messages still in view only
        self._sizes = {key: value for key, value in self._sizes.items() if key in kept}
        return view

    def _kept_from(self, transcript: Sequence[al.Message]) -> int:
        """Where the current fold's verbatim part begins, or 0 (and no fold) if the fold
        does not apply: another conversation, or none folded yet."""
        if self._fold is not None:
            count = self._fold.messages
            if count < len(transcript) and transcript[count - 1].id == self._through:
                return count
        self._fold = None
        return 0

    def _compose(self, transcript: Sequence[al.Message], start: int) -> List[al.Message]:
        """The summary of the current fold, if any, then the transcript from ``start``."""
        head: List[al.Message] = [] if self._fold is None else [self._fold.message()]
        return head + list(transcript[start:])

    def _folded(
        self,
        request: al.ModelRequest,
        signal: al.Signal,
        view: List[al.Message],
        *,
        before: Optional[int] = None,
        forced: Optional[BaseException] = None,
    ) -> List[al.Message]:
        """Folds until the view fits, each fold one summary; ContextOverflow when nothing
        older is left to fold. ``forced``: the provider refused a view that fits by the
        count, so everything older than the newest messages is folded, once."""
        transcript = request.messages
        tokens = self._tokens(request, view, reported=False) if before is None else before
        while forced is not None or tokens > self.window.max_tokens:
            start = self._kept_from(transcript)
            cuts = [cut for cut in _safe_cuts(transcript) if cut > start]
            if not cuts:
                if forced is not None:
                    raise forced  # nothing left to fold: the provider's refusal stands
                raise ContextOverflow(
                    f"request {request.id} does not fit the context window of "
                    f"{self.window.max_tokens} tokens even with every older message folded: "
                    f"it holds {tokens} tokens, the newest messages (from "
                    f"{transcript[start].id!r} on) staying verbatim"
                )
            cut = cuts[-1] if forced is not None else self._cut(request, cuts)
            forced = None
            # The previous summary and the messages after it, up to the cut.
            composed = self._compose(transcript, start)
            folded = composed[: len(composed) - (len(transcript) - cut)]
            summary, usage = self._summary(request, signal, folded)
            summary_id = self._free_summary_id(transcript)
            self._fold = Fold(summary_id, summary, cut, tokens, 0, request.id, usage)
            self._through = transcript[cut - 1].id
            view = self._compose(transcript, cut)
            tokens = self._tokens(request, view, reported=False)
            self._fold = dataclasses.replace(self._fold, tokens_after=tokens)
            self.folds.append(self._fold)
            if self.on_fold is not None:
                self.on_fold(self._fold)
        return view

    def _cut(self, request: al.ModelRequest, cuts: List[int]) -> int:
        """The earliest cut whose verbatim part fits keep_recent_tokens, else the latest."""
        keep = cast(int, self.window.keep_recent_tokens)  # __post_init__ made it an int
        low, high = 0, len(cuts) - 1  # the verbatim part shrinks as the cut moves on
        while low < high:
            middle = (low + high) // 2
            tail = request.messages[cuts[middle] :]
            if self._tokens(request, tail, reported=False) <= keep:
                high = middle
            else:
                low = middle + 1
        return cuts[low]

    def _summary(
        self, request: al.ModelRequest, signal: al.Signal, folded: List[al.Message]
    ) -> Tuple[str, Optional[al.Usage]]:
        """The summary of the folded messages (the previous summary first), and its usage."""
        if self.window.summarize is not None:
            summary = self.window.summarize(tuple(folded))
            if type(summary) is not str:
                raise TypeError(f"summarize() must return a str, got {type(summary).__name__}")
            return summary, None
        ids = {message.id for message in folded}
        ask = al.UserMessage(_free("summary-request", ids.__contains__), SUMMARY_PROMPT)
        stream = self.model.stream(al.ModelRequest(request.id, (*folded, ask), ()), signal)
        try:
            while True:
                try:
                    next(stream)  # the summary's chunks are not the run's
                except StopIteration as done:
                    response = done.value
                    break
        finally:
            stream.close()
        if not isinstance(response, al.ModelResponse):
            raise TypeError(
                f"the summary request's stream returned {type(response).__name__}, "
                "not a ModelResponse"
            )
        text = "".join(block.text for block in response.content if isinstance(block, al.TextBlock))
        return text, response.usage

    def _free_summary_id(self, transcript: Sequence[al.Message]) -> str:
        """An id for a new summary message that neither the transcript nor ``taken`` uses."""
        ids = {message.id for message in transcript}
        return _free("summary", lambda candidate: candidate in ids or candidate in self.taken)

    # --- Tokens ------------------------------------------------------------------------

    def _tokens(
        self, request: al.ModelRequest, view: Sequence[al.Message], *, reported: bool
    ) -> int:
        """The view's tokens as a request: count_tokens, else the newest reported input
        tokens (when ``reported``) plus the estimate from that message on, else the
        estimate."""
        if self.window.count_tokens is not None:
            counted = self.window.count_tokens(
                al.ModelRequest(request.id, tuple(view), request.tools)
            )
            if type(counted) is not int:
                raise TypeError(f"count_tokens() must return an int, got {type(counted).__name__}")
            return counted
        total = 0
        for message in reversed(view):
            total += self._size(message)
            if reported and isinstance(message, al.AssistantMessage):
                usage = message.usage
                if usage is not None and usage.input_tokens is not None:
                    return usage.input_tokens + total
        return total + _estimate(_tools_text(request.tools))

    def _size(self, message: al.Message) -> int:
        """One message's estimate, computed once while the message stays in the views."""
        cached = self._sizes.get(message.id)
        if cached is not None and cached[0] is message:
            return cached[1]
        size = _message_tokens(message)
        self._sizes[message.id] = (message, size)
        return size


class _Renamer:
    """The ids of one answer, made unique against the transcript (which the model saw only
    part of) and ``taken``: a response id or call id in use gets -2, -3... appended."""

    def __init__(self, transcript: Sequence[al.Message], taken: Container[str]) -> None:
        self.transcript = transcript
        self.taken = taken
        self.calls: Dict[
            str, str
        ] = {}  # call id as given -> as sent on: chunks and response agree
        self._ids: Optional[Tuple[Set[str], Set[str]]] = None

    def ids(self) -> Tuple[Set[str], Set[str]]:
        """The transcript's message ids and call ids, gathered on first use."""
        if self._ids is None:
            messages = {message.id for message in self.transcript}
            calls = {
                block.id
                for message in self.transcript
                if isinstance(message, al.AssistantMessage)
                for block in message.content
                if isinstance(block, al.ToolCall)
            }
            self._ids = messages, calls
        return self._ids

    def chunk(self, chunk: al.ModelChunk) -> al.ModelChunk:
        """The chunk, its tool call renamed if need be."""
        if isinstance(chunk, al.ToolCallChunk) and isinstance(chunk.tool_call, al.ToolCall):
            call = self.call(chunk.tool_call)
            if call is not chunk.tool_call:
                return dataclasses.replace(chunk, tool_call=call)
        return chunk

    def response(self, response: Any) -> Any:
        """The response, its id and its calls renamed if need be; anything else as it came
        (the loop refuses it)."""
        if not isinstance(response, al.ModelResponse) or type(response.id) is not str:
            return response
        messages, _ = self.ids()

        def used(candidate: str) -> bool:
            message_id = al.assistant_message_id(candidate)
            return message_id in messages or message_id in self.taken

        content = tuple(
            self.call(block) if isinstance(block, al.ToolCall) else block
            for block in response.content
        )
        response_id = _free(response.id, used)
        if response_id == response.id and all(a is b for a, b in zip(content, response.content)):
            return response
        return dataclasses.replace(response, id=response_id, content=content)

    def call(self, call: al.ToolCall) -> al.ToolCall:
        """The call, renamed if its id, or its result's, is in use."""
        if type(call.id) is not str:
            return call
        if call.id not in self.calls:
            messages, calls = self.ids()
            chosen = set(self.calls.values())

            def used(candidate: str) -> bool:
                result = al.tool_result_id(candidate)
                return (
                    candidate in calls
                    or candidate in chosen
                    or candidate in self.taken
                    or result in messages
                    or result in self.taken
                )

            self.calls[call.id] = _free(call.id, used)
        new = self.calls[call.id]
        return call if new == call.id else dataclasses.replace(call, id=new)


# --- Cuts, estimates and ids ------------------------------------------------------------


def _safe_cuts(transcript: Sequence[al.Message]) -> List[int]:
    """The positions a fold may end at (1..len-1): no tool call before them is left
    without its result after them, so every kept result follows its kept call."""
    cuts: List[int] = []
    open_calls = 0
    for position, message in enumerate(transcript[:-1], start=1):
        if isinstance(message, al.AssistantMessage):
            open_calls += sum(isinstance(block, al.ToolCall) for block in message.content)
        elif isinstance(message, al.ToolResultMessage):
            open_calls -= 1
        if open_calls == 0:
            cuts.append(position)
    return cuts


def estimate_tokens(request: al.ModelRequest) -> int:
    """The estimate of a request's tokens: a quarter of the characters of each message's
    JSON form (``to_dict()``) and of the tools' specs, each rounded up."""
    return sum(_message_tokens(message) for message in request.messages) + _estimate(
        _tools_text(request.tools)
    )


def _message_tokens(message: al.Message) -> int:
    """One message's estimate."""
    return _estimate(json.dumps(message.to_dict(), ensure_ascii=False, separators=(",", ":")))


def _tools_text(tools: Sequence[al.ToolSpec]) -> str:
    """The tools' specs as JSON text, as a request carries them ("" for none)."""
    if not tools:
        return ""
    return json.dumps(
        [spec.to_dict() for spec in tools], ensure_ascii=False, separators=(",", ":")
    )


def _estimate(text: str) -> int:
    """Characters to tokens, rounded up."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def _free(base: str, taken: Callable[[str], bool]) -> str:
    """``base`` if not taken, else the first of base-2, base-3... that is not."""
    candidate, suffix = base, 1
    while taken(candidate):
        suffix += 1
        candidate = f"{base}-{suffix}"
    return candidate
