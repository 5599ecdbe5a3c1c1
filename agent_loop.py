# agent_loop.py 1.5.0: the reference Python implementation of the iterative Agent Loop.
# One file, standard library only; copy it into your project. Home: the agent_loop repository.
"""The iterative Agent Loop of checkpoint 07 ("Run the iterative Agent Loop"), in Python.

``run_agent_loop()`` returns a generator that yields a run's sequenced ``Event``s and
returns its ``RunResult``: ``completed``, ``cancelled``, ``maxSteps`` or ``failed``. Each
step opens one model request, appends the complete assistant response, runs the tools it
asks for in assistant order and appends their linked results. The seed's state diagram::

    stateDiagram-v2
      [*] --> ValidateOptions
      ValidateOptions --> SnapshotRun
      SnapshotRun --> Failed: invalid transcript
      SnapshotRun --> EmitAccepted: transcript valid
      EmitAccepted --> OpenModel
      OpenModel --> ReadChunks
      ReadChunks --> ReadChunks: valid model.chunk
      ReadChunks --> Failed: stream or protocol failure
      ReadChunks --> AppendAssistant: terminal response valid
      AppendAssistant --> Completed: stopReason stop
      AppendAssistant --> ExecuteTools: stopReason toolCall
      ExecuteTools --> ExecuteTools: next Tool call
      ExecuteTools --> Failed: fatal Tool phase
      ExecuteTools --> MaxSteps: step budget reached
      ExecuteTools --> OpenModel: continuation allowed
      SnapshotRun --> Cancelled: signal aborts
      EmitAccepted --> Cancelled: signal aborts
      OpenModel --> Cancelled: signal aborts
      ReadChunks --> Cancelled: signal aborts
      ExecuteTools --> Cancelled: signal aborts
      Completed --> Finish
      MaxSteps --> Finish
      Failed --> Finish
      Cancelled --> Finish
      Finish --> [*]

Invariants: one counter numbers every event, and ``run.finished`` is the last; the
transcript holds complete messages only (no unfinished response, no fabricated tool
result); options are checked and the run snapshotted when ``run_agent_loop()`` is called;
a value from outside is checked once, where it enters; cancellation wins over an error
that arrives after the signal was set. Beyond the seed, opt-in: tools at once
(``tool_concurrency``, events and results still in assistant order), consent
(``before_tool_call``), tools that end the run (``ends_run``) and tool progress (a tool that
is a generator function). Not here, as the seed says: steering queues, context
transformation, provider retries, persistent sessions.

The README and docs/ are the reference: the API, choices where the seed is silent, the companion
files (which use only this file's public names). This file reads top down: the limits,
the loop, then what it uses in that order. ``python agent_loop.py`` runs the demonstration,
which is the command line's (``python agent_loop_cli.py --demo``, beside this file).
"""

from __future__ import annotations

import collections.abc
import contextlib
import contextvars
import dataclasses
import importlib
import inspect
import itertools
import json
import logging
import math
import os
import queue
import reprlib
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import GeneratorType, MappingProxyType
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    ClassVar,
    Dict,
    Final,
    Generator,
    Iterable,
    Iterator,
    List,
    Literal,
    Mapping,
    NamedTuple,
    Optional,
    Protocol,
    Sequence,
    Set,
    TextIO,
    Tuple,
    TypeVar,
    Union,
    cast,
    get_args,
)

if TYPE_CHECKING:  # annotations only: the module needs nothing at run time
    from typing_extensions import TypeAlias, TypeGuard

_T = TypeVar("_T")

__version__ = "1.5.0"

__all__ = [  # grouped as the README presents the API
    # Entry point
    "run_agent_loop", "settle_run", "print_event", "Signal", "WATCH_SECONDS",
    # Message IR
    "JSON", "TextBlock", "ThinkingBlock", "ToolCall", "UserMessage", "AssistantMessage",
    "ToolResultMessage", "Message", "text_from_assistant", "message_from_dict",
    # Model boundary
    "Model", "ModelRequest", "TextDelta", "ThinkingDelta", "ToolCallChunk", "ModelChunk",
    "ModelResponse", "Usage", "StopReason", "check_stream_agreement",
    # Tools
    "Tool", "ToolSpec", "ToolRegistry", "ToolError", "execute_tool_call", "current_tool_call",
    # Events and results
    "Event", "RunResult", "RunError", "RunStatus", "FailureCode", "EventType", "event_from_dict",
    # Ids
    "request_id", "request_number", "assistant_message_id", "response_id_of", "tool_result_id",
    # Limits
    "MAX_AGENT_STEPS", "MAX_INITIAL_MESSAGES", "MAX_STEP_CHUNKS", "MAX_STEP_TEXT",
    "MAX_ASSISTANT_BLOCKS", "MAX_ARGUMENT_DEPTH", "MAX_ARGUMENT_VALUES", "MAX_ARGUMENT_SLOTS",
    "MAX_ARGUMENT_TEXT",
    # Test helpers
    "ScriptedModel", "ScriptedResponse", "scripted_response",
    # Interop and resumption
    "open_tool_calls", "resolve_open_tool_calls",
]  # fmt: skip

_logger = logging.getLogger("agent_loop")  # the exceptions that become tool results
_logger.addHandler(logging.NullHandler())  # silent unless the application configures logging

# --- Limits -----------------------------------------------------------------------
# Every number of the seed, once. Each limit is inclusive: the limit passes, one more fails.

MAX_AGENT_STEPS: Final = 64  # model requests in one run, request_sequence_start included
MAX_INITIAL_MESSAGES: Final = 4096  # starting messages
MAX_STEP_CHUNKS: Final = 1024  # chunks in one step, of every kind (thinking deltas too)
MAX_STEP_TEXT: Final = 65_536  # code points of streamed text in one step; of thinking, apart
MAX_ASSISTANT_BLOCKS: Final = 1024  # blocks in one terminal response, as returned
MAX_ARGUMENT_DEPTH: Final = 32  # containers nested in one call's arguments: {} has depth 1
MAX_ARGUMENT_VALUES: Final = 257  # values in one call's arguments, the root included
MAX_ARGUMENT_SLOTS: Final = 256  # object fields plus array slots in one call's arguments
MAX_ARGUMENT_TEXT: Final = 4096  # code points across the keys and strings of one call's arguments


# --- The loop ---------------------------------------------------------------------


def run_agent_loop(
    *,
    messages: Iterable[Message],
    model: Model,
    tools: ToolRegistry,
    max_steps: int,
    signal: Optional[Signal] = None,
    request_sequence_start: int = 0,
    tool_concurrency: int = 1,
    # The signal is Any, as in Tool.execute: a function may annotate it threading.Event.
    before_tool_call: Optional[Callable[[ToolCall, Any], Optional[str]]] = None,
) -> Generator[Event, None, RunResult]:
    """Validates the options, snapshots the run, and returns its event generator.

    The generator yields the run's events and returns its ``RunResult``; at most
    ``MAX_INITIAL_MESSAGES + 1`` messages are read, now. Raises TypeError or ValueError for a
    bad option, now; a bad starting transcript is a ``failed`` run (INVALID_TRANSCRIPT).
    """
    # ValidateOptions. Seed: "Invalid construction throws before an EventStream is returned."
    _check_options(model, tools, max_steps, request_sequence_start, tool_concurrency)
    if before_tool_call is not None and not callable(before_tool_call):
        raise TypeError(
            "before_tool_call must be None or a function (call, signal) -> Optional[str], "
            f"got {type(before_tool_call).__name__}"
        )
    signal = _checked_signal(signal)
    try:  # any iterable (typing aside), read at call time
        items = iter(messages)
    except TypeError:
        kind = type(messages).__name__
        raise TypeError(f"messages must be an iterable of messages, got {kind}") from None
    # SnapshotRun. Reading one past the cap tells "too many" without reading forever.
    start: List[object] = list(itertools.islice(items, MAX_INITIAL_MESSAGES + 1))
    options = (max_steps, signal, request_sequence_start, tool_concurrency, before_tool_call)
    return _Run(start, model, ToolRegistry(tools), *options).drive()


