# agent_loop_workspace.py 1.0.0: coding tools for agent_loop.py that stay inside a workspace.
# Standard library only (ctypes for Landlock); copy it next to agent_loop.py.
# Home: the agent_loop repository.
"""Files and processes for a coding agent, kept inside one directory, with stated limits.

``Workspace(root=None, *, limits=Limits(), env=None, sandbox="auto")`` is a directory (a new
temporary one unless ``root`` is given; removed on ``close()`` only when it made it) and
``workspace.tools()`` its seven tools: ``read_file``, ``write_file``, ``edit_file``,
``list_dir``, ``find_files``, ``grep`` and ``run_command``::

    with Workspace() as workspace:
        tools = agent_loop.ToolRegistry(workspace.tools())

The rules, each enforced in one function below:

1. Every limit is a field of ``Limits`` with its default and a hard maximum; a cut says
   what was cut and how to see the rest, a refusal is a ``ToolError`` that says why and
   what to do instead. Memory stays bounded by the limits, whatever the input.
2. Files stay inside by construction: a path is split into components (never compared as
   a string), ``..`` above the root, NUL, ``~`` and over-long paths are refused, and it is
   opened by walking from the root's descriptor one component at a time with
   ``O_NOFOLLOW`` (``_open_dir``): a symbolic link is never followed, so one swapped in
   between two calls, or between a check and an open, cannot redirect anything. Writes go
   to a temporary file beside the target, then ``os.replace`` (atomic, never through a
   hard link). FIFOs, devices and sockets are refused without blocking (``O_NONBLOCK``
   and ``fstat``).
3. Processes stay inside too, where the kernel allows: ``run_command`` starts a small
   supervisor (``python -I -S -c _SUPERVISOR``, in a new session) that becomes the child
   subreaper (``PR_SET_CHILD_SUBREAPER``), restricts itself with Landlock when sandboxed
   (writes only under the root and to ``/dev/null``; no TCP bind or connect from ABI 4; no
   signals out of the sandbox from ABI 6), then forks ``sh -c`` (bash when present), stdin
   ``/dev/null``. A supervisor, rather than a ``preexec_fn``, because code between fork
   and exec in a threaded parent may deadlock; and because only a subreaper still sees
   the descendants that left with ``setsid``. When the shell ends, the tool drains the
   output for ``Limits.drain_s`` and asks the supervisor to end the whole tree (SIGKILL,
   found through ``/proc``, until it has no child left).
4. The run's signal is seen every ``agent_loop.WATCH_SECONDS`` while a command or a search
   runs, and between chunks of file work (64 KiB, or 256 directory entries). ``grep`` runs
   its pattern in a child process with a timeout, so a catastrophic regular expression
   cannot freeze the run. ``close()`` ends every live process.

It uses only the public names of ``agent_loop``.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import json
import os
import re
import secrets
import selectors
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from typing import (
    IO,
    Any,
    Callable,
    Dict,
    Final,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
)

import agent_loop as al

__version__ = "1.0.0"

__all__ = ["Workspace", "Limits"]


# --- Limits ---------------------------------------------------------------------------

_MiB: Final = 1 << 20

_CEILINGS: Final[Dict[str, float]] = {
    "path_bytes": 4096,  # PATH_MAX: the kernel refuses a longer path anyway
    "read_lines": 100_000,
    "read_bytes": 16 * _MiB,
    "read_line_chars": 1_000_000,
    "read_file_bytes": 1 << 40,
    "write_bytes": 256 * _MiB,
    "edit_file_bytes": 256 * _MiB,
    "list_entries": 100_000,
    "find_results": 100_000,
    "grep_results": 100_000,
    "grep_line_chars": 100_000,
    "scan_entries": 100_000_000,
    "grep_timeout_s": 3600,
    "command_bytes": 131_071,  # MAX_ARG_STRLEN less its NUL: past it, execve fails E2BIG
    "timeout_s": 86_400,
    "max_timeout_s": 86_400,
    "output_head_bytes": 16 * _MiB,
    "output_tail_bytes": 16 * _MiB,
    "output_save_bytes": 1 << 40,
    "drain_s": 60,
}
"""The hard maximum of each field of Limits: a bigger value is a ValueError."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """Every limit of a Workspace's tools, each with its default; ``Limits()`` is the
    defaults. Raises ValueError, naming the field, for a count below 1, a time not above 0
    (``drain_s`` may be 0), a value above its hard maximum, or a ``timeout_s`` above
    ``max_timeout_s``; TypeError for a value that is not a number (an int for the counts
    and sizes)."""

    path_bytes: int = 4096  # a path argument, UTF-8 encoded
    read_lines: int = 2000  # lines in one read_file window (the most ``limit`` may ask)
    read_bytes: int = 51_200  # bytes in one read_file window
    read_line_chars: int = 2000  # a line longer than this is cut in a read_file window
    read_file_bytes: int = 128 * _MiB  # a bigger file is refused by read_file and skipped by grep
    write_bytes: int = 1 * _MiB  # write_file's content, edit_file's texts, UTF-8 encoded
    edit_file_bytes: int = 10 * _MiB  # a bigger file is refused by edit_file (read whole)
    list_entries: int = 1000  # entries that list_dir shows
    find_results: int = 1000  # paths that find_files shows
    grep_results: int = 200  # matching lines that grep shows
    grep_line_chars: int = 500  # a matching line longer than this is cut
    scan_entries: int = 100_000  # directory entries that one list_dir, find_files or grep reads
    grep_timeout_s: float = 30  # a search that runs longer is ended
    command_bytes: int = 65_536  # run_command's command, UTF-8 encoded
    timeout_s: float = 120  # run_command's timeout when the call gives none
    max_timeout_s: float = 600  # the most a call's timeout_s may ask
    output_head_bytes: int = 8192  # of a command's output, the model sees this much of its start
    output_tail_bytes: int = 8192  # and this much of its end
    output_save_bytes: int = 64 * _MiB  # a cut output is saved in the workspace up to this
    drain_s: float = 0.2  # after the shell ends, how long its output may still come

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            timed = field.name.endswith("_s")
            kinds: Tuple[type, ...] = (int, float) if timed else (int,)
            if type(value) not in kinds:
                wanted = "a number" if timed else "an int"
                raise TypeError(f"Limits.{field.name} must be {wanted}, got {value!r}")
            high = _CEILINGS[field.name]
            if field.name == "drain_s":
                low, fits = "0..", 0 <= value <= high
            elif timed:
                low, fits = "above 0 and at most ", 0 < value <= high
            else:
                low, fits = "1..", 1 <= value <= high
            if not fits:
                raise ValueError(f"Limits.{field.name} must be {low}{high}, got {value!r}")
        if self.timeout_s > self.max_timeout_s:
            raise ValueError(
                f"Limits.timeout_s must be at most max_timeout_s ({self.max_timeout_s}), "
                f"got {self.timeout_s}"
            )


# --- The workspace ----------------------------------------------------------------------

_CHUNK: Final = 64 * 1024  # file work looks at the signal between chunks of this size
_ENTRY_BATCH: Final = 256  # and directory walks between batches of this many entries
_BINARY_PROBE: Final = 8192  # a NUL byte in this much of a file's start: a binary file
_REAP_SECONDS: Final = 2.5  # the longest a tree takes to end once asked (a pipe holder reaped)
_GREP_OUTPUT: Final = 64 * _MiB  # the most a search's child may print (far past its caps)
_STATE_DIR: Final = ".agent_loop"  # in the root: the commands' HOME, TMPDIR, saved outputs
_SKIPPED_DIRS: Final = frozenset({".git"})  # find_files and grep do not walk into these
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_ENVIRONMENT: Final = frozenset(
    {"PATH", "LANG", "LANGUAGE", "TZ", "TERM", "USER", "LOGNAME", "SHELL"}
)  # with LC_*: what a command inherits; the caller's env= adds to it
_SECRET: Final = re.compile("KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
_NOT_SANDBOXED: Final = "not sandboxed"


class Workspace:
    """A directory and the tools that work inside it; a context manager (``close()``).

    ``root``: an existing directory, or None for a new temporary one (removed by
    ``close()``; a given root never is). ``limits``: every bound of the tools. ``env``:
    variables added to the commands' environment (which is otherwise an allowlist, without
    names holding KEY, TOKEN, SECRET or PASSWORD). ``sandbox``: "auto" runs commands under
    Landlock where the kernel has it, "require" raises RuntimeError where it does not,
    None never does. Raises TypeError or ValueError for a bad argument, naming it.
    """

    def __init__(
        self,
        root: Optional[str] = None,
        *,
        limits: Limits = Limits(),
        env: Optional[Mapping[str, str]] = None,
        sandbox: Optional[str] = "auto",
    ) -> None:
        if not isinstance(limits, Limits):
            raise TypeError(f"limits must be a Limits, got {type(limits).__name__}")
        if sandbox not in ("auto", "require", None):
            raise ValueError(f'sandbox must be "auto", "require" or None, got {sandbox!r}')
        extra = dict(env or {})
        if not all(
            isinstance(key, str) and isinstance(value, str) for key, value in extra.items()
        ):
            raise TypeError("env must map str names to str values")
        abi = _landlock_abi() if sandbox is not None else 0
        if sandbox == "require" and abi < 1:
            raise RuntimeError(
                "sandbox='require': this kernel offers no Landlock (Linux 5.13 or later, "
                "enabled in the LSM list); use sandbox='auto' to run commands unsandboxed"
            )
        self.limits = limits
        self.sandboxed = abi >= 1
        self._abi = abi
        self._made = root is None
        self.root = os.path.realpath(
            tempfile.mkdtemp(prefix="workspace-") if root is None else root
        )
        try:
            self._root_fd = os.open(self.root, _DIR_FLAGS)
        except OSError as error:  # a given root (a temporary one is a directory)
            raise ValueError(f"root must be a directory: {error}") from None
        self._root_parts = tuple(part for part in self.root.split("/") if part)
        self._env = _command_environment(os.environ, extra)
        self._lock = threading.Lock()  # writers and commands: one at a time
        self._live: Dict[subprocess.Popen[bytes], Optional[_Control]] = {}
        self._live_lock = threading.Lock()
        self._saved = 0  # the number of the last saved output
        self._closed = False
        self._shell = _shell()

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Ends every live process (and its tree); removes the root if the workspace made
        it. Idempotent."""
        with self._live_lock:
            live = list(self._live.items())
        for process, control in live:
            _end(process, control)
        if self._closed:
            return
        self._closed = True
        os.close(self._root_fd)
        if self._made:
            shutil.rmtree(self.root, ignore_errors=True)

    def tools(self) -> Tuple[al.Tool, ...]:
        """The seven tools, for a ToolRegistry; read-only ones annotated ``readOnlyHint``,
        the others ``destructiveHint`` and ``sequential``."""
        limits = self.limits
        sandbox = (
            "Sandboxed (Landlock): it can write only inside the workspace and to /dev/null"
            + (", and cannot open TCP connections" if self._abi >= 4 else "")
            + (" nor signal processes outside" if self._abi >= 6 else "")
            + "."
            if self.sandboxed
            else "Not sandboxed: it can do whatever this user can."
        )
        string = {"type": "string"}
        specs: List[Tuple[str, str, Dict[str, Any], List[str], Callable[..., str], bool]] = [
            (
                "read_file",
                f"Reads a text file of the workspace: a window of at most {limits.read_lines} "
                f"lines and {limits.read_bytes} bytes, each line numbered, from line `offset` "
                f"(1 first); lines over {limits.read_line_chars} characters are cut. A footer "
                "says how to read on.",
                {"path": string, "offset": {"type": "integer"}, "limit": {"type": "integer"}},
                ["path"],
                self._read_file,
                False,
            ),
            (
                "write_file",
                "Writes a whole file (creating its directories), replacing it atomically.",
                {"path": string, "content": string},
                ["path", "content"],
                self._write_file,
                True,
            ),
            (
                "edit_file",
                "Replaces exact text in a file: old_text must occur once (or replace_all).",
                {
                    "path": string,
                    "old_text": string,
                    "new_text": string,
                    "replace_all": {"type": "boolean"},
                },
                ["path", "old_text", "new_text"],
                self._edit_file,
                True,
            ),
            (
                "list_dir",
                f"Lists a directory (default the root), at most {limits.list_entries} entries.",
                {"path": string},
                [],
                self._list_dir,
                False,
            ),
            (
                "find_files",
                "Finds paths by a glob (* ? [..] within a name, ** across directories; a "
                f"pattern without / matches names at any depth), at most {limits.find_results}.",
                {"pattern": string, "path": string},
                ["pattern"],
                self._find_files,
                False,
            ),
            (
                "grep",
                "Searches file contents for a Python regular expression (or literal text), "
                f"at most {limits.grep_results} lines; glob filters the file names.",
                {
                    "pattern": string,
                    "path": string,
                    "glob": string,
                    "ignore_case": {"type": "boolean"},
                    "literal": {"type": "boolean"},
                },
                ["pattern"],
                self._grep,
                False,
            ),
            (
                "run_command",
                f"Runs a shell command in the workspace's root, stdin empty, for at most "
                f"timeout_s seconds (default {limits.timeout_s:g}, at most "
                f"{limits.max_timeout_s:g}). {sandbox}",
                {"command": string, "timeout_s": {"type": "number"}},
                ["command"],
                self._run_command,
                True,
            ),
        ]
        return tuple(
            al.Tool(
                name,
                description,
                {
                    "type": "object",
                    "properties": properties,
                    "required": required,
                    "additionalProperties": False,
                },
                _execute(function),
                sequential=changes,
                annotations={"readOnlyHint": False, "destructiveHint": True}
                if changes
                else {"readOnlyHint": True},
            )
            for name, description, properties, required, function, changes in specs
        )

    # --- Paths: components, walked from the root's descriptor -----------------------------

    def _parts(self, path: str) -> Tuple[str, ...]:
        """A path's components below the root, or a ToolError saying why it is refused."""
        if "\0" in path:
            raise al.ToolError(f"path {path!r} holds a NUL character: no file is named so")
        if len(path.encode("utf-8", "surrogatepass")) > self.limits.path_bytes:
            raise al.ToolError(
                f"path is over {self.limits.path_bytes} bytes (Limits.path_bytes): give a "
                "shorter one, relative to the workspace root"
            )
        if path.startswith("~"):
            raise al.ToolError(
                f"path {path!r} starts with ~, which is not expanded: give a path relative "
                "to the workspace root"
            )
        given = [part for part in path.split("/") if part not in ("", ".")]
        if path.startswith("/"):
            # Compared by component: /work/ab is not under /work/a.
            if tuple(given[: len(self._root_parts)]) != self._root_parts:
                raise al.ToolError(
                    f"path {path!r} is outside the workspace ({self.root}): give a path "
                    "relative to its root"
                )
            given = given[len(self._root_parts) :]
        parts: List[str] = []
        for part in given:
            if part == "..":
                if not parts:
                    raise al.ToolError(
                        f"path {path!r} goes above the workspace root with '..': the tools "
                        "reach only what is inside it"
                    )
                parts.pop()
            elif len(part.encode("utf-8", "surrogatepass")) > 255:
                raise al.ToolError(f"a component of path {path!r} is over 255 bytes (NAME_MAX)")
            else:
                parts.append(part)
        return tuple(parts)

    def _open_dir(self, parts: Sequence[str], create: bool = False) -> int:
        """The descriptor of the directory at ``parts``, walked from the root without
        following a link (made on the way when ``create``); a ToolError naming the step."""
        return _open_dir_at(self._root_fd, parts, create)

    def _open_file(self, path: str) -> Tuple[int, os.stat_result, str]:
        """A regular file opened for reading, its status and its shown path; a ToolError for
        anything else (a link, a directory, a FIFO, a device), without blocking."""
        parts = self._parts(path)
        shown = "/".join(parts)
        if not parts:
            raise al.ToolError("the path names the workspace root, a directory: use list_dir")
        directory = self._open_dir(parts[:-1])
        try:
            checked = _status(directory, parts[-1], shown)
            _require_regular(directory, parts[-1], checked, shown)
            try:
                # O_NONBLOCK: a FIFO swapped in after the check opens at once; fstat sees it.
                fd = os.open(parts[-1], _READ_FLAGS, dir_fd=directory)
            except OSError as error:
                raise _path_error(directory, parts[-1], shown, error) from None
        finally:
            os.close(directory)
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (
            checked.st_dev,
            checked.st_ino,
        ):
            os.close(fd)
            raise al.ToolError(f"{shown} changed while it was being opened: try again")
        return fd, opened, shown

    # --- read_file --------------------------------------------------------------------------

    def _read_file(
        self, path: str, signal: al.Signal, offset: int = 1, limit: Optional[int] = None
    ) -> str:
        """read_file's window: numbered lines from ``offset``, then a footer saying how to
        read on; a ToolError for a file that is binary, over the cap, or not a file."""
        limits = self.limits
        lines_wanted = limits.read_lines if limit is None else limit
        if not 1 <= lines_wanted <= limits.read_lines:
            raise al.ToolError(
                f"limit must be in 1..{limits.read_lines} (Limits.read_lines), got {limit}"
            )
        if offset < 1:
            raise al.ToolError(f"offset is a line number, 1 for the first line, got {offset}")
        fd, status, shown = self._open_file(path)
        with open(fd, "rb", buffering=_CHUNK) as file:
            if status.st_size > limits.read_file_bytes:
                raise al.ToolError(
                    f"{shown} is {status.st_size} bytes, over the {limits.read_file_bytes} "
                    "that read_file reads (Limits.read_file_bytes): search it with grep, or "
                    "show a part with run_command (head -c, tail -c, sed -n '10,20p')"
                )
            if b"\0" in _peek(file):
                raise al.ToolError(
                    f"{shown} is binary (a NUL byte in its first {_BINARY_PROBE} bytes): look "
                    "at it with run_command (od -c, xxd, file)"
                )
            return _window(file, shown, offset, lines_wanted, limits, signal)

    # --- write_file and edit_file ------------------------------------------------------------

    def _write_file(self, path: str, content: str, signal: al.Signal) -> str:
        """write_file: the whole content, replacing the file atomically."""
        data = self._argument_bytes("content", content)
        parts = self._file_parts(path)
        with self._exclusive(signal):
            _replace(self._root_fd, parts, data, signal)
        return f"wrote {len(data)} bytes to {'/'.join(parts)}"

    def _edit_file(
        self,
        path: str,
        old_text: str,
        new_text: str,
        signal: al.Signal,
        replace_all: bool = False,
    ) -> str:
        """edit_file: exact text replaced, once or everywhere; bytes around it unchanged."""
        old = self._argument_bytes("old_text", old_text)
        new = self._argument_bytes("new_text", new_text)
        if not old:
            raise al.ToolError("old_text is empty: give the exact text to replace")
        parts = self._file_parts(path)
        with self._exclusive(signal):
            fd, status, shown = self._open_file(path)
            with open(fd, "rb") as file:
                if status.st_size > self.limits.edit_file_bytes:
                    raise al.ToolError(
                        f"{shown} is {status.st_size} bytes, over the "
                        f"{self.limits.edit_file_bytes} that edit_file rewrites "
                        "(Limits.edit_file_bytes): edit it with run_command (sed -i)"
                    )
                data = _read_all(file, signal)
            places = _occurrences(data, old)
            if not places:
                raise al.ToolError(f"old_text was not found in {shown}{_near_match(data, old)}")
            if len(places) > 1 and not replace_all:
                raise al.ToolError(
                    f"old_text occurs {len(places)} times in {shown}, at "
                    f"{_line_list(data, places)}: add lines around it so that it occurs once, "
                    "or set replace_all"
                )
            _replace(self._root_fd, parts, data.replace(old, new), signal)
        count = len(places)
        noun = "occurrence" if count == 1 else "occurrences"
        return f"replaced {count} {noun} in {shown}, at {_line_list(data, places)}"

    def _argument_bytes(self, name: str, text: str) -> bytes:
        """An argument's UTF-8 bytes, refused past Limits.write_bytes."""
        data = text.encode("utf-8", "surrogateescape")
        if len(data) > self.limits.write_bytes:
            raise al.ToolError(
                f"{name} is {len(data)} bytes, over {self.limits.write_bytes} "
                "(Limits.write_bytes): write the file in parts with edit_file, or generate it "
                "with run_command"
            )
        return data

    def _file_parts(self, path: str) -> Tuple[str, ...]:
        parts = self._parts(path)
        if not parts:
            raise al.ToolError("the path names the workspace root, a directory")
        return parts

    @contextlib.contextmanager
    def _exclusive(self, signal: al.Signal) -> Iterator[None]:
        """Writers and commands one at a time, even across runs: waits, watching the signal."""
        while not self._lock.acquire(timeout=al.WATCH_SECONDS):
            if signal.is_set():
                raise al.ToolError("cancelled while waiting for another write or command")
        try:
            yield
        finally:
            self._lock.release()

    # --- list_dir, find_files, grep ------------------------------------------------------------

    def _list_dir(self, signal: al.Signal, path: str = ".") -> str:
        """list_dir: the entries of one directory, sorted; a footer when some are not shown."""
        parts = self._parts(path)
        shown = "/".join(parts) or "."
        directory = self._open_dir(parts)
        names: List[str] = []
        try:
            with os.scandir(directory) as entries:
                for count, entry in enumerate(entries, 1):
                    _watch(signal, count)
                    if count > self.limits.scan_entries:
                        names.append(f"[stopped after {self.limits.scan_entries} entries]")
                        break
                    names.append(_entry_line(directory, entry))
        finally:
            os.close(directory)
        names.sort()
        if not names:
            return f"{shown} is empty"
        shown_names = names[: self.limits.list_entries]
        footer = ""
        if len(names) > len(shown_names):
            footer = (
                f"\n[{len(names) - len(shown_names)} more entries not shown "
                "(Limits.list_entries): use find_files with a pattern]"
            )
        return "\n".join(shown_names) + footer

    def _find_files(self, pattern: str, signal: al.Signal, path: str = ".") -> str:
        """find_files: the paths under ``path`` that the glob matches, in walk order."""
        matcher = _glob(pattern)
        base = self._parts(path)
        found: List[str] = []
        walk = _Walk(self._root_fd, base, self.limits.scan_entries, signal)
        for _, relative, _ in walk:
            if matcher(relative):
                found.append(_joined(base, relative))
                if len(found) > self.limits.find_results:
                    break
        footer = ""
        if len(found) > self.limits.find_results:
            found.pop()
            footer = (
                f"\n[stopped at {self.limits.find_results} paths (Limits.find_results): "
                "narrow the pattern or give path=]"
            )
        footer += walk.footer()
        return ("\n".join(found) or f"no path matches {pattern!r}") + footer

    def _grep(
        self,
        pattern: str,
        signal: al.Signal,
        path: str = ".",
        glob: Optional[str] = None,
        ignore_case: bool = False,
        literal: bool = False,
    ) -> str:
        """grep: ``path:line: text`` for each matching line, found by a child process that
        is ended after Limits.grep_timeout_s or when the signal is set."""
        request = {
            "pattern": pattern,
            "base": list(self._parts(path)),
            "glob": glob,
            "ignore_case": ignore_case,
            "literal": literal,
            "limits": dataclasses.asdict(self.limits),
        }
        if glob is not None:
            _glob(glob)  # a bad glob is refused here, not in the child
        here = os.path.dirname(os.path.abspath(__file__))
        code = (
            "import sys; sys.path.insert(0, sys.argv[1]); import agent_loop_workspace as w; "
            "w._search_main(int(sys.argv[2]), sys.stdin, sys.stdout)"
        )
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", code, here, str(self._root_fd)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=(self._root_fd,),
            start_new_session=True,
        )
        self._track(process, None)
        try:
            assert process.stdin is not None
            assert process.stdout is not None
            process.stdin.write(json.dumps(request).encode())
            process.stdin.close()
            lines, ended = _read_search(process, self.limits.grep_timeout_s, signal)
        finally:
            _end(process)
            self._untrack(process)
        return _search_text(lines, ended, pattern, self.limits)

    # --- run_command ----------------------------------------------------------------------------

    def _run_command(
        self, command: str, signal: al.Signal, timeout_s: Optional[float] = None
    ) -> str:
        """run_command: the command's output (cut head and tail past the limits, the whole of
        it saved), its exit status, what was ended after it, and "not sandboxed" if so. A
        timeout or a cancel is a ToolError with the output so far."""
        limits = self.limits
        size = len(command.encode("utf-8", "surrogateescape"))
        if size > limits.command_bytes:
            raise al.ToolError(
                f"the command is {size} bytes, over {limits.command_bytes} "
                "(Limits.command_bytes): write a script with write_file and run it"
            )
        if "\0" in command:
            raise al.ToolError("the command holds a NUL character, which no argv can carry")
        seconds = limits.timeout_s if timeout_s is None else timeout_s
        if not 0 < seconds <= limits.max_timeout_s:
            raise al.ToolError(
                f"timeout_s must be above 0 and at most {limits.max_timeout_s:g} "
                f"(Limits.max_timeout_s), got {timeout_s}"
            )
        with self._exclusive(signal):
            return self._run(command, seconds, signal)

    def _run(self, command: str, seconds: float, signal: al.Signal) -> str:
        """Starts the supervisor, reads its output as it comes, ends its tree, and says how
        it went."""
        state = (_STATE_DIR,)
        for name in ("home", "tmp", "output"):
            os.close(self._open_dir((*state, name), create=True))
        env = dict(self._env)
        env.update(
            HOME=os.path.join(self.root, _STATE_DIR, "home"),
            TMPDIR=os.path.join(self.root, _STATE_DIR, "tmp"),
            PWD=self.root,
        )
        output = _Output(self)
        status_read, status_write = os.pipe()
        control_read, control_write = os.pipe()
        control = _Control(control_write)
        began = time.monotonic()
        try:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-S",
                    "-c",
                    _SUPERVISOR,
                    self._shell,
                    command,
                    str(self._root_fd),
                    str(status_write),
                    _ruleset(self._abi, self.sandboxed),
                ],
                stdin=control_read,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                pass_fds=(self._root_fd, status_write),
                env=env,
                start_new_session=True,
            )
        except BaseException:
            os.close(status_read)
            control.close()
            raise
        finally:
            os.close(status_write)
            os.close(control_read)
        self._track(process, control)
        try:
            outcome = _supervise(process, status_read, control, output, seconds, signal)
        finally:
            _end(process, control)
            self._untrack(process)
            control.close()
            os.close(status_read)
            output.close()
        return self._outcome_text(outcome, output, seconds, time.monotonic() - began)

    def _outcome_text(
        self, outcome: _Outcome, output: _Output, seconds: float, took: float
    ) -> str:
        """The result, or the ToolError, of a command from how it ended."""
        notes = []
        if outcome.error:
            raise al.ToolError(f"the command could not be started: {outcome.error}")
        if outcome.ended and not outcome.stopped:
            notes.append(
                f"[ended {outcome.ended} process{'es' if outcome.ended > 1 else ''} still "
                "running after the command exited (a background job, or one that held its "
                "output open)]"
            )
        notes.extend(output.notes())
        if not self.sandboxed:
            notes.append(f"[{_NOT_SANDBOXED}]")
        text = output.text()
        text = text[:-1] if text.endswith("\n") else text  # the status line follows
        if outcome.stopped:
            what = (
                f"the command did not end within {seconds:g} s (timeout_s) and was killed"
                if outcome.stopped == "timeout"
                else "cancelled: the command was killed"
            )
            raise al.ToolError("\n".join([f"{what}; its output so far:", text, *notes]))
        code = outcome.exit_status
        ended = (
            "exit status unknown"
            if code is None
            else f"exit status {code}"
            if code >= 0
            else f"killed by signal {-code}"
        )
        return "\n".join([text, f"[{ended}, after {took:.2f} s]", *notes])

    def _track(self, process: subprocess.Popen[bytes], control: Optional[_Control]) -> None:
        with self._live_lock:
            self._live[process] = control

    def _untrack(self, process: subprocess.Popen[bytes]) -> None:
        with self._live_lock:
            del self._live[process]

    def _save_file(self) -> Tuple[int, str]:
        """A new file for a command's whole output, in the state directory."""
        directory = self._open_dir((_STATE_DIR, "output"), create=True)
        try:
            while True:
                self._saved += 1
                name = f"command-{self._saved}.log"
                try:
                    fd = os.open(
                        name,
                        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                        0o644,
                        dir_fd=directory,
                    )
                except FileExistsError:
                    continue
                return fd, f"{_STATE_DIR}/output/{name}"
        finally:
            os.close(directory)


