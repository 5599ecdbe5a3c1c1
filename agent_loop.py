# agent_loop.py 1.2.1: the reference Python implementation of the iterative Agent Loop.
# One file, standard library only; copy it into your project. Home: the agent_loop repository.
"""The iterative Agent Loop of checkpoint 07 ("Run the iterative Agent Loop"), in Python.

``run_agent_loop()`` owns a snapshot of the transcript, opens one model request per
step, appends the complete assistant response, executes every requested tool in
assistant order, appends the linked tool results, and continues until the model
stops or the run reaches another terminal condition. It returns a plain generator:
iterating it yields sequenced ``Event``s, and its return value (``StopIteration.value``)
is the ``RunResult``, which is always ``completed``, ``cancelled``, ``maxSteps`` or
``failed``.

The loop reads in the order of the seed's state diagram::

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

Invariants:

- One counter numbers every event of a run; ``run.finished`` is always the last event
  and carries the returned ``RunResult``.
- The transcript holds complete messages only: an unfinished assistant message is never
  appended, and an interrupted tool call never gets a fabricated result.
- Options are validated, and the messages and the registry snapshotted, when
  ``run_agent_loop()`` is *called*, not when iteration starts.
- Values are frozen dataclasses; a ``ToolCall`` freezes a copy of its arguments.
- A value from outside (the caller's messages, a model's chunks and response, a tool's
  schema) is checked once, where it enters: a check raises one neutral ``_Problem``, and
  the phase that runs it says which failure code that is. A step costs what it adds,
  whatever the length of the transcript.
- The signal (a ``threading.Event``, or any ``Signal``) is looked at before the first
  event, after every event, and whenever the model, its stream or a tool returns or
  raises; cancellation wins over an error that arrives after it was set.

Where the seed is silent, the README lists the choices made; the main ones: JSON equality
is strict (``True`` is not ``1``); ids, names and text are exactly ``str`` and blocks and
messages exactly the IR's classes (a subclass could redefine ``==``); a ``ToolCall`` keeps
arguments that are not plain bounded JSON as given, and the run rejects it before any tool
runs; an ``Exception`` from a tool is a recoverable, logged result; thinking is a kind of
block of its own, bounded and coalesced as text is; a run's usage is the sum of its
responses' usage. Beyond the seed, opt-in: concurrent tools (``tool_concurrency``, events
and results still in assistant order) and consent (``before_tool_call``). Not here, as
the seed says: steering queues, context transformation, provider retries, persistent
sessions. Companion files beside this one use only its public names:
``agent_loop_providers.py`` (real models), ``agent_loop_cli.py`` (their command line),
``agent_loop_replay.py`` (replay, durable runs) and ``agent_loop_mcp.py`` (MCP tools).

The file reads top down: the limits, the loop and its phases in the diagram's order,
then what the loop uses in that order (the transcript and its checks, the model
boundary, tools, bounded plain JSON, the Message IR with its JSON codec, events and
results), the test helpers, and the demonstration: ``python agent_loop.py --help``.
"""

from __future__ import annotations

import argparse
import collections.abc
import contextlib
import contextvars
import dataclasses
import inspect
import itertools
import json
import logging
import math
import os
import reprlib
import sys
import threading
import types
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import MappingProxyType
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
    get_origin,
    get_type_hints,
)

if TYPE_CHECKING:  # annotations only: the module needs nothing at run time
    from typing_extensions import TypeAlias, TypeGuard

_T = TypeVar("_T")

__version__ = "1.2.1"

__all__ = [  # grouped as the README presents the API
    # Entry point
    "run_agent_loop",
    "settle_run",
    "print_event",
    "Signal",
    # Message IR
    "JSON",
    "TextBlock",
    "ThinkingBlock",
    "ToolCall",
    "UserMessage",
    "AssistantMessage",
    "ToolResultMessage",
    "Message",
    "text_from_assistant",
    "message_from_dict",
    # Model boundary
    "Model",
    "ModelRequest",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallChunk",
    "ModelChunk",
    "ModelResponse",
    "Usage",
    "StopReason",
    # Tools
    "Tool",
    "ToolSpec",
    "ToolRegistry",
    "ToolError",
    "execute_tool_call",
    "current_tool_call",
    # Events and results
    "Event",
    "RunResult",
    "RunError",
    "RunStatus",
    "FailureCode",
    "EventType",
    "event_from_dict",
    # Limits
    "MAX_AGENT_STEPS",
    "MAX_INITIAL_MESSAGES",
    "MAX_STEP_CHUNKS",
    "MAX_STEP_TEXT",
    "MAX_ASSISTANT_BLOCKS",
    "MAX_ARGUMENT_DEPTH",
    "MAX_ARGUMENT_VALUES",
    "MAX_ARGUMENT_SLOTS",
    "MAX_ARGUMENT_TEXT",
    # Test helpers
    "ScriptedModel",
    "ScriptedResponse",
    "scripted_response",
    # Interop and resumption
    "open_tool_calls",
    "resolve_open_tool_calls",
]

# The library logs the exceptions that become tool results, and prints nothing unless
# the application configures logging.
_logger = logging.getLogger("agent_loop")
_logger.addHandler(logging.NullHandler())

# --- Limits -----------------------------------------------------------------------
# Every number of the seed, once. Each limit is inclusive: the limit passes, one more fails.

