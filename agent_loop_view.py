# agent_loop_view.py 1.1.0: the times of a recorded run of agent_loop.py, and a page that draws it.
# One file, standard library only; copy it next to agent_loop.py. Home: the agent_loop repository.
"""See inside a recorded run: its times in a short summary, and a page that draws it.

Both read a run's events paired with the time each was yielded (seconds since the run
began, or None where the log holds no time), as ``agent_loop_replay.load_timed_events``
gives them back from a log or a durable journal.

``summarize_times(timed_events)`` returns a ``RunTimes``: for each step (a request id),
the time to its first chunk and its stream time, each tool call's duration, and the
run's. The rules, from what the events give (no event marks a request's opening):

- A step begins at the time of the event just before its first event (the loop opens
  the request right after yielding it), or at 0 when its first event is the run's first.
- Its time to first chunk runs from its beginning to its first ``model.chunk``; its
  stream time from its first chunk to its last. A step without chunks has neither.
- A call's duration runs from its ``tool.started`` to its ``tool.finished``. In a group
  run at once, ``tool.started`` means scheduled, so the duration includes any wait for
  a free thread. A call without ``tool.finished`` (the run ended first) has none.
- The run's time is the time of its last event (``run.finished`` when it ended).
- A request that failed before its first chunk yielded no event of its own, so it has
  no step here.

A value that needs a time the log does not hold is None. ``format_times(times)`` is the
summary as text, one line per step and per call.

``render_page(timed_events, title=...)`` returns one self-contained HTML page (inline
style and script, nothing fetched: its Content-Security-Policy allows no connection) that
draws the run: each step on a timeline (its wait for the first chunk, its streaming, its
calls, calls that ran at once in parallel lanes), each call's arguments and result on
demand (a click on its bar, or a link to ``#call-S-C``, opens the C-th call of the S-th
step, from 0), errors and refusals marked, the final status (with the calls a durable
run awaits a decision on), usage and times. Without times the timeline is ordinal:
one unit per event. The run's data is embedded as JSON in a
``<script type="application/json">`` element with ``<``, ``>`` and ``&`` escaped, and
the page's script builds the page with ``textContent`` only: text from a model or a
tool is shown, never read as HTML.

This file uses only the public names of ``agent_loop``.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import html
import importlib
import itertools
import json
from typing import TYPE_CHECKING, Any, Dict, Final, Iterable, List, Optional, Sequence, Set, Tuple

import agent_loop as al
import agent_loop_replay as alr

if TYPE_CHECKING:  # annotations only: read_run() loads agent_loop_durable by name
    from agent_loop_durable import Journal

__version__ = "1.1.0"

__all__ = [
    "RunTimes",
    "StepTimes",
    "ToolTimes",
    "format_times",
    "read_run",
    "render_page",
    "summarize_times",
]


TimedEvent = Tuple[al.Event, Optional[float]]
"""An event and the time it was yielded, in seconds since the run began (None: unknown)."""


# --- The times --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ToolTimes:
    """One tool call's time: from its ``tool.started`` to its ``tool.finished``."""

    request_id: str
    call_id: str
    name: str
    duration: Optional[float]


@dataclasses.dataclass(frozen=True)
class StepTimes:
    """One step's times: its wait for the first chunk, its streaming, its calls."""

    request_id: str
    time_to_first_chunk: Optional[float]
    stream_time: Optional[float]
    tools: Tuple[ToolTimes, ...]


@dataclasses.dataclass(frozen=True)
class RunTimes:
    """A run's times: each step's, in the order of the steps, and the run's own."""

    steps: Tuple[StepTimes, ...]
    total: Optional[float]


def summarize_times(timed_events: Iterable[TimedEvent]) -> RunTimes:
    """Returns the times of a run's events, paired with their times (see the module's rules).

    Raises TypeError for an item that is not an (Event, float or None) pair.
    """
    return _times(_read(timed_events))