# --- What the tools use: paths -----------------------------------------------------------


def _execute(function: Callable[..., str]) -> Callable[[Dict[str, Any], Any], str]:
    """A Tool's execute for a method that takes the arguments by keyword and the signal."""

    def execute(arguments: Dict[str, Any], signal: Any) -> str:
        return function(signal=signal, **arguments)

    return execute


def _open_dir_at(root_fd: int, parts: Sequence[str], create: bool = False) -> int:
    """The directory at ``parts`` under ``root_fd``, each component opened with O_NOFOLLOW
    from its parent's descriptor (made first when ``create``); a ToolError naming the step."""
    fd = os.open(".", _DIR_FLAGS, dir_fd=root_fd)
    try:
        for index, part in enumerate(parts):
            try:
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o777, dir_fd=fd)
                following = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as error:
                raise _path_error(fd, part, "/".join(parts[: index + 1]), error) from None
            os.close(fd)
            fd = following
    except BaseException:
        os.close(fd)
        raise
    return fd


def _status(directory: int, name: str, shown: str) -> os.stat_result:
    """lstat of ``name`` in ``directory``, or the ToolError saying what is wrong."""
    try:
        return os.stat(name, dir_fd=directory, follow_symlinks=False)
    except OSError as error:
        raise _path_error(directory, name, shown, error) from None


