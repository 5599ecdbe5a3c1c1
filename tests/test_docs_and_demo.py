"""The checks that are not unit tests of one module: the README (its python blocks run,
alone and together, and pass mypy --strict; its API table names exactly ``__all__``;
it states the id rules; the Anthropic request it shows is what the adapter sends;
nothing refers outside the repository), the demonstration, run as a user runs it, and
``print_event``, the printer that the demonstration and the command line share.

``print_event`` is tested line by line: the exact line for each event type, each kind of
message, chunk and result, and for text that would break the line.
The demonstration is exercised only through its command line, ``python agent_loop.py``,
and only for what its help and the README promise: one print_event line per event, the
result last; ``--json`` lines that event_from_dict reads and that replay exactly;
``--max-steps N``; ``--cancel-after K``; ``--help``; a usage message and exit status 2
for a bad option; the same output every time. Its exact wording is pinned only where the
README shows it. run_demo() runs it in this process through runpy (so that coverage sees
it); a few tests start a real process. `tox -e type` runs the mypy check of the README
blocks (``-k mypy_strict``); where mypy is not installed it is skipped.
"""

from __future__ import annotations

import ast
import configparser
import io
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, List, NamedTuple, Optional

import pytest

import agent_loop as al
import agent_loop_providers as providers
import agent_loop_replay as alr
from loop_invariants import check_run
from loop_testing import (
    DOCUMENTS,
    REPOSITORY,
    documentation,
    json_lines,
    read_json_lines,
    run,
    settle,
    text,
    types_of,
)
from loop_testing_providers import SPECS, request

# --- The public names ---------------------------------------------------------------------


# Every public name the README documents, section by section.
API_NAMES = [
    # Entry point
    "run_agent_loop",
    "settle_run",
    "print_event",
    "Signal",
    # Message IR
    "TextBlock",
    "ThinkingBlock",
    "ToolCall",
    "UserMessage",
    "AssistantMessage",
    "ToolResultMessage",
    "Message",
    "JSON",
    "text_from_assistant",
    # Model boundary
    "Model",
    "ModelRequest",
    "ModelChunk",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallChunk",
    "ModelResponse",
    "Usage",
    "StopReason",
    "check_stream_agreement",
    # Tools
    "Tool",
    "ToolRegistry",
    "ToolSpec",
    "execute_tool_call",
    "current_tool_call",
    "ToolError",
    # Events and results
    "Event",
    "RunResult",
    "RunError",
    "RunStatus",
    "FailureCode",
    "EventType",
    # Ids
    "request_id",
    "request_number",
    "assistant_message_id",
    "response_id_of",
    "tool_result_id",
    # Limits
    "MAX_AGENT_STEPS",
    "MAX_INITIAL_MESSAGES",
    "MAX_STEP_CHUNKS",
    "MAX_STEP_TEXT",
    "MAX_ASSISTANT_BLOCKS",
    "MAX_ARGUMENT_DEPTH",
    "MAX_ARGUMENT_VALUES",
    "MAX_ARGUMENT_SLOTS",
    "MAX_ARGUMENT_TEXT",
    # Test helpers
    "ScriptedModel",
    "ScriptedResponse",
    "scripted_response",
    # Interop, replay and resumption
    "message_from_dict",
    "event_from_dict",
    "open_tool_calls",
    "resolve_open_tool_calls",
    "WATCH_SECONDS",
]


MOVED_TO_REPLAY = {"replay", "ReplayedRun"}
"""Names that agent_loop_replay.py holds since 1.2; a copy of agent_loop.py from before
the move still lists them in its __all__ (and forwards them)."""


class TestPublicNames:
    """__all__ holds exactly the public names the README documents."""

    def test_all_is_exactly_the_names_listed_here(self) -> None:
        assert len(al.__all__) == len(set(al.__all__))
        assert set(al.__all__) - MOVED_TO_REPLAY == set(API_NAMES)

    def test_the_readme_api_table_names_exactly_all(self) -> None:
        """The README's "The API at a glance" documents every public name, and no other
        name of the module."""
        readme = (REPOSITORY / "README.md").read_text(encoding="utf-8")
        section = readme.split("## The API at a glance\n", 1)[1].split("\n## ", 1)[0]
        table = [line for line in section.splitlines() if line.startswith("| ")]
        named = set(re.findall(r"`([A-Za-z_][A-Za-z_0-9]*)", "\n".join(table)))
        assert {name for name in named if hasattr(al, name)} == set(al.__all__)

    @pytest.mark.parametrize("name", API_NAMES)
    def test_every_public_name_exists(self, name: str) -> None:
        assert hasattr(al, name)

    def test_version_is_a_str(self) -> None:
        assert isinstance(al.__version__, str)
        assert al.__version__


# --- The printer ------------------------------------------------------------------------

