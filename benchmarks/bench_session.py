"""A long conversation in a Session against llmock: time per turn, store size, folds.

Run from the repository root, with llmock installed (``python -m pip install
llmock==0.2.2``; it needs Python >= 3.10)::

    python benchmarks/bench_session.py                  # 1,000 turns, then 200 at 400 tokens
    python benchmarks/bench_session.py --turns 200 --chat-turns 50

Workload: ``llmock serve`` in another process on 127.0.0.1 (a free port, started by the
tests' ``server_process``), in its "auto" tool mode: each turn's first request offers a
tool and gets a call to it, the second holds the tool's result and gets a text answer,
so a turn is two streamed requests and one tool call. The model is ``OpenAIChatModel``,
wrapped to count the requests that ask for a summary.

1. A session of ``--turns`` turns in a SQLite file with ``ContextWindow(600)``: the mean
   time of a turn over turns 10-29 and over the last 20, and the store's size (the file
   and its WAL, and the bytes of its rows) every tenth of the way: flat and linear.
2. A chat of ``--chat-turns`` turns against ``llmock serve --context-window 400`` with
   ``ContextWindow(400)``: every turn completes with no context error, and the number
   of summary requests equals the number of folds.

The figures are printed, never asserted: a timing is not a test. Exit status 1 if a turn
did not complete or the summaries and the folds differ.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, List, Optional

# Import the modules of this checkout (and the tests' server helper), not installed copies.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import agent_loop as al
import agent_loop_context as ctx
import agent_loop_providers as providers
import agent_loop_session as sessions
from loop_testing_providers import free_port, server_process


class Counting:
    """The model, counting the requests that ask for a summary (they end with its prompt)."""

    def __init__(self, model: al.Model) -> None:
        self.model = model
        self.summaries = 0

    def stream(self, request: al.ModelRequest, signal: Any) -> Any:
        if request.messages and request.messages[-1].content == ctx.SUMMARY_PROMPT:
            self.summaries += 1
        return self.model.stream(request, signal)


def lookup(city: str) -> str:
    """Looks up the weather in a city."""
    return f"Snow in {city}."


TOOLS = al.ToolRegistry([al.Tool.from_function(lookup)])


@contextlib.contextmanager
def llmock(*options: str) -> Iterator[str]:
    """``llmock serve`` with these options on a free port; yields its URL."""
    port = free_port()
    command = [sys.executable, "-m", "llmock.cli", "serve", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--log-level", "warning", *options]
    url = f"http://127.0.0.1:{port}"
    with server_process("llmock serve", command, url + "/health", start_bound=30.0):
        yield url


def store_bytes(path: str) -> int:
    """The file and its WAL."""
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


def row_bytes(path: str) -> int:
    with sqlite3.connect(path) as connection:
        return int(
            connection.execute("SELECT sum(length(line)) FROM agent_loop_rows").fetchone()[0]
        )


def long_session(url: str, turns: int, folder: str) -> bool:
    """Part 1; True when every turn completed."""
    path = os.path.join(folder, "long.sqlite")
    model = Counting(providers.OpenAIChatModel("gpt-4o", base_url=url + "/v1", retries=0))
    window = ctx.ContextWindow(600)
    times: List[float] = []
    ok = True
    print(f"1. {turns} turns, ContextWindow(600), store {path}")
    print("   turn   mean ms (last tenth)   store bytes   row bytes   folds")
    with sessions.Session(path) as session:
        for number in range(1, turns + 1):
            began = time.perf_counter()
            run = session.run(
                f"Weather number {number}: look it up.", model=model, tools=TOOLS, context=window
            )
            _, result = al.settle_run(run)
            times.append(time.perf_counter() - began)
            ok = ok and result.status == "completed"
            if number % max(1, turns // 10) == 0:
                tenth = times[-max(1, turns // 10) :]
                print(
                    f"   {number:>5}   {1000 * sum(tenth) / len(tenth):>8.2f}"
                    f"               {store_bytes(path):>11,}   {row_bytes(path):>9,}"
                    f"   {len(session.folds):>5}"
                )
        first, last = times[9:29], times[-20:]  # from turn 10: the first ones warm up
        print(
            f"   turns 10-29: {1000 * sum(first) / len(first):.2f} ms a turn; last 20: "
            f"{1000 * sum(last) / len(last):.2f} ms ({sum(last) / sum(first):.2f}x); "
            f"{len(session.history()):,} messages, {len(session.folds)} folds, "
            f"{model.summaries} summaries; every turn completed: {ok}"
        )
        return ok and model.summaries == len(session.folds)


def small_window_chat(url: str, turns: int) -> bool:
    """Part 2; True when every turn completed and summaries == folds."""
    model = Counting(providers.OpenAIChatModel("gpt-4o", base_url=url + "/v1", retries=0))
    window = ctx.ContextWindow(400)
    statuses: List[str] = []
    errors: List[Optional[str]] = []
    with sessions.Session() as session:
        for number in range(1, turns + 1):
            run = session.run(
                f"Weather number {number}: look it up.", model=model, tools=TOOLS, context=window
            )
            _, result = al.settle_run(run)
            statuses.append(result.status)
            errors.append(None if result.error is None else result.error.message)
        folds = len(session.folds)
    context_errors = sum("context" in (error or "") for error in errors)
    completed = statuses.count("completed")
    print(
        f"2. {turns} turns against llmock --context-window 400, ContextWindow(400): "
        f"{completed} completed, {context_errors} context errors, {folds} folds, "
        f"{model.summaries} summaries"
    )
    for error in {error for error in errors if error}:
        print("   error:", error)
    return completed == turns and folds == model.summaries


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--chat-turns", type=int, default=200)
    options = parser.parse_args(argv)
    print(f"Python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs")
    ok = True
    with tempfile.TemporaryDirectory() as folder:
        with llmock() as url:
            ok = long_session(url, options.turns, folder) and ok
        with llmock("--context-window", "400") as url:
            ok = small_window_chat(url, options.chat_turns) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