def _require_regular(directory: int, name: str, status: os.stat_result, shown: str) -> None:
    """Only regular files are read or written: a link is never followed, a FIFO or a
    device could block or never end."""
    if stat.S_ISLNK(status.st_mode):
        raise _link_error(directory, name, shown)
    if stat.S_ISDIR(status.st_mode):
        raise al.ToolError(f"{shown} is a directory: use list_dir or find_files")
    if not stat.S_ISREG(status.st_mode):
        raise al.ToolError(
            f"{shown} is {_kind(status.st_mode)}: only regular files are read or written "
            "(it could block, or never end)"
        )


def _path_error(directory: int, name: str, shown: str, error: OSError) -> al.ToolError:
    """The ToolError for a step of a walk that failed: what is there, and what to do."""
    if error.errno == errno.ENOENT:
        return al.ToolError(
            f"{shown}: no such file or directory (list_dir or find_files show what there is)"
        )
    try:
        status = os.stat(name, dir_fd=directory, follow_symlinks=False)
    except OSError:
        return al.ToolError(f"{shown}: {error.strerror}")
    if stat.S_ISLNK(status.st_mode):
        return _link_error(directory, name, shown)
    return al.ToolError(f"{shown} is {_kind(status.st_mode)}: {error.strerror}")


def _link_error(directory: int, name: str, shown: str) -> al.ToolError:
    target = os.readlink(name, dir_fd=directory)
    return al.ToolError(
        f"{shown} is a symbolic link (to {target!r}): the tools never follow links; give the "
        "path it points to, if that is inside the workspace"
    )