def _times(run: alr.RunSteps) -> RunTimes:
    """The times of a run's steps, from the times of its events."""
    times = run.times

    def between(start: Optional[int], end: Optional[int]) -> Optional[float]:
        begun = 0.0 if start is None else times[start]
        ended = None if end is None else times[end]
        return None if begun is None or ended is None else float(ended - begun)

    step_times = []
    for step in run.steps:
        first, last = (step.chunks[0], step.chunks[-1]) if step.chunks else (None, None)
        tools = tuple(
            ToolTimes(
                step.request_id,
                call.tool_call.id,
                call.tool_call.name,
                between(call.started, call.finished),
            )
            for call in step.calls
        )
        step_times.append(
            StepTimes(
                step.request_id,
                None if first is None else between(_begins(step), first),
                None if first is None else between(first, last),
                tools,
            )
        )
    return RunTimes(tuple(step_times), times[-1] if times else None)


def format_times(times: RunTimes) -> str:
    """Returns the summary as text: the run's time, then a line per step and per call."""
    lines = [f"times: {_seconds(times.total)} in all"]
    for step in times.steps:
        lines.append(
            f"  {step.request_id}: first chunk after {_seconds(step.time_to_first_chunk)}, "
            f"streamed {_seconds(step.stream_time)}"
        )
        lines.extend(f"    {t.name} [{t.call_id}]: {_seconds(t.duration)}" for t in step.tools)
    return "\n".join(lines)


def _seconds(value: Optional[float]) -> str:
    """A time as the summary and the page show it: ms below a second, else seconds."""
    if value is None:
        return "unknown"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    return f"{value:.2f} s"


def _read(timed_events: Iterable[TimedEvent]) -> alr.RunSteps:
    """The run of the timed events, read by RunSteps; TypeError names the first pair that
    is not one, and RunSteps' ValueError an event out of order."""
    run = alr.RunSteps()
    for position, pair in enumerate(timed_events):
        event, time = pair if type(pair) is tuple and len(pair) == 2 else (None, None)
        if not isinstance(event, al.Event) or not (time is None or (type(time) in (int, float))):
            raise TypeError(
                f"timed events are (Event, float or None) pairs, got {pair!r:.80} at "
                f"position {position}"
            )
        # The pair's time is the event's: None is unknown, whatever event.time holds (the
        # loop's own clock, not seconds since the run began).
        run.feed(dataclasses.replace(event, time=None) if time is None else event, time)
    return run


def _begins(step: alr.Step) -> Optional[int]:
    """Where a step begins: the event just before its first (the loop opens the request
    right after yielding it), or None when its first is the run's first."""
    return step.first - 1 if step.first else None


def _lanes(calls: Sequence[alr.Call]) -> List[int]:
    """Each call's lane: the first that no call still running at its tool.started holds,
    so that calls one after the other share a lane and calls at once get one each."""
    ends: List[Optional[int]] = []  # per lane, where its last call finished (None: open)
    lanes = []
    for call in calls:
        free = [lane for lane, end in enumerate(ends) if end is not None and end < call.started]
        lane = free[0] if free else len(ends)
        if not free:
            ends.append(None)
        ends[lane] = call.finished
        lanes.append(lane)
    return lanes


# --- The page -----------------------------------------------------------------------


def render_page(
    timed_events: Iterable[TimedEvent],
    *,
    title: str = "A run of agent_loop",
    journal: Optional[Journal] = None,
) -> str:
    """Returns a self-contained HTML page that draws the run of these timed events; with
    the ``journal`` they were read from (``read_run()``), also what it awaits, the
    answers it holds and where a process took over.

    Raises TypeError for an item that is not an (Event, float or None) pair, and
    ValueError for events that are not in a run's order (``RunSteps``).
    """
    data = _page_data(_read(timed_events), title, journal)
    text = json.dumps(data, ensure_ascii=True, separators=(",", ":"))
    # So that no text of the log can end the element ("</script>") or open a comment.
    for character in "<>&":
        text = text.replace(character, f"\\u{ord(character):04x}")
    return _PAGE.format(
        title=html.escape(title),
        style=_STYLE,
        script=_SCRIPT,
        data=text,
        style_hash=_sha256(_STYLE),
        script_hash=_sha256(_SCRIPT),
    )


