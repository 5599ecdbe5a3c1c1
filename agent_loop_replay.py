# agent_loop_replay.py 1.3.0: record and replay runs for agent_loop.py.
# One file, standard library only; copy it next to agent_loop.py. Home: the agent_loop repository.
"""Replay a recorded run of the Agent Loop offline, with the events it recorded.

An event log holds everything a run saw: the starting messages, every chunk as it was
streamed, every tool call and its result, and the final transcript. ``replay(events)``
rebuilds the run from it: a model that streams each step's chunks exactly as recorded
and returns the response the transcript holds, and tools that answer each call with its
recorded result without running anything. ``ReplayedRun.run()`` runs the loop on them.

Rules:

- A ``completed`` or ``maxSteps`` log replays exactly: the replayed events have the same
  ``to_dict()`` as the recording.
- A ``cancelled`` or ``failed`` log replays to its last event before ``run.finished``,
  and there ``run()`` cancels the run, as a consumer who sets the signal on seeing that
  event does (the loop looks at the signal after every event). So a cancelled run
  replays exactly, except one cancelled inside a request before its first chunk: the
  replay does not open that request (``steps`` is one less). A failed run ends
  ``cancelled`` after the same events: the log does not hold what the model sent or what
  the tool raised. An ``INVALID_TRANSCRIPT`` log holds no starting message: a ValueError.
- A run with ``tool_concurrency`` > 1 replays exactly: calls whose ``tool.started``
  events came in a row ran together; the tools of no such group replay as sequential.
  A cancelled group replays exactly whatever the timing (once the loop sees the signal,
  no more results join); a log where a result follows a call still open (1.3 could
  write one) is a ValueError; a run cancelled by ``before_tool_call`` before its last
  response's first call started replays without that response.
- A recorded call yields its recorded progress again before its result, so a log with
  ``tool.progress`` events replays byte for byte; calls at once give their progress and
  results in the log's order (``run()`` passes its events through ``Recording.ordered``,
  and a recorded call waits, bounded, for the events before its turn). A run that ended
  on an ``ends_run`` tool replays ``completed``, with its output.
- A call that ``before_tool_call`` refused (its ``tool.finished`` says ``refused``) is
  refused again by ``ReplayedRun.before_tool_call``, with the recorded words.
- The replayed model compares each request with the transcript that the recording
  implies; with real tools in place of the recorded ones, a tool that now answers
  differently fails the run (``MODEL_STREAM_ERROR``) at the next request, with the
  request, the index of the first different message and both sides, shortened.

``dump_events(events, fp)`` writes an event log as JSON lines (one compact ASCII
``to_dict()`` per line, with ``times=True`` each with its time), ``load_events(fp)`` reads
it back, and ``load_timed_events(fp)`` reads it with times. This file knows no journal:
agent_loop_durable.py reads and writes those.

``RunSteps`` is the one reader of a run's log: fed its events in order, it holds its
steps (each request, its chunks and its calls) and refuses an event out of order.
Replay, durable runs, the page and the spans read runs through it.

``passed_on(run, on_event)`` is the one driver of a run with a hook on each event (replay,
durable runs and sessions pass their runs on through it), and ``KeptModel(model)`` keeps
the last response a model returned, which no event holds, until it is taken.

``durable_run()`` and ``JournalError`` (agent_loop_durable.py since 1.4) can still be
imported from here until 2.0. A ``Recording`` is what both features give again: replay
runs on one, a durable run on one read from its journal, and then live.

This file uses only the public names of ``agent_loop``.
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import importlib
import json
import threading
import time
from dataclasses import dataclass
from typing import (
    Any,
    Callable,
    Dict,
    Final,
    Generator,
    Iterable,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    cast,
)

import agent_loop as al

__version__ = "1.3.0"

__all__ = [
    "RunSteps",
    "Step",
    "Call",
    "replay",
    "ReplayedRun",
    "Recording",
    "dump_events",
    "event_seconds",
    "load_events",
    "load_timed_events",
    "json_line",
    "shortened_difference",
    "passed_on",
    "KeptModel",
]


def __getattr__(name: str) -> Any:
    """``durable_run`` and ``JournalError``, here since 1.3, live in agent_loop_durable.py,
    which builds on this module: loaded by name on first use, for 1.3's imports only.
    Deprecated: this re-export goes in 2.0; import them from agent_loop_durable."""
    if name in ("durable_run", "JournalError"):
        return getattr(importlib.import_module("agent_loop_durable"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_DRIFT_BEFORE: Final = 160
"""Characters of a drift message's sides shown before their first difference: enough
for a message's repr up to its content, with call ids as long as providers make them."""
_DRIFT_AFTER: Final = 60
"""Characters shown from the first difference on."""

_NO_OUTPUT: Final = object()
"""No recorded output: the call is not the one whose value the recorded run ended with."""