def _kind(mode: int) -> str:
    """What a file is, in words."""
    for test, kind in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return kind
    return "a regular file"


def _joined(base: Sequence[str], relative: Sequence[str]) -> str:
    return "/".join(tuple(base) + tuple(relative))


def _watch(signal: al.Signal, count: int) -> None:
    """Directory work looks at the signal every _ENTRY_BATCH entries."""
    if count % _ENTRY_BATCH == 0 and signal.is_set():
        raise al.ToolError("cancelled")


# --- Reading and writing files ------------------------------------------------------------


def _lines(file: IO[bytes], keep: int, signal: al.Signal) -> Iterator[Tuple[bytes, bool]]:
    """Each line's first ``keep`` bytes and whether more of it was skipped; memory bounded
    by ``keep`` whatever the file, the signal seen every _CHUNK bytes."""
    unwatched = 0
    while True:
        line = file.readline(keep)
        if not line:
            return
        unwatched += len(line)
        skipped = False
        while not line.endswith(b"\n") and len(line) == keep:
            rest = file.readline(_CHUNK)  # the rest of a long line, read and dropped
            unwatched += len(rest)
            skipped = skipped or rest not in (b"", b"\n")
            if not rest or rest.endswith(b"\n"):
                break
            unwatched = _checked(signal)  # a whole chunk of the line was read
        if unwatched >= _CHUNK:
            unwatched = _checked(signal)
        yield line, skipped


