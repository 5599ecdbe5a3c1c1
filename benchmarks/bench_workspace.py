"""What agent_loop_workspace's tools cost, and the memory they keep, measured.

Run from the repository root (standard library only; GNU grep and find for the
comparison)::

    python benchmarks/bench_workspace.py            # about a minute, 1.2 GB of disk in /tmp
    python benchmarks/bench_workspace.py --quick    # 10 MB and 100 MB instead of 100 MB and 1 GB

It prints, each the median of several runs: a ``read_file`` window of a 100 MB file (at
its start, and at its last line, which reads the whole file); ``grep`` and ``find_files``
over a tree of 10,000 files beside GNU ``grep -r`` and ``find``; ``run_command`` of
``true`` beside ``subprocess.run(["sh", "-c", "true"])``. Then the memory: the peak RSS of
a fresh process that runs a command printing 1 GB, and of one that reads the last window
of a 1 GB file, each beside the same process's RSS before it.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import agent_loop_workspace as workspace

SIGNAL = threading.Event()
MiB = 1 << 20


def median_ms(work: Callable[[], object], runs: int = 5) -> float:
    times: List[float] = []
    for _ in range(runs):
        began = time.perf_counter()
        work()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def tool(space: workspace.Workspace, name: str) -> Callable[..., str]:
    found = next(item for item in space.tools() if item.name == name)
    return lambda **arguments: str(found.execute(arguments, SIGNAL))


def big_file(path: str, size: int) -> int:
    """A text file of ``size`` bytes in 100-byte lines; returns its line count."""
    line = b"x" * 99 + b"\n"
    block = line * (MiB // 100)
    with open(path, "wb") as file:
        written = 0
        while written < size:
            file.write(block)
            written += len(block)
    return written // 100


def peak_rss(code: str, root: str) -> str:
    """A fresh process runs ``code`` (``space``: a Workspace on ``root``); its peak RSS
    before the code and after it."""
    program = (
        "import resource, sys, threading; sys.path.insert(0, '.');"
        "import agent_loop_workspace as w; space = w.Workspace(sys.argv[1], "
        "limits=w.Limits(read_file_bytes=1 << 31));"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss;" + code + ";"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss;"
        "print(f'{before / 1024:.0f} MiB before it, {after / 1024:.0f} MiB at its peak')"
    )
    try:
        return subprocess.run(
            [sys.executable, "-c", program, root], capture_output=True, text=True, check=True
        ).stdout.strip()
    finally:
        shutil.rmtree(root)


def main() -> None:
    quick = "--quick" in sys.argv
    read_size = (10 if quick else 100) * 1000 * 1000
    memory_size = (100 if quick else 1000) * MiB
    with workspace.Workspace() as space:
        lines = big_file(os.path.join(space.root, "big.txt"), read_size)
        read = tool(space, "read_file")
        print(f"read_file window (2,000 lines or 50 KiB) of a {read_size // 10**6} MB file:")
        print(f"  at its start     {median_ms(lambda: read(path='big.txt')):8.2f} ms")
        last = median_ms(lambda: read(path="big.txt", offset=lines), runs=3)
        print(f"  at its last line {last:8.2f} ms (reads the whole file)")
        os.unlink(os.path.join(space.root, "big.txt"))
        for number in range(10_000):
            folder = os.path.join(space.root, "tree", f"d{number // 100}")
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"f{number}.py"), "w") as file:
                file.write(f"def function_{number}():\n    return {number}\n" * 20)
        grep, find = tool(space, "grep"), tool(space, "find_files")
        root = os.path.join(space.root, "tree")

        def gnu(*command: str) -> Callable[[], object]:
            return lambda: subprocess.run(command, stdout=subprocess.DEVNULL, check=False)

        print("over 10,000 files of 40 lines, in 100 directories:")
        rows = [
            (
                "grep 'return 4242$'",
                lambda: grep(pattern="return 4242$"),
                gnu("grep", "-rE", "return 4242$", root),
            ),
            (
                "find_files 'f42*.py'",
                lambda: find(pattern="f42*.py"),
                gnu("find", root, "-name", "f42*.py"),
            ),
        ]
        for name, ours, theirs in rows:
            print(f"  {name:22} {median_ms(ours):8.2f} ms   GNU: {median_ms(theirs):8.2f} ms")
        command = tool(space, "run_command")
        ours_ms = median_ms(lambda: command(command="true"), runs=20)
        plain = median_ms(lambda: subprocess.run(["sh", "-c", "true"], check=True), runs=20)
        sandbox = "sandboxed" if space.sandboxed else "not sandboxed"
        print(f"run_command 'true' ({sandbox}) {ours_ms:8.2f} ms   sh -c true: {plain:8.2f} ms")
    print("memory (peak RSS of a fresh process):")
    gigabyte = f"head -c {memory_size} /dev/zero | tr '\\\\0' x"
    print(
        f"  a command printing {memory_size // MiB} MiB: "
        + peak_rss(
            f"next(t for t in space.tools() if t.name == 'run_command')"
            f".execute({{'command': \"{gigabyte}\", 'timeout_s': 600}}, threading.Event())",
            tempfile.mkdtemp(),
        )
    )
    root = tempfile.mkdtemp()
    lines = big_file(os.path.join(root, "big"), memory_size)
    print(
        f"  read_file of the last line of a {memory_size // MiB} MiB file: "
        + peak_rss(
            f"next(t for t in space.tools() if t.name == 'read_file')"
            f".execute({{'path': 'big', 'offset': {lines}}}, threading.Event())",
            root,
        )
    )


if __name__ == "__main__":
    main()