def replay(events: Iterable[al.Event]) -> ReplayedRun:
    """Rebuilds a recorded run from its event log, so that it runs again offline.

    ``events`` is one run's log: the live ``Event``s, or ``event_from_dict()`` of each
    line of a JSON lines file. Returns a ``ReplayedRun``: the starting messages, a model
    that streams each step's chunks exactly as recorded (same blocks, same segmentation,
    empty text deltas too) and returns the response the transcript holds (its thinking
    blocks, signatures included, and the usage its message kept), a registry
    with one tool per tool name the run's calls use, which answers each call with its
    recorded result (an error result as a ``ToolError``, so its content is exact), the
    recorded steps as the budget (at least 1), and the result's
    ``request_sequence_start``.

    Raises TypeError for an item that is not an Event, and ValueError, saying what is
    wrong, for a log that is not one whole run's: empty, sequences other than 0, 1, 2...
    in order, no ``run.finished`` at the end or another one before it,
    ``message.accepted`` after the start, an event naming a request the run did not open
    (or out of order), tool events that do not pair up, chunks that disagree with the
    response, a result whose transcript disagrees with the events, or a run that failed
    ``INVALID_TRANSCRIPT``.
    """
    run = RunSteps()
    for position, event in enumerate(events):
        _check_event("replay()", event, position)
        run.feed(event)
    result = run.result
    if result is None:
        raise ValueError("the log does not end with run.finished: it is not a whole run's")
    if result.error is not None and result.error.code == "INVALID_TRANSCRIPT":
        raise ValueError(
            "the run failed INVALID_TRANSCRIPT: its log holds none of the starting "
            "messages it rejected, so there is nothing to replay"
        )
    start = result.request_sequence_start
    budget = max(result.steps, 1)
    if not 0 <= start <= al.MAX_AGENT_STEPS - budget:
        raise ValueError(
            f"the result's request_sequence_start {start} and steps {result.steps} do not "
            f"fit in {al.MAX_AGENT_STEPS} requests"
        )
    accepted = run.accepted
    # A run cancelled before its first request holds every starting message, accepted or not.
    messages = result.messages if result.steps == 0 else accepted
    if result.messages[: len(accepted)] != accepted:
        raise ValueError("the result's transcript does not begin with the accepted messages")
    steps = _recorded_steps(run, result, len(messages))
    complete = result.status in ("completed", "maxSteps")
    calls = [call for step in run.steps for call in step.calls]
    # Replay is the recording with nothing behind it.
    recording = Recording(
        {step.request_id: (step.chunks, step.response) for step in steps if step.response},
        {call: result for step in steps for call, result in zip(step.calls, step.results)},
        {
            call.tool_call.id: cast(al.ToolResultMessage, call.result).content
            for call in calls
            if call.refused
        },
        run,
    )
    model = _ReplayedModel(steps, recording, None if complete else len(run.events) - 2)
    names = dict.fromkeys(call.tool_call.name for call in calls)
    # A run with tool_concurrency > 1 scheduled groups: tool.started events in a row. A
    # tool whose calls were never in one replays as sequential (a barrier): a call alone
    # stays alone, and the groups are the recorded ones.
    together = {
        name
        for one, next_one in zip(calls, calls[1:])
        if next_one.started == one.started + 1
        for name in (one.tool_call.name, next_one.tool_call.name)
    }
    ends_run = {call.tool_call.name for call in calls if call.ends_run}
    tools = al.ToolRegistry(
        recording.tool(_recorded_tool(model, name, name not in together, name in ends_run))
        for name in names
    )
    concurrency = _largest_group(calls)
    # A call refused in the recording is refused again, by the same words.
    hook = recording.before_tool_call(None) if recording.decisions else None
    return ReplayedRun(messages, model, tools, budget, start, concurrency, hook)


@dataclass(frozen=True)
class ReplayedRun:
    """A recorded run, rebuilt by ``replay()``; ``run()`` runs it again.

    The fields are the options of ``run_agent_loop()``: replace one with
    ``dataclasses.replace()`` (real tools, another budget) to run a variant. The model
    and the recorded tools work together and keep track of the request being replayed:
    run one replay of them at a time.
    """

    messages: Tuple[al.Message, ...]
    model: al.Model
    tools: al.ToolRegistry
    max_steps: int
    request_sequence_start: int = 0
    tool_concurrency: int = 1
    before_tool_call: Optional[Callable[[al.ToolCall, Any], Optional[str]]] = None

    def run(self) -> Generator[al.Event, None, al.RunResult]:
        """Returns ``run_agent_loop()`` on these fields, with a signal of its own.

        With the model of a cancelled or failed log, the run is cancelled right after
        it yields the log's last event before ``run.finished`` (before its first event
        when the log has no other). Raises as ``run_agent_loop()`` does.
        """
        signal = threading.Event()
        run = al.run_agent_loop(
            messages=self.messages,
            model=self.model,
            tools=self.tools,
            max_steps=self.max_steps,
            signal=signal,
            request_sequence_start=self.request_sequence_start,
            tool_concurrency=self.tool_concurrency,
            before_tool_call=self.before_tool_call,
        )
        if not isinstance(self.model, _ReplayedModel):
            return run
        # Calls run at once give their progress and results in the log's order.
        run = self.model.recording.ordered(run)
        if self.model.stop_after is not None:
            return _cancelled_after(run, signal, self.model.stop_after)
        return run


def _cancelled_after(
    run: Generator[al.Event, None, al.RunResult], signal: threading.Event, last: int
) -> Generator[al.Event, None, al.RunResult]:
    """The run, cancelled as a consumer who sets the signal on seeing event ``last`` does
    (-1: before the first event). The signal is set as the event is passed on, not once
    the consumer asks for the next: the same to the run, which looks at its signal when
    it is resumed, after every event."""
    if last == -1:
        signal.set()

    def cancel_after(event: al.Event) -> None:
        if event.sequence == last:
            signal.set()

    return passed_on(run, cancel_after)


@dataclass(frozen=True)
class _RecordedStep:
    """One request of a recording: what it was sent, what it streamed and answered."""

    request_id: str
    messages: Tuple[al.Message, ...]  # the request's transcript, as the recording implies it
    chunks: Tuple[al.ModelChunk, ...]
    response: Optional[al.ModelResponse]  # None: the log stops inside this request
    calls: Tuple[al.ToolCall, ...]
    results: Tuple[al.ToolResultMessage, ...]  # fewer than calls where the log stops


def _largest_group(calls: Sequence[Call]) -> int:
    """The most calls whose tool.started events came in a row (at least 1)."""
    largest = length = 1
    for one, next_one in zip(calls, calls[1:]):
        length = length + 1 if next_one.started == one.started + 1 else 1
        largest = max(largest, length)
    return largest