MAX_AGENT_STEPS: Final = 64
"""Model requests in one run, request_sequence_start included: a workshop ceiling."""
MAX_INITIAL_MESSAGES: Final = 4096
"""Starting messages; more is INVALID_TRANSCRIPT."""
MAX_STEP_CHUNKS: Final = 1024
"""Chunks in one step, of every kind (thinking deltas too): stops a stream that never ends."""
MAX_STEP_TEXT: Final = 65_536
"""Unicode code points of streamed text in one step (a non-BMP character is one); streamed
thinking is counted apart, against the same number."""
MAX_ASSISTANT_BLOCKS: Final = 1024
"""Blocks in one terminal response, thinking blocks too, as returned (before coalescing)."""
MAX_ARGUMENT_DEPTH: Final = 32
"""Containers nested in one call's arguments: ``{}`` has depth 1, a scalar 0."""
MAX_ARGUMENT_VALUES: Final = 257
"""Values in one call's arguments, the root included: ``{"a": [1]}`` has 3."""
MAX_ARGUMENT_SLOTS: Final = 256
"""Object fields plus array slots in one call's arguments: ``{"a": [1]}`` has 2."""
MAX_ARGUMENT_TEXT: Final = 4096
"""Unicode code points across all keys and string values of one call's arguments."""


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

    Iterating the generator yields the run's events; its return value is the
    ``RunResult`` (``result = yield from run``, or ``settle_run(run)``). The starting
    messages (at most ``MAX_INITIAL_MESSAGES + 1`` items are read) and the registry's
    membership are snapshotted now: later changes to either do not reach the run.

    Raises TypeError for an option of the wrong kind and ValueError for one out of
    range, now, before anything is iterated. A bad starting transcript is not an
    error here: the run finishes ``failed`` with ``INVALID_TRANSCRIPT``.

    ``tool_concurrency`` > 1 runs consecutive calls of a batch on up to that many threads
    (a ``sequential`` tool's call alone), with events and results in assistant order
    whatever the timing; ``before_tool_call(call, signal)`` is asked before each call and
    a str it returns refuses the call (see the README's "Tools at once, and consent").
    """
    # ValidateOptions. Seed: "Invalid construction throws before an EventStream is returned."
    _check_options(model, tools, max_steps, request_sequence_start)
    _check_tool_options(tool_concurrency, before_tool_call)
    signal = _checked_signal(signal)
    items = _iterated(messages)
    # SnapshotRun. Reading one past the cap tells "too many" without reading forever.
    start: List[object] = list(itertools.islice(items, MAX_INITIAL_MESSAGES + 1))
    options = (max_steps, signal, request_sequence_start, tool_concurrency, before_tool_call)
    return _Run(start, model, ToolRegistry(tools), *options).drive()


class _Run:
    """One run's private state: its snapshots, the transcript it owns, its one event counter."""

    def __init__(
        self,
        start: List[object],
        model: Model,
        tools: ToolRegistry,
        max_steps: int,
        signal: Signal,
        request_sequence_start: int,
        tool_concurrency: int,
        before_tool_call: Optional[Callable[[ToolCall, Any], Optional[str]]],
    ) -> None:
        self.model = model
        self.tools = tools
        self.specs = tools.specs()
        self.max_steps = max_steps
        self.signal = signal
        self.request_sequence_start = request_sequence_start
        self.tool_concurrency = tool_concurrency
        self.before_tool_call = before_tool_call
        self.steps = 0
        self.next_sequence = 0
        self.usage: Optional[Usage] = None  # the sum over the responses appended so far
        # SnapshotRun, now at call time: the generator's body would wait for next().
        self.transcript = _Transcript()  # stays empty when the start is invalid
        self.invalid_start: Optional[_RunFailure] = None
        try:
            self.transcript = _Transcript.from_start(start)
        except _Problem as problem:
            self.invalid_start = _RunFailure("INVALID_TRANSCRIPT", str(problem))

    def drive(self) -> Generator[Event, None, RunResult]:
        """The state diagram, from SnapshotRun to Finish, and the one place where events
        leave the run: the phases yield them here, and this hands each to the consumer.

        Each ``--> Failed`` edge raises _RunFailure and each ``--> Cancelled`` edge
        raises _Cancelled; both become the result here, and nowhere else.
        """
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
            # The phase that was waiting hears of it there: a batch of tools still yields
            # the results completed before the signal was seen, then ends.
            yield from self._told(steps)
            result = self._result("cancelled")
        except _RunFailure as failure:
            error = RunError(failure.code, failure.message, failure.__cause__)
            result = self._result("failed", error=error)
        finally:
            # Cancelled after an event, or closed by the consumer: the phase that was
            # waiting ends too, and with it the model's stream.
            steps.close()
        return (yield from self._finish(result))

    @staticmethod
    def _told(steps: Generator[Event, None, RunResult]) -> Generator[Event, None, None]:
        """Any phase --> Cancelled: the events the waiting phase still yields once the
        cancellation is thrown into it, until it raises it (at once, if it had ended)."""
        with contextlib.suppress(_Cancelled):
            event = steps.throw(_Cancelled())
            while True:
                yield event
                event = next(steps)

    def _run_steps(self) -> Generator[Event, None, RunResult]:
        """From SnapshotRun to Completed or MaxSteps; the other endings raise."""
        if self.invalid_start is not None:
            # SnapshotRun --> Failed: invalid transcript. Reported even with the signal
            # already set: the inputs decide before the signal is looked at.
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
        request_id = _request_id(self.request_sequence_start + step)
        request = ModelRequest(request_id, tuple(self.transcript.messages), self.specs)
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
        """ReadChunks: one model.chunk per valid chunk, then the checked terminal response.

        Returns the response and its assistant message. The model's stream is closed
        whichever way this ends.
        """
        # Seed: "The loop calls model.stream() and drains its event channel before
        # awaiting the terminal response." The generator returns the response.
        streamed = _StreamedBlocks(request)
        try:
            while True:
                try:
                    chunk = self._next_chunk(stream)
                except StopIteration as done:
                    response = done.value
                    break
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

    def _next_chunk(self, stream: Generator[ModelChunk, None, Any]) -> object:
        """ReadChunks: advances the model's stream by one chunk, and looks at the signal.

        The stream's StopIteration (its end, carrying the response) passes unless the
        signal was set; any other exception fails the run with MODEL_STREAM_ERROR.
        """
        try:
            chunk = next(stream)
        except StopIteration:
            self._check_signal()  # a response that arrives after the signal is not taken
            raise
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as error:
            raise self._failure("MODEL_STREAM_ERROR", "the model's stream", error) from error
        self._check_signal()
        return chunk

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
        _check_request_id(response.request_id, request)
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
        message = AssistantMessage(
            _assistant_message_id(response.id), response.content, response.usage
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
        """AppendAssistant: the complete assistant message joins the transcript, and its
        usage the run's (a response without usage makes every field of the sum unknown)."""
        self.transcript.append(message)
        if message.usage is None:
            self.usage = _UNKNOWN_USAGE  # whatever the sum was, and without building a Usage
        elif self.usage is None:
            self.usage = message.usage  # the first response
        else:
            self.usage = self.usage + message.usage

    def _execute_tools(
        self, request: ModelRequest, message: AssistantMessage
    ) -> Generator[Event, None, None]:
        """ExecuteTools: every call of the message in assistant order, one at a time (with
        tool_concurrency > 1, group by group)."""
        if self.tool_concurrency > 1:
            for group in self._groups(_tool_calls(message)):
                yield from self._execute_group(request, group)
        else:
            for call in _tool_calls(message):
                # Consent, before the call's tool.started (without a hook, not even a call:
                # this is the hot path of W1 in benchmarks/bench_agent_loop.py).
                refusal = None if self.before_tool_call is None else self._refusal(call)
                # Seed: "For each call, it emits tool.started, awaits executeToolCall(),
                # appends the linked Tool-result message, then emits tool.finished."
                yield self._event("tool.started", request_id=request.id, tool_call=call)
                result = refusal or self._execute(call)
                self.transcript.append(result)  # linked by construction (see _finished)
                yield self._event(
                    "tool.finished", request_id=request.id, tool_call=call, tool_result=result
                )
        # Seed: "After the complete Tool batch, validateTranscript() proves that every
        # call has one later matching result." Here that holds by construction: each
        # call above got its linked result appended, or the phase ended by raising.

    def _groups(self, calls: List[ToolCall]) -> List[List[ToolCall]]:
        """ExecuteTools: the calls cut into groups that run together, in order: maximal
        runs of consecutive calls, a sequential tool's call alone (a barrier)."""
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

    def _refusal(self, call: ToolCall) -> Optional[ToolResultMessage]:
        """ExecuteTools, consent: the error result before_tool_call refuses a call with,
        or None to run it. It may block, and set the signal: the call then stays open."""
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
        return None if answer is None else _tool_result(call, answer, True)

    def _execute(self, call: ToolCall) -> ToolResultMessage:
        """ExecuteTools: runs one call, in whichever thread, and looks at the signal after."""
        # A result that arrives after cancellation is discarded. An Exception from the
        # tool is already a recoverable result; what else it raises ends the phase.
        what = f"tool call {call.id!r}"
        return self._call(
            "TOOL_PHASE_ERROR", what, _execute_checked_call, self.tools, call, self.signal
        )

    def _execute_group(
        self, request: ModelRequest, group: List[ToolCall]
    ) -> Generator[Event, None, None]:
        """ExecuteTools, one group on up to tool_concurrency threads: each result joins the
        transcript once it and every call before it have finished. Whatever the way out
        (an end, a failure, a cancellation, close()), it returns only once every running
        tool has returned, and no call begins after."""
        # Consent, for each call of the group before any of them is scheduled.
        refusals = [self._refusal(call) for call in group]
        # In a group, tool.started means scheduled: all of them come first, in order.
        for call in group:
            yield self._event("tool.started", request_id=request.id, tool_call=call)

        def execute(call: ToolCall) -> ToolResultMessage:  # in a worker thread
            self._check_signal()  # a call not yet begun never begins once the signal is set
            return self._execute(call)

        pool = ThreadPoolExecutor(min(self.tool_concurrency, len(group)), "agent_loop-tool")
        outcomes: List[Union[ToolResultMessage, Future[ToolResultMessage]]] = []
        kept = 0  # the calls whose results joined the transcript
        try:
            for call, refusal in zip(group, refusals):
                try:
                    outcomes.append(refusal or pool.submit(execute, call))
                except Exception as error:  # a thread that cannot start
                    what = f"starting tool call {call.id!r}"
                    raise self._failure("TOOL_PHASE_ERROR", what, error) from error
            for index, (call, outcome) in enumerate(zip(group, outcomes)):
                # result() raises what ended the call: _Cancelled if the signal came first.
                result = outcome if isinstance(outcome, ToolResultMessage) else outcome.result()
                kept = index + 1
                yield self._finished(request, call, result)
        except _Cancelled:
            # ExecuteTools --> Cancelled, once the running tools have returned. The results
            # completed before the signal was seen are kept, in order, even after a call
            # still open. Seed: "appends no fabricated result" for the others.
            _stop(pool, outcomes)
            for call, outcome in zip(group[kept:], outcomes[kept:]):
                if isinstance(outcome, Future):
                    if outcome.cancelled() or outcome.exception() is not None:
                        continue
                    outcome = outcome.result()
                # The driver may tell of the signal again after this event: it is known.
                with contextlib.suppress(_Cancelled):
                    yield self._finished(request, call, outcome)
            raise
        finally:
            _stop(pool, outcomes)

    def _finished(self, request: ModelRequest, call: ToolCall, result: ToolResultMessage) -> Event:
        """ExecuteTools: a call's result joins the transcript; returns its tool.finished."""
        # Linked by construction: the result is derived from the call, whose
        # result id was checked free before any tool ran.
        self.transcript.append(result)
        return self._event(
            "tool.finished", request_id=request.id, tool_call=call, tool_result=result
        )

    def _finish(self, result: RunResult) -> Generator[Event, None, RunResult]:
        """Finish: run.finished, always the last event, carries the result the run returns."""
        yield self._event("run.finished", result=result)
        return result

    def _event(self, type: EventType, **payload: Any) -> Event:
        """The run's next event: the one counter numbers it."""
        # Seed: "Each event receives the next integer sequence; no component owns a
        # separate counter."
        event = Event(self.next_sequence, type, MappingProxyType(payload))
        self.next_sequence += 1
        return event

    def _call(
        self, code: FailureCode, what: str, function: Callable[..., _T], *arguments: Any
    ) -> _T:
        """Calls code the loop does not own (model.stream(), a tool) and looks at the
        signal when it returns or raises: cancellation wins over either. An exception
        fails the run with ``code``; KeyboardInterrupt and SystemExit propagate."""
        try:
            value = function(*arguments)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as error:
            raise self._failure(code, what, error) from error
        self._check_signal()
        return value

    def _failure(self, code: FailureCode, what: str, error: BaseException) -> _RunFailure:
        """What an exception from code the loop does not own becomes: _Cancelled (raised)
        if the signal was set meanwhile, else the failure ``code`` that names it."""
        self._check_signal()
        return _RunFailure(code, f"{what} raised {_describe(error)}")

    def _check_signal(self) -> None:
        """Any phase --> Cancelled: signal aborts."""
        if self.signal.is_set():
            raise _Cancelled

    def _result(self, status: RunStatus, **fields: Any) -> RunResult:
        """The run's result: its transcript as it is now, complete messages only."""
        return RunResult(
            status,
            tuple(self.transcript.messages),
            self.steps,
            request_sequence_start=self.request_sequence_start,
            usage=self.usage,
            **fields,
        )


class _RunFailure(Exception):
    """A run-time failure; the driver turns it into a ``failed`` RunResult, in one place."""

    def __init__(self, code: FailureCode, message: str) -> None:
        super().__init__(message)
        self.code: FailureCode = code
        self.message = message


class _Cancelled(Exception):
    """The signal was set; the driver turns it into a ``cancelled`` RunResult, in one place."""


class _Problem(Exception):
    """What a check found wrong, as a message and nothing else: the phase that ran the
    check decides what it becomes (a failure code, a ValueError, an error result)."""


def _check_options(model: object, tools: object, max_steps: object, start: object) -> None:
    """ValidateOptions: raises TypeError or ValueError for an option the run cannot take."""
    # Seed: "maxSteps must be a positive safe integer no greater than MAX_AGENT_STEPS."
    if not isinstance(max_steps, int) or isinstance(max_steps, bool):
        raise TypeError(f"max_steps must be an int, got {type(max_steps).__name__}")
    if not 1 <= max_steps <= MAX_AGENT_STEPS:
        raise ValueError(f"max_steps must be an int in 1..{MAX_AGENT_STEPS}, got {max_steps}")
    if not isinstance(start, int) or isinstance(start, bool):
        raise TypeError(f"request_sequence_start must be an int, got {type(start).__name__}")
    # Seed: "Optional requestSequenceStart must keep the requested range within the same ceiling."
    if start < 0 or start + max_steps > MAX_AGENT_STEPS:
        raise ValueError(
            f"request_sequence_start must be >= 0 with request_sequence_start + max_steps "
            f"<= {MAX_AGENT_STEPS}, got {start} + {max_steps}"
        )
    if not callable(getattr(model, "stream", None)):
        raise TypeError(f"model must have a callable stream(), got {type(model).__name__}")
    if not isinstance(tools, ToolRegistry):
        raise TypeError(f"tools must be a ToolRegistry, got {type(tools).__name__}")


def _check_tool_options(tool_concurrency: object, before_tool_call: object) -> None:
    """ValidateOptions for the tool phase. No upper bound on tool_concurrency: a group
    never uses more threads than it has calls."""
    if not isinstance(tool_concurrency, int) or isinstance(tool_concurrency, bool):
        kind = type(tool_concurrency).__name__
        raise TypeError(f"tool_concurrency must be an int, got {kind}")
    if tool_concurrency < 1:
        raise ValueError(f"tool_concurrency must be an int >= 1, got {tool_concurrency}")
    if before_tool_call is not None and not callable(before_tool_call):
        raise TypeError(
            "before_tool_call must be None or a function (call, signal) -> Optional[str], "
            f"got {type(before_tool_call).__name__}"
        )


def _stop(pool: ThreadPoolExecutor, outcomes: List[Any]) -> None:
    """ExecuteTools: no call of a group begins any more; returns once the running ones
    have returned (a refused call's outcome is its result, and has nothing to stop)."""
    for outcome in outcomes:
        if isinstance(outcome, Future):
            outcome.cancel()  # a call not yet begun; one running cannot be cancelled
    pool.shutdown(wait=True)


def _checked_signal(signal: object) -> Signal:
    """ValidateOptions for the signal: returns it, or a new Event nobody sets for None."""
    if signal is None:
        return threading.Event()
    accepted = "a threading.Event, or an object with is_set() and wait(timeout)"
    if not (callable(getattr(signal, "is_set", None)) and callable(getattr(signal, "wait", None))):
        raise TypeError(f"signal must be {accepted}, got {type(signal).__name__}")
    # asyncio.Event has both methods, but its wait() is a coroutine: a tool that
    # waited on it would get a coroutine object back, never a wait.
    if inspect.iscoroutinefunction(signal.wait):  # type: ignore[attr-defined]
        raise TypeError(
            f"signal must be {accepted}; {type(signal).__name__}.wait() is a coroutine "
            "(an asyncio.Event?): use threading.Event, and set it from your event loop"
        )
    return cast(Signal, signal)


def _iterated(messages: Iterable[object]) -> Iterator[object]:
    """ValidateOptions for the messages: any iterable (typing aside), read at call time."""
    try:
        return iter(messages)
    except TypeError:
        raise TypeError(
            f"messages must be an iterable of messages, got {type(messages).__name__}"
        ) from None


# The ids the loop derives. Seed: request-001, request-002 and so on; its test: the
# assistant message of response R is "message-" + R's id, the result of call C is
# "tool-result-" + C's id.


def _request_id(number: int) -> str:
    """The id of a run's request number ``number`` (request_sequence_start + step)."""
    return f"request-{number:03d}"


def _assistant_message_id(response_id: str) -> str:
    """The id of the assistant message built from a response."""
    return "message-" + response_id


def _response_id(message_id: str) -> str:
    """The response id an assistant message's id was derived from (itself if it was not)."""
    return message_id[len("message-") :] if message_id.startswith("message-") else message_id


def _tool_result_id(call_id: str) -> str:
    """The id of the result message linked to a tool call."""
    return "tool-result-" + call_id


# --- The transcript, the stream, and their checks ---------------------------------


def _is_text(value: object) -> TypeGuard[str]:
    """Exactly a str: a subclass could redefine ==, len() or hash() under the loop's checks."""
    return type(value) is str


def _is_id(value: object) -> bool:
    """Ids and names are non-empty strings."""
    return _is_text(value) and value != ""


# The checks below ask for the exact IR classes, as _is_text asks for exactly str: a
# subclass could redefine == (and so agree with anything) or unfreeze its fields.


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
# A rejected value is quoted in the run's error, which a log keeps: long enough to be
# recognised (a dataclass's repr, a provider's id), never a megabyte.
_QUOTE.maxstring = _QUOTE.maxother = 160


def _a(noun: str) -> str:
    """The noun with its indefinite article, for an error message: "an int", "a str"."""
    return ("an " if noun[:1].lower() in ("a", "e", "i", "o") else "a ") + noun  # "a user"


def _quoted(value: object) -> str:
    """A rejected value as an error message quotes it: its repr, shortened."""
    return _QUOTE.repr(value)


def _wrong_block_field(kind: str, name: str, expected: str, value: object) -> str:
    """Says which field of a block has the wrong type: expected and given."""
    given = f"{_quoted(value)} ({type(value).__name__})"
    return f"{kind}: field {name!r} must be {expected}, got {given}"


def _checked_message(message: object) -> Message:
    """Returns a message that keeps the IR's rules on its own (linkage aside), or raises
    _Problem naming the field."""
    if type(message) is UserMessage:
        if not _is_text(message.content):
            raise _Problem(_wrong_field(message, "content"))
    elif type(message) is AssistantMessage:
        if message.usage is not None and type(message.usage) is not Usage:
            raise _Problem(_wrong_field(message, "usage"))
        for block in message.content:
            try:
                _check_block(block)
            except _Problem as problem:  # the same problem, saying which message has it
                raise _Problem(f"message {message.id!r}: {problem}") from None
    elif type(message) is ToolResultMessage:
        if not _is_id(message.tool_call_id):
            raise _Problem(_wrong_field(message, "tool_call_id"))
        if not _is_id(message.tool_name):
            raise _Problem(_wrong_field(message, "tool_name"))
        if not _is_text(message.content):
            raise _Problem(_wrong_field(message, "content"))
        if type(message.is_error) is not bool:
            raise _Problem(_wrong_field(message, "is_error"))
    else:
        hint = " (read a dict with message_from_dict())" if isinstance(message, dict) else ""
        raise _Problem(f"{_a(type(message).__name__)} is not a message{hint}")
    if not _is_id(message.id):
        raise _Problem(_wrong_field(message, "id"))
    return message


# What _wrong_field says each checked field must be.
_FIELD_TYPES: Final = {
    "id": "a non-empty str",
    "tool_call_id": "a non-empty str",
    "tool_name": "a non-empty str",
    "content": "a str",
    "is_error": "a bool",
    "usage": "None or a Usage",
}


def _wrong_field(message: Message, name: str) -> str:
    """Says which field of a message has the wrong type: expected and given."""
    value = getattr(message, name)
    where = f"{_a(message.role)} message" if name == "id" else f"message {message.id!r}"
    given = f"{_quoted(value)} ({type(value).__name__})"
    return f"{where}: field {name!r} must be {_FIELD_TYPES[name]}, got {given}"


class _Transcript:
    """The run's private transcript, with the indexes that make checking a message cost
    what the message holds, whatever the length of the transcript.

    A valid transcript: unique message ids and tool-call ids, every tool result answers
    an open call of an earlier assistant message with the same tool name, once. It is
    complete when no call is left open.
    """

    def __init__(self) -> None:
        self.messages: List[Message] = []
        self._message_ids: Set[str] = set()
        self._call_ids: Set[str] = set()
        self._open_calls: Dict[str, ToolCall] = {}

    @classmethod
    def from_start(cls, start: List[object]) -> _Transcript:
        """SnapshotRun: the starting messages as a transcript; raises _Problem if they
        are not a complete one."""
        # Seed: "Initial messages are capped at 4096 ... and validated as a complete transcript."
        if len(start) > MAX_INITIAL_MESSAGES:
            raise _Problem(f"more than {MAX_INITIAL_MESSAGES} starting messages")
        transcript = cls()
        for message in start:
            transcript.append(transcript.check(message))
        if transcript._open_calls:
            raise _Problem(f"tool calls without a result: {list(transcript._open_calls)}")
        return transcript

    def check(self, message: object) -> Message:
        """Returns the message if it is well formed and keeps linkage with what is
        already here, else raises _Problem."""
        checked = _checked_message(message)
        self._check_linkage(checked)
        return checked

    def _check_linkage(self, message: Message) -> None:
        """Raises _Problem unless its ids are free and a result answers an open call."""
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
                if _tool_result_id(call.id) in self._message_ids:
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

    def append(self, message: Message) -> None:
        """Adds a message that keeps linkage, and indexes its ids and open calls."""
        self.messages.append(message)
        self._message_ids.add(message.id)
        if isinstance(message, AssistantMessage):
            for call in message.content:
                if isinstance(call, ToolCall):  # as in _check_linkage, no list built
                    self._call_ids.add(call.id)
                    self._open_calls[call.id] = call
        elif isinstance(message, ToolResultMessage):
            del self._open_calls[message.tool_call_id]


def _check_request_id(request_id: object, request: ModelRequest) -> None:
    """Seed: "Request IDs must match the active request." (chunks and responses alike)"""
    if not _is_text(request_id) or request_id != request.id:
        given = _quoted(request_id)
        if not _is_text(request_id):  # a str subclass's repr reads like the id it imitates
            given += f" ({type(request_id).__name__})"
        raise _Problem(
            f"{given} is not the active request {request.id!r}: every chunk's and the "
            "response's request_id must be the request's id"
        )


# A normalised block: text as a str, thinking as a ThinkingBlock of its text alone (a
# signature never streams), a tool call as itself.
_Normalized: TypeAlias = Union[str, "ThinkingBlock", "ToolCall"]


class _StreamedBlocks:
    """What one step has streamed so far, checked chunk by chunk against the step's limits."""

    def __init__(self, request: ModelRequest) -> None:
        self.request = request
        self.items: List[_Normalized] = []
        self.text = 0
        self.thinking = 0

    def add(self, chunk: object) -> None:
        """Checks one streamed chunk and keeps its text, its thinking or its tool call."""
        # Seed: "The loop caps one step at 1024 chunks, 65,536 Unicode code points
        # of text, and 1024 assistant blocks." (blocks: see _checked_response) Every
        # chunk counts, thinking too; thinking is bounded by the same number as text,
        # counted apart, so that the seed's text limit is unchanged.
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
        _check_request_id(chunk.request_id, self.request)
        self.items.append(item)

    def require_agreement(
        self, content: Sequence[Union[TextBlock, ThinkingBlock, ToolCall]]
    ) -> None:
        """Raises _Problem unless the terminal content agrees with the stream (usage
        is not part of it)."""
        # Seed: "The resulting normalized block sequences must agree in content and
        # order; raw text-chunk segmentation may differ."
        terminal = _normalized(_normalized_item(block) for block in content)
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
        index = cast(int, _first_difference(streamed, terminal))  # they differ
        raise _Problem(
            "the streamed chunks and the terminal response disagree at normalised block "
            f"{index}: streamed {_shortened(streamed, index)}, "
            f"terminal {_shortened(terminal, index)}"
        )


def _streamed_length(text: object, kind: str, so_far: int) -> int:
    """The code points of a text or thinking chunk, if the step's total stays within
    MAX_STEP_TEXT; raises _Problem if not, or if it is not a str."""
    if not _is_text(text):
        raise _Problem(f"a {kind} chunk's {kind} must be a str, got {type(text).__name__}")
    if so_far + len(text) > MAX_STEP_TEXT:
        raise _Problem(f"the model streamed more than {MAX_STEP_TEXT} code points of {kind}")
    return len(text)


def _normalized_item(block: Union[TextBlock, ThinkingBlock, ToolCall]) -> _Normalized:
    """A terminal block as the stream carries it: a thinking block's signature does not stream."""
    if isinstance(block, TextBlock):
        return block.text
    if isinstance(block, ThinkingBlock):
        return ThinkingBlock(block.thinking)
    return block


def _normalized(items: Iterable[_Normalized]) -> List[_Normalized]:
    """Coalesces adjacent text and adjacent thinking; text, thinking and tool calls are
    each other's boundaries, and empty text or thinking carries nothing."""
    # Seed: "the loop coalesces adjacent streamed text deltas and adjacent terminal
    # text blocks, using Tool calls as boundaries." Thinking is coalesced as text is.
    normalized: List[_Normalized] = []
    # Empty text and empty thinking are dropped first, so that they are no boundary
    # either (a redacted block between two pieces of text). (Comparing each item with a
    # ThinkingBlock("") instead costs 15 times as much.)
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


def _first_difference(left: Sequence[Any], right: Sequence[Any]) -> Optional[int]:
    """The first index at which two sequences differ (one may end first), or None."""
    for index, (left_item, right_item) in enumerate(zip(left, right)):
        if left_item != right_item:
            return index
    return None if len(left) == len(right) else min(len(left), len(right))


def _shortened(blocks: List[_Normalized], index: int) -> str:
    """One normalised block as a disagreement shows it, shortened: text as its repr,
    ``thinking '...'``, ``tool call 'id' to 'name' with {...}``; "nothing" past the end."""
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


@dataclass(frozen=True)
class ModelRequest:
    """One step's request: a frozen snapshot of the transcript and the tools' specs."""

    id: str
    messages: Tuple[Message, ...]
    tools: Tuple[ToolSpec, ...]
    __hash__ = None  # type: ignore[assignment]  # its tools hold schema mappings

    def to_dict(self) -> Dict[str, Any]:
        """Returns the seed's JSON shape of this object (plain dicts and lists)."""
        return {
            "id": self.id,
            "messages": [message.to_dict() for message in self.messages],
            "tools": [spec.to_dict() for spec in self.tools],
        }


@dataclass(frozen=True)
class TextDelta:
    """A streamed piece of assistant text."""

    request_id: str
    text: str
    type: ClassVar[Literal["text"]] = "text"

    def to_dict(self) -> Dict[str, Any]:
        """Returns the seed's JSON shape of this object (plain dicts and lists)."""
        return {"type": self.type, "requestId": self.request_id, "text": self.text}


@dataclass(frozen=True)
class ThinkingDelta:
    """A streamed piece of the model's thinking (its signature, if any, arrives only in
    the terminal response's ThinkingBlock)."""

    request_id: str
    thinking: str
    type: ClassVar[Literal["thinking"]] = "thinking"

    def to_dict(self) -> Dict[str, Any]:
        """Returns the JSON shape of this object (plain dicts and lists)."""
        return {"type": self.type, "requestId": self.request_id, "thinking": self.thinking}


@dataclass(frozen=True)
class ToolCallChunk:
    """A streamed, complete tool call."""

    request_id: str
    tool_call: ToolCall
    type: ClassVar[Literal["toolCall"]] = "toolCall"

    def to_dict(self) -> Dict[str, Any]:
        """Returns the seed's JSON shape of this object (plain dicts and lists)."""
        return {
            "type": self.type,
            "requestId": self.request_id,
            "toolCall": self.tool_call.to_dict(),
        }


ModelChunk = Union[TextDelta, ThinkingDelta, ToolCallChunk]


def _chunk_from_dict(data: object, where: str) -> ModelChunk:
    """Reads a chunk from its to_dict() form; ValueError naming the field if malformed."""
    chunk = _object(data, where)
    request_id = _read(chunk, "requestId", str, where)
    kind = _read_choice(chunk, "type", ("text", "thinking", "toolCall"), where)
    if kind == "text":
        return TextDelta(request_id, _read(chunk, "text", str, where))
    if kind == "thinking":
        return ThinkingDelta(request_id, _read(chunk, "thinking", str, where))
    return ToolCallChunk(
        request_id,
        _tool_call_from_dict(_read(chunk, "toolCall", dict, where), f"{where}.toolCall"),
    )


StopReason = Literal["stop", "toolCall"]
"""Why a model stopped: ``stop`` (its answer is complete) or ``toolCall`` (run the calls)."""
_STOP_REASONS: Final = get_args(StopReason)


@dataclass(frozen=True)
class Usage:
    """The tokens one response (or, summed, one run) cost, as the provider reported them.

    Each field is None when the provider did not say (never 0 for unknown), else an int
    >= 0. ``input_tokens`` counts the input tokens neither read from nor written to a
    prompt cache: the whole input is ``input_tokens + cache_read_tokens +
    cache_write_tokens``, as Anthropic counts it. ``output_tokens`` counts all output
    tokens, reasoning included; ``reasoning_tokens`` is the part of them spent on
    reasoning, when the provider says. ``a + b`` sums field by field, and a field that
    is None on either side is None in the sum: a sum with an unknown part is unknown.

    Raises TypeError for a field that is not None or an int (a bool is not one), and
    ValueError for a negative one.
    """

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
        sums = []
        for name, _ in _USAGE_KEYS:
            mine, theirs = getattr(self, name), getattr(other, name)
            sums.append(None if mine is None or theirs is None else mine + theirs)
        return Usage(*sums)

    def to_dict(self) -> Dict[str, Any]:
        """Returns the JSON shape of this object: Pi's keys, each absent when unknown."""
        return {
            key: getattr(self, name)
            for name, key in _USAGE_KEYS
            if getattr(self, name) is not None
        }


# Usage's fields, in order, and their JSON keys.
_USAGE_KEYS: Final = (
    ("input_tokens", "input"),
    ("output_tokens", "output"),
    ("cache_read_tokens", "cacheRead"),
    ("cache_write_tokens", "cacheWrite"),
    ("reasoning_tokens", "reasoning"),
)
_UNKNOWN_USAGE: Final = Usage()
"""A sum with an unknown part: every field unknown."""


def _usage_from_dict(data: Dict[str, Any], where: str) -> Optional[Usage]:
    """Reads the optional ``usage`` key of an object that may hold one."""
    if data.get("usage") is None:
        return None
    usage = _object(data["usage"], f"{where}.usage")
    counts = [_read_optional(usage, key, int, f"{where}.usage") for _, key in _USAGE_KEYS]
    for (_, key), count in zip(_USAGE_KEYS, counts):
        if count is not None and count < 0:
            raise ValueError(f"{where}.usage.{key} must be >= 0, got {count}")
    return Usage(*counts)


@dataclass(frozen=True)
class ModelResponse:
    """A model's terminal response to one request, and what it cost (None: unknown)."""

    id: str
    request_id: str
    content: Sequence[Union[TextBlock, ThinkingBlock, ToolCall]]  # stored as a tuple
    stop_reason: StopReason
    usage: Optional[Usage] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "content", tuple(self.content))

    def to_dict(self) -> Dict[str, Any]:
        """Returns the seed's JSON shape of this object, and ``usage`` when it is known."""
        data: Dict[str, Any] = {
            "id": self.id,
            "requestId": self.request_id,
            "content": [block.to_dict() for block in self.content],
            "stopReason": self.stop_reason,
        }
        if self.usage is not None:
            data["usage"] = self.usage.to_dict()
        return data


class Signal(Protocol):
    """What the loop needs of a cancellation signal: threading.Event's reading side.

    ``threading.Event`` is one; so is any object with these two methods whose
    ``wait`` blocks (not a coroutine). Annotate a model's or a tool's ``signal``
    parameter with ``Signal`` or ``threading.Event``.
    """

    def is_set(self) -> bool:
        """True once cancellation was requested."""

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks until cancellation is requested or the timeout passes."""


class Model(Protocol):
    """A model: ``stream()`` returns a generator that yields chunks and returns its response.

    ``signal`` is the run's signal, as the caller gave it; it is typed ``Any`` here, as a
    tool's is, so that an implementation may annotate it ``Signal`` or ``threading.Event``.
    """

    def stream(
        self, request: ModelRequest, signal: Any
    ) -> Generator[ModelChunk, None, ModelResponse]:
        """Streams the answer to one request; the generator's return value is the response."""


# --- Tools ------------------------------------------------------------------------

_SCHEMA_TYPES: Final = ("object", "string", "number", "integer", "boolean", "array", "null")
_SCHEMA_KEYWORDS: Final = (
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "description",
    "title",
)


@dataclass(frozen=True)
class ToolSpec:
    """What a model is told about a tool: its name, description and parameter schema.

    Checked as a ``Tool`` is (TypeError or ValueError naming the field), and its
    parameters are frozen.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    __hash__ = None  # type: ignore[assignment]  # it holds a mapping

    def __post_init__(self) -> None:
        parameters = _checked_tool_fields("ToolSpec", self.name, self.description, self.parameters)
        object.__setattr__(self, "parameters", parameters)

    def __reduce__(self) -> Tuple[Any, ...]:
        return _reduce_to_plain_fields(self)

    def to_dict(self) -> Dict[str, Any]:
        """Returns the seed's JSON shape of this object (plain dicts and lists)."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": _thawed(self.parameters),
        }


@dataclass(frozen=True)
class Tool:
    """A named effect the model may request, with a JSON Schema for its arguments.

    ``parameters`` uses the subset of JSON Schema that the loop enforces: ``type``
    (object, string, number, integer, boolean, array, null), ``properties``,
    ``required``, ``additionalProperties`` (bool), ``items``, ``enum``, and the
    annotations ``description`` and ``title``; the root is ``{"type": "object", ...}``.
    It is checked and frozen when the Tool is built. ``execute(arguments, signal)``
    gets a fresh plain dict that it may change freely, and the run's signal.
    ``sequential=True`` (by keyword): with ``tool_concurrency`` > 1, the tool's calls
    run alone, after the calls before them (a barrier).

    Raises TypeError or ValueError, naming the field, for a Tool the loop could not
    run as described.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    # The signal is Any here so that a function annotated with Signal or with
    # threading.Event fits (a Callable's parameters are contravariant).
    execute: Callable[[Dict[str, Any], Any], object]
    sequential: bool = False  # given by keyword: with tool_concurrency > 1, runs alone
    __hash__ = None  # type: ignore[assignment]  # it holds a mapping

    def __post_init__(self) -> None:
        parameters = _checked_tool_fields("Tool", self.name, self.description, self.parameters)
        _check_execute(self.name, self.execute)
        sequential: object = self.sequential  # typing aside: it comes from the caller
        if type(sequential) is not bool:
            kind = type(sequential).__name__
            raise TypeError(f"Tool {self.name!r}: sequential must be a bool, got {kind}")
        object.__setattr__(self, "parameters", parameters)

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
        """Builds a Tool from a function that takes the arguments as keyword parameters.

        The schema comes from the type hints (``typing.get_type_hints``): ``str``,
        ``int``, ``float`` (an int is accepted too), ``bool``, ``None``, ``list`` and
        ``List[X]``, ``dict`` and ``Dict[str, Any]``, ``Literal[...]`` of JSON scalars,
        and ``Optional[X]`` with the default None (not required: the model leaves it
        out). Every parameter without a default is required, and no other property is
        allowed. A parameter named ``signal`` gets the run's signal and is not in the
        schema. The description is the docstring (``inspect.getdoc``; ``""`` without
        one), the name the function's; ``name`` and ``description`` override;
        ``sequential`` is the Tool's. The tool calls ``fn(**arguments)``, and what
        ``fn`` returns is the result.

        Raises TypeError, naming the parameter, for a hint the schema subset cannot say
        exactly, a parameter with no hint, ``*args``, ``**kwargs`` or a positional-only
        parameter; for an async function or anything but a function or a method; for a
        lambda without ``name``; and as ``Tool()`` does for the name or description.
        """
        parameters, wants_signal = _function_parameters(fn)
        if name is None and fn.__name__ == "<lambda>":
            raise TypeError("Tool.from_function: a lambda has no name of its own; give it name=")

        def execute(arguments: Dict[str, Any], signal: Signal) -> object:
            if wants_signal:
                return fn(**arguments, signal=signal)
            return fn(**arguments)

        return cls(
            fn.__name__ if name is None else name,
            (inspect.getdoc(fn) or "") if description is None else description,
            parameters,
            execute,
            sequential=sequential,
        )


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
    schema = _frozen_schema(parameters, f"{kind} {name!r} parameters", 0)
    if schema.get("type") != "object":
        raise ValueError(
            f'{kind} {name!r} parameters must have "type": "object": '
            "a tool's arguments are always a JSON object"
        )
    return schema


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


def _function_parameters(fn: object) -> Tuple[Dict[str, Any], bool]:
    """Tool.from_function: the schema of fn's keyword parameters, and whether it takes
    the signal."""
    if not (inspect.isfunction(fn) or inspect.ismethod(fn)):
        raise TypeError(
            f"Tool.from_function takes a function or a method, got {type(fn).__name__}"
        )
    if inspect.iscoroutinefunction(fn):  # its result would be a coroutine, never awaited
        raise TypeError(
            f"Tool.from_function: {fn.__qualname__} is an async function, and the loop "
            "calls tools synchronously; give it a plain def"
        )
    try:
        hints = get_type_hints(fn)
    except Exception as error:  # a name the annotation string uses is not defined, say
        raise TypeError(
            f"Tool.from_function: cannot resolve the type hints of {fn.__qualname__}: "
            f"{_describe(error)}"
        ) from None
    properties: Dict[str, Any] = {}
    required: List[str] = []
    wants_signal = False
    for parameter in inspect.signature(fn).parameters.values():
        where = f"Tool.from_function({fn.__qualname__}): parameter {parameter.name!r}"
        if parameter.kind not in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            raise TypeError(
                f"{where} is {parameter.kind.description}: the tool calls fn(**arguments), "
                "so each parameter must be one that can be passed by name"
            )
        if parameter.name == "signal":
            wants_signal = True
            continue
        if parameter.name not in hints:
            raise TypeError(f"{where} has no type hint: the schema is made from the hints")
        default_none = parameter.default is None
        properties[parameter.name] = _hint_schema(hints[parameter.name], where, default_none)
        if parameter.default is parameter.empty:
            required.append(parameter.name)
    schema = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    return schema, wants_signal


_HINT_TYPES: Final = (
    (str, "string"),
    (bool, "boolean"),
    (int, "integer"),
    (float, "number"),
    (type(None), "null"),
)
"""The hints Tool.from_function turns into a schema type, as pairs: Literal values and
others may be unhashable, so they are compared by identity, not looked up."""


def _hint_schema(hint: Any, where: str, default_none: bool) -> Dict[str, Any]:
    """Tool.from_function: the schema that admits exactly the JSON values of a hint."""
    origin = get_origin(hint)
    arguments = get_args(hint)
    for python_type, json_type in _HINT_TYPES:
        if hint is python_type:
            return {"type": json_type}
    # Union[X, None] has the origin typing.Union, and X | None (3.10+) types.UnionType.
    if origin is Union or origin is getattr(types, "UnionType", Union):
        others = [argument for argument in arguments if argument is not type(None)]
        if len(others) == 1 and len(arguments) == 2:
            if get_origin(others[0]) is Literal:
                return _literal_schema((*get_args(others[0]), None), where)
            if default_none:  # the model leaves it out, and fn gets its default None
                return _hint_schema(others[0], where, False)
        raise TypeError(
            f"{where}: {hint} admits values of several JSON types, and a schema here has "
            "one type (no anyOf); for Optional[X], give the parameter the default None"
        )
    if hint is list or origin is list:
        if arguments:
            return {"type": "array", "items": _hint_schema(arguments[0], where, False)}
        return {"type": "array"}
    if hint is dict or origin is dict:
        if arguments and arguments != (str, Any):
            raise TypeError(
                f"{where}: {hint} types the values of an object, which a schema here "
                "cannot say (no additionalProperties schema); use dict or Dict[str, Any]"
            )
        return {"type": "object"}
    if origin is Literal:
        return _literal_schema(arguments, where)
    raise TypeError(
        f"{where}: {hint!r} has no schema in the subset this loop enforces; use str, "
        "int, float, bool, None, list, dict, Literal, or Optional of one of them"
    )


def _literal_schema(values: Tuple[object, ...], where: str) -> Dict[str, Any]:
    """Tool.from_function: the enum of a Literal, typed when its values share a JSON type."""
    kinds = set()
    for value in values:
        if not any(type(value) is python_type for python_type, _ in _HINT_TYPES):
            raise TypeError(
                f"{where}: Literal value {value!r} is a {type(value).__name__}, "
                "not a JSON scalar (str, int, float, bool or None)"
            )
        kinds.add(_json_type(value))
    if len(kinds) == 1:
        return {"type": kinds.pop(), "enum": list(values)}
    return {"enum": list(values)}


def _frozen_schema(schema: object, where: str, depth: int) -> Mapping[str, Any]:
    """Checks that a schema uses only the keywords the loop enforces; returns it frozen."""
    if not isinstance(schema, Mapping):
        raise TypeError(f"{where} must be a JSON Schema object, got {type(schema).__name__}")
    unsupported = [key for key in schema if key not in _SCHEMA_KEYWORDS]
    if unsupported:
        raise ValueError(
            f"{where} uses {unsupported}, which this loop cannot enforce; "
            f"supported keywords: {', '.join(_SCHEMA_KEYWORDS)}"
        )
    # A schema nested deeper than arguments may be would describe values no call can have.
    if depth > MAX_ARGUMENT_DEPTH:
        raise ValueError(f"{where} nests deeper than {MAX_ARGUMENT_DEPTH} levels")
    frozen: Dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type":
            if value not in _SCHEMA_TYPES:
                raise ValueError(f"{where}: type must be one of {_SCHEMA_TYPES}, got {value!r}")
        elif key == "properties":
            if not isinstance(value, Mapping):
                raise TypeError(f"{where}: properties must be an object")
            value = MappingProxyType(
                {
                    name: _frozen_schema(item, f"{where}.properties.{name}", depth + 1)
                    for name, item in value.items()
                }
            )
        elif key == "required":
            if not isinstance(value, (list, tuple)) or not all(isinstance(n, str) for n in value):
                raise TypeError(f"{where}: required must be a list of property names")
            value = tuple(value)
        elif key == "additionalProperties":
            if not isinstance(value, bool):
                raise TypeError(f"{where}: additionalProperties must be true or false")
        elif key == "items":
            value = _frozen_schema(value, f"{where}.items", depth + 1)
        elif key == "enum":
            if not isinstance(value, (list, tuple)):
                raise TypeError(f"{where}: enum must be a list of JSON values")
            # Each member is a value some argument may be, within the bounds on its own;
            # how many there are is the schema's business.
            members = []
            for index, member in enumerate(value):
                try:
                    members.append(_frozen_json(member, 0, _ArgumentBudget()))
                except _Problem as violation:
                    raise ValueError(
                        f"{where}: enum member {index} is no value arguments may hold: {violation}"
                    ) from None
            value = tuple(members)
        elif not isinstance(value, str):  # description, title
            raise TypeError(f"{where}: {key} must be a str")
        frozen[key] = value
    return MappingProxyType(frozen)


def _schema_problem(value: object, schema: Mapping[str, Any], path: str) -> Optional[str]:
    """Returns why a frozen JSON value fails a tool's schema, or None when it passes."""
    expected = schema.get("type")
    actual = _json_type(value)
    # A JSON integer is also a JSON number; bool is neither (it is not an int here).
    if expected is not None and expected != actual and (expected, actual) != ("number", "integer"):
        return f"{path} must be {expected}, got {actual}"
    if "enum" in schema and not any(_same_json(value, option) for option in schema["enum"]):
        return f"{path} must be one of {json.dumps(_thawed(schema['enum']))}"
    # Frozen JSON objects are MappingProxyType. isinstance() with that class costs a
    # tenth of isinstance(value, typing.Mapping), and this runs for every call's arguments.
    if isinstance(value, MappingProxyType):
        properties = schema.get("properties", {})
        for name in schema.get("required", ()):
            if name not in value:
                return f"{path} is missing the required property {name!r}"
        for name, item in value.items():
            if name in properties:
                problem = _schema_problem(item, properties[name], f"{path}.{name}")
                if problem is not None:
                    return problem
            elif schema.get("additionalProperties") is False:
                return f"{path} has the unexpected property {name!r}"
    elif isinstance(value, tuple) and "items" in schema:
        for index, item in enumerate(value):
            problem = _schema_problem(item, schema["items"], f"{path}[{index}]")
            if problem is not None:
                return problem
    return None


class ToolRegistry:
    """The tools a run may execute, by unique name.

    Raises, as ``register()`` does, TypeError for an item that is not a Tool and
    ValueError for a name that is taken.
    """

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
    """Runs one tool call and returns its linked result message.

    An unknown tool, arguments that are not bounded plain JSON or fail the tool's
    schema, an exception from the tool, or a return value that is not JSON become a
    *recoverable* result: ``is_error=True`` and content that says what went wrong, so
    the model can correct itself on the next step. A ``str`` return value is the
    content verbatim; any other JSON value (a str subclass included) is encoded
    compactly. A ``ToolError`` gives its message as the content, as the tool wrote it.
    Only BaseExceptions that are not Exceptions (KeyboardInterrupt, SystemExit...)
    propagate.

    Raises TypeError for a call whose id or name is not a non-empty str: no result
    message can be linked to it.
    """
    if not (_is_id(call.id) and _is_id(call.name)):
        raise TypeError(
            f"a call's id and name must be non-empty str, got {call.id!r} and {call.name!r}: "
            "no result message could be linked to it"
        )
    try:
        _check_arguments(call)
    except _Problem as problem:
        return _tool_result(call, f"invalid arguments for tool {call.name!r}: {problem}", True)
    return _execute_checked_call(registry, call, signal)


def _execute_checked_call(
    registry: ToolRegistry, call: ToolCall, signal: Signal
) -> ToolResultMessage:
    """execute_tool_call() for a call whose arguments are known to be plain bounded JSON."""
    tool = registry.get(call.name)
    if tool is None:
        known = ", ".join(registered.name for registered in registry) or "none"
        return _tool_result(call, f"unknown tool {call.name!r} (available: {known})", True)
    problem = _schema_problem(call.arguments, tool.parameters, "$")
    if problem is not None:
        return _tool_result(call, f"invalid arguments for tool {call.name!r}: {problem}", True)
    token = _CURRENT_TOOL_CALL.set(call)  # in this thread's context only
    try:
        value = tool.execute(call.plain_arguments(), signal)
    except ToolError as error:
        return _tool_result(call, error.message, True)  # the tool's own words, as it chose them
    except Exception as error:
        _logger.warning("tool %r raised; the model gets an error result", call.name, exc_info=True)
        return _tool_result(call, f"tool {call.name!r} raised {_describe(error)}", True)
    finally:
        _CURRENT_TOOL_CALL.reset(token)
    if _is_text(value):
        return _tool_result(call, value, False)
    try:
        content = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except Exception as error:  # json.dumps runs the value's own code (a dict subclass's items())
        _logger.warning("tool %r returned a value that is not JSON", call.name, exc_info=True)
        return _tool_result(
            call, f"tool {call.name!r} returned a value that is not JSON: {error}", True
        )
    return _tool_result(call, content, False)


_CURRENT_TOOL_CALL: Final[contextvars.ContextVar[Optional[ToolCall]]] = contextvars.ContextVar(
    "agent_loop.current_tool_call", default=None
)


def current_tool_call() -> Optional[ToolCall]:
    """Returns the ToolCall whose tool is executing, in the thread (the context) that runs
    it, or None outside a tool's ``execute``: a tool learns its call's id from it."""
    return _CURRENT_TOOL_CALL.get()


class ToolError(Exception):
    """Raised by a tool to tell the model what went wrong, in its own words.

    The call's result is ``is_error=True`` with content exactly ``message``, with no
    prefix (any other exception's result names the tool and the exception). It is
    not logged: it is an answer, not a bug.
    """

    def __init__(self, message: str) -> None:
        if not _is_text(message):
            raise TypeError(f"ToolError message must be a str, got {type(message).__name__}")
        super().__init__(message)
        self.message = message


def _tool_result(call: ToolCall, content: str, is_error: bool) -> ToolResultMessage:
    """Builds the result message linked to a call (its id is derived from the call's)."""
    return ToolResultMessage(_tool_result_id(call.id), call.id, call.name, content, is_error)


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
        # Seed: "4096 Unicode code points across keys/string values". len() of a str
        # counts code points, and costs nothing even for a 10 MB string.
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
    if not (
        type(value) is dict
        or type(value) is MappingProxyType
        or type(value) is list
        or type(value) is tuple
    ):
        raise _Problem(f"arguments hold {_a(type(value).__name__)}, which is not plain JSON")
    # Seed: "depth 32". Checked before descending, so depth 100,000 costs 33 frames.
    if depth == MAX_ARGUMENT_DEPTH:
        raise _Problem(f"arguments nest containers deeper than {MAX_ARGUMENT_DEPTH}")
    # "No object reachable twice" guards against aliasing and cycles, which only a dict
    # or a list can make: frozen tuples and mappings may be shared (CPython shares the
    # empty tuple), and a cycle through them still meets a dict or the depth limit.
    if type(value) is dict or type(value) is list:
        if id(value) in budget.mutable_containers:
            raise _Problem("arguments reach the same dict or list twice (shared or cyclic)")
        budget.mutable_containers.add(id(value))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen_json(item, depth + 1, budget) for item in value)
    frozen: Dict[str, JSON] = {}
    for key, item in value.items():
        if type(key) is not str:
            raise _Problem(f"arguments hold {_a(type(key).__name__)} key, not a string")
        budget.spend_text(key)
        frozen[key] = _frozen_json(item, depth + 1, budget)
    return MappingProxyType(frozen)


