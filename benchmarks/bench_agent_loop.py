"""Timing of agent_loop on the workloads that pi/bench_pi.mjs times for Pi, with a scripted model.

Run from the repository root (standard library only; it imports the local
``agent_loop.py``)::

    python benchmarks/bench_agent_loop.py                  # the full run, about a minute
    python benchmarks/bench_agent_loop.py --quick          # 20 warm-up + 100 runs each
    python benchmarks/bench_agent_loop.py --pi pi.jsonl    # also compare with Pi
    AGENT_LOOP_DIR=/tmp/before python benchmarks/bench_agent_loop.py   # another copy

``--pi`` takes the JSON lines that ``node bench_pi.mjs`` prints (benchmarks/pi);
other lines in the file are ignored, and a workload measured several times counts
with the median of its medians.

Workloads (a scripted model and one ``echo`` tool, which returns its ``text``):

- W1 tool-heavy: one user message; steps 1-63 each return 3 echo calls, step 64
  returns text (max_steps=64). Compared with Pi's W1.
- W2 streaming: one step streaming 1,024 text deltas of 64 characters (exactly
  the text limit), then stop. Compared with Pi's W2.
- W3 long transcript: 4,000 starting messages (alternating user and assistant
  text) and a user prompt, 8 steps with one echo call each, then text. Compared
  with Pi's W3p, which also emits an event per starting message.
- W4 scaling: the W3 shape at 10, 100, 1,000 and 4,000 starting messages. One
  tool step costs the time from the ``tool.finished`` event of step 1 to that of
  step 8, divided by 7, as the consumer sees it. That leaves out the one-time
  cost of the start: validating it, emitting it, and the cache misses that this
  leaves to step 1. (A 9-step run minus a 1-step run, divided by 8, measures the
  same, but a 4,000-message run lasts ~5-8 ms and its jitter swamps 8 steps.)

Method, as in bench_pi.mjs: one untimed run whose outcome is checked (the script
exits with status 1 if it is wrong, so a broken run is never measured), warm-up
runs, then timed runs. One timed run builds a fresh ScriptedModel (the scripted
responses are built once and reused, like Pi's steps), calls run_agent_loop,
drains every event and takes the result. The figure is the median, read as
``sorted[int(p / 100 * (n - 1) + 0.5)]`` like bench_pi.mjs. The garbage collector
stays on, as Node's does. The targets are printed, never asserted: a timing is
not a test.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import platform
import reprlib
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

# Import the agent_loop.py of this checkout, not an installed copy; AGENT_LOOP_DIR names
# another folder holding one, to time an earlier version in the same session.
sys.path.insert(0, os.environ.get("AGENT_LOOP_DIR") or str(Path(__file__).resolve().parent.parent))

import agent_loop as al

PI_VERSION = "0.85.0"
PI_WORKLOADS = {
    "W1": "W1_tool_heavy",
    "W2": "W2_streaming",
    "W3": "W3p_long_transcript_as_prompts",
}
"""Which of bench_pi.mjs's workloads each of ours is compared with."""
PI_TARGET = 2.0
"""W1-W3 may take at most twice as long as Pi's."""
SCALING_TARGET = 1.3
"""A tool step at 4,000 messages may cost at most 1.3x a tool step at 10."""
SCALING_LENGTHS = (10, 100, 1000, 4000)
SCALING_ROUNDS = 20
"""W4 times each length in this many blocks, taking turns with the other lengths."""
HISTORY_LENGTH = 4000


# --- Workloads ----------------------------------------------------------------------

ScriptedStep = Any
"""What al.scripted_response() returns: al.ScriptedResponse since 1.4, named loosely so
that the script also times 1.3 (AGENT_LOOP_DIR)."""


def echo(arguments: dict[str, Any], signal: object) -> object:
    """The echo tool: returns its ``text`` argument."""
    return arguments["text"]


ECHO_SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "required": ["text"],
}
TOOLS = al.ToolRegistry([al.Tool("echo", "Returns its text.", ECHO_SCHEMA, echo)])


def echo_step(step: int, calls: int) -> ScriptedStep:
    """A scripted step that calls echo ``calls`` times, with Pi's ids and values."""
    return al.scripted_response(
        f"response-{step:03d}",
        [
            al.ToolCall(f"call-{step}-{i}", "echo", {"text": f"step {step} call {i}"})
            for i in range(calls)
        ],
        "toolCall",
    )


