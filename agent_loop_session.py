# agent_loop_session.py 1.0.0: conversations kept in SQLite, for agent_loop.py.
# One file, standard library only; copy it next to agent_loop.py, agent_loop_replay.py and
# agent_loop_context.py. Home: the agent_loop repository.
"""A conversation that outlives its process and the seed's 64 requests: ``Session``.

``Session(path, session_id)`` is one conversation kept in a SQLite file (the standard
library's ``sqlite3``, in WAL mode; many sessions share a file; ``":memory:"`` keeps it
in the process). ``session.run(message, model=..., tools=...)`` is one turn: the user's
message, then runs of ``run_agent_loop()`` until the turn ends.

Rules:

- A turn is one or more runs of the seed's loop, each at most 64 requests, its rules
  untouched: a run that ends ``maxSteps`` with requests of ``max_requests`` left is
  followed by another from the transcript it ended with, until a run completes, is
  cancelled or fails, or ``max_requests`` are spent (the turn ends ``maxSteps``). Each
  run's request ids start again at ``request-001``. The turn's events are the runs'
  events as each run numbered them: a run begins at each event of sequence 0 and ends
  with its ``run.finished``; the generator returns the turn's ``RunResult``, whose
  ``steps`` counts the turn's requests, ``usage`` sums its runs', ``messages`` is the
  session's transcript after the turn (``session.messages``), ``max_steps`` is
  ``max_requests`` when the turn ended ``maxSteps``.
- Every event and message is stored as it happens, before the consumer sees the event:
  the events as ``agent_loop_replay.json_line`` of ``to_dict()`` with ``"time"`` (the
  seconds since its run began, ``agent_loop_replay.event_seconds``), read back by
  ``agent_loop_replay.load_timed_events``; an assistant message at its response's first
  ``tool.started`` (or the run's end), a tool result with its ``tool.finished``.
- A process that dies mid-turn leaves the session at its last stored message. The next
  turn first resolves the calls it left open (or that a cancelled run left open), as
  the loop's rules ask: ``resolve_open_tool_calls(..., INTERRUPTED)``.
- One turn at a time: ``run()`` takes the session's lock row (its owner's host and pid)
  at once and holds it until the turn's generator ends or is closed; another owner gets
  ``SessionBusy`` at once, a lock whose owner's process is dead (same host) is taken over.
- With ``context=ContextWindow(...)``, every request of the turn goes through
  ``agent_loop_context.fit()``: each fold is a row beside the messages, never an edit of
  them; ``session.messages`` (what the next run starts from) is the last fold's summary
  and the messages after it; ``session.history()`` is still every message.

The store behind a session is a ``SessionStore`` (``SqliteStore`` by default): five
methods, so that a server database can stand in. This file uses only the public names of
``agent_loop``, ``agent_loop_replay`` and ``agent_loop_context``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sqlite3
import threading
import time
import uuid
from typing import (
    Any,
    Callable,
    Dict,
    Final,
    Generator,
    List,
    Optional,
    Protocol,
    Sequence,
    Set,
    Tuple,
    Union,
    cast,
)

import agent_loop as al
import agent_loop_context as context_
import agent_loop_replay as replay

__version__ = "1.0.0"

__all__ = ["Session", "SessionBusy", "SessionStore", "SqliteStore", "Row", "INTERRUPTED"]

INTERRUPTED: Final = (
    "the tool call was interrupted: the turn that made it ended before its result "
    "(its process died, or the run was cancelled)"
)
"""The error result a turn gives each call that an earlier turn left open."""

Row = Tuple[int, str, int, str]
"""A stored row: its position (increasing in the order of writing), its kind
(``"message"``, ``"event"``, ``"fold"``, ``"turn"``, ``"result"``), its turn, its line."""


class SessionBusy(Exception):
    """Another owner (another process, or another ``Session`` object) is in a turn of
    this session."""


class SessionStore(Protocol):
    """What a session needs of its store: rows of text per session, appended in order,
    and one lock per session. A row's line is one JSON line of agent_loop_replay."""

    def acquire(self, session_id: str, owner: str) -> None:
        """Takes the session's lock for ``owner`` at once, or raises SessionBusy when
        another owner that is still alive holds it (a dead owner's lock is taken over)."""

    def release(self, session_id: str, owner: str) -> None:
        """Gives the lock back if ``owner`` holds it."""

    def append(self, session_id: str, rows: Sequence[Tuple[str, int, str]]) -> int:
        """Writes the rows (kind, turn, line) at once, all or none, durably once it
        returns; returns the position of the last."""

    def read(
        self,
        session_id: str,
        kinds: Sequence[str],
        *,
        after: int = 0,
        turn: Optional[int] = None,
    ) -> List[Row]:
        """The session's rows of those kinds after position ``after`` (of that turn, if
        given), in order."""

    def close(self) -> None:
        """Releases what the store holds open."""


