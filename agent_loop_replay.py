# agent_loop_replay.py 1.1.0: record, replay and durable runs for agent_loop.py.
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

``dump_events(events, fp)`` writes an event log as JSON lines (one compact ``to_dict()``
per line) and ``load_events(fp)`` reads it back.

``durable_run(journal, ...)`` is ``run_agent_loop()`` written to a journal file as it
goes, so that the run survives its process. Rules:

- The journal is JSON lines and only grows: its first line says what the run is (its
  starting messages, tools and options), then come the events, each written before the
  consumer sees it, and what no event holds (the response of each step that called
  tools). It is synced to disk at each complete message and at the end, not at each
  chunk. A torn last line (the process died writing it) is dropped, and cut off before
  the next write; no whole line is ever changed.
- Called again with the journal, a finished run (any status) is given again as
  recorded, calling nothing. An unfinished run is run again by the loop itself, with a
  model that streams each recorded step and tools that give each recorded result, so
  that it gives its recorded events again up to its last complete message; from there it
  is live: the step that was streaming is requested again, and a call that started and
  has no recorded result runs again (at least once). A resume record voids the events
  recorded past that point, which the run then gives live.
- A journal of another run (other starting messages, tools or options), or a line that
  is not where the journal's order puts it, is refused: JournalError, naming the line.

This file uses only the public names of ``agent_loop``.
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import itertools
import json
import os
import threading
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    Final,
    Generator,
    Iterable,
    List,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    Union,
    cast,
)

import agent_loop as al

if TYPE_CHECKING:  # annotations only
    from os import PathLike

__version__ = "1.1.0"

__all__ = [
    "replay",
    "ReplayedRun",
    "dump_events",
    "load_events",
    "durable_run",
    "JournalError",
]

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
        _check_event("replay()", event, position)
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
        return _recorded_answer(step.results[index])


def _recorded_answer(result: al.ToolResultMessage) -> object:
    """What a tool returns, or raises, for execute_tool_call() to build exactly ``result``:
    its content, or for an error result a ToolError of it (whose content is exact)."""
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
    return _shortened_sides(left, right)


def _shortened_sides(left: str, right: str) -> Tuple[str, str]:
    """Two different texts, each shortened around the place where they first differ."""
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


# --- JSON lines -------------------------------------------------------------------


class _TextFile(Protocol):
    """What dump_events() writes to: a text file, ``io.StringIO``, ``sys.stdout``."""

    def write(self, text: str, /) -> object:
        """Writes the text."""


def dump_events(events: Iterable[al.Event], fp: _TextFile) -> None:
    """Writes one compact ``to_dict()`` JSON line per event to ``fp``, a text file.

    Characters beyond ASCII are written as they are (open a file with
    ``encoding="utf-8"``); ``load_events()`` reads the lines back. Raises TypeError for
    an item that is not an Event (the lines before it are written).
    """
    for position, event in enumerate(events):
        _check_event("dump_events()", event, position)
        fp.write(json.dumps(event.to_dict(), separators=(",", ":"), ensure_ascii=False) + "\n")


def load_events(fp: Iterable[str]) -> List[al.Event]:
    """Reads the events of JSON lines as ``dump_events()`` writes them: one ``to_dict()``
    per line, from a text file (or any iterable of lines).

    Returns the events in the order of the lines. Raises ValueError naming the line
    (counted from 1) that holds no event: not JSON (a blank line too), or JSON that
    ``event_from_dict()`` refuses, with its reason.
    """
    events = []
    for number, line in enumerate(fp, start=1):
        try:
            events.append(_event_from_line(line))
        except ValueError as error:
            raise ValueError(f"line {number}: {error}") from None
    return events


def _event_from_line(line: str) -> al.Event:
    """The event of one JSON line; ValueError saying why the line holds none."""
    try:
        data = json.loads(line.rstrip("\r\n"))  # so that its error counts within the line
    except ValueError as error:  # a JSONDecodeError
        raise ValueError(f"not JSON ({error})") from None
    return al.event_from_dict(data)


