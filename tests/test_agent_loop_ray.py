"""Tests of agent_loop_ray.py and of its recipe, examples/ray_durable_runs.py: many
durable runs on a local Ray, workers killed.

Run by ``tox -e ray``: they skip where Ray or llmock is not importable, unless
``AGENT_LOOP_REQUIRE_RAY=1`` (set by tox's ray env) turns the skip into a failure. The
recipe and its benchmark are imported from examples/.

The batch (``batch`` fixture, once for the module): 200 runs with tools against one llmock
server, first on a thread pool without faults (the reference), then as Ray tasks while
8 Ray workers are killed with SIGKILL (seeded), then the same journals once more. The
tests read what it left: results, journals, the effects ledger, the kills, the processes
and their listening sockets. Ray and llmock listen on 127.0.0.1 only; each is stopped
whatever happens, and the batch records every process it saw so that a test can check
that none is left.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Sequence, Set, Tuple

import pytest

import agent_loop as al
import agent_loop_durable

_REQUIRED = os.environ.get("AGENT_LOOP_REQUIRE_RAY") == "1"
_MISSING = [name for name in ("ray", "llmock") if importlib.util.find_spec(name) is None]
if _MISSING:
    if _REQUIRED:
        pytest.fail(f"AGENT_LOOP_REQUIRE_RAY=1 but {_MISSING} not importable", pytrace=False)
    pytest.skip(
        f"{' and '.join(_MISSING)} not installed: run `tox -e ray`", allow_module_level=True
    )

REPOSITORY = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPOSITORY / "examples"))  # the recipe and its benchmark

import ray_durable_runs as recipe  # noqa: E402

import agent_loop_ray  # noqa: E402 (after the skip: it needs Ray when used)

RUNS = 200
KILLS = 8
SEED = 25
WORKERS = 2
THREADS = 8
REPLAYED = 20
"""Runs of the batch sent to Ray once more, after it finished: they replay their journals."""
GONE_SECONDS = 30.0
"""How long the processes may take to exit after Ray and llmock were stopped."""


# --- Processes, read from /proc -------------------------------------------------------

Process = Tuple[int, int]
"""A pid and its start time (clock ticks after boot): a pid reused later is another."""


def _stat(pid: int) -> Tuple[int, int, str]:
    """The parent pid, start time and state of a process (raises OSError when gone)."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as file:
        fields = file.read().rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[19]), fields[0]