_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS agent_loop_rows (
    position INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    turn INTEGER NOT NULL,
    line TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS agent_loop_rows_by_kind
    ON agent_loop_rows (session_id, kind, position);
CREATE INDEX IF NOT EXISTS agent_loop_rows_by_turn
    ON agent_loop_rows (session_id, turn, kind);
CREATE TABLE IF NOT EXISTS agent_loop_locks (
    session_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL
);
"""

_BUSY_SECONDS: Final = 10.0
"""How long a write waits for another connection's write to the file to end (SQLite's
busy timeout): a row is a short transaction, so this is a bound, never the usual case."""


class SqliteStore:
    """The default store: a SQLite file (``":memory:"``: in this process only) in WAL
    mode, every append a transaction synced to disk. The lock row names its owner's host
    and pid: a lock whose process no longer runs on this host is taken over; a lock held
    from another host is never taken over (delete its row once that host is gone)."""

    def __init__(self, path: str = ":memory:") -> None:
        self._connection = sqlite3.connect(
            path, timeout=_BUSY_SECONDS, isolation_level=None, check_same_thread=False
        )
        self._mutex = threading.Lock()  # one statement at a time on the connection
        self._connection.execute("PRAGMA journal_mode=WAL")
        self._connection.execute("PRAGMA synchronous=FULL")
        self._connection.executescript(_SCHEMA)

    def acquire(self, session_id: str, owner: str) -> None:
        host, pid = socket.gethostname(), os.getpid()
        with self._mutex:
            self._connection.execute("BEGIN IMMEDIATE")
            try:
                held = self._connection.execute(
                    "SELECT owner, host, pid FROM agent_loop_locks WHERE session_id = ?",
                    (session_id,),
                ).fetchone()
                if held is not None and held[0] != owner and _alive(held[1], held[2]):
                    raise SessionBusy(
                        f"session {session_id!r} is in a turn of another owner (process "
                        f"{held[2]} on {held[1]!r}): one turn at a time"
                    )
                self._connection.execute(
                    "INSERT OR REPLACE INTO agent_loop_locks VALUES (?, ?, ?, ?)",
                    (session_id, owner, host, pid),
                )
                self._connection.execute("COMMIT")
            except BaseException:
                self._connection.execute("ROLLBACK")
                raise

    def release(self, session_id: str, owner: str) -> None:
        with self._mutex:
            self._connection.execute(
                "DELETE FROM agent_loop_locks WHERE session_id = ? AND owner = ?",
                (session_id, owner),
            )

    def append(self, session_id: str, rows: Sequence[Tuple[str, int, str]]) -> int:
        with self._mutex, self._connection:  # one transaction
            self._connection.execute("BEGIN")
            cursor = self._connection.executemany(
                "INSERT INTO agent_loop_rows (session_id, kind, turn, line) VALUES (?, ?, ?, ?)",
                [(session_id, kind, turn, line) for kind, turn, line in rows],
            )
            position = cursor.execute("SELECT last_insert_rowid()").fetchone()[0]
        return cast(int, position)

    def read(
        self,
        session_id: str,
        kinds: Sequence[str],
        *,
        after: int = 0,
        turn: Optional[int] = None,
    ) -> List[Row]:
        marks = ", ".join("?" for _ in kinds)
        query = (
            "SELECT position, kind, turn, line FROM agent_loop_rows WHERE session_id = ? "
            f"AND kind IN ({marks}) AND position > ?"
        )
        arguments: List[object] = [session_id, *kinds, after]
        if turn is not None:
            query += " AND turn = ?"
            arguments.append(turn)
        with self._mutex:
            return self._connection.execute(query + " ORDER BY position", arguments).fetchall()

    def close(self) -> None:
        with self._mutex:
            self._connection.close()


def _alive(host: str, pid: int) -> bool:
    """Whether the process that holds a lock may still run: on another host, always."""
    if host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)  # no signal: asks whether the process exists
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: another user's process, which runs
        pass
    return True


class Session:
    """One conversation, kept in a store (see the module's doc).

    ``Session(path=":memory:", session_id="default", *, store=None)``: the SQLite file
    (created if missing) or, given, another ``SessionStore``. ``messages`` is the
    transcript the next turn starts from, ``history()`` every message ever added,
    ``turns`` the number of turns begun, ``folds`` the context folds made (each one's
    ``messages`` counts the history messages its summary stands for), ``events(turn)``
    a turn's stored events with their times. A context manager: ``close()`` at the end.
    """

    def __init__(
        self,
        path: str = ":memory:",
        session_id: str = "default",
        *,
        store: Optional[SessionStore] = None,
    ) -> None:
        if type(session_id) is not str or not session_id:
            raise ValueError(f"session_id must be a non-empty str, got {session_id!r}")
        self.session_id = session_id
        self._store: SessionStore = SqliteStore(path) if store is None else store
        self._history: List[al.Message] = []
        self._ids: Set[str] = set()  # every message, call and summary id in use
        self._folds: List[context_.Fold] = []
        self._turns = 0
        self._read = 0  # the position of the last row read or written
        self._owner: Optional[str] = None  # set while this object is in a turn
        self._closed = False
        self._load()

    # --- What the session holds -----------------------------------------------------

    @property
    def messages(self) -> Tuple[al.Message, ...]:
        """The transcript the next turn starts from: every message, or with folds, the
        last fold's summary and the messages after it."""
        if not self._folds:
            return tuple(self._history)
        fold = self._folds[-1]
        return (fold.message(), *self._history[fold.messages :])

    def history(self) -> Tuple[al.Message, ...]:
        """Every message ever added, in order, folds aside."""
        return tuple(self._history)

    @property
    def turns(self) -> int:
        """The number of turns begun in this session (an interrupted one too)."""
        return self._turns

    @property
    def folds(self) -> Tuple[context_.Fold, ...]:
        """The folds of the session's context, in order."""
        return tuple(self._folds)

    def events(self, turn: int) -> List[Tuple[al.Event, Optional[float]]]:
        """Turn ``turn``'s stored events (each run's from sequence 0) and their times."""
        rows = self._store.read(self.session_id, ("event",), turn=turn)
        return replay.load_timed_events(line + "\n" for _, _, _, line in rows)

    # --- A turn -----------------------------------------------------------------------

    def run(
        self,
        message: Union[str, al.UserMessage],
        *,
        model: al.Model,
        tools: al.ToolRegistry,
        max_requests: int = al.MAX_AGENT_STEPS,
        signal: Optional[al.Signal] = None,
        tool_concurrency: int = 1,
        before_tool_call: Optional[Callable[[al.ToolCall, Any], Optional[str]]] = None,
        context: Optional[context_.ContextWindow] = None,
    ) -> Generator[al.Event, None, al.RunResult]:
        """Begins one turn: ``message`` (a str is a user message with a new id), then runs
        of ``run_agent_loop()`` with these options; returns the turn's generator of
        events, which returns the turn's RunResult (see the module's doc).

        Raises now: TypeError or ValueError for an option ``run_agent_loop()`` refuses or
        a bad ``message``, ``max_requests`` or ``context``; SessionBusy when another
        owner is in a turn; ValueError once the session is closed.
        """
        if self._closed:
            raise ValueError("the session is closed")
        if type(max_requests) is not int or max_requests < 1:
            raise ValueError(f"max_requests must be an int >= 1, got {max_requests!r}")
        if context is not None and not isinstance(context, context_.ContextWindow):
            raise TypeError(
                f"context must be None or a ContextWindow, got {type(context).__name__}"
            )
        # The loop's own checks of its options, now: a run built and never started.
        al.run_agent_loop(
            messages=(),
            model=model,
            tools=tools,
            max_steps=1,
            signal=signal,
            tool_concurrency=tool_concurrency,
            before_tool_call=before_tool_call,
        ).close()
        options = {
            "tools": tools,
            "signal": signal,
            "tool_concurrency": tool_concurrency,
            "before_tool_call": before_tool_call,
        }
        turn = self._turn(message, model, max_requests, context, options)
        next(turn)  # takes the lock (or raises SessionBusy) and holds it until the turn ends
        return turn

    def _turn(
        self,
        message: Union[str, al.UserMessage],
        model: al.Model,
        max_requests: int,
        context: Optional[context_.ContextWindow],
        options: Dict[str, Any],
    ) -> Generator[al.Event, None, al.RunResult]:
        """The turn: the lock, the user's message, then runs until the turn ends."""
        if self._owner is not None:
            raise SessionBusy(f"session {self.session_id!r} is in a turn of this Session object")
        owner = f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex}"
        self._store.acquire(self.session_id, owner)
        self._owner = owner
        try:
            self._load()  # what other owners added since
            user = self._user_message(message)
            yield cast(al.Event, None)  # primed by run(): from here, close() releases the lock
            number = self._turns + 1
            self._append([("turn", number, replay.json_line({"turn": number}))])
            self._turns = number
            # Seed: a transcript with an open call cannot start a run; the turn resolves them.
            history = tuple(self._history)
            resolved = al.resolve_open_tool_calls(history, INTERRUPTED)[len(history) :]
            self._add_messages(number, [*resolved, user])
            results: List[al.RunResult] = []
            requests = 0
            while True:
                run = self._run(
                    number,
                    model,
                    min(al.MAX_AGENT_STEPS, max_requests - requests),
                    context,
                    options,
                )
                result = yield from run
                results.append(result)
                requests += result.steps
                if result.status != "maxSteps" or requests >= max_requests:
                    break
            turn_result = self._turn_result(results, requests, max_requests)
            summary = {k: v for k, v in turn_result.to_dict().items() if k != "messages"}
            self._append([("result", number, replay.json_line(summary))])
            return turn_result
        finally:
            self._release(owner)

    def _release(self, owner: str) -> None:
        """The turn's end: its lock given back, unless close() gave it back already."""
        if self._owner == owner:
            self._owner = None
            self._store.release(self.session_id, owner)

    def _run(
        self,
        turn: int,
        model: al.Model,
        max_steps: int,
        context: Optional[context_.ContextWindow],
        options: Dict[str, Any],
    ) -> Generator[al.Event, None, al.RunResult]:
        """One run of the turn, from ``messages``: stores each event and message as it comes."""
        start = self.messages
        if context is not None:
            offset = len(self._history) - len(start)
            model = context_.fit(
                model,
                context,
                taken=self._ids,
                on_fold=lambda fold: self._add_fold(turn, fold, offset),
            )
        kept = replay.KeptModel(model)
        run = al.run_agent_loop(messages=start, model=kept, max_steps=max_steps, **options)
        began = time.time()  # each run's lines are timed from its start, as a log's are
        added = 0  # messages of this run stored so far

        def stored(event: al.Event) -> None:
            nonlocal added
            messages: List[al.Message] = []
            # At a response's first tool.started the loop has appended its message (taken
            # once: None at its other calls).
            response = kept.take_response() if event.type == "tool.started" else None
            if response is not None:
                messages.append(
                    al.AssistantMessage(
                        al.assistant_message_id(response.id),
                        response.content,
                        response.usage,
                        response.provider_response_id,
                    )
                )
            elif event.type == "tool.finished":
                messages.append(event.payload["tool_result"])
            elif event.type == "run.finished":
                messages.extend(event.payload["result"].messages[len(start) + added :])
            added += len(messages)
            line = dict(event.to_dict(), time=replay.event_seconds(event, began))
            self._append(
                [("event", turn, replay.json_line(line))]
                + [("message", turn, replay.json_line(m.to_dict())) for m in messages],
                messages,
            )

        return (yield from replay.passed_on(run, stored))

    def _turn_result(
        self, results: List[al.RunResult], requests: int, max_requests: int
    ) -> al.RunResult:
        """The turn's result: the last run's, over the whole turn."""
        last = results[-1]
        usage: Optional[al.Usage] = None
        for result in results:
            if result.usage is not None:
                usage = result.usage if usage is None else usage + result.usage
        return dataclasses.replace(
            last,
            messages=self.messages,
            steps=requests,
            max_steps=max_requests if last.status == "maxSteps" else None,
            request_sequence_start=0,
            usage=usage,
        )

    def _user_message(self, message: Union[str, al.UserMessage]) -> al.UserMessage:
        """The turn's user message: a str gets a new id; a message's id must be new."""
        if type(message) is str:
            base = f"user-{self._turns + 1:03d}"
            free = base
            suffix = 1
            while free in self._ids:
                suffix += 1
                free = f"{base}-{suffix}"
            return al.UserMessage(free, message)
        if type(message) is not al.UserMessage:
            raise TypeError(
                f"message must be a str or a UserMessage, got {type(message).__name__}"
            )
        if type(message.id) is not str or not message.id or type(message.content) is not str:
            raise TypeError(
                f"message must have a non-empty str id and str content, got {message!r}"
            )
        if message.id in self._ids:
            raise ValueError(f"message id {message.id!r} is used in the session already")
        return message

    # --- The store ----------------------------------------------------------------------

    def _append(
        self, rows: List[Tuple[str, int, str]], messages: Sequence[al.Message] = ()
    ) -> None:
        """Writes rows; the messages among them join the history."""
        self._read = self._store.append(self.session_id, rows)
        for message in messages:
            self._remember(message)

    def _add_messages(self, turn: int, messages: Sequence[al.Message]) -> None:
        rows = [("message", turn, replay.json_line(message.to_dict())) for message in messages]
        self._append(rows, messages)

    def _add_fold(self, turn: int, fold: context_.Fold, offset: int) -> None:
        """A fold of this run's context: its summary stands for history messages."""
        # The run began with the history from ``offset + 1`` on after the previous summary,
        # or with all of it (offset 0): the fold's first messages end at history offset + n.
        fold = dataclasses.replace(fold, messages=offset + fold.messages)
        self._read = self._store.append(self.session_id, [("fold", turn, _fold_line(fold))])
        self._folds.append(fold)
        self._ids.add(fold.id)

    def _remember(self, message: al.Message) -> None:
        self._history.append(message)
        self._ids.add(message.id)
        if isinstance(message, al.AssistantMessage):
            self._ids.update(b.id for b in message.content if isinstance(b, al.ToolCall))

    def _load(self) -> None:
        """Reads the rows added since the last read (by this object or another owner)."""
        rows = self._store.read(self.session_id, ("message", "fold", "turn"), after=self._read)
        for position, kind, turn, line in rows:
            data = json.loads(line)
            if kind == "message":
                self._remember(al.message_from_dict(data))
            elif kind == "fold":
                fold = _fold_from_dict(data)
                self._folds.append(fold)
                self._ids.add(fold.id)
            else:
                self._turns = max(self._turns, turn)
            self._read = position

    def close(self) -> None:
        """Ends the session's use of its store (a turn still open gives its lock back)."""
        if not self._closed:
            self._closed = True
            if self._owner is not None:
                self._release(self._owner)
            self._store.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _fold_line(fold: context_.Fold) -> str:
    data: Dict[str, Any] = {
        "id": fold.id,
        "summary": fold.summary,
        "messages": fold.messages,
        "tokensBefore": fold.tokens_before,
        "tokensAfter": fold.tokens_after,
        "requestId": fold.request_id,
        "usage": None if fold.usage is None else fold.usage.to_dict(),
    }
    return replay.json_line(data)


_USAGE_KEYS: Final = (
    ("input_tokens", "input"),
    ("output_tokens", "output"),
    ("cache_read_tokens", "cacheRead"),
    ("cache_write_tokens", "cacheWrite"),
    ("reasoning_tokens", "reasoning"),
)


def _fold_from_dict(data: Dict[str, Any]) -> context_.Fold:
    usage = data.get("usage")
    return context_.Fold(
        data["id"],
        data["summary"],
        data["messages"],
        data["tokensBefore"],
        data["tokensAfter"],
        data["requestId"],
        None if usage is None else al.Usage(**{name: usage.get(key) for name, key in _USAGE_KEYS}),
    )
