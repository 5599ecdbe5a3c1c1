"""Many durable runs as Ray tasks: a run whose worker dies is retried, and the retry resumes.

A recipe for agent_loop_ray.py (examples/ holds what needs a third-party engine; only its
tests import it). It needs Ray and llmock, a mock OpenAI-compatible server (Python >= 3.10):

    pip install . ray llmock==0.2.2
    python examples/ray_durable_runs.py --runs 200 --kill 8

That starts llmock and a local Ray on 127.0.0.1, runs 200 agent runs with tools as Ray
tasks while it SIGKILLs 8 of Ray's worker processes at random, runs the same batch without
faults on a thread pool, and prints figures: runs per second, workers killed, runs
retried, tool calls run again, effects recorded, and how many runs ended as they did
without faults. ``--help`` lists the options.

How it works:

1. One run, one id, one journal. ``agent_loop_ray.run_on_ray(make_run, specs, ...)`` runs
   each spec as a Ray task, which drains ``make_run(spec, signal)``: a
   ``agent_loop_durable.durable_run(journal, ...)`` with the journal at
   ``DIR/journals/<run id>.jsonl``, in a directory that every worker reaches (here a
   local one; on a cluster, a shared filesystem).
2. Ray retries a task whose worker died (``max_retries``). The retry opens the same
   journal, replays what it holds without calling the model or a tool, and goes on from
   the last complete message. A run that ends ``failed`` is a result, not a crash:
   exceptions are not retried.
3. Tools are at-least-once: a call that started and has no result in the journal runs
   again after a crash. So each tool acts through ``agent_loop_ray.Ledger.once()``, which
   keeps one effect per call under ``agent_loop_durable.effect_key()``, linked into place
   once (a link fails where the file exists); an attempt that finds its call's effect
   returns it instead of acting again. This recipe's ``EffectLedger`` also logs what ran where.
4. The model is ``OpenAIChatModel`` against llmock, which answers a request with the
   reply scripted for its model name. Each request is sent as the model
   ``"<run id>/<request id>"``, so the answer is a function of the run and the step, as a
   deterministic model's would be: a step asked again after a crash gets the same answer,
   and a run that survived crashes ends as it would have without them, but for the ids
   the server draws at random (``canonical()`` renames those).

Where Ray is local (``agent_loop_ray.local_ray()``), the workers get this file and the
agent_loop modules through Ray's ``runtime_env`` (``py_modules``), as on a cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import (
    Any,
    Callable,
    Dict,
    Final,
    Generator,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
)

import agent_loop as al
import agent_loop_durable
import agent_loop_providers as providers
import agent_loop_ray
from agent_loop_ray import LOOPBACK

MAX_STEPS: Final = 8
"""Each run's step budget: the scripts take 2 to 4 steps."""
TOOL_SECONDS: Final = 0.02
"""How long a tool works before its effect, by default: a window for a kill mid-call."""
HOLD_SECONDS: Final = 60.0
"""How long a tool waits, at most, while its spec's ``hold`` file exists."""
LLMOCK_START_SECONDS: Final = 30.0
"""How long llmock may take to answer its health check after it was started."""
HTTP_SECONDS: Final = 10.0
"""Bounds each wait on llmock: its admin API, each wait of a model request, its exit."""
RUN_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
"""A run id names its journal file, so it is a plain file name."""
CUSTOMERS: Final = ("ada", "grace", "edsger", "barbara", "donald")
"""Whom the scripted tool calls charge and notify."""

# The ledger's files, in its directory (one directory for every worker, like the journals).
LOG: Final = "log.jsonl"
"""What ran where, one line per record in the order written (by any process): a task
attempt as it starts (``"task started"``, with the size of the journal it found: what it
replays), each tool attempt before the tool acts (``"tool attempt"``), and a task attempt
as it finishes (``"task finished"``)."""
EFFECTS: Final = "effects"
"""The effects, one file per tool call that acted: an ``agent_loop_ray.Ledger``'s directory."""


# --- One run: a Ray task --------------------------------------------------------------


