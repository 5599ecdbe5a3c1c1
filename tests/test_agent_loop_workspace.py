"""agent_loop_workspace.py: the seven coding tools, their limits, and what keeps them inside.

Hostile input is data: PATH_ROWS (escapes by path, links, FIFOs), PROCESS_ROWS (commands
that outlive their call, hide from their group, ignore SIGTERM, flood the output) and
SANDBOX_ROWS (what Landlock forbids; they skip, with the reason, where the kernel lacks
the ABI). Every limit of ``Limits`` is a row of LIMIT_ROWS, at the limit and one past.
"""

from __future__ import annotations

import io
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

import agent_loop as al
import agent_loop_workspace as workspace
from agent_loop_workspace import Limits, Workspace
from loop_testing import call, run, stop, tool_turn
from test_agent_loop_providers_connection import llmock_process  # noqa: F401

ABI = workspace._landlock_abi()
BOUND = 5.0  # seconds: the longest any wait of these tests may take


class Once:
    """A signal that is set from its ``after``-th look on (a cancel in mid-work)."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.looks = 0

    def is_set(self) -> bool:
        self.looks += 1
        return self.looks >= self.after

    def wait(self, timeout: Optional[float] = None) -> bool:
        return self.is_set()


def use(space: Workspace, name: str, signal: Any = None, **arguments: Any) -> str:
    """A tool's result text, or "ERROR: " and its ToolError's message."""
    tool = {tool.name: tool for tool in space.tools()}[name]
    try:
        said = str(tool.execute(arguments, signal or threading.Event()))
    except al.ToolError as error:
        said = "ERROR: " + error.message
    if name == "grep" and signal is None and "did not end" not in said:
        # The child runs the one search: here, the same answers in this process.
        assert search_here(space, **arguments) == said
    return said


def search_here(space: Workspace, **arguments: Any) -> str:
    """grep's result from its search run in this process (the child's main, on strings)."""
    request = {"glob": None, "ignore_case": False, "literal": False, **arguments}
    try:
        request["base"] = list(space._parts(request.pop("path", ".")))
    except al.ToolError as error:
        return "ERROR: " + error.message
    request["limits"] = dict(vars(space.limits))
    answers = io.StringIO()
    workspace._search_main(space._root_fd, io.StringIO(json.dumps(request)), answers)
    lines = [json.loads(line) for line in answers.getvalue().splitlines()]
    try:
        return workspace._search_text(lines, None, arguments["pattern"], space.limits)
    except al.ToolError as error:
        return "ERROR: " + error.message


@pytest.fixture
def space(tmp_path: Path) -> Iterator[Workspace]:
    (tmp_path / "root").mkdir()
    mark = f"agent-loop-test-{os.getpid()}-{time.monotonic_ns()}"
    with Workspace(str(tmp_path / "root"), env={"WORKSPACE_MARK": mark}) as made:
        yield made
    assert not marked(mark), "a process of the workspace outlived it"


def marked(mark: str) -> List[int]:
    """The live processes whose environment holds ``mark`` (read from /proc)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                environ = Path("/proc", name, "environ").read_bytes()
                state = Path("/proc", name, "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
            except OSError:
                continue
            if mark.encode() in environ and state != b"Z":
                found.append(int(name))
    return found


def mark_of(space: Workspace) -> str:
    return space._env["WORKSPACE_MARK"]


def wait_for(path: Path) -> None:
    """Waits, bounded, until a command has made ``path``."""
    deadline = time.monotonic() + BOUND
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.005)


# --- Limits ------------------------------------------------------------------------------


class TestLimits:
    @pytest.mark.parametrize("name", sorted(workspace._CEILINGS))
    def test_each_field_is_bounded_by_its_hard_maximum(self, name: str) -> None:
        ceiling = workspace._CEILINGS[name]
        fields: Dict[str, Any] = {name: ceiling}
        if name == "timeout_s":
            fields["max_timeout_s"] = ceiling
        assert getattr(Limits(**fields), name) == ceiling  # at the limit
        fields[name] = ceiling + 1
        with pytest.raises(ValueError, match=f"Limits.{name} must be "):
            Limits(**fields)
        with pytest.raises(ValueError, match=f"Limits.{name} must be "):
            Limits(**{name: -1})

    @pytest.mark.parametrize(
        ("fields", "error", "words"),
        [
            ({"read_lines": 2.0}, TypeError, "Limits.read_lines must be an int"),
            ({"read_lines": True}, TypeError, "must be an int"),
            ({"timeout_s": "1"}, TypeError, "Limits.timeout_s must be a number"),
            ({"read_lines": 0}, ValueError, "must be 1.."),
            ({"drain_s": -0.1}, ValueError, "must be 0.."),
            ({"grep_timeout_s": 0}, ValueError, "must be above 0 and at most 3600"),
            ({"timeout_s": 601}, ValueError, "at most max_timeout_s"),
        ],
    )
    def test_a_bad_value_names_the_field(
        self, fields: Dict[str, Any], error: type, words: str
    ) -> None:
        with pytest.raises(error, match=words):
            Limits(**fields)

    def test_the_defaults_are_the_documented_ones(self) -> None:
        limits = Limits()
        assert (limits.read_lines, limits.read_bytes, limits.read_line_chars) == (
            2000,
            51200,
            2000,
        )
        assert (limits.timeout_s, limits.max_timeout_s, limits.drain_s) == (120, 600, 0.2)
        assert Limits(drain_s=0).drain_s == 0


def lines(count: int, text: str = "x") -> str:
    return "".join(f"{text}\n" for _ in range(count))


def entries(count: int) -> Dict[str, str]:
    return {f"e{index}": "" for index in range(count)}