def descendants(root: int) -> Set[Process]:
    """Every process below root, now."""
    children: Dict[int, List[Process]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                parent, started, _ = _stat(int(entry))
                children.setdefault(parent, []).append((int(entry), started))
    found: Set[Process] = set()
    todo = [root]
    while todo:
        for process in children.get(todo.pop(), []):
            found.add(process)
            todo.append(process[0])
    return found


def alive(process: Process) -> bool:
    """True while the process runs (a zombie has ended)."""
    try:
        _, started, state = _stat(process[0])
    except OSError:
        return False
    return started == process[1] and state != "Z"


def started_by(pid: int, ray_dir: str) -> bool:
    """Whether a process has this module's Ray directory in its environment (RAY_TMPDIR,
    which Ray's processes inherit): a pid reused since by another process has not."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as file:
            return f"RAY_TMPDIR={ray_dir}".encode() in file.read().split(b"\0")
    except OSError:
        return False


def command_line(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as file:
        return file.read().replace(b"\0", b" ").decode("utf-8", "replace")


def command_line_or_gone(pid: int) -> str:
    try:
        return command_line(pid)
    except OSError:
        return "(gone)"


def listening_addresses(pids: Sequence[int]) -> List[str]:
    """The addresses on which these processes listen for TCP connections."""
    inodes: Set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for descriptor in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{descriptor}")
                    if target.startswith("socket:["):
                        inodes.add(target[len("socket:[") : -1])
    addresses = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table, encoding="utf-8") as file:
            for line in file.read().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    addresses.append(_address(fields[1].split(":")[0]))
    return addresses


def _address(hexadecimal: str) -> str:
    """/proc/net/tcp's address: 32-bit words in the machine's (little-endian) order."""
    raw = bytes.fromhex(hexadecimal)
    data = b"".join(raw[index : index + 4][::-1] for index in range(0, len(raw), 4))
    address = ipaddress.ip_address(data)
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


# --- The batch ------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def ray_temp_dir() -> Iterator[str]:
    """Ray's files (sessions, logs, sockets) in a directory of this module's, removed
    after. Its sockets live there, and a socket's path is short: so not in tmp_path."""
    directory = tempfile.mkdtemp(prefix="ray-")
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("RAY_TMPDIR", directory)
            yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@dataclass
class Batch:
    """What the batch left, for the tests to read."""

    reference: List[Dict[str, Any]]
    results: List[Dict[str, Any]]
    replayed: List[Dict[str, Any]]
    specs: List[recipe.RunSpec]
    ledger: recipe.EffectLedger
    attempts_before_replay: int
    killed: List[int]
    seen: Dict[Process, str]
    """Every process the batch started (and theirs), with its command line."""
    listening: List[str]
    left: List[str]
    raised: str
    """What run_on_ray raised for a make_run that raises."""


class Releasing(recipe.WorkerKiller):
    """The recipe's WorkerKiller that removes the batch's hold file once it has sent its
    first kill: until then every tool call waits before it acts."""

    def __init__(self, hold: Path, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hold = hold

    def _send(self, pid: int) -> None:
        super()._send(pid)
        with contextlib.suppress(FileNotFoundError):
            self.hold.unlink()


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory, ray_temp_dir: str) -> Batch:
    directory = tmp_path_factory.mktemp("batch")
    seen: Dict[Process, str] = {}
    try:
        with recipe.llmock_server() as url:
            reference_specs = recipe.batch(RUNS, url, str(directory / "reference"))
            recipe.script_llmock(url, [spec.run_id for spec in reference_specs], SEED)
            reference = recipe.run_on_threads(reference_specs, workers=THREADS)
            # The tools wait while the hold file exists: it is removed once the first kill
            # is sent, so that kill lands in the middle of a call, whatever its delay.
            hold = directory / "hold"
            hold.touch()
            specs = recipe.batch(RUNS, url, str(directory / "ray"), hold=str(hold))
            ledger = recipe.EffectLedger(specs[0].ledger_dir)
            with recipe.recipe_ray(WORKERS):
                killer = Releasing(hold, ledger, kills=KILLS, runs=RUNS, seed=SEED)
                with killer:
                    results = recipe.run_specs_on_ray(specs, max_retries=KILLS + 3)
                attempts_before_replay = len(ledger.records("tool attempt"))
                replayed = recipe.run_specs_on_ray(specs[:REPLAYED], max_retries=0)
                not_a_spec: Any = "not a spec"
                with pytest.raises(RuntimeError) as raised:
                    agent_loop_ray.run_on_ray(recipe.make_run, [not_a_spec], max_retries=0)
                seen = {process: command_line(process[0]) for process in descendants(os.getpid())}
                listening = listening_addresses([pid for pid, _ in seen])
    finally:
        # Whatever happened: wait (bounded) for every process seen to end, then say which
        # did not. Ray's workers also report their pids in the ledger's task log (a pid
        # counts if its process is still one of this Ray's: a killed worker's may be reused).
        log = recipe.EffectLedger(str(directory / "ray" / "ledger")).records("")
        for process in descendants(1):
            if process[0] in {record["pid"] for record in log} and started_by(
                process[0], ray_temp_dir
            ):
                seen.setdefault(process, command_line_or_gone(process[0]))
        deadline = time.monotonic() + GONE_SECONDS
        while any(alive(process) for process in seen) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = []
        for process in seen:
            if alive(process):
                left.append(seen[process])
                with contextlib.suppress(OSError):
                    os.kill(process[0], signal.SIGKILL)  # not to leave it to the next test
    return Batch(
        reference,
        results,
        replayed,
        specs,
        ledger,
        attempts_before_replay,
        killer.killed,
        seen,
        listening,
        left,
        str(raised.value),
    )


def _recorded_calls(journal: bytes) -> Set[str]:
    """The ids of the calls whose result a journal (or the start of one) holds: its
    tool.finished events, one JSON line each among the journal's other records."""
    calls = set()
    for line in journal.splitlines(keepends=True):
        data = json.loads(line) if line.endswith(b"\n") else {"record": "torn"}
        if "record" not in data:  # the run, response and resume records are no events
            event = al.event_from_dict(data)
            if event.type == "tool.finished":
                calls.add(event.payload["tool_call"].id)
    return calls


def _calls(result: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """The tool calls of a result's transcript by id, each with its result's content."""
    calls: Dict[str, Dict[str, Any]] = {}
    for message in result["messages"]:
        if message["role"] == "assistant":
            for block in message["content"]:
                if block["type"] == "toolCall":
                    calls[block["id"]] = {"name": block["name"], "arguments": block["arguments"]}
        elif message["role"] == "toolResult":
            calls[message["toolCallId"]]["content"] = message["content"]
    return calls


class TestManyRunsOnRay:
    """200 durable runs as Ray tasks, 8 workers killed: what the issue asks to prove."""

    def test_every_run_ends_with_the_result_it_has_without_faults(self, batch: Batch) -> None:
        assert len(batch.results) == len(batch.reference) == RUNS
        for result, expected in zip(batch.results, batch.reference):
            assert expected["status"] == "completed"
            assert _calls(expected), "every run calls tools"
            assert recipe.canonical(result) == recipe.canonical(expected)

    def test_workers_were_killed_and_their_runs_retried(self, batch: Batch) -> None:
        assert len(batch.killed) == KILLS
        started = batch.ledger.records("task started")
        assert set(batch.killed) <= {record["pid"] for record in started}
        assert batch.ledger.figures()["runs retried"] >= 1
        # Every submission finished: each run once, the first REPLAYED twice. A kill can
        # land after an attempt logged its finish and before Ray had its result: Ray then
        # runs it again, so a run may log one finish more, from a worker that was killed.
        submitted = {spec.run_id: 1 + (index < REPLAYED) for index, spec in enumerate(batch.specs)}
        finished: Dict[str, List[int]] = {}
        for record in batch.ledger.records("task finished"):
            finished.setdefault(record["run"], []).append(record["pid"])
        assert set(finished) == set(submitted)
        for run_id, pids in finished.items():
            extra = len(pids) - submitted[run_id]
            assert extra >= 0, run_id
            assert len([pid for pid in pids if pid in batch.killed]) >= extra, run_id

    def test_no_recorded_tool_call_ran_twice(self, batch: Batch) -> None:
        """Each task attempt logged how much of its run's journal it found: no call whose
        result was in that part ran in that attempt. And a call ran again only where
        the worker of its previous attempt was killed (at-least-once), each killed worker
        in one call at most."""
        journals = {spec.run_id: Path(spec.journal).read_bytes() for spec in batch.specs}
        recorded: Dict[str, Set[str]] = {}  # run id -> calls recorded when its task began
        checked = 0
        for record in batch.ledger.records(""):  # in the order written, by every process
            if record["event"] == "task started":
                found = journals[record["run"]][: record["journal_bytes"]]
                recorded[record["run"]] = _recorded_calls(found)
                checked += len(recorded[record["run"]])
            elif record["event"] == "tool attempt":
                assert record["call"] not in recorded[record["run"]], record
        assert checked  # the runs submitted again found every call recorded, at least
        where: Dict[Tuple[str, str], List[int]] = {}  # each call's attempts' pids, in order
        for attempt in batch.ledger.records("tool attempt"):
            where.setdefault((attempt["run"], attempt["call"]), []).append(attempt["pid"])
        repeated = [pids[:-1] for pids in where.values() if len(pids) > 1]
        earlier = [pid for pids in repeated for pid in pids]
        assert set(earlier) <= set(batch.killed)
        assert len(earlier) == len(set(earlier))
        # The first kill lands while the tools are held (Releasing): that call ran again.
        assert repeated, "a kill in the middle of a call: it ran again (at-least-once)"

    def test_each_call_acted_once_with_the_result_in_its_transcript(self, batch: Batch) -> None:
        transcript: Dict[Tuple[str, str], Dict[str, Any]] = {}
        for spec, result in zip(batch.specs, batch.results):
            for call_id, call in _calls(result).items():
                transcript[(spec.run_id, call_id)] = call
        effects = batch.ledger.effects()
        acted = [(effect["run"], effect["call"]) for effect in effects]
        assert len(acted) == len(set(acted))
        assert set(acted) == set(transcript)
        for effect in effects:
            call = transcript[(effect["run"], effect["call"])]
            assert (effect["tool"], effect["arguments"]) == (call["name"], call["arguments"])
            content = effect["result"]
            if not isinstance(content, str):
                content = json.dumps(content, separators=(",", ":"), ensure_ascii=False)
            assert content == call["content"]

    def test_one_journal_per_run_id(self, batch: Batch) -> None:
        journals = sorted(os.listdir(batch.specs[0].journal_dir))
        assert journals == [spec.run_id + ".jsonl" for spec in batch.specs]

    def test_a_finished_run_returns_its_recorded_result_and_runs_no_tool(
        self, batch: Batch
    ) -> None:
        assert batch.replayed == batch.results[:REPLAYED]  # ids and all
        assert len(batch.ledger.records("tool attempt")) == batch.attempts_before_replay

    def test_ray_and_llmock_listen_on_the_loopback_only(self, batch: Batch) -> None:
        assert batch.listening
        assert set(batch.listening) == {agent_loop_ray.LOOPBACK}

    def test_nothing_is_left_running(self, batch: Batch) -> None:
        seen = list(batch.seen.values())
        for name in ("gcs_server", "raylet", "ray::", "llmock.cli serve"):
            assert any(name in line for line in seen), f"no {name} process was seen"
        assert batch.left == []


# --- The parts, one at a time ---------------------------------------------------------


class TestRunSpec:
    @pytest.mark.parametrize(
        "run_id",
        [
            pytest.param("run-0001", id="plain"),
            pytest.param("a" * 100, id="at-limit"),
            pytest.param("Run_1.retry-2", id="dots-and-underscores"),
        ],
    )
    def test_a_run_id_is_a_plain_file_name(self, run_id: str) -> None:
        spec = recipe.RunSpec(run_id, "http://127.0.0.1:1", "/journals", "/ledger")
        assert spec.journal == os.path.join("/journals", run_id + ".jsonl")

    @pytest.mark.parametrize(
        "run_id",
        [
            pytest.param("a" * 101, id="over-limit"),
            pytest.param("", id="empty"),
            pytest.param("../run", id="parent"),
            pytest.param("runs/1", id="slash"),
            pytest.param(".hidden", id="dot-first"),
            pytest.param("-option", id="dash-first"),
            pytest.param(7, id="not-a-str"),
        ],
    )
    def test_any_other_run_id_is_a_value_error(self, run_id: Any) -> None:
        with pytest.raises(ValueError, match=r"run_id must be a file name .* got "):
            recipe.RunSpec(run_id, "http://127.0.0.1:1", "/journals", "/ledger")


def _settle(
    journal: Path, tool: Callable[[Dict[str, Any], al.Signal], object], call_id: str = "call-1"
) -> al.RunResult:
    """One durable run whose model calls ``tool`` (as "charge") once, then stops."""
    model = al.ScriptedModel(
        [
            al.scripted_response(
                "response-1",
                [al.ToolCall(call_id, "charge", {"customer": "ada", "cents": 250})],
                "toolCall",
            ),
            al.scripted_response("response-2", [al.TextBlock("Charged.")], "stop"),
        ]
    )
    run = agent_loop_durable.durable_run(
        str(journal),
        messages=[al.UserMessage("user-001", "Charge Ada.")],
        model=model,
        tools=al.ToolRegistry([al.Tool("charge", "Charges.", {"type": "object"}, tool)]),
        max_steps=2,
    )
    return al.settle_run(run)[1]


def _attempts(ledger: agent_loop_ray.Ledger, acted: List[str], attempts: int = 1) -> Any:
    """A tool that acts through the ledger ``attempts`` times in one execution, as
    attempts in processes that went on with the same journal would (the same key), and
    appends to ``acted`` each time it really acts; it returns the last attempt's result."""

    def charge(arguments: Dict[str, Any], signal: al.Signal) -> object:
        def act() -> al.JSON:
            acted.append(f"charged {len(acted) + 1}")
            return {"charged": arguments["cents"], "time": len(acted)}

        results = [
            ledger.once(act, tool="charge", cents=arguments["cents"]) for _ in range(attempts)
        ]
        assert all(result == results[0] for result in results)
        return results[-1]

    return charge


class TestLedger:
    """agent_loop_ray.Ledger: one effect per call, keyed by effect_key()."""

    def test_a_call_attempted_again_acts_once_and_answers_as_it_did(self, tmp_path: Path) -> None:
        ledger = agent_loop_ray.Ledger(tmp_path / "effects")
        acted: List[str] = []
        result = _settle(tmp_path / "run.jsonl", _attempts(ledger, acted, attempts=3))
        assert acted == ["charged 1"]
        assert result.messages[2].content == '{"charged":250,"time":1}'
        (effect,) = ledger.effects()
        assert effect["key"].endswith("call-1")  # the run's id, then the call's
        assert {key: value for key, value in effect.items() if key != "key"} == {
            "tool": "charge",
            "cents": 250,
            "result": {"charged": 250, "time": 1},
        }

    def test_the_same_call_id_in_another_run_acts_again(self, tmp_path: Path) -> None:
        """Call ids repeat across runs; effect keys do not."""
        ledger = agent_loop_ray.Ledger(tmp_path / "effects")
        acted: List[str] = []
        _settle(tmp_path / "first.jsonl", _attempts(ledger, acted))
        _settle(tmp_path / "second.jsonl", _attempts(ledger, acted))
        assert acted == ["charged 1", "charged 2"]
        keys = {effect["key"] for effect in ledger.effects()}
        assert len(keys) == 2

    def test_outside_a_tool_of_a_durable_run_it_does_not_act(self, tmp_path: Path) -> None:
        ledger = agent_loop_ray.Ledger(tmp_path)
        acted: List[str] = []
        with pytest.raises(RuntimeError, match=r"only inside a tool of a durable run"):
            ledger.once(lambda: acted.append("acted"))
        run = al.run_agent_loop(  # a tool of a run that is not durable: no key either
            messages=[al.UserMessage("user-001", "Charge Ada.")],
            model=al.ScriptedModel(
                [
                    al.scripted_response(
                        "r1", [al.ToolCall("call-1", "charge", {"cents": 1})], "toolCall"
                    )
                ]
            ),
            tools=al.ToolRegistry(
                [al.Tool("charge", "Charges.", {"type": "object"}, _attempts(ledger, acted))]
            ),
            max_steps=1,
        )
        _, result = al.settle_run(run)
        assert "only inside a tool of a durable run" in result.messages[2].content
        assert acted == []
        assert ledger.effects() == []

    def test_an_effect_once_written_is_never_replaced(self, tmp_path: Path) -> None:
        """Two attempts alive at once: the one whose effect was linked first stands, and
        the other returns its result."""
        ledger = agent_loop_ray.Ledger(tmp_path / "effects")

        def charge(arguments: Dict[str, Any], signal: al.Signal) -> object:
            def act() -> al.JSON:
                # The other attempt links its effect while this one works.
                other: al.JSON = ledger.once(lambda: "first")
                assert other == "first"
                return "second"

            return ledger.once(act)

        result = _settle(tmp_path / "run.jsonl", charge)
        assert result.messages[2].content == "first"
        assert [effect["result"] for effect in ledger.effects()] == ["first"]
        assert sorted(os.listdir(tmp_path / "effects"))[0].endswith(".json")
        assert len(os.listdir(tmp_path / "effects")) == 1  # no draft left


class TestRecipeLedger:
    """The recipe's EffectLedger: its log of what ran where, and its tools' effects."""

    def test_outside_a_tool_call_it_does_not_act(self, tmp_path: Path) -> None:
        ledger = recipe.EffectLedger(str(tmp_path))
        with pytest.raises(RuntimeError, match=r"charge acts only inside a tool call"):
            ledger.effect("run-a", "charge", {}, None, 0.0)
        assert ledger.effects() == []
        assert ledger.records("") == []

    def test_the_figures_count_attempts_and_calls(self, tmp_path: Path) -> None:
        ledger = recipe.EffectLedger(str(tmp_path / "ledger"))
        ledger.task_started("run-a", 0)
        ledger.task_started("run-a", 1234)  # a retry

        def charge(arguments: Dict[str, Any], signal: al.Signal) -> object:
            for _ in range(2):  # as the first attempt and the retry of the same call
                result = ledger.effect("run-a", "charge", arguments, {"charged": 250}, 0.0)
            return result

        result = _settle(tmp_path / "run.jsonl", charge)
        ledger.task_finished("run-a", "completed")
        assert result.messages[2].content == '{"charged":250}'
        (effect,) = ledger.effects()
        assert (effect["run"], effect["call"], effect["tool"]) == ("run-a", "call-1", "charge")
        assert effect["arguments"] == {"customer": "ada", "cents": 250}
        assert ledger.figures() == {
            "task attempts": 2,
            "runs retried": 1,
            "tool attempts": 2,
            "tool calls": 1,
            "calls run again": 1,
            "effects": 1,
        }

    def test_a_tool_waits_to_act_while_the_hold_file_exists(self, tmp_path: Path) -> None:
        """What lets the batch kill a worker in the middle of a call: its tool has logged
        its attempt, and acts only once the hold file is gone."""
        ledger = recipe.EffectLedger(str(tmp_path / "ledger"))
        hold = tmp_path / "hold"
        hold.touch()

        def charge(arguments: Dict[str, Any], signal: al.Signal) -> object:
            return ledger.effect("run-a", "charge", arguments, "charged", 0.0, str(hold))

        results: List[al.RunResult] = []
        runner = threading.Thread(
            target=lambda: results.append(_settle(tmp_path / "run.jsonl", charge))
        )
        runner.start()
        try:
            deadline = time.monotonic() + GONE_SECONDS
            while not ledger.records("tool attempt") and time.monotonic() < deadline:
                time.sleep(0.01)
            assert ledger.records("tool attempt")
            assert ledger.effects() == []  # held: it has not acted
        finally:
            hold.unlink()
            runner.join(GONE_SECONDS)
        assert results[0].messages[2].content == "charged"
        assert [effect["result"] for effect in ledger.effects()] == ["charged"]


class TestRunOnRay:
    """run_on_ray's arguments, and a run that raises (the batch fixture's Ray runs it)."""

    @pytest.mark.parametrize(
        ("arguments", "error", "message"),
        [
            pytest.param({"max_retries": 1.0}, TypeError, "max_retries must be an int, got float"),
            pytest.param({"max_retries": True}, TypeError, "max_retries must be an int, got bool"),
            pytest.param(
                {"max_retries": -1}, ValueError, "max_retries must be an int >= 0, got -1"
            ),
            pytest.param(
                {"max_retries": 0, "options": {"max_retries": 2, "num_cpus": 1}},
                ValueError,
                "options must not set max_retries: run_on_ray sets them",
            ),
        ],
    )
    def test_a_bad_argument(self, arguments: Dict[str, Any], error: type, message: str) -> None:
        with pytest.raises(error, match=re.escape(message)):
            agent_loop_ray.run_on_ray(recipe.make_run, [], **arguments)

    def test_no_items_no_runs(self) -> None:
        assert agent_loop_ray.run_on_ray(recipe.make_run, [], max_retries=0) == []

    def test_a_make_run_that_raises_names_its_item(self, batch: Batch) -> None:
        assert batch.raised.startswith("run_on_ray: the run of item 'not a spec' raised: ")
        assert "AttributeError" in batch.raised  # a str has no journal_dir

    def test_without_ray_the_import_error_names_it(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setitem(sys.modules, "ray", None)
        with pytest.raises(ImportError, match=r"agent_loop_ray.py needs Ray: pip install ray"):
            agent_loop_ray.import_ray()

    def test_what_ray_lacks_is_not_said_to_be_ray(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def import_module(name: str) -> Any:
            raise ModuleNotFoundError("No module named 'grpc'", name="grpc")

        monkeypatch.setattr(importlib, "import_module", import_module)
        with pytest.raises(ModuleNotFoundError, match="grpc"):
            agent_loop_ray.import_ray()


class TestJsonLinesTail:
    def test_it_reads_complete_lines_as_the_file_grows(self, tmp_path: Path) -> None:
        path = tmp_path / "log.jsonl"
        tail = recipe.JsonLinesTail(path)
        assert tail.read() == []  # no file yet
        path.write_bytes(b'{"a":1}\n{"b":')
        assert tail.read() == [{"a": 1}]
        assert tail.read() == []  # the torn line waits
        with open(path, "ab") as file:
            file.write(b'2}\n{"c":3}\n')
        assert tail.read() == [{"b": 2}, {"c": 3}]


class TestCanonical:
    def test_ids_are_renamed_in_order_and_links_kept(self) -> None:
        result = {
            "status": "completed",
            "messages": [
                {"id": "message-x", "content": [{"type": "toolCall", "id": "call_9"}],
                 "providerResponseId": "chatcmpl-7"},
                {"id": "tool-result-call_9", "toolCallId": "call_9", "content": "id"},
            ],
        }  # fmt: skip
        assert recipe.canonical(result) == {
            "status": "completed",
            "messages": [
                {"id": "id-1", "content": [{"type": "toolCall", "id": "id-2"}],
                 "providerResponseId": "id-3"},
                {"id": "id-4", "toolCallId": "id-2", "content": "id"},
            ],
        }  # fmt: skip


class TestLLMockScript:
    def test_each_run_and_seed_has_its_own_script(self) -> None:
        script = recipe.llmock_script("run-0001", 7)
        assert script == recipe.llmock_script("run-0001", 7)
        assert script != recipe.llmock_script("run-0001", 8)
        assert [reply["match"] for reply in script] == [
            {"model": f"run-0001/request-{step:03d}"} for step in range(1, len(script) + 1)
        ]
        assert all(reply["tool_calls"] for reply in script[:-1])
        assert script[-1]["text"].startswith("run-0001: settled in")
        assert all(reply["times"] is None for reply in script)


class TestWorkerKiller:
    def test_it_kills_nothing_but_ray_workers(self, tmp_path: Path) -> None:
        killer = recipe.WorkerKiller(recipe.EffectLedger(str(tmp_path)), kills=2, runs=2, seed=0)
        child = subprocess.Popen([sys.executable, "-c", "pass"])
        child.wait(GONE_SECONDS)
        killer._send(os.getpid())  # this process is no Ray worker
        killer._send(child.pid)  # gone
        assert killer.killed == []

    @pytest.mark.parametrize("kills", [1, 3])
    def test_it_stops_when_the_batch_ends_before_its_kills(
        self, tmp_path: Path, kills: int
    ) -> None:
        ledger = recipe.EffectLedger(str(tmp_path))
        ledger.task_started("run-a", 0)
        ledger.task_finished("run-a", "completed")
        with recipe.WorkerKiller(ledger, kills=kills, runs=2, seed=0) as killer:
            pass  # no tool call starts
        assert killer.killed == []
        assert not killer._thread.is_alive()


class TestLLMockServer:
    def test_a_server_that_does_not_start_is_an_error_and_is_stopped(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # A stand-in for Python that never answers and ignores SIGTERM.
        stubborn = tmp_path / "python"
        stubborn.write_text(
            f"#!/bin/sh\nexec {sys.executable} -c "
            '"import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); '
            'open(\\"' + str(tmp_path / "started") + '\\", \\"w\\").close(); time.sleep(60)"\n',
            encoding="utf-8",
        )
        stubborn.chmod(0o755)
        started = tmp_path / "started"

        def popen(*args: Any, **kwargs: Any) -> Any:
            """Starts the stub, and returns once it ignores SIGTERM: the recipe's 0.5 s
            to answer begin then, however long /bin/sh and Python took to start."""
            process = subprocess.Popen(*args, **kwargs)
            deadline = time.monotonic() + GONE_SECONDS
            while not started.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            return process

        # The recipe's own subprocess names: only its Popen waits for the stub.
        names = {name: getattr(subprocess, name) for name in ("DEVNULL", "TimeoutExpired")}
        monkeypatch.setattr(recipe, "subprocess", types.SimpleNamespace(Popen=popen, **names))
        monkeypatch.setattr(sys, "executable", str(stubborn))
        monkeypatch.setattr(recipe, "LLMOCK_START_SECONDS", 0.5)
        monkeypatch.setattr(recipe, "HTTP_SECONDS", 0.5)
        before = descendants(os.getpid())
        with pytest.raises(
            RuntimeError, match=r"llmock serve did not start on http://127\.0\.0\.1:"
        ), recipe.llmock_server():
            pass  # never reached
        assert started.exists()
        assert {process for process in descendants(os.getpid()) if alive(process)} <= before


class TestLocalRay:
    def test_ray_on_another_address_is_an_error_and_is_shut_down(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        ray = agent_loop_ray.import_ray()
        monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "192.0.2.1")
        with pytest.raises(
            RuntimeError, match=r"Ray took the address 192\.0\.2\.1, not 127\.0\.0\.1"
        ), recipe.recipe_ray(1):
            pass  # never reached
        assert not ray.is_initialized()


def _report(out: str) -> List[str]:
    """main's report: its lines from "runs:" on (Ray prints on stdout what a worker's
    death did, before)."""
    return out[out.index("runs: ") :].splitlines()


class TestMain:
    def test_a_batch_with_kills_is_compared_with_one_without(
        self,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # main's own directories
        assert recipe.main(["--runs", "6", "--kill", "1", "--seed", "3"]) == 0
        lines = _report(capsys.readouterr().out)
        assert lines[0] == "runs: 6 on Ray (2 workers), 6 completed"
        assert lines[1].startswith("time: ")
        killed = re.fullmatch(
            r"workers killed: 1; task attempts: (\d+) \((\d+) runs retried\)", lines[2]
        )
        assert killed is not None
        assert int(killed[1]) == 6 + int(killed[2])
        assert lines[4] == "same result as without faults (on threads): 6 of 6"
        assert lines[5].startswith(f"journals: {tmp_path}")
        assert len(os.listdir(tmp_path)) == 1  # the journals; the reference's are removed

    def test_a_batch_on_a_given_server_and_directory(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        with recipe.llmock_server() as url:
            arguments = ["--runs", "3", "--workers", "1", "--tool-seconds", "0"]
            status = recipe.main([*arguments, "--llmock-url", url, "--dir", str(tmp_path)])
        assert status == 0
        lines = _report(capsys.readouterr().out)
        assert lines[0] == "runs: 3 on Ray (1 workers), 3 completed"
        assert lines[2] == "workers killed: 0; task attempts: 3 (0 runs retried)"
        assert lines[-1] == f"journals: {tmp_path / 'journals'}"
        assert sorted(os.listdir(tmp_path / "journals")) == [
            "run-0001.jsonl",
            "run-0002.jsonl",
            "run-0003.jsonl",
        ]

    @pytest.mark.parametrize(
        "arguments",
        [
            pytest.param(["--runs", "0"], id="no-runs"),
            pytest.param(["--workers", "0"], id="no-workers"),
            pytest.param(["--kill", "-1"], id="negative-kills"),
            pytest.param(["--tool-seconds", "-0.1"], id="negative-seconds"),
            pytest.param(["--runs", "many"], id="not-a-number"),
        ],
    )
    def test_a_bad_option_is_a_usage_message_and_exit_status_2(
        self, arguments: List[str], capsys: pytest.CaptureFixture[str]
    ) -> None:
        with pytest.raises(SystemExit) as exit:
            recipe.main(arguments)
        assert exit.value.code == 2
        err = capsys.readouterr().err
        assert "usage: ray_durable_runs.py" in err
        assert "error: " in err


class TestBenchmark:
    def test_it_prints_a_row_per_size(self, capsys: pytest.CaptureFixture[str]) -> None:
        import bench_ray_durable_runs as bench

        assert bench.main(["--sizes", "2,3", "--repeat", "1", "--tool-seconds", "0"]) == 0
        out = capsys.readouterr().out
        lines = out[out.index("Ray 2 workers") :].splitlines()
        assert lines[0].endswith("tools work 0.0 s; best of 1")
        assert lines[2] == "| runs | Ray | runs/s | per run | threads | runs/s | per run |"
        assert [line.split(" | ")[0] for line in lines[4:]] == ["| 2", "| 3"]