def _checked(signal: al.Signal) -> int:
    if signal.is_set():
        raise al.ToolError("cancelled")
    return 0


def _window(
    file: IO[bytes], shown: str, offset: int, wanted: int, limits: Limits, signal: al.Signal
) -> str:
    """read_file's window: numbered lines from ``offset``, a footer saying how to read on."""
    out: List[str] = []
    size = 0
    number = 0
    more = False
    for number, (raw, skipped) in enumerate(
        _lines(file, limits.read_line_chars * 4 + 1, signal), 1
    ):
        if number < offset:
            continue
        if len(out) == wanted:
            more = True
            break
        text = raw.decode("utf-8", "replace").rstrip("\n")
        if skipped or len(text) > limits.read_line_chars:
            text = (
                text[: limits.read_line_chars]
                + f" [line cut at {limits.read_line_chars} characters (Limits.read_line_chars)]"
            )
        line = f"{number:>6}\t{text}"
        cost = len(line.encode()) + 1
        if out and size + cost > limits.read_bytes:
            more = True
            break
        out.append(line)
        size += cost
    if not out:
        if number == 0:
            return f"{shown} is empty"
        raise al.ToolError(f"offset {offset} is past the end of {shown} ({number} lines)")
    last = offset + len(out) - 1
    if more:
        footer = f"[lines {offset}-{last} shown; more follow: read_file offset={last + 1}]"
    else:
        footer = f"[end of {shown}, line {last}]"
    return "\n".join(out) + "\n" + footer


def _peek(file: IO[bytes]) -> bytes:
    """A file's first _BINARY_PROBE bytes, left to be read again (a BufferedReader's)."""
    return bytes(file.peek(_BINARY_PROBE)[:_BINARY_PROBE])  # type: ignore[attr-defined]


def _read_all(file: IO[bytes], signal: al.Signal) -> bytes:
    """A whole (capped) file, the signal seen between chunks."""
    chunks = []
    for chunk in iter(lambda: file.read(_CHUNK), b""):
        _checked(signal)
        chunks.append(chunk)
    return b"".join(chunks)


def _replace(root_fd: int, parts: Sequence[str], data: bytes, signal: al.Signal) -> None:
    """The file at ``parts`` becomes ``data`` at once: a temporary file beside it, then
    os.replace, so that a failed or cancelled write leaves the old file whole, and a hard
    link or a link swapped in is replaced, never written through."""
    shown = "/".join(parts)
    directory = _open_dir_at(root_fd, parts[:-1], create=True)
    try:
        try:
            status: Optional[os.stat_result] = os.stat(
                parts[-1], dir_fd=directory, follow_symlinks=False
            )
        except FileNotFoundError:
            status = None
        if status is not None:
            _require_regular(directory, parts[-1], status, shown)
        mode = 0o666 if status is None else stat.S_IMODE(status.st_mode)
        temporary = f".agent_loop-{secrets.token_hex(8)}.tmp"
        fd = os.open(
            temporary,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            mode,
            dir_fd=directory,
        )
        try:
            if status is not None:
                os.fchmod(fd, mode)  # the old file's mode, which the umask may have cut
            view = memoryview(data)
            while view:
                _checked(signal)
                view = view[os.write(fd, view[:_CHUNK]) :]
            os.fsync(fd)
            os.close(fd)
            fd = -1
            os.replace(temporary, parts[-1], src_dir_fd=directory, dst_dir_fd=directory)
        except BaseException as error:
            if fd >= 0:
                os.close(fd)
            os.unlink(temporary, dir_fd=directory)
            if isinstance(error, al.ToolError):
                raise al.ToolError(f"{error.message}: {shown} was left as it was") from None
            raise
    finally:
        os.close(directory)


def _occurrences(data: bytes, old: bytes) -> List[int]:
    """Where ``old`` occurs, left to right without overlap, as bytes.replace sees it."""
    places = []
    start = data.find(old)
    while start >= 0:
        places.append(start)
        start = data.find(old, start + len(old))
    return places


def _line_list(data: bytes, places: Sequence[int]) -> str:
    """The line numbers of byte offsets, the first 20 of them, in words."""
    numbers = []
    line, at = 1, 0
    for place in places[:20]:
        line += data.count(b"\n", at, place)
        at = place
        numbers.append(str(line))
    more = f" and {len(places) - 20} more" if len(places) > 20 else ""
    return ("line " if len(places) == 1 else "lines ") + ", ".join(numbers) + more


def _near_match(data: bytes, old: bytes) -> str:
    """A place where ``old`` occurs but for whitespace, said (never applied), or ""."""

    def squeezed(text: bytes) -> List[bytes]:
        return [b" ".join(line.split()) for line in text.split(b"\n")]

    wanted = squeezed(old)
    while wanted and not wanted[-1]:
        wanted.pop()
    while wanted and not wanted[0]:
        wanted.pop(0)
    if not wanted:
        return ""
    lines = squeezed(data)
    for index in range(len(lines) - len(wanted) + 1):
        if lines[index] == wanted[0] and lines[index : index + len(wanted)] == wanted:
            return (
                f"; lines {index + 1}-{index + len(wanted)} match it but for whitespace "
                "(nothing was changed): read_file them and copy the exact text"
            )
    return ""


# --- Listing and searching ----------------------------------------------------------------


def _entry_line(directory: int, entry: os.DirEntry[str]) -> str:
    """One list_dir line: name/, a link and its target, a name and what it is."""
    if entry.is_dir(follow_symlinks=False):
        return entry.name + "/"
    if entry.is_symlink():
        return f"{entry.name} -> {os.readlink(entry.name, dir_fd=directory)}"
    if entry.is_file(follow_symlinks=False):
        return entry.name
    return f"{entry.name} ({_kind(entry.stat(follow_symlinks=False).st_mode)})"