def text_step(step: int, chunks: Sequence[str]) -> ScriptedStep:
    """A scripted step that streams ``chunks`` as text deltas and stops."""
    return al.scripted_response(
        f"response-{step:03d}",
        [al.TextBlock("".join(chunks))],
        "stop",
        chunks=[al.TextBlock(chunk) for chunk in chunks],
    )


def history(length: int) -> list[al.Message]:
    """Pi's W3 history: user and assistant text, alternating, starting with a user."""
    return [
        al.UserMessage(f"history-{i}", f"user message {i}")
        if i % 2 == 0
        else al.AssistantMessage(f"history-{i}", (al.TextBlock(f"assistant message {i}"),))
        for i in range(length)
    ]


@dataclass(frozen=True)
class Workload:
    """One workload: what a run starts with, and the outcome its check expects."""

    name: str
    messages: tuple[al.Message, ...]
    model: Callable[[], al.ScriptedModel]
    max_steps: int
    steps: int
    events: int
    tool_outputs: tuple[str, ...]
    final_text: str

    def run(self) -> tuple[int, al.RunResult]:
        """One run: a fresh model, every event drained; returns the event count and result."""
        run = al.run_agent_loop(
            messages=self.messages, model=self.model(), tools=TOOLS, max_steps=self.max_steps
        )
        events = 0
        try:
            while True:
                next(run)
                events += 1
        except StopIteration as done:
            return events, done.value

    def problems(self) -> list[str]:
        """Runs once, untimed; returns how the outcome differs from the expected one."""
        events, result = self.run()
        added = self.steps + len(self.tool_outputs)
        results = [m for m in result.messages if isinstance(m, al.ToolResultMessage)]
        expected = {
            "status": (result.status, "completed"),
            "steps": (result.steps, self.steps),
            "events": (events, self.events),
            "messages": (len(result.messages), len(self.messages) + added),
            "final text": (result.final_text, self.final_text),
            "tool outputs": (tuple(m.content for m in results), self.tool_outputs),
            "tool errors": (sum(m.is_error for m in results), 0),
        }
        return [
            f"{self.name}: {what} is {reprlib.repr(actual)}, expected {reprlib.repr(wanted)}"
            for what, (actual, wanted) in expected.items()
            if actual != wanted
        ]


def tool_workload(name: str, messages: Sequence[al.Message], calls: Sequence[int]) -> Workload:
    """Steps that call echo ``calls[i]`` times each, then a step that says "done"."""
    responses = [echo_step(step, count) for step, count in enumerate(calls, 1)]
    responses.append(text_step(len(calls) + 1, ["done"]))
    outputs = tuple(
        f"step {step} call {i}" for step, count in enumerate(calls, 1) for i in range(count)
    )
    tool_events = 3 * len(outputs)  # per call: model.chunk, tool.started, tool.finished
    return Workload(
        name=name,
        messages=tuple(messages),
        model=functools.partial(al.ScriptedModel, tuple(responses)),
        max_steps=len(responses),
        steps=len(responses),
        # message.accepted per message, tool steps, one chunk of "done", run.finished
        events=len(messages) + tool_events + 1 + 1,
        tool_outputs=outputs,
        final_text="done",
    )


def streaming_workload() -> Workload:
    """W2: exactly the seed's limits for one step, 1,024 chunks and 65,536 code points."""
    chunks = [str(i % 10) * 64 for i in range(1024)]
    return Workload(
        name="W2 streaming",
        messages=(al.UserMessage("prompt", "Stream a long answer."),),
        model=functools.partial(al.ScriptedModel, (text_step(1, chunks),)),
        max_steps=1,
        steps=1,
        events=1 + len(chunks) + 1,
        tool_outputs=(),
        final_text="".join(chunks),
    )


def long_transcript(name: str, length: int, tool_steps: int) -> Workload:
    """The W3 shape: ``length`` history messages and a prompt, then one echo per step."""
    prompt = al.UserMessage("prompt", "Echo one value per step.")
    return tool_workload(name, [*history(length), prompt], [1] * tool_steps)


