"""Tests of agent_loop_session.py: a conversation in SQLite, turns of several runs."""

from __future__ import annotations

import contextlib
import io
import json
import os
import select
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Generator, List

import pytest

import agent_loop as al
import agent_loop_cli as cli
import agent_loop_context as ctx
import agent_loop_session as sessions
from loop_testing import echo_tool, stop, text, tool_turn
from loop_testing_providers import Reply, answer_parts, serving

REPOSITORY = Path(__file__).resolve().parent.parent
TOOLS = al.ToolRegistry([echo_tool()])


class Looping:
    """Calls echo ``calls`` times, then answers; its ids unique across every run."""

    def __init__(self, calls: int) -> None:
        self.calls = calls
        self.count = 0
        self.requests: List[al.ModelRequest] = []

    def stream(
        self, request: al.ModelRequest, signal: Any
    ) -> Generator[al.ModelChunk, None, al.ModelResponse]:
        self.count += 1
        self.requests.append(request)
        if self.count > self.calls:
            return (
                yield from al.ScriptedModel([stop(f"r{self.count}", "done")]).stream(
                    request, signal
                )
            )
        call = al.ToolCall(f"c{self.count}", "echo", {"text": "x"})
        scripted = tool_turn(f"r{self.count}", call)
        return (yield from al.ScriptedModel([scripted]).stream(request, signal))


def settle(turn: Generator[al.Event, None, al.RunResult], **options: Any) -> Any:
    return al.settle_run(turn, **options)


# --- A turn, stored --------------------------------------------------------------------