def _recorded_steps(run: RunSteps, result: al.RunResult, start_length: int) -> List[_RecordedStep]:
    """The steps of a whole log, as RunSteps read them, checked against the result's
    transcript."""
    request_ids = [
        al.request_id(result.request_sequence_start + step) for step in range(1, result.steps + 1)
    ]
    read = {step.request_id: step for step in run.steps}
    if list(read) != request_ids[: len(read)]:
        raise ValueError(
            f"the log's requests ({', '.join(read)}) are not the result's "
            f"({', '.join(request_ids) or 'none'}, in that order)"
        )
    events = run.events
    chunks = [
        [events[position].payload["chunk"] for position in read[request_id].chunks]
        if request_id in read
        else []
        for request_id in request_ids
    ]
    started = [
        [call.tool_call for call in read[request_id].calls] if request_id in read else []
        for request_id in request_ids
    ]
    finished = [
        [call.result for call in read[request_id].calls if call.result is not None]
        if request_id in read
        else []
        for request_id in request_ids
    ]

    # The transcript the run added: each assistant message, then its tool results.
    groups: List[Tuple[al.AssistantMessage, List[al.ToolResultMessage]]] = []
    for message in result.messages[start_length:]:
        if isinstance(message, al.AssistantMessage) and al.response_id_of(message.id) is not None:
            groups.append((message, []))
        elif isinstance(message, al.ToolResultMessage) and groups:
            groups[-1][1].append(message)
        else:
            raise ValueError(
                f"the result's transcript holds {message.role} message {message.id!r} after "
                "the starting messages, where a run adds only assistant messages (whose ids "
                "agent_loop.assistant_message_id() makes), each followed by its tool results"
            )
    complete = result.status in ("completed", "maxSteps")
    if not (
        len(groups) == result.steps >= 1
        if complete
        else result.steps - 1 <= len(groups) <= result.steps
    ):
        raise ValueError(
            f"the result's transcript holds {len(groups)} assistant message(s) for "
            f"{result.steps} step(s) of a {result.status} run"
        )
    steps = []
    length = start_length
    for index, request_id in enumerate(request_ids):
        calls: Tuple[al.ToolCall, ...] = ()
        response = None
        if index < len(groups):
            message, results = groups[index]
            calls = tuple(block for block in message.content if isinstance(block, al.ToolCall))
            stopped_here = not complete and index == len(request_ids) - 1
            if (
                finished[index] != results
                or tuple(started[index]) != calls[: len(started[index])]
                or (len(results) != len(calls) and not stopped_here)
            ):
                raise ValueError(
                    f"the tool events of {request_id} do not agree with the result's transcript"
                )
            response = al.ModelResponse(
                cast(str, al.response_id_of(message.id)),  # not None: it is in groups
                request_id,
                message.content,
                "toolCall" if calls else "stop",
                message.usage,
                message.provider_response_id,
            )
            _check_recorded_stream(request_id, chunks[index], response)
        elif started[index]:
            raise ValueError(f"{request_id} ran tools, but the result holds no response to it")
        steps.append(
            _RecordedStep(
                request_id,
                result.messages[:length],
                tuple(chunks[index]),
                response,
                calls,
                tuple(finished[index]),
            )
        )
        length += 1 + len(calls)
    return steps


def _check_recorded_stream(
    request_id: str, chunks: Sequence[al.ModelChunk], response: al.ModelResponse
) -> None:
    """A step's recorded chunks agree with its response, as the loop checked them when it
    recorded the step (the replayed run checks them once more)."""
    try:
        al.check_stream_agreement(chunks, response)
    except ValueError as problem:
        raise ValueError(
            f"the chunks of {request_id} do not agree with the result's transcript: {problem}"
        ) from None


def _first_difference(left: Sequence[Any], right: Sequence[Any]) -> Optional[int]:
    """The first index at which two sequences differ (one may end first), or None."""
    for index, (left_item, right_item) in enumerate(zip(left, right)):
        if left_item != right_item:
            return index
    return None if len(left) == len(right) else min(len(left), len(right))


class _ReplayedModel:
    """replay()'s model: checks each request against the recording, then streams its
    step from the Recording (a step the log stops inside: its chunks, then an error).

    Its tools (``_recorded_tool``) stand behind the Recording's: they are asked only
    about a call without a recorded result. ``stop_after`` is the sequence of a cancelled
    or failed log's last event before run.finished (-1: it has none), else None.
    """

    def __init__(
        self, steps: Sequence[_RecordedStep], recording: Recording, stop_after: Optional[int]
    ) -> None:
        self._steps = {step.request_id: step for step in steps}
        self.recording = recording
        self._recorded = recording.model(self)
        self.stop_after = stop_after
        self._active: Optional[_RecordedStep] = None

    def stream(
        self, request: al.ModelRequest, signal: al.Signal
    ) -> Generator[al.ModelChunk, None, al.ModelResponse]:
        """Checks the request against the recording and streams the recorded step.

        Raises RuntimeError for a request the recording does not hold or that differs
        from the recorded one."""
        step = self._steps.get(request.id)
        if step is None:
            held = ", ".join(self._steps) or "none"
            raise RuntimeError(f"the recording holds no {request.id} (it holds {held})")
        index = _first_difference(step.messages, request.messages)
        if index is not None:
            recorded, got = _drift_sides(step.messages, request.messages, index)
            raise RuntimeError(
                f"{request.id} differs from the recording at message {index}: "
                f"recorded {recorded}, got {got}"
            )
        self._active = step
        if step.response is None:  # the Recording holds no such step: it comes back here
            return self._unfinished(step)
        return self._recorded.stream(request, signal)

    @staticmethod
    def _unfinished(step: _RecordedStep) -> Generator[al.ModelChunk, None, al.ModelResponse]:
        yield from step.chunks
        # ReplayedRun.run() cancels the run before this.
        raise RuntimeError(
            f"the recording stops inside {step.request_id}: replay it with "
            "ReplayedRun.run(), which cancels the run where its log stops"
        )

    def answer(self, name: str, signal: al.Signal) -> object:
        """A recorded tool's execute, for a call without a recorded result: a call the log
        left open in the active step (the run was cancelled while it ran) waits for the
        replay's cancellation, whose signal discards it; any other is a RuntimeError."""
        step, call = self._active, al.current_tool_call()
        if step is None or call is None or call.name != name or call not in step.calls:
            raise RuntimeError(
                f"the recording has no call of tool {name!r} with these arguments here "
                "(the recorded tools answer the replayed model's calls)"
            )
        # ReplayedRun.run() sets the signal once the log's last event is given; bounded, so
        # that a replay run by hand (which nothing cancels) fails instead of hanging.
        if not signal.wait(_TURN_SECONDS):
            raise RuntimeError(
                f"tool call {call.id!r} was open when the recording ended, and the "
                f"replay was not cancelled within {_TURN_SECONDS:.0f} s: replay it with "
                "ReplayedRun.run(), which cancels the run where its log stops"
            )
        return "interrupted in the recording"  # discarded: the signal is set