CALL = al.ToolCall("call-add-001", "add", {"left": 20, "right": 22})
RESULT = al.ToolResultMessage(
    "tool-result-call-add-001", "call-add-001", "add", '{"sum":42}', False
)
ASKED = al.UserMessage("user-001", "Add 20 and 22.")
ANSWERED = al.AssistantMessage("message-response-001", [CALL])


def finished(
    status: Any,
    messages: Any = (ASKED, ANSWERED, RESULT),
    usage: Optional[al.Usage] = None,
    error: Optional[al.RunError] = None,
) -> al.Event:
    """A run.finished event (sequence 9) whose result is one step long."""
    max_steps = 1 if status == "maxSteps" else None
    result = al.RunResult(status, messages, 1, max_steps=max_steps, error=error, usage=usage)
    return al.Event(9, "run.finished", {"result": result})


def printed(event: al.Event) -> str:
    """What print_event writes for event."""
    file = io.StringIO()
    al.print_event(event, file)
    return file.getvalue()


class TestPrintEvent:
    """print_event(event, file=None): one readable line per event, the result on the
    run.finished line, to file or sys.stdout, flushed."""

    @pytest.mark.parametrize(
        ("event", "line"),
        [
            pytest.param(
                al.Event(0, "message.accepted", {"message": al.UserMessage("user-001", "Café?")}),
                '  0  message.accepted  user user-001: "Café?"',
                id="a-user-message",
            ),
            pytest.param(
                al.Event(
                    1,
                    "message.accepted",
                    {
                        "message": al.AssistantMessage(
                            "message-response-001",
                            [al.ThinkingBlock("Sum first.", "sig"), al.TextBlock("Adding."), CALL],
                        )
                    },
                ),
                '  1  message.accepted  assistant message-response-001: thinking "Sum first.", '
                'text "Adding.", toolCall add({"left":20,"right":22}) [call-add-001]',
                id="an-assistant-message",
            ),
            pytest.param(
                al.Event(2, "message.accepted", {"message": RESULT}),
                '  2  message.accepted  toolResult tool-result-call-add-001: add ok: {"sum":42}',
                id="a-tool-result-message",
            ),
            pytest.param(
                al.Event(
                    3,
                    "model.chunk",
                    {
                        "request_id": "request-001",
                        "chunk": al.TextDelta("request-001", "The sum "),
                    },
                ),
                '  3  model.chunk       request-001 text "The sum "',
                id="a-text-chunk",
            ),
            pytest.param(
                al.Event(
                    4,
                    "model.chunk",
                    {
                        "request_id": "request-001",
                        "chunk": al.ThinkingDelta("request-001", "Sum first."),
                    },
                ),
                '  4  model.chunk       request-001 thinking "Sum first."',
                id="a-thinking-chunk",
            ),
            pytest.param(
                al.Event(
                    5,
                    "model.chunk",
                    {"request_id": "request-001", "chunk": al.ToolCallChunk("request-001", CALL)},
                ),
                '  5  model.chunk       request-001 toolCall add({"left":20,"right":22}) '
                "[call-add-001]",
                id="a-tool-call-chunk",
            ),
            pytest.param(
                al.Event(6, "tool.started", {"request_id": "request-001", "tool_call": CALL}),
                '  6  tool.started      request-001 add({"left":20,"right":22}) [call-add-001]',
                id="tool-started",
            ),
            pytest.param(
                al.Event(
                    7,
                    "tool.finished",
                    {"request_id": "request-001", "tool_call": CALL, "tool_result": RESULT},
                ),
                '  7  tool.finished     request-001 add ok: {"sum":42}',
                id="tool-finished-ok",
            ),
            pytest.param(
                al.Event(
                    8,
                    "tool.finished",
                    {
                        "request_id": "request-002",
                        "tool_call": al.ToolCall("call-w", "weather", {"city": "Atlantis"}),
                        "tool_result": al.ToolResultMessage(
                            "tool-result-call-w", "call-w", "weather", "no station", True
                        ),
                    },
                ),
                "  8  tool.finished     request-002 weather error: no station",
                id="tool-finished-error",
            ),
            pytest.param(
                finished("completed", usage=al.Usage(412, 58, 0, 1024, 12)),
                "  9  run.finished      completed after 1 step(s), 3 messages, usage: input 412, "
                "output 58, cacheRead 0, cacheWrite 1024, reasoning 12",
                id="completed-with-every-count",
            ),
            pytest.param(
                finished("completed", usage=al.Usage(1, None, 3, None, 0)),
                "  9  run.finished      completed after 1 step(s), 3 messages, usage: input 1, "
                "cacheRead 3, reasoning 0",
                id="only-the-counts-reported",
            ),
            pytest.param(
                finished("completed", usage=al.Usage()),
                "  9  run.finished      completed after 1 step(s), 3 messages, usage: unknown",
                id="no-count-reported",
            ),
            pytest.param(
                finished("maxSteps"),
                "  9  run.finished      maxSteps after 1 step(s), 3 messages",
                id="no-response-no-usage",
            ),
            pytest.param(
                finished(
                    "cancelled",
                    (
                        ASKED,
                        al.AssistantMessage("m", [CALL, al.ToolCall("call-add-002", "add", {})]),
                    ),
                ),
                "  9  run.finished      cancelled after 1 step(s), 2 messages, left without a "
                "result: call-add-001, call-add-002",
                id="cancelled-with-open-calls",
            ),
            pytest.param(
                finished("failed", (ASKED,), error=al.RunError("MODEL_STREAM_ERROR", "HTTP 500")),
                "  9  run.finished      failed after 1 step(s), 1 messages, error: "
                "MODEL_STREAM_ERROR: HTTP 500",
                id="failed-with-its-error",
            ),
            pytest.param(
                al.Event(
                    3,
                    "model.chunk",
                    {
                        "request_id": "request-001",
                        "chunk": al.TextDelta("request-001", "a\nb\u2028c"),
                    },
                ),
                '  3  model.chunk       request-001 text "a\\nb\\u2028c"',
                id="a-line-break-in-a-json-string",
            ),
            pytest.param(
                al.Event(
                    7,
                    "tool.finished",
                    {
                        "request_id": "request-001",
                        "tool_call": CALL,
                        "tool_result": al.ToolResultMessage(
                            "tool-result-call-add-001",
                            "call-add-001",
                            "add",
                            "two\nlines,\ta tab, \x00 and \ud800",
                            False,
                        ),
                    },
                ),
                "  7  tool.finished     request-001 add ok: two\\nlines,\\ta tab, \\x00 and "
                "\\ud800",
                id="unprintables-in-a-tool-result",
            ),
            pytest.param(
                al.Event(
                    6,
                    "tool.started",
                    {"request_id": "request-001", "tool_call": al.ToolCall("call\r1", "add", {})},
                ),
                "  6  tool.started      request-001 add({}) [call\\r1]",
                id="a-line-break-in-an-id",
            ),
            pytest.param(
                finished("failed", (ASKED,), error=al.RunError("TOOL_PHASE_ERROR", "a\u0085b")),
                "  9  run.finished      failed after 1 step(s), 1 messages, error: "
                "TOOL_PHASE_ERROR: a\\x85b",
                id="a-line-break-in-an-error",
            ),
        ],
    )
    def test_the_line_of_each_event(self, event: al.Event, line: str) -> None:
        """The exact line for each kind of event, message, chunk and result; a line break
        or other unprintable character in what a model or tool wrote is its escape."""
        assert printed(event) == line + "\n"

    def test_it_prints_a_run_to_stdout_as_settle_run_hands_it_events(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        model = al.ScriptedModel([al.scripted_response("response-001", [text("Hi.")], "stop")])
        events, _ = al.settle_run(
            al.run_agent_loop(messages=[ASKED], model=model, tools=al.ToolRegistry(), max_steps=1),
            on_event=al.print_event,
        )
        assert capsys.readouterr().out == (
            '  0  message.accepted  user user-001: "Add 20 and 22."\n'
            '  1  model.chunk       request-001 text "Hi."\n'
            "  2  run.finished      completed after 1 step(s), 2 messages, usage: unknown\n"
        )
        assert len(events) == 3

    def test_each_line_is_flushed(self) -> None:
        class Flushes(io.StringIO):
            def __init__(self) -> None:
                super().__init__()
                self.flushed: List[str] = []

            def flush(self) -> None:
                self.flushed.append(self.getvalue())

        file = Flushes()
        al.print_event(finished("maxSteps"), file)
        al.print_event(finished("maxSteps"), file)
        line = "  9  run.finished      maxSteps after 1 step(s), 3 messages\n"
        assert file.flushed == [line, line * 2]


# --- The demonstration ----------------------------------------------------------------


class Demo(NamedTuple):
    """What one run of the demonstration's command line did."""

    status: Any  # the exit status, as SystemExit carries it
    out: str
    err: str


def run_demo(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str
) -> Demo:
    """``python agent_loop.py ARGV``, run in this process as __main__ (through runpy)."""
    monkeypatch.setattr(sys, "argv", [al.__file__, *argv])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(al.__file__, run_name="__main__")
    captured = capsys.readouterr()
    return Demo(exited.value.code, captured.out, captured.err)


def demo_log(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str
) -> List[al.Event]:
    """The events that ``python agent_loop.py --json ARGV`` printed, read back, after the
    driver's check_run has checked them as a run."""
    demo = run_demo(monkeypatch, capsys, "--json", *argv)
    assert (demo.status, demo.err) == (0, "")
    assert demo.out.endswith("\n")
    events = read_json_lines(demo.out)
    assert json_lines(events) == demo.out  # each line is exactly one event's to_dict()
    check_run(events, events[-1].payload["result"])
    return events


def run_process(*argv: str) -> subprocess.CompletedProcess[str]:
    """``python agent_loop.py ARGV`` in a real process, in the module's folder."""
    return subprocess.run(
        [sys.executable, Path(al.__file__).name, *argv],
        cwd=Path(al.__file__).resolve().parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def result_of(events: List[al.Event]) -> al.RunResult:
    result: al.RunResult = events[-1].payload["result"]
    return result


def request_ids(events: List[al.Event]) -> List[str]:
    """The request ids the events name, in order, each once."""
    ids = [event.payload["request_id"] for event in events if "request_id" in event.payload]
    return sorted(set(ids), key=ids.index)


# One run of each kind the options can ask for: completed, maxSteps, cancelled.
OPTION_SETS = [
    pytest.param((), id="completed"),
    pytest.param(("--max-steps", "1"), id="maxSteps"),
    pytest.param(("--cancel-after", "4"), id="cancelled"),  # at the first tool.started
]


class TestDemonstration:
    """``python agent_loop.py`` runs a built-in demonstration and prints its event stream,
    one readable line per event, then the result; ``--json`` prints one to_dict() event
    per line and nothing else. The output is deterministic."""

    @pytest.mark.parametrize("options", OPTION_SETS)
    def test_one_print_event_line_per_event_the_result_last(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], options: Any
    ) -> None:
        events = demo_log(monkeypatch, capsys, *options)
        demo = run_demo(monkeypatch, capsys, *options)
        assert (demo.status, demo.err) == (0, "")
        assert demo.out == "".join(printed(event) for event in events)
        assert f"run.finished      {result_of(events).status} after " in demo.out

    def test_the_default_run_calls_tools_over_several_steps_and_completes(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A scripted model, a few tools, a first step that calls a tool."""
        events = demo_log(monkeypatch, capsys)
        result = result_of(events)
        assert result.status == "completed"
        assert result.steps >= 2
        first_step = [e for e in events if e.payload.get("request_id") == "request-001"]
        assert "tool.started" in types_of(first_step)

    @pytest.mark.parametrize("options", [*OPTION_SETS, pytest.param(("--json",), id="json")])
    def test_the_output_is_deterministic(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], options: Any
    ) -> None:
        first = run_demo(monkeypatch, capsys, *options)
        assert run_demo(monkeypatch, capsys, *options) == first

    @pytest.mark.parametrize("options", OPTION_SETS)
    def test_json_lines_replay_exactly(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], options: Any
    ) -> None:
        """A recording that the demo wrote replays byte for byte (agent_loop_replay)."""
        recorded = json_lines(demo_log(monkeypatch, capsys, *options))
        events, _ = settle(alr.replay(read_json_lines(recorded)).run())
        assert json_lines(events) == recorded

    def test_json_lines_of_a_run_cancelled_while_the_model_streams_replay_exactly(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Cancelled at a chunk that another chunk of the same request follows: the model
        had control, so the replay is exact too."""
        full = demo_log(monkeypatch, capsys)
        k = next(
            index
            for index, (event, after) in enumerate(zip(full, full[1:]))
            if event.type == after.type == "model.chunk"
            and event.payload["request_id"] == after.payload["request_id"]
        )
        recorded = json_lines(demo_log(monkeypatch, capsys, "--cancel-after", str(k)))
        events, result = settle(alr.replay(read_json_lines(recorded)).run())
        assert result.status == "cancelled"
        assert json_lines(events) == recorded

    def test_max_steps_on_both_sides_of_the_steps_the_demo_needs(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """``--max-steps N``: the run ends maxSteps when the budget is hit, after N
        requests and with the events of a longer budget up to there."""
        full = demo_log(monkeypatch, capsys)
        needed = result_of(full).steps
        for budget in (1, needed - 1, needed, al.MAX_AGENT_STEPS):
            events = demo_log(monkeypatch, capsys, "--max-steps", str(budget))
            result = result_of(events)
            if budget < needed:
                assert (result.status, result.max_steps, result.steps) == (
                    "maxSteps",
                    budget,
                    budget,
                )
                assert request_ids(events) == request_ids(full)[:budget]
                assert [e.to_dict() for e in events[:-1]] == [
                    e.to_dict() for e in full[: len(events) - 1]
                ]
            else:
                assert events == full

    def test_cancel_after_every_event(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """``--cancel-after K``: the signal is set once event K has been printed, so the
        run ends cancelled right after it; at the last event it comes too late."""
        full = demo_log(monkeypatch, capsys)
        complete = result_of(full)
        for k in range(len(full)):
            events = demo_log(monkeypatch, capsys, "--cancel-after", str(k))
            if k == len(full) - 1:
                assert events == full
                continue
            assert [e.to_dict() for e in events[: k + 1]] == [e.to_dict() for e in full[: k + 1]]
            assert len(events) == k + 2
            result = result_of(events)
            assert result.status == "cancelled"
            assert complete.messages[: len(result.messages)] == result.messages

    def test_help(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        demo = run_demo(monkeypatch, capsys, "--help")
        assert (demo.status, demo.err) == (0, "")
        assert demo.out.startswith("usage: ")
        for option in ("--json", "--max-steps", "--cancel-after", "--help"):
            assert option in demo.out

    @pytest.mark.parametrize(
        ("argv", "complaint"),
        [
            pytest.param(["--max-steps", "0"], "--max-steps", id="max-steps-below-1"),
            pytest.param(["--max-steps", str(al.MAX_AGENT_STEPS + 1)], "--max-steps",
                         id="max-steps-over-limit"),
            pytest.param(["--max-steps", "x"], "--max-steps", id="max-steps-not-int"),
            pytest.param(["--max-steps"], "--max-steps", id="max-steps-no-value"),
            pytest.param(["--cancel-after", "-1"], "--cancel-after", id="cancel-after-negative"),
            pytest.param(["--cancel-after", "1.5"], "--cancel-after", id="cancel-after-float"),
            pytest.param(["--bogus"], "--bogus", id="unknown-option"),
            pytest.param(["extra"], "extra", id="positional"),
        ],
    )  # fmt: skip
    def test_a_bad_option_is_a_usage_message_and_exit_status_2(
        self,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
        argv: List[str],
        complaint: str,
    ) -> None:
        demo = run_demo(monkeypatch, capsys, *argv)
        assert (demo.status, demo.out) == (2, "")
        assert demo.err.startswith("usage: ")
        assert complaint in demo.err

    def test_the_limits_of_the_options_are_accepted(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The at-limit side of the bad values above: --max-steps 1 and the ceiling,
        --cancel-after 0 (the first event)."""
        assert result_of(demo_log(monkeypatch, capsys, "--cancel-after", "0")).steps == 0
        for budget in ("1", str(al.MAX_AGENT_STEPS)):
            assert run_demo(monkeypatch, capsys, "--max-steps", budget).status == 0

    def test_a_resumed_run_from_a_cancelled_demo_log(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The whole story from a saved log: the demo cancelled at its first tool.started,
        read back, its open calls resolved, and resumed where its request ids stopped."""
        full = demo_log(monkeypatch, capsys)
        started = types_of(full).index("tool.started")
        cancelled = result_of(demo_log(monkeypatch, capsys, "--cancel-after", str(started)))
        assert cancelled.status == "cancelled"
        assert al.open_tool_calls(cancelled.messages) == (full[started].payload["tool_call"],)
        resolved = al.resolve_open_tool_calls(cancelled.messages, "interrupted")
        model = al.ScriptedModel(
            [al.scripted_response("response-later", [text("Later.")], "stop")]
        )
        events, result, _ = run(
            model, messages=resolved, max_steps=1, request_sequence_start=cancelled.steps
        )
        assert [request.id for request in model.requests] == [f"request-{cancelled.steps + 1:03d}"]
        assert types_of(events) == ["message.accepted"] * len(resolved) + [
            "model.chunk",
            "run.finished",
        ]
        assert result.status == "completed"


class TestDemonstrationAsAProcess:
    """The script entry point, run as the user runs it."""

    def test_it_prints_what_the_command_line_prints(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        completed = run_process()
        assert (completed.returncode, completed.stderr) == (0, "")
        assert completed.stdout == run_demo(monkeypatch, capsys).out

    def test_a_bad_option(self) -> None:
        completed = run_process("--bogus")
        assert (completed.returncode, completed.stdout) == (2, "")
        assert completed.stderr.startswith("usage: ")
        assert "--bogus" in completed.stderr

    def test_it_is_the_command_lines_demo(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """One copy of the demonstration: ``python agent_loop_cli.py --demo`` prints the same."""
        completed = subprocess.run(
            [sys.executable, "agent_loop_cli.py", "--demo", "--json"],
            cwd=Path(al.__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert (completed.returncode, completed.stderr) == (0, "")
        assert completed.stdout == run_demo(monkeypatch, capsys, "--json").out

    def test_a_copy_of_agent_loop_py_alone_says_where_the_demonstration_lives(
        self, tmp_path: Path
    ) -> None:
        (tmp_path / "agent_loop.py").write_bytes(Path(al.__file__).read_bytes())
        completed = subprocess.run(
            [sys.executable, "agent_loop.py"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert (completed.returncode, completed.stdout) == (1, "")
        assert "`python agent_loop_cli.py --demo`" in completed.stderr
        assert "from the agent_loop repository beside this file" in completed.stderr

    def test_a_reader_that_leaves_early_gets_no_traceback(self) -> None:
        """`python agent_loop.py --json | head -1`: the demo stops quietly when its
        reader has gone (here, a pipe whose reading end is already closed)."""
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            finished = subprocess.run(
                [sys.executable, str(Path(al.__file__).resolve()), "--json"],
                stdout=write_end,
                stderr=subprocess.PIPE,
                check=False,
            )
        finally:
            os.close(write_end)
        assert finished.stderr == b""
        assert finished.returncode == 1


class TestDemonstrationShowsThinkingAndUsage:
    """The demo's first step streams thinking, printed as its text; its result line
    shows the run's usage, the sum over its responses (none appended: no usage shown)."""

    def test_the_result_line_shows_the_runs_usage(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        events = demo_log(monkeypatch, capsys)
        result = result_of(events)
        assert result.usage == al.Usage(696, 118, 2048, 1024, 12)
        assert [m.usage for m in result.messages if isinstance(m, al.AssistantMessage)] == [
            al.Usage(412, 58, 0, 1024, 12),
            al.Usage(96, 41, 1024, 0, 0),
            al.Usage(188, 19, 1024, 0, 0),
        ]
        lines = run_demo(monkeypatch, capsys).out.splitlines()
        assert lines[-1] == (
            " 15  run.finished      completed after 3 step(s), 7 messages, usage: input 696, "
            "output 118, cacheRead 2048, cacheWrite 1024, reasoning 12"
        )
        cancelled = run_demo(monkeypatch, capsys, "--cancel-after", "0").out
        assert "usage" not in cancelled

    def test_a_thinking_chunk_is_printed_as_its_text(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        events = demo_log(monkeypatch, capsys)
        assert events[1].payload["chunk"] == al.ThinkingDelta(
            "request-001", "Two operations: the sum first, then the division."
        )
        line = run_demo(monkeypatch, capsys).out.splitlines()[1]
        assert line == (
            '  1  model.chunk       request-001 thinking "Two operations: the sum first, then '
            'the division."'
        )

    def test_a_tool_that_raises_is_a_recoverable_result(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """42 / 0 raises ZeroDivisionError in the divide tool: the model reads it as an
        error result on its next step, which completes the run."""
        events = demo_log(monkeypatch, capsys)
        errors = [
            event.payload["tool_result"]
            for event in events
            if event.type == "tool.finished" and event.payload["tool_result"].is_error
        ]
        assert [error.content for error in errors] == [
            "tool 'divide' raised ZeroDivisionError: division by zero"
        ]
        assert result_of(events).status == "completed"


# --- The README ---------------------------------------------------------------------------


def blocks_of(path: Path, language: str) -> list[str]:
    """The fenced blocks of this language in one document, in order."""
    text = path.read_text(encoding="utf-8")
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)


def readme_blocks(language: str) -> list[str]:
    """The README's fenced blocks of this language, in order."""
    return blocks_of(REPOSITORY / "README.md", language)


def documented_blocks(language: str) -> list[str]:
    """The fenced blocks of this language in the README and then each guide, in order."""
    return [block for path in DOCUMENTS for block in blocks_of(path, language)]


class TestReadme:
    """What the README tells a newcomer is true."""

    def test_it_opens_with_the_demonstration_and_the_test_command(self) -> None:
        first_block = readme_blocks("sh")[0]
        commands = [line.split("#")[0].strip() for line in first_block.splitlines()]
        assert commands == ["python agent_loop.py", "pip install tox && tox"]

    def test_its_python_blocks_run_and_their_assertions_hold(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """In this process (so that coverage sees them), one namespace per document."""
        assert len(documented_blocks("python")) >= 4  # quick start, adapter, cancellation, replay
        namespaces: dict[str, dict[str, Any]] = {}
        for path in DOCUMENTS:
            namespace = namespaces[path.name] = {}
            for number, block in enumerate(blocks_of(path, "python"), start=1):
                # dont_inherit: compiled as a reader's file is, not under this file's PEP 563
                # (a dataclass's string annotations would not resolve in a namespace).
                where = f"{path.name} python block {number}"
                exec(compile(block, where, "exec", dont_inherit=True), namespace)
        assert namespaces["README.md"]["result"].status == "completed"
        assert capsys.readouterr().out.splitlines()[0] == "0 message.accepted"

    def test_its_demonstration_output_is_what_the_demo_prints(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert readme_blocks("text")[0] == run_demo(monkeypatch, capsys).out

    def test_its_anthropic_tool_turn_with_thinking_is_what_the_adapter_sends(self) -> None:
        readme = documentation()
        # The one json block, indented in the Anthropic adapter's list item.
        (shown,) = re.findall(r"^  ```json\n(.*?)^  ```$", readme, flags=re.M | re.S)
        signature = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds..."
        thought = al.ThinkingBlock("The user wants 2 + 3: the add tool does it.", signature)
        call = al.ToolCall("toolu_01", "add", {"left": 2, "right": 3})
        history = (
            al.UserMessage("user-001", "What is 2 + 3?"),
            al.AssistantMessage("message-response-001", [thought, call], al.Usage(472, 89)),
            al.ToolResultMessage("tool-result-toolu_01", "toolu_01", "add", '{"sum":5}', False),
        )
        sent = providers.anthropic_request_body(
            request(history, SPECS, id="request-002"),
            "m",
            thinking={"type": "enabled", "budget_tokens": 1},
        )
        assert json.loads(shown) == json.loads(sent)["messages"]

    def test_it_states_the_id_rules(self) -> None:
        """How a duplicate id's message says the ids are derived, the README says too."""
        readme = " ".join(documentation().split())
        assert '"message-" + response id' in readme
        assert '"tool-result-" + call id' in readme
        assert "unique across the whole transcript" in readme


class TestReadmeBlocksRunAlone:
    """Every python block runs on its own when pasted into a fresh
    interpreter ...; the tests run each block alone."""

    def test_there_are_blocks(self) -> None:
        assert len(documented_blocks("python")) >= 4

    @pytest.mark.parametrize("index", range(len(documented_blocks("python"))))
    def test_each_block_alone(self, index: int) -> None:
        block = documented_blocks("python")[index]
        finished = subprocess.run(
            [sys.executable, "-c", block],
            cwd=REPOSITORY,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert finished.returncode == 0, f"block {index + 1}:\n{block}\n{finished.stderr}"

    def test_every_block_passes_mypy_strict(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The blocks are typed code that a type-checked project can copy. `tox -e type`
        runs this; where mypy is not installed it is skipped."""
        mypy = pytest.importorskip("mypy.api")
        files = []
        for index, block in enumerate(documented_blocks("python"), 1):
            path = tmp_path / f"readme_block_{index}.py"
            path.write_text(block, encoding="utf-8")
            files.append(str(path))
        monkeypatch.setenv("MYPYPATH", str(REPOSITORY))
        report, errors, status = mypy.run(["--strict", "--no-incremental", *files])
        assert status == 0, report + errors

    def test_nothing_refers_to_files_outside_the_repository(self) -> None:
        """Nothing in the repository refers to files outside it. The pattern is escaped so
        that this file does not name them either."""
        outside = re.compile(r"API\.md|STYLE\.md|\.\./shared|shared/bench\-pi")
        paths = [
            *REPOSITORY.glob("*.py"),
            *REPOSITORY.glob("tests/*.py"),
            *REPOSITORY.glob("*.md"),
            *REPOSITORY.glob("docs/*.md"),
            *REPOSITORY.glob("*.cfg"),
            *REPOSITORY.glob("*.toml"),
            *REPOSITORY.glob("*.ini"),
            *REPOSITORY.glob("benchmarks/*.py"),
            *REPOSITORY.glob("examples/*.py"),
            *REPOSITORY.glob("benchmarks/pi/*.*"),
        ]
        assert len(paths) >= 10
        for path in paths:
            assert outside.search(path.read_text(encoding="utf-8")) is None, path

    def test_the_pi_benchmark_is_in_the_repository(self) -> None:
        package = json.loads((REPOSITORY / "benchmarks/pi/package.json").read_text("utf-8"))
        assert package["dependencies"]["@earendil-works/pi-agent-core"] == "0.85.0"
        assert (REPOSITORY / "benchmarks/pi/package-lock.json").is_file()
        assert (REPOSITORY / "benchmarks/pi/bench_pi.mjs").is_file()


# --- The rules and their tests ------------------------------------------------------

RULES = REPOSITORY / "docs" / "rules.md"


def defined_tests(path: Path) -> dict[str, set[str]]:
    """The test methods of each test class of one file, read from its source (nothing is
    imported or run)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name: {
            item.name
            for item in node.body
            if isinstance(item, ast.FunctionDef) and item.name.startswith("test_")
        }
        for node in tree.body
        if isinstance(node, ast.ClassDef)
    }


def named_in_the_rules() -> list[tuple[str, str, str]]:
    """(file, class, test) for each test docs/rules.md names, in order."""
    text = RULES.read_text(encoding="utf-8")
    return re.findall(r"`([\w/.]+\.py)::(\w+)::(\w+)`", text)


class TestRulesMap:
    """docs/rules.md maps each rule the documentation states to its one test."""

    def test_every_test_it_names_exists(self) -> None:
        named = named_in_the_rules()
        assert len(named) >= 50
        missing = [
            "::".join(test)
            for test in named
            if test[2] not in defined_tests(REPOSITORY / test[0]).get(test[1], set())
        ]
        assert missing == []

    def test_each_rule_has_one_test(self) -> None:
        """A table row holds one rule and names one test; no test holds two rules."""
        rows = [
            line
            for line in RULES.read_text(encoding="utf-8").splitlines()
            if line.startswith("| ") and not line.startswith("| rule ")
        ]
        assert all(len(re.findall(r"::\w+::", row)) == 1 for row in rows), rows
        named = named_in_the_rules()
        assert len(rows) == len(named)
        assert len(set(named)) == len(named)

    def test_a_missing_test_is_found(self, tmp_path: Path) -> None:
        """The check reads classes and methods, so a name that is not there is missing."""
        path = tmp_path / "test_x.py"
        path.write_text(
            "class TestA:\n    def test_b(self) -> None: ...\n    def helper(self) -> None: ...\n"
            "def test_c() -> None: ...\n",
            encoding="utf-8",
        )
        assert defined_tests(path) == {"TestA": {"test_b"}}


# --- The packaging --------------------------------------------------------------------


def setup_cfg_list(section: str, option: str) -> List[str]:
    """One list option of setup.cfg (one name a line, or comma-separated), as a list."""
    parser = configparser.ConfigParser()
    parser.read(REPOSITORY / "setup.cfg", encoding="utf-8")
    names = parser[section][option].replace(",", "\n").split()
    return [name.strip() for name in names]


ROOT_MODULES = sorted(path.stem for path in REPOSITORY.glob("agent_loop*.py"))
"""What a user copies or installs: the core and its companions."""


IMPORT_EACH = """
import importlib, sys
for name in sys.argv[1:]:
    try:
        print(name, importlib.import_module(name).__file__)
    except ImportError as error:
        print(name, "ImportError:", error)
"""
"""Imports each module named on the command line: its file, or the ImportError."""


def build_modules(tmp_path: Path) -> Path:
    """The files `pip install .` puts in site-packages, as setup.py's build step writes
    them (skipped where setuptools is not installed)."""
    pytest.importorskip("setuptools")
    build = tmp_path / "lib"
    finished = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(build)],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert finished.returncode == 0, finished.stderr
    return build


class TestPackaging:
    """`pip install .` installs every module with its version, each marked as typed."""

    @pytest.mark.parametrize("module", ROOT_MODULES)
    def test_every_module_at_the_root_is_installed(self, module: str) -> None:
        assert module in setup_cfg_list("options", "py_modules")

    @pytest.mark.parametrize("module", ROOT_MODULES)
    def test_every_module_header_names_its___version__(self, module: str) -> None:
        """A copied file says what it is: its first line names it and its version, which
        is its __version__ (read from the source: nothing is imported)."""
        source = (REPOSITORY / f"{module}.py").read_text(encoding="utf-8")
        header = re.match(rf"# {module}\.py (\d+\.\d+\.\d+): ", source)
        assert header is not None, source.splitlines()[0]
        versions = [
            node.value.value
            for node in ast.parse(source).body
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            and [
                getattr(target, "id", None)
                for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            ]
            == ["__version__"]
            and isinstance(node.value, ast.Constant)
        ]
        assert versions == [header.group(1)]

    def test_the_build_puts_a_type_marker_beside_every_module(self, tmp_path: Path) -> None:
        build = build_modules(tmp_path)
        for module in setup_cfg_list("options", "py_modules"):
            assert (build / f"{module}.py").is_file(), module
            marker = build / module / "py.typed"
            assert marker.is_file(), module
            assert marker.read_bytes() == b""
        assert sorted(path.name for path in build.iterdir() if path.is_dir()) == sorted(
            setup_cfg_list("options", "py_modules")
        )

    def test_installed_modules_pass_mypy_strict_as_typed_code(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Installed in a fresh virtual environment as `pip install .` installs them, the
        modules are imported as modules (not as the marker's directory), and mypy reads
        their annotations: a user's wrong annotation is an error, not an untyped import."""
        mypy = pytest.importorskip("mypy.api")
        build = build_modules(tmp_path)
        environment = tmp_path / "venv"
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(environment)],
            check=True,
            timeout=120,
        )
        python = environment / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
        site_packages = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.strip()
        shutil.copytree(build, site_packages, dirs_exist_ok=True)
        modules = setup_cfg_list("options", "py_modules")
        imported = subprocess.run(
            [str(python), "-c", IMPORT_EACH, *modules],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.splitlines()
        assert len(imported) == len(modules)
        for module, line in zip(modules, imported):
            name, where = line.split(" ", 1)
            assert name == module
            # A bridge to another ecosystem says what to install; every other module is
            # the installed file, not the marker's directory.
            if module == "agent_loop" or not where.startswith("ImportError"):
                assert Path(where) == Path(site_packages) / f"{module}.py"
            else:
                assert "pip install" in where
        user = tmp_path / "user.py"
        user.write_text(
            "".join(f"import {module}\n" for module in modules)
            + "version: int = agent_loop.__version__\n",
            encoding="utf-8",
        )
        (tmp_path / "mypy.ini").write_text("[mypy]\n", encoding="utf-8")
        monkeypatch.chdir(tmp_path)
        monkeypatch.delenv("MYPYPATH", raising=False)
        report, errors, status = mypy.run(
            [
                "--strict",
                "--no-incremental",
                "--config-file",
                str(tmp_path / "mypy.ini"),
                "--python-executable",
                str(python),
                str(user),
            ]
        )
        assert status == 1, report + errors
        assert 'expression has type "str", variable has type "int"' in report, report
        assert "import-untyped" not in report, report
        assert report.count("error:") == 1, report