class TestTurns:
    def test_a_turn_is_stored_as_it_happens_and_a_reopened_session_goes_on(
        self, tmp_path: Path
    ) -> None:
        path = str(tmp_path / "chat.sqlite")
        with sessions.Session(path, "one") as session:
            events, result = settle(session.run("hi", model=Looping(1), tools=TOOLS))
            assert result.status == "completed"
            assert result.messages == session.messages
            assert [m.id for m in session.history()] == [
                "user-001",
                "message-r1",
                "tool-result-c1",
                "message-r2",
            ]
        with sessions.Session(path, "one") as again, sessions.Session(path, "two") as other:
            assert again.history() == result.messages
            assert again.turns == 1
            assert [e.to_dict() for e, _ in again.events(1)] == [e.to_dict() for e in events]
            # Timed as a log is: seconds since the run began (an hour is generous), not the
            # clock's count since 1970.
            assert all(t is not None and 0.0 <= t < 3600.0 for _, t in again.events(1))
            assert other.history() == ()
            assert other.turns == 0
            model = al.ScriptedModel([stop("r3", "again"), stop("r4", "and again")])
            given = al.UserMessage("user-003", "more")
            _, _second = settle(again.run(given, model=model, tools=TOOLS))
            assert model.requests[0].messages == (*result.messages, given)
            _, third = settle(again.run("most", model=model, tools=TOOLS))
            assert third.messages[-2] == al.UserMessage("user-003-2", "most")  # a new id
            assert third.messages == again.history()
            assert again.turns == 3

    @pytest.mark.parametrize(
        ("max_requests", "calls", "status", "runs"),
        [
            (64, 63, "completed", 1),
            (65, 64, "completed", 2),
            (70, 100, "maxSteps", 2),
            (1, 5, "maxSteps", 1),
        ],
        ids=["64-one-run", "65-two-runs", "budget-spent", "one-request"],
    )
    def test_past_64_requests_a_turn_goes_on_in_further_runs(
        self, max_requests: int, calls: int, status: str, runs: int
    ) -> None:
        model = Looping(calls)
        with sessions.Session() as session:
            events, result = settle(
                session.run("go", model=model, tools=TOOLS, max_requests=max_requests)
            )
        assert (result.status, result.steps) == (status, min(calls + 1, max_requests))
        assert result.max_steps == (max_requests if status == "maxSteps" else None)
        # A run begins at each event of sequence 0; each run's request ids from request-001.
        assert sum(event.sequence == 0 for event in events) == runs
        assert [r.id for r in model.requests].count("request-001") == runs
        assert result.messages == session.history()
        assert len(model.requests) == result.steps

    def test_the_turn_ends_as_its_last_run_and_the_next_resolves_what_it_left_open(self) -> None:
        signal = threading.Event()

        def cancel() -> bool:
            signal.set()
            return True

        with sessions.Session() as session:
            turn = session.run("go", model=Looping(5), tools=TOOLS, signal=signal)
            _, cancelled = settle(turn, on_event=lambda e: e.type == "tool.started" and cancel())
            assert cancelled.status == "cancelled"
            assert al.open_tool_calls(session.history())
            bad = type("Bad", (), {"stream": lambda self, request, signal: [1]})()
            _, failed = settle(session.run("again", model=bad, tools=TOOLS))
            assert failed.error is not None
            assert failed.error.code == "MODEL_PROTOCOL_ERROR"
            nothing = type("Nothing", (), {"stream": lambda self, request, signal: iter_none()})()
            _, failed = settle(session.run("and", model=nothing, tools=TOOLS))
            assert failed.error is not None
            assert failed.error.code == "MODEL_PROTOCOL_ERROR"
            resolved = session.history()[2]
            assert isinstance(resolved, al.ToolResultMessage)
            assert resolved.is_error
            assert resolved.content == sessions.INTERRUPTED
            assert session.turns == 3

    @pytest.mark.parametrize(
        ("call", "error"),
        [
            (lambda s: s.run(3, model=Looping(0), tools=TOOLS), TypeError),
            (
                lambda s: s.run(al.UserMessage("user-001", "x"), model=Looping(0), tools=TOOLS),
                ValueError,
            ),
            (lambda s: s.run(al.UserMessage("", "x"), model=Looping(0), tools=TOOLS), TypeError),
            (lambda s: s.run("x", model=Looping(0), tools=TOOLS, max_requests=0), ValueError),
            (lambda s: s.run("x", model=Looping(0), tools=TOOLS, max_requests=True), ValueError),
            (lambda s: s.run("x", model=Looping(0), tools=TOOLS, context=100), TypeError),
            (lambda s: s.run("x", model=Looping(0), tools=TOOLS, tool_concurrency=0), ValueError),
            (lambda s: s.run("x", model=Looping(0), tools=[]), TypeError),
            (lambda s: sessions.Session(session_id=""), ValueError),
        ],
        ids=[
            "message",
            "id-used",
            "id-empty",
            "zero-requests",
            "bool",
            "context",
            "loop-option",
            "tools",
            "session-id",
        ],
    )
    def test_a_bad_argument_raises_at_call_time_and_changes_nothing(
        self, call: Callable[[sessions.Session], Any], error: type
    ) -> None:
        with sessions.Session() as session:
            settle(session.run("first", model=Looping(0), tools=TOOLS))
            before = session.history()
            with pytest.raises(error):
                call(session)
            assert session.history() == before
            assert session.turns == 1
            settle(session.run("still free", model=Looping(0), tools=TOOLS))  # no lock kept
        with pytest.raises(ValueError, match="closed"):
            session.run("x", model=Looping(0), tools=TOOLS)


def iter_none() -> Generator[al.ModelChunk, None, None]:
    """A model's stream that returns no response."""
    yield from ()


# --- One turn at a time ------------------------------------------------------------------


def lock_row(path: str, host: str, pid: int) -> None:
    # sqlite3's context manager commits but does not close: closing() does.
    with contextlib.closing(sqlite3.connect(path)) as connection, connection:
        connection.execute(
            "INSERT OR REPLACE INTO agent_loop_locks VALUES ('default', 'someone', ?, ?)",
            (host, pid),
        )


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(30)
    return child.pid