def _reduce_to_plain_fields(value: Any) -> Tuple[Any, ...]:
    """``__reduce__`` of a value that holds read-only mappings, which pickle and copy
    cannot copy: the value is rebuilt from a plain copy of each of its fields."""
    fields = dataclasses.fields(value)
    return (type(value), tuple(_thawed(getattr(value, item.name)) for item in fields if item.init))


def _thawed(value: object) -> Any:
    """Returns a fresh plain copy (dicts and lists) of frozen JSON."""
    if type(value) is MappingProxyType:
        return {key: _thawed(item) for key, item in value.items()}
    if type(value) is tuple:
        return [_thawed(item) for item in value]
    return value


def _same_json(left: object, right: object) -> bool:
    """JSON equality at any depth: unlike ==, True is not 1 and 1 is not 1.0."""
    if left is right:
        return True
    # Frozen JSON objects are MappingProxyType, as in _schema_problem: testing for that
    # class costs a tenth of isinstance(value, typing.Mapping).
    if isinstance(left, MappingProxyType) and isinstance(right, MappingProxyType):
        return left.keys() == right.keys() and all(_same_json(left[k], right[k]) for k in left)
    if isinstance(left, tuple) and isinstance(right, tuple):
        return len(left) == len(right) and all(map(_same_json, left, right))
    return type(left) is type(right) and left == right