class _Walk:
    """The entries under ``base``, depth first in name order, each yielded with its
    directory's open descriptor; links are never followed, .git never entered, and no more
    than ``cap`` entries read."""

    def __init__(self, root_fd: int, base: Sequence[str], cap: int, signal: al.Signal) -> None:
        self.root_fd, self.base, self.cap, self.signal = root_fd, tuple(base), cap, signal
        self.scanned = 0
        self.unreadable = 0
        self.stopped = False

    def __iter__(self) -> Iterator[Tuple[int, Tuple[str, ...], os.DirEntry[str]]]:
        stack: List[Tuple[str, ...]] = [()]
        while stack:
            relative = stack.pop()
            try:
                fd = _open_dir_at(self.root_fd, self.base + relative)
            except al.ToolError:
                if not relative:
                    raise  # the base itself: the caller's path is wrong
                self.unreadable += 1  # swapped or removed since it was listed
                continue
            try:
                with os.scandir(fd) as entries:
                    listed = sorted(
                        (entry for _, entry in zip(range(self.cap - self.scanned + 1), entries)),
                        key=lambda entry: entry.name,
                    )
                below = []
                for entry in listed:
                    self.scanned += 1
                    _watch(self.signal, self.scanned)
                    if self.scanned > self.cap:
                        self.stopped = True
                        return
                    yield fd, (*relative, entry.name), entry
                    if entry.is_dir(follow_symlinks=False) and entry.name not in _SKIPPED_DIRS:
                        below.append((*relative, entry.name))
                stack.extend(reversed(below))
            finally:
                os.close(fd)

    def footer(self) -> str:
        notes = ""
        if self.stopped:
            notes += (
                f"\n[stopped after reading {self.cap} entries (Limits.scan_entries): "
                "give a narrower path=]"
            )
        if self.unreadable:
            notes += f"\n[{self.unreadable} directories changed or vanished during the walk]"
        return notes


_Token = Tuple[Any, ...]  # ("c", char), ("?",), ("*",), ("[", negated, ((low, high), ...))


def _glob(pattern: str) -> Callable[[Sequence[str]], bool]:
    """A glob as a test of a path's components: * ? [..] within a name, ** for any number
    of directories; without a /, the pattern tests the last name at any depth. Matched in
    time linear in the name for each pattern character (no backtracking regex)."""
    components = [part for part in pattern.split("/") if part not in ("", ".")]
    if not components or "\0" in pattern:
        raise al.ToolError(f"{pattern!r} is not a glob: give one such as *.py or src/**/*.c")
    compiled = [None if part == "**" else _glob_tokens(part) for part in components]
    if "/" not in pattern.strip("/"):
        only = compiled[0]
        return lambda parts: only is None or _matches_name(only, parts[-1])
    return lambda parts: _matches_path(compiled, parts)


def _glob_tokens(component: str) -> List[_Token]:
    tokens: List[_Token] = []
    index = 0
    while index < len(component):
        char = component[index]
        index += 1
        if char == "*":
            if not tokens or tokens[-1] != ("*",):
                tokens.append(("*",))
        elif char == "?":
            tokens.append(("?",))
        elif char == "[" and "]" in component[index + 1 :]:
            negated = component[index] in "!^"
            start = index + 1 if negated else index
            end = component.index("]", start + 1)
            body = component[start:end]
            ranges = []
            at = 0
            while at < len(body):
                if at + 2 < len(body) and body[at + 1] == "-":
                    ranges.append((body[at], body[at + 2]))
                    at += 3
                else:
                    ranges.append((body[at], body[at]))
                    at += 1
            tokens.append(("[", negated, tuple(ranges)))
            index = end + 1
        else:
            tokens.append(("c", char))
    return tokens


def _one(token: _Token, char: str) -> bool:
    if token[0] == "?":
        return True
    if token[0] == "c":
        return bool(token[1] == char)
    inside = any(low <= char <= high for low, high in token[2])
    return bool(inside != token[1])


def _matches_name(tokens: Sequence[_Token], name: str) -> bool:
    """A name against one component's tokens: greedy, back to the last * on a mismatch."""
    at = index = 0
    star, star_at = -1, 0
    while at < len(name):
        if index < len(tokens) and tokens[index] == ("*",):
            star, star_at = index, at
            index += 1
        elif index < len(tokens) and _one(tokens[index], name[at]):
            index += 1
            at += 1
        elif star >= 0:
            index, star_at = star + 1, star_at + 1
            at = star_at
        else:
            return False
    return all(token == ("*",) for token in tokens[index:])


def _matches_path(compiled: Sequence[Optional[List[_Token]]], parts: Sequence[str]) -> bool:
    """A path against components, where None (**) stands for any number of names."""

    def closure(states: Set[int]) -> Set[int]:
        more = set(states)
        for state in sorted(states):
            while state < len(compiled) and compiled[state] is None:
                state += 1
                more.add(state)
        return more

    states = closure({0})
    for part in parts:
        following: Set[int] = set()
        for state in states:
            if state < len(compiled):
                tokens = compiled[state]
                if tokens is None:
                    following.add(state)
                elif _matches_name(tokens, part):
                    following.add(state + 1)
        states = closure(following)
    return len(compiled) in states


def _search_main(root_fd: int, requests: IO[str], answers: IO[str]) -> None:
    """The grep child's main: the request (JSON) from ``requests``, each answer a JSON
    line on ``answers`` as it is found."""

    def emit(answer: Dict[str, Any]) -> None:
        answers.write(json.dumps(answer) + "\n")
        answers.flush()

    try:
        _search(root_fd, json.load(requests), emit)
    except al.ToolError as error:
        emit({"error": error.message})


def _search(root_fd: int, request: Dict[str, Any], emit: Callable[[Dict[str, Any]], None]) -> None:
    """grep's search (run in the child): a match, then "more" past the cap, then "end"."""
    limits = Limits(**request["limits"])
    text = request["pattern"]
    try:
        regex = re.compile(
            re.escape(text) if request["literal"] else text,
            re.IGNORECASE if request["ignore_case"] else 0,
        )
    except re.error as error:
        raise al.ToolError(
            f"the pattern is not a Python regular expression ({error}): fix it, or set "
            "literal=true to search for the text itself"
        ) from None
    base = tuple(request["base"])
    never = threading.Event()  # the parent ends this process; nothing to watch here
    wanted = None if request["glob"] is None else _glob(request["glob"])
    counts = {"binary": 0, "large": 0}
    found = 0
    walk = _Walk(root_fd, base, limits.scan_entries, never)
    for directory, name, shown in _search_files(root_fd, base, walk, wanted):
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=directory)
        except OSError:
            continue  # a link swapped in, or gone
        with open(fd, "rb", buffering=_CHUNK) as file:
            status = os.fstat(fd)
            if not stat.S_ISREG(status.st_mode):
                continue
            if status.st_size > limits.read_file_bytes:
                counts["large"] += 1
                continue
            if b"\0" in _peek(file):
                counts["binary"] += 1
                continue
            for number, (raw, _) in enumerate(_lines(file, _CHUNK, never), 1):
                line = raw.decode("utf-8", "replace").rstrip("\n")
                if regex.search(line):
                    found += 1
                    if found > limits.grep_results:
                        emit({"more": True})
                        return
                    if len(line) > limits.grep_line_chars:
                        line = line[: limits.grep_line_chars] + " [cut]"
                    emit({"match": [shown, number, line]})
    emit(dict(counts, end=walk.footer()))


