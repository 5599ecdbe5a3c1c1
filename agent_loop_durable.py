# agent_loop_durable.py 1.1.0: durable runs for agent_loop.py, which survive their process.
# One file, standard library only; copy it next to agent_loop.py and agent_loop_replay.py.
# Home: the agent_loop repository.
"""Durable runs: ``run_agent_loop()`` written to a journal file as it goes, so that the
run survives its process, and waits, if need be, for a person's decision.

A durable run is a replay of its journal, then live: called again with the journal,
``durable_run()`` runs the loop from the start on the journal's ``Recording``
(agent_loop_replay.py), whose model streams each recorded step, whose tools give each
recorded result and whose consent hook gives each recorded decision; where the journal
holds nothing more, they ask the run's own model, tools and hook. Rules:

- The journal is JSON lines and only grows: its first line says what the run is (its id,
  starting messages, tools and options), then come the events, each written before the
  consumer sees it with its ``"time"`` (seconds since the run began, to the event's
  ``time``; a process that goes on with the journal counts its own time from its call,
  after the last time recorded before the events it gives live, so the times never go
  back and the time between processes counts nothing), and what no
  event holds: the response of each step that called
  tools, each answer of ``before_tool_call``, and the call a run awaits a decision on. It
  is synced to disk at each complete message, each answer and at the end, not at each
  chunk. A torn last line (the process died writing it) is dropped, and cut off before
  the next write; no whole line is ever changed.
- Called again with the journal, a finished run (any status) is given again as
  recorded, calling nothing. An unfinished run gives its recorded events again up to its
  last complete message (``live_from()`` says where the live events begin); from there
  it is live: the step that was streaming is requested again, and a call that started
  and has no recorded result runs again (at least once: ``effect_key()`` keys its
  effect), while a call with a recorded result never runs again. A group of calls at
  once with such a call is given again up to its tool.started events only: from there
  it is live (its recorded calls give their recorded progress and results again, the
  others run again and report their progress anew). A resume entry voids the events
  recorded past that point, which the run then gives live.
- ``before_tool_call`` may return ``LATER``: the run stops ``cancelled`` right there,
  before the call's group runs (one at a time: before the call runs), so that the call,
  the other calls of its group and the calls after it stay open, and the journal
  records that it awaits a decision (``awaiting_decision()``); the result (and its
  run.finished) lists those calls in ``awaiting``. Called again, the run
  asks ``before_tool_call`` again for that call, and goes on once it is answered.
  An answer is written before the call runs, and never asked again.
- A journal of another run (other starting messages, tools or options), or a line that
  is not where the journal's order puts it (its events are read by
  ``agent_loop_replay.RunSteps``), is refused: JournalError, naming the line.
  ``read_journal()`` gives what a journal holds (the page reads journals with it).

This file uses only the public names of ``agent_loop`` and ``agent_loop_replay``.
"""

from __future__ import annotations

import contextvars
import dataclasses
import enum
import itertools
import json
import os
import secrets
import threading
import time
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Final,
    Generator,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
    cast,
)

import agent_loop as al
import agent_loop_replay as alr

if TYPE_CHECKING:  # annotations only
    from os import PathLike

__version__ = "1.1.0"

__all__ = [
    "durable_run",
    "read_journal",
    "Journal",
    "LATER",
    "awaiting_decision",
    "live_from",
    "effect_key",
    "JournalError",
]

# The journal is JSON lines (agent_loop_replay.json_line), one entry per line, and only grows
# (its "record" key, kept from format 1, names an entry's kind):
#
#   line 1   {"record":"run","format":2,"runId":R,"messages":[...],"tools":[...],
#             "maxSteps":N,"requestSequenceStart":S,"toolConcurrency":C}
#            what the run is (R is random, made once); compared on every call but R
#   events   event.to_dict() plus "time", each before the consumer sees it
#   response {"record":"response","response":{...}} a toolCall response, once the loop
#            appended its message (no event holds it), before its first call is asked
#            about or started
#   decision {"record":"decision","callId":ID,"refusal":null or "..."} what
#            before_tool_call answered for a call, before the call starts
#   awaiting {"record":"awaiting","toolCall":{...}} before_tool_call answered LATER: the
#            run stops cancelled, and goes on once a decision entry answers the call
#   resume   {"record":"resume","sequence":K}  a process took over: the events recorded
#            before this line from sequence K on are void, and K comes next