@dataclass(frozen=True)
class RunSpec:
    """What a task needs to run (or resume) one run; plain values, sent to the worker.

    ``base_url`` is llmock's root URL, ``journal_dir`` and ``ledger_dir`` directories that
    every worker reaches. ``hold``, a file that every worker reaches: while it exists, a
    tool that is about to act waits (at most HOLD_SECONDS), so that a worker killed then
    is killed in the middle of a call, whatever the delay (the tests' batch holds its
    tools until its first kill). Raises ValueError for a run id that is not a plain file
    name.
    """

    run_id: str
    base_url: str
    journal_dir: str
    ledger_dir: str
    max_steps: int = MAX_STEPS
    tool_seconds: float = TOOL_SECONDS
    hold: Optional[str] = None

    def __post_init__(self) -> None:
        if not isinstance(self.run_id, str) or not RUN_ID.fullmatch(self.run_id):
            raise ValueError(
                "run_id must be a file name of letters, digits, '.', '_' and '-' "
                f"(at most 100, not starting with a dot or a dash), got {self.run_id!r}"
            )

    @property
    def journal(self) -> str:
        """The run's journal: one per run id."""
        return os.path.join(self.journal_dir, self.run_id + ".jsonl")


def make_run(spec: RunSpec, signal: al.Signal) -> Generator[al.Event, None, al.RunResult]:
    """Runs, or resumes, one durable run: the ``make_run`` of ``agent_loop_ray.run_on_ray``.

    Called again with the same spec after its process died, it replays the journal and
    goes on: this is what Ray retries. Each call logs a task attempt in the ledger, with
    the size of the journal it found, and the run's end.
    """
    ledger = EffectLedger(spec.ledger_dir)
    try:
        found = os.path.getsize(spec.journal)
    except FileNotFoundError:
        found = 0  # the first attempt
    ledger.task_started(spec.run_id, found)
    run = agent_loop_durable.durable_run(
        spec.journal,
        messages=[al.UserMessage("user-001", f"Settle the accounts of {spec.run_id}.")],
        model=RunStepModel(spec.run_id, spec.base_url),
        tools=tools_for(spec.run_id, ledger, spec.tool_seconds, spec.hold),
        max_steps=spec.max_steps,
        signal=signal,
    )
    return _logged(run, ledger, spec.run_id)


def _logged(
    run: Generator[al.Event, None, al.RunResult], ledger: EffectLedger, run_id: str
) -> Generator[al.Event, None, al.RunResult]:
    """The run's events; its end is logged once it has its result."""
    result = yield from run
    ledger.task_finished(run_id, result.status)
    return result


# --- Tools whose effects are idempotent through the call id ---------------------------