def _recorded_answer(
    result: al.ToolResultMessage, ends_run: bool = False, output: object = _NO_OUTPUT
) -> object:
    """What a tool returns, or raises, for execute_tool_call() to build exactly ``result``:
    its content, or for an error result a ToolError of it (whose content is exact). An
    ``ends_run`` tool returns the value the run's output was (``output``), or else its
    content read as JSON where the loop's encoding of it gives that content again (a
    value, not a text, as most tools that end a run return)."""
    if result.is_error:
        raise al.ToolError(result.content)
    if not ends_run:
        return result.content
    if output is not _NO_OUTPUT:
        return output
    try:
        value = json.loads(result.content)
        again = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError:  # not JSON, or NaN
        return result.content
    return value if again == result.content and not isinstance(value, str) else result.content


def _recorded_tool(model: _ReplayedModel, name: str, sequential: bool, ends_run: bool) -> al.Tool:
    """A tool that accepts any arguments and answers with the recorded results (one that
    ends the run where the recorded one did)."""

    def execute(arguments: Dict[str, Any], signal: al.Signal) -> object:
        return model.answer(name, signal)

    description = f"Answers as the recorded tool {name!r} did."
    return al.Tool(
        name, description, {"type": "object"}, execute, sequential=sequential, ends_run=ends_run
    )


def _drift_sides(
    recorded: Sequence[al.Message], got: Sequence[al.Message], index: int
) -> Tuple[str, str]:
    """The reprs of two different messages (or "nothing"), shortened around where they differ."""
    left, right = (
        repr(side[index]) if index < len(side) else "nothing" for side in (recorded, got)
    )
    return shortened_difference(left, right)


def shortened_difference(left: str, right: str) -> Tuple[str, str]:
    """Two different texts, each shortened around the place where they first differ (from
    160 characters before it to 60 after, "..." marking a cut): what replay's drift
    messages and a journal's refusals show of the two sides."""
    at = _first_difference(left, right) or 0  # equal texts: from the start
    begin = max(0, at - _DRIFT_BEFORE)

    def window(text: str) -> str:
        end = at + _DRIFT_AFTER
        return ("..." if begin else "") + text[begin:end] + ("..." if end < len(text) else "")

    return window(left), window(right)


def _check_event(function: str, event: object, position: int) -> None:
    """A function that takes events takes Events: a TypeError names what it got, and where."""
    if type(event) is not al.Event:
        kind = type(event).__name__
        raise TypeError(f"{function} takes Events, got {kind} at position {position}")


# --- A run's steps, read from its events -----------------------------------------
#
# The one reader of a run's log: replay, durable runs, the page and the spans read a run
# through it, and a new event type is taught here alone. Fed one event at a time, as h11's
# Connection is fed bytes, it keeps what the events say so far; an event that cannot come
# where it comes is refused (ValueError), and the reader is as it was before it.


@dataclass(frozen=True)
class Call:
    """One tool call of a step, by the positions (in the order fed, from 0) of its events.

    ``started`` is its ``tool.started``; ``finished`` its ``tool.finished`` (None while the
    call is open); ``result`` the result that event carries (None while open);
    ``refused`` and ``ends_run`` what that event says; ``progress`` its ``tool.progress``
    events. A call's end time is ``RunSteps.times[call.finished]``.
    """

    tool_call: al.ToolCall
    started: int
    finished: Optional[int] = None
    result: Optional[al.ToolResultMessage] = None
    refused: bool = False
    ends_run: bool = False
    progress: Tuple[int, ...] = ()


@dataclass(frozen=True)
class Step:
    """One model request of a run, by the positions of its events: its first and last
    event, its ``model.chunk`` events, and its calls in ``tool.started`` order."""

    request_id: str
    first: int
    last: int
    chunks: Tuple[int, ...] = ()
    calls: Tuple[Call, ...] = ()


_STEP_EVENTS: Final = ("model.chunk", "tool.started", "tool.progress", "tool.finished")
"""The events of a request: each names its request id."""