_JOURNAL_FORMAT: Final = 2
"""The format of the journal's lines; a journal of another format is refused, not guessed at.
Format 1 (1.3) had no run id, tool concurrency, decisions or times."""

_FIRST_LINE_BEGINS: Final = f'{{"record":"run","format":{_JOURNAL_FORMAT},"runId":"'.encode(
    "ascii"
)
"""How every journal this version writes begins (what a torn first line can be the start of)."""


class JournalError(ValueError):
    """A journal that ``durable_run()`` refuses: another run's, or not one it wrote.

    ``path`` is the journal's path, ``line`` the number (from 1) of the line at fault,
    and the message says what is wrong there.
    """

    def __init__(self, path: str, line: int, problem: str) -> None:
        super().__init__(f"journal {path}, line {line}: {problem}")
        self.path = path
        self.line = line


class _Later(enum.Enum):
    """The type of LATER."""

    LATER = "LATER"

    def __repr__(self) -> str:
        return "agent_loop_durable.LATER"


LATER: Final = _Later.LATER
"""What ``before_tool_call`` returns in a durable run when nobody can answer now: the run
stops ``cancelled`` with the call open, and the journal says it awaits a decision."""

_EFFECT_KEY: Final[contextvars.ContextVar[Optional[str]]] = contextvars.ContextVar(
    "agent_loop_durable.effect_key", default=None
)


def effect_key() -> Optional[str]:
    """Returns the key of the tool call executing in this thread (context) in a durable
    run, or None outside a durable run's tool.

    The key is the run's id (random, made once and written in the journal's first line)
    and the call's id: the same for the same call in every process that goes on with the
    journal, and different for every other run's calls, even when call ids repeat across
    runs. A tool whose effect must happen once keys the effect by it: a call that started
    and has no recorded result runs again when the run goes on.
    """
    return _EFFECT_KEY.get()