# --- Durable runs -----------------------------------------------------------------
#
# The journal is JSON lines, one record per line, and only grows:
#
#   line 1   {"record":"run","format":1,"messages":[...],"tools":[...],"maxSteps":N,
#             "requestSequenceStart":S}          what the run is; compared on every call
#   events   event.to_dict(), as dump_events() writes them (ASCII), each before the
#            consumer sees it
#   response {"record":"response","response":{...}} a toolCall response, once the loop
#            appended its message (no event holds it), just before its first tool.started
#   resume   {"record":"resume","sequence":K}  a process took over: the events recorded
#            before this line from sequence K on are void, and K comes next
#
# A process that goes on from a journal runs the loop again from the start with the
# journal's model and tools: every step whose response is recorded streams its recorded
# chunks and returns that response, every call whose result is recorded gives that result,
# and the loop itself appends and numbers everything, as it did the first time. So the
# core's rules (ids, usage, budgets, cancellation) are applied by the core and copied
# nowhere. The events it gives again up to the last complete message (the last response
# or tool result recorded) are compared with the journal's lines, not written; from there
# on the run is live.

_JOURNAL_FORMAT: Final = 1
"""The format of the journal's lines; a journal of another format is refused, not guessed at."""


class JournalError(ValueError):
    """A journal that ``durable_run()`` refuses: another run's, or not one it wrote.

    ``path`` is the journal's path, ``line`` the number (from 1) of the line at fault,
    and the message says what is wrong there.
    """

    def __init__(self, path: str, line: int, problem: str) -> None:
        super().__init__(f"journal {path}, line {line}: {problem}")
        self.path = path
        self.line = line


def durable_run(
    journal: Union[str, PathLike[str]],
    *,
    messages: Iterable[al.Message],
    model: al.Model,
    tools: al.ToolRegistry,
    max_steps: int,
    signal: Optional[al.Signal] = None,
    request_sequence_start: int = 0,
) -> Generator[al.Event, None, al.RunResult]:
    """Returns the events of a run, as ``run_agent_loop()`` does, that survives its
    process: it is written to the ``journal`` file as it goes, and a call with the same
    journal goes on from there.

    On a journal that does not exist yet (or holds nothing whole), the run starts. On a
    journal of a finished run, the generator yields the recorded events and returns
    the recorded result, and calls neither the model nor a tool (a result read back has
    no ``error.exception``). On a journal of an unfinished run, the run gives its
    recorded events again, with their sequence numbers and without calling the model
    or a tool, up to its last complete message, and goes on live from there: the step
    that was streaming is requested again, a call whose result is recorded is not run
    again, and a call that started and has no recorded result runs again (at least
    once: a tool makes itself idempotent with ``agent_loop.current_tool_call().id``).

    Every event is written (flushed to the operating system) before the consumer sees
    it; the journal is synced to disk (``os.fsync``) at each complete message and at
    the end. The options are checked now, as ``run_agent_loop()`` checks them, and so is
    the journal: JournalError (a ValueError) for a journal of another run (other
    starting messages, tools or options), or one that is not a journal this function
    wrote. Raises ValueError for starting messages that cannot be written as JSON (an
    item that is not a message; run_agent_loop() would fail that run
    INVALID_TRANSCRIPT), TypeError for a journal that is not a path, and OSError as
    the file does. While the run goes on: OSError from writing the journal, and
    JournalError for recorded events that the run does not give again.
    """
    path = _journal_path(journal)
    try:
        items = iter(messages)
        refused: Iterable[al.Message] = ()
    except TypeError:
        items, refused = iter(()), messages
    # ValidateOptions, in run_agent_loop()'s words: it checks the options now, and
    # refuses messages that are not iterable.
    al.run_agent_loop(
        messages=refused,
        model=model,
        tools=tools,
        max_steps=max_steps,
        signal=signal,
        request_sequence_start=request_sequence_start,
    )
    # SnapshotRun: as many starting messages as run_agent_loop() reads (one past the cap).
    start = list(itertools.islice(items, al.MAX_INITIAL_MESSAGES + 1))
    run_record = _run_record(start, tools, max_steps, request_sequence_start)
    recorded = _read_journal(path, run_record)
    if recorded.finished:
        return _recorded_run(recorded.events)
    journaled = _JournaledModel(model, recorded.steps())
    results = recorded.results()
    run = al.run_agent_loop(
        messages=start,
        model=journaled,
        tools=al.ToolRegistry(_journaled_tool(tool, results) for tool in tools),
        max_steps=max_steps,
        signal=signal,
        request_sequence_start=request_sequence_start,
    )
    return _journaled_run(run, recorded, journaled, _JournalWriter(path, recorded, run_record))