# --- Measuring ----------------------------------------------------------------------


def percentile(samples: Sequence[float], p: float) -> float:
    """bench_pi.mjs's percentile: no interpolation, halves rounded up."""
    ordered = sorted(samples)
    return ordered[int(p / 100 * (len(ordered) - 1) + 0.5)]


def timed(run: Callable[[], object]) -> float:
    """Seconds that one call of ``run`` takes."""
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def samples(runs: Sequence[Callable[[], object]], warmup: int, count: int) -> list[list[float]]:
    """Seconds per call of each of ``runs``, after ``warmup`` untimed calls of each.

    The runs take turns, so that a slow spell of the machine hits all of them alike.
    """
    for _ in range(warmup):
        for run in runs:
            run()
    taken: list[list[float]] = [[] for _ in runs]
    for _ in range(count):
        for run, seconds in zip(runs, taken):
            seconds.append(timed(run))
    return taken


def median_seconds(runs: Sequence[Callable[[], object]], warmup: int, count: int) -> list[float]:
    """The median of ``samples()`` for each of ``runs``."""
    return [percentile(seconds, 50) for seconds in samples(runs, warmup, count)]


def pi_medians(path: str | None) -> dict[str, tuple[float, int, int]]:
    """Pi's median µs, events per run and number of measurements, by bench_pi.mjs label."""
    if path is None:
        return {}
    found: dict[str, list[dict[str, Any]]] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            found.setdefault(record["workload"], []).append(record)
    return {
        label: (
            statistics.median(record["median_us"] for record in records),
            records[0]["events_per_run"],
            len(records),
        )
        for label, records in found.items()
    }


def source_digest() -> str:
    """The start of the SHA-256 of the agent_loop.py measured, to tell versions apart."""
    return hashlib.sha256(Path(al.__file__).read_bytes()).hexdigest()[:12]


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


# --- The report ---------------------------------------------------------------------


def verdict(ratio: float, target: float) -> str:
    return f"target <= {target:g}x: {'met' if ratio <= target else 'NOT MET'}"


def report_workload(
    workload: Workload, key: str, warmup: int, runs: int, pi: dict[str, tuple[float, int, int]]
) -> None:
    """One line: our median per run and per event, and Pi's figure when it was given."""
    [median] = median_seconds([workload.run], warmup, runs)
    line = (
        f"{workload.name:<19} {median * 1e6:8.1f} us/run {median * 1e9 / workload.events:6.0f}"
        f" ns/event {workload.events:5d} events ({runs} runs)"
    )
    label = PI_WORKLOADS[key]
    if label in pi:
        pi_us, pi_events, measured = pi[label]
        ratio = median * 1e6 / pi_us
        line += (
            f" | Pi {PI_VERSION} {label.split('_')[0]} {pi_us:.1f} us/run, {pi_events} events"
            f" (median of {measured}): {ratio:.2f}x, {verdict(ratio, PI_TARGET)}"
        )
    print(line, flush=True)


def seconds_per_tool_step(workload: Workload) -> float:
    """One run of the W3 shape; returns the seconds per tool step between the end of
    the first tool step and the end of the last, as the run's consumer sees them."""
    tool_steps = len(workload.tool_outputs)  # one echo call per step
    model = workload.model()
    run = al.run_agent_loop(
        messages=workload.messages, model=model, tools=TOOLS, max_steps=workload.max_steps
    )
    finished = 0
    start = end = 0.0
    for event in run:
        if event.type == "tool.finished":
            # A ScriptedModel keeps every request; a real model lets each go when its step
            # ends, and so the cost of freeing a request's snapshot falls within the steps.
            model.requests.clear()
            finished += 1
            if finished == 1:
                start = time.perf_counter()
            elif finished == tool_steps:
                end = time.perf_counter()
    return (end - start) / (tool_steps - 1)