class RunSteps:
    """Reads a run's steps from its events, fed one at a time in order.

    ``feed(event, time)`` takes the next event; the fields say what the events fed so far
    hold: ``events`` and ``times`` (by position), the ``accepted`` starting messages,
    ``steps`` (one per request the events name, in order) and ``result`` (that of
    ``run.finished``, else None). The order it holds a log to, as ``run_agent_loop()``
    yields it:

    - sequences 0, 1, 2... in order; ``message.accepted`` events first; ``run.finished``
      once, last;
    - a request's events in a row; the first request any number, each next one the next
      number (``agent_loop.request_id``), opened once the previous one's calls finished;
    - a request's chunks carry its id and come before its first ``tool.started``;
    - a ``tool.started`` while a call is open only right after another (calls at once
      are scheduled in a row, their progress after them); a call id once per request;
    - a ``tool.progress`` names an open call of its request; a ``tool.finished`` the
      first open call, with the same call (results in the order the calls started).

    A request that yielded no event (a run cancelled or failed before a request's first
    chunk, a stop response with no chunk) has no step. Reading ``events``, ``times`` or
    ``steps`` builds them once after each feed: read them when the events you need are in.
    """

    def __init__(self) -> None:
        self._events: List[al.Event] = []
        self._times: List[Optional[float]] = []
        self._accepted: List[al.Message] = []
        self._steps: List[Step] = []  # the requests before the current one
        self._current: Optional[_OpenStep] = None
        self._built: Optional[Tuple[Tuple[al.Event, ...], Tuple[Optional[float], ...]]] = None
        self._built_steps: Optional[Tuple[Step, ...]] = None
        self.result: Optional[al.RunResult] = None
        """The result of the run's ``run.finished``; None before it."""

    @property
    def events(self) -> Tuple[al.Event, ...]:
        """The events fed, in order."""
        return self._tuples()[0]

    @property
    def times(self) -> Tuple[Optional[float], ...]:
        """The time fed with each event (None: unknown), by position."""
        return self._tuples()[1]

    @property
    def accepted(self) -> Tuple[al.Message, ...]:
        """The messages of the run's ``message.accepted`` events."""
        return tuple(self._accepted)

    @property
    def steps(self) -> Tuple[Step, ...]:
        """One Step per request the events name, in order (the last one as it is so far)."""
        if self._built_steps is None:
            current = () if self._current is None else (self._current.step(),)
            self._built_steps = (*self._steps, *current)
        return self._built_steps

    def feed(self, event: al.Event, time: Optional[float] = None) -> None:
        """Takes the run's next event and the time it reports (default: ``event.time``).

        Raises TypeError for an event that is not an Event or a time that is not a
        number, and ValueError, naming the event and the rule, for an event that cannot
        come here; either leaves the reader as it was.
        """
        position = len(self._events)
        _check_event("RunSteps.feed()", event, position)
        if time is None:
            time = event.time
        if time is not None and type(time) not in (int, float):
            raise TypeError(f"time must be a number of seconds or None, got {time!r}")
        where = f"event {position} ({event.type})"
        if event.sequence != position:
            raise ValueError(
                f"{where} has sequence {event.sequence}: a run's events are numbered 0, 1, "
                "2... in order, with no gap"
            )
        if self.result is not None:
            raise ValueError(f"{where} comes after run.finished, which ends a run's events")
        apply = self._checked(event, position, where)
        apply()
        self._events.append(event)
        self._times.append(None if time is None else float(time))
        self._built = self._built_steps = None

    def _checked(self, event: al.Event, position: int, where: str) -> Callable[[], None]:
        """The change ``event`` makes once it is checked: ValueError if it cannot come here."""
        payload = event.payload
        if event.type == "message.accepted":
            if self._current is not None:
                raise ValueError(f"{where}: message.accepted events come before the first request")
            return lambda: self._accepted.append(payload["message"])
        if event.type == "run.finished":
            return lambda: setattr(self, "result", payload["result"])
        if event.type not in _STEP_EVENTS:
            raise ValueError(f"{where}: not an event type of a run")
        step = self._current
        request_id = payload["request_id"]
        if step is None or step.request_id != request_id:
            self._check_next_request(request_id, where)
            step = _OpenStep(request_id, position)
            opened: Optional[_OpenStep] = step
        else:
            opened = None
        change = step.checked(event, position, where)

        def apply() -> None:
            if opened is not None:
                if self._current is not None:
                    self._steps.append(self._current.step())
                self._current = opened
            change()
            cast(_OpenStep, self._current).last = position

        return apply

    def _check_next_request(self, request_id: str, where: str) -> None:
        """A new request: the run's first, or the next number once no call is open."""
        number = al.request_number(request_id)
        current = self._current
        if current is None:
            if number is None:
                raise ValueError(f"{where} names {request_id!r}, which is no request id")
            return
        expected = al.request_id(cast(int, al.request_number(current.request_id)) + 1)
        if request_id != expected:
            raise ValueError(
                f"{where} names {request_id!r}, where the run's current request is "
                f"{current.request_id!r} and its next {expected!r}"
            )
        if current.open_calls():
            raise ValueError(
                f"{where} opens {request_id!r} while tool calls of {current.request_id!r} "
                "are open: a request follows its previous one's results"
            )

    def _tuples(self) -> Tuple[Tuple[al.Event, ...], Tuple[Optional[float], ...]]:
        if self._built is None:
            self._built = (tuple(self._events), tuple(self._times))
        return self._built


class _OpenStep:
    """RunSteps' current request, as its events are fed: lists that grow, made into a
    Step when read."""

    def __init__(self, request_id: str, first: int) -> None:
        self.request_id = request_id
        self.first = self.last = first
        self.chunks: List[int] = []
        self.calls: List[Call] = []  # their progress in self.progress until read
        self.progress: List[List[int]] = []
        self.scheduling = False  # the last call event was a tool.started (or its progress)

    def open_calls(self) -> List[int]:
        """The indexes of its calls without a tool.finished."""
        return [index for index, call in enumerate(self.calls) if call.finished is None]

    def step(self) -> Step:
        calls = (
            dataclasses.replace(call, progress=tuple(progress))
            for call, progress in zip(self.calls, self.progress)
        )
        return Step(self.request_id, self.first, self.last, tuple(self.chunks), tuple(calls))

    def checked(self, event: al.Event, position: int, where: str) -> Callable[[], None]:
        """The change ``event`` makes to this request: ValueError if it cannot come here."""
        payload = event.payload
        open_calls = self.open_calls()
        if event.type == "model.chunk":
            if payload["chunk"].request_id != self.request_id or self.calls:
                raise ValueError(
                    f"{where}: a chunk carries its event's request id, and comes before "
                    "the request's tool calls"
                )
            return lambda: self.chunks.append(position)
        if event.type == "tool.started":
            call = payload["tool_call"]
            if open_calls and not self.scheduling:
                raise ValueError(f"{where}: a tool call started before the previous one finished")
            if any(started.tool_call.id == call.id for started in self.calls):
                raise ValueError(f"{where}: tool call {call.id!r} started twice")

            def start() -> None:
                self.calls.append(Call(call, position))
                self.progress.append([])
                self.scheduling = True

            return start
        if event.type == "tool.progress":
            call_id = payload["tool_call_id"]
            index = next((i for i in open_calls if self.calls[i].tool_call.id == call_id), None)
            if index is None:
                raise ValueError(f"{where}: progress of tool call {call_id!r}, which is not open")
            return lambda: self.progress[index].append(position)
        # tool.finished: the first open call, as the loop gives results in start order.
        call = payload["tool_call"]
        if not open_calls or self.calls[open_calls[0]].tool_call != call:
            raise ValueError(
                f"{where}: tool call {call.id!r} finished without starting, or before a "
                "call started earlier"
            )

        def finish() -> None:
            self.calls[open_calls[0]] = dataclasses.replace(
                self.calls[open_calls[0]],
                finished=position,
                result=payload["tool_result"],
                refused=payload.get("refused", False) is True,
                ends_run=payload.get("ends_run", False) is True,
            )
            self.scheduling = False

        return finish