def _journal_path(journal: object) -> str:
    """ValidateOptions for the journal: a str or an os.PathLike of one."""
    path = os.fspath(journal) if isinstance(journal, (str, os.PathLike)) else None
    if not isinstance(path, str):
        raise TypeError(
            f"journal must be a path (a str or os.PathLike), got {type(journal).__name__}"
        )
    return path


def _journal_line(data: Dict[str, Any]) -> str:
    """One line of a journal: compact JSON, ASCII (every str round-trips, a lone
    surrogate too), and only JSON (no NaN)."""
    return json.dumps(data, separators=(",", ":"), allow_nan=False)


def _run_record(
    start: Sequence[object], tools: al.ToolRegistry, max_steps: int, request_sequence_start: int
) -> str:
    """The journal's first line: what the run is (its starting messages and options)."""
    messages = []
    for index, message in enumerate(start):
        try:
            data = cast(Any, message).to_dict()
            _journal_line(data)
        except Exception as error:  # no to_dict(), or a value that is not JSON
            raise ValueError(
                f"messages[{index}] cannot be written to the journal as JSON ({error}): a "
                "durable run records its starting messages, and run_agent_loop() would "
                "fail this run INVALID_TRANSCRIPT"
            ) from None
        messages.append(data)
    return _journal_line(
        {
            "record": "run",
            "format": _JOURNAL_FORMAT,
            "messages": messages,
            "tools": [spec.to_dict() for spec in tools.specs()],
            "maxSteps": max_steps,
            "requestSequenceStart": request_sequence_start,
        }
    )


@dataclass
class _Recorded:
    """What a journal holds for the run that reads it: its events and responses as
    the resume records left them, and where each came from."""

    cut_at: Optional[int]  # where a torn last line begins, cut off before the next write
    begun: bool = False  # it holds the run record
    events: List[al.Event] = dataclasses.field(default_factory=list)
    lines: List[str] = dataclasses.field(default_factory=list)  # each event's line
    numbers: List[int] = dataclasses.field(default_factory=list)  # and its line number
    # Request id -> (how many events were recorded before the response, the response).
    responses: Dict[str, Tuple[int, al.ModelResponse]] = dataclasses.field(default_factory=dict)

    @property
    def finished(self) -> bool:
        """The run ended: its last recorded event is run.finished."""
        return bool(self.events) and self.events[-1].type == "run.finished"

    def boundary(self) -> int:
        """How many recorded events the run gives again: those up to its last complete
        message (a response the loop appended, a tool result)."""
        ends = [position for position, _ in self.responses.values()]
        ends.extend(i + 1 for i, event in enumerate(self.events) if event.type == "tool.finished")
        return max(ends, default=0)

    def steps(self) -> Dict[str, Tuple[Tuple[al.ModelChunk, ...], al.ModelResponse]]:
        """Each step whose response is recorded: its recorded chunks and its response."""
        chunks: Dict[str, List[al.ModelChunk]] = {request_id: [] for request_id in self.responses}
        for event in self.events[: self.boundary()]:
            if event.type == "model.chunk" and event.payload["request_id"] in chunks:
                chunks[event.payload["request_id"]].append(event.payload["chunk"])
        return {
            request_id: (tuple(chunks[request_id]), response)
            for request_id, (_, response) in self.responses.items()
        }

    def results(self) -> Dict[str, al.ToolResultMessage]:
        """Each recorded tool result, by its call's id."""
        return {
            event.payload["tool_call"].id: event.payload["tool_result"]
            for event in self.events
            if event.type == "tool.finished"
        }