class EffectLedger:
    """What the tools did, in a directory that every worker reaches.

    ``effect(...)`` is the tools' one way to act: at most one effect per call id, however
    often the call is attempted. ``LOG`` says what ran where.
    """

    def __init__(self, directory: str) -> None:
        self.directory = Path(directory)

    def task_started(self, run_id: str, journal_bytes: int) -> None:
        """Logs a task attempt's start, with the size of the journal it found: the part
        of the run it replays rather than runs."""
        self._log("task started", run_id, journal_bytes=journal_bytes)

    def task_finished(self, run_id: str, status: str) -> None:
        self._log("task finished", run_id, status=status)

    def effect(
        self,
        run_id: str,
        tool: str,
        arguments: Mapping[str, al.JSON],
        result: al.JSON,
        seconds: float,
        hold: Optional[str] = None,
    ) -> Any:
        """Acts once for the tool call being executed; returns the result recorded for it.

        The first attempt works for ``seconds`` (first waiting, at most HOLD_SECONDS,
        while the file ``hold`` exists), then records ``result`` (the effect) through
        ``agent_loop_ray.Ledger.once``; an attempt that finds its call's effect recorded
        returns that instead of acting again. Raises RuntimeError outside a tool call of a
        durable run.
        """
        call = al.current_tool_call()
        if call is None:
            raise RuntimeError(f"{tool} acts only inside a tool call: current_tool_call() is None")
        self._log("tool attempt", run_id, call=call.id, tool=tool)

        def act() -> al.JSON:
            if hold is not None:
                deadline = time.monotonic() + HOLD_SECONDS
                while os.path.exists(hold) and time.monotonic() < deadline:
                    time.sleep(0.005)
            time.sleep(seconds)  # the work, before the effect: a kill here loses nothing
            return result

        record: Dict[str, al.JSON] = {"arguments": dict(arguments)}
        return self.effects_ledger.once(act, run=run_id, call=call.id, tool=tool, **record)

    @property
    def effects_ledger(self) -> agent_loop_ray.Ledger:
        """The effects, one per tool call that acted."""
        return agent_loop_ray.Ledger(self.directory / EFFECTS)

    def effects(self) -> List[Dict[str, Any]]:
        """Every effect recorded, one per tool call that acted."""
        return self.effects_ledger.effects()

    def records(self, event: str) -> List[Dict[str, Any]]:
        """The log's records of one kind (``"task started"``, ``"tool attempt"``, ``"task
        finished"``), or all of them (``""``), in the order written."""
        records = JsonLinesTail(self.directory / LOG).read()
        return [record for record in records if event in ("", record["event"])]

    def figures(self) -> Dict[str, int]:
        """Counts from the ledger: task attempts, runs retried, tool attempts and calls."""
        started: Dict[str, int] = {}
        for record in self.records("task started"):
            started[record["run"]] = started.get(record["run"], 0) + 1
        attempts: Dict[Tuple[str, str], int] = {}
        for record in self.records("tool attempt"):
            key = (record["run"], record["call"])
            attempts[key] = attempts.get(key, 0) + 1
        return {
            "task attempts": sum(started.values()),
            "runs retried": sum(count > 1 for count in started.values()),
            "tool attempts": sum(attempts.values()),
            "tool calls": len(attempts),
            "calls run again": sum(count > 1 for count in attempts.values()),
            "effects": len(self.effects()),
        }

    def _log(self, event: str, run_id: str, **fields: Any) -> None:
        """Appends one record to the log: one write() with O_APPEND, so that the lines of
        several processes neither mix nor reorder."""
        self.directory.mkdir(parents=True, exist_ok=True)
        record = {"event": event, "run": run_id, "pid": os.getpid(), **fields}
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode("utf-8")
        descriptor = os.open(self.directory / LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, line)
        finally:
            os.close(descriptor)


def tools_for(
    run_id: str, ledger: EffectLedger, seconds: float = TOOL_SECONDS, hold: Optional[str] = None
) -> al.ToolRegistry:
    """The run's tools: each acts once per call id, through the ledger (``hold``: see
    RunSpec)."""

    def charge(customer: str, cents: int) -> Any:
        """Charges a customer's card, once per tool call."""
        arguments: Dict[str, al.JSON] = {"customer": customer, "cents": cents}
        result: Dict[str, al.JSON] = {"customer": customer, "charged": cents}
        return ledger.effect(run_id, "charge", arguments, result, seconds, hold)

    def notify(customer: str, text: str) -> Any:
        """Sends a customer a message, once per tool call."""
        arguments: Dict[str, al.JSON] = {"customer": customer, "text": text}
        return ledger.effect(run_id, "notify", arguments, "sent", seconds, hold)

    return al.ToolRegistry([al.Tool.from_function(charge), al.Tool.from_function(notify)])


# --- The model: OpenAIChatModel against llmock, scripted per run and step -------------


class RunStepModel:
    """``OpenAIChatModel`` against llmock, asked as the model ``"<run id>/<request id>"``.

    llmock answers with the reply scripted for that name (``llmock_script``), so a step
    that is requested again after a crash gets the same answer.
    """

    def __init__(self, run_id: str, base_url: str) -> None:
        self.run_id = run_id
        self.base_url = base_url

    def stream(
        self, request: al.ModelRequest, signal: al.Signal
    ) -> Generator[al.ModelChunk, None, al.ModelResponse]:
        model = providers.OpenAIChatModel(
            f"{self.run_id}/{request.id}",
            base_url=self.base_url + "/v1",
            api_key="",  # llmock wants none: a real key in the environment is not sent
            timeout=HTTP_SECONDS,
        )
        return model.stream(request, signal)