# --- The recording ---------------------------------------------------------------
#
# Replay and durable runs are one mechanism: run_agent_loop() runs again on a model, tools
# and a consent hook that give what the recording holds and, where it holds nothing, ask
# what stands behind them: nothing for replay(), the live model, tools and hook for a
# durable run. So the core's rules (ids, usage, budgets, cancellation) are applied by the
# core, and restated nowhere.


@dataclass(frozen=True)
class Recording:
    """What a recorded run gives again when ``run_agent_loop()`` runs it once more.

    ``steps``: by request id, the chunks the step streamed and the response it returned.
    ``results``: by tool call (its id, name and arguments), the call's recorded result.
    ``decisions``: by tool call id, what ``before_tool_call`` answered (None: run it; a
    str: refuse it with that error result). ``log``: the recorded events, as RunSteps
    read them, or None; with it, a recorded call yields its recorded progress values
    again before its result, an ``ends_run`` call returns the run's recorded output, and
    calls run at once give their progress and results in the order the log shows (to the
    position ``live_from``: past it the run is live, in no recorded order). Its
    ``model()``, ``tool()`` and ``before_tool_call()`` give these, and pass what they do
    not hold to what stands behind them (the live model, tool and hook of a durable run);
    ``ordered(run)`` passes the run's events on and keeps the recorded order. Used by
    ``replay()`` and by ``agent_loop_durable``.
    """

    steps: Mapping[str, Tuple[Tuple[al.ModelChunk, ...], al.ModelResponse]]
    results: Mapping[al.ToolCall, al.ToolResultMessage]
    decisions: Mapping[str, Optional[str]]
    log: Optional[RunSteps] = None
    live_from: Optional[int] = None
    _turns: _Turns = dataclasses.field(init=False, repr=False, compare=False)
    __hash__ = None  # type: ignore[assignment]  # it holds mappings

    def __post_init__(self) -> None:
        object.__setattr__(self, "_turns", _Turns(self.log, self.live_from))

    def model(self, live: al.Model) -> al.Model:
        """A model that streams a recorded step's chunks and returns its response, and
        asks ``live`` for any other request."""
        return _RecordingModel(self.steps, live)

    def tool(self, tool: al.Tool) -> al.Tool:
        """The tool, except that a call whose result is recorded gives that result again
        (an error result as a ``ToolError``, so its content is exact; for an ``ends_run``
        tool, the run's recorded output) after its recorded progress, and runs nothing.
        A call with recorded progress and no result (the run ended while it ran) yields
        that progress (before ``live_from``), then runs ``tool``."""
        results, turns = self.results, self._turns

        def execute(arguments: Dict[str, Any], signal: al.Signal) -> object:
            call = al.current_tool_call()
            if call is None:  # not run by the loop: nothing is recorded for it
                return tool.execute(arguments, signal)
            result, progress = results.get(call), turns.progress_of(call)
            if result is None and not progress:
                return tool.execute(arguments, signal)
            if not progress:
                turns.wait_to_return(call, signal)
                return _recorded_answer(
                    cast(al.ToolResultMessage, result), tool.ends_run, turns.output_of(call)
                )
            return _given_again(call, result, progress, turns, tool, arguments, signal)

        return dataclasses.replace(tool, execute=execute)

    def before_tool_call(
        self, live: Optional[Callable[[al.ToolCall, Any], object]]
    ) -> Callable[[al.ToolCall, Any], Any]:
        """A consent hook that gives a call's recorded decision; runs (None) a call whose
        result is recorded without one; and asks ``live`` for any other call (None when
        ``live`` is None)."""
        decisions, results = self.decisions, self.results

        def before_tool_call(call: al.ToolCall, signal: Any) -> object:
            if call.id in decisions:
                return decisions[call.id]
            if call in results or live is None:
                return None
            return live(call, signal)

        return before_tool_call

    def ordered(
        self, run: Generator[al.Event, None, al.RunResult]
    ) -> Generator[al.Event, None, al.RunResult]:
        """Passes the events of ``run`` (a run on this recording's tools) on, telling the
        recorded tools each one, so that calls run at once give their recorded progress
        and results in the log's order; returns its result. Without it they give them
        in the order their threads make. Run one such run at a time."""
        turns = self._turns
        turns.begin()  # at the first next(), as the run begins
        # The turns end before the run is closed: its close waits for the running tools,
        # and a tool still waiting for its turn waits no more.
        return (yield from passed_on(run, lambda event: turns.passed(event.sequence), turns.end))


_TURN_SECONDS: Final = 300.0
"""How long a recorded call run at once waits for its turn at most: the log's events before
it come as fast as the run's consumer takes them, so this is generous; past it the call
fails (RuntimeError), rather than a replay hanging."""