def _json_type(value: object) -> str:
    """Names the JSON type of a frozen JSON value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, tuple):
        return "array"
    return "object"


# Reading JSON back (the *_from_dict readers beside each class): each takes a value as
# json.loads gives it and the path that names it, and raises ValueError naming the field.

_JSON_TYPE_NAMES: Final = {
    str: "a string",
    int: "an integer",
    bool: "a boolean",
    list: "an array",
    dict: "an object",
}


def _object(data: object, where: str) -> Dict[str, Any]:
    """Returns data if it is a JSON object (a dict); a ValueError names the field if not."""
    if type(data) is not dict:
        raise ValueError(f"{where} must be an object, got {type(data).__name__}")
    return data


def _read(data: Dict[str, Any], key: str, kind: type, where: str) -> Any:
    """Returns data[key] if it has the JSON type ``kind``; a ValueError names the field if not."""
    if key not in data:
        raise ValueError(f"{where}.{key} is missing")
    value = data[key]
    if type(value) is not kind:
        raise ValueError(
            f"{where}.{key} must be {_JSON_TYPE_NAMES[kind]}, got {type(value).__name__}"
        )
    return value


def _read_optional(data: Dict[str, Any], key: str, kind: type, where: str) -> Any:
    """Like _read, for a key that may be absent or null."""
    return None if data.get(key) is None else _read(data, key, kind, where)


def _read_choice(data: Dict[str, Any], key: str, choices: Tuple[str, ...], where: str) -> Any:
    """Returns data[key] if it is one of the protocol values ``choices``."""
    value = _read(data, key, str, where)
    if value not in choices:
        raise ValueError(f"{where}.{key}: unknown value {value!r} (expected one of {choices})")
    return value


def _string_from_dict(data: object, where: str) -> str:
    if type(data) is not str:
        raise ValueError(f"{where} must be a string, got {type(data).__name__}")
    return data


# --- Message IR, and its JSON codec -----------------------------------------------

JSON: TypeAlias = Union[bool, int, float, str, Sequence["JSON"], Mapping[str, "JSON"], None]
"""A JSON value. Frozen JSON (as a ToolCall holds it) uses read-only mappings and tuples."""


@dataclass(frozen=True)
class TextBlock:
    """Assistant text."""

    text: str
    type: ClassVar[Literal["text"]] = "text"

    def to_dict(self) -> Dict[str, Any]:
        """Returns the seed's JSON shape of this object (plain dicts and lists)."""
        return {"type": self.type, "text": self.text}