def read_run(path: str) -> Tuple[List[TimedEvent], Optional[Journal]]:
    """Reads a recorded run from the file at ``path``, by its first line: a durable run's
    journal (``agent_loop_durable.read_journal``, loaded by name) gives its events, their
    times and the journal; any other file is a log (``agent_loop_replay.load_timed_events``)
    and gives its events, their times and None.

    Raises ValueError naming the line that holds no event, JournalError (a ValueError)
    for a journal that durable runs refuse, ImportError naming the file to copy when a
    journal is read without agent_loop_durable.py, and OSError as the file does.
    """
    with open(path, encoding="utf-8") as file:
        first = file.readline()
        if not first.startswith('{"record":"run"'):
            return alr.load_timed_events(itertools.chain([first] if first else [], file)), None
    try:
        durable = importlib.import_module("agent_loop_durable")
    except ImportError:
        raise ImportError(
            f"{path} is a durable run's journal: reading it needs agent_loop_durable.py "
            "beside agent_loop_view.py"
        ) from None
    journal: Journal = durable.read_journal(path)
    return list(zip(journal.events, journal.times)), journal


def _sha256(text: str) -> str:
    """The Content-Security-Policy source that allows exactly this inline text."""
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode()


def _page_data(run: alr.RunSteps, title: str, journal: Optional[Journal]) -> Dict[str, Any]:
    """The plain data the page's script draws: positions on the timeline, and texts."""
    events, times = run.events, run.times
    timed = bool(times) and None not in times
    # Seconds since the run began, or one unit per event where the log holds no times.
    positions: List[float] = list(times) if timed else list(range(len(events)))  # type: ignore[arg-type]
    span = positions[-1] if positions else 0

    def at(position: Optional[int]) -> float:
        return 0 if position is None else positions[position]

    summary = _times(run)
    awaiting = {call.id for call in journal.awaiting} if journal is not None else set()
    steps = []
    for step, step_times in zip(run.steps, summary.steps):
        chunks = [events[position].payload["chunk"] for position in step.chunks]
        lanes = _lanes(step.calls)
        labels = [
            ", ".join(
                f"{call.tool_call.name} [{call.tool_call.id}]"
                for call, in_lane in zip(step.calls, lanes)
                if in_lane == lane
            )
            for lane in range(max(lanes, default=-1) + 1)
        ]
        steps.append(
            {
                "requestId": step.request_id,
                "start": at(_begins(step)),
                "firstChunk": at(step.chunks[0]) if step.chunks else None,
                "lastChunk": at(step.chunks[-1]) if step.chunks else None,
                "end": at(step.last),
                "lanes": labels,
                "label": (
                    f"first chunk after {_seconds(step_times.time_to_first_chunk)}, "
                    f"streamed {_seconds(step_times.stream_time)}"
                    if timed and step.chunks
                    else f"{len(chunks)} chunk(s)"
                ),
                "thinking": "".join(c.thinking for c in chunks if isinstance(c, al.ThinkingDelta)),
                "text": "".join(c.text for c in chunks if isinstance(c, al.TextDelta)),
                "calls": [
                    {
                        **_call_data(call, tool_times, timed, awaiting),
                        "lane": lane,
                        "start": at(call.started),
                        "end": span if call.finished is None else at(call.finished),
                        "progress": [
                            {"at": at(position), "text": _progress_text(events[position])}
                            for position in call.progress
                        ],
                    }
                    for call, tool_times, lane in zip(step.calls, step_times.tools, lanes)
                ],
            }
        )
    return {
        "title": title,
        "timed": timed,
        "span": span,
        "axis": (
            f"time since the run began, 0 to {_seconds(span)}"
            if timed
            else f"no times in the log: one unit per event, 0 to {len(events) - 1}"
        ),
        "ticks": [
            {"at": at, "label": _seconds(at) if timed else str(at)} for at in _ticks(span, timed)
        ],
        "total": _seconds(summary.total) if timed else None,
        "messages": [_message_data(message) for message in run.accepted],
        "steps": steps,
        "result": None if run.result is None else _result_data(run.result),
        "journal": None if journal is None else _journal_data(journal, at, timed, len(events)),
    }