class TestOneTurnAtATime:
    @pytest.mark.parametrize(
        ("hold", "busy"),
        [
            ("turn-of-another-session", True),
            ("turn-of-the-same-object", True),
            ("lock-on-another-host", True),
            ("lock-of-a-live-process", True),
            ("lock-of-another-users-process", True),
            ("lock-of-a-dead-process", False),
            ("turn-closed-before-it-began", False),
        ],
    )
    def test_a_second_owner_gets_session_busy_at_once_and_a_dead_owners_lock_is_taken_over(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hold: str, busy: bool
    ) -> None:
        path = str(tmp_path / "chat.sqlite")
        first, second = sessions.Session(path), sessions.Session(path)
        holding: Dict[str, Callable[[], Any]] = {
            "turn-of-another-session": lambda: first.run("a", model=Looping(0), tools=TOOLS),
            "turn-of-the-same-object": lambda: second.run("a", model=Looping(0), tools=TOOLS),
            "lock-on-another-host": lambda: lock_row(path, "elsewhere.invalid", os.getpid()),
            "lock-of-a-live-process": lambda: lock_row(path, os.uname().nodename, os.getppid()),
            "lock-of-another-users-process": lambda: lock_row(path, os.uname().nodename, 1),
            "lock-of-a-dead-process": lambda: lock_row(path, os.uname().nodename, dead_pid()),
            "turn-closed-before-it-began": lambda: first.run(
                "a", model=Looping(0), tools=TOOLS
            ).close(),
        }
        held = holding[hold]()
        if hold == "lock-of-another-users-process":
            monkeypatch.setattr(os, "kill", _raise(PermissionError()))
        if busy:
            with pytest.raises(sessions.SessionBusy):
                second.run("b", model=Looping(0), tools=TOOLS)
            assert second.history() in ((), first.history())  # nothing interleaved
        else:
            _, result = settle(second.run("b", model=Looping(0), tools=TOOLS))
            assert result.status == "completed"
        first.close()  # a turn still open gives its lock back
        if held is not None:
            held.close()  # the turn ends without the lock
        second.close()
        first.close()  # twice is harmless


def _raise(error: BaseException) -> Callable[..., Any]:
    def raiser(*arguments: Any) -> Any:
        raise error

    return raiser


CHILD = """
import sys, threading
sys.path[:0] = [{repository!r}, {tests!r}]
import agent_loop as al, agent_loop_session as sessions

def slow(arguments, signal):
    print("in the tool", flush=True)
    threading.Event().wait(60)  # killed long before
    return "late"

tool = al.Tool("slow", "Waits.", {{"type": "object"}}, slow)
call = al.ToolCall("c1", "slow", {{}})
model = al.ScriptedModel([al.scripted_response("r1", [call], "toolCall")])
with sessions.Session({path!r}) as session:
    al.settle_run(session.run("go", model=model, tools=al.ToolRegistry([tool])))
"""


class TestProcesses:
    def test_a_process_killed_mid_turn_leaves_its_last_message_and_the_next_owner_goes_on(
        self, tmp_path: Path
    ) -> None:
        path = str(tmp_path / "chat.sqlite")
        code = CHILD.format(repository=str(REPOSITORY), tests=str(REPOSITORY / "tests"), path=path)
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        try:
            assert child.stdout is not None
            ready, _, _ = select.select([child.stdout], [], [], 60)
            assert ready
            assert child.stdout.readline() == b"in the tool\n"
            with sessions.Session(path) as session:
                with pytest.raises(sessions.SessionBusy, match=str(child.pid)):
                    session.run("now", model=Looping(0), tools=TOOLS)
                child.kill()
                child.wait(30)
                # Reopened in this process: the dead owner's lock is taken over.
                _, result = settle(
                    session.run("after", model=al.ScriptedModel([stop("r2", "ok")]), tools=TOOLS)
                )
            assert result.status == "completed"
            ids = [message.id for message in result.messages]
            assert ids == ["user-001", "message-r1", "tool-result-c1", "user-002", "message-r2"]
            assert result.messages[2].content == sessions.INTERRUPTED
        finally:
            child.kill()
            child.wait(30)
            child.stdout.close()  # type: ignore[union-attr]


