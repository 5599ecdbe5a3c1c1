"""Runs per second of examples/ray_durable_runs.py: on Ray, and on a thread pool.

    pip install . ray llmock==0.2.2
    python examples/bench_ray_durable_runs.py            # 50, 100 and 200 runs; a few minutes

One llmock server and one local Ray (started once, its start timed apart) serve every
batch. Each batch of N runs (the recipe's runs: 1 to 3 steps of tool calls, then text,
each tool working ``--tool-seconds``) runs as Ray tasks on ``--workers`` workers, then on
a ``concurrent.futures.ThreadPoolExecutor`` of as many threads, each in a new directory
of journals, without faults. Ray's workers are warmed first (a batch of 2 runs per
worker, not counted). Each figure is the best of ``--repeat`` batches. It prints a
Markdown table: seconds per batch, runs per second, and each batch's time per run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from typing import Callable, List, Optional, Sequence

import ray_durable_runs as recipe  # beside this file: Python puts its folder on the path


def best_seconds(repeat: int, batch: Callable[[str], object]) -> float:
    """The shortest of repeat timed calls of batch, each with a new directory."""
    times = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="bench-ray-durable-runs-") as directory:
            started = time.perf_counter()
            batch(directory)
            times.append(time.perf_counter() - started)
    return min(times)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_ray_durable_runs.py", description=__doc__)
    parser.add_argument(
        "--sizes",
        default="50,100,200",
        help="runs per batch, comma-separated (default 50,100,200)",
    )
    parser.add_argument("--workers", type=int, default=2, help="Ray workers and threads")
    parser.add_argument("--repeat", type=int, default=2, help="batches per figure (best)")
    parser.add_argument("--tool-seconds", type=float, default=recipe.TOOL_SECONDS)
    options = parser.parse_args(argv)
    sizes = [int(size) for size in options.sizes.split(",")]
    workers = options.workers
    rows: List[str] = []
    with recipe.llmock_server() as url:
        recipe.script_llmock(url, [f"run-{n:04d}" for n in range(1, max(sizes) + 1)], seed=0)

        def specs(count: int, directory: str) -> List[recipe.RunSpec]:
            return recipe.batch(count, url, directory, options.tool_seconds)

        started = time.perf_counter()
        with recipe.recipe_ray(workers):
            ray_start = time.perf_counter() - started
            with tempfile.TemporaryDirectory(prefix="bench-ray-durable-runs-") as directory:
                recipe.run_specs_on_ray(specs(2 * workers, directory), max_retries=0)  # warm-up
            for size in sizes:

                def on_ray_batch(directory: str, size: int = size) -> object:
                    return recipe.run_specs_on_ray(specs(size, directory), max_retries=0)

                def on_threads_batch(directory: str, size: int = size) -> object:
                    return recipe.run_on_threads(specs(size, directory), workers=workers)

                on_ray = best_seconds(options.repeat, on_ray_batch)
                on_threads = best_seconds(options.repeat, on_threads_batch)
                rows.append(
                    f"| {size} | {on_ray:.2f} s | {size / on_ray:.1f} | "
                    f"{1000 * on_ray / size:.0f} ms | {on_threads:.2f} s | "
                    f"{size / on_threads:.1f} | {1000 * on_threads / size:.0f} ms |"
                )
    print(
        f"Ray {workers} workers (started in {ray_start:.1f} s) against a thread pool of "
        f"{workers} threads; tools work {options.tool_seconds} s; best of {options.repeat}"
    )
    print()
    print("| runs | Ray | runs/s | per run | threads | runs/s | per run |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