def durable_run(
    journal: Union[str, PathLike[str]],
    *,
    messages: Iterable[al.Message],
    model: al.Model,
    tools: al.ToolRegistry,
    max_steps: int,
    signal: Optional[al.Signal] = None,
    request_sequence_start: int = 0,
    tool_concurrency: int = 1,
    before_tool_call: Optional[Callable[[al.ToolCall, Any], object]] = None,
) -> Generator[al.Event, None, al.RunResult]:
    """Returns the events of a run, as ``run_agent_loop()`` does with the same options,
    that survives its process: it is written to the ``journal`` file as it goes, and a
    call with the same journal goes on from there.

    On a journal that does not exist yet (or holds nothing whole), the run starts. On a
    journal of a finished run, the generator yields the recorded events and returns the
    recorded result, and calls neither the model nor a tool (a result read back has no
    ``error.exception``). On a journal of an unfinished run, the run gives its recorded
    events again, with their sequence numbers and without calling the model, a tool or
    ``before_tool_call``, up to its last complete message (``live_from(journal)``), and
    goes on live from there: the step that was streaming is requested again, a call
    whose result is recorded is not run again, and a call that started and has no
    recorded result runs again (at least once: key its effect by ``effect_key()``).

    ``before_tool_call`` is asked once per call, as ``run_agent_loop()`` asks it; its
    answer is written to the journal before the call starts, and never asked again (a
    recorded answer is given again even when no ``before_tool_call`` is given). It may
    also return ``LATER``: the run stops there, ``cancelled``, with that call open, and
    awaits a decision (``awaiting_decision(journal)``); called again, the run asks for
    that call again (a ValueError without a ``before_tool_call`` to ask).

    Every event is written (flushed to the operating system) before the consumer sees
    it; the journal is synced to disk (``os.fsync``) at each complete message, each
    answer and at the end. The options are checked now, by ``run_agent_loop()`` itself,
    and so is the journal: JournalError (a ValueError) for a journal of another run
    (other starting messages, tools or options), or one that is not a journal this
    function wrote. Raises ValueError for starting messages that cannot be written as
    JSON (an item that is not a message; run_agent_loop() would fail that run
    INVALID_TRANSCRIPT), TypeError for a journal that is not a path, and OSError as the
    file does. While the run goes on: OSError from writing the journal, and JournalError
    for recorded events that the run does not give again.
    """
    began = time.time()  # the clock of Event.time
    path = _journal_path(journal)
    try:
        items = iter(messages)
        refused: Iterable[al.Message] = ()
    except TypeError:
        items, refused = iter(()), messages
    # ValidateOptions, by run_agent_loop() itself: it checks the options now, and
    # refuses messages that are not iterable.
    al.run_agent_loop(
        messages=refused,
        model=model,
        tools=tools,
        max_steps=max_steps,
        signal=signal,
        request_sequence_start=request_sequence_start,
        tool_concurrency=tool_concurrency,
        before_tool_call=cast(Any, before_tool_call),  # may also return LATER
    )
    # SnapshotRun: as many starting messages as run_agent_loop() reads (one past the cap).
    start = list(itertools.islice(items, al.MAX_INITIAL_MESSAGES + 1))
    run_entry = _run_entry(start, tools, max_steps, request_sequence_start, tool_concurrency)
    entries = _read_journal(path, run_entry)
    if entries.finished:
        return _finished_run(entries.run.events)
    if entries.awaiting and before_tool_call is None:
        raise ValueError(
            f"the journal's run awaits a decision on tool call {entries.awaiting[0].id!r}: "
            "call durable_run() with the before_tool_call that answers it"
        )
    run_id = entries.run_id or secrets.token_hex(16)
    # The run id right after the format: a torn first line shows it is a journal.
    first_line = {"record": "run", "format": _JOURNAL_FORMAT, "runId": run_id, **run_entry}
    writer = _JournalWriter(path, entries, first_line, began)
    # A durable run is a replay of its journal, then live.
    recording = alr.Recording(
        entries.steps(), entries.results(), entries.decisions, entries.run, entries.boundary()
    )
    live_model = alr.KeptModel(model)
    stop = _Stop(signal if signal is not None else threading.Event())
    # The recorded answers are given again even without a hook: a call refused before
    # its process died is refused, not run.
    hook: Any = None
    asking = None
    if before_tool_call is not None or entries.decisions:
        if before_tool_call is not None:
            asking = _Asking(before_tool_call, writer, live_model, stop)
        hook = recording.before_tool_call(asking)
    run = al.run_agent_loop(
        messages=start,
        model=recording.model(live_model),
        tools=al.ToolRegistry(_keyed(recording.tool(tool), run_id) for tool in tools),
        max_steps=max_steps,
        signal=stop,
        request_sequence_start=request_sequence_start,
        tool_concurrency=tool_concurrency,
        # A LATER answer is None to the loop: the hook has set the signal.
        before_tool_call=cast(Optional[Callable[[al.ToolCall, Any], Optional[str]]], hook),
    )
    # Calls at once give their recorded progress and results in the journal's order.
    return _journaled_run(recording.ordered(run), entries, live_model, writer, asking)


def live_from(journal: Union[str, PathLike[str]]) -> int:
    """Returns the sequence of the first event that ``durable_run()`` on this journal, as
    it is now, gives live: the events before it are given again as entries.

    0 for a journal that does not exist yet; for a finished run, the number of its
    events (none is live). Call it before iterating the run. Raises JournalError for a
    file that is not a durable run's journal, TypeError for a journal that is not a
    path, and OSError as the file does.
    """
    entries = _read_journal(_journal_path(journal), None)
    return len(entries.lines) if entries.finished else entries.boundary()


def awaiting_decision(journal: Union[str, PathLike[str]]) -> Tuple[al.ToolCall, ...]:
    """Returns the tool calls whose decision the journal's run awaits (``before_tool_call``
    answered ``LATER``), in assistant order; ``()`` when none (a journal that does not
    exist yet too).

    Raises JournalError for a file that is not a durable run's journal, TypeError for a
    journal that is not a path, and OSError as the file does.
    """
    return tuple(_read_journal(_journal_path(journal), None).awaiting)


