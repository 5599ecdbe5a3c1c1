# agent_loop_ray.py 1.0.1: many durable runs of agent_loop.py as Ray tasks, retried on a crash.
# Needs Ray, imported when used; copy it next to agent_loop.py. Home: the agent_loop repository.
"""Many durable runs as Ray tasks: a run whose worker dies is retried, and the retry goes
on from the run's journal instead of starting again.

``run_on_ray(make_run, items, *, max_retries)`` runs one task per item. A task calls
``make_run(item, signal)``, which returns a ``durable_run()`` generator whose journal is in
a directory that every worker reaches (the item says where: one journal per item), and
drains it. When the worker dies, Ray runs the task again (``max_retries`` times at most):
``make_run`` opens the same journal, so the run gives its recorded events again without
calling the model or a tool and goes on live from its last complete message. The results
come back in the order of ``items``.

Rules:

- A run finishes whatever happens to its workers only while its task has retries left:
  a run whose workers died ``max_retries + 1`` times ends the batch with Ray's error (its
  journal keeps what it did, and a later ``run_on_ray`` goes on from there).
- A run that ends ``failed`` is a result, not a crash: exceptions are not retried. An
  exception from ``make_run`` or from the run (a journal that cannot be written, say)
  ends the batch once every other task has ended, with a RuntimeError that names the
  item. A finished run's journal gives its result again at once, so calling
  ``run_on_ray`` again with the same items runs only what did not finish.
- Results cross processes as JSON (``RunResult.to_dict()``): a result has no
  ``error.exception``, as a result given again from a journal has none.
- Tools are at least once: a call that started and has no result in the journal runs
  again on the retry. A tool whose effect must happen once acts through
  ``Ledger(directory).once(act)``, which keeps one effect per call under the key that
  ``agent_loop_durable.effect_key()`` gives inside a tool of a durable run: the same call
  has the same key in every process that goes on with the journal, and another run's
  call another key. The effect is recorded once ``act()`` returns: an attempt killed in
  between recorded nothing, and the retry acts again.
- ``local_ray(workers)`` starts Ray on this machine only (every server on 127.0.0.1) and
  sends the workers the agent_loop files, this one and the caller's modules, as they
  would go to a cluster. On a real cluster, connect with ``ray.init(address=...)``: the
  journals and the ledger then need a filesystem that every node mounts at one path.

It uses only agent_loop's public names (and agent_loop_durable's), and imports Ray only
when a function that needs it is called.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import logging
import os
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import (
    Any,
    Callable,
    Dict,
    Final,
    Generator,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    TypeVar,
    Union,
)

import agent_loop as al
from agent_loop_durable import effect_key

__version__: Final = "1.0.1"

__all__ = ["run_on_ray", "settle_item", "Ledger", "local_ray", "import_ray", "LOOPBACK"]

LOOPBACK: Final = "127.0.0.1"
"""Where local_ray()'s servers listen: nothing is reachable from another machine."""

Item = TypeVar("Item")
MakeRun = Callable[[Item, al.Signal], Generator[al.Event, None, al.RunResult]]
"""What returns an item's run, built with the signal given: ``make_run(item, signal)``."""


# --- Many runs ------------------------------------------------------------------------


def run_on_ray(
    make_run: MakeRun[Item],
    items: Iterable[Item],
    *,
    max_retries: int,
    options: Optional[Mapping[str, Any]] = None,
) -> List[al.RunResult]:
    """Runs ``make_run(item, signal)`` for each item as a Ray task, retried up to
    ``max_retries`` times when its worker dies; returns the results in the order of items.

    ``make_run`` and the items go to the workers (pickled by Ray), so the functions they
    name must be importable there (see ``local_ray``). ``signal`` is a new
    ``threading.Event`` in each task attempt, which nothing sets. ``options`` are more of
    ``ray.remote()``'s (``num_cpus``, ``resources``...); Ray must be initialised. Raises
    TypeError or ValueError for a bad ``max_retries`` or ``options``, ImportError without
    Ray, RuntimeError naming the item whose ``make_run`` or run raised (once every task
    has ended), and Ray's error for a task whose worker died more often than allowed.
    """
    if type(max_retries) is not int:
        raise TypeError(f"max_retries must be an int, got {type(max_retries).__name__}")
    if max_retries < 0:
        raise ValueError(f"max_retries must be an int >= 0, got {max_retries}")
    given = dict(options or {})
    ours = sorted({"max_retries", "retry_exceptions"} & set(given))
    if ours:
        raise ValueError(f"options must not set {', '.join(ours)}: run_on_ray sets them")
    items = list(items)
    if not items:
        return []  # nothing to run: Ray is not needed
    ray = import_ray()
    task = ray.remote(max_retries=max_retries, retry_exceptions=False, **given)(settle_item)
    shared = ray.put(make_run)
    pending = [task.remote(shared, item) for item in items]
    # Every task ends: bounded by the runs themselves (a task ends with its run, Ray retries
    # a killed worker's up to max_retries times), as run_many's join is. No timeout: a
    # result is never dropped for being slow.
    ray.wait(pending, num_returns=len(pending), fetch_local=False)
    results = []
    for item, ref in zip(items, pending):
        try:
            finished = ray.get(ref)  # at once: ray.wait() saw it end
        except ray.exceptions.RayTaskError as error:  # what make_run or the run raised
            raise RuntimeError(f"run_on_ray: the run of item {item!r} raised: {error}") from error
        results.append(al.event_from_dict(finished).payload["result"])
    return results