# --- The context ---------------------------------------------------------------------------


class TestContext:
    def test_folds_are_rows_beside_the_history_and_the_next_turn_starts_from_the_last(
        self, tmp_path: Path
    ) -> None:
        path = str(tmp_path / "chat.sqlite")
        window = ctx.ContextWindow(200, keep_recent_tokens=60)

        class Answering(Looping):
            """Answers at once, also the summary requests; reports output tokens only."""

            def stream(self, request: al.ModelRequest, signal: Any) -> Any:
                self.count += 1
                self.requests.append(request)
                usage = al.Usage(output_tokens=2)
                answer = al.scripted_response(
                    f"r{self.count}", [text("ok " * 5)], "stop", usage=usage
                )
                return al.ScriptedModel([answer]).stream(request, signal)

        answering = Answering(0)
        with sessions.Session(path) as session:
            for number in range(12):
                _, result = settle(
                    session.run(
                        f"turn {number} " * 5, model=answering, tools=TOOLS, context=window
                    )
                )
                assert result.status == "completed"
                assert result.messages == session.messages
            assert len(session.history()) == 24
            assert session.folds
            assert session.messages[0] == session.folds[-1].message()
            assert session.messages[1:] == session.history()[session.folds[-1].messages :]
            assert answering.requests[-1].messages[0].id.startswith("summary")
            assert session.folds[0].usage == al.Usage(output_tokens=2)  # the summary's
            folds, messages = session.folds, session.messages
        with sessions.Session(path) as again:
            assert again.folds == folds
            assert again.messages == messages
            ids = [fold.id for fold in folds]
            assert len(set(ids)) == len(ids)


# --- The command line: chat --session FILE ----------------------------------------------


class TestChatCommand:
    def test_chat_keeps_the_conversation_in_the_session_file(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        path = str(tmp_path / "chat.sqlite")
        with serving() as server:
            model = ["--provider", "openai", "--base-url", server.url + "/v1", "--model", "m"]
            chat = ["chat", "--session", path, *model, "--retries", "0"]
            server.script(
                *(Reply(answer_parts("openai", [words])) for words in ("Hello.", "Fine.", "Yes."))
            )
            assert cli.main([*chat, "Hi"]) == 0
            assert "completed after 1 step(s)" in capsys.readouterr().out
            monkeypatch.setattr(sys, "stdin", io.StringIO("How?\n\nAnd?\n"))
            assert cli.main([*chat, "--json", "--context-window", "10000", "-"]) == 0
            lines = capsys.readouterr().out.splitlines()
            assert [json.loads(line)["type"] for line in lines].count("run.finished") == 2
            # Timed as a log is: seconds since each run began (an hour is generous), not the
            # clock's count since 1970.
            assert all(0.0 <= json.loads(line)["time"] < 3600.0 for line in lines)
            sent = [(m["role"], m["content"]) for m in server.body(2)["messages"]]
            assert sent == [("user", "Hi"), ("assistant", "Hello."), ("user", "How?"),
                            ("assistant", "Fine."), ("user", "And?")]  # fmt: skip
            assert cli.main([*chat, "Again?"]) == 1  # no reply left: the turn fails
            with pytest.raises(SystemExit) as exited:
                cli.main([*chat, "--max-steps", "3", "Hi"])
            assert exited.value.code == 2
            assert "--max-requests N, not --max-steps" in capsys.readouterr().err
            lock_row(path, "elsewhere.invalid", 1)
            assert cli.main([*chat, "Hi"]) == 1
            assert (
                "chat: session 'default' is in a turn of another owner" in capsys.readouterr().err
            )
        with sessions.Session(path) as session:
            assert session.turns == 4
            assert len(session.history()) == 7