@dataclass(eq=False)
class _Run:
    """One run's private state: its snapshots, the transcript it owns, its one event counter."""

    start: dataclasses.InitVar[List[object]]
    model: Model
    tools: ToolRegistry
    max_steps: int
    signal: Signal
    request_sequence_start: int
    tool_concurrency: int
    before_tool_call: Optional[Callable[[ToolCall, Any], Optional[str]]]

    def __post_init__(self, start: List[object]) -> None:
        self.specs = self.tools.specs()
        self.steps = 0
        self.next_sequence = 0
        self.usage: Optional[Usage] = None  # the sum over the responses appended so far
        self.ended = False  # whether a call of an ends_run tool returned (beyond the seed)
        self.output: JSON = None  # what the first such call returned
        # SnapshotRun, now at call time: the generator's body would wait for next().
        self.transcript = _Transcript()  # stays empty when the start is invalid
        self.invalid_start: Optional[_RunFailure] = None
        try:
            self.transcript = _Transcript.from_start(start)
        except _Problem as problem:
            self.invalid_start = _RunFailure("INVALID_TRANSCRIPT", str(problem))

    def drive(self) -> Generator[Event, None, RunResult]:
        """SnapshotRun to Finish: where events leave the run and failures become its result."""
        steps = self._run_steps()
        try:
            while True:
                try:
                    event = next(steps)
                except StopIteration as done:
                    result: RunResult = done.value
                    break
                yield event
                # After every event: the consumer ran, and may have set the signal.
                self._check_signal()
        except _Cancelled:
            result = self._result("cancelled")
        except _RunFailure as failure:
            error = RunError(failure.code, failure.message, failure.__cause__)
            result = self._result("failed", error=error)
        finally:
            # Cancelled, or closed by the consumer: the waiting phase ends, and its stream.
            steps.close()
        return (yield from self._finish(result))

    def _run_steps(self) -> Generator[Event, None, RunResult]:
        """From SnapshotRun to Completed or MaxSteps; the other endings raise."""
        if self.invalid_start is not None:
            # SnapshotRun --> Failed: invalid transcript (the inputs decide before the signal).
            raise self.invalid_start
        self._check_signal()  # SnapshotRun --> Cancelled
        yield from self._emit_accepted()  # SnapshotRun --> EmitAccepted --> OpenModel
        for step in range(1, self.max_steps + 1):
            request, stream = self._open_model(step)  # OpenModel --> ReadChunks
            response, message = yield from self._read_chunks(request, stream)
            self._append_assistant(message)  # ReadChunks --> AppendAssistant
            if response.stop_reason == "stop":
                # AppendAssistant --> Completed: stopReason stop
                return self._result("completed", final_text=text_from_assistant(message))
            # AppendAssistant --> ExecuteTools: stopReason toolCall
            yield from self._execute_tools(request, message)
            if self.ended:
                # ExecuteTools --> Completed, beyond the seed: a call of an ends_run tool
                # returned, and every call of the response has its result.
                text = text_from_assistant(message)
                return self._result("completed", final_text=text, output=self.output)
            # ExecuteTools --> OpenModel: continuation allowed, while steps remain
        # ExecuteTools --> MaxSteps. Seed: "If the current step equals maxSteps, the
        # loop emits run.finished with status maxSteps and does not open another
        # model request." The budget counts model turns, not tool calls.
        return self._result("maxSteps", max_steps=self.max_steps)

    def _emit_accepted(self) -> Generator[Event, None, None]:
        """EmitAccepted: one message.accepted event per starting message."""
        for message in self.transcript.messages:
            yield self._event("message.accepted", message=message)

    def _open_model(self, step: int) -> Tuple[ModelRequest, Generator[ModelChunk, None, Any]]:
        """OpenModel: snapshots the transcript into request-NNN and calls model.stream() once."""
        # Seed: "requestSnapshot() freezes the current transcript and creates
        # request-001, request-002, and so on, offset by requestSequenceStart".
        number = self.request_sequence_start + step
        request = ModelRequest(request_id(number), tuple(self.transcript.messages), self.specs)
        self.steps = step
        stream = self._call(
            "MODEL_STREAM_ERROR", "model.stream()", self.model.stream, request, self.signal
        )
        if not isinstance(stream, collections.abc.Generator):
            raise _RunFailure(
                "MODEL_PROTOCOL_ERROR",
                f"model.stream() must return a generator, got {type(stream).__name__}",
            )
        return request, stream

    def _read_chunks(
        self, request: ModelRequest, stream: Generator[ModelChunk, None, Any]
    ) -> Generator[Event, None, Tuple[ModelResponse, AssistantMessage]]:
        """ReadChunks: a model.chunk per valid chunk; returns the checked response and message."""
        # Seed: "The loop calls model.stream() and drains its event channel before
        # awaiting the terminal response." The generator returns the response.
        streamed = _StreamedBlocks(request.id)
        try:
            while True:
                try:
                    chunk = next(stream)
                except StopIteration as done:
                    self._check_signal()
                    response = done.value
                    break
                except (KeyboardInterrupt, SystemExit):
                    raise
                except BaseException as error:
                    self._check_signal()
                    raise _failure("MODEL_STREAM_ERROR", "the model's stream", error) from error
                self._check_signal()
                streamed.add(chunk)
                yield self._event("model.chunk", request_id=request.id, chunk=chunk)
            return self._checked_response(request, response, streamed)
        except _Problem as problem:
            # ReadChunks --> Failed: protocol failure. Seed: "Contradiction or excess
            # becomes a failed MODEL_PROTOCOL_ERROR result".
            raise _RunFailure("MODEL_PROTOCOL_ERROR", str(problem)) from None
        finally:
            # A model whose cleanup fails cannot replace the step's outcome.
            with contextlib.suppress(Exception):
                stream.close()

    def _checked_response(
        self, request: ModelRequest, response: object, streamed: _StreamedBlocks
    ) -> Tuple[ModelResponse, AssistantMessage]:
        """ReadChunks --> AppendAssistant: only a terminal response that keeps every rule."""
        if type(response) is not ModelResponse:
            missing = " (did its generator end without `return ModelResponse(...)`?)"
            raise _Problem(
                f"the model's stream returned a {type(response).__name__}, not a "
                f"ModelResponse{missing if response is None else ''}"
            )
        _check_request_id(response.request_id, request.id)
        if not _is_id(response.id):
            raise _Problem(f"a response id must be a non-empty str, got {response.id!r}")
        # Exactly a str first: `in` would run the value's own __eq__.
        if not _is_text(response.stop_reason) or response.stop_reason not in _STOP_REASONS:
            raise _Problem(
                f"unknown stop reason {response.stop_reason!r} (expected one of {_STOP_REASONS})"
            )
        # Seed: "... and 1024 assistant blocks."
        if len(response.content) > MAX_ASSISTANT_BLOCKS:
            raise _Problem(f"the response holds more than {MAX_ASSISTANT_BLOCKS} blocks")
        provider_id = response.provider_response_id
        if provider_id is not None and not _is_id(provider_id):
            raise _Problem(f"a provider response id must be None or a str, got {provider_id!r}")
        message = AssistantMessage(
            assistant_message_id(response.id), response.content, response.usage, provider_id
        )
        self.transcript.check(message)
        calls = _tool_calls(message)
        # Seed: "Tool calls are forbidden in a stop response."
        if response.stop_reason == "stop" and calls:
            raise _Problem("a stop response holds tool calls")
        if response.stop_reason == "toolCall" and not calls:
            raise _Problem("a toolCall response holds no tool call")
        streamed.require_agreement(response.content)
        return response, message

    def _append_assistant(self, message: AssistantMessage) -> None:
        """AppendAssistant: the message joins the transcript, and its usage the run's sum."""
        self.transcript.append(message)
        if message.usage is None:
            self.usage = _UNKNOWN_USAGE  # whatever the sum was, and without building a Usage
        elif self.usage is None:
            self.usage = message.usage  # the first response
        else:
            self.usage = self.usage + message.usage

    def _execute_tools(self, request: ModelRequest, message: AssistantMessage) -> Iterator[Event]:
        """ExecuteTools: every call in assistant order; returns once each has its result."""
        if self.tool_concurrency > 1:  # opt-in, beyond the seed: groups of calls at once
            for group in self._groups(_tool_calls(message)):
                yield from self._execute_group(request, group)
            return
        for call in _tool_calls(message):
            refusal = self._refusal(call)  # consent, before the call's tool.started
            # Seed: "For each call, it emits tool.started, awaits executeToolCall(),
            # appends the linked Tool-result message, then emits tool.finished."
            yield self._event("tool.started", request_id=request.id, tool_call=call)
            # The tool runs in a copy of the context that resumed the run after tool.started.
            context = contextvars.copy_context()
            outcome = refusal or self._execute(call, context)
            if not isinstance(outcome, _Outcome):  # a tool that reports its progress
                outcome = yield from self._report(request, call, context, outcome)
            yield self._finished(request, call, outcome)
        # Seed: "After the complete Tool batch, validateTranscript() proves that every
        # call has one later matching result." By construction: each got one, or it raised.

    def _execute(
        self, call: ToolCall, context: contextvars.Context
    ) -> Union[_Outcome, Generator[JSON, None, _Outcome]]:
        """ExecuteTools: runs one call in ``context``, in whichever thread, and looks at the
        signal after; returns its outcome, or the generator of a tool that reports progress."""
        outcome: Union[_Outcome, Generator[JSON, None, _Outcome]] = self._call(
            "TOOL_PHASE_ERROR", call, context.run, _run_tool, self.tools, call, self.signal
        )
        return outcome

    def _report(
        self,
        request: ModelRequest,
        call: ToolCall,
        context: contextvars.Context,
        steps: Generator[JSON, None, _Outcome],
    ) -> Generator[Event, None, _Outcome]:
        """ExecuteTools, in the loop's thread: a tool.progress per value a tool yields; looks at
        the signal after each, and closes the tool when the run ends; returns its outcome."""
        try:
            while True:
                step = self._call("TOOL_PHASE_ERROR", call, context.run, _next_step, steps)
                if isinstance(step, _Outcome):
                    return step
                yield self._progress(request, call, step)
        finally:
            context.run(steps.close)

    def _progress(
        self, request: ModelRequest, call: ToolCall, progress: JSON, at: Optional[float] = None
    ) -> Event:
        """ExecuteTools: one tool.progress of a running call, yielded by its tool ``at``
        (beyond the seed)."""
        return self._event(
            "tool.progress", at, request_id=request.id, tool_call_id=call.id, progress=progress
        )

    def _finished(self, request: ModelRequest, call: ToolCall, outcome: _Outcome) -> Event:
        """ExecuteTools: a call's result joins the transcript; returns its tool.finished."""
        # Linked by construction: derived from the call, whose result id was checked free.
        self.transcript.append(outcome.result)
        # The keys are absent unless set, so that a run without them logs as the seed's.
        flags: Dict[str, bool] = {}
        if outcome.refused:
            flags["refused"] = True
        elif outcome.ends_run:
            flags["ends_run"] = True
            if not self.ended:  # the first in assistant order
                self.ended, self.output = True, outcome.output
        return self._event(
            "tool.finished",
            request_id=request.id,
            tool_call=call,
            tool_result=outcome.result,
            at=outcome.time,
            **flags,
        )

    def _finish(self, result: RunResult) -> Generator[Event, None, RunResult]:
        """Finish: run.finished, always the last event, carries the result the run returns."""
        yield self._event("run.finished", result=result)
        return result

    def _event(self, type: EventType, at: Optional[float] = None, **payload: Any) -> Event:
        """The run's next event, which happened ``at`` (None: as it is yielded); the one
        counter numbers it."""
        # Seed: "Each event receives the next integer sequence; no component owns a
        # separate counter."
        event = Event(self.next_sequence, type, MappingProxyType(payload), at)
        self.next_sequence += 1
        return event

    def _call(
        self,
        code: FailureCode,
        what: Union[str, ToolCall],
        function: Callable[..., _T],
        *arguments: Any,
    ) -> _T:
        """Calls code the loop does not own (``what``: see _failure); cancellation wins over
        what it returns or raises."""
        try:
            value = function(*arguments)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as error:
            self._check_signal()  # cancellation wins over the error
            raise _failure(code, what, error) from error
        self._check_signal()
        return value

    def _check_signal(self) -> None:
        """Any phase --> Cancelled: signal aborts."""
        if self.signal.is_set():
            raise _Cancelled

    def _result(self, status: RunStatus, **fields: Any) -> RunResult:
        """The run's result: its transcript as it is now, complete messages only."""
        fields.update(request_sequence_start=self.request_sequence_start, usage=self.usage)
        return RunResult(status, tuple(self.transcript.messages), self.steps, **fields)

    # --- Opt-in, beyond the seed: consent (before_tool_call) and tools at once -------

    def _refusal(self, call: ToolCall) -> Optional[_Outcome]:
        """ExecuteTools, consent: the error result that refuses a call, or None to run it."""
        if self.before_tool_call is None:
            return None
        what = f"before_tool_call for tool call {call.id!r}"
        answer = self._call("TOOL_PHASE_ERROR", what, self.before_tool_call, call, self.signal)
        if answer is not None and not _is_text(answer):
            raise _RunFailure(
                "TOOL_PHASE_ERROR",
                f"{what} returned {_a(type(answer).__name__)}: it must return None "
                "(run the call) or a str (refuse it, the str being the call's error result)",
            )
        if answer is None:
            return None
        return _Outcome(_tool_result(call, answer, True), refused=True, time=None)

    def _groups(self, calls: List[ToolCall]) -> List[List[ToolCall]]:
        """ExecuteTools: maximal runs of consecutive calls; a sequential tool's call alone."""
        groups: List[List[ToolCall]] = []
        together = False  # whether the last group takes the next call
        for call in calls:
            # An unknown tool's call joins its group: it only gets its error result.
            tool = self.tools.get(call.name)
            alone = tool is not None and tool.sequential
            if together and not alone:
                groups[-1].append(call)
            else:
                groups.append([call])
            together = not alone
        return groups

    def _execute_group(
        self, request: ModelRequest, group: List[ToolCall]
    ) -> Generator[Event, None, None]:
        """ExecuteTools, a group on threads: progress as it comes, results in assistant order;
        returns once all have."""
        # Consent, for each call of the group before any of them is scheduled.
        refusals = [self._refusal(call) for call in group]
        # In a group, tool.started means scheduled: all of them come first, in order.
        contexts = []
        for call in group:
            yield self._event("tool.started", request_id=request.id, tool_call=call)
            contexts.append(contextvars.copy_context())  # as a sequential call's
        # What the workers report, in the order they report it: a call's progress values (with
        # the time its tool yielded each), then its outcome, or what ended it (an exception).
        # A JSON value is neither.
        updates: queue.SimpleQueue[Tuple[int, Any, float]] = queue.SimpleQueue()

        def execute(call: ToolCall, index: int) -> None:  # in a worker thread
            context = contexts[index]
            try:
                self._check_signal()  # a call not yet begun never begins once the signal is set
                step = self._execute(call, context)
                if not isinstance(step, _Outcome):  # a tool that reports its progress
                    steps = step
                    try:
                        step = self._call("TOOL_PHASE_ERROR", call, context.run, _next_step, steps)
                        while not isinstance(step, _Outcome):
                            updates.put((index, step, time.time()))
                            step = self._call(
                                "TOOL_PHASE_ERROR", call, context.run, _next_step, steps
                            )
                    finally:
                        context.run(steps.close)
                updates.put((index, step, 0.0))
            except BaseException as error:  # the loop's thread raises it in the call's turn
                updates.put((index, error, 0.0))

        pool = ThreadPoolExecutor(min(self.tool_concurrency, len(group)), "agent_loop-tool")
        futures: List[Future[None]] = []
        ended: Dict[int, Union[_Outcome, BaseException]] = {}
        try:
            for index, (call, refusal) in enumerate(zip(group, refusals)):
                if refusal is not None:
                    ended[index] = refusal
                    continue
                try:
                    futures.append(pool.submit(execute, call, index))
                except Exception as error:  # a thread that cannot start
                    self._check_signal()  # cancellation wins over the error
                    what = f"starting tool call {call.id!r}"
                    raise _failure("TOOL_PHASE_ERROR", what, error) from error
            for index, call in enumerate(group):
                while index not in ended:
                    # Bounded by the running tools: each worker's last update is its end.
                    who, update, at = updates.get()
                    self._check_signal()  # once the loop sees the signal, nothing more joins
                    if isinstance(update, (_Outcome, BaseException)):
                        ended[who] = update
                    else:
                        yield self._progress(request, group[who], update, at)
                outcome = ended[index]
                if isinstance(outcome, BaseException):
                    raise outcome  # _Cancelled if the signal came first
                yield self._finished(request, call, outcome)
        finally:
            # ExecuteTools --> Cancelled (or failed, or closed), once the running tools have
            # returned. A group keeps the sequential loop's rule: once the loop sees the
            # signal, no more results join, so a result completed behind a call still
            # running is dropped and its call stays open, as that call does (the log is
            # the same whatever the timing, and replays). Seed: "appends no fabricated
            # result".
            for future in futures:
                future.cancel()  # a call not yet begun; one running cannot be cancelled
            pool.shutdown(wait=True)