def llmock_script(run_id: str, seed: int) -> List[Dict[str, Any]]:
    """llmock's replies to one run, one per step: 1 to 3 steps of 1 or 2 tool calls, then
    text. The same run id and seed give the same script."""
    rng = random.Random(f"{seed}/{run_id}")
    tool_steps = rng.randint(1, 3)
    replies: List[Dict[str, Any]] = []
    for step in range(1, tool_steps + 1):
        calls = []
        for _ in range(rng.randint(1, 2)):
            customer = rng.choice(CUSTOMERS)
            if rng.random() < 0.5:
                arguments: Dict[str, Any] = {"customer": customer, "cents": rng.randint(1, 9999)}
                calls.append({"name": "charge", "arguments": arguments})
            else:
                arguments = {"customer": customer, "text": f"Step {step} of {run_id}."}
                calls.append({"name": "notify", "arguments": arguments})
        replies.append({"tool_calls": calls})
    replies.append({"text": f"{run_id}: settled in {tool_steps} steps."})
    return [
        {
            "type": "reply",
            **reply,
            "times": None,  # permanent: a step asked again gets the same reply
            "match": {"model": f"{run_id}/request-{step:03d}"},
        }
        for step, reply in enumerate(replies, start=1)
    ]


def script_llmock(base_url: str, run_ids: Sequence[str], seed: int) -> None:
    """Queues every run's replies on the llmock server at base_url (its admin API)."""
    behaviors = [reply for run_id in run_ids for reply in llmock_script(run_id, seed)]
    body = json.dumps({"behaviors": behaviors}).encode("utf-8")
    request = urllib.request.Request(base_url + "/_llmock/scenario", data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=HTTP_SECONDS) as answer:
        answer.read()