def _read_journal(path: str, run_record: str) -> _Recorded:
    """Reads the journal at ``path`` for the run whose first line is ``run_record``.

    Raises JournalError for another run's journal or a line that is not one of the
    records the journal holds, in order; a torn last line (no newline: the process
    died while writing it) is dropped.
    """
    try:
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        data = b""
    whole, newline, torn = data.rpartition(b"\n")
    recorded = _Recorded(cut_at=len(whole) + len(newline) if torn else None)
    if not newline:
        # Nothing whole: a journal to begin, unless the bytes are another file's.
        if not (run_record + "\n").encode("ascii").startswith(torn):
            raise JournalError(
                path,
                1,
                "the file holds no whole line, and its bytes are not the beginning of this "
                "run's first line: not a journal, or another run's",
            )
        return recorded
    lines = whole.split(b"\n")
    _check_run_record(path, _record(path, 1, lines[0]), run_record)
    recorded.begun = True
    for number, line in enumerate(lines[1:], start=2):
        _read_line(path, number, line, recorded)
    return recorded


def _record(path: str, number: int, line: bytes) -> Dict[str, Any]:
    """The JSON object of a whole line; JournalError if it holds none."""
    try:
        data = json.loads(line.decode("ascii"))
    except ValueError as error:  # not ASCII, or a JSONDecodeError: not what the journal writes
        raise JournalError(path, number, f"not a line of a journal ({error})") from None
    if type(data) is not dict:
        raise JournalError(path, number, f"not a JSON object but {type(data).__name__}")
    return cast(Dict[str, Any], data)


def _check_run_record(path: str, data: Dict[str, Any], run_record: str) -> None:
    """The journal's first line describes this run; JournalError says what differs."""
    if data.get("record") != "run":
        raise JournalError(path, 1, "not a durable run's journal: its first line is no run record")
    expected = json.loads(run_record)
    if _canonical(data.get("format")) != _canonical(expected["format"]):
        raise JournalError(
            path,
            1,
            f"a journal of format {data.get('format')!r}; this durable_run() reads format "
            f"{_JOURNAL_FORMAT}",
        )
    for key, what, item in (
        ("messages", "starting messages", "message"),
        ("tools", "tools", "tool"),
        ("maxSteps", "max_steps", ""),
        ("requestSequenceStart", "request_sequence_start", ""),
    ):
        recorded, wanted = data.get(key), expected[key]
        if _canonical(recorded) == _canonical(wanted):
            continue
        where = ""
        if type(recorded) is list and type(wanted) is list:  # show the first item that differs
            left, right = ([_canonical(value) for value in side] for side in (recorded, wanted))
            index = cast(int, _first_difference(left, right))
            where = f", at {item} {index}"
            recorded, wanted = (
                side[index] if index < len(side) else "nothing" for side in (left, right)
            )
        shown = _shortened_sides(_shown(recorded), _shown(wanted))
        raise JournalError(
            path,
            1,
            f"the journal holds another run: not the same {what}{where}: journal "
            f"{shown[0]}, this run {shown[1]}",
        )