class _Outcome(NamedTuple):  # a tuple: built once per call, cheaper than a dataclass
    """How one call ended: its result, whether consent refused it or it ends the run (and
    then what its tool returned), and when its tool returned (None: when it is reported)."""

    result: ToolResultMessage
    refused: bool = False
    ends_run: bool = False
    output: JSON = None
    time: Optional[float] = None


def _next_step(steps: Generator[JSON, None, _Outcome]) -> Union[JSON, _Outcome]:
    """A call's next progress value, or its outcome once its tool has returned."""
    try:
        return next(steps)
    except StopIteration as done:
        outcome: _Outcome = done.value
        return outcome


class _RunFailure(Exception):
    """A run-time failure; the driver turns it into a ``failed`` RunResult, in one place."""

    def __init__(self, code: FailureCode, message: str) -> None:
        super().__init__(message)
        self.code: FailureCode = code
        self.message = message


def _failure(code: FailureCode, what: Union[str, ToolCall], error: BaseException) -> _RunFailure:
    """The failure that an exception from code the loop does not own becomes; ``what`` is its
    name, or the call whose tool phase raised (named only then: a call's name costs)."""
    name = what if isinstance(what, str) else f"tool call {what.id!r}"
    return _RunFailure(code, f"{name} raised {_describe(error)}")


class _Cancelled(Exception):
    """The signal was set; the driver turns it into a ``cancelled`` RunResult, in one place."""


class _Problem(Exception):
    """What a check found wrong; the phase that ran the check decides what it becomes."""


def _check_options(
    model: object, tools: object, max_steps: object, start: object, concurrency: object
) -> None:
    """ValidateOptions: raises TypeError or ValueError for an option the run cannot take."""
    # Seed: "maxSteps must be a positive safe integer no greater than MAX_AGENT_STEPS."
    steps = _checked_int("max_steps", max_steps, f"in 1..{MAX_AGENT_STEPS}", 1, MAX_AGENT_STEPS)
    first = _checked_int("request_sequence_start", start, "", -math.inf, math.inf)
    # Seed: "Optional requestSequenceStart must keep the requested range within the same ceiling."
    if first < 0 or first + steps > MAX_AGENT_STEPS:
        raise ValueError(
            f"request_sequence_start must be >= 0 with request_sequence_start + max_steps "
            f"<= {MAX_AGENT_STEPS}, got {start} + {max_steps}"
        )
    # No upper bound: a group of tools at once never uses more threads than it has calls.
    _checked_int("tool_concurrency", concurrency, ">= 1", 1, math.inf)
    if not callable(getattr(model, "stream", None)):
        raise TypeError(f"model must have a callable stream(), got {type(model).__name__}")
    if not isinstance(tools, ToolRegistry):
        raise TypeError(f"tools must be a ToolRegistry, got {type(tools).__name__}")


def _checked_int(name: str, value: object, rule: str, low: float, high: float) -> int:
    """ValidateOptions: an int (not a bool) in low..high, or an error naming it and the rule."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be an int {rule}, got {value}")
    return value


def _checked_signal(signal: object) -> Signal:
    """ValidateOptions for the signal: returns it, or a new Event nobody sets for None."""
    if signal is None:
        return threading.Event()
    accepted = "a threading.Event, or an object with is_set() and wait(timeout)"
    if not (callable(getattr(signal, "is_set", None)) and callable(getattr(signal, "wait", None))):
        raise TypeError(f"signal must be {accepted}, got {type(signal).__name__}")
    # asyncio.Event has both, but a tool that waited on it would get a coroutine back.
    if inspect.iscoroutinefunction(signal.wait):  # type: ignore[attr-defined]
        raise TypeError(
            f"signal must be {accepted}; {type(signal).__name__}.wait() is a coroutine "
            "(an asyncio.Event?): use threading.Event, and set it from your event loop"
        )
    return cast(Signal, signal)


# The ids the loop derives, public so that a companion derives them as the loop does. Seed:
# "requestSnapshot() ... creates request-001, request-002, and so on"; its test derives the
# others: response R's message is "message-" + R's id, call C's result "tool-result-" + C's.


def request_id(number: int) -> str:
    """Returns the id of request number ``number``: ``request_id(1) == "request-001"``."""
    return f"request-{number:03d}"


def request_number(id: str) -> Optional[int]:
    """Returns the ``n`` in 1..MAX_AGENT_STEPS whose ``request_id(n)`` is ``id``, else None."""
    return _REQUEST_NUMBERS.get(id)


_REQUEST_NUMBERS: Final = {request_id(number): number for number in range(1, MAX_AGENT_STEPS + 1)}


def assistant_message_id(response_id: str) -> str:
    """Returns the id of the assistant message that the loop builds from a response."""
    return "message-" + response_id


def response_id_of(message_id: str) -> Optional[str]:
    """Returns the response id that ``assistant_message_id()`` made ``message_id`` of, or None."""
    if message_id.startswith("message-") and message_id != "message-":
        return message_id[len("message-") :]
    return None


def tool_result_id(call_id: str) -> str:
    """Returns the id of the tool-result message linked to a tool call."""
    return "tool-result-" + call_id


# --- The transcript, the stream, and their checks ---------------------------------


def _is_text(value: object) -> TypeGuard[str]:
    """Exactly a str: a subclass could redefine ==, len() or hash() under the loop's checks."""
    return type(value) is str


def _is_id(value: object) -> bool:
    """Ids and names are non-empty strings."""
    return _is_text(value) and value != ""


# The checks ask for exactly the IR's classes: a subclass could redefine == or unfreeze.


def _check_block(block: object) -> None:
    """Raises _Problem unless an assistant block keeps the IR's rules."""
    if type(block) is TextBlock:
        if not _is_text(block.text):
            raise _Problem(_wrong_block_field("a text block", "text", "a str", block.text))
    elif type(block) is ThinkingBlock:
        _checked_thinking(block)
    elif type(block) is not ToolCall:
        hint = ": wrap text in TextBlock(...)" if isinstance(block, str) else ""
        raise _Problem(
            f"{_a(type(block).__name__)} is not a TextBlock, ThinkingBlock or ToolCall{hint}"
        )
    elif not _is_id(block.id):
        raise _Problem(f"a tool call's id must be a non-empty str, got {block.id!r}")
    elif not _is_id(block.name):
        raise _Problem(f"tool call {block.id!r}: name must be a non-empty str, got {block.name!r}")
    else:
        try:
            _check_arguments(block)
        except _Problem as problem:  # the same problem, saying which call has it
            raise _Problem(f"tool call {block.id!r}: {problem}") from None


def _checked_thinking(block: ThinkingBlock) -> ThinkingBlock:
    """Returns a thinking block that keeps the IR's rules, or raises _Problem naming the field."""
    kind = "a thinking block"
    if not _is_text(block.thinking):
        raise _Problem(_wrong_block_field(kind, "thinking", "a str", block.thinking))
    if block.signature is not None and not _is_text(block.signature):
        raise _Problem(_wrong_block_field(kind, "signature", "None or a str", block.signature))
    if type(block.redacted) is not bool:
        raise _Problem(_wrong_block_field(kind, "redacted", "a bool", block.redacted))
    # A redacted block's opaque data is its signature: without it nothing can be sent back.
    if block.redacted and (block.thinking != "" or not block.signature):
        raise _Problem(
            "a redacted thinking block holds its data as a non-empty 'signature' and its "
            f"'thinking' is \"\": got thinking {_quoted(block.thinking)}, signature "
            f"{_quoted(block.signature)}"
        )
    return block


_QUOTE: Final = reprlib.Repr()
# A rejected value quoted in an error (which a log keeps): recognisable, never a megabyte.
_QUOTE.maxstring = _QUOTE.maxother = 160
_quoted: Final = _QUOTE.repr


def _a(noun: str) -> str:
    """The noun with its indefinite article, for an error message: "an int", "a str"."""
    return ("an " if noun[:1].lower() in ("a", "e", "i", "o") else "a ") + noun  # "a user"


def _wrong_block_field(kind: str, name: str, expected: str, value: object) -> str:
    """Says which field of a block has the wrong type: expected and given."""
    given = f"{_quoted(value)} ({type(value).__name__})"
    return f"{kind}: field {name!r} must be {expected}, got {given}"


def _checked_message(message: object) -> Message:
    """Returns a message that keeps the IR's rules on its own (linkage aside), or _Problem."""
    if type(message) is UserMessage:
        if not _is_text(message.content):
            raise _Problem(_wrong_field(message, "content", "a str"))
    elif type(message) is AssistantMessage:
        if message.usage is not None and type(message.usage) is not Usage:
            raise _Problem(_wrong_field(message, "usage", "None or a Usage"))
        for block in message.content:
            try:
                _check_block(block)
            except _Problem as problem:  # the same problem, saying which message has it
                raise _Problem(f"message {message.id!r}: {problem}") from None
    elif type(message) is ToolResultMessage:
        if not _is_id(message.tool_call_id):
            raise _Problem(_wrong_field(message, "tool_call_id", "a non-empty str"))
        if not _is_id(message.tool_name):
            raise _Problem(_wrong_field(message, "tool_name", "a non-empty str"))
        if not _is_text(message.content):
            raise _Problem(_wrong_field(message, "content", "a str"))
        if type(message.is_error) is not bool:
            raise _Problem(_wrong_field(message, "is_error", "a bool"))
    else:
        hint = " (read a dict with message_from_dict())" if isinstance(message, dict) else ""
        raise _Problem(f"{_a(type(message).__name__)} is not a message{hint}")
    if not _is_id(message.id):
        raise _Problem(_wrong_field(message, "id", "a non-empty str"))
    return message


def _wrong_field(message: Message, name: str, expected: str) -> str:
    """Says which field of a message has the wrong type: expected and given."""
    where = f"{_a(message.role)} message" if name == "id" else f"message {message.id!r}"
    return _wrong_block_field(where, name, expected, getattr(message, name))


class _Transcript:
    """The run's transcript, indexed so that a check costs what the message holds. Valid: unique
    message and tool-call ids, each result answering an open call of an earlier assistant
    message, with the same tool name, once. Complete: no call left open."""

    def __init__(self) -> None:
        self.messages: List[Message] = []
        self._message_ids: Set[str] = set()
        self._call_ids: Set[str] = set()
        self._open_calls: Dict[str, ToolCall] = {}

    @classmethod
    def from_start(cls, start: List[object]) -> _Transcript:
        """SnapshotRun: the starting messages as a transcript; _Problem unless complete."""
        # Seed: "Initial messages are capped at 4096 ... and validated as a complete transcript."
        if len(start) > MAX_INITIAL_MESSAGES:
            raise _Problem(f"more than {MAX_INITIAL_MESSAGES} starting messages")
        transcript = cls()
        for message in start:
            transcript.append(transcript.check(message))
        if transcript._open_calls:
            raise _Problem(f"tool calls without a result: {list(transcript._open_calls)}")
        return transcript

    def check(self, unchecked: object) -> Message:
        """Returns the message if well formed, its ids free and its linkage kept; else _Problem."""
        message = _checked_message(unchecked)
        if message.id in self._message_ids:
            raise _Problem(
                f"message id {message.id!r} is used twice (an assistant message's id is "
                '"message-" + its response id, a tool result\'s is "tool-result-" + its '
                "call id: response ids and tool-call ids must be unique across the whole "
                "transcript)"
            )
        if isinstance(message, AssistantMessage):
            new_ids: Set[str] = set()
            for call in message.content:
                # Not _tool_calls(): a loop costs less than a list, and most hold no call.
                if not isinstance(call, ToolCall):
                    continue
                if call.id in self._call_ids or call.id in new_ids:
                    raise _Problem(
                        f"tool call id {call.id!r} is used twice (tool-call ids must be "
                        "unique across the whole transcript)"
                    )
                if tool_result_id(call.id) in self._message_ids:
                    raise _Problem(
                        f'the result id of tool call {call.id!r} ("tool-result-" + its id) '
                        "is already taken by another message (message ids must be unique "
                        "across the whole transcript)"
                    )
                new_ids.add(call.id)
        elif isinstance(message, ToolResultMessage):
            # Seed: "every call has one later matching result".
            answered = self._open_calls.get(message.tool_call_id)
            if answered is None:
                raise _Problem(f"tool result {message.id!r} answers no open tool call")
            if answered.name != message.tool_name:
                raise _Problem(
                    f"tool result {message.id!r} names tool {message.tool_name!r}, "
                    f"but its call names {answered.name!r}"
                )
        return message

    def append(self, message: Message) -> None:
        """Adds a message that keeps linkage, and indexes its ids and open calls."""
        self.messages.append(message)
        self._message_ids.add(message.id)
        if isinstance(message, AssistantMessage):
            for call in message.content:
                if isinstance(call, ToolCall):  # as in check(), no list built
                    self._call_ids.add(call.id)
                    self._open_calls[call.id] = call
        elif isinstance(message, ToolResultMessage):
            del self._open_calls[message.tool_call_id]