def _ticks(span: float, timed: bool) -> List[float]:
    """Where the timeline's axis is labelled: 0, its quarters and its end (whole events
    on an ordinal axis, without repeats)."""
    quarters = [span * quarter / 4 for quarter in range(5)]
    return quarters if timed else sorted({round(at) for at in quarters})


def _call_data(
    call: alr.Call, times: ToolTimes, timed: bool, awaiting: Set[str]
) -> Dict[str, Any]:
    """A call as the page shows it: its status, its arguments and its result."""
    if call.result is None:  # the run ended before its result, or awaits a decision on it
        status = "awaiting" if call.tool_call.id in awaiting else "open"
    elif call.refused:
        status = "refused"
    else:
        status = "error" if call.result.is_error else "ends_run" if call.ends_run else "ok"
    return {
        "id": call.tool_call.id,
        "name": call.tool_call.name,
        "status": status,
        "duration": _seconds(times.duration) if timed and times.duration is not None else None,
        "arguments": json.dumps(call.tool_call.plain_arguments(), indent=2, ensure_ascii=False),
        "result": None if call.result is None else call.result.content,
    }


def _progress_text(event: al.Event) -> str:
    """A tool.progress event's value, as the page shows it: its JSON."""
    return json.dumps(event.payload["progress"], ensure_ascii=False)


def _journal_data(journal: Journal, at: Any, timed: bool, events: int) -> Dict[str, Any]:
    """What a durable run's journal holds beyond its events, as the page shows it."""
    return {
        "awaiting": [f"{call.name} [{call.id}]" for call in journal.awaiting],
        "answers": [
            f"{call_id}: " + ("run it" if refusal is None else f"refused: {refusal}")
            for call_id, refusal in journal.decisions.items()
        ],
        "resumes": [
            f"a process went on from event {sequence}"
            + (f", at {_seconds(at(sequence - 1))}" if timed and 0 < sequence <= events else "")
            for sequence in journal.resumes
        ],
    }


def _message_data(message: al.Message) -> Dict[str, str]:
    """A starting message as the page shows it: its role, id and text."""
    if isinstance(message, al.AssistantMessage):
        text = al.text_from_assistant(message)
    else:
        text = message.content
    return {"role": message.role, "id": message.id, "text": text}


def _result_data(result: al.RunResult) -> Dict[str, Any]:
    """The run's result as the page shows it."""
    return {
        "status": result.status,
        "steps": result.steps,
        "finalText": result.final_text,
        "error": None if result.error is None else result.error.to_dict(),
        "usage": None if result.usage is None else result.usage.to_dict(),
        # A durable run that stopped on LATER: a pause, not a cancel.
        "awaiting": [f"{call.name} [{call.id}]" for call in result.awaiting],
    }