def _journal_path(journal: object) -> str:
    """ValidateOptions for the journal: a str or an os.PathLike of one."""
    path = os.fspath(journal) if isinstance(journal, (str, os.PathLike)) else None
    if not isinstance(path, str):
        raise TypeError(
            f"journal must be a path (a str or os.PathLike), got {type(journal).__name__}"
        )
    return path


def _run_entry(
    start: Sequence[object],
    tools: al.ToolRegistry,
    max_steps: int,
    request_sequence_start: int,
    tool_concurrency: int,
) -> Dict[str, Any]:
    """The journal's first line but its run id: what the run is (starting messages, options)."""
    messages = []
    for index, message in enumerate(start):
        try:
            data = cast(Any, message).to_dict()
            alr.json_line(data)
        except Exception as error:  # no to_dict(), or a value that is not JSON
            raise ValueError(
                f"messages[{index}] cannot be written to the journal as JSON ({error}): a "
                "durable run records its starting messages, and run_agent_loop() would "
                "fail this run INVALID_TRANSCRIPT"
            ) from None
        messages.append(data)
    return {
        "record": "run",
        "format": _JOURNAL_FORMAT,
        "messages": messages,
        "tools": [spec.to_dict() for spec in tools.specs()],
        "maxSteps": max_steps,
        "requestSequenceStart": request_sequence_start,
        "toolConcurrency": tool_concurrency,
    }


# --- Reading the journal -------------------------------------------------------------


@dataclass(frozen=True)
class Journal:
    """What a durable run's journal holds, as ``read_journal()`` reads it.

    ``events`` and ``times``: the run's events as the resume entries left them, each
    with its time (seconds since the run began, on the journal's clock; None where a line
    holds none). ``decisions``: by call id, each answer of ``before_tool_call`` (None: run
    the call; a str: it refused the call with it). ``awaiting``: the calls whose decision
    the run awaits. ``resumes``: for each process that went on with the journal, the
    sequence of the first event it gave live, in the order they went on.
    """

    events: Tuple[al.Event, ...]
    times: Tuple[Optional[float], ...]
    decisions: Mapping[str, Optional[str]]
    awaiting: Tuple[al.ToolCall, ...]
    resumes: Tuple[int, ...]
    __hash__ = None  # type: ignore[assignment]  # it holds a mapping


def read_journal(journal: Union[str, PathLike[str]]) -> Journal:
    """Returns what the durable run's journal at this path holds (``Journal``); a journal
    that does not exist yet holds nothing.

    Raises JournalError for a file that is not a durable run's journal, TypeError for a
    journal that is not a path, and OSError as the file does.
    """
    entries = _read_journal(_journal_path(journal), None)
    run = entries.run
    return Journal(
        run.events,
        run.times,
        dict(entries.decisions),
        tuple(entries.awaiting),
        tuple(entries.resumes),
    )