@dataclass(frozen=True)
class ThinkingBlock:
    """The model's thinking, kept in the transcript so that it can be sent back exactly.

    ``signature`` is the provider's proof of the thinking, when it gives one. A
    redacted block (``redacted=True``) holds the provider's opaque data as its
    ``signature`` (a non-empty str), and its ``thinking`` is ``""``. The loop rejects a
    block that breaks these rules where it enters, like any malformed block.
    """

    thinking: str
    signature: Optional[str] = None
    redacted: bool = False
    type: ClassVar[Literal["thinking"]] = "thinking"

    def to_dict(self) -> Dict[str, Any]:
        """Returns the JSON shape of this object, as Pi writes it: ``thinkingSignature``
        only when there is one, ``redacted`` only when true."""
        data: Dict[str, Any] = {"type": self.type, "thinking": self.thinking}
        if self.signature is not None:
            data["thinkingSignature"] = self.signature
        if self.redacted:
            data["redacted"] = True
        return data


@dataclass(frozen=True, eq=False)
class ToolCall:
    """A request from the model to run one tool.

    ``arguments`` is a frozen copy made when the call is built: objects become
    read-only mappings and arrays become tuples, so the caller's dict can change
    afterwards without touching the call. The constructor rejects no arguments it can
    read: arguments that are not plain bounded JSON are kept as given (a read-only
    mapping as a plain dict copy of it), and the run that receives such a call fails
    with MODEL_PROTOCOL_ERROR before any tool runs (``execute_tool_call`` makes it an
    error result). Two calls are equal when their id, name and arguments are equal as
    JSON (``True`` is not ``1``).
    """

    id: str
    name: str
    arguments: Mapping[str, JSON]
    # The proof that the arguments are plain bounded JSON: __post_init__ sets it True
    # only when it froze them, which it does only when they pass every bound. The run
    # trusts this flag (_check_arguments), never the type of the arguments. It is not
    # a constructor argument, and is neither compared nor shown.
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

    def to_dict(self) -> Dict[str, Any]:
        """Returns the seed's JSON shape of this object (plain dicts and lists)."""
        return {
            "type": self.type,
            "id": self.id,
            "name": self.name,
            "arguments": self.plain_arguments(),
        }