class _Turns:
    """The order of a log's calls run at once (``tool.started`` events in a row): what each
    recorded call yields and returns, and how many of the run's events must have been
    passed on (``Recording.ordered``) before it does.

    The loop drains its workers' progress values and outcomes in the order they are put
    and gives results in assistant order, so the log is reproduced when a progress value
    at position P is put once the events before P were passed on, and a call's outcome
    once the progress values between the previous result of its group and its own were:
    a call may return earlier than its result shows (threads free for the calls behind
    it), never past a progress value that the log shows after its result.
    """

    def __init__(self, log: Optional[RunSteps], live_from: Optional[int]) -> None:
        self._progress: Dict[al.ToolCall, List[Tuple[int, Any]]] = {}  # (wait, value)
        self._returns: Dict[al.ToolCall, int] = {}
        self._outputs: Dict[al.ToolCall, object] = {}
        self._passed = 0
        self._timed = False  # set while Recording.ordered() runs a run
        self._changed = threading.Condition()
        if log is None:
            return
        limit = len(log.events) if live_from is None else live_from
        events = log.events
        for step in log.steps:
            for group in _groups(step):
                ordered = len(group) > 1
                previous = group[-1].started
                for call in group:
                    self._progress[call.tool_call] = [
                        (
                            position if ordered and position < limit else 0,
                            events[position].payload["progress"],
                        )
                        for position in call.progress
                        if call.finished is not None or position < limit
                    ]
                    if call.finished is None:
                        continue
                    between = [
                        position
                        for other in group
                        for position in other.progress
                        if previous < position < call.finished < limit
                    ]
                    self._returns[call.tool_call] = max(between, default=-1) + 1 if ordered else 0
                    previous = call.finished
        result, last = log.result, log.steps[-1] if log.steps else None
        ends = [call for call in last.calls if call.ends_run] if last is not None else []
        if result is not None and result.status == "completed" and ends:
            self._outputs[ends[0].tool_call] = result.output

    def progress_of(self, call: al.ToolCall) -> List[Tuple[int, Any]]:
        """The call's recorded progress values, each with the events to wait for."""
        return self._progress.get(call, [])

    def output_of(self, call: al.ToolCall) -> object:
        """What the call's tool returned, where the log's result holds it."""
        return self._outputs.get(call, _NO_OUTPUT)

    def begin(self) -> None:
        with self._changed:
            self._passed, self._timed = 0, True

    def passed(self, sequence: int) -> None:
        with self._changed:
            self._passed = sequence + 1
            self._changed.notify_all()

    def end(self) -> None:
        with self._changed:
            self._timed = False
            self._changed.notify_all()

    def wait_to_return(self, call: al.ToolCall, signal: al.Signal) -> None:
        """Waits for the call's turn to return."""
        self.wait(self._returns.get(call, 0), signal)

    def wait(self, events: int, signal: al.Signal) -> None:
        """Waits until ``events`` events were passed on, the run ends or its signal is set;
        RuntimeError after _TURN_SECONDS."""
        deadline = time.monotonic() + _TURN_SECONDS
        with self._changed:
            while self._timed and self._passed < events and not signal.is_set():
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"a recorded call waited {_TURN_SECONDS:.0f} s for the log's first "
                        f"{events} events, which the run did not give"
                    )
                self._changed.wait(al.WATCH_SECONDS)  # and looks at the signal again


def _groups(step: Step) -> List[List[Call]]:
    """A step's calls in groups: those whose tool.started events came in a row."""
    groups: List[List[Call]] = []
    for call in step.calls:
        if groups and call.started == groups[-1][-1].started + 1:
            groups[-1].append(call)
        else:
            groups.append([call])
    return groups


def _given_again(
    call: al.ToolCall,
    result: Optional[al.ToolResultMessage],
    progress: Sequence[Tuple[int, Any]],
    turns: _Turns,
    tool: al.Tool,
    arguments: Dict[str, Any],
    signal: al.Signal,
) -> Generator[Any, None, object]:
    """A recorded call with progress: each value in its turn, then its result in its turn
    (or, without one, what ``tool`` does)."""
    for wait, value in progress:
        turns.wait(wait, signal)
        yield value
    if result is None:
        value = tool.execute(arguments, signal)
        if isinstance(value, collections.abc.Generator):
            value = yield from value
        return value
    turns.wait_to_return(call, signal)
    return _recorded_answer(result, tool.ends_run, turns.output_of(call))


class _RecordingModel:
    """Recording.model(): the recorded steps, then the live model."""

    def __init__(
        self,
        steps: Mapping[str, Tuple[Tuple[al.ModelChunk, ...], al.ModelResponse]],
        live: al.Model,
    ) -> None:
        self._steps = steps
        self._live = live

    def stream(
        self, request: al.ModelRequest, signal: al.Signal
    ) -> Generator[al.ModelChunk, None, al.ModelResponse]:
        """Streams the recorded step, or the live model's answer to the request."""
        step = self._steps.get(request.id)
        if step is None:
            return self._live.stream(request, signal)
        return _played(*step)


def _played(
    chunks: Tuple[al.ModelChunk, ...], response: al.ModelResponse
) -> Generator[al.ModelChunk, None, al.ModelResponse]:
    yield from chunks
    return response


# --- Passing a run on --------------------------------------------------------------
#
# What a companion does with each event of a run (paces recorded tools by it, cancels
# after it, journals it, stores it) it does in passed_on()'s on_event, and what it must
# keep of the model's answers, which no event holds, it keeps with KeptModel: one driver
# of a run and one keeper of its responses, for replay, durable runs and sessions.
# (agent_loop_otel drives its run by hand: it attaches a tracing context around each
# next(), which a hook on the events cannot do.)


def passed_on(
    run: Generator[al.Event, None, al.RunResult],
    on_event: Callable[[al.Event], Optional[al.Event]],
    on_end: Optional[Callable[[], None]] = None,
) -> Generator[al.Event, None, al.RunResult]:
    """Passes the events of ``run`` on, each once ``on_event(event)`` has seen it, and
    returns the run's result.

    ``on_event`` returns None to pass the event on as it is, or an Event to pass on in
    its place (the result returned is still the run's: a caller that changes the result
    changes it itself). It runs before the consumer gets the event, so what it writes is
    written first. The run is closed when the pass-through ends: the run returned or
    raised, ``on_event`` raised (its exception goes on), or the pass-through was closed.
    ``on_end()``, if given, is called then, before the run is closed: it lets go of what
    the run's close would wait for (a tool that waits on what ``on_event`` was told).
    """
    with contextlib.closing(run):
        try:
            while True:
                try:
                    event = next(run)
                except StopIteration as done:
                    result: al.RunResult = done.value
                    return result
                replacement = on_event(event)
                yield event if replacement is None else replacement
        finally:
            if on_end is not None:
                on_end()