def settle_item(make_run: MakeRun[Item], item: Item) -> Dict[str, Any]:
    """The task of one item, in a worker: drains ``make_run(item, signal)`` and returns
    its last event's ``to_dict()``: ``run.finished``, which carries the result as JSON."""
    events, _ = al.settle_run(make_run(item, threading.Event()))
    return events[-1].to_dict()


# --- Tools that act once per call -----------------------------------------------------


class Ledger:
    """The effects of tool calls, one per call, in a directory that every worker reaches.

    A call that started and has no result in its journal runs again after a crash; a
    tool that acts through ``once()`` acts once for it all the same, unless an attempt
    died after acting and before its record was linked (then the next one acts again),
    or two attempts of one run are alive at once (a node cut off from the cluster, not
    dead).
    """

    def __init__(self, directory: Union[str, os.PathLike[str]]) -> None:
        self.directory = Path(directory)

    def once(self, act: Callable[[], al.JSON], **record: al.JSON) -> al.JSON:
        """Calls ``act()`` for the tool call being executed unless an earlier attempt of
        that call recorded its result; returns ``act()``'s result, or the result recorded
        by that attempt. The record is written once ``act()`` has returned: an attempt
        that died in between left none, and ``act()`` runs again (give ``effect_key()``
        to the system that acts, as an idempotency key, where twice is never acceptable).

        ``act`` returns plain JSON, recorded with ``record``'s fields (what the effect
        was, for whoever reads the ledger) under the call's ``effect_key()``, in a file
        written whole and linked into place once (a link never replaces a file). Raises
        RuntimeError outside a tool of a durable run, where there is no key.
        """
        key = effect_key()
        if key is None:
            raise RuntimeError(
                "Ledger.once acts only inside a tool of a durable run: effect_key() is None"
            )
        path = self.directory / (hashlib.sha256(key.encode("utf-8")).hexdigest() + ".json")
        if not path.exists():
            _create_once(path, {**record, "key": key, "result": act()})
        result: al.JSON = json.loads(path.read_text(encoding="utf-8"))["result"]
        return result

    def effects(self) -> List[Dict[str, Any]]:
        """Every effect recorded (its record's fields, ``key`` and ``result``)."""
        return [
            json.loads(path.read_text(encoding="utf-8"))
            for path in sorted(self.directory.glob("*.json"))
        ]


def _create_once(path: Path, record: Mapping[str, Any]) -> None:
    """Writes the file whole (fsynced), unless it exists: a link never replaces a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    with open(draft, "w", encoding="utf-8") as file:
        json.dump(record, file)
        file.flush()
        os.fsync(file.fileno())
    try:
        os.link(draft, path)
    except FileExistsError:
        pass  # another attempt of the same call acted first: its effect stands
    else:
        directory = os.open(path.parent, os.O_RDONLY)  # the new name survives a power cut
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    finally:
        os.unlink(draft)


# --- Ray on this machine --------------------------------------------------------------


def import_ray() -> ModuleType:
    """Returns the ``ray`` module, imported to run on this machine only where it is first
    imported here.

    Ray binds its servers to the node's address, which it takes from the network unless
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (then 127.0.0.1), read when Ray is first
    imported: this sets it where it is unset, and ``RAY_USAGE_STATS_ENABLED=0`` (nothing
    is reported). Raises ImportError, naming the package, without Ray.
    """
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        return importlib.import_module("ray")
    except ModuleNotFoundError as missing:
        if missing.name != "ray":
            raise  # Ray is there, and something it imports is not
        raise ImportError("agent_loop_ray.py needs Ray: pip install ray") from None


@contextlib.contextmanager
def local_ray(workers: int, *, modules: Sequence[ModuleType] = ()) -> Iterator[None]:
    """Starts Ray on this machine, listening on 127.0.0.1 only, and shuts it down.

    ``workers`` is Ray's CPU count, so as many tasks run at once. No dashboard; Ray keeps
    its files in ``ray/`` under ``$RAY_TMPDIR`` (else ``$TMPDIR``, else /tmp). The workers
    get the agent_loop files that are imported, this one and ``modules`` (the caller's,
    where ``make_run`` and the tools live) through ``runtime_env``, as on a cluster.
    Raises RuntimeError (Ray shut down) if Ray took another address than 127.0.0.1: it was
    imported before ``import_ray()`` could set what it reads.
    """
    ray = import_ray()
    ray.init(
        address="local",
        num_cpus=workers,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
        runtime_env={"py_modules": [*_agent_loop_modules(), *modules]},
        _node_ip_address=LOOPBACK,
    )
    try:
        address = ray.util.get_node_ip_address()
        if address != LOOPBACK:
            raise RuntimeError(
                f"Ray took the address {address}, not {LOOPBACK}: it was imported before "
                "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 was set (import it with import_ray())"
            )
        yield
    finally:
        ray.shutdown()


def _agent_loop_modules() -> List[ModuleType]:
    """The agent_loop files this process has imported (this one among them)."""
    return [
        module
        for name, module in sorted(sys.modules.items())
        if (name == "agent_loop" or name.startswith("agent_loop_")) and module is not None
    ]