@contextlib.contextmanager
def llmock_server() -> Iterator[str]:
    """Starts ``llmock serve`` on 127.0.0.1 and a free port; yields its URL; stops it.

    Raises RuntimeError if it does not answer within LLMOCK_START_SECONDS.
    """
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        port = probe.getsockname()[1]
    url = f"http://{LOOPBACK}:{port}"
    command = [sys.executable, "-m", "llmock.cli", "serve", "--host", LOOPBACK]
    process = subprocess.Popen(
        [*command, "--port", str(port), "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + LLMOCK_START_SECONDS
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=1.0):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"llmock serve did not start on {url}") from None
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(HTTP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(HTTP_SECONDS)


# --- Many runs: on Ray, or on a thread pool -------------------------------------------


@contextlib.contextmanager
def recipe_ray(workers: int) -> Iterator[None]:
    """``agent_loop_ray.local_ray(workers)``, sending the workers this file too."""
    with agent_loop_ray.local_ray(workers, modules=[sys.modules[__name__]]):
        yield


def run_specs_on_ray(specs: Sequence[RunSpec], *, max_retries: int) -> List[Dict[str, Any]]:
    """Runs every spec as a Ray task, retried up to max_retries times when its worker
    dies; returns their results' dicts in the order of specs. Ray must be initialised."""
    results = agent_loop_ray.run_on_ray(make_run, specs, max_retries=max_retries)
    return [result.to_dict() for result in results]


def run_on_threads(specs: Sequence[RunSpec], *, workers: int) -> List[Dict[str, Any]]:
    """Runs every spec on a thread pool of that many threads, as a Ray task would
    (``agent_loop_ray.settle_item``); returns their results' dicts."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        finished = pool.map(functools.partial(agent_loop_ray.settle_item, make_run), specs)
        return [event["payload"]["result"] for event in finished]


def batch(
    count: int,
    base_url: str,
    directory: str,
    tool_seconds: float = TOOL_SECONDS,
    hold: Optional[str] = None,
) -> List[RunSpec]:
    """Specs for runs run-0001..., with their journals in directory/journals and their
    effects ledger in directory/ledger (``hold``: see RunSpec)."""
    journal_dir = os.path.join(directory, "journals")
    ledger_dir = os.path.join(directory, "ledger")
    os.makedirs(journal_dir, exist_ok=True)
    return [
        RunSpec(
            f"run-{number:04d}",
            base_url,
            journal_dir,
            ledger_dir,
            tool_seconds=tool_seconds,
            hold=hold,
        )
        for number in range(1, count + 1)
    ]


def canonical(result: Mapping[str, Any]) -> Dict[str, Any]:
    """A result's dict with each id replaced by its order of first appearance.

    Response ids (the provider's own too) and tool call ids are drawn at random by the
    server, so two runs that went the same way differ only there; the links (call and
    result, message and response) are kept.
    """
    names: Dict[str, str] = {}

    def rename(value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            return {name: rename(item, name) for name, item in value.items()}
        if isinstance(value, list):
            return [rename(item) for item in value]
        if key in ("id", "toolCallId", "providerResponseId") and isinstance(value, str):
            return names.setdefault(value, f"id-{len(names) + 1}")
        return value

    renamed: Dict[str, Any] = rename(dict(result))
    return renamed


# --- Killing workers at random --------------------------------------------------------


class JsonLinesTail:
    """The complete lines of an append-only JSON lines file, read as it grows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read(self) -> List[Dict[str, Any]]:
        """The lines completed since the last read (a torn last line waits)."""
        try:
            with open(self.path, "rb") as file:
                file.seek(self.offset)
                data = file.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        return [json.loads(line) for line in data[:end].splitlines()]


class WorkerKiller:
    """Kills Ray worker processes with SIGKILL while a batch runs, at random (seeded).

    ``kills`` at most, spread over the batch: kill number i waits until i * runs / kills
    runs have finished, then for the next tool call to start, and kills its worker a
    random delay of 0 to ``delay`` seconds later: before the tool acted, after it acted
    but before the result reached the journal, or later still (streaming the next step).
    A tool call of a worker it killed already (logged before it died) is not waited for.
    Only a process whose command line is a Ray worker's (``ray::``) is killed; ``killed``
    lists their pids. Local Ray only (Linux: it reads /proc).
    """

    def __init__(
        self,
        ledger: EffectLedger,
        *,
        kills: int,
        runs: int,
        seed: int,
        delay: float = 2 * TOOL_SECONDS,
    ) -> None:
        self.kills = kills
        self.runs = runs
        self.delay = delay
        self.rng = random.Random(seed)
        self.killed: List[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._kill, name="worker killer", daemon=True)
        self._log = JsonLinesTail(ledger.directory / LOG)
        self._finished = 0
        self._fresh: List[Dict[str, Any]] = []

    def __enter__(self) -> WorkerKiller:
        self._thread.start()
        return self

    def __exit__(self, *exception: object) -> None:
        self._stop.set()
        # Bounded: each of its waits is a _stop.wait() (its reads of the log and its kill
        # do not block), so it returns once _stop is set.
        self._thread.join()

    def _kill(self) -> None:
        for number in range(self.kills):
            if not self._wait(functools.partial(self._ready, number)):
                return
            pid = self._fresh[0]["pid"]
            self._stop.wait(self.rng.uniform(0.0, self.delay))
            self._send(pid)

    def _wait(self, ready: Callable[[], bool]) -> bool:
        """Waits until ready() is true (True) or the killer is stopped (False)."""
        while not ready():
            if self._stop.wait(0.002):
                return False
        return True

    def _ready(self, number: int) -> bool:
        """Kill number's moment: number * runs / kills runs have finished, and since then a
        tool call has started in a worker not killed yet (it is in ``_fresh``)."""
        records = self._log.read()
        self._finished += sum(record["event"] == "task finished" for record in records)
        self._fresh = [
            record
            for record in records
            if record["event"] == "tool attempt" and record["pid"] not in self.killed
        ]
        return self._finished * self.kills >= number * self.runs and bool(self._fresh)

    def _send(self, pid: int) -> None:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                if not file.read().startswith(b"ray::"):
                    return
            os.kill(pid, signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError):
            return  # gone already
        self.killed.append(pid)


# --- The command line -----------------------------------------------------------------


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs a batch of durable runs on a local Ray and prints its figures; returns 0."""
    parser = argparse.ArgumentParser(
        prog="ray_durable_runs.py",
        description="Many durable agent runs as Ray tasks against llmock, workers killed at will.",
    )
    parser.add_argument("--runs", type=int, default=50, help="runs in the batch (default 50)")
    parser.add_argument(
        "--workers", type=int, default=2, help="runs at once: Ray's CPUs (default 2)"
    )
    parser.add_argument(
        "--dir",
        help="a directory that every worker reaches, for the journals (DIR/journals, one per "
        "run id) and the effects ledger (DIR/ledger); default: a new temporary one",
    )
    parser.add_argument(
        "--llmock-url", help="an llmock server's root URL (default: start one on 127.0.0.1)"
    )
    parser.add_argument(
        "--kill",
        type=int,
        default=0,
        help="SIGKILL this many Ray workers during the batch, and compare with a run of "
        "the same batch without faults on a thread pool (default 0)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the scripts and kills")
    parser.add_argument(
        "--tool-seconds",
        type=float,
        default=TOOL_SECONDS,
        help=f"how long each tool works (default {TOOL_SECONDS})",
    )
    options = parser.parse_args(argv)
    if options.runs < 1 or options.workers < 1 or options.kill < 0 or options.tool_seconds < 0:
        parser.error(
            "--runs and --workers must be at least 1, --kill and --tool-seconds at least 0"
        )
    directory = options.dir or tempfile.mkdtemp(prefix="ray-durable-runs-")
    with contextlib.ExitStack() as stack:
        url = options.llmock_url or stack.enter_context(llmock_server())
        specs = batch(options.runs, url, directory, options.tool_seconds)
        script_llmock(url, [spec.run_id for spec in specs], options.seed)
        reference: List[Dict[str, Any]] = []
        if options.kill:
            reference_dir = stack.enter_context(tempfile.TemporaryDirectory())
            reference_specs = batch(options.runs, url, reference_dir, options.tool_seconds)
            reference = run_on_threads(reference_specs, workers=options.workers)
        ledger = EffectLedger(specs[0].ledger_dir)
        with recipe_ray(options.workers):
            killer = WorkerKiller(
                ledger,
                kills=options.kill,
                runs=options.runs,
                seed=options.seed,
                delay=2 * options.tool_seconds,
            )
            started = time.monotonic()
            with killer:
                results = run_specs_on_ray(specs, max_retries=options.kill + 3)
            seconds = time.monotonic() - started
    print(report(results, ledger, seconds, options.workers, killer.killed, reference))
    print(f"journals: {specs[0].journal_dir}")
    return 0


def report(
    results: Sequence[Mapping[str, Any]],
    ledger: EffectLedger,
    seconds: float,
    workers: int,
    killed: Sequence[int],
    reference: Sequence[Mapping[str, Any]],
) -> str:
    """The figures of a batch, as main prints them."""
    figures = ledger.figures()
    statuses: Dict[str, int] = {}
    for result in results:
        statuses[result["status"]] = statuses.get(result["status"], 0) + 1
    lines = [
        f"runs: {len(results)} on Ray ({workers} workers), "
        + ", ".join(f"{count} {status}" for status, count in sorted(statuses.items())),
        f"time: {seconds:.1f} s, {len(results) / seconds:.1f} runs/s",
        f"workers killed: {len(killed)}; task attempts: {figures['task attempts']} "
        f"({figures['runs retried']} runs retried)",
        f"tool calls: {figures['tool calls']}, attempts: {figures['tool attempts']} "
        f"({figures['calls run again']} calls run again after a crash), "
        f"effects recorded: {figures['effects']}",
    ]
    if reference:
        same = sum(
            canonical(result) == canonical(expected)
            for result, expected in zip(results, reference)
        )
        lines.append(f"same result as without faults (on threads): {same} of {len(results)}")
    return "\n".join(lines)


if __name__ == "__main__":
    # As a script this file is __main__, whose functions Ray would send by value, without
    # the names their annotations need: run it as the module that workers import.
    import ray_durable_runs

    sys.exit(ray_durable_runs.main())
