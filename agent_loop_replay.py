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
- A run with ``tool_concurrency`` > 1 replays exactly: calls whose ``tool.started``
  events came in a row ran together; the tools of no such group replay as sequential.
  A cancelled group that kept a result after a call still open is a ValueError; a run
  cancelled by ``before_tool_call`` before its last response's first call started
  replays without that response.
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
    Union,
    cast,
)

import agent_loop as al

__version__ = "1.0.0"

__all__ = ["replay", "ReplayedRun"]

# The ids the loop derives, as its README states them: request-001, request-002... and
# the assistant message of response R is "message-" + R's id.
_MESSAGE_ID_PREFIX: Final = "message-"

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
    # A run with tool_concurrency > 1 scheduled groups: tool.started events in a row. A
    # tool whose calls were never in one replays as sequential (a barrier): a call alone
    # stays alone, and the groups are the recorded ones.
    groups = [
        [event.payload["tool_call"].name for event in group]
        for kind, group in itertools.groupby(log, key=lambda event: event.type)
        if kind == "tool.started"
    ]
    together = {name for group in groups if len(group) > 1 for name in group}
    tools = al.ToolRegistry(_recorded_tool(model, name, name not in together) for name in names)
    concurrency = max((len(group) for group in groups), default=1)
    return ReplayedRun(messages, model, tools, budget, start, concurrency)


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
        f"request-{result.request_sequence_start + step:03d}"
        for step in range(1, result.steps + 1)
    ]
    positions = {request_id: index for index, request_id in enumerate(request_ids)}
    chunks: List[List[al.ModelChunk]] = [[] for _ in request_ids]
    started: List[List[al.ToolCall]] = [[] for _ in request_ids]
    finished: List[List[al.ToolResultMessage]] = [[] for _ in request_ids]
    current = 0
    previous = ""  # the type of the event before
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
            # A group's calls start in a row; the next group once they have finished.
            if len(started[index]) != len(finished[index]) and previous != "tool.started":
                raise ValueError(f"{where}: a tool call started before the previous one finished")
            started[index].append(event.payload["tool_call"])
        else:
            call = event.payload["tool_call"]
            pending = started[index][len(finished[index]) :]
            if not pending or pending[0] != call:
                raise ValueError(
                    f"{where}: tool call {call.id!r} finished without starting, or before a "
                    "call started earlier (a cancelled batch that kept a result after an "
                    "interrupted call cannot be replayed: which calls the cancellation "
                    "interrupted depended on timing)"
                )
            finished[index].append(event.payload["tool_result"])
        previous = event.type

    # The transcript the run added: each assistant message, then its tool results.
    groups: List[Tuple[al.AssistantMessage, List[al.ToolResultMessage]]] = []
    for message in result.messages[start_length:]:
        if isinstance(message, al.AssistantMessage) and message.id.startswith(_MESSAGE_ID_PREFIX):
            groups.append((message, []))
        elif isinstance(message, al.ToolResultMessage) and groups:
            groups[-1][1].append(message)
        else:
            raise ValueError(
                f"the result's transcript holds {message.role} message {message.id!r} after "
                'the starting messages, where a run adds only assistant messages ("message-" '
                "+ a response id), each followed by its tool results"
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
                message.id[len(_MESSAGE_ID_PREFIX) :],
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
    """A step's recorded chunks agree with its response, as in every step the loop
    recorded: the same blocks once adjacent text and adjacent thinking are joined and
    empty text and thinking dropped (a thinking block's signature does not stream).

    This is the loop's agreement rule, written again here because a companion file uses
    only agent_loop's public names: a change to the rule in agent_loop.py is a change
    here too (the replayed run checks it once more, so a log that slipped through would
    still fail there, with MODEL_PROTOCOL_ERROR)."""
    streamed = _normalized(_normalized_item(chunk) for chunk in chunks)
    terminal = _normalized(_normalized_item(block) for block in response.content)
    index = _first_difference(streamed, terminal)
    if index is not None:
        raise ValueError(
            f"the chunks of {request_id} do not agree with the result's transcript: "
            f"normalised block {index} differs ({len(streamed)} streamed, "
            f"{len(terminal)} in the response)"
        )


_Normalized = Union[str, al.ThinkingBlock, al.ToolCall]
"""A normalised block: text as a str, thinking as a ThinkingBlock of its text alone."""


def _normalized_item(
    item: Union[al.ModelChunk, al.TextBlock, al.ThinkingBlock, al.ToolCall],
) -> _Normalized:
    """What a chunk or a terminal block carries, as a normalised block."""
    if isinstance(item, (al.TextDelta, al.TextBlock)):
        return item.text
    if isinstance(item, (al.ThinkingDelta, al.ThinkingBlock)):
        return al.ThinkingBlock(item.thinking)
    return item.tool_call if isinstance(item, al.ToolCallChunk) else item


def _normalized(items: Iterable[_Normalized]) -> List[_Normalized]:
    """Adjacent text joined and adjacent thinking joined, text, thinking and tool calls
    being each other's boundaries; empty text or thinking carries nothing."""
    normalized: List[_Normalized] = []
    # Empty text and empty thinking are dropped first, so that they are no boundary
    # either (a redacted block between two pieces of text). (Comparing each item with a
    # al.ThinkingBlock("") instead costs 15 times as much.)
    carrying = (
        item
        for item in items
        if item != "" and not (type(item) is al.ThinkingBlock and item.thinking == "")
    )
    for kind, group in itertools.groupby(carrying, key=type):
        if kind is str:
            normalized.append("".join(cast("Iterable[str]", group)))
        elif kind is al.ThinkingBlock:
            pieces = cast("Iterable[al.ThinkingBlock]", group)
            normalized.append(al.ThinkingBlock("".join(block.thinking for block in pieces)))
        else:
            normalized.extend(group)
    return normalized


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

    def answer(self, name: str, signal: al.Signal) -> object:
        """A recorded tool's execute: the recorded result of the call being executed, in
        the active step (in any thread). A call the log left open (the run was cancelled
        while it ran) waits for the replay's cancellation, whose signal discards it."""
        step, call = self._active, al.current_tool_call()
        if step is None or call is None or call.name != name or call not in step.calls:
            raise RuntimeError(
                f"the recording has no call of tool {name!r} with these arguments here "
                "(the recorded tools answer the replayed model's calls)"
            )
        index = step.calls.index(call)
        if index >= len(step.results):  # results end at the first open call, if any
            signal.wait()
            return "interrupted in the recording"  # discarded: the signal is set
        result = step.results[index]
        if result.is_error:
            raise al.ToolError(result.content)
        return result.content


def _recorded_tool(model: _ReplayedModel, name: str, sequential: bool) -> al.Tool:
    """A tool that accepts any arguments and answers with the recorded results."""

    def execute(arguments: Dict[str, Any], signal: al.Signal) -> object:
        return model.answer(name, signal)

    description = f"Answers as the recorded tool {name!r} did."
    return al.Tool(name, description, {"type": "object"}, execute, sequential=sequential)


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