def _search_files(
    root_fd: int,
    base: Tuple[str, ...],
    walk: _Walk,
    wanted: Optional[Callable[[Sequence[str]], bool]],
) -> Iterator[Tuple[int, str, str]]:
    """The files grep reads: (directory, name, shown path); ``base`` itself if a file."""
    if base:
        parent = _open_dir_at(root_fd, base[:-1])
        try:
            status = os.stat(base[-1], dir_fd=parent, follow_symlinks=False)
            if stat.S_ISREG(status.st_mode):
                yield parent, base[-1], "/".join(base)
                return
        except OSError:
            pass  # the walk says what is wrong with it
        finally:
            os.close(parent)
    for directory, relative, entry in walk:
        if entry.is_file(follow_symlinks=False) and (wanted is None or wanted(relative)):
            yield directory, entry.name, _joined(base, relative)


def _read_search(
    process: subprocess.Popen[bytes], seconds: float, signal: al.Signal
) -> Tuple[List[Dict[str, Any]], Optional[str]]:
    """The child's answers as they come, and why it was stopped (None: it finished)."""
    assert process.stdout is not None  # started with stdout=PIPE
    fd = process.stdout.fileno()
    buffer = bytearray()
    deadline = time.monotonic() + seconds
    ended: Optional[str] = None
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if signal.is_set():
                ended = "cancelled"
                break
            if left <= 0:
                ended = "timeout"
                break
            if selector.select(min(al.WATCH_SECONDS, left)):
                data = os.read(fd, _CHUNK)
                if not data:
                    break
                buffer += data
                if len(buffer) > _GREP_OUTPUT:
                    ended = "output"
                    break
    answers = []
    for line in bytes(buffer).splitlines():
        try:
            answers.append(json.loads(line))
        except ValueError:
            answers.append({"crash": line.decode("utf-8", "replace")})
    return answers, ended


def _search_text(
    answers: List[Dict[str, Any]], ended: Optional[str], pattern: str, limits: Limits
) -> str:
    """grep's result from the child's answers; a ToolError for an error, a timeout, a
    cancel or a child that died, with the lines found so far."""
    lines = [
        f"{path}:{number}: {text}"
        for path, number, text in (answer["match"] for answer in answers if "match" in answer)
    ]
    notes = []
    end = None
    for answer in answers:
        if "error" in answer:
            raise al.ToolError(answer["error"])
        if "more" in answer:
            notes.append(
                f"[stopped at {limits.grep_results} lines (Limits.grep_results): narrow "
                "the pattern, path= or glob=]"
            )
        if "end" in answer:
            end = answer
    crash = "\n".join(answer["crash"] for answer in answers if "crash" in answer)
    so_far = "\n".join(["; the lines found so far:", *lines]) if lines else ""
    if ended == "timeout":
        raise al.ToolError(
            f"the search did not end within {limits.grep_timeout_s:g} s "
            "(Limits.grep_timeout_s) and was stopped: a pattern that backtracks (nested "
            "repeats such as (a+)+) can take forever; simplify it, set literal=true, or "
            f"narrow path= or glob={so_far}"
        )
    if ended == "cancelled":
        raise al.ToolError(f"cancelled{so_far}")
    if crash or (end is None and not notes):
        raise al.ToolError(f"the search failed: {crash[-2000:] or 'its process ended early'}")
    if end is not None:
        for key, why in (("binary", "binary"), ("large", "over Limits.read_file_bytes")):
            if end[key]:
                notes.append(f"[{end[key]} files skipped: {why}]")
        notes.extend(note for note in end["end"].split("\n") if note)
    body = "\n".join(lines) if lines else f"no line matches {pattern!r}"
    return "\n".join([body, *notes])


# --- Commands -------------------------------------------------------------------------------


def _command_environment(environ: Mapping[str, str], extra: Mapping[str, str]) -> Dict[str, str]:
    """The allowlist of the caller's environment (never a name holding KEY, TOKEN, SECRET or
    PASSWORD), then what the caller passed (secrets too: its choice)."""
    env = {
        name: value
        for name, value in environ.items()
        if (name in _ENVIRONMENT or name.startswith("LC_")) and not _SECRET.search(name)
    }
    env.setdefault("PATH", os.defpath)
    env.update(extra)
    return env


_SYS_LANDLOCK_CREATE_RULESET: Final = 444  # the same number on every Linux architecture
_LANDLOCK_CREATE_RULESET_VERSION: Final = 1


def _landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where it has none (or this is not Linux)."""
    if not sys.platform.startswith("linux"):
        return 0
    syscall = ctypes.CDLL(None, use_errno=True).syscall
    syscall.restype = ctypes.c_long
    version = syscall(
        ctypes.c_long(_SYS_LANDLOCK_CREATE_RULESET),
        None,
        ctypes.c_size_t(0),
        ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION),
    )
    return max(int(version), 0)


# Landlock's access rights (linux/landlock.h), and the ABI version that brought each.
_FS_WRITES: Final = (
    (1 << 1, 1),  # WRITE_FILE
    (1 << 4, 1),  # REMOVE_DIR
    (1 << 5, 1),  # REMOVE_FILE
    (1 << 6, 1),  # MAKE_CHAR
    (1 << 7, 1),  # MAKE_DIR
    (1 << 8, 1),  # MAKE_REG
    (1 << 9, 1),  # MAKE_SOCK
    (1 << 10, 1),  # MAKE_FIFO
    (1 << 11, 1),  # MAKE_BLOCK
    (1 << 12, 1),  # MAKE_SYM
    (1 << 13, 2),  # REFER: renames and links across directories
    (1 << 14, 3),  # TRUNCATE
    (1 << 15, 5),  # IOCTL_DEV
)
_DEV_NULL_ACCESS: Final = (1 << 1) | (1 << 14) | (1 << 15)  # write, truncate, ioctl
_NET_TCP: Final = ((1 << 0) | (1 << 1), 4)  # BIND_TCP, CONNECT_TCP
_SCOPES: Final = ((1 << 0) | (1 << 1), 6)  # ABSTRACT_UNIX_SOCKET, SIGNAL


def _ruleset(abi: int, sandboxed: bool) -> str:
    """The supervisor's Landlock argument: handled fs, net and scopes, and what /dev/null
    may do ("" unsandboxed). Reads are not handled: a command reads what the user can."""
    if not sandboxed:
        return ""
    handled = sum(right for right, since in _FS_WRITES if abi >= since)
    net = _NET_TCP[0] if abi >= _NET_TCP[1] else 0
    scoped = _SCOPES[0] if abi >= _SCOPES[1] else 0
    return f"{handled} {net} {scoped} {handled & _DEV_NULL_ACCESS}"


def _shell() -> str:
    return shutil.which("bash") or "/bin/sh"


# The supervisor, run as `python -I -S -c _SUPERVISOR SHELL COMMAND ROOT_FD STATUS_FD RULES`
# in a new session, stdin the tool's control pipe. It becomes the child subreaper, restricts
# itself with Landlock (RULES: handled fs, net, scopes, /dev/null's rights; empty: none),
# forks SHELL -c COMMAND (stdin /dev/null, its own output the tool's pipe), says "exit N"
# on STATUS_FD when the shell ends, and at a byte (or the end) of its stdin ends every
# descendant with SIGKILL until it has no child, says "done K" (how many besides the shell)
# and exits. A string, not this module: the command should not wait for agent_loop's
# import, and nothing here may run in the tool's own process.
_SUPERVISOR: Final = r"""
import ctypes, os, select, signal, struct, sys, time
shell, command, root, status = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rules = [int(number) for number in sys.argv[5].split()]
L = ctypes.c_long
def say(line):
    os.write(status, line.encode() + b"\n")
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def check(result, what):
    if result < 0:
        number = ctypes.get_errno()
        say("error %s failed: %s" % (what, os.strerror(number)))
        sys.exit(125)
    return result
