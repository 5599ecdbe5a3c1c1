"""CPU cost per streamed chunk of agent_loop_providers, beside the official ``openai`` SDK.

Run from the repository root::

    python benchmarks/bench_providers.py            # 20 warm-up + 200 timed runs each
    python benchmarks/bench_providers.py --quick    # 5 warm-up + 30 runs each

The ``openai`` SDK is needed only here, and only for the comparison; it is never a
dependency of the project. Install it where you run the benchmark (``python -m pip
install openai``); without it, only our figure is printed.

Workload: a local server, in another process, answers every POST to
``/v1/chat/completions`` with the same Chat Completions stream of 1,024 text deltas of
64 characters each (the loop's per-step limits, exactly), then ``data: [DONE]``. It
writes the whole body at once, so both clients read the same bytes the same way.

- ours: one timed run is ``run_agent_loop()`` with an ``OpenAIChatModel`` (a new
  connection, the request, the parse of every event, the ``TextDelta`` chunks and their
  events, the loop's checks), drained to its ``RunResult``. The adapter's pacing yields
  the first 512 deltas one by one and coalesces the rest (a stream of 65,536 characters
  is at the loop's text limit), so the loop sees fewer chunks than the stream has
  deltas: the benchmark prints how many;
- the SDK: one timed run is ``client.chat.completions.create(..., stream=True)`` on one
  client built beforehand, iterated to the end, reading ``choices[0].delta.content``.

The figure is the median over the timed runs of the client process's CPU time
(``time.process_time()``: every thread of this process, none of the server's) divided
by 1,024, the stream's deltas: the cost per streamed delta, for both clients. The
run's result is checked once before timing (exit status 1 if it is wrong). Target:
ours, loop included, costs at most a tenth of the SDK's per delta. The targets
are printed, never asserted: a timing is not a test.
"""

from __future__ import annotations

import argparse
import http.server
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, List, Tuple

# Import the modules of this checkout, not installed copies.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import agent_loop as al
import agent_loop_providers as providers

DELTAS = 1024
DELTA = "x" * 63 + " "


def stream_body() -> bytes:
    """The 1,024-delta Chat Completions stream that the server sends."""
    events: List[bytes] = []
    for number in range(DELTAS):
        delta = {"role": "assistant", "content": DELTA} if number == 0 else {"content": DELTA}
        chunk = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "bench",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}],
        }
        events.append(b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n")
    last = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "bench",
        "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}],
    }
    events.append(b"data: " + json.dumps(last, separators=(",", ":")).encode() + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return b"".join(events)


def serve() -> None:
    """The server process: prints its port, then answers until its stdin closes."""
    body = stream_body()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    import threading

    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.read()  # the benchmark closes it when done
    server.shutdown()


def drained(model: al.Model) -> Tuple[List[al.Event], al.RunResult]:
    """One run of the loop on model, drained: its events and its result."""
    return al.settle_run(
        al.run_agent_loop(
            messages=[al.UserMessage("user-001", "Stream.")],
            model=model,
            tools=al.ToolRegistry(),
            max_steps=1,
        )
    )


def loop_chunks(base_url: str) -> int:
    """How many chunks the loop sees for the stream's 1,024 deltas (the pacing)."""
    events, _ = drained(providers.OpenAIChatModel("bench", base_url=base_url, timeout=10.0))
    return sum(event.type == "model.chunk" for event in events)


def ours(base_url: str) -> Callable[[], str]:
    model = providers.OpenAIChatModel("bench", base_url=base_url, timeout=10.0)

    def run() -> str:
        _, result = drained(model)
        if result.status != "completed":
            raise RuntimeError(f"the run did not complete: {result.error}")
        return result.final_text or ""

    return run


def sdk(base_url: str) -> Callable[[], str]:
    import openai  # lazily: only this benchmark uses it

    client = openai.OpenAI(base_url=base_url, api_key="bench", max_retries=0)

    def run() -> str:
        text: List[str] = []
        for chunk in client.chat.completions.create(
            model="bench", messages=[{"role": "user", "content": "Stream."}], stream=True
        ):
            if chunk.choices and chunk.choices[0].delta.content:
                text.append(chunk.choices[0].delta.content)
        return "".join(text)

    return run


def per_chunk_us(run: Callable[[], str], warmup: int, runs: int) -> float:
    """Median client CPU time of one run, per streamed chunk, in microseconds."""
    if run() != DELTA * DELTAS:
        print("the untimed run did not read the whole stream", file=sys.stderr)
        sys.exit(1)
    for _ in range(warmup):
        run()
    samples = []
    for _ in range(runs):
        started = time.process_time()
        run()
        samples.append(time.process_time() - started)
    return statistics.median(samples) / DELTAS * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 warm-up + 30 runs each")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.serve:
        serve()
        return 0
    warmup, runs = (5, 30) if options.quick else (20, 200)
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        base_url = f"http://127.0.0.1:{int(server.stdout.readline())}/v1"
        print(f"Python {platform.python_version()}, {platform.machine()}, {platform.system()}")
        print(f"{DELTAS} deltas of {len(DELTA)} characters; {warmup} warm-up + {runs} runs")
        mine = per_chunk_us(ours(base_url), warmup, runs)
        print(f"the loop sees {loop_chunks(base_url)} chunks for the {DELTAS} deltas")
        print(f"agent_loop_providers + run_agent_loop: {mine:7.2f} us CPU per delta")
        try:
            theirs = per_chunk_us(sdk(base_url), warmup, runs)
        except ImportError:
            print("openai SDK: not installed (python -m pip install openai)")
            return 0
        import openai

        print(f"openai SDK {openai.__version__} (no loop):  {theirs:7.2f} us CPU per delta")
        ratio = mine / theirs
        verdict = "met" if ratio <= 0.1 else "NOT met"
        print(f"ratio: {ratio:.3f} (target <= 0.1: {verdict})")
    finally:
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