def _block_from_dict(data: object, where: str) -> Union[TextBlock, ThinkingBlock, ToolCall]:
    """Reads a TextBlock, ThinkingBlock or ToolCall from its to_dict() form."""
    block = _object(data, where)
    kind = _read_choice(block, "type", ("text", "thinking", "toolCall"), where)
    if kind == "text":
        return TextBlock(_read(block, "text", str, where))
    if kind == "thinking":
        thinking = ThinkingBlock(
            _read(block, "thinking", str, where),
            _read_optional(block, "thinkingSignature", str, where),
            _read_optional(block, "redacted", bool, where) is True,
        )
        try:
            return _checked_thinking(thinking)
        except _Problem as problem:
            raise ValueError(f"{where}: {problem}") from None
    arguments = _read(block, "arguments", dict, where)
    try:
        _frozen_arguments(arguments)
    except _Problem as problem:
        raise ValueError(f"{where}.arguments: {problem}") from None
    return ToolCall(_read(block, "id", str, where), _read(block, "name", str, where), arguments)


def _tool_call_from_dict(data: object, where: str) -> ToolCall:
    block = _block_from_dict(data, where)
    if not isinstance(block, ToolCall):
        raise ValueError(f"{where} must be a toolCall block")
    return block


@dataclass(frozen=True)
class UserMessage:
    """A message from the user."""

    id: str
    content: str
    role: ClassVar[Literal["user"]] = "user"

    def to_dict(self) -> Dict[str, Any]:
        """Returns the seed's JSON shape of this object (plain dicts and lists)."""
        return {"id": self.id, "role": self.role, "content": self.content}