def report_scaling(scaling: Sequence[Workload], warmup: int, runs: int) -> None:
    """W4: the median cost of one tool step at each length, and the ratio 4000 / 10."""
    # Each length is timed in a block of its own (runs of one length in turn with the
    # other would each start with the caches of the other), and the blocks go round
    # SCALING_ROUNDS times, so that a slow spell of the machine hits every length.
    taken: list[list[float]] = [[] for _ in scaling]
    for _ in range(SCALING_ROUNDS):
        for seconds, workload in zip(taken, scaling):
            for _ in range(warmup // SCALING_ROUNDS):
                seconds_per_tool_step(workload)
            seconds += [seconds_per_tool_step(workload) for _ in range(runs // SCALING_ROUNDS)]
    step_costs = [percentile(seconds, 50) for seconds in taken]
    for length, cost in zip(SCALING_LENGTHS, step_costs):
        print(f"W4 {length:4d} messages: one tool step {cost * 1e6:6.1f} us")
    ratio = step_costs[-1] / step_costs[0]
    print(
        f"W4 tool step at {SCALING_LENGTHS[-1]} / at {SCALING_LENGTHS[0]} messages: "
        f"{ratio:.2f}x, {verdict(ratio, SCALING_TARGET)}",
        flush=True,
    )


def report_validation(warmup: int, runs: int) -> None:
    """The start is validated when run_agent_loop() is called: times that call alone."""
    starts = [long_transcript("start", n, 0) for n in (1000, HISTORY_LENGTH)]
    calls = [
        functools.partial(
            al.run_agent_loop, messages=w.messages, model=w.model(), tools=TOOLS, max_steps=1
        )
        for w in starts
    ]
    medians = median_seconds(calls, warmup, runs)
    per_message = [seconds / len(w.messages) for seconds, w in zip(medians, starts)]
    print(
        "start validation (the run_agent_loop() call): "
        + ", ".join(
            f"{len(w.messages)} messages {seconds * 1e6:.1f} us ({cost * 1e9:.0f} ns/message)"
            for w, seconds, cost in zip(starts, medians, per_message)
        )
        + f"; ns/message ratio {per_message[1] / per_message[0]:.2f} (1.00 is linear)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/bench_agent_loop.py",
        description="Times agent_loop on bench_pi.mjs's workloads (W1-W3) and its scaling (W4).",
    )
    parser.add_argument(
        "--quick", action="store_true", help="20 warm-up and 100 timed runs per workload"
    )
    parser.add_argument(
        "--pi", metavar="FILE", help="JSON lines printed by bench_pi.mjs, to compare with Pi"
    )
    parser.add_argument(
        "--only",
        default="W1,W2,W3,W4",
        metavar="LIST",
        help="workloads to run, comma-separated (default: W1,W2,W3,W4; W4 includes validation)",
    )
    options = parser.parse_args(argv)
    only = set(options.only.split(","))
    if not only <= {"W1", "W2", "W3", "W4"}:
        parser.error(f"--only takes W1, W2, W3 and W4, got {options.only}")

    def counts(warmup: int, runs: int) -> tuple[int, int]:
        return (20, 100) if options.quick else (warmup, runs)

    prompt = al.UserMessage("prompt", "Echo three values per step.")
    plans = {
        "W1": (tool_workload("W1 tool-heavy", [prompt], [3] * 63), counts(200, 1000)),
        "W2": (streaming_workload(), counts(300, 2000)),
        "W3": (long_transcript("W3 long transcript", HISTORY_LENGTH, 8), counts(200, 1000)),
    }
    scaling = [long_transcript(f"W4 {n} messages", n, 8) for n in SCALING_LENGTHS]
    checked = [workload for key, (workload, _) in plans.items() if key in only]
    if "W4" in only:
        checked += scaling
    problems = [problem for workload in checked for problem in workload.problems()]
    if problems:
        print("wrong outcome, nothing measured:", *problems, sep="\n  ", file=sys.stderr)
        return 1

    print(
        f"agent_loop {al.__version__} ({al.__file__}, sha256 {source_digest()}): "
        f"{platform.python_implementation()} "
        f"{platform.python_version()} on {platform.platform()}, "
        f"{os.cpu_count()} CPUs ({cpu_name()})"
    )
    print("median of the timed runs after warm-up; the garbage collector is on")
    pi = pi_medians(options.pi)
    for key, (workload, (warmup, runs)) in plans.items():
        if key in only:
            report_workload(workload, key, warmup, runs, pi)
    if "W4" in only:
        report_scaling(scaling, *counts(200, 1000))
        report_validation(*counts(200, 1000))
    return 0


if __name__ == "__main__":
    sys.exit(main())