@dataclass
class _Entries:
    """What a journal holds for the run that reads it: its events (read by RunSteps) and
    responses as the resume entries left them, where each came from, and the answers given."""

    cut_at: Optional[int]  # where a torn last line begins, cut off before the next write
    run_id: Optional[str] = None  # None: the journal holds no run entry yet
    run: alr.RunSteps = dataclasses.field(default_factory=alr.RunSteps)  # events, times
    lines: List[str] = dataclasses.field(default_factory=list)  # each event's line, no time
    numbers: List[int] = dataclasses.field(default_factory=list)  # and its line number
    # Request id -> (how many events were recorded before the response, the response).
    responses: Dict[str, Tuple[int, al.ModelResponse]] = dataclasses.field(default_factory=dict)
    decisions: Dict[str, Optional[str]] = dataclasses.field(default_factory=dict)
    awaiting: List[al.ToolCall] = dataclasses.field(default_factory=list)
    resumes: List[int] = dataclasses.field(default_factory=list)  # each resume's sequence

    @property
    def stopped(self) -> bool:
        """Its last recorded event is run.finished (the run ended, or awaits a decision)."""
        return self.run.result is not None

    @property
    def finished(self) -> bool:
        """The run ended, and awaits no decision."""
        return self.stopped and not self.awaiting

    def calls(self) -> List[alr.Call]:
        return [call for step in self.run.steps for call in step.calls]

    def boundary(self) -> int:
        """How many recorded events the run gives again: those up to its last complete
        message (a response the loop appended, a tool result), but no further than the
        tool.started events of a group of calls at once with a call that has no result:
        that call runs again, and its progress may come anywhere among the others'."""
        ends = [position for position, _ in self.responses.values()]
        ends.extend(call.finished + 1 for call in self.calls() if call.finished is not None)
        boundary = max(ends, default=0)
        calls = self.calls()
        for index, call in enumerate(calls):
            group = [call]
            for other in calls[index + 1 :]:
                if other.started != group[-1].started + 1:
                    break
                group.append(other)
            if len(group) > 1 and any(member.finished is None for member in group):
                boundary = min(boundary, group[-1].started + 1)
        return boundary

    def steps(self) -> Dict[str, Tuple[Tuple[al.ModelChunk, ...], al.ModelResponse]]:
        """Each step whose response is recorded: its recorded chunks (all before the
        response entry, which follows the loop's appending it) and its response."""
        events = self.run.events
        chunks = {
            step.request_id: tuple(events[position].payload["chunk"] for position in step.chunks)
            for step in self.run.steps
        }
        return {
            request_id: (chunks.get(request_id, ()), response)
            for request_id, (_, response) in self.responses.items()
        }

    def results(self) -> Dict[al.ToolCall, al.ToolResultMessage]:
        """Each recorded tool result, by its call."""
        return {call.tool_call: call.result for call in self.calls() if call.result is not None}


def _read_journal(path: str, run_entry: Optional[Dict[str, Any]]) -> _Entries:
    """Reads the journal at ``path`` for the run whose first line is ``run_entry`` (any
    run's for None).

    Raises JournalError for another run's journal or a line that is not one of the
    entries the journal holds, in order; a torn last line (no newline: the process
    died while writing it) is dropped.
    """
    try:
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        data = b""
    whole, newline, torn = data.rpartition(b"\n")
    entries = _Entries(cut_at=len(whole) + len(newline) if torn else None)
    if not newline:
        # Nothing whole: a journal to begin, unless the bytes are another file's.
        if not (_FIRST_LINE_BEGINS.startswith(torn) or torn.startswith(_FIRST_LINE_BEGINS)):
            raise JournalError(
                path,
                1,
                "the file holds no whole line, and its bytes are not the beginning of a "
                "journal's first line: not a journal, or another run's",
            )
        return entries
    lines = whole.split(b"\n")
    entries.run_id = _checked_run_entry(path, _entry(path, 1, lines[0]), run_entry)
    for number, line in enumerate(lines[1:], start=2):
        _read_line(path, number, line, entries)
    return entries


def _entry(path: str, number: int, line: bytes) -> Dict[str, Any]:
    """The JSON object of a whole line; JournalError if it holds none."""
    try:
        data = json.loads(line.decode("ascii"))
    except ValueError as error:  # not ASCII, or a JSONDecodeError: not what the journal writes
        raise JournalError(path, number, f"not a line of a journal ({error})") from None
    if type(data) is not dict:
        raise JournalError(path, number, f"not a JSON object but {type(data).__name__}")
    return cast(Dict[str, Any], data)


_COMPARED: Final = (
    ("messages", "starting messages", "message"),
    ("tools", "tools", "tool"),
    ("maxSteps", "max_steps", ""),
    ("requestSequenceStart", "request_sequence_start", ""),
    ("toolConcurrency", "tool_concurrency", ""),
)
"""The run entry's fields that say what the run is, with their names and item names."""