os.fchdir(root)
check(libc.prctl(L(36), L(1), L(0), L(0), L(0)), "prctl(PR_SET_CHILD_SUBREAPER)")
if rules:
    handled, net, scoped, null_access = rules
    attr = struct.pack("QQQ", handled, net, scoped)
    ruleset = check(libc.syscall(L(444), attr, L(len(attr)), L(0)), "landlock_create_ruleset")
    null = os.open("/dev/null", os.O_PATH | os.O_CLOEXEC)
    for fd, access in ((root, handled), (null, null_access)):
        rule = struct.pack("=Qi", access, fd)
        check(libc.syscall(L(445), L(ruleset), L(1), rule, L(0)), "landlock_add_rule")
    check(libc.prctl(L(38), L(1), L(0), L(0), L(0)), "prctl(PR_SET_NO_NEW_PRIVS)")
    check(libc.syscall(L(446), L(ruleset), L(0)), "landlock_restrict_self")
    os.close(ruleset)
    os.close(null)
wake, woken = os.pipe()
os.set_blocking(woken, False)
signal.signal(signal.SIGCHLD, lambda number, frame: None)
signal.set_wakeup_fd(woken)
pid = os.fork()
if pid == 0:
    try:
        signal.set_wakeup_fd(-1)
        for number in (signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(number, signal.SIG_DFL)
        empty = os.open("/dev/null", os.O_RDONLY)
        os.dup2(empty, 0)
        for fd in (empty, wake, woken, root, status):
            os.close(fd)
        os.execve(shell, [shell, "-c", command], os.environ)
    except BaseException as error:
        os.write(2, ("cannot run %s: %s\n" % (shell, error)).encode())
    os._exit(127)
sink = os.open("/dev/null", os.O_WRONLY)
os.dup2(sink, 1)
os.dup2(sink, 2)
os.close(sink)
def reap():
    while True:
        try:
            found, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if found == 0:
            return True
        if found == pid:
            say("exit %d" % (os.WEXITSTATUS(code) if os.WIFEXITED(code) else -os.WTERMSIG(code)))
def tree():
    children = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/" + name + "/stat", "rb") as file:
                    fields = file.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            children.setdefault(int(fields[1]), []).append((int(name), fields[0]))
    found, todo = [], [os.getpid()]
    while todo:
        for child, state in children.get(todo.pop(), ()):
            found.append((child, state))
            todo.append(child)
    return found
while True:
    ready = select.select([0, wake], [], [])[0]
    if wake in ready:
        os.read(wake, 4096)
    reap()
    if 0 in ready:
        break
ended = set()
deadline = time.monotonic() + 2.0
while reap() and time.monotonic() < deadline:
    for child, state in tree():
        if state != b"Z":
            try:
                os.kill(child, signal.SIGKILL)
                ended.add(child)
            except OSError:
                pass
    if select.select([wake], [], [], 0.01)[0]:
        os.read(wake, 4096)
say("done %d" % len(ended - {pid}))
"""


@dataclasses.dataclass
class _Outcome:
    """How a command ended, as the supervisor and the clock said."""

    exit_status: Optional[int] = None
    ended: int = 0  # processes ended after the shell exited
    stopped: Optional[str] = None  # "timeout" or "cancelled"
    error: Optional[str] = None  # the supervisor could not start the command


class _Control:
    """The supervisor's stdin: a byte (or its closing) ends the tree; safe from two threads."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.lock = threading.Lock()

    def end(self) -> None:
        with self.lock:
            if self.fd >= 0:
                with contextlib.suppress(OSError):
                    os.write(self.fd, b"k")

    def close(self) -> None:
        with self.lock:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1


class _Output:
    """A command's output as it comes: the head and the tail kept, the whole (up to the
    cap) written to a file in the workspace once it is longer than both."""

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace
        self.limits = workspace.limits
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.fd = -1
        self.saved_path = ""
        self.saved = 0

    def add(self, data: bytes) -> None:
        limits = self.limits
        self.total += len(data)
        room = limits.output_head_bytes - len(self.head)
        self.head += data[:room]
        self.tail += data[max(room, 0) :]
        if self.fd < 0 and not self.saved_path and self.total > self._shown_whole():
            self.fd, self.saved_path = self.workspace._save_file()
            self._save(bytes(self.head) + bytes(self.tail))  # all of it so far
        elif self.fd >= 0:
            self._save(data)
        if len(self.tail) > limits.output_tail_bytes + _CHUNK:
            del self.tail[: -limits.output_tail_bytes]

    def _shown_whole(self) -> int:
        return self.limits.output_head_bytes + self.limits.output_tail_bytes

    def _save(self, data: bytes) -> None:
        view = memoryview(data)[: self.limits.output_save_bytes - self.saved]
        while view:
            written = os.write(self.fd, view)
            self.saved += written
            view = view[written:]

    def text(self) -> str:
        if not self.total:
            return "(no output)"
        if self.total <= self._shown_whole():
            return (bytes(self.head) + bytes(self.tail)).decode("utf-8", "replace")
        tail = bytes(self.tail[-self.limits.output_tail_bytes :])
        cut = self.total - len(self.head) - len(tail)
        return (
            bytes(self.head).decode("utf-8", "replace")
            + f"\n[... {cut} bytes cut ...]\n"
            + tail.decode("utf-8", "replace")
        )

    def notes(self) -> List[str]:
        if not self.saved_path:
            return []
        whole = (
            "the whole of it is"
            if self.saved == self.total
            else f"its first {self.saved} bytes are (Limits.output_save_bytes)"
        )
        return [
            f"[the output was {self.total} bytes, cut to its first "
            f"{self.limits.output_head_bytes} and last {self.limits.output_tail_bytes}: "
            f"{whole} saved in {self.saved_path} (read_file, grep)]"
        ]

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _supervise(
    process: subprocess.Popen[bytes],
    status_fd: int,
    control: _Control,
    output: _Output,
    seconds: float,
    signal: al.Signal,
) -> _Outcome:
    """Reads the output and the supervisor's words until both end; asks for the tree's end
    on a timeout, a cancel, or once the shell has exited and the output is drained."""
    assert process.stdout is not None  # started with stdout=PIPE
    outcome = _Outcome()
    words = b""
    began = time.monotonic()
    exited: Optional[float] = None
    asked: Optional[float] = None
    output_open = True
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout.fileno(), selectors.EVENT_READ, "output")
        selector.register(status_fd, selectors.EVENT_READ, "status")
        while selector.get_map():
            now = time.monotonic()
            wait = al.WATCH_SECONDS
            if asked is None:
                if signal.is_set():
                    outcome.stopped = "cancelled"
                elif now >= began + seconds:
                    outcome.stopped = "timeout"
                if outcome.stopped or (
                    exited is not None
                    and (not output_open or now >= exited + output.limits.drain_s)
                ):
                    asked = now
                    control.end()
                else:
                    ends = [began + seconds] + (
                        [] if exited is None else [exited + output.limits.drain_s]
                    )
                    wait = max(0.0, min([wait] + [end - now for end in ends]))
            elif now >= asked + _REAP_SECONDS:
                break  # the supervisor did not end the tree: _end() kills it
            for key, _ in selector.select(wait):
                data = os.read(key.fd, _CHUNK)
                if not data:
                    selector.unregister(key.fd)
                    output_open = output_open and key.data != "output"
                elif key.data == "output":
                    output.add(data)
                else:
                    words += data
                    *lines, words = words.split(b"\n")
                    for line in lines:
                        word, _, value = line.decode().partition(" ")
                        if word == "exit":
                            outcome.exit_status = int(value)
                            exited = time.monotonic()
                        elif word == "done":
                            outcome.ended = int(value)
                        else:
                            outcome.error = value
    return outcome


def _end(process: subprocess.Popen[bytes], control: Optional[_Control] = None) -> None:
    """Ends a child: a supervisor through its control pipe (it ends its tree), then, or
    for a search, SIGKILL to its session; waits for it, bounded."""
    if control is not None:
        control.end()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(_REAP_SECONDS)
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, 9)
        process.wait(_REAP_SECONDS)
    if process.stdout is not None:
        process.stdout.close()