@dataclass(frozen=True)
class AssistantMessage:
    """A complete assistant response: text, thinking and tool-call blocks, in the model's
    order, and the usage of the response it came from (None: unknown).

    The usage is the message's own record of what it cost, so that a saved transcript
    carries it: it is not part of what a model is sent back.
    """

    id: str
    content: Sequence[Union[TextBlock, ThinkingBlock, ToolCall]]  # stored as a tuple
    usage: Optional[Usage] = None
    role: ClassVar[Literal["assistant"]] = "assistant"

    def __post_init__(self) -> None:
        object.__setattr__(self, "content", tuple(self.content))

    def to_dict(self) -> Dict[str, Any]:
        """Returns the seed's JSON shape of this object, and ``usage`` when it is known."""
        data: Dict[str, Any] = {
            "id": self.id,
            "role": self.role,
            "content": [block.to_dict() for block in self.content],
        }
        if self.usage is not None:
            data["usage"] = self.usage.to_dict()
        return data


@dataclass(frozen=True)
class ToolResultMessage:
    """The result of one tool call, linked to it by ``tool_call_id``."""

    id: str
    tool_call_id: str
    tool_name: str
    content: str
    is_error: bool
    role: ClassVar[Literal["toolResult"]] = "toolResult"

    def to_dict(self) -> Dict[str, Any]:
        """Returns the seed's JSON shape of this object (plain dicts and lists)."""
        return {
            "id": self.id,
            "role": self.role,
            "toolCallId": self.tool_call_id,
            "toolName": self.tool_name,
            "content": self.content,
            "isError": self.is_error,
        }


Message = Union[UserMessage, AssistantMessage, ToolResultMessage]


def message_from_dict(data: Dict[str, Any]) -> Message:
    """Reads a message from its ``to_dict()`` form (plain dicts and lists, as json.loads
    gives). Raises ValueError naming the field that is missing or malformed."""
    return _message_from_dict(data, "message")


def _message_from_dict(data: object, where: str) -> Message:
    message = _object(data, where)
    role = _read_choice(message, "role", ("user", "assistant", "toolResult"), where)
    message_id = _read(message, "id", str, where)
    if role == "user":
        return UserMessage(message_id, _read(message, "content", str, where))
    if role == "assistant":
        blocks = _read(message, "content", list, where)
        return AssistantMessage(
            message_id,
            tuple(_block_from_dict(b, f"{where}.content[{i}]") for i, b in enumerate(blocks)),
            _usage_from_dict(message, where),
        )
    return ToolResultMessage(
        message_id,
        _read(message, "toolCallId", str, where),
        _read(message, "toolName", str, where),
        _read(message, "content", str, where),
        _read(message, "isError", bool, where),
    )


def _tool_result_from_dict(data: object, where: str) -> ToolResultMessage:
    message = _message_from_dict(data, where)
    if not isinstance(message, ToolResultMessage):
        raise ValueError(f"{where} must be a toolResult message")
    return message


def text_from_assistant(message: AssistantMessage) -> str:
    """Returns the text blocks of an assistant message, concatenated with no separator
    (thinking is left out)."""
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
"""Why a run failed (see the README's table of failure codes)."""
EventType = Literal[
    "message.accepted", "model.chunk", "tool.started", "tool.finished", "run.finished"
]
"""The five kinds of event a run yields."""
_RUN_STATUSES: Final = get_args(RunStatus)
_FAILURE_CODES: Final = get_args(FailureCode)
_EVENT_TYPES: Final = get_args(EventType)


@dataclass(frozen=True)
class RunError:
    """Why a run failed: one of the seed's failure codes and a readable message.

    ``exception`` is the exception that failed the run (a model's stream or a tool
    phase raised it), or None. It is for the caller (a provider's ``retry_after``,
    say), so it is not part of ``to_dict()`` or of equality.
    """

    code: FailureCode
    message: str
    exception: Optional[BaseException] = field(default=None, compare=False, repr=False)

    def to_dict(self) -> Dict[str, Any]:
        """Returns the seed's JSON shape of this object (plain dicts and lists)."""
        return {"code": self.code, "message": self.message}


@dataclass(frozen=True)
class RunResult:
    """How a run ended, and the transcript it ended with (complete messages only).

    ``request_sequence_start`` is the run's option of that name, so that
    ``next_request_sequence`` can say where a resumed run's request ids go on.
    ``usage`` is the sum (``Usage.__add__``) of the usage of the responses this run
    appended: None when it appended none, and every field None if one of them had no
    usage. A failed or cancelled run sums the responses it did append.
    """

    status: RunStatus
    messages: Tuple[Message, ...]
    steps: int
    final_text: Optional[str] = None
    max_steps: Optional[int] = None
    error: Optional[RunError] = None
    request_sequence_start: int = 0
    usage: Optional[Usage] = None

    @property
    def next_request_sequence(self) -> int:
        """``request_sequence_start + steps``: pass it as the next run's
        ``request_sequence_start``, and its first request id follows this run's last."""
        return self.request_sequence_start + self.steps

    def to_dict(self) -> Dict[str, Any]:
        """Returns the seed's JSON shape of this result; optional keys only when set.

        ``requestSequenceStart`` is written only when it is not 0, and ``usage`` only
        when it is not None.
        """
        data: Dict[str, Any] = {
            "status": self.status,
            "messages": [message.to_dict() for message in self.messages],
            "steps": self.steps,
        }
        if self.final_text is not None:
            data["finalText"] = self.final_text
        if self.max_steps is not None:
            data["maxSteps"] = self.max_steps
        if self.error is not None:
            data["error"] = self.error.to_dict()
        if self.request_sequence_start != 0:
            data["requestSequenceStart"] = self.request_sequence_start
        if self.usage is not None:
            data["usage"] = self.usage.to_dict()
        return data


def _result_from_dict(data: object, where: str) -> RunResult:
    result = _object(data, where)
    error = None
    if result.get("error") is not None:
        error_data = _object(result["error"], f"{where}.error")
        error = RunError(
            _read_choice(error_data, "code", _FAILURE_CODES, f"{where}.error"),
            _read(error_data, "message", str, f"{where}.error"),
        )
    messages = _read(result, "messages", list, where)
    return RunResult(
        _read_choice(result, "status", _RUN_STATUSES, where),
        tuple(_message_from_dict(m, f"{where}.messages[{i}]") for i, m in enumerate(messages)),
        _read(result, "steps", int, where),
        final_text=_read_optional(result, "finalText", str, where),
        max_steps=_read_optional(result, "maxSteps", int, where),
        error=error,
        request_sequence_start=_read_optional(result, "requestSequenceStart", int, where) or 0,
        usage=_usage_from_dict(result, where),
    )


_PAYLOAD_JSON_KEYS: Final = {
    "message": "message",
    "request_id": "requestId",
    "chunk": "chunk",
    "tool_call": "toolCall",
    "tool_result": "toolResult",
    "result": "result",
}


@dataclass(frozen=True)
class Event:
    """One observable step of a run, numbered by the run's single counter.

    ``payload`` is read-only: a read-only mapping (``MappingProxyType``) is kept as
    given, and any other mapping is copied into one.
    """

    sequence: int
    type: EventType
    payload: Mapping[str, Any]
    __hash__ = None  # type: ignore[assignment]  # it holds a mapping

    def __post_init__(self) -> None:
        # A read-only mapping is kept as given: the loop builds each event's payload as a
        # new mapping, read-only, and copying it again would cost every event of a run.
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
                _PAYLOAD_JSON_KEYS[key]: value if isinstance(value, str) else value.to_dict()
                for key, value in self.payload.items()
            },
        }


# For each event type: its payload keys (as in Python) and how to read each from JSON.
_PAYLOAD_READERS: Final[Dict[str, Tuple[Tuple[str, Callable[[object, str], object]], ...]]] = {
    "message.accepted": (("message", _message_from_dict),),
    "model.chunk": (("request_id", _string_from_dict), ("chunk", _chunk_from_dict)),
    "tool.started": (("request_id", _string_from_dict), ("tool_call", _tool_call_from_dict)),
    "tool.finished": (
        ("request_id", _string_from_dict),
        ("tool_call", _tool_call_from_dict),
        ("tool_result", _tool_result_from_dict),
    ),
    "run.finished": (("result", _result_from_dict),),
}