def _canonical(value: object) -> str:
    """JSON text that two equal JSON values share (True is not 1 here, as in JSON)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _shown(value: object) -> str:
    return value if isinstance(value, str) else _canonical(value)


def _read_line(path: str, number: int, line: bytes, recorded: _Recorded) -> None:
    """Reads a whole line after the run record into ``recorded``, checking its place."""
    data = _record(path, number, line)
    kind = data.get("record")
    if recorded.finished:
        raise JournalError(path, number, "a line after run.finished, which ends a run's journal")
    if kind is None:  # an event
        try:
            event = al.event_from_dict(data)
        except ValueError as error:
            raise JournalError(path, number, str(error)) from None
        if event.sequence != len(recorded.events):
            raise JournalError(
                path,
                number,
                f"event {event.sequence} where event {len(recorded.events)} comes next",
            )
        recorded.events.append(event)
        recorded.lines.append(line.decode("ascii"))
        recorded.numbers.append(number)
    elif kind == "response":
        try:
            response = _response_from_dict(data.get("response"))
        except ValueError as error:
            raise JournalError(path, number, str(error)) from None
        if response.request_id in recorded.responses:
            raise JournalError(path, number, f"a second response to {response.request_id}")
        recorded.responses[response.request_id] = (len(recorded.events), response)
    elif kind == "resume":
        sequence = data.get("sequence")
        if type(sequence) is not int or not 0 <= sequence <= len(recorded.events):
            raise JournalError(
                path,
                number,
                f"a resume record's sequence must be an int in 0..{len(recorded.events)} "
                f"(the events recorded before it), got {sequence!r}",
            )
        # The events from `sequence` on, and the responses recorded after them, are void.
        del recorded.events[sequence:], recorded.lines[sequence:], recorded.numbers[sequence:]
        recorded.responses = {
            request_id: (position, response)
            for request_id, (position, response) in recorded.responses.items()
            if position <= sequence
        }
    else:
        raise JournalError(
            path,
            number,
            f"a record {kind!r}: after its first line a journal holds events, and "
            "'response' and 'resume' records",
        )


def _response_from_dict(data: object) -> al.ModelResponse:
    """Reads a ModelResponse from its ``to_dict()`` form; ValueError names the field.
    Its content and usage are read as an assistant message's are."""
    if type(data) is not dict:
        raise ValueError(f"response must be an object, got {type(data).__name__}")
    fields = cast(Dict[str, Any], data)
    for key in ("id", "requestId", "stopReason"):
        if type(fields.get(key)) is not str:
            raise ValueError(
                f"response.{key} must be a string, got {type(fields.get(key)).__name__}"
            )
    message = al.message_from_dict(
        {
            "role": "assistant",
            "id": fields["id"],
            "content": fields.get("content"),
            "usage": fields.get("usage"),
        }
    )
    return al.ModelResponse(
        fields["id"],
        fields["requestId"],
        message.content,  # type: ignore[arg-type]  # an assistant message's
        fields["stopReason"],
        cast(al.AssistantMessage, message).usage,
    )


def _recorded_run(events: List[al.Event]) -> Generator[al.Event, None, al.RunResult]:
    """A finished run, from its journal: its events, then its result."""
    yield from events
    result: al.RunResult = events[-1].payload["result"]
    return result


class _JournaledModel:
    """durable_run()'s model: a step whose response is recorded streams its recorded
    chunks and returns that response; any other asks the run's model, and its response
    is kept for the journal until the loop has appended its message."""

    def __init__(
        self,
        model: al.Model,
        steps: Dict[str, Tuple[Tuple[al.ModelChunk, ...], al.ModelResponse]],
    ) -> None:
        self._model = model
        self._steps = steps
        self._answer: Optional[al.ModelResponse] = None

    def stream(
        self, request: al.ModelRequest, signal: al.Signal
    ) -> Generator[al.ModelChunk, None, al.ModelResponse]:
        """Streams the recorded step, or the run's model's answer to the request."""
        step = self._steps.get(request.id)
        if step is not None:
            return _played(*step)
        stream: object = self._model.stream(request, signal)
        if not isinstance(stream, collections.abc.Generator):
            # run_agent_loop() refuses it, in its own words.
            return cast(Generator[al.ModelChunk, None, al.ModelResponse], stream)
        return self._kept(stream)

    def _kept(
        self, stream: Generator[al.ModelChunk, None, al.ModelResponse]
    ) -> Generator[al.ModelChunk, None, al.ModelResponse]:
        response = yield from stream
        self._answer = response
        return response

    def take_answer(self) -> Optional[al.ModelResponse]:
        """The response the run's model gave last, once (None: the step was recorded)."""
        answer, self._answer = self._answer, None
        return answer