_PAGE: Final = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; \
style-src '{style_hash}'; script-src '{script_hash}'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{style}</style>
</head>
<body>
<main id="run"><noscript>This page draws the run with its script; \
the run's data is in the element run-data.</noscript></main>
<script type="application/json" id="run-data">{data}</script>
<script>{script}</script>
</body>
</html>
"""
"""The page: its policy allows only its own style and script, and no connection."""

_STYLE: Final = """
:root { --ink: #1d2430; --muted: #5d6778; --line: #d9dee7; --wait: #e3e7ee;
  --stream: #3b73d9; --ok: #2f9e6b; --error: #d2423b; --refused: #c9861a; --open: #8a93a3; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif;
  color: var(--ink); background: #f5f7fa; }
main { max-width: 1100px; margin: 0 auto; padding: 20px 24px 40px; }
h1 { font-size: 20px; margin: 0 0 8px; }
h2 { font-size: 15px; margin: 22px 0 8px; color: var(--muted); text-transform: uppercase;
  letter-spacing: .04em; }
.card { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 14px 16px; }
.facts { display: flex; flex-wrap: wrap; gap: 8px 18px; align-items: center; margin: 0; }
.facts span { color: var(--muted); }
.facts b { color: var(--ink); font-weight: 600; }
.facts .status, .status { display: inline-block; padding: 2px 10px; border-radius: 999px;
  color: #fff; font-weight: 600; background: var(--open); }
.status.completed { background: var(--ok); }
.status.failed { background: var(--error); }
.status.cancelled, .status.maxSteps { background: var(--refused); }
.run-error { margin: 10px 0 0; padding: 8px 10px; border-left: 4px solid var(--error);
  background: #fdeeed; }
.run-awaiting { margin: 10px 0 0; padding: 8px 10px; border-left: 4px solid var(--refused); }
.final { margin: 10px 0 0; white-space: pre-wrap; }
.messages p { margin: 4px 0; }
.role { display: inline-block; min-width: 70px; color: var(--muted); }
.axis { margin: 0 0 8px; color: var(--muted); font-size: 12px; }
.row { display: grid; grid-template-columns: 120px 1fr; align-items: center; min-height: 26px; }
.row + .row { border-top: 1px dashed #eef0f4; }
.row.step { border-top: 1px solid var(--line); }
.label { font: 12px/1.2 ui-monospace, "DejaVu Sans Mono", monospace; color: var(--muted);
  white-space: nowrap; overflow: hidden; text-overflow: ellipsis; padding-right: 8px; }
.row.step .label { color: var(--ink); font-weight: 600; }
.track { position: relative; height: 22px; overflow: hidden;
  background: repeating-linear-gradient(90deg, transparent 0 calc(10% - 1px),
  #eef0f4 calc(10% - 1px) 10%); }
.bar { position: absolute; top: 3px; height: 16px; min-width: 3px; border-radius: 3px;
  font-size: 11px; line-height: 16px; color: #fff; padding: 0 4px; overflow: hidden;
  white-space: nowrap; text-overflow: clip; text-decoration: none; }
.note { position: absolute; top: 3px; font-size: 11px; line-height: 16px; color: var(--muted);
  white-space: nowrap; text-decoration: none; padding: 0 5px; }
a.note { color: var(--ink); }
.note.error { color: var(--error); font-weight: 600; }
.note.refused { color: #9a6510; font-weight: 600; }
.ticks .track { background: none; height: 18px; }
.tick { position: absolute; top: 0; font-size: 11px; color: var(--muted); white-space: nowrap;
  transform: translateX(-50%); }
.tick.first { transform: none; }
.tick.last { transform: translateX(-100%); }
.bar.wait { background: var(--wait); color: var(--muted); }
.bar.stream { background: var(--stream); }
.bar.call.ok { background: var(--ok); }
.bar.call.error { background: var(--error); }
.bar.call.refused { background: repeating-linear-gradient(135deg, var(--refused) 0 6px,
  #b3740f 6px 12px); }
.bar.call.open { background: var(--open); opacity: .75; }
.bar.call.awaiting { background: var(--refused); opacity: .6; }
.bar.call.ends_run { background: var(--ok); box-shadow: inset -4px 0 0 var(--ink); }
.progress { position: absolute; top: 1px; width: 2px; height: 20px; background: var(--ink); }
.legend { display: flex; flex-wrap: wrap; gap: 14px; margin: 10px 0 0; font-size: 12px;
  color: var(--muted); }
.legend i { display: inline-block; width: 12px; height: 12px; border-radius: 2px;
  vertical-align: -2px; margin-right: 4px; }
.step-card { margin: 10px 0; }
.step-card h3 { margin: 0 0 6px; font-size: 14px; font-family: ui-monospace, "DejaVu Sans Mono",
  monospace; }
.step-card h3 span { font-family: system-ui, "DejaVu Sans", sans-serif; font-weight: 400;
  color: var(--muted); margin-left: 8px; }
pre { margin: 6px 0; padding: 8px 10px; background: #f3f5f9; border-radius: 6px;
  white-space: pre-wrap; word-break: break-word; font: 12px/1.45 ui-monospace,
  "DejaVu Sans Mono", monospace; }
details { margin: 4px 0; border: 1px solid var(--line); border-radius: 6px; padding: 4px 10px; }
details.error { border-color: var(--error); }
details.refused { border-color: var(--refused); }
summary { cursor: pointer; }
.tag { display: inline-block; margin-left: 8px; padding: 0 6px; border-radius: 4px;
  font-size: 11px; font-weight: 600; color: #fff; background: var(--ok); }
.tag.error { background: var(--error); }
.tag.refused { background: var(--refused); }
.tag.open { background: var(--open); }
.tag.awaiting { background: var(--refused); }
.tag.ends_run { background: var(--ink); }
.muted { color: var(--muted); }
"""
"""The page's style: one column, a timeline of bars, cards for the steps."""

_SCRIPT: Final = """
"use strict";
(function () {
  var data = JSON.parse(document.getElementById("run-data").textContent);
  var root = document.getElementById("run");
  root.textContent = "";

  // Every text from the log goes through textContent: shown, never parsed as HTML.
  function el(tag, className, text) {
    var node = document.createElement(tag);
    if (className) { node.className = className; }
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }
  function add(parent, child) { parent.appendChild(child); return child; }
  function fact(parent, name, value) {
    var item = add(parent, el("span", "fact", name + " "));
    add(item, el("b", "", value));
  }
  function bar(track, className, start, end, text) {
    var node = add(track, el(className.indexOf("call") === 0 ? "a" : "div", "bar " + className,
      text));
    var span = data.span > 0 ? data.span : 1;
    node.style.left = (100 * start / span) + "%";
    node.style.width = (100 * Math.max(end - start, 0) / span) + "%";
    return node;
  }
  // A bar's text beside it: after its end, or before its start near the right edge.
  function note(track, className, start, end, text) {
    var node = add(track, el(className.indexOf("call") === 0 ? "a" : "span", "note " + className,
      text));
    var span = data.span > 0 ? data.span : 1;
    if (end / span > 0.72) {
      node.style.right = (100 - 100 * start / span) + "%";
    } else {
      node.style.left = (100 * end / span) + "%";
    }
    return node;
  }
  function row(parent, className, label) {
    var line = add(parent, el("div", "row " + className));
    add(line, el("div", "label", label)).title = label;
    return add(line, el("div", "track"));
  }

  // The run: status, steps, time, usage, error, final text.
  var result = data.result;
  var head = add(root, el("section", "card"));
  add(head, el("h1", "", data.title));
  var facts = add(head, el("p", "facts"));
  add(facts, el("span", "status " + (result ? result.status : "unfinished"),
    result ? result.status : "no run.finished in the log"));
  if (result) { fact(facts, "steps", result.steps); }
  if (data.total !== null) { fact(facts, "time", data.total); }
  if (result && result.usage) {
    var keys = Object.keys(result.usage);
    fact(facts, "usage", keys.length ? keys.map(function (key) {
      return key + " " + result.usage[key];
    }).join(", ") : "unknown");
  }
  if (result && result.error) {
    add(head, el("p", "run-error", result.error.code + ": " + result.error.message));
  }
  if (result && result.awaiting.length) {
    add(head, el("p", "run-awaiting", "awaiting a decision: " + result.awaiting.join(", ")));
  }
  if (result && result.finalText !== null) { add(head, el("p", "final", result.finalText)); }

  if (data.messages.length) {
    add(root, el("h2", "", "Starting messages"));
    var messages = add(root, el("section", "card messages"));
    data.messages.forEach(function (message) {
      var line = add(messages, el("p"));
      add(line, el("span", "role", message.role));
      add(line, el("span", "", message.text));
    });
  }

  // The timeline: per step, its wait and its stream, then a lane per call at once.
  add(root, el("h2", "", "Timeline"));
  var timeline = add(root, el("section", "card timeline"));
  add(timeline, el("p", "axis", data.axis));
  var anchors = {};
  data.steps.forEach(function (step, stepIndex) {
    var track = row(timeline, "step", step.requestId);
    var streams = step.firstChunk !== null;
    bar(track, "wait", step.start, streams ? step.firstChunk : step.end,
      streams ? "" : "no chunk").title = step.requestId + ": waiting for the model";
    if (streams) {
      bar(track, "stream", step.firstChunk, step.lastChunk, "").title =
        step.requestId + ": " + step.label;
    }
    note(track, "step", step.start, streams ? step.lastChunk : step.end, step.label);
    step.lanes.forEach(function (laneLabel, lane) {
      var laneTrack = row(timeline, "lane", laneLabel);
      step.calls.forEach(function (call, callIndex) {
        if (call.lane !== lane) { return; }
        var anchor = "call-" + stepIndex + "-" + callIndex;
        var text = call.name + (call.status === "ok" ? "" : " " + call.status) +
          (call.duration ? " " + call.duration : "");
        [bar(laneTrack, "call " + call.status, call.start, call.end, ""),
         note(laneTrack, "call " + call.status, call.start, call.end, text)].forEach(
          function (node) {
            node.href = "#" + anchor;
            node.title = call.name + " [" + call.id + "] " + call.status;
            node.addEventListener("click", function () { anchors[anchor].open = true; });
          });
        call.progress.forEach(function (progress) {
          var mark = add(laneTrack, el("span", "progress", ""));
          mark.style.left = (100 * progress.at / (data.span > 0 ? data.span : 1)) + "%";
          mark.title = call.name + " [" + call.id + "] progress " + progress.text;
        });
      });
    });
  });
  var ticks = row(timeline, "ticks", "");
  data.ticks.forEach(function (tick, index) {
    var node = add(ticks, el("span", "tick" + (index === 0 ? " first" : "") +
      (index === data.ticks.length - 1 ? " last" : ""), tick.label));
    node.style.left = (100 * tick.at / (data.span > 0 ? data.span : 1)) + "%";
  });
  var legend = add(timeline, el("p", "legend"));
  [["wait", "waiting for the first chunk"], ["stream", "streaming"], ["ok", "tool call"],
   ["error", "tool error"], ["refused", "refused"], ["open", "no result"],
   ["ink", "progress; a call that ended the run"]].forEach(
    function (entry) {
      var item = add(legend, el("span", "", ""));
      add(item, el("i", "bar-key")).style.background = "var(--" + entry[0] + ")";
      add(item, document.createTextNode(entry[1]));
    });

  // A durable run's journal: the decisions it awaits, the answers it holds, its resumes.
  if (data.journal) {
    add(root, el("h2", "", "Durable journal"));
    var journal = add(root, el("section", "card journal"));
    [["awaiting", "awaiting a decision"], ["answers", "answers"],
     ["resumes", "resumes"]].forEach(function (part) {
      var line = add(journal, el("p", part[0]));
      add(line, el("span", "role", part[1]));
      add(line, el("span", "", data.journal[part[0]].length ?
        data.journal[part[0]].join("; ") : "none"));
    });
  }

  // Each step: its thinking and text, and each call's arguments and result on demand.
  add(root, el("h2", "", "Steps"));
  data.steps.forEach(function (step, stepIndex) {
    var card = add(root, el("section", "card step-card"));
    var heading = add(card, el("h3", "", step.requestId));
    add(heading, el("span", "", step.label));
    if (step.thinking) {
      var thinking = add(card, el("details", "thinking"));
      add(thinking, el("summary", "muted", "thinking"));
      add(thinking, el("pre", "", step.thinking));
    }
    if (step.text) { add(card, el("pre", "text", step.text)); }
    step.calls.forEach(function (call, callIndex) {
      var details = add(card, el("details", "call " + call.status));
      details.id = "call-" + stepIndex + "-" + callIndex;
      anchors[details.id] = details;
      var summary = add(details, el("summary", "", call.name + " [" + call.id + "]"));
      add(summary, el("span", "tag " + call.status, call.status));
      if (call.duration) { add(summary, el("span", "muted", " " + call.duration)); }
      add(details, el("div", "muted", "arguments"));
      add(details, el("pre", "arguments", call.arguments));
      if (call.progress.length) {
        add(details, el("div", "muted", "progress"));
        add(details, el("pre", "progress", call.progress.map(function (progress) {
          return progress.text;
        }).join("\\n")));
      }
      add(details, el("div", "muted", "result"));
      add(details, el("pre", "result", call.result === null ? "(none)" : call.result));
    });
  });

  // A link to a call (page.html#call-1-0: the second step's first call) opens it.
  var linked = window.location.hash.slice(1);
  if (Object.prototype.hasOwnProperty.call(anchors, linked)) { anchors[linked].open = true; }
}());
"""
"""The page's script: builds the page from the run's data, with textContent only."""