def _check_request_id(request_id: object, active: str) -> None:
    """Seed: "Request IDs must match the active request." (chunks and responses alike)"""
    if not _is_text(request_id) or request_id != active:
        given = _quoted(request_id)
        if not _is_text(request_id):  # a str subclass's repr reads like the id it imitates
            given += f" ({type(request_id).__name__})"
        raise _Problem(
            f"{given} is not the active request {active!r}: every chunk's and the "
            "response's request_id must be the request's id"
        )


# A normalised block: text as a str, thinking as a ThinkingBlock of its text alone, a call.
_Normalized: TypeAlias = Union[str, "ThinkingBlock", "ToolCall"]


class _StreamedBlocks:
    """What one step has streamed so far, checked chunk by chunk against the step's limits."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.items: List[_Normalized] = []
        self.text = 0
        self.thinking = 0

    def add(self, chunk: object) -> None:
        """Checks one streamed chunk and keeps its text, its thinking or its tool call."""
        # Seed: "The loop caps one step at 1024 chunks, 65,536 Unicode code points of text,
        # and 1024 assistant blocks." (blocks: _checked_response) Every chunk counts;
        # thinking is counted apart from text, against the same number.
        if len(self.items) == MAX_STEP_CHUNKS:
            raise _Problem(f"the model streamed more than {MAX_STEP_CHUNKS} chunks")
        item: _Normalized
        if type(chunk) is TextDelta:
            self.text += _streamed_length(chunk.text, "text", self.text)
            item = chunk.text
        elif type(chunk) is ThinkingDelta:
            self.thinking += _streamed_length(chunk.thinking, "thinking", self.thinking)
            item = ThinkingBlock(chunk.thinking)
        elif type(chunk) is ToolCallChunk:
            if type(chunk.tool_call) is not ToolCall:
                raise _Problem(
                    f"a tool-call chunk carries a {type(chunk.tool_call).__name__}, not a ToolCall"
                )
            _check_block(chunk.tool_call)
            item = chunk.tool_call
        else:
            raise _Problem(
                f"the model streamed a {type(chunk).__name__}, not a TextDelta, ThinkingDelta "
                "or ToolCallChunk"
            )
        _check_request_id(chunk.request_id, self.request_id)
        self.items.append(item)

    def require_agreement(
        self, content: Sequence[Union[TextBlock, ThinkingBlock, ToolCall]]
    ) -> None:
        """Raises _Problem unless the terminal content agrees with the stream."""
        # Seed: "The resulting normalized block sequences must agree in content and
        # order; raw text-chunk segmentation may differ." (A signature never streams.)
        terminal = _normalized(b.text if isinstance(b, TextBlock) else b for b in content)
        streamed = _normalized(self.items)
        if terminal == streamed:
            return
        if not self.items:
            raise _Problem(
                "the model streamed nothing, but its terminal response holds "
                f"{len(content)} block(s): a model must yield a chunk for each block it "
                "returns (a TextDelta per text, a ThinkingDelta per thinking, a "
                "ToolCallChunk per tool call)"
            )
        # They differ: at a pair of blocks, or where the shorter one ends.
        pairs = enumerate(zip(streamed, terminal))
        index = next((i for i, (s, t) in pairs if s != t), min(len(streamed), len(terminal)))
        raise _Problem(
            "the streamed chunks and the terminal response disagree at normalised block "
            f"{index}: streamed {_shortened(streamed, index)}, "
            f"terminal {_shortened(terminal, index)}"
        )


def check_stream_agreement(chunks: Iterable[ModelChunk], response: ModelResponse) -> None:
    """Checks a step's chunks against its terminal response as the loop does: they carry its
    ``request_id``, keep the step's limits, and agree with its content once normalised (its
    own fields are not checked). Raises TypeError if ``response`` is not a ModelResponse, and
    ValueError naming the chunk or block that breaks a rule."""
    if type(response) is not ModelResponse:
        raise TypeError(f"response must be a ModelResponse, got {type(response).__name__}")
    streamed = _StreamedBlocks(response.request_id)
    try:
        for chunk in chunks:
            streamed.add(chunk)
        streamed.require_agreement(response.content)
    except _Problem as problem:
        raise ValueError(str(problem)) from None


def _streamed_length(text: object, kind: str, so_far: int) -> int:
    """A text or thinking chunk's code points, if the step keeps within MAX_STEP_TEXT."""
    if not _is_text(text):
        raise _Problem(f"a {kind} chunk's {kind} must be a str, got {type(text).__name__}")
    length = len(text)
    if so_far + length > MAX_STEP_TEXT:
        raise _Problem(f"the model streamed more than {MAX_STEP_TEXT} code points of {kind}")
    return length


def _normalized(items: Iterable[_Normalized]) -> List[_Normalized]:
    """Coalesces adjacent text and adjacent thinking (no signature); each bounds the others."""
    # Seed: "the loop coalesces adjacent streamed text deltas and adjacent terminal
    # text blocks, using Tool calls as boundaries." Thinking is coalesced as text is.
    normalized: List[_Normalized] = []
    # Empty text and thinking carry nothing, and are no boundary either (a redacted block).
    carrying = (
        item
        for item in items
        if item != "" and not (type(item) is ThinkingBlock and item.thinking == "")
    )
    for kind, run in itertools.groupby(carrying, key=type):
        if kind is str:
            normalized.append("".join(cast("Iterable[str]", run)))
        elif kind is ThinkingBlock:
            thinking = "".join(block.thinking for block in cast("Iterable[ThinkingBlock]", run))
            normalized.append(ThinkingBlock(thinking))
        else:
            normalized.extend(run)
    return normalized


def _shortened(blocks: List[_Normalized], index: int) -> str:
    """One normalised block as a disagreement quotes it; "nothing" past the end."""
    if index == len(blocks):
        return "nothing"
    block = blocks[index]
    # A dataclass's repr would be shortened to its class name, or cut before its id.
    if isinstance(block, ThinkingBlock):
        return "thinking " + reprlib.repr(block.thinking)
    if isinstance(block, ToolCall):
        arguments = reprlib.repr(block.plain_arguments())
        return f"tool call {reprlib.repr(block.id)} to {reprlib.repr(block.name)} with {arguments}"
    return reprlib.repr(block)


# --- Model boundary ---------------------------------------------------------------


class _Shape:
    """A value with a JSON form, whose fields _FIELDS lists (in "Reading JSON back")."""

    def to_dict(self) -> Dict[str, Any]:
        """Returns the seed's JSON shape of this object (plain dicts and lists)."""
        data: Dict[str, Any] = {}
        for key, name, _, optional in _FIELDS[type(self)]:
            value = getattr(self, name)
            # An optional key is written unless the field holds its default.
            if not optional or value != getattr(type(self), name):
                data[key] = _plain(value)
        return data


def _plain(value: object) -> Any:
    """A value as JSON holds it: a shape as its dict, frozen JSON as plain dicts and lists."""
    if isinstance(value, _Shape):
        return value.to_dict()
    return [_plain(item) for item in value] if type(value) is tuple else _thawed(value)


def _thawed(value: object) -> Any:
    """Returns a fresh plain copy (dicts and lists) of frozen JSON."""
    if type(value) is MappingProxyType:
        return {key: _thawed(item) for key, item in value.items()}
    if type(value) is tuple:
        return [_thawed(item) for item in value]
    return value


# Usage's fields, in order, and their JSON keys.
_USAGE_KEYS: Final = (("input_tokens", "input"), ("output_tokens", "output"),
    ("cache_read_tokens", "cacheRead"), ("cache_write_tokens", "cacheWrite"),
    ("reasoning_tokens", "reasoning"))  # fmt: skip


@dataclass(frozen=True)
class ModelRequest(_Shape):
    """One step's request: a frozen snapshot of the transcript and the tools' specs."""

    id: str
    messages: Tuple[Message, ...]
    tools: Tuple[ToolSpec, ...]
    __hash__ = None  # type: ignore[assignment]  # its tools hold schema mappings


@dataclass(frozen=True)
class TextDelta(_Shape):
    """A streamed piece of assistant text."""

    request_id: str
    text: str
    type: ClassVar[Literal["text"]] = "text"


@dataclass(frozen=True)
class ThinkingDelta(_Shape):
    """A streamed piece of the model's thinking (a signature comes only in the response)."""

    request_id: str
    thinking: str
    type: ClassVar[Literal["thinking"]] = "thinking"


@dataclass(frozen=True)
class ToolCallChunk(_Shape):
    """A streamed, complete tool call."""

    request_id: str
    tool_call: ToolCall
    type: ClassVar[Literal["toolCall"]] = "toolCall"


ModelChunk = Union[TextDelta, ThinkingDelta, ToolCallChunk]


StopReason = Literal["stop", "toolCall"]
"""Why a model stopped: ``stop`` (its answer is complete) or ``toolCall`` (run the calls)."""
_STOP_REASONS: Final = get_args(StopReason)


@dataclass(frozen=True)
class Usage(_Shape):
    """The tokens one response (or, summed, one run) cost, as the provider reported them: each
    an int >= 0, or None when the provider did not say. ``a + b`` sums field by field, None on
    either side giving None. Raises TypeError for a field neither None nor an int, ValueError
    for a negative one."""

    input_tokens: Optional[int] = None
    output_tokens: Optional[int] = None
    cache_read_tokens: Optional[int] = None
    cache_write_tokens: Optional[int] = None
    reasoning_tokens: Optional[int] = None

    def __post_init__(self) -> None:
        for name, _ in _USAGE_KEYS:
            value = getattr(self, name)
            if value is not None and type(value) is not int:
                raise TypeError(f"Usage {name} must be None or an int, got {type(value).__name__}")
            if value is not None and value < 0:
                raise ValueError(f"Usage {name} must be None or an int >= 0, got {value}")

    def __add__(self, other: object) -> Usage:
        if type(other) is not Usage:
            return NotImplemented
        pairs = ((getattr(self, name), getattr(other, name)) for name, _ in _USAGE_KEYS)
        return Usage(*(None if a is None or b is None else a + b for a, b in pairs))


_UNKNOWN_USAGE: Final = Usage()  # a sum with an unknown part: every field unknown


@dataclass(frozen=True)
class ModelResponse(_Shape):
    """A model's terminal response to one request, and what it cost (None: unknown)."""

    id: str
    request_id: str
    content: Sequence[Union[TextBlock, ThinkingBlock, ToolCall]]  # stored as a tuple
    stop_reason: StopReason
    usage: Optional[Usage] = None
    provider_response_id: Optional[str] = None  # the provider's own id of the answer, if any

    def __post_init__(self) -> None:
        object.__setattr__(self, "content", tuple(self.content))


# How often code that blocks on something other than the signal (a socket, a queue, a lock, a
# child process) looks at the signal: a cancel is seen within this. One name for every file.
WATCH_SECONDS: Final = 0.05


class Signal(Protocol):
    """What the loop needs of a cancellation signal: threading.Event's reading side (any object
    with these two methods, if its ``wait`` blocks: not a coroutine)."""

    def is_set(self) -> bool:
        """True once cancellation was requested."""

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks until cancellation is requested or the timeout passes."""


class Model(Protocol):
    """A model: ``stream()`` returns a generator that yields chunks and returns its response."""

    def stream(
        self, request: ModelRequest, signal: Any
    ) -> Generator[ModelChunk, None, ModelResponse]:
        """Streams the answer to one request; the generator's return value is the response."""


# --- Tools ------------------------------------------------------------------------

_SCHEMA_ENGINE: Final = "agent_loop_schema"  # the companion that enforces JSON Schema in full
_SCHEMA_TYPES: Final = ("object", "string", "number", "integer", "boolean", "array", "null")
# What the value of a keyword the core checks must be: the words an error says, and the test.
_VALUE_KINDS: Final[Dict[str, Tuple[str, Callable[[Any], bool]]]] = {
    "schema": ("a JSON Schema object", lambda value: isinstance(value, (bool, Mapping))),
    "schema map": ("an object of schemas", lambda value: isinstance(value, Mapping)),
    "names": ("an array of property names", lambda v: _is_array(v) and all(map(_is_text, v))),
    "array": ("an array", lambda value: _is_array(value)),
    "type": (f"one of {', '.join(_SCHEMA_TYPES)}, or a non-empty array of distinct ones",
             lambda value: _type_names(value) is not None),
}  # fmt: skip
# The keywords of JSON Schema 2020-12 that the core checks by itself, and their kinds.
_CORE_KEYWORDS: Final = {"type": "type", "properties": "schema map", "required": "names",
    "additionalProperties": "schema", "items": "schema", "enum": "array"}  # fmt: skip