def _played(
    chunks: Tuple[al.ModelChunk, ...], response: al.ModelResponse
) -> Generator[al.ModelChunk, None, al.ModelResponse]:
    yield from chunks
    return response


def _journaled_tool(tool: al.Tool, results: Dict[str, al.ToolResultMessage]) -> al.Tool:
    """The tool, except that a call whose result is recorded gives that result again
    and runs nothing."""

    def execute(arguments: Dict[str, Any], signal: al.Signal) -> object:
        call = al.current_tool_call()
        result = results.get(call.id) if call is not None else None
        if result is None:
            return tool.execute(arguments, signal)
        return _recorded_answer(result)

    return dataclasses.replace(tool, execute=execute)


class _JournalWriter:
    """Appends a run's lines to its journal. The first write opens the file (cutting
    off a torn last line) and begins with the run record, or with a resume record."""

    def __init__(self, path: str, recorded: _Recorded, run_record: str) -> None:
        self.path = path
        self._cut_at = recorded.cut_at
        self._run_record = None if recorded.begun else run_record
        self._descriptor: Optional[int] = None

    def append(self, lines: List[str], sequence: int, sync: bool) -> None:
        """Writes whole lines (the first of them with event ``sequence``), and syncs
        them to disk if ``sync``."""
        if self._descriptor is None:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_BINARY", 0)
            self._descriptor = os.open(self.path, flags, 0o666)
            if self._cut_at is not None:
                # The only bytes ever taken away: a line whose writer died, which no
                # reader took for a record.
                os.ftruncate(self._descriptor, self._cut_at)
            if self._run_record is None:
                lines = [_journal_line({"record": "resume", "sequence": sequence}), *lines]
            else:
                lines = [self._run_record, *lines]
                sync = True
        data = memoryview("".join(line + "\n" for line in lines).encode("ascii"))
        while data:  # os.write may write less than it was given
            data = data[os.write(self._descriptor, data) :]
        if sync:
            os.fsync(self._descriptor)
        if self._run_record is not None:
            _sync_directory(self.path)  # the new file's name survives a power loss too
            self._run_record = None

    def close(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None


def _sync_directory(path: str) -> None:
    """Syncs the directory that holds ``path`` to disk, where the system can."""
    try:
        descriptor = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    except OSError:  # Windows opens no directory
        return
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _journaled_run(
    run: Generator[al.Event, None, al.RunResult],
    recorded: _Recorded,
    model: _JournaledModel,
    writer: _JournalWriter,
) -> Generator[al.Event, None, al.RunResult]:
    """Passes the run's events on: those it gives again are compared with the journal,
    the others written to it first."""
    boundary = recorded.boundary()
    with contextlib.closing(run):
        try:
            while True:
                try:
                    event = next(run)
                except StopIteration as done:
                    result: al.RunResult = done.value
                    return result
                line = _journal_line(event.to_dict())
                if event.sequence < boundary and line == recorded.lines[event.sequence]:
                    yield event  # given again, as recorded
                    continue
                if event.sequence < boundary and not _is_cancellation(event):
                    number = recorded.numbers[event.sequence]
                    again, held = _shortened_sides(line, recorded.lines[event.sequence])
                    raise JournalError(
                        writer.path,
                        number,
                        f"the run gives event {event.sequence} again as {again}, where the "
                        f"journal holds {held}",
                    )
                lines = [line]
                sync = event.type in ("tool.finished", "run.finished")
                answer = model.take_answer() if event.type == "tool.started" else None
                if answer is not None:  # the loop appended its message: record it
                    lines.insert(
                        0, _journal_line({"record": "response", "response": answer.to_dict()})
                    )
                    sync = True
                writer.append(lines, event.sequence, sync)
                yield event
        finally:
            writer.close()


def _is_cancellation(event: al.Event) -> bool:
    """The consumer's signal ended the run while it was being given again."""
    return event.type == "run.finished" and event.payload["result"].status == "cancelled"