# Each row: a limit, the files and the call made for a size n, and what the result says
# for n at the limit and for n one past it (the words of the cut absent at the limit).
Files = Callable[[int], Dict[str, str]]
Arguments = Callable[[int], Dict[str, Any]]
LIMIT_ROWS: List[Tuple[str, int, Files, str, Arguments, str, str]] = [
    (
        "path_bytes",
        10,
        lambda n: {},
        "write_file",
        lambda n: {"path": "p" * n, "content": ""},
        "wrote 0 bytes",
        "over 10 bytes",
    ),
    (
        "read_lines",
        3,
        lambda n: {"f": lines(n)},
        "read_file",
        lambda n: {"path": "f"},
        "[end of f, line 3]",
        "[lines 1-3 shown; more follow: read_file offset=4]",
    ),
    (
        "read_lines",
        3,
        lambda n: {"f": lines(5)},
        "read_file",
        lambda n: {"path": "f", "limit": n},
        "lines 1-3 shown",
        "limit must be in 1..3",
    ),
    (
        "read_bytes",
        18,
        lambda n: {"f": "x\n" + "x" * (n - 17) + "\n"},
        "read_file",  # 9 + 9
        lambda n: {"path": "f"},
        "[end of f, line 2]",
        "[lines 1-1 shown; more follow",
    ),
    (
        "read_line_chars",
        5,
        lambda n: {"f": "a" * n},
        "read_file",
        lambda n: {"path": "f"},
        "\taaaaa\n[end",
        "\taaaaa [line cut at 5 characters",
    ),
    (
        "read_file_bytes",
        10,
        lambda n: {"f": "x" * n},
        "read_file",
        lambda n: {"path": "f"},
        "xxxxxxxxxx",
        "over the 10 that read_file reads",
    ),
    (
        "write_bytes",
        5,
        lambda n: {},
        "write_file",
        lambda n: {"path": "f", "content": "a" * n},
        "wrote 5 bytes",
        "over 5 (Limits.write_bytes)",
    ),
    (
        "write_bytes",
        5,
        lambda n: {"f": "b"},
        "edit_file",
        lambda n: {"path": "f", "old_text": "b", "new_text": "a" * n},
        "replaced 1",
        "over 5",
    ),
    (
        "edit_file_bytes",
        4,
        lambda n: {"f": "a" * (n - 1) + "b"},
        "edit_file",
        lambda n: {"path": "f", "old_text": "b", "new_text": "B"},
        "replaced 1",
        "Limits.edit_file_bytes",
    ),
    ("list_entries", 2, entries, "list_dir", lambda n: {}, "e0\ne1", "[1 more entries not shown"),
    (
        "find_results",
        2,
        entries,
        "find_files",
        lambda n: {"pattern": "*"},
        "e0\ne1",
        "[stopped at 2 paths",
    ),
    (
        "grep_results",
        2,
        lambda n: {"a": lines(n)},
        "grep",
        lambda n: {"pattern": "x"},
        "a:2: x",
        "[stopped at 2 lines",
    ),
    (
        "grep_line_chars",
        3,
        lambda n: {"a": "x" * n},
        "grep",
        lambda n: {"pattern": "x"},
        "a:1: xxx",
        "a:1: xxx [cut]",
    ),
    ("scan_entries", 2, entries, "list_dir", lambda n: {}, "e0\ne1", "[stopped after 2 entries]"),
    (
        "scan_entries",
        2,
        entries,
        "find_files",
        lambda n: {"pattern": "*"},
        "e0\ne1",
        "[stopped after reading 2 entries",
    ),
    (
        "command_bytes",
        10,
        lambda n: {},
        "run_command",
        lambda n: {"command": "echo " + "1" * (n - 5)},
        "[exit status 0",
        "over 10 (Limits.command_bytes)",
    ),
    (
        "max_timeout_s",
        2,
        lambda n: {},
        "run_command",
        lambda n: {"command": "true", "timeout_s": n},
        "[exit status 0",
        "at most 2 (Limits.max_timeout_s)",
    ),
    (
        "output_head_bytes",
        4,
        lambda n: {},
        "run_command",
        lambda n: {"command": f"printf {'1' * n}5678"},
        "11115678\n[exit",
        "[... 1 bytes cut ...]",
    ),
    (
        "output_tail_bytes",
        4,
        lambda n: {},
        "run_command",
        lambda n: {"command": f"printf 1234{'5' * n}"},
        "12345555\n[exit",
        "[... 1 bytes cut ...]",
    ),
    (
        "output_save_bytes",
        10,
        lambda n: {},
        "run_command",
        lambda n: {"command": f"printf {'1' * n}"},
        "the whole of it is saved",
        "its first 10 bytes are (Limits.output_save_bytes) saved",
    ),
]


# --- Paths ------------------------------------------------------------------------------

# Each row: a setup (given the root and a directory outside it), a tool, its arguments,
# and what the result says. None of them reaches or changes anything outside.
PathRow = Tuple[str, Callable[[Path, Path], None], str, Dict[str, Any], str]


def link(target: str, name: str) -> Callable[[Path, Path], None]:
    def make(root: Path, outside: Path) -> None:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target.replace("OUT", str(outside)), root / name)

    return make


def nothing(root: Path, outside: Path) -> None:
    pass


def fifo(root: Path, outside: Path) -> None:
    os.mkfifo(root / "pipe")


def unix_socket(root: Path, outside: Path) -> None:
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(root / "sock"))
    listener.close()


PATH_ROWS: List[PathRow] = [
    ("dot-dot above the root", nothing, "read_file", {"path": "../secret"}, "goes above"),
    ("dot-dot deep", nothing, "read_file", {"path": "a/../../secret"}, "goes above"),
    ("dot-dot write", nothing, "write_file", {"path": "../x", "content": "x"}, "goes above"),
    ("absolute outside", nothing, "read_file", {"path": "/etc/passwd"}, "outside the workspace"),
    ("absolute sibling prefix", nothing, "read_file", {"path": "ROOTx/f"}, "outside"),
    ("tilde", nothing, "read_file", {"path": "~/.ssh/id_rsa"}, "starts with ~"),
    ("NUL", nothing, "read_file", {"path": "a\0b"}, "NUL character"),
    ("long component", nothing, "write_file", {"path": "n" * 256, "content": ""}, "NAME_MAX"),
    ("symlink file out", link("OUT/secret", "f"), "read_file", {"path": "f"}, "symbolic link"),
    ("symlink dir out", link("OUT", "d"), "read_file", {"path": "d/secret"}, "symbolic link"),
    ("symlink dir list", link("OUT", "d"), "list_dir", {"path": "d"}, "symbolic link"),
    (
        "write via link",
        link("OUT/secret", "f"),
        "write_file",
        {"path": "f", "content": "x"},
        "symbolic link",
    ),
    (
        "write under dir link",
        link("OUT", "d"),
        "write_file",
        {"path": "d/new", "content": "x"},
        "symbolic link",
    ),
    (
        "edit via link",
        link("OUT/secret", "f"),
        "edit_file",
        {"path": "f", "old_text": "s", "new_text": "x"},
        "symbolic link",
    ),
    ("grep skips links", link("OUT", "d"), "grep", {"pattern": "secret"}, "no line matches"),
    ("find skips links", link("OUT", "d"), "find_files", {"pattern": "secret"}, "no path"),
    ("fifo read", fifo, "read_file", {"path": "pipe"}, "pipe is a FIFO"),
    ("fifo write", fifo, "write_file", {"path": "pipe", "content": "x"}, "pipe is a FIFO"),
    ("socket read", unix_socket, "read_file", {"path": "sock"}, "sock is a socket"),
    ("device via link", link("/dev/zero", "zero"), "read_file", {"path": "zero"}, "symbolic"),
    ("directory read", nothing, "read_file", {"path": "."}, "names the workspace root"),
    ("missing", nothing, "read_file", {"path": "nope"}, "no such file"),
    ("file as a directory", link("x", "f"), "read_file", {"path": "f/x"}, "symbolic link"),
]