# The others that agent_loop_schema.py enforces: without it, a schema with one is refused,
# so that no call is checked looser than its schema says. Any other keyword is JSON that
# refuses nothing here (annotations, and what the engine leaves to the tool as well).
_ENGINE_KEYWORDS: Final = frozenset(
    ("const", "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "$ref", "minimum",
     "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "minItems",
     "maxItems", "minProperties", "maxProperties")
)  # fmt: skip
_LISTED_PROBLEMS: Final = 10  # violations an argument error lists; it counts the others


@dataclass(frozen=True)
class ToolSpec(_Shape):
    """What a model is told about a tool: its name, description and (frozen) parameter schema;
    checked as a Tool is."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    __hash__ = None  # type: ignore[assignment]  # it holds a mapping

    def __post_init__(self) -> None:
        parameters = _checked_tool_fields("ToolSpec", self.name, self.description, self.parameters)
        object.__setattr__(self, "parameters", parameters)

    def __reduce__(self) -> Tuple[Any, ...]:
        return _reduce_to_plain_fields(self)


@dataclass(frozen=True)
class Tool:
    """A named effect the model may request, with a JSON Schema for its arguments.

    ``parameters`` (a root ``{"type": "object", ...}``) is checked and frozen now, and each
    call's arguments against it before the tool runs. ``execute(arguments, signal)`` gets a
    fresh plain dict and the run's signal; it returns the result's value, or is a generator
    function whose yields are the call's ``tool.progress`` events and whose return is that
    value. ``sequential=True``: with ``tool_concurrency`` > 1, its calls run alone.
    ``ends_run=True``: a call of it that returns (not a ToolError, not refused) ends the run
    ``completed`` once the response's calls all have results; ``RunResult.output`` is what the
    first such call returned. Raises TypeError or ValueError, naming the field, for a bad Tool.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    # The signal is Any: a function that annotates it threading.Event fits (contravariance).
    execute: Callable[[Dict[str, Any], Any], object]
    sequential: bool = False  # given by keyword: with tool_concurrency > 1, runs alone
    # Given by keyword; None is read as no hints, so that the field is always a mapping.
    annotations: Mapping[str, Any] = None  # type: ignore[assignment]
    ends_run: bool = False  # given by keyword: a call that returns ends the run, completed
    # agent_loop_schema.py when the schema holds a keyword only it enforces, else None: the
    # core's own checks are the whole of the schema, as fast as before the engine moved out.
    _engine: Any = field(default=None, init=False, repr=False, compare=False)
    __hash__ = None  # type: ignore[assignment]  # it holds a mapping

    def __post_init__(self) -> None:
        parameters = _checked_tool_fields("Tool", self.name, self.description, self.parameters)
        _check_execute(self.name, self.execute)
        for flag in ("sequential", "ends_run"):
            value: object = getattr(self, flag)  # typing aside: it comes from the caller
            if type(value) is not bool:
                kind = type(value).__name__
                raise TypeError(f"Tool {self.name!r}: {flag} must be a bool, got {kind}")
        annotations: object = {} if self.annotations is None else self.annotations
        if not isinstance(annotations, Mapping) or not all(
            isinstance(key, str) for key in annotations
        ):
            raise TypeError(
                f"Tool {self.name!r}: annotations must be a mapping with str keys, or None, "
                f"got {annotations!r:.200}"
            )
        object.__setattr__(self, "parameters", parameters)
        object.__setattr__(self, "annotations", MappingProxyType(dict(annotations)))
        if _uses_engine(parameters):  # then Tool() found the engine, or it refused the schema
            object.__setattr__(self, "_engine", _companion(_SCHEMA_ENGINE))

    def __reduce__(self) -> Tuple[Any, ...]:
        return _reduce_to_plain_fields(self)

    def spec(self) -> ToolSpec:
        """Returns what a model request tells the model about this tool."""
        return ToolSpec(self.name, self.description, self.parameters)

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., object],
        *,
        name: Optional[str] = None,
        description: Optional[str] = None,
        sequential: bool = False,
    ) -> Tool:
        """Builds a Tool from a function that takes the arguments as keyword parameters, its
        schema from the type hints, by the companion agent_loop_functions.py (ImportError
        without it). Raises TypeError, naming the parameter, for what it cannot describe."""
        functions = _companion("agent_loop_functions")
        if functions is None:
            raise ImportError(
                "Tool.from_function needs agent_loop_functions.py beside agent_loop.py"
            )
        name, description, parameters, execute = functions.tool_fields(fn, name, description)
        return cls(name, description, parameters, execute, sequential=sequential)


def _checked_tool_fields(
    kind: str, name: object, description: object, parameters: object
) -> Mapping[str, Any]:
    """Checks a Tool's or ToolSpec's name and description; returns its frozen parameters."""
    if not _is_id(name):
        raise TypeError(f"{kind} name must be a non-empty str, got {name!r}")
    if not _is_text(description):
        raise TypeError(
            f"{kind} {name!r}: description must be a str, got {type(description).__name__}"
        )
    where = f"{kind} {name!r} parameters"
    engine = _companion(_SCHEMA_ENGINE)
    if engine is None:
        schema = _frozen_schema(parameters, where, 0)
    else:  # the whole schema is the engine's: checked, frozen, its $refs resolved
        schema = engine.frozen_schema(parameters, where)
    if not isinstance(schema, Mapping) or schema.get("type") != "object":
        raise ValueError(
            f'{kind} {name!r} parameters must have "type": "object": '
            "a tool's arguments are always a JSON object"
        )
    return schema


def _companion(name: str) -> Any:
    """The companion module ``name``, loaded by name when it is beside this file, else None."""
    try:  # by name, so that a copy of this file alone still type-checks and runs
        return importlib.import_module(name)
    except ModuleNotFoundError as missing:
        if missing.name != name:
            raise  # the companion is there, and something it imports is not
        return None


def _check_execute(name: str, execute: object) -> None:
    """A tool's execute must accept (arguments, signal): a TypeError now, not at each call."""
    if not callable(execute):
        raise TypeError(f"Tool {name!r}: execute must be callable, got {type(execute).__name__}")
    try:
        signature = inspect.signature(execute)
    except (TypeError, ValueError):  # some builtins have no signature: trust them
        return
    try:
        signature.bind(None, None)
    except TypeError:
        raise TypeError(
            f"Tool {name!r}: execute{signature} cannot be called as execute(arguments, "
            "signal); give it two positional parameters, e.g. def execute(arguments, signal)"
        ) from None


def _frozen_schema(value: object, where: str, depth: int, kind: Optional[str] = "schema") -> Any:
    """A schema of the core's keywords, or a keyword value of a _VALUE_KINDS kind (None: any
    JSON), checked and frozen, without agent_loop_schema.py."""
    if kind == "schema" and not isinstance(value, (bool, Mapping)):
        raise TypeError(f"{where} must be a JSON Schema object, got {type(value).__name__}")
    if kind is not None and not _VALUE_KINDS[kind][1](value):
        raise ValueError(f"{where} must be {_VALUE_KINDS[kind][0]}, got {_quoted(value)}")
    if value is None or type(value) in (str, bool, int) or _is_finite_float(value):
        return value
    # Deeper than arguments may be, it would describe no call: schemas and containers count.
    if depth > MAX_ARGUMENT_DEPTH:
        raise ValueError(f"{where} nests deeper than {MAX_ARGUMENT_DEPTH} levels")
    if isinstance(value, Mapping):
        frozen = {}
        for key, item in value.items():
            if type(key) is not str:
                raise TypeError(f"{where} has {_a(type(key).__name__)} key {_quoted(key)}")
            if kind == "schema" and key in _ENGINE_KEYWORDS:
                raise ValueError(
                    f"{where}.{key} needs agent_loop_schema.py: copy it beside agent_loop.py "
                    "(alone, the core checks type, properties, required, additionalProperties, "
                    "items and enum)"
                )
            inner = "schema" if kind == "schema map" else None
            if kind == "schema" and not (key == "items" and _is_array(item)):
                inner = _CORE_KEYWORDS.get(key)  # the array form of old items is not enforced
            deeper = depth + (inner in (None, "schema"))
            frozen[key] = _frozen_schema(item, f"{where}.{key}", deeper, inner)
        return MappingProxyType(frozen)
    if _is_array(value):
        return tuple(
            _frozen_schema(item, f"{where}[{index}]", depth + 1, None)
            for index, item in enumerate(cast(Sequence[Any], value))
        )
    raise TypeError(f"{where} holds {_quoted(value)}, which is not JSON")


def _is_array(value: object) -> bool:
    return isinstance(value, (list, tuple))


def _is_finite_float(value: object) -> bool:
    return type(value) is float and math.isfinite(value)


def _type_names(value: object) -> Optional[Sequence[object]]:
    """The names a type keyword gives, if they are distinct names of JSON types, else None."""
    names = cast(Sequence[object], value) if _is_array(value) and value else [value]
    return names if len(names) == sum(name in names for name in _SCHEMA_TYPES) else None


def _core_problems(value: Any, schema: Any, path: str, found: List[str]) -> None:
    """Every way a frozen JSON value fails a schema of the core's keywords, to ``found``."""
    if schema is True:
        return
    if schema is False:
        found.append(f"{path} is not allowed (its schema is false)")
        return
    kind = _JSON_TYPES[type(value)]
    if "type" in schema and schema["type"] != kind:  # a name or a tuple of names
        names = (schema["type"],) if type(schema["type"]) is str else schema["type"]
        # A JSON integer is also a JSON number; bool is neither (it is not an int here).
        if kind not in names and (kind != "integer" or "number" not in names):
            found.append(f"{path} must be {' or '.join(names)}, got {kind}")
    if "enum" in schema and not any(_same_json(value, option) for option in schema["enum"]):
        found.append(f"{path} must be one of {json.dumps(_thawed(schema['enum']))}")
    if kind == "object":
        properties = schema.get("properties", {})
        for name in schema.get("required", ()):
            if name not in value:
                found.append(f"{path} is missing the required property {name!r}")
        # Beside patternProperties (not enforced), additionalProperties is not enforced.
        others = True
        if "additionalProperties" in schema and "patternProperties" not in schema:
            others = schema["additionalProperties"]
        for name, item in value.items():
            if name in properties:
                _core_problems(item, properties[name], f"{path}.{name}", found)
            elif others is False:
                found.append(f"{path} has the unexpected property {name!r}")
            else:
                _core_problems(item, others, f"{path}.{name}", found)
    elif kind == "array" and "items" in schema and type(schema["items"]) is not tuple:
        prefix = schema.get("prefixItems")  # not enforced: items applies after it
        for index in range(len(prefix) if type(prefix) is tuple else 0, len(value)):
            _core_problems(value[index], schema["items"], f"{path}[{index}]", found)


def _uses_engine(schema: object) -> bool:
    """Whether a frozen schema holds a keyword that only agent_loop_schema.py enforces."""
    if isinstance(schema, Mapping):
        return not _ENGINE_KEYWORDS.isdisjoint(schema) or any(map(_uses_engine, schema.values()))
    return type(schema) is tuple and any(map(_uses_engine, schema))


def _argument_problems(tool: Tool, arguments: Mapping[str, JSON]) -> str:
    """What an argument error says: every violation, the first _LISTED_PROBLEMS of them
    named and the others counted; "" when the arguments pass."""
    found: List[str] = []
    if tool._engine is None:  # the schema holds no keyword beyond the core's: no $ref
        _core_problems(arguments, tool.parameters, "$", found)
    else:  # which tells $refs that loop
        found = tool._engine.problems(arguments, tool.parameters)
    if not found:
        return ""
    more = len(found) - _LISTED_PROBLEMS
    return "; ".join(found[:_LISTED_PROBLEMS]) + (f"; and {more} more" if more > 0 else "")