def _checked_run_entry(path: str, data: Dict[str, Any], expected: Optional[Dict[str, Any]]) -> str:
    """The run id of the journal's first line, which describes the ``expected`` run (any
    run for None); JournalError says what differs."""
    if data.get("record") != "run":
        raise JournalError(path, 1, "not a durable run's journal: its first line is no run entry")
    if _canonical(data.get("format")) != _canonical(_JOURNAL_FORMAT):
        raise JournalError(
            path,
            1,
            f"a journal of format {data.get('format')!r}; this durable_run() reads format "
            f"{_JOURNAL_FORMAT}",
        )
    run_id = data.get("runId")
    if type(run_id) is not str or not run_id:
        raise JournalError(path, 1, f"the run id must be a non-empty string, got {run_id!r}")
    for key, what, item in _COMPARED if expected is not None else ():
        recorded, wanted = data.get(key), cast(Dict[str, Any], expected)[key]
        if _canonical(recorded) == _canonical(wanted):
            continue
        where = ""
        if type(recorded) is list and type(wanted) is list:  # show the first item that differs
            left, right = ([_canonical(value) for value in side] for side in (recorded, wanted))
            pairs = enumerate(zip(left, right))
            shorter = min(len(left), len(right))  # one is the start of the other
            index = next((i for i, (one, other) in pairs if one != other), shorter)
            where = f", at {item} {index}"
            recorded, wanted = (
                side[index] if index < len(side) else "nothing" for side in (left, right)
            )
        shown = alr.shortened_difference(_shown(recorded), _shown(wanted))
        raise JournalError(
            path,
            1,
            f"the journal holds another run: not the same {what}{where}: journal "
            f"{shown[0]}, this run {shown[1]}",
        )
    return run_id


def _canonical(value: object) -> str:
    """JSON text that two equal JSON values share (True is not 1 here, as in JSON)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _shown(value: object) -> str:
    return value if isinstance(value, str) else _canonical(value)


def _read_line(path: str, number: int, line: bytes, entries: _Entries) -> None:
    """Reads a whole line after the run entry into ``entries``, checking its place."""
    data = _entry(path, number, line)
    kind = data.get("record")
    if entries.finished:
        raise JournalError(path, number, "a line after run.finished, which ends a run's journal")
    if entries.stopped and kind != "resume":
        raise JournalError(
            path,
            number,
            "a line after the run.finished of a run that awaits a decision, where only "
            "a resume entry comes",
        )
    try:
        if kind is None:  # an event
            _read_event(data, number, entries)
        elif kind == "response":
            response = _response_from_dict(data.get("response"))
            if response.request_id in entries.responses:
                raise ValueError(f"a second response to {response.request_id}")
            entries.responses[response.request_id] = (len(entries.lines), response)
        elif kind == "decision":
            call_id, refusal = data.get("callId"), data.get("refusal")
            if type(call_id) is not str or not (refusal is None or type(refusal) is str):
                raise ValueError(
                    "a decision entry holds a callId string and a refusal (null or a "
                    f"string), got {call_id!r} and {refusal!r}"
                )
            entries.decisions[call_id] = refusal
            entries.awaiting = [call for call in entries.awaiting if call.id != call_id]
        elif kind == "awaiting":
            entries.awaiting = [_tool_call_from_dict(data.get("toolCall"))]
        elif kind == "resume":
            _void_from(_resume_sequence(data, len(entries.lines)), entries)
        else:
            raise ValueError(
                f"an entry {kind!r}: after its first line a journal holds events, and "
                "'response', 'decision', 'awaiting' and 'resume' entries"
            )
    except ValueError as error:
        raise JournalError(path, number, str(error)) from None


def _read_event(data: Dict[str, Any], number: int, entries: _Entries) -> None:
    """An event line: the next event of the run, in a run's order (RunSteps); ValueError
    if it is not."""
    event = al.event_from_dict(data)
    seconds = data.get("time")
    entries.run.feed(event, seconds if type(seconds) in (int, float) else None)
    # As the run gives it again: without its time.
    entries.lines.append(alr.json_line({k: v for k, v in data.items() if k != "time"}))
    entries.numbers.append(number)


def _resume_sequence(data: Dict[str, Any], recorded: int) -> int:
    """The sequence a resume entry names: the first of the events it voids."""
    sequence = data.get("sequence")
    if type(sequence) is not int or not 0 <= sequence <= recorded:
        raise ValueError(
            f"a resume entry's sequence must be an int in 0..{recorded} (the events "
            f"recorded before it), got {sequence!r}"
        )
    return sequence


def _void_from(sequence: int, entries: _Entries) -> None:
    """A resume entry: the events from ``sequence`` on, and the responses recorded
    after them, are void."""
    kept, entries.run = entries.run, alr.RunSteps()
    for event, seconds in zip(kept.events[:sequence], kept.times):
        entries.run.feed(event, seconds)
    del entries.lines[sequence:], entries.numbers[sequence:]
    entries.resumes.append(sequence)
    entries.responses = {
        request_id: (position, response)
        for request_id, (position, response) in entries.responses.items()
        if position <= sequence
    }


def _tool_call_from_dict(data: object) -> al.ToolCall:
    """Reads a ToolCall from its ``to_dict()`` form, as an assistant message's block."""
    message = al.message_from_dict({"role": "assistant", "id": "awaiting", "content": [data]})
    call = cast(al.AssistantMessage, message).content[0]
    if not isinstance(call, al.ToolCall):
        raise ValueError(f"an awaiting entry holds a tool call, got {type(call).__name__}")
    return call


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
            "providerResponseId": fields.get("providerResponseId"),
        }
    )
    assistant = cast(al.AssistantMessage, message)
    return al.ModelResponse(
        fields["id"],
        fields["requestId"],
        assistant.content,
        fields["stopReason"],
        assistant.usage,
        assistant.provider_response_id,
    )