# --- read_file and edit_file ---------------------------------------------------------------


# --- list_dir, find_files, grep -------------------------------------------------------------


def tree(root: Path) -> None:
    for name in ("a.py", "b.txt", "src/c.py", "src/deep/d.py", "src/deep/e.md", ".git/x.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"hello from {name}\nHELLO again\n")


# --- run_command ------------------------------------------------------------------------------

# Each row: a command and what its result holds (a ToolError's message starts "ERROR: ").
# The fixture checks through /proc that no process of the workspace is left afterwards.
PROCESS_ROWS: List[Tuple[str, str, Dict[str, Any], List[str]]] = [
    (
        "exit status is information",
        "echo out; echo err >&2; exit 3",
        {},
        ["out\nerr\n[exit status 3, after"],
    ),
    ("killed by a signal", "kill -9 $$", {}, ["[killed by signal 9, after"]),
    ("stdin is /dev/null", "cat; echo read-nothing", {}, ["read-nothing"]),
    ("bash when present", "echo $BASH_VERSION", {}, ["." if os.path.exists("/bin/bash") else ""]),
    (
        "home and tmp inside",
        'echo "$HOME $TMPDIR $PWD"',
        {},
        ["/.agent_loop/home ", "/.agent_loop/tmp ", "\n[exit status 0"],
    ),
    (
        "a fork that outlives the call",
        "sleep 30 & echo started",
        {},
        ["started", "[ended 1 process still running after the command exited"],
    ),
    (
        "a pipe holder",
        "(sleep 30; echo never) & echo started",
        {},
        ["started\n[exit status 0", "[ended 2 processes"],
    ),
    (
        "setsid leaves the group",
        "setsid sleep 30 & setsid sh -c 'sleep 30 & sleep 30' & echo x",
        {},
        ["[ended 4 processes"],
    ),
    ("a double fork", "(sh -c 'sleep 30 &' &); echo x", {}, ["[ended 1 process"]),
    ("ignores SIGTERM", "trap '' TERM; sleep 30 & echo x", {}, ["[ended 1 process"]),
    ("binary output", "printf 'a\\000b\\377c'", {}, ["a\x00b\ufffdc"]),
    (
        "a huge output",
        "yes | head -c 50000000",
        {},
        ["y\ny\n", "[... ", "[the output was 50000000 bytes", "saved in .agent_loop/output/"],
    ),
    (
        "a timeout",
        "echo partial; sleep 30",
        {"timeout_s": 0.3},
        [
            "ERROR: the command did not end within 0.3 s (timeout_s) and was killed; its output "
            "so far:\npartial"
        ],
    ),
    (
        "a timeout during a write",
        "yes | head -c 100000 > f; echo wrote; exec sleep 30",
        {"timeout_s": 0.5},
        ["ERROR: the command did not end", "wrote"],
    ),
    ("timeout_s is above 0", "true", {"timeout_s": 0}, ["ERROR: timeout_s must be above 0"]),
    ("no NUL in a command", "a\0b", {}, ["ERROR: the command holds a NUL character"]),
    ("no output", "true", {}, ["(no output)\n[exit status 0"]),
]


def listening() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


# Each row: the Landlock ABI it needs, a command (given OUT, a directory outside; PORT, a
# listening port; PID, a process outside) and what its output holds with the sandbox.
SANDBOX_ROWS: List[Tuple[str, int, str, str]] = [
    ("no write outside", 1, "echo x > OUT/f; ls OUT", "Permission denied"),
    ("no mkdir outside", 1, "mkdir OUT/d 2>&1; ls OUT | wc -l", "0\n"),
    ("writes inside", 1, "echo x > f && cat f", "x\n[exit status 0"),
    ("/dev/null", 1, "echo x > /dev/null && echo ok", "ok"),
    ("no TCP connect", 4, "exec 3<>/dev/tcp/127.0.0.1/PORT && echo connected", "denied"),
    ("no signal outside", 6, "kill -0 PID", "not permitted"),
]


# --- Cancellation -------------------------------------------------------------------------------


# --- The tools in a run ---------------------------------------------------------------------


# --- The command line's coding agent ------------------------------------------------------

# A scripted session: each step, the model's text and its one call; then its last words.
SESSION: List[Tuple[str, str, Dict[str, Any]]] = [
    ("Looking.", "list_dir", {}),
    (
        "Writing.",
        "write_file",
        {"path": "calc.py", "content": "def add(a, b):\n    return a - b\n"},
    ),
    ("Running.", "run_command", {"command": "python3 -B -c 'import calc; print(calc.add(2, 3))'"}),
    ("Fixing.", "edit_file", {"path": "calc.py", "old_text": "a - b", "new_text": "a + b"}),
    (
        "Testing.",
        "run_command",
        {"command": "python3 -B -c 'import calc; assert calc.add(2, 3) == 5' && echo passed"},
    ),
]


def code_session(
    directory: Path, model_options: List[str], monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> Tuple[str, str]:
    """Runs ``agent_loop_cli.py code`` on the session, answering y to each question."""
    import agent_loop_cli as cli

    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 10))
    command = ["code", "--workspace", str(directory), "--max-steps", "8", *model_options]
    assert cli.main([*command, "Fix calc.py"]) == 0
    out, err = capsys.readouterr()
    assert (directory / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    # A question before each call that changes something, none before list_dir.
    assert err.count("? [y/N]") == 4
    assert "run list_dir" not in err
    assert f"workspace: {os.path.realpath(directory)} (" in err
    return out, err


class TestLimitsHold:
    @pytest.mark.parametrize(
        ("field", "value", "files", "tool", "arguments", "at", "past"),
        LIMIT_ROWS,
        ids=[f"{row[0]}-{row[3]}" for row in LIMIT_ROWS],
    )
    def test_every_limit_holds_at_the_limit_and_one_past(
        self,
        tmp_path: Path,
        field: str,
        value: int,
        files: Files,
        tool: str,
        arguments: Arguments,
        at: str,
        past: str,
    ) -> None:
        fields: Dict[str, Any] = {"output_head_bytes": 4, "output_tail_bytes": 4, field: value}
        if field == "max_timeout_s":
            fields["timeout_s"] = 1
        said = []
        for size in (value, value + 1):
            root = tmp_path / str(size)
            root.mkdir()
            for name, content in files(size).items():
                (root / name).write_text(content)
            with Workspace(str(root), limits=Limits(**fields)) as space:
                said.append(use(space, tool, **arguments(size)))
        assert at in said[0], said[0]
        assert past not in said[0], said[0]
        assert past in said[1], said[1]

    def test_a_call_without_timeout_s_has_limits_timeout_s(self, tmp_path: Path) -> None:
        with Workspace(str(tmp_path), limits=Limits(timeout_s=0.2)) as space:
            assert "within 0.2 s" in use(space, "run_command", command="sleep 30")

    def test_a_cut_output_is_saved_whole_up_to_its_cap(self, space: Workspace) -> None:
        result = use(space, "run_command", command="seq 1 100000")
        assert "[... " in result
        assert "bytes cut ...]" in result
        saved = result.split("saved in ")[1].split(" ")[0]
        assert "1\n2\n3\n" in result
        assert "99999\n100000" in result
        window = use(space, "read_file", path=saved, offset=50000, limit=1)
        assert window.startswith(" 50000\t50000\n")
        assert Path(space.root, saved).read_bytes() == subprocess.check_output(
            ["seq", "1", "100000"]
        )
        capped = Workspace(space.root, limits=Limits(output_save_bytes=100))
        with capped:
            assert "its first 100 bytes are (Limits.output_save_bytes) saved" in use(
                capped, "run_command", command="seq 1 100000"
            )


class TestFilesStayInside:
    @pytest.mark.hostile
    @pytest.mark.parametrize(
        ("setup", "tool", "arguments", "says"),
        [row[1:] for row in PATH_ROWS],
        ids=[row[0] for row in PATH_ROWS],
    )
    def test_files_stay_inside_by_construction(
        self,
        tmp_path: Path,
        setup: Callable[[Path, Path], None],
        tool: str,
        arguments: Dict[str, Any],
        says: str,
    ) -> None:
        root, outside = tmp_path / "root", tmp_path / "outside"
        root.mkdir()
        outside.mkdir()
        (outside / "secret").write_text("secret\n")
        setup(root, outside)
        arguments = {
            key: value.replace("ROOT", str(root)) if isinstance(value, str) else value
            for key, value in arguments.items()
        }
        with Workspace(str(root)) as space:
            result = use(space, tool, **arguments)
        assert says in result, result
        assert sorted(os.listdir(outside)) == ["secret"]
        assert (outside / "secret").read_text() == "secret\n"

    def test_an_absolute_path_under_the_root_is_accepted(self, space: Workspace) -> None:
        assert (
            use(space, "write_file", path=f"{space.root}/a/./b", content="x")
            == "wrote 1 bytes to a/b"
        )
        assert "1\tx" in use(space, "read_file", path="a/../a/b")

    @pytest.mark.hostile
    @pytest.mark.parametrize("what", ["file", "directory"])
    def test_a_link_swapped_in_between_the_check_and_the_open_cannot_redirect(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str
    ) -> None:
        root, outside = tmp_path / "root", tmp_path / "outside"
        (root / "d").mkdir(parents=True)
        outside.mkdir()
        (root / "d" / "f").write_text("inside\n")
        (outside / "f").write_text("outside\n")
        real_stat = os.stat
        swapped: List[bool] = []

        def swap_after_check(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
            result = real_stat(path, *args, **kwargs)
            if path == "f" and not swapped:  # the check passed: now the attacker swaps
                swapped.append(True)
                if what == "file":
                    os.rename(root / "d" / "f", tmp_path / "moved")
                    os.symlink(outside / "f", root / "d" / "f")
                else:
                    os.rename(root / "d", tmp_path / "moved")
                    os.symlink(outside, root / "d")
            return result

        with Workspace(str(root)) as space:
            assert "inside" in use(space, "read_file", path="d/f")  # before the swap
            monkeypatch.setattr(os, "stat", swap_after_check)
            result = use(space, "read_file", path="d/f")
            monkeypatch.setattr(os, "stat", real_stat)
            assert swapped
            assert "\toutside" not in result
            if what == "directory":  # the directory's descriptor was open: the old file
                assert "inside" in result
            else:
                assert "symbolic link" in result
            # And between calls: the next call meets the link and refuses it.
            assert "symbolic link" in use(space, "read_file", path="d/f")
            assert "symbolic link" in use(space, "write_file", path="d/f", content="x")
        assert (outside / "f").read_text() == "outside\n"

    def test_a_file_changed_into_a_fifo_while_opened_is_refused(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        (tmp_path / "f").write_text("x")
        real_stat = os.stat

        def swap(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
            result = real_stat(path, *args, **kwargs)
            if path == "f":
                os.unlink(tmp_path / "f")
                os.mkfifo(tmp_path / "f")
            return result

        with Workspace(str(tmp_path)) as space:
            monkeypatch.setattr(os, "stat", swap)
            assert "f changed while it was being opened" in use(space, "read_file", path="f")

    def test_a_write_replaces_a_hard_link_never_writes_through_it(self, space: Workspace) -> None:
        root = Path(space.root)
        (root / "f").write_text("old\n")
        os.chmod(root / "f", 0o640)
        os.link(root / "f", root / "other")
        assert use(space, "write_file", path="f", content="new\n") == "wrote 4 bytes to f"
        assert (root / "other").read_text() == "old\n"
        assert (root / "f").read_text() == "new\n"
        assert stat.S_IMODE(os.stat(root / "f").st_mode) == 0o640  # the mode is kept

    def test_a_cancelled_write_leaves_the_old_file_whole(self, space: Workspace) -> None:
        root = Path(space.root)
        (root / "f").write_text("old\n")
        big = "y" * (3 * 65536)
        result = use(space, "write_file", signal=Once(2), path="f", content=big)
        assert result == "ERROR: cancelled: f was left as it was"
        assert (root / "f").read_text() == "old\n"
        assert sorted(os.listdir(root)) == ["f"]
        result = use(space, "run_command", signal=Once(3), command="sleep 5")  # the lock's wait
        assert result.startswith("ERROR: cancelled")

    def test_writers_wait_for_each_other_and_see_the_signal(self, space: Workspace) -> None:
        with space._lock:
            assert use(space, "write_file", signal=Once(2), path="f", content="x") == (
                "ERROR: cancelled while waiting for another write or command"
            )
        assert use(space, "write_file", path="f", content="x") == "wrote 1 bytes to f"


class TestReadAndEdit:
    @pytest.mark.parametrize(
        ("content", "arguments", "says"),
        [
            (b"", {}, "f is empty"),
            (b"a\nb\n", {"offset": 2}, "     2\tb\n[end of f, line 2]"),
            (b"a\nb\n", {"offset": 3}, "offset 3 is past the end of f (2 lines)"),
            (b"a\n", {"offset": 0}, "offset is a line number"),
            (b"a\0b", {}, "f is binary"),
            (b"caf\xe9\n", {}, "caf\ufffd"),
            (b"x" * 200_000 + b"\nnext\n", {}, "[line cut at 2000 characters"),
            (b"x" * 70000 + b"\nnext\n", {"offset": 2}, "     2\tnext"),
            (b"x" * 8001 + b"\nnext\n", {"offset": 2}, "     2\tnext"),
            (b"x" * 8001 + b"\n", {}, "[end of f, line 1]"),
            (b"last line without end", {}, "\tlast line without end\n[end of f, line 1]"),
        ],
    )
    def test_read_file_shows_a_window_and_says_how_to_read_on(
        self, space: Workspace, content: bytes, arguments: Dict[str, Any], says: str
    ) -> None:
        Path(space.root, "f").write_bytes(content)
        assert says in use(space, "read_file", path="f", **arguments)

    def test_a_read_sees_the_signal_every_64_kib(self, space: Workspace) -> None:
        Path(space.root, "f").write_bytes(b"x\n" * 100_000 + b"y" * 300_000)
        assert (
            use(space, "read_file", signal=Once(2), path="f", offset=90_000) == "ERROR: cancelled"
        )
        assert (
            use(space, "read_file", signal=Once(3), path="f", offset=100_001) == "ERROR: cancelled"
        )

    @pytest.mark.parametrize(
        ("before", "arguments", "says", "after"),
        [
            (
                b"a = 1\nb = 2\n",
                {"old_text": "b = 2", "new_text": "b = 3"},
                "replaced 1 occurrence in f, at line 2",
                b"a = 1\nb = 3\n",
            ),
            (
                b"x\nx\n",
                {"old_text": "x", "new_text": "y"},
                "old_text occurs 2 times in f, at lines 1, 2",
                b"x\nx\n",
            ),
            (
                b"x\nx\n",
                {"old_text": "x", "new_text": "y", "replace_all": True},
                "replaced 2 occurrences in f, at lines 1, 2",
                b"y\ny\n",
            ),
            (b"x\n" * 25, {"old_text": "x", "new_text": "y"}, "20 and 5 more", b"x\n" * 25),
            (
                b"def f():\n    return 1\n",
                {"old_text": "\ndef f():\n  return 1", "new_text": "z"},
                "lines 1-2 match it but for whitespace (nothing was changed)",
                b"def f():\n    return 1\n",
            ),
            (
                b"abc\n",
                {"old_text": "zzz", "new_text": "y"},
                "old_text was not found in f",
                b"abc\n",
            ),
            (b"abc\n", {"old_text": "\n\n", "new_text": "y"}, "not found in f\x00", b"abc\n"),
            (b"abc\n", {"old_text": "", "new_text": "y"}, "old_text is empty", b"abc\n"),
            (
                b"\xff\xfe caf\xe9 = 1\n",
                {"old_text": "1", "new_text": "2"},
                "replaced 1",
                b"\xff\xfe caf\xe9 = 2\n",
            ),
        ],
    )
    def test_edit_file_replaces_exact_text_only(
        self, space: Workspace, before: bytes, arguments: Dict[str, Any], says: str, after: bytes
    ) -> None:
        Path(space.root, "f").write_bytes(before)
        assert says.rstrip("\x00") in use(space, "edit_file", path="f", **arguments) + "\x00"
        assert Path(space.root, "f").read_bytes() == after

    def test_write_file_makes_the_directories_on_its_way(self, space: Workspace) -> None:
        assert (
            use(space, "write_file", path="a/b/c.txt", content="é") == "wrote 2 bytes to a/b/c.txt"
        )
        assert use(space, "list_dir") == "a/"
        assert "is a directory" in use(space, "write_file", path="a", content="x")
        assert "names the workspace root" in use(space, "write_file", path=".", content="x")


class TestSearch:
    @pytest.mark.parametrize(
        ("pattern", "path", "found"),
        [
            ("*.py", ".", "a.py src/c.py src/deep/d.py"),
            ("src/*.py", ".", "src/c.py"),
            ("src/**/*.py", ".", "src/c.py src/deep/d.py"),
            ("**/deep/*", ".", "src/deep/d.py src/deep/e.md"),
            ("**", "src/deep", "src/deep/d.py src/deep/e.md"),
            ("[a-b].*", ".", "a.py b.txt"),
            ("[!a]*.p?", ".", "src/c.py src/deep/d.py"),
            ("?.txt", ".", "b.txt"),
            ("*.py", "src", "src/c.py src/deep/d.py"),
            ("[.py", ".", "no path matches '[.py'"),
            ("d**e*p", ".", "src/deep"),
            ("src/*", ".", "src/c.py src/deep"),
            (
                "*",
                "nope",
                "ERROR: nope: no such file or directory (list_dir or find_files show what "
                "there is)",
            ),
            (
                "*a*a*a*a*a*a*a*a*a*a*a*a*b",
                ".",
                "no path matches '*a*a*a*a*a*a*a*a*a*a*a*a*b'",
            ),  # linear, never backtracks
        ],
    )
    def test_find_files_matches_globs_by_component(
        self, space: Workspace, pattern: str, path: str, found: str
    ) -> None:
        tree(Path(space.root))
        Path(space.root, "a" * 200).write_text("")
        assert use(space, "find_files", pattern=pattern, path=path).replace("\n", " ") == found

    @pytest.mark.parametrize("pattern", ["", "/", "./."])
    def test_an_empty_glob_is_refused(self, space: Workspace, pattern: str) -> None:
        assert "is not a glob" in use(space, "find_files", pattern=pattern)
        assert "is not a glob" in use(space, "grep", pattern="x", glob=pattern)

    def test_list_dir_says_what_each_entry_is(self, space: Workspace) -> None:
        root = Path(space.root)
        tree(root)
        os.symlink("a.py", root / "l")
        os.mkfifo(root / "p")
        assert use(space, "list_dir") == ".git/\na.py\nb.txt\nl -> a.py\np (a FIFO)\nsrc/"
        assert use(space, "list_dir", path="src/deep/../deep") == "d.py\ne.md"
        os.mkdir(root / "empty")
        assert use(space, "list_dir", path="empty") == "empty is empty"
        assert use(space, "list_dir", path="a.py").startswith("ERROR: a.py is a regular file")

    def test_directory_walks_see_the_signal_every_256_entries(self, space: Workspace) -> None:
        for number in range(600):
            Path(space.root, f"f{number}").write_text("")
        for tool, arguments in (("list_dir", {}), ("find_files", {"pattern": "*"})):
            assert use(space, tool, signal=Once(2), **arguments) == "ERROR: cancelled"

    def test_a_walk_counts_directories_that_vanish(self, space: Workspace) -> None:
        tree(Path(space.root))
        walk = workspace._Walk(space._root_fd, (), 100, threading.Event())
        seen = []
        for _, relative, _ in walk:
            seen.append(relative)
            if relative == ("src",):
                os.rename(Path(space.root, "src"), Path(space.root, "gone"))
        assert ("src", "c.py") not in seen
        assert "1 directories changed or vanished" in walk.footer()

    @pytest.mark.parametrize(
        ("arguments", "found"),
        [
            ({"pattern": "hello"}, "a.py:1 b.txt:1 src/c.py:1 src/deep/d.py:1 src/deep/e.md:1"),
            (
                {"pattern": "hello", "ignore_case": True, "glob": "*.md"},
                "src/deep/e.md:1 src/deep/e.md:2",
            ),
            ({"pattern": "c.py", "literal": True}, "src/c.py:1"),
            ({"pattern": "c.py", "path": "src/c.py"}, "src/c.py:1"),
            ({"pattern": "from [ab]", "path": "."}, "a.py:1 b.txt:1"),
            ({"pattern": "from", "glob": "src/**/*.py"}, "src/c.py:1 src/deep/d.py:1"),
            ({"pattern": "nothing here"}, "no line matches 'nothing here'"),
            ({"pattern": "again", "path": "src/deep"}, "src/deep/d.py:2 src/deep/e.md:2"),
        ],
    )
    def test_grep_finds_lines_by_regex_or_literal_text(
        self, space: Workspace, arguments: Dict[str, Any], found: str
    ) -> None:
        tree(Path(space.root))
        result = use(space, "grep", **arguments)
        assert " ".join(line.split(": ")[0] for line in result.splitlines()) == found

    def test_grep_passes_over_files_that_change_under_it(
        self, space: Workspace, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        tree(Path(space.root))
        real_open = os.open

        def changing(path: Any, *args: Any, **kwargs: Any) -> int:
            if path == "a.py":
                raise PermissionError(13, "Permission denied")
            if path == "b.txt":
                os.unlink(Path(space.root, "b.txt"))
                os.mkfifo(Path(space.root, "b.txt"))
            return real_open(path, *args, **kwargs)

        monkeypatch.setattr(os, "open", changing)
        assert (
            search_here(space, pattern="hello", path=".").splitlines()[0]
            == "src/c.py:1: hello from src/c.py"
        )

    @pytest.mark.parametrize(
        ("files", "arguments", "says"),
        [
            ({"bin": b"x\0x"}, {"pattern": "x"}, "[1 files skipped: binary]"),
            (
                {"big": b"x" * 20},
                {"pattern": "x"},
                "[1 files skipped: over Limits.read_file_bytes]",
            ),
            ({}, {"pattern": "("}, "ERROR: the pattern is not a Python regular expression"),
            ({}, {"pattern": "x", "path": "nope"}, "ERROR: nope: no such file"),
            ({"long": b"y" * 100_000 + b"x\nx\n"}, {"pattern": "x"}, "long:2: x"),
        ],
    )
    def test_grep_skips_and_refuses_with_reasons(
        self, tmp_path: Path, files: Dict[str, bytes], arguments: Dict[str, Any], says: str
    ) -> None:
        for name, content in files.items():
            (tmp_path / name).write_bytes(content)
        with Workspace(
            str(tmp_path), limits=Limits(read_file_bytes=10**6 if "long" in files else 10)
        ) as space:
            assert says in use(space, "grep", **arguments)

    @pytest.mark.hostile
    def test_a_catastrophic_regex_cannot_freeze_the_run(self, tmp_path: Path) -> None:
        (tmp_path / "f").write_text("a" * 40 + "!\n")
        (tmp_path / "e").write_text("aaa\n")
        with Workspace(str(tmp_path), limits=Limits(grep_timeout_s=0.5)) as space:
            began = time.monotonic()
            result = use(space, "grep", pattern="^(a+)+$")
            assert time.monotonic() - began < BOUND
            assert result.startswith("ERROR: the search did not end within 0.5 s")
            assert result.endswith("the lines found so far:\ne:1: aaa")
            began = time.monotonic()
            assert use(space, "grep", signal=Once(3), pattern="^(a+)+$").startswith(
                "ERROR: cancelled"
            )
            assert time.monotonic() - began < 1.0  # the signal ends the child at once

    @pytest.mark.parametrize(
        ("answers", "ended", "says"),
        [
            ([{"crash": "Traceback ..."}], None, "the search failed: Traceback ..."),
            ([], None, "the search failed: its process ended early"),
            ([{"match": ["f", 1, "x"]}], "output", "the search failed"),
        ],
    )
    def test_a_search_that_dies_is_a_tool_error(
        self, answers: List[Dict[str, Any]], ended: Optional[str], says: str
    ) -> None:
        with pytest.raises(al.ToolError, match=says):
            workspace._search_text(answers, ended, "x", Limits())

    def test_the_search_reads_what_its_child_prints(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(workspace, "_GREP_OUTPUT", 10)
        child = subprocess.Popen(["sh", "-c", "echo not json; seq 1 100"], stdout=subprocess.PIPE)
        answers, ended = workspace._read_search(child, BOUND, threading.Event())
        workspace._end(child)
        assert ended == "output"
        assert answers[0] == {"crash": "not json"}
        workspace._end(subprocess.Popen(["true"]))  # no pipe, and already ended: nothing to do

    def test_a_control_pipe_closed_is_never_written(self, space: Workspace) -> None:
        control = workspace._Control(os.pipe()[1])
        control.close()
        control.end()
        control.close()
        assert control.fd == -1

    def test_a_step_that_cannot_be_looked_at_says_the_error(self, space: Workspace) -> None:
        error = workspace._path_error(
            space._root_fd, "gone", "a/gone", PermissionError(13, "Denied")
        )
        assert error.message == "a/gone: Denied"

    def test_a_failed_replace_removes_its_temporary_file(
        self, space: Workspace, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        Path(space.root, "f").write_text("old")

        def failing(*args: Any, **kwargs: Any) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "replace", failing)
        with pytest.raises(OSError, match="No space left"):
            use(space, "write_file", path="f", content="new")
        assert os.listdir(space.root) == ["f"]
        assert Path(space.root, "f").read_text() == "old"


class TestCommands:
    @pytest.mark.hostile
    @pytest.mark.parametrize(
        ("command", "arguments", "says"),
        [row[1:] for row in PROCESS_ROWS],
        ids=[row[0] for row in PROCESS_ROWS],
    )
    def test_processes_end_with_their_call(
        self, space: Workspace, command: str, arguments: Dict[str, Any], says: List[str]
    ) -> None:
        result = use(space, "run_command", command=command, **arguments)
        for part in says:
            assert part in result, result
        assert not marked(mark_of(space))
        assert ("not sandboxed" in result) is not space.sandboxed

    def test_the_environment_is_an_allowlist(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("MY_API_KEY", "k")
        monkeypatch.setenv("GITHUB_TOKEN", "t")
        monkeypatch.setenv("LC_SECRET_THING", "s")
        monkeypatch.setenv("LC_ALL", "C")
        monkeypatch.setenv("UNLISTED", "u")
        with Workspace(str(tmp_path), env={"GIVEN_PASSWORD": "p"}) as space:
            result = use(space, "run_command", command="env")
        names = {line.split("=")[0] for line in result.splitlines() if "=" in line}
        assert {"GIVEN_PASSWORD", "LC_ALL", "PATH", "HOME", "TMPDIR"} <= names
        assert not names & {"MY_API_KEY", "GITHUB_TOKEN", "LC_SECRET_THING", "UNLISTED"}
        assert workspace._command_environment({}, {})["PATH"] == os.defpath

    @pytest.mark.hostile
    @pytest.mark.parametrize(
        ("needs", "command", "says"),
        [row[1:] for row in SANDBOX_ROWS],
        ids=[row[0] for row in SANDBOX_ROWS],
    )
    def test_a_sandboxed_command_writes_only_inside(
        self, tmp_path: Path, needs: int, command: str, says: str
    ) -> None:
        if needs > ABI:
            pytest.skip(f"this kernel's Landlock ABI is {ABI}; the rule needs ABI {needs}")
        (tmp_path / "root").mkdir()
        (tmp_path / "out").mkdir()
        server = listening()
        outside = subprocess.Popen(["sleep", "30"])
        try:
            command = command.replace("OUT", str(tmp_path / "out"))
            command = command.replace("PORT", str(server.getsockname()[1]))
            command = command.replace("PID", str(outside.pid))
            with Workspace(str(tmp_path / "root"), sandbox="require") as space:
                assert space.sandboxed
                result = use(space, "run_command", command=command)
        finally:
            server.close()
            outside.kill()
            outside.wait(BOUND)
        assert says in result, result
        assert os.listdir(tmp_path / "out") == []
        without = Workspace(str(tmp_path / "root"), sandbox=None)
        with without:
            assert "[not sandboxed]" in use(without, "run_command", command="true")

    def test_without_landlock_commands_say_not_sandboxed(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(workspace, "_landlock_abi", lambda: 0)
        with pytest.raises(RuntimeError, match="this kernel offers no Landlock"):
            Workspace(str(tmp_path), sandbox="require")
        with Workspace(str(tmp_path)) as space:
            assert not space.sandboxed
            tool = next(tool for tool in space.tools() if tool.name == "run_command")
            assert "Not sandboxed" in tool.description
            assert use(space, "run_command", command="true").endswith("[not sandboxed]")

    @pytest.mark.parametrize(
        ("abi", "says"),
        [
            (1, "to /dev/null."),
            (4, "and cannot open TCP connections."),
            (6, "cannot open TCP connections nor signal processes outside."),
        ],
    )
    def test_the_description_says_what_the_sandbox_holds(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, abi: int, says: str
    ) -> None:
        monkeypatch.setattr(workspace, "_landlock_abi", lambda: abi)
        with Workspace(str(tmp_path)) as space:
            tool = next(tool for tool in space.tools() if tool.name == "run_command")
            assert tool.description.endswith(says)
        assert workspace._ruleset(abi, True).split()[1:3] == [
            "3" if abi >= 4 else "0",
            "3" if abi >= 6 else "0",
        ]

    def test_landlock_is_probed_on_linux_only(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(sys, "platform", "darwin")
        assert workspace._landlock_abi() == 0

    def test_a_sandbox_that_cannot_be_made_is_an_error(
        self, space: Workspace, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(workspace, "_ruleset", lambda abi, sandboxed: "0 0 0 0")
        assert use(space, "run_command", command="true").startswith(
            "ERROR: the command could not be started: landlock_create_ruleset failed"
        )

    def test_a_supervisor_that_cannot_start_raises(
        self, space: Workspace, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(sys, "executable", "/nonexistent/python")
        with pytest.raises(FileNotFoundError):
            use(space, "run_command", command="true")
        assert not space._live

    def test_a_supervisor_that_never_ends_the_tree_is_killed(
        self, space: Workspace, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(workspace, "_REAP_SECONDS", 0.2)
        monkeypatch.setattr(workspace, "_SUPERVISOR", "import time; time.sleep(30)")
        result = use(space, "run_command", command="true", timeout_s=0.1)
        assert result.startswith("ERROR: the command did not end within 0.1 s")


class TestCancellation:
    @pytest.mark.parametrize(
        ("command", "bound"),
        [
            ("trap '' TERM; touch started; sleep 30", 0.25),
            ("touch started; setsid sh -c 'sleep 30' & sleep 30 & exec sleep 30", 0.25),
            ("(trap '' TERM; sleep 30) & touch started; wait", 2.5),
        ],
    )
    def test_the_signal_ends_the_tree_within_the_bound(
        self, space: Workspace, command: str, bound: float
    ) -> None:
        signal = threading.Event()
        results: List[str] = []
        runner = threading.Thread(
            target=lambda: results.append(use(space, "run_command", signal, command=command))
        )
        runner.start()
        wait_for(Path(space.root, "started"))
        signal.set()
        began = time.monotonic()
        runner.join(BOUND)
        took = time.monotonic() - began
        assert results[0].startswith("ERROR: cancelled: the command was killed")
        assert not marked(mark_of(space))
        assert took < bound * 4  # generous: 2 shared cores

    def test_close_ends_every_live_process(self, tmp_path: Path) -> None:
        space = Workspace(env={"WORKSPACE_MARK": f"close-{os.getpid()}"})
        root = space.root
        results: List[str] = []
        runner = threading.Thread(
            target=lambda: results.append(use(space, "run_command", command="touch s; sleep 30"))
        )
        runner.start()
        wait_for(Path(root, "s"))
        space.close()
        runner.join(BOUND)
        assert not runner.is_alive()
        assert not marked(f"close-{os.getpid()}")
        assert not os.path.exists(root)  # it made the root: it removes it
        space.close()  # idempotent

    def test_a_given_root_is_kept_and_must_be_a_directory(self, tmp_path: Path) -> None:
        with Workspace(str(tmp_path)) as space:
            assert space.root == os.path.realpath(tmp_path)
        assert tmp_path.exists()
        with pytest.raises(ValueError, match="root must be a directory"):
            Workspace(str(tmp_path / "nope"))

    @pytest.mark.parametrize(
        ("arguments", "error", "words"),
        [
            ({"limits": {}}, TypeError, "limits must be a Limits"),
            ({"sandbox": "yes"}, ValueError, 'sandbox must be "auto", "require" or None'),
            ({"env": {"A": 1}}, TypeError, "env must map str names to str values"),
        ],
    )
    def test_bad_arguments_are_refused_by_name(
        self, tmp_path: Path, arguments: Dict[str, Any], error: type, words: str
    ) -> None:
        with pytest.raises(error, match=words):
            Workspace(str(tmp_path), **arguments)


class TestTools:
    def test_the_tools_carry_their_hints_and_run_in_a_loop(self, space: Workspace) -> None:
        tools = {tool.name: tool for tool in space.tools()}
        assert list(tools) == [
            "read_file",
            "write_file",
            "edit_file",
            "list_dir",
            "find_files",
            "grep",
            "run_command",
        ]
        for name, tool in tools.items():
            changes = name in ("write_file", "edit_file", "run_command")
            assert tool.sequential is changes
            assert dict(tool.annotations) == (
                {"readOnlyHint": False, "destructiveHint": True}
                if changes
                else {"readOnlyHint": True}
            )
        assert set(tools["grep"].parameters["properties"]) == {
            "pattern",
            "path",
            "glob",
            "ignore_case",
            "literal",
        }
        script = [
            tool_turn(
                "r1", call("write_file", "c1", {"path": "t.py", "content": "print(6 * 7)\n"})
            ),
            tool_turn("r2", call("run_command", "c2", {"command": "python3 t.py"})),
            stop("r3", "done"),
        ]
        _events, result, _ = run(al.ScriptedModel(script), list(tools.values()))
        assert result.status == "completed"
        outputs = [
            message for message in result.messages if isinstance(message, al.ToolResultMessage)
        ]
        assert outputs[1].content.startswith("42\n[exit status 0")


class TestCodingAgent:
    def test_the_coding_agent_asks_before_each_change(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
    ) -> None:
        from loop_testing_providers import Reply, answer_parts, serving

        with serving() as server:
            server.script(
                *[
                    Reply(answer_parts("openai", [text, (f"c{index}", name, arguments)]))
                    for index, (text, name, arguments) in enumerate(SESSION)
                ],
                Reply(answer_parts("openai", ["Fixed."])),
            )
            options = ["--provider", "openai", "--base-url", server.url + "/v1", "--model", "m"]
            out, _ = code_session(tmp_path, options, monkeypatch, capsys)
            results = [
                message for message in server.body(5)["messages"] if message["role"] == "tool"
            ]
        assert results[2]["content"].startswith("-1\n[exit status 0")
        assert results[4]["content"].startswith("passed\n[exit status 0")
        assert "completed after 6 step(s)" in out

    def test_the_coding_agent_needs_a_directory(self, tmp_path: Path, capsys: Any) -> None:
        import agent_loop_cli as cli

        with pytest.raises(SystemExit) as exit:
            cli.main(
                [
                    "code",
                    "--workspace",
                    str(tmp_path / "nope"),
                    "--provider",
                    "openai",
                    "--base-url",
                    "http://127.0.0.1:9/v1",
                    "--model",
                    "m",
                    "--yes",
                    "hi",
                ]
            )
        assert exit.value.code == 2
        assert "--workspace" in capsys.readouterr().err

    @pytest.mark.llmock
    def test_the_coding_agent_against_llmock(
        self,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: Any,
        llmock_process: Any,  # noqa: F811
    ) -> None:
        llmock_process.admin("POST", "/_llmock/reset", {})
        llmock_process.scenario(
            *[
                {
                    "type": "reply",
                    "text": text,
                    "tool_calls": [{"name": name, "arguments": arguments}],
                }
                for text, name, arguments in SESSION
            ],
            {"type": "reply", "text": "Fixed."},
        )
        options = [
            "--provider",
            "openai",
            "--base-url",
            llmock_process.url + "/v1",
            "--model",
            "gpt-4o",
        ]
        out, _ = code_session(tmp_path, options, monkeypatch, capsys)
        assert "completed after 6 step(s)" in out
        assert "passed" in out