class ToolRegistry:
    """The tools a run may execute, by unique name; raises as ``register()`` does."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: Dict[str, Tool] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        """Adds a tool. Raises TypeError for a non-Tool, ValueError for a taken name."""
        if not isinstance(tool, Tool):
            raise TypeError(f"register() takes a Tool, got {type(tool).__name__}")
        if tool.name in self._tools:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Optional[Tool]:
        """Returns the tool with this name, or None."""
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        return iter(tuple(self._tools.values()))

    def specs(self) -> Tuple[ToolSpec, ...]:
        """Returns what a model request tells the model about each tool, in registration order."""
        return tuple(tool.spec() for tool in self._tools.values())


def execute_tool_call(registry: ToolRegistry, call: ToolCall, signal: Signal) -> ToolResultMessage:
    """Runs one tool call and returns its linked result message: a ``str`` is the content
    verbatim, other JSON is encoded. What goes wrong with the call (an unknown tool, bad
    arguments, an exception, a value that is not JSON) is an ``is_error=True`` result saying
    what. Raises TypeError for a call whose id or name is not a non-empty str."""
    if not (_is_id(call.id) and _is_id(call.name)):
        raise TypeError(
            f"a call's id and name must be non-empty str, got {call.id!r} and {call.name!r}: "
            "no result message could be linked to it"
        )
    try:
        _check_arguments(call)
    except _Problem as problem:
        return _tool_result(call, f"invalid arguments for tool {call.name!r}: {problem}", True)
    context = contextvars.copy_context()
    started = context.run(_run_tool, registry, call, signal)
    if isinstance(started, _Outcome):
        return started.result
    step: Union[JSON, _Outcome] = None
    while not isinstance(step, _Outcome):  # a tool that reports progress: it is dropped
        step = context.run(_next_step, started)
    return step.result


def _run_tool(
    registry: ToolRegistry, call: ToolCall, signal: Signal
) -> Union[_Outcome, Generator[JSON, None, _Outcome]]:
    """Runs a call whose arguments are plain bounded JSON, in the context it is given: its
    outcome, or for a tool that reports progress, the generator of its progress (a plain
    copy of each value) that returns the outcome."""
    tool = registry.get(call.name)
    if tool is None:
        known = ", ".join(registered.name for registered in registry) or "none"
        return _Outcome(
            _tool_result(call, f"unknown tool {call.name!r} (available: {known})", True)
        )
    problems = _argument_problems(tool, call.arguments)
    if problems:
        content = f"invalid arguments for tool {call.name!r}: {problems}"
        return _Outcome(_tool_result(call, content, True))
    _CURRENT_TOOL_CALL.set(call)  # in the call's own context: see current_tool_call()
    try:
        value = tool.execute(call.plain_arguments(), signal)
    except Exception as error:
        return _raised(call, error)
    if type(value) is GeneratorType:  # exactly: an ABC's isinstance costs every call
        return _progress_of(tool, call, value)
    return _returned(tool, call, value)


def _progress_of(
    tool: Tool, call: ToolCall, steps: Generator[object, None, object]
) -> Generator[JSON, None, _Outcome]:
    """A tool that reports progress: a plain copy of each value it yields; returns its
    outcome. Closed, it closes the tool's generator, which cleans up."""
    with contextlib.closing(steps):
        while True:
            try:
                value = next(steps)
            except StopIteration as done:
                return _returned(tool, call, done.value)
            except Exception as error:
                return _raised(call, error)
            try:
                progress: JSON = json.loads(_encoded(value))
            except Exception as error:
                content = f"tool {call.name!r} yielded progress that is not JSON: {error}"
                return _Outcome(_tool_result(call, content, True), time=time.time())
            yield progress


def _raised(call: ToolCall, error: Exception) -> _Outcome:
    """The outcome of a call whose tool raised: a ToolError's own words, or what it raised."""
    if isinstance(error, ToolError):
        content = error.message  # as the tool chose them, and not logged
    else:
        _logger.warning(
            "tool %r raised; the model gets an error result", call.name, exc_info=error
        )
        content = f"tool {call.name!r} raised {_describe(error)}"
    return _Outcome(_tool_result(call, content, True), time=time.time())


def _returned(tool: Tool, call: ToolCall, value: object) -> _Outcome:
    """The outcome of a call whose tool returned ``value``: a str verbatim, other JSON
    encoded, anything else an error result."""
    returned = time.time()
    # The outcomes of a call that returns are given by position: a NamedTuple's keywords
    # cost about 1% more instructions in a tool-heavy run (docs/performance.md).
    if _is_text(value):
        result = _tool_result(call, value, False)
        return _Outcome(result, False, tool.ends_run, value, returned)
    try:
        content = _encoded(value)
    except Exception as error:  # json.dumps runs the value's own code (a dict subclass's items())
        _logger.warning("tool %r returned a value that is not JSON", call.name, exc_info=True)
        content = f"tool {call.name!r} returned a value that is not JSON: {error}"
        return _Outcome(_tool_result(call, content, True), time=returned)
    # What an ends_run tool returned is the run's output, as JSON reads it back: a plain copy.
    output = json.loads(content) if tool.ends_run else None
    result = _tool_result(call, content, False)
    return _Outcome(result, False, tool.ends_run, output, returned)


def _encoded(value: object) -> str:
    """A value as the compact JSON text of a result (ValueError or TypeError if not JSON)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


_CURRENT_TOOL_CALL: Final[contextvars.ContextVar[Optional[ToolCall]]] = contextvars.ContextVar(
    "agent_loop.current_tool_call", default=None
)


def current_tool_call() -> Optional[ToolCall]:
    """Returns the ToolCall whose tool is executing in this thread (context), or None."""
    return _CURRENT_TOOL_CALL.get()


class ToolError(Exception):
    """Raised by a tool to tell the model what went wrong, in its own words: the call's result
    is is_error=True with content exactly ``message``, and it is not logged."""

    def __init__(self, message: str) -> None:
        if not _is_text(message):
            raise TypeError(f"ToolError message must be a str, got {type(message).__name__}")
        super().__init__(message)
        self.message = message


def _tool_result(call: ToolCall, content: str, is_error: bool) -> ToolResultMessage:
    """Builds the result message linked to a call (its id is derived from the call's)."""
    return ToolResultMessage(tool_result_id(call.id), call.id, call.name, content, is_error)


def _describe(error: BaseException) -> str:
    """Names an exception and its message, for a readable result or RunError."""
    try:
        message = str(error)
    except Exception:  # an exception whose message cannot be read is still named
        message = ""
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


# --- Bounded plain JSON -----------------------------------------------------------


class _ArgumentBudget:
    """What one call's arguments have spent of the seed's bounds so far."""

    def __init__(self) -> None:
        self.values = 0
        self.text = 0
        self.mutable_containers: Set[int] = set()

    def spend_text(self, text: str) -> None:
        # Seed: "4096 Unicode code points across keys/string values": len() of a str.
        self.text += len(text)
        if self.text > MAX_ARGUMENT_TEXT:
            raise _Problem(f"arguments hold more than {MAX_ARGUMENT_TEXT} code points of text")


def _check_arguments(call: ToolCall) -> None:
    """Raises _Problem unless the call's arguments are plain bounded JSON."""
    # Seed: "Tool arguments must be plain bounded JSON ... These checks occur before
    # a Tool effect." The constructor measured them, and says so in _plain_json.
    if call._plain_json:
        return
    _frozen_arguments(call.arguments)  # raises, naming the bound that was broken
    # They pass now, so they changed since the call was built: not frozen, not accepted.
    raise _Problem("arguments were not plain bounded JSON when the call was built")


def _frozen_arguments(arguments: object) -> Mapping[str, JSON]:
    """Checks that arguments are a plain bounded JSON object; returns a frozen copy."""
    if not isinstance(arguments, (dict, MappingProxyType)):
        raise _Problem(f"arguments must be a JSON object, got {type(arguments).__name__}")
    try:
        return cast("Mapping[str, JSON]", _frozen_json(arguments, 0, _ArgumentBudget()))
    except _Problem:
        raise
    except Exception as error:  # a mapping whose own code raises (its items(), say)
        raise _Problem(f"arguments cannot be read: {_describe(error)}") from None


def _frozen_json(value: object, depth: int, budget: _ArgumentBudget) -> JSON:
    """Walks one value once: checks the seed's bounds for plain JSON and freezes a copy."""
    # Seed: "at most 257 values including the root, 256 object fields plus array
    # slots". Every value but the root fills exactly one slot, so values == slots + 1
    # and counting values enforces both limits at once.
    budget.values += 1
    if budget.values > MAX_ARGUMENT_VALUES:
        raise _Problem(
            f"arguments hold more than {MAX_ARGUMENT_VALUES} values "
            f"({MAX_ARGUMENT_SLOTS} object fields plus array slots)"
        )
    if type(value) is str:
        budget.spend_text(value)
        return value
    if value is None or type(value) is bool or type(value) is int:
        return value
    if type(value) is float:
        if not math.isfinite(value):
            raise _Problem(f"arguments hold {value}, which is not a JSON number")
        return value
    if type(value) not in (dict, MappingProxyType, list, tuple):
        raise _Problem(f"arguments hold {_a(type(value).__name__)}, which is not plain JSON")
    # Seed: "depth 32". Checked before descending, so depth 100,000 costs 33 frames.
    if depth == MAX_ARGUMENT_DEPTH:
        raise _Problem(f"arguments nest containers deeper than {MAX_ARGUMENT_DEPTH}")
    # No dict or list reachable twice: no aliasing, no cycle. Frozen tuples and mappings
    # may be shared (CPython shares the empty tuple); a cycle through them meets a dict.
    if type(value) is dict or type(value) is list:
        if id(value) in budget.mutable_containers:
            raise _Problem("arguments reach the same dict or list twice (shared or cyclic)")
        budget.mutable_containers.add(id(value))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen_json(item, depth + 1, budget) for item in value)
    frozen: Dict[str, JSON] = {}
    for key, item in cast("Mapping[object, object]", value).items():  # a dict or a proxy
        if type(key) is not str:
            raise _Problem(f"arguments hold {_a(type(key).__name__)} key, not a string")
        budget.spend_text(key)
        frozen[key] = _frozen_json(item, depth + 1, budget)
    return MappingProxyType(frozen)


def _reduce_to_plain_fields(value: Any) -> Tuple[Any, ...]:
    """``__reduce__`` of a value with read-only mappings: rebuilt from plain copies."""
    fields = dataclasses.fields(value)
    return (type(value), tuple(_thawed(getattr(value, item.name)) for item in fields if item.init))


def _same_json(left: object, right: object) -> bool:
    """JSON equality at any depth: unlike ==, True is not 1 and 1 is not 1.0, in keys too."""
    if left is right:
        return True
    # Not isinstance(value, typing.Mapping), which costs ten times as much.
    if isinstance(left, (dict, MappingProxyType)) and isinstance(right, (dict, MappingProxyType)):
        typed_keys = {(type(key), key) for key in left}  # so that True and 1 are two keys
        return typed_keys == {(type(key), key) for key in right} and all(
            _same_json(left[key], right[key]) for key in left
        )
    if isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
        return len(left) == len(right) and all(map(_same_json, left, right))
    return type(left) is type(right) and left == right


# The JSON type of each Python type that plain or frozen JSON holds.
_JSON_TYPES: Final = {
    type(None): "null", bool: "boolean", int: "integer", float: "number", str: "string",
    list: "array", tuple: "array", dict: "object", MappingProxyType: "object",
}  # fmt: skip


# --- Message IR -------------------------------------------------------------------

JSON: TypeAlias = Union[bool, int, float, str, Sequence["JSON"], Mapping[str, "JSON"], None]
"""A JSON value. Frozen JSON (as a ToolCall holds it) uses read-only mappings and tuples."""


@dataclass(frozen=True)
class TextBlock(_Shape):
    """Assistant text."""

    text: str
    type: ClassVar[Literal["text"]] = "text"


@dataclass(frozen=True)
class ThinkingBlock(_Shape):
    """The model's thinking, kept so that it can be sent back exactly: ``signature`` is the
    provider's proof, if any; a redacted block's opaque data is its ``signature``, its
    ``thinking`` ``""``."""

    thinking: str
    signature: Optional[str] = None
    redacted: bool = False
    type: ClassVar[Literal["thinking"]] = "thinking"


@dataclass(frozen=True, eq=False)
class ToolCall(_Shape):
    """A request from the model to run one tool: ``arguments`` frozen (read-only mappings,
    tuples), or kept as given if not plain bounded JSON (the run then fails with
    MODEL_PROTOCOL_ERROR before any tool runs). Equal when id, name and arguments are, as JSON
    (``True`` is not ``1``)."""

    id: str
    name: str
    arguments: Mapping[str, JSON]
    # True only when __post_init__ froze them, within every bound: the run trusts this flag.
    _plain_json: bool = field(init=False, repr=False, compare=False)
    type: ClassVar[Literal["toolCall"]] = "toolCall"

    def __post_init__(self) -> None:
        # Normalises only; the run decides where the call enters it (_check_arguments).
        try:
            arguments = _frozen_arguments(self.arguments)
        except Exception:  # not plain bounded JSON, or a mapping whose own code raised
            if type(self.arguments) is MappingProxyType:
                # A plain copy, so that read-only means checked; raises if it cannot be read.
                object.__setattr__(self, "arguments", dict(self.arguments))
            object.__setattr__(self, "_plain_json", False)
            return
        object.__setattr__(self, "arguments", arguments)
        object.__setattr__(self, "_plain_json", True)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ToolCall):
            return NotImplemented
        return (
            self.id == other.id
            and self.name == other.name
            and _same_json(self.arguments, other.arguments)
        )

    def __hash__(self) -> int:
        return hash((self.id, self.name))  # equal calls share these; arguments are unhashable

    def __reduce__(self) -> Tuple[Any, ...]:
        return _reduce_to_plain_fields(self)

    def plain_arguments(self) -> Dict[str, Any]:
        """Returns a fresh plain copy of the arguments (dicts and lists), for ``json.dumps``."""
        return cast("Dict[str, Any]", _thawed(self.arguments))


