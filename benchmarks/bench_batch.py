"""Runs per second and memory of agent_loop_batch.run_many against llmock.

Run from the repository root, with llmock installed (``python -m pip install
llmock==0.2.2``; it needs Python >= 3.10)::

    python benchmarks/bench_batch.py                    # 100, then 1,000 runs, 8 at once
    python benchmarks/bench_batch.py --runs 100 --concurrency 4

Workload: ``llmock serve`` in another process on 127.0.0.1 (a free port), in its "auto"
tool mode: each run's first request offers a tool and gets a call to it, the second holds
the tool's result and gets a text answer, so a run is two streamed requests, one tool
call, and 10 to 20 events (llmock's text answers differ in length). Every run shares one
``OpenAIChatModel`` object, as a batch does.

For each batch size, in one process, smallest first:

- time: the wall-clock time of ``run_many(...)``, and runs per second;
- CPU: this process's CPU time (every thread; llmock's is not counted);
- llmock's record of the requests is emptied before each pass, so that every size
  meets the same server;
- memory: the peak of Python's allocations during the batch (``tracemalloc``, in a second
  pass of the same size, since tracing slows the run), what is still allocated after it
  (the results the batch returns: each run's transcript), and the process's peak resident
  size (``ru_maxrss``) after the timed pass.

The figures are printed, never asserted: a timing is not a test. Exit status 1 if a run
did not complete.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import platform
import resource
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
import urllib.request
from pathlib import Path
from typing import Generator, Iterator, List, Optional, Sequence

# Import the modules of this checkout, not installed copies.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import agent_loop as al
import agent_loop_batch as batch
import agent_loop_providers as providers


@contextlib.contextmanager
def llmock_server() -> Iterator[str]:
    """Starts ``llmock serve`` on 127.0.0.1 and a free port; yields its URL; stops it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "llmock.cli", "serve", "--host", "127.0.0.1"]
    process = subprocess.Popen(
        [*command, "--port", str(port), "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30.0
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=1.0):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"llmock serve did not start on {url}") from None
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def lookup(city: str) -> str:
    """Looks up the weather in a city."""
    return f"Snow in {city}."


def batch_of(model: al.Model, runs: int, concurrency: int) -> List[al.RunResult]:
    """``runs`` runs of the workload, ``concurrency`` at once."""
    tools = al.ToolRegistry([al.Tool.from_function(lookup)])

    def make_run(number: int, signal: threading.Event) -> Generator[al.Event, None, al.RunResult]:
        return al.run_agent_loop(
            messages=[al.UserMessage("user-001", f"Weather number {number}: look it up.")],
            model=model,
            tools=tools,
            max_steps=2,
            signal=signal,
        )

    return batch.run_many(make_run, range(runs), concurrency=concurrency, progress=False)


def reset(url: str) -> None:
    """Empties llmock's record of the requests it answered, which grows with each one."""
    request = urllib.request.Request(url + "/_llmock/reset", data=b"{}", method="POST")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10.0) as answer:
        answer.read()


def measure(url: str, runs: int, concurrency: int) -> bool:
    """Prints one batch size's figures; returns whether every run completed."""
    reset(url)
    model = providers.OpenAIChatModel(
        "gpt-4o", base_url=url + "/v1", api_key="", timeout=30.0, retries=0
    )
    gc.collect()
    began, cpu = time.perf_counter(), time.process_time()
    results = batch_of(model, runs, concurrency)
    seconds, cpu = time.perf_counter() - began, time.process_time() - cpu
    maxrss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    completed = sum(result.status == "completed" for result in results)
    del results
    gc.collect()
    reset(url)
    tracemalloc.start()
    results = batch_of(model, runs, concurrency)
    kept, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del results
    print(
        f"{runs:>5} runs, {concurrency} at once: {seconds:6.2f} s, {runs / seconds:6.1f} runs/s, "
        f"CPU {cpu / runs * 1000:5.2f} ms/run; Python peak {peak / 2**20:6.2f} MiB, "
        f"kept after (the results) {kept / 2**20:6.2f} MiB ({kept / runs / 1024:.1f} KiB/run); "
        f"process peak RSS so far {maxrss_mib:6.1f} MiB; {completed}/{runs} completed",
        flush=True,
    )
    return completed == runs


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--concurrency", type=int, default=8)
    options = parser.parse_args(argv)
    print(f"Python {platform.python_version()} on {platform.machine()}, {platform.system()}")
    ok = True
    with llmock_server() as url:
        batch_of(  # warm-up: imports, the first connections
            providers.OpenAIChatModel("gpt-4o", base_url=url + "/v1", api_key=""),
            options.concurrency,
            options.concurrency,
        )
        for runs in options.runs:
            ok = measure(url, runs, options.concurrency) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