# --- Going on: the recording, then live ----------------------------------------------


def _finished_run(events: Sequence[al.Event]) -> Generator[al.Event, None, al.RunResult]:
    """A finished run, from its journal: its events, then its result."""
    yield from events
    result: al.RunResult = events[-1].payload["result"]
    return result


class _Stop:
    """The run's signal: the consumer's, or a decision that comes LATER. A LATER is
    answered only before a call starts, while nothing waits on the signal."""

    def __init__(self, signal: al.Signal) -> None:
        self._signal = signal
        self.later = threading.Event()

    def is_set(self) -> bool:
        return self.later.is_set() or self._signal.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        return self._signal.wait(timeout)


def _keyed(tool: al.Tool, run_id: str) -> al.Tool:
    """The tool, run with effect_key() telling its call's key."""

    def execute(arguments: Dict[str, Any], signal: al.Signal) -> object:
        call = al.current_tool_call()  # set: the loop runs the tool
        # In the call's own context (the loop runs each call in a copy, as it sets
        # current_tool_call()), so that a generator tool's body, run there on each of the
        # loop's next(), sees the key too.
        _EFFECT_KEY.set(None if call is None else f"{run_id}:{call.id}")
        return tool.execute(arguments, signal)

    return dataclasses.replace(tool, execute=execute)


class _JournalWriter:
    """Appends a run's lines to its journal. The first write opens the file (cutting
    off a torn last line) and begins with the run entry, or with a resume entry."""

    def __init__(
        self, path: str, entries: _Entries, run_entry: Dict[str, Any], began: float
    ) -> None:
        self.path = path
        self._cut_at = entries.cut_at
        self._run_entry = None if entries.run_id is not None else run_entry
        # A process that goes on with a journal goes on with its clock: its own time
        # counts from the last time recorded before the events it gives live, so that a
        # journal's times never go back and the time between two processes counts
        # nothing, while this process's time before its first live event (its replay,
        # the request it makes again) counts.
        boundary = entries.boundary()
        self._clock = max((t for t in entries.run.times[:boundary] if t is not None), default=0.0)
        self._began = began
        self._descriptor: Optional[int] = None
        self.next_sequence = 0  # the sequence of the run's next event

    def event_line(self, event: al.Event) -> str:
        """The event's line: its ``to_dict()`` and its time on the journal's clock (from
        ``event.time`` when the loop set it, else now)."""
        seconds = self._clock + alr.event_seconds(event, self._began)
        return alr.json_line({**event.to_dict(), "time": seconds})

    def append(self, lines: List[str], sync: bool) -> None:
        """Writes whole lines, and syncs them to disk if ``sync``."""
        if self._descriptor is None:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_BINARY", 0)
            self._descriptor = os.open(self.path, flags, 0o666)
            if self._cut_at is not None:
                # The only bytes ever taken away: a line whose writer died, which no
                # reader took for an entry.
                os.ftruncate(self._descriptor, self._cut_at)
            if self._run_entry is None:
                resume = {"record": "resume", "sequence": self.next_sequence}
                lines = [alr.json_line(resume), *lines]
            else:
                lines = [alr.json_line(self._run_entry), *lines]
                sync = True
        data = memoryview("".join(line + "\n" for line in lines).encode("ascii"))
        while data:  # os.write may write less than it was given
            data = data[os.write(self._descriptor, data) :]
        if sync:
            os.fsync(self._descriptor)
        if self._run_entry is not None:
            _sync_directory(self.path)  # the new file's name survives a power loss too
            self._run_entry = None

    def write_entry(self, data: Dict[str, Any]) -> None:
        """Writes an entry that is no event, synced to disk."""
        self.append([alr.json_line(data)], True)

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