def event_from_dict(data: Dict[str, Any]) -> Event:
    """Reads an event from its ``to_dict()`` form (plain dicts and lists, as json.loads
    gives). Raises ValueError naming the field that is missing or malformed."""
    event = _object(data, "event")
    event_type = _read_choice(event, "type", _EVENT_TYPES, "event")
    payload_data = _read(event, "payload", dict, "event")
    payload = {}
    for key, reader in _PAYLOAD_READERS[event_type]:
        json_key = _PAYLOAD_JSON_KEYS[key]
        if json_key not in payload_data:
            raise ValueError(f"event.payload.{json_key} is missing")
        payload[key] = reader(payload_data[json_key], f"event.payload.{json_key}")
    return Event(_read(event, "sequence", int, "event"), event_type, MappingProxyType(payload))


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
    """Returns the transcript with an ``is_error=True`` result carrying ``content`` for
    each open tool call, so that a cancelled run's transcript can start a new run.

    The loop never writes such a result itself: whether an interrupted call failed is
    the caller's decision. Raises TypeError if content is not a str.
    """
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
    """Drains a run; returns its events and its RunResult.

    ``on_event``, if given, is called with each event as the run yields it, before the
    run goes on (``print_event`` prints it; stream it to a screen, set the signal). If
    it raises, the run is closed (its model stream too) and the exception propagates.
    """
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
    """Prints one readable line for an event to ``file`` (default: ``sys.stdout``), flushed.

    Use it as ``settle_run(run, on_event=print_event)``. The line is the sequence, the
    type and what the event says: text as a JSON string, a call as ``name(arguments)
    [id]``, a tool result as ``name ok: content`` or ``name error: content``; the
    ``run.finished`` line is the result, with the usage reported (``unknown``: no count),
    the calls left without a result and the error. An unprintable character (a line
    break) is written as its escape, so that an event is always one line.
    """
    payload = event.payload
    if event.type == "message.accepted":
        detail = _message_text(payload["message"])
    elif event.type == "model.chunk":
        chunk = payload["chunk"]
        shown = chunk.tool_call if isinstance(chunk, ToolCallChunk) else chunk
        detail = f"{payload['request_id']} {_piece_text(shown)}"
    elif event.type == "tool.started":
        detail = f"{payload['request_id']} {_call_text(payload['tool_call'])}"
    elif event.type == "tool.finished":
        detail = f"{payload['request_id']} {_outcome_text(payload['tool_result'])}"
    else:
        detail = _result_text(payload["result"])
    line = f"{event.sequence:3d}  {event.type:<16}  {detail}"
    if not line.isprintable():  # a line break, say, in what a model or a tool wrote
        line = "".join(char if char.isprintable() else ascii(char)[1:-1] for char in line)
    print(line, file=file, flush=True)


def _message_text(message: Message) -> str:
    """A message as print_event shows it: its role and id, then its content."""
    if isinstance(message, UserMessage):
        content = json.dumps(message.content, ensure_ascii=False)
    elif isinstance(message, AssistantMessage):
        content = ", ".join(_piece_text(block) for block in message.content)
    else:
        content = _outcome_text(message)
    return f"{message.role} {message.id}: {content}"


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


def _outcome_text(result: ToolResultMessage) -> str:
    """A tool result as print_event shows it: name ok: content, or name error: content."""
    return f"{result.tool_name} {'error' if result.is_error else 'ok'}: {result.content}"


def _result_text(result: RunResult) -> str:
    """A RunResult as print_event shows it, on the run.finished line."""
    parts = [f"{result.status} after {result.steps} step(s)", f"{len(result.messages)} messages"]
    if result.usage is not None:  # the counts the model reported, by their JSON keys
        counts = ", ".join(f"{key} {count}" for key, count in result.usage.to_dict().items())
        parts.append(f"usage: {counts or 'unknown'}")
    open_calls = open_tool_calls(result.messages)
    if open_calls:
        parts.append("left without a result: " + ", ".join(call.id for call in open_calls))
    if result.error is not None:
        parts.append(f"error: {result.error.code}: {result.error.message}")
    return ", ".join(parts)


@dataclass(frozen=True)
class ScriptedResponse:
    """One turn of a ScriptedModel: the response it returns and the chunks it streams.

    Build it with ``scripted_response()``, which says what each field does.
    """

    id: str
    content: Sequence[Union[TextBlock, ThinkingBlock, ToolCall]]  # stored as a tuple
    stop_reason: StopReason
    chunks: Optional[Sequence[Union[TextBlock, ThinkingBlock, ToolCall]]] = None  # a tuple
    request_id: Optional[str] = None
    usage: Optional[Usage] = None

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


def scripted_response(
    id: str,
    content: Iterable[Union[TextBlock, ThinkingBlock, ToolCall]],
    stop_reason: StopReason,
    *,
    chunks: Optional[Iterable[Union[TextBlock, ThinkingBlock, ToolCall]]] = None,
    request_id: Optional[str] = None,
    usage: Optional[Usage] = None,
) -> ScriptedResponse:
    """One scripted model turn.

    The model streams each block of ``chunks`` (default: ``content``) as one chunk
    with the active request id (a TextBlock as a TextDelta of its text, a ThinkingBlock
    as a ThinkingDelta of its thinking, a ToolCall as a ToolCallChunk), then returns
    ``ModelResponse(id, request_id or the active request id, content, stop_reason,
    usage)``.
    """
    return ScriptedResponse(
        id,
        tuple(content),
        stop_reason,
        chunks=None if chunks is None else tuple(chunks),
        request_id=request_id,
        usage=usage,
    )


class ScriptedModel:
    """A deterministic model that replays scripted responses in order, for tests and demos.

    ``requests`` records every ModelRequest and ``call_count`` counts ``stream()``
    calls. A call with no response left raises RuntimeError (after being counted and
    recorded), so a run that asks for one turn too many fails with MODEL_STREAM_ERROR.
    """

    def __init__(self, responses: Iterable[ScriptedResponse]) -> None:
        self._responses = tuple(responses)
        self.requests: List[ModelRequest] = []
        self.call_count = 0

    @classmethod
    def from_transcript(cls, messages: Iterable[Message]) -> ScriptedModel:
        """A model that replays the assistant messages of a recorded transcript, in order.

        It streams one chunk per block, returns each message's usage with its response,
        and leaves the tools to the caller, who runs them again.
        (``agent_loop_replay.replay()`` of the run's event log replays it exactly.)
        """
        responses = []
        for message in messages:
            if isinstance(message, AssistantMessage):
                stop_reason: StopReason = "toolCall" if _tool_calls(message) else "stop"
                response_id = _response_id(message.id)
                responses.append(
                    scripted_response(
                        response_id, message.content, stop_reason, usage=message.usage
                    )
                )
        return cls(responses)

    def stream(
        self, request: ModelRequest, signal: Signal
    ) -> Generator[ModelChunk, None, ModelResponse]:
        """Records the request and streams the next scripted turn for it.

        Raises RuntimeError when no scripted turn is left.
        """
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
            scripted.id, request_id, scripted.content, scripted.stop_reason, scripted.usage
        )


# --- The demonstration ------------------------------------------------------------


def _demo_model() -> ScriptedModel:
    """A three-step script: thinking and one tool, then two calls (one fails), then the
    answer; each response with the usage a provider with a prompt cache would report."""
    thinking = ThinkingBlock("Two operations: the sum first, then the division.", "sig-demo-001")
    add = ToolCall("call-add-001", "add", {"left": 20, "right": 22})
    half = ToolCall("call-divide-001", "divide", {"dividend": 42, "divisor": 2})
    by_zero = ToolCall("call-divide-002", "divide", {"dividend": 42, "divisor": 0})
    answer = ["(20 + 22) / 2 = 21. ", "42 / 0 has no value: ", "division by zero."]
    return ScriptedModel(
        [
            scripted_response(
                "response-001",
                [thinking, TextBlock("First the sum."), add],
                "toolCall",
                usage=Usage(412, 58, 0, 1024, 12),
            ),
            scripted_response(
                "response-002", [half, by_zero], "toolCall", usage=Usage(96, 41, 1024, 0, 0)
            ),
            scripted_response(
                "response-003",
                [TextBlock("".join(answer))],
                "stop",
                chunks=[TextBlock(piece) for piece in answer],
                usage=Usage(188, 19, 1024, 0, 0),
            ),
        ]
    )


def _main(argv: Optional[Sequence[str]] = None) -> int:
    """The demonstration: a scripted run over two tools, printed one event per line."""
    parser = argparse.ArgumentParser(
        prog="python agent_loop.py",
        description="Runs the Agent Loop on a scripted model with two tools (one call "
        "fails, recoverably) and prints each event on one line, the result last.",
    )
    parser.add_argument("--json", action="store_true", help="print each event as JSON")
    budget = f"the step budget, 1..{MAX_AGENT_STEPS} (the demo needs 3)"
    parser.add_argument("--max-steps", type=int, default=MAX_AGENT_STEPS, metavar="N", help=budget)
    parser.add_argument(
        "--cancel-after", type=int, metavar="K", help="set the signal once event K is printed"
    )
    options = parser.parse_args(argv)
    if not 1 <= options.max_steps <= MAX_AGENT_STEPS:
        parser.error(f"argument --max-steps: {options.max_steps} is not in 1..{MAX_AGENT_STEPS}")
    if options.cancel_after is not None and options.cancel_after < 0:
        parser.error(f"argument --cancel-after: {options.cancel_after} is negative")
    signal = threading.Event()

    def show(event: Event) -> None:
        if options.json:
            print(json.dumps(event.to_dict(), ensure_ascii=False))
        else:
            print_event(event)
        if event.sequence == options.cancel_after:
            signal.set()

    def add(left: float, right: float) -> object:
        """Adds two numbers."""
        return {"sum": left + right}

    def divide(dividend: float, divisor: float) -> object:
        """Divides one number by another."""
        return {"quotient": dividend / divisor}  # by 0: an exception, a recoverable result

    settle_run(
        run_agent_loop(
            messages=[UserMessage("user-001", "What is (20 + 22) / 2? And 42 / 0?")],
            model=_demo_model(),
            tools=ToolRegistry([Tool.from_function(add), Tool.from_function(divide)]),
            max_steps=options.max_steps,
            signal=signal,
        ),
        on_event=show,
    )
    return 0


if __name__ == "__main__":
    try:
        status = _main()
        sys.stdout.flush()  # here, where a broken pipe can still be caught
    except BrokenPipeError:
        # The reader left early (`--json | head`): stop quietly, as other tools do, and
        # keep Python from reporting the same broken pipe again when it flushes stdout.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 1
    sys.exit(status)