@dataclass(frozen=True)
class UserMessage(_Shape):
    """A message from the user."""

    id: str
    content: str
    role: ClassVar[Literal["user"]] = "user"


@dataclass(frozen=True)
class AssistantMessage(_Shape):
    """A complete assistant response: its blocks in the model's order, the usage of the
    response it came from (None: unknown) and the provider's own id of that response (None:
    none given), neither of which is sent back to a model.
    """

    id: str
    content: Sequence[Union[TextBlock, ThinkingBlock, ToolCall]]  # stored as a tuple
    usage: Optional[Usage] = None
    provider_response_id: Optional[str] = None  # its response's, not sent back to a model
    role: ClassVar[Literal["assistant"]] = "assistant"

    def __post_init__(self) -> None:
        object.__setattr__(self, "content", tuple(self.content))


@dataclass(frozen=True)
class ToolResultMessage(_Shape):
    """The result of one tool call, linked to it by ``tool_call_id``."""

    id: str
    tool_call_id: str
    tool_name: str
    content: str
    is_error: bool
    role: ClassVar[Literal["toolResult"]] = "toolResult"


Message = Union[UserMessage, AssistantMessage, ToolResultMessage]


def text_from_assistant(message: AssistantMessage) -> str:
    """Returns the text blocks of an assistant message, concatenated (no thinking)."""
    return "".join(block.text for block in message.content if isinstance(block, TextBlock))


def _tool_calls(message: AssistantMessage) -> List[ToolCall]:
    """Returns the tool-call blocks of an assistant message, in assistant order."""
    return [block for block in message.content if isinstance(block, ToolCall)]


# --- Events and results -----------------------------------------------------------

RunStatus = Literal["completed", "cancelled", "maxSteps", "failed"]
"""How a run ended."""
FailureCode = Literal[
    "INVALID_TRANSCRIPT", "MODEL_PROTOCOL_ERROR", "MODEL_STREAM_ERROR", "TOOL_PHASE_ERROR"
]
"""Why a run failed (see the table of failure codes in docs/runs.md)."""
EventType = Literal[
    "message.accepted",
    "model.chunk",
    "tool.started",
    "tool.progress",
    "tool.finished",
    "run.finished",
]
"""The kinds of event a run yields: the seed's five, and tool.progress (only from a tool that
yields progress)."""
_RUN_STATUSES: Final = get_args(RunStatus)
_FAILURE_CODES: Final = get_args(FailureCode)
_EVENT_TYPES: Final = get_args(EventType)


@dataclass(frozen=True)
class RunError(_Shape):
    """Why a run failed: a failure code and a readable message; ``exception`` is what raised
    (if anything did), for the caller, and not part of ``to_dict()`` or of equality."""

    code: FailureCode
    message: str
    exception: Optional[BaseException] = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class RunResult(_Shape):
    """How a run ended, and the transcript it ended with (complete messages only); ``usage``
    sums the usage of the responses this run appended. ``output``: what the ``ends_run``
    tool that ended a ``completed`` run returned, as JSON reads it back (a str as it is);
    None for every other ending. ``awaiting``: the calls a durable run left awaiting a
    person's decision (the loop itself leaves it empty)."""

    status: RunStatus
    messages: Tuple[Message, ...]
    steps: int
    final_text: Optional[str] = None
    max_steps: Optional[int] = None
    error: Optional[RunError] = None
    request_sequence_start: int = 0
    usage: Optional[Usage] = None
    output: Any = None  # Any: a companion (agent_loop_output) puts the caller's own type there
    awaiting: Tuple[ToolCall, ...] = ()
    __hash__ = None  # type: ignore[assignment]  # its output may be a mapping

    @property
    def next_request_sequence(self) -> int:
        """``request_sequence_start + steps``: the next run's ``request_sequence_start``."""
        return self.request_sequence_start + self.steps


@dataclass(frozen=True)
class Event:
    """One observable step of a run, numbered by the run's one counter; payload is read-only."""

    sequence: int
    type: EventType
    payload: Mapping[str, Any]
    # When what it reports happened (time.time()), where that is not when the run yielded it:
    # a tool.finished's is when its tool returned; a tool.progress's of calls at once, when
    # its tool yielded it.
    # None: as it is yielded (a reader takes its own clock then). Not part of equality, nor of
    # to_dict().
    time: Optional[float] = field(default=None, compare=False, repr=False)
    __hash__ = None  # type: ignore[assignment]  # it holds a mapping

    def __post_init__(self) -> None:
        # The loop builds each payload read-only: copying it again would cost every event.
        if type(self.payload) is not MappingProxyType:
            object.__setattr__(self, "payload", MappingProxyType(dict(self.payload)))

    def __reduce__(self) -> Tuple[Any, ...]:
        return _reduce_to_plain_fields(self)

    def to_dict(self) -> Dict[str, Any]:
        """Returns the seed's JSON shape of this object (plain dicts and lists)."""
        return {
            "sequence": self.sequence,
            "type": self.type,
            "payload": {
                _PAYLOAD_JSON_KEYS[key]: _plain(value) for key, value in self.payload.items()
            },
        }


# --- Reading JSON back ------------------------------------------------------------

# A reader takes a value as json.loads gives it and the path naming it, and returns what the
# field holds; its ValueError names the field.
_Reader: TypeAlias = Callable[[Any, str], Any]


class _Field(NamedTuple):
    """One JSON field of a shape: its key, its attribute, its reader (None: not read back, as a
    discriminator, or a shape the loop only writes), and whether it is optional (written
    unless it holds its default; read back absent or null as the default)."""

    key: str
    name: str
    read: Optional[_Reader] = None
    optional: bool = False


def message_from_dict(data: Dict[str, Any]) -> Message:
    """Reads a message from its ``to_dict()`` form; ValueError names a bad field."""
    return cast(Message, _read_message(data, "message"))


def event_from_dict(data: Dict[str, Any]) -> Event:
    """Reads an event from its ``to_dict()`` form; ValueError names a bad field."""
    event = _read_fields(_typed(data, dict, "event"), _EVENT_FIELDS, "event")
    payload = _read_fields(event["payload"], _PAYLOAD_FIELDS[event["type"]], "event.payload")
    return Event(event["sequence"], event["type"], MappingProxyType(payload))


def _typed(value: Any, kind: type, where: str) -> Any:
    """Returns value if it has exactly the JSON type ``kind``; a ValueError names it if not."""
    if type(value) is not kind:
        raise ValueError(f"{where} must be {_a(_JSON_TYPES[kind])}, got {type(value).__name__}")
    return value


def _read_fields(data: Dict[str, Any], fields: Sequence[_Field], where: str) -> Dict[str, Any]:
    """A JSON object's fields by attribute; an optional one absent or null is left out."""
    values: Dict[str, Any] = {}
    for key, name, read, optional in fields:
        if read is None or (optional and data.get(key) is None):
            continue
        if key not in data:
            raise ValueError(f"{where}.{key} is missing")
        values[name] = read(data[key], f"{where}.{key}")
    return values


def _of_type(kind: type) -> _Reader:
    """The reader of a value of exactly the JSON type ``kind``."""
    return lambda data, where: _typed(data, kind, where)


def _among(values: Tuple[str, ...]) -> _Reader:
    """The reader of a str that is one of ``values``."""

    def read(data: object, where: str) -> str:
        if _typed(data, str, where) not in values:
            raise ValueError(f"{where}: unknown value {data!r} (expected one of {values})")
        return cast(str, data)

    return read


def _one_of(key: str, shapes: Mapping[str, Any], only: str = "") -> _Reader:
    """The reader of an object whose ``key`` names its class in ``shapes`` (``only``: that one)."""
    discriminator = (_Field(key, key, _among(tuple(shapes))),)

    def read(data: object, where: str) -> Any:
        value = _typed(data, dict, where)
        kind = _read_fields(value, discriminator, where)[key]
        if only and kind != only:
            raise ValueError(
                f"{where} must be {_a(only)} {'block' if key == 'type' else 'message'}"
            )
        return _built(shapes[kind], value, where)

    return read


def _built(shape: Any, data: Dict[str, Any], where: str) -> Any:
    """The object of class ``shape`` that its JSON fields describe; ValueError if it is not one."""
    try:
        built = shape(**_read_fields(data, _FIELDS[shape], where))
        return _checked_thinking(built) if type(built) is ThinkingBlock else built
    except _Problem as problem:
        raise ValueError(f"{where}: {problem}") from None


def _shape_from_dict(shape: type) -> _Reader:
    """The reader of an object of class ``shape``, which has no discriminator."""
    return lambda data, where: _built(shape, _typed(data, dict, where), where)


def _arguments_from_dict(data: object, where: str) -> Dict[str, Any]:
    """A tool call's arguments, if they are plain bounded JSON."""
    try:
        _frozen_arguments(_typed(data, dict, where))
    except _Problem as problem:
        raise ValueError(f"{where}: {problem}") from None
    return cast(Dict[str, Any], data)


def _json_from_dict(data: object, where: str) -> JSON:
    """Any JSON value (no NaN or infinity), as it is."""
    try:
        _encoded(data)
    except (TypeError, ValueError) as problem:
        raise ValueError(f"{where} must be JSON: {problem}") from None
    return cast(JSON, data)


def _usage_from_dict(data: object, where: str) -> Usage:
    """A Usage: each count absent, null, or an int >= 0."""
    counts = _read_fields(_typed(data, dict, where), _FIELDS[Usage], where)
    for name, key in _USAGE_KEYS:
        if counts.get(name, 0) < 0:
            raise ValueError(f"{where}.{key} must be >= 0, got {counts[name]}")
    return Usage(**counts)


def _items(read: _Reader) -> _Reader:
    """The reader of a JSON array whose items ``read`` reads, as a tuple."""
    return lambda data, where: tuple(
        read(item, f"{where}[{index}]") for index, item in enumerate(_typed(data, list, where))
    )


# The tables come last: a class's fields name readers, and readers name classes. The classes
# of each discriminated shape, by the value of its "type" or "role":
_BLOCKS: Final = {"text": TextBlock, "thinking": ThinkingBlock, "toolCall": ToolCall}
_MESSAGES: Final = {"user": UserMessage, "assistant": AssistantMessage,
                    "toolResult": ToolResultMessage}  # fmt: skip