class KeptModel:
    """A model that keeps the last response ``model`` returned, until it is taken.

    No event holds a response: the loop appends its assistant message, then yields the
    first ``tool.started`` of its calls (or ends the run). A consumer that stores what
    the loop appends runs the loop on a KeptModel and takes the response there
    (``take_response()``), when the loop has shown that it accepted it; the message is
    ``AssistantMessage(assistant_message_id(response.id), response.content,
    response.usage, response.provider_response_id)``, as the loop builds it.
    """

    def __init__(self, model: al.Model) -> None:
        self._model = model
        self._response: Optional[al.ModelResponse] = None

    def stream(
        self, request: al.ModelRequest, signal: al.Signal
    ) -> Generator[al.ModelChunk, None, al.ModelResponse]:
        """The model's stream, whose response is kept once it is returned. A stream that
        is not a generator is returned untouched, so that ``run_agent_loop()`` refuses it
        in its own words."""
        stream: object = self._model.stream(request, signal)
        if not isinstance(stream, collections.abc.Generator):
            return cast(Generator[al.ModelChunk, None, al.ModelResponse], stream)
        return self._kept(stream)

    def _kept(
        self, stream: Generator[al.ModelChunk, None, al.ModelResponse]
    ) -> Generator[al.ModelChunk, None, al.ModelResponse]:
        response = yield from stream
        self._response = response
        return response

    def take_response(self) -> Optional[al.ModelResponse]:
        """The response the model returned last, once: None when it was taken already
        (or the model returned none yet). It is what the model returned, which the loop
        checks: take it once the loop has accepted it."""
        response, self._response = self._response, None
        return response


# --- JSON lines -------------------------------------------------------------------


class _TextFile(Protocol):
    """What dump_events() writes to: a text file, ``io.StringIO``, ``sys.stdout``."""

    def write(self, text: str, /) -> object:
        """Writes the text."""


def json_line(data: Mapping[str, Any]) -> str:
    """One JSON line of a log or a journal, without its newline: compact, ASCII (every str
    round-trips through any text encoding, a lone surrogate too), and only JSON.

    Raises ValueError for a float that JSON cannot hold (NaN, infinity), TypeError for a
    value that is not JSON.
    """
    return json.dumps(data, separators=(",", ":"), allow_nan=False)


def dump_events(events: Iterable[al.Event], fp: _TextFile, *, times: bool = False) -> None:
    """Writes one ``json_line()`` of ``to_dict()`` per event to ``fp``, a text file.

    The lines are ASCII (a character beyond it is a ``\\u`` escape, so any encoding
    reads them, and a str holding a lone surrogate comes back as it was); one writer
    makes the lines of logs and of durable journals. With ``times=True`` each line also
    holds ``"time"``: the seconds (a float, on the clock of ``time.time()``) from the first
    ``next()`` on ``events`` to ``event.time`` (when what it reports happened: for a
    ``tool.finished``, when its tool returned), or to the moment the event was received
    where the event has no time.
    ``load_events()`` reads the lines back, ``load_timed_events()`` with their times.
    Raises TypeError for an item that is not an Event (the lines before it are written).
    """
    items = iter(events)
    began = time.time()  # the clock of Event.time
    for position, event in enumerate(items):
        _check_event("dump_events()", event, position)
        data = event.to_dict()
        if times:
            data["time"] = event_seconds(event, began)
        fp.write(json_line(data) + "\n")


def event_seconds(event: al.Event, began: float) -> float:
    """An event's ``"time"`` in a log: the seconds from ``began`` (a ``time.time()``: when
    the run began) to when what the event reports happened (``event.time``, where the loop
    says it: a ``tool.finished``'s is when its tool returned), else to now; never below 0.
    Logs, the command line's ``--json``, journals and sessions all time their lines by it."""
    happened = time.time() if event.time is None else event.time
    return max(0.0, happened - began)


def load_events(fp: Iterable[str]) -> List[al.Event]:
    """Reads the events of JSON lines as ``dump_events()`` writes them: one ``to_dict()``
    per line, from a text file (or any iterable of lines).

    Returns the events in the order of the lines (a line's ``"time"`` is not read).
    Raises ValueError naming the line (counted from 1) that holds no event: not JSON (a
    blank line too), or JSON that ``event_from_dict()`` refuses, with its reason.
    """
    return [event for event, _ in load_timed_events(fp)]


def load_timed_events(fp: Iterable[str]) -> List[Tuple[al.Event, Optional[float]]]:
    """Reads a log with its times: the lines of ``dump_events()`` (``times`` or not) or
    of the command line's ``--json``.

    Returns each event with its ``"time"`` (seconds since the run began in the process
    that wrote the line), or None for a line without one. (A durable run's journal is
    read by agent_loop_durable.py's ``read_journal``.) Raises ValueError naming the line
    (counted from 1) that holds no event.
    """
    timed = []
    for number, line in enumerate(fp, start=1):
        try:
            timed.append(_timed_event(_json_value(line)))
        except ValueError as error:
            raise ValueError(f"line {number}: {error}") from None
    return timed


def _json_value(line: str) -> Any:
    """The JSON value of one line; ValueError saying why the line holds none."""
    try:
        return json.loads(line.rstrip("\r\n"))  # so that its error counts within the line
    except ValueError as error:  # a JSONDecodeError
        raise ValueError(f"not JSON ({error})") from None


def _timed_event(data: Any) -> Tuple[al.Event, Optional[float]]:
    """The event of one line's JSON and its time; ValueError saying why it holds none."""
    event = al.event_from_dict(data)
    seconds = data.get("time")
    if seconds is not None and (type(seconds) not in (int, float) or seconds < 0):
        raise ValueError(f"time must be a number of seconds >= 0, got {seconds!r}")
    return event, None if seconds is None else float(seconds)
