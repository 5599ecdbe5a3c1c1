# agent_loop_replay.py 1.0.0: record and replay for agent_loop.py.
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
- The replayed model compares each request with the transcript that the recording
  implies; with real tools in place of the recorded ones, a tool that now answers
  differently fails the run (``MODEL_STREAM_ERROR``) at the next request, with the
  request, the index of the first different message and both sides, shortened.

This file uses only the public names of ``agent_loop``.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from dataclasses import dataclass
from typing import (
    Any,
    Dict,
    Final,
    Generator,
    Iterable,
    List,
    Optional,
    Sequence,
    Tuple,
    cast,
)

import agent_loop as al

__version__ = "1.0.0"

__all__ = ["replay", "ReplayedRun"]

_DRIFT_BEFORE: Final = 160
"""Characters of a drift message's sides shown before their first difference: enough
for a message's repr up to its content, with call ids as long as providers make them."""
_DRIFT_AFTER: Final = 60
"""Characters shown from the first difference on."""


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
    log = tuple(events)
    for position, event in enumerate(log):
        if type(event) is not al.Event:
            kind = type(event).__name__
            raise TypeError(f"replay() takes Events, got {kind} at position {position}")
        if event.sequence != position:
            raise ValueError(
                f"the event at position {position} has sequence {event.sequence}: a run's "
                "events are numbered 0, 1, 2... in order, with no gap"
            )
    if not log or log[-1].type != "run.finished":
        raise ValueError("the log does not end with run.finished: it is not a whole run's")
    result: al.RunResult = log[-1].payload["result"]
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
    accepted = tuple(
        event.payload["message"]
        for event in itertools.takewhile(lambda event: event.type == "message.accepted", log)
    )
    # A run cancelled before its first request holds every starting message, accepted or not.
    messages = result.messages if result.steps == 0 else accepted
    if result.messages[: len(accepted)] != accepted:
        raise ValueError("the result's transcript does not begin with the accepted messages")
    steps = _recorded_steps(log[len(accepted) : -1], result, len(messages))
    complete = result.status in ("completed", "maxSteps")
    model = _ReplayedModel(steps, None if complete else len(log) - 2)
    names = dict.fromkeys(call.name for step in steps for call in step.calls)
    tools = al.ToolRegistry(_recorded_tool(model, name) for name in names)
    return ReplayedRun(messages, model, tools, budget, start)


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
        )
        if isinstance(self.model, _ReplayedModel) and self.model.stop_after is not None:
            return _cancelled_after(run, signal, self.model.stop_after)
        return run


def _cancelled_after(
    run: Generator[al.Event, None, al.RunResult], signal: threading.Event, last: int
) -> Generator[al.Event, None, al.RunResult]:
    """Drives a run as a consumer who sets the signal once event ``last`` is yielded
    (-1: before the first event)."""
    with contextlib.closing(run):
        if last == -1:
            signal.set()
        while True:
            try:
                event = next(run)
            except StopIteration as done:
                result: al.RunResult = done.value
                return result
            yield event
            if event.sequence == last:
                signal.set()


@dataclass(frozen=True)
class _RecordedStep:
    """One request of a recording: what it was sent, what it streamed and answered."""

    request_id: str
    messages: Tuple[al.Message, ...]  # the request's transcript, as the recording implies it
    chunks: Tuple[al.ModelChunk, ...]
    response: Optional[al.ModelResponse]  # None: the log stops inside this request
    calls: Tuple[al.ToolCall, ...]
    results: Tuple[al.ToolResultMessage, ...]  # fewer than calls where the log stops