def _write_response(model: alr.KeptModel, writer: _JournalWriter) -> None:
    """The response the run's model gave, once the loop appended its message: no event
    holds it, so a response entry does."""
    response = model.take_response()
    if response is not None:
        writer.write_entry({"record": "response", "response": response.to_dict()})


class _Asking:
    """The run's own before_tool_call, whose answers are written before the call starts."""

    def __init__(
        self,
        hook: Callable[[al.ToolCall, Any], object],
        writer: _JournalWriter,
        model: alr.KeptModel,
        stop: _Stop,
    ) -> None:
        self._hook = hook
        self._writer = writer
        self._model = model
        self._stop = stop
        self.awaiting: List[al.ToolCall] = []  # the calls it answered LATER for

    def __call__(self, call: al.ToolCall, signal: Any) -> object:
        _write_response(self._model, self._writer)  # asked after the loop appended it
        answer = self._hook(call, signal)
        if answer is LATER:
            self._writer.write_entry({"record": "awaiting", "toolCall": call.to_dict()})
            self.awaiting.append(call)
            self._stop.later.set()  # the loop looks at its signal once the hook returns
            return None
        if answer is None or type(answer) is str:  # any other answer fails the run
            self._writer.write_entry({"record": "decision", "callId": call.id, "refusal": answer})
        return answer


def _journaled_run(
    run: Generator[al.Event, None, al.RunResult],
    entries: _Entries,
    model: alr.KeptModel,
    writer: _JournalWriter,
    asking: Optional[_Asking],
) -> Generator[al.Event, None, al.RunResult]:
    """Passes the run's events on (``passed_on``): those it gives again are compared with
    the journal, the others written to it first; the journal is closed before the run.
    A run that stops on a LATER has its calls as its result's ``awaiting``, in its
    run.finished too."""
    boundary = entries.boundary()
    awaiting: Optional[al.RunResult] = None  # the result of a run that stopped on a LATER

    def journaled(event: al.Event) -> al.Event:
        nonlocal awaiting
        if event.type == "run.finished" and asking is not None and asking.awaiting:
            # A pause is not a cancel: the result says which calls await a decision.
            awaiting = dataclasses.replace(
                event.payload["result"], awaiting=tuple(asking.awaiting)
            )
            event = al.Event(event.sequence, event.type, {"result": awaiting}, event.time)
        # Given again: compared with its line. Live: written, and only once.
        live = event.sequence >= boundary
        if not live:
            line, held = alr.json_line(event.to_dict()), entries.lines[event.sequence]
            live = line != held  # a cancellation while given again is live
            if live and not _is_cancellation(event):
                again, held = alr.shortened_difference(line, held)
                raise JournalError(
                    writer.path,
                    entries.numbers[event.sequence],
                    f"the run gives event {event.sequence} again as {again}, where "
                    f"the journal holds {held}",
                )
        if live:
            if event.type == "tool.started":
                _write_response(model, writer)  # the loop appended its message
            sync = event.type in ("tool.finished", "run.finished")
            writer.append([writer.event_line(event)], sync)
        writer.next_sequence = event.sequence + 1
        return event

    result = yield from alr.passed_on(run, journaled, writer.close)
    return result if awaiting is None else awaiting


def _is_cancellation(event: al.Event) -> bool:
    """The consumer's signal ended the run while it was being given again."""
    return event.type == "run.finished" and event.payload["result"].status == "cancelled"