_CHUNKS: Final = {"text": TextDelta, "thinking": ThinkingDelta, "toolCall": ToolCallChunk}
_TEXT, _INT, _BOOL = _of_type(str), _of_type(int), _of_type(bool)
_read_message: Final = _one_of("role", _MESSAGES)
_read_call: Final = _one_of("type", _BLOCKS, "toolCall")
# Each shape's JSON fields, in the order to_dict() writes them.
_FIELDS: Final[Dict[type, Tuple[_Field, ...]]] = {
    ModelRequest: (_Field("id", "id"), _Field("messages", "messages"), _Field("tools", "tools")),
    TextDelta: (_Field("type", "type"), _Field("requestId", "request_id", _TEXT),
                _Field("text", "text", _TEXT)),
    ThinkingDelta: (_Field("type", "type"), _Field("requestId", "request_id", _TEXT),
                    _Field("thinking", "thinking", _TEXT)),
    ToolCallChunk: (_Field("type", "type"), _Field("requestId", "request_id", _TEXT),
                    _Field("toolCall", "tool_call", _read_call)),
    Usage: tuple(_Field(key, name, _INT, optional=True) for name, key in _USAGE_KEYS),
    ModelResponse: (_Field("id", "id"), _Field("requestId", "request_id"),
                    _Field("content", "content"), _Field("stopReason", "stop_reason"),
                    _Field("usage", "usage", optional=True),
                    _Field("providerResponseId", "provider_response_id", optional=True)),
    ToolSpec: (_Field("name", "name"), _Field("description", "description"),
               _Field("parameters", "parameters")),
    TextBlock: (_Field("type", "type"), _Field("text", "text", _TEXT)),
    ThinkingBlock: (_Field("type", "type"), _Field("thinking", "thinking", _TEXT),
                    _Field("thinkingSignature", "signature", _TEXT, optional=True),
                    _Field("redacted", "redacted", _BOOL, optional=True)),
    ToolCall: (_Field("type", "type"), _Field("id", "id", _TEXT), _Field("name", "name", _TEXT),
               _Field("arguments", "arguments", _arguments_from_dict)),
    UserMessage: (_Field("id", "id", _TEXT), _Field("role", "role"),
                  _Field("content", "content", _TEXT)),
    AssistantMessage: (_Field("id", "id", _TEXT), _Field("role", "role"),
                       _Field("content", "content", _items(_one_of("type", _BLOCKS))),
                       _Field("usage", "usage", _usage_from_dict, optional=True),
                       _Field("providerResponseId", "provider_response_id", _TEXT,
                              optional=True)),
    ToolResultMessage: (_Field("id", "id", _TEXT), _Field("role", "role"),
                        _Field("toolCallId", "tool_call_id", _TEXT),
                        _Field("toolName", "tool_name", _TEXT),
                        _Field("content", "content", _TEXT),
                        _Field("isError", "is_error", _BOOL)),
    RunError: (_Field("code", "code", _among(_FAILURE_CODES)),
               _Field("message", "message", _TEXT)),
    RunResult: (_Field("status", "status", _among(_RUN_STATUSES)),
                _Field("messages", "messages", _items(_read_message)),
                _Field("steps", "steps", _INT),
                _Field("finalText", "final_text", _TEXT, optional=True),
                _Field("maxSteps", "max_steps", _INT, optional=True),
                _Field("error", "error", _shape_from_dict(RunError), optional=True),
                _Field("requestSequenceStart", "request_sequence_start", _INT, optional=True),
                _Field("usage", "usage", _usage_from_dict, optional=True),
                _Field("output", "output", _json_from_dict, optional=True),
                _Field("awaiting", "awaiting", _items(_one_of("type", {"toolCall": ToolCall})),
                       optional=True)),
}  # fmt: skip
_EVENT_FIELDS: Final = (_Field("sequence", "sequence", _INT),
                        _Field("type", "type", _among(_EVENT_TYPES)),
                        _Field("payload", "payload", _of_type(dict)))  # fmt: skip
# For each event type, its payload's fields, named in Python as its Event holds them.
_PAYLOAD_FIELDS: Final[Dict[str, Tuple[_Field, ...]]] = {
    "message.accepted": (_Field("message", "message", _read_message),),
    "model.chunk": (_Field("requestId", "request_id", _TEXT),
                    _Field("chunk", "chunk", _one_of("type", _CHUNKS))),
    "tool.started": (_Field("requestId", "request_id", _TEXT),
                     _Field("toolCall", "tool_call", _read_call)),
    "tool.finished": (_Field("requestId", "request_id", _TEXT),
                      _Field("toolCall", "tool_call", _read_call),
                      _Field("toolResult", "tool_result",
                             _one_of("role", _MESSAGES, "toolResult")),
                      _Field("refused", "refused", _BOOL, optional=True),  # a refused call's
                      _Field("endsRun", "ends_run", _BOOL, optional=True)),  # a call's that ends
    "tool.progress": (_Field("requestId", "request_id", _TEXT),
                      _Field("toolCallId", "tool_call_id", _TEXT),
                      _Field("progress", "progress", _json_from_dict)),
    "run.finished": (_Field("result", "result", _shape_from_dict(RunResult)),),
}  # fmt: skip
# The JSON key of each payload key, for Event.to_dict().
_PAYLOAD_JSON_KEYS: Final = {
    field.name: field.key for fields in _PAYLOAD_FIELDS.values() for field in fields
}


# --- Resumption -------------------------------------------------------------------


def open_tool_calls(messages: Iterable[Message]) -> Tuple[ToolCall, ...]:
    """Returns the tool calls that have no result yet, in transcript order."""
    open_calls: Dict[str, ToolCall] = {}
    for message in messages:
        if isinstance(message, AssistantMessage):
            open_calls.update((call.id, call) for call in _tool_calls(message))
        elif isinstance(message, ToolResultMessage):
            open_calls.pop(message.tool_call_id, None)
    return tuple(open_calls.values())


def resolve_open_tool_calls(messages: Iterable[Message], content: str) -> Tuple[Message, ...]:
    """Returns the transcript with an is_error=True result of ``content`` for each open call
    (which the loop never writes: the caller decides). TypeError if content is not a str."""
    if not _is_text(content):
        raise TypeError(f"content must be a str, got {type(content).__name__}")
    transcript = tuple(messages)
    return transcript + tuple(
        _tool_result(call, content, True) for call in open_tool_calls(transcript)
    )


# --- Test helpers -----------------------------------------------------------------


def settle_run(
    run: Generator[Event, None, RunResult],
    on_event: Optional[Callable[[Event], object]] = None,
) -> Tuple[List[Event], RunResult]:
    """Drains a run; returns its events and its RunResult. ``on_event`` is called with each
    event before the run goes on; if it raises, the run is closed and the exception propagates."""
    events: List[Event] = []
    with contextlib.closing(run):
        while True:
            try:
                event = next(run)
            except StopIteration as done:
                return events, done.value
            events.append(event)
            if on_event is not None:
                on_event(event)


def print_event(event: Event, file: Optional[TextIO] = None) -> None:
    """Prints one readable line for an event to ``file`` (default: ``sys.stdout``), flushed,
    unprintable characters escaped: ``settle_run(run, on_event=print_event)`` prints a run."""
    payload = event.payload
    if event.type == "message.accepted":
        message = payload["message"]
        if isinstance(message, UserMessage):
            content = json.dumps(message.content, ensure_ascii=False)
        elif isinstance(message, AssistantMessage):
            content = ", ".join(_piece_text(block) for block in message.content)
        else:
            content = _outcome_text(message)
        detail = f"{message.role} {message.id}: {content}"
    elif event.type == "model.chunk":
        chunk = payload["chunk"]
        shown = chunk.tool_call if isinstance(chunk, ToolCallChunk) else chunk
        detail = f"{payload['request_id']} {_piece_text(shown)}"
    elif event.type == "tool.started":
        detail = f"{payload['request_id']} {_call_text(payload['tool_call'])}"
    elif event.type == "tool.progress":
        progress = json.dumps(payload["progress"], ensure_ascii=False, separators=(",", ":"))
        detail = f"{payload['request_id']} [{payload['tool_call_id']}] {progress}"
    elif event.type == "tool.finished":
        refused = payload.get("refused", False)
        detail = f"{payload['request_id']} {_outcome_text(payload['tool_result'], refused)}"
        if payload.get("ends_run", False):
            detail += " (ends the run)"
    else:
        result: RunResult = payload["result"]
        parts = [f"{result.status} after {result.steps} step(s), {len(result.messages)} messages"]
        if result.usage is not None:  # the counts the model reported, by their JSON keys
            counts = ", ".join(f"{key} {count}" for key, count in result.usage.to_dict().items())
            parts.append(f"usage: {counts or 'unknown'}")
        if result.output is not None:
            parts.append("output: " + json.dumps(result.output, ensure_ascii=False))
        open_calls = open_tool_calls(result.messages)
        if result.awaiting:  # a durable run that waits for a person, not a cancelled one
            parts.append("awaiting a decision: " + ", ".join(c.id for c in result.awaiting))
        elif open_calls:
            parts.append("left without a result: " + ", ".join(call.id for call in open_calls))
        if result.error is not None:
            parts.append(f"error: {result.error.code}: {result.error.message}")
        detail = ", ".join(parts)
    line = f"{event.sequence:3d}  {event.type:<16}  {detail}"
    if not line.isprintable():  # a line break, say, in what a model or a tool wrote
        line = "".join(char if char.isprintable() else ascii(char)[1:-1] for char in line)
    print(line, file=file, flush=True)


def _piece_text(piece: Union[TextBlock, ThinkingBlock, ToolCall, TextDelta, ThinkingDelta]) -> str:
    """A block or a chunk as print_event shows it: its type, then its text or call."""
    if isinstance(piece, ToolCall):
        return f"{piece.type} {_call_text(piece)}"
    text = piece.thinking if isinstance(piece, (ThinkingBlock, ThinkingDelta)) else piece.text
    return f"{piece.type} {json.dumps(text, ensure_ascii=False)}"


def _call_text(call: ToolCall) -> str:
    """A call as print_event shows it: name(arguments) [id]."""
    arguments = json.dumps(call.plain_arguments(), ensure_ascii=False, separators=(",", ":"))
    return f"{call.name}({arguments}) [{call.id}]"


def _outcome_text(result: ToolResultMessage, refused: bool = False) -> str:
    """A tool result as print_event shows it: name ok, error or refused, then its content."""
    outcome = "refused" if refused else "error" if result.is_error else "ok"
    return f"{result.tool_name} {outcome}: {result.content}"


@dataclass(frozen=True)
class ScriptedResponse:
    """One scripted model turn (built as ``scripted_response``): each block of ``chunks``
    (default: ``content``) streams as one chunk of the active request, then the model returns
    ``ModelResponse(id, request_id or the active request's id, content, stop_reason, usage,
    provider_response_id)``.
    Raises TypeError for text given as a str."""

    id: str
    content: Sequence[Union[TextBlock, ThinkingBlock, ToolCall]]  # stored as a tuple
    stop_reason: StopReason
    chunks: Optional[Sequence[Union[TextBlock, ThinkingBlock, ToolCall]]] = None  # a tuple
    request_id: Optional[str] = None
    usage: Optional[Usage] = None
    provider_response_id: Optional[str] = None

    def __post_init__(self) -> None:
        # A str is a sequence too, of characters: never what a script means.
        for name in ("content", "chunks"):
            if isinstance(getattr(self, name), str):
                raise TypeError(
                    f"scripted {name} must be a sequence of TextBlock, ThinkingBlock and "
                    "ToolCall, got a str: wrap text in TextBlock(...)"
                )
        object.__setattr__(self, "content", tuple(self.content))
        if self.chunks is not None:
            object.__setattr__(self, "chunks", tuple(self.chunks))


scripted_response = ScriptedResponse
"""``scripted_response(id, content, stop_reason, chunks=None, request_id=None, usage=None,
provider_response_id=None)``: ScriptedResponse by another name (give the optional fields by
keyword)."""


class ScriptedModel:
    """A deterministic model that replays scripted responses in order, for tests and demos:
    ``requests`` records each ModelRequest, ``call_count`` counts ``stream()`` calls, and a
    call with no response left raises RuntimeError, so that the run fails."""

    def __init__(self, responses: Iterable[ScriptedResponse]) -> None:
        self._responses = tuple(responses)
        self.requests: List[ModelRequest] = []
        self.call_count = 0

    @classmethod
    def from_transcript(cls, messages: Iterable[Message]) -> ScriptedModel:
        """A model that replays a transcript's assistant messages in order (tools run again)."""
        return cls(
            scripted_response(
                response_id_of(message.id) or message.id,
                message.content,
                "toolCall" if _tool_calls(message) else "stop",
                usage=message.usage,
                provider_response_id=message.provider_response_id,
            )
            for message in messages
            if isinstance(message, AssistantMessage)
        )

    def stream(
        self, request: ModelRequest, signal: Signal
    ) -> Generator[ModelChunk, None, ModelResponse]:
        """Records the request and streams its scripted turn; RuntimeError if none is left."""
        self.call_count += 1
        self.requests.append(request)
        if self.call_count > len(self._responses):
            raise RuntimeError(
                f"ScriptedModel has no response left for {request.id} "
                f"(it was scripted with {len(self._responses)})"
            )
        return self._replay(request, self._responses[self.call_count - 1])

    @staticmethod
    def _replay(
        request: ModelRequest, scripted: ScriptedResponse
    ) -> Generator[ModelChunk, None, ModelResponse]:
        blocks = scripted.content if scripted.chunks is None else scripted.chunks
        for block in blocks:
            if isinstance(block, TextBlock):
                yield TextDelta(request.id, block.text)
            elif isinstance(block, ThinkingBlock):
                yield ThinkingDelta(request.id, block.thinking)
            else:
                yield ToolCallChunk(request.id, block)
        request_id = request.id if scripted.request_id is None else scripted.request_id
        return ModelResponse(
            scripted.id,
            request_id,
            scripted.content,
            scripted.stop_reason,
            scripted.usage,
            scripted.provider_response_id,
        )


if __name__ == "__main__":  # the demonstration is the command line's: one copy of it
    import runpy

    cli = os.path.join(os.path.dirname(os.path.abspath(__file__)), "agent_loop_cli.py")
    if not os.path.exists(cli):
        sys.exit(
            "agent_loop.py: the demonstration is `python agent_loop_cli.py --demo`: copy "
            "agent_loop_cli.py and its companions from the agent_loop repository beside this file"
        )
    sys.argv[1:1] = ["--demo"]
    runpy.run_path(cli, run_name="__main__")