def _recorded_steps(
    body: Sequence[al.Event], result: al.RunResult, start_length: int
) -> List[_RecordedStep]:
    """The steps of a log, from its events after the accepted messages and before
    run.finished, checked against the result's transcript."""
    request_ids = [
        al.request_id(result.request_sequence_start + step) for step in range(1, result.steps + 1)
    ]
    positions = {request_id: index for index, request_id in enumerate(request_ids)}
    chunks: List[List[al.ModelChunk]] = [[] for _ in request_ids]
    started: List[List[al.ToolCall]] = [[] for _ in request_ids]
    finished: List[List[al.ToolResultMessage]] = [[] for _ in request_ids]
    current = 0
    for event in body:
        where = f"event {event.sequence} ({event.type})"
        if event.type == "message.accepted" or event.type == "run.finished":
            raise ValueError(
                f"{where}: a run's message.accepted events come before its first request, "
                "and its one run.finished last"
            )
        request_id = event.payload["request_id"]
        index = positions.get(request_id, -1)
        if index < current:
            raise ValueError(
                f"{where} names {request_id!r}, which is not the run's current or next "
                f"request (it opened {', '.join(request_ids) or 'none'}, in that order)"
            )
        current = index
        if event.type == "model.chunk":
            if event.payload["chunk"].request_id != request_id or started[index]:
                raise ValueError(
                    f"{where}: a chunk carries its event's request id, and comes before "
                    "the request's tool calls"
                )
            chunks[index].append(event.payload["chunk"])
        elif event.type == "tool.started":
            if len(started[index]) != len(finished[index]):
                raise ValueError(f"{where}: a tool call started before the previous one finished")
            started[index].append(event.payload["tool_call"])
        else:
            call = event.payload["tool_call"]
            if len(started[index]) != len(finished[index]) + 1 or started[index][-1] != call:
                raise ValueError(f"{where}: tool call {call.id!r} finished without starting")
            finished[index].append(event.payload["tool_result"])

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
    """replay()'s model: checks each request against the recording and streams its step.

    Its tools (``_recorded_tool``) ask it for the recorded result of the call that the
    step being replayed runs next. ``stop_after`` is the sequence of a cancelled or
    failed log's last event before run.finished (-1: it has none), else None.
    """

    def __init__(self, steps: Sequence[_RecordedStep], stop_after: Optional[int]) -> None:
        self._steps = {step.request_id: step for step in steps}
        self.stop_after = stop_after
        self._active: Optional[_RecordedStep] = None
        self._next_call = 0

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
        self._active, self._next_call = step, 0
        return self._play(step)

    @staticmethod
    def _play(step: _RecordedStep) -> Generator[al.ModelChunk, None, al.ModelResponse]:
        yield from step.chunks
        if step.response is None:  # ReplayedRun.run() cancels the run before this
            raise RuntimeError(
                f"the recording stops inside {step.request_id}: replay it with "
                "ReplayedRun.run(), which cancels the run where its log stops"
            )
        return step.response

    def answer(self, name: str, arguments: Dict[str, Any]) -> object:
        """A recorded tool's execute: the recorded result of the active step's next call."""
        step, index = self._active, self._next_call
        self._next_call += 1
        if (
            step is None
            or index >= len(step.results)
            or step.calls[index] != al.ToolCall(step.calls[index].id, name, arguments)
        ):
            raise RuntimeError(
                f"the recording has no call of tool {name!r} with these arguments here, or "
                "no result for it (the recorded tools answer the replayed model's calls, "
                "in order)"
            )
        result = step.results[index]
        if result.is_error:
            raise al.ToolError(result.content)
        return result.content


def _recorded_tool(model: _ReplayedModel, name: str) -> al.Tool:
    """A tool that accepts any arguments and answers with the recorded results."""

    def execute(arguments: Dict[str, Any], signal: al.Signal) -> object:
        return model.answer(name, arguments)

    description = f"Answers as the recorded tool {name!r} did."
    return al.Tool(name, description, {"type": "object"}, execute)


def _drift_sides(
    recorded: Sequence[al.Message], got: Sequence[al.Message], index: int
) -> Tuple[str, str]:
    """The reprs of two different messages (or "nothing"), shortened around where they differ."""
    left, right = (
        repr(side[index]) if index < len(side) else "nothing" for side in (recorded, got)
    )
    at = _first_difference(left, right) or 0  # equal reprs: from the start
    begin = max(0, at - _DRIFT_BEFORE)

    def window(text: str) -> str:
        end = at + _DRIFT_AFTER
        return ("..." if begin else "") + text[begin:end] + ("..." if end < len(text) else "")

    return window(left), window(right)
