"""Tests of the README, mypy and the demo."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import (
    Any,
)

import pytest

import agent_loop as al
import agent_loop_replay as alr
from loop_testing import (
    REPOSITORY,
    json_lines,
    read_json_lines,
    settle,
    types_of,
    user,
)


def demo_json_output(*options: str) -> str:
    """The demonstration's output with ``--json`` and the options."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert al._main(["--json", *options]) == 0
    return out.getvalue()


class TestJsonLinesRecordings:
    """Make the replay of the demo's own --json output reproduce it byte for
    byte."""

    @pytest.mark.parametrize(
        "options",
        [
            pytest.param((), id="completed"),
            pytest.param(("--max-steps", "1"), id="maxSteps-1"),
            pytest.param(("--max-steps", "2"), id="maxSteps-2"),
            pytest.param(("--cancel-after", "3"), id="cancelled-at-a-tool"),
            pytest.param(("--cancel-after", "12"), id="cancelled-while-streaming"),
        ],
    )
    def test_the_demos_json_output_replays_byte_for_byte(self, options: tuple[str, ...]) -> None:
        recorded = demo_json_output(*options)
        events, _ = settle(alr.replay(read_json_lines(recorded)).run())
        assert json_lines(events) == recorded

    def test_the_readme_recording_block_runs_on_its_own(self) -> None:
        path = os.path.join(os.path.dirname(os.path.abspath(al.__file__)), "README.md")
        with open(path, encoding="utf-8") as readme:
            blocks = re.findall(r"```python\n(.*?)```", readme.read(), re.DOTALL)
        (block,) = [block for block in blocks if "al.replay(" in block]
        exec(compile(block, "README.md record-and-replay block", "exec"), {})


# --- The demonstration -------------------------------------------------------------------


DEMO_OUTPUT = "\n".join(
    [
        '  0  message.accepted  user user-001: "What is (20 + 22) * 2? And the weather in '
        'Atlantis?"',
        '  1  model.chunk       request-001 text "First the sum."',
        '  2  model.chunk       request-001 toolCall add({"left":20,"right":22}) [call-add-001]',
        '  3  tool.started      request-001 add({"left":20,"right":22}) [call-add-001]',
        '  4  tool.finished     request-001 add ok: {"sum":42}',
        '  5  model.chunk       request-002 toolCall multiply({"left":42,"right":2}) '
        "[call-multiply-001]",
        '  6  model.chunk       request-002 toolCall weather({"city":"Atlantis"}) '
        "[call-weather-001]",
        '  7  tool.started      request-002 multiply({"left":42,"right":2}) [call-multiply-001]',
        '  8  tool.finished     request-002 multiply ok: {"product":84}',
        '  9  tool.started      request-002 weather({"city":"Atlantis"}) [call-weather-001]',
        " 10  tool.finished     request-002 weather error: tool 'weather' raised LookupError: "
        "no weather station in Atlantis",
        ' 11  model.chunk       request-003 text "(20 + 22) * 2 = 84. "',
        ' 12  model.chunk       request-003 text "Atlantis has no "',
        ' 13  model.chunk       request-003 text "weather station."',
        " 14  run.finished      completed after 3 step(s)",
        "result: completed, 3 step(s), 7 messages",
        "final text: (20 + 22) * 2 = 84. Atlantis has no weather station.",
        "",
    ]
)
"""``python agent_loop.py`` with no options, checked by hand: three steps, a recoverable
weather error, the final text assembled from three chunks."""


DEMO_QUESTION = "What is (20 + 22) * 2? And the weather in Atlantis?"


def run_demo(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[str, str]:
    assert al._main(list(argv)) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def event_lines(out: str) -> tuple[list[str], list[str]]:
    """Splits readable demo output into its event lines and the result lines after them."""
    lines = out.splitlines()
    finished = next(i for i, line in enumerate(lines) if "  run.finished  " in line)
    return lines[: finished + 1], lines[finished + 1 :]


def demo_run(max_steps: int = al.MAX_AGENT_STEPS) -> tuple[list[al.Event], al.RunResult]:
    return settle(
        al.run_agent_loop(
            messages=[al.UserMessage("user-001", DEMO_QUESTION)],
            model=al._demo_model(),
            tools=al._demo_tools(),
            max_steps=max_steps,
        ),
        max_steps=max_steps,
    )


class TestDemonstration:
    """Running it: python agent_loop.py prints its event stream, one line per
    event, then the result; the output is deterministic."""

    def test_default_output_is_the_golden_output(self, capsys: pytest.CaptureFixture[str]) -> None:
        out, err = run_demo(capsys)
        assert out == DEMO_OUTPUT
        assert err == ""

    def test_default_output_is_deterministic(self, capsys: pytest.CaptureFixture[str]) -> None:
        first, _ = run_demo(capsys)
        second, _ = run_demo(capsys)
        assert first == second

    def test_each_event_is_one_line_starting_with_its_sequence(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        out, _ = run_demo(capsys)
        events, results = event_lines(out)
        direct_events, direct = demo_run()
        assert len(events) == len(direct_events)
        for sequence, (line, event) in enumerate(zip(events, direct_events)):
            assert line.split()[:2] == [str(sequence), event.type]
        assert events[-1].split()[1:3] == ["run.finished", "completed"]
        assert results == [
            "result: completed, 3 step(s), 7 messages",
            f"final text: {direct.final_text}",
        ]
        assert any(
            "tool.finished" in line and " error: " in line and "LookupError" in line
            for line in events
        )

    def test_the_script_entry_point(self) -> None:
        """A real process, run as the user would: no options, exit status 0."""
        completed = subprocess.run(
            [sys.executable, "agent_loop.py"],
            cwd=os.path.dirname(os.path.abspath(al.__file__)),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert (completed.returncode, completed.stderr) == (0, "")
        assert completed.stdout == DEMO_OUTPUT

    def test_the_script_entry_point_rejects_a_bad_option(self) -> None:
        completed = subprocess.run(
            [sys.executable, "agent_loop.py", "--bogus"],
            cwd=os.path.dirname(os.path.abspath(al.__file__)),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert completed.returncode == 2
        assert completed.stdout == ""
        assert completed.stderr.startswith("usage: ")
        assert "--bogus" in completed.stderr

    def test_json_prints_only_json_events(self, capsys: pytest.CaptureFixture[str]) -> None:
        out, err = run_demo(capsys, "--json")
        assert err == ""
        lines = out.splitlines()
        assert out.endswith("\n")
        parsed = [json.loads(line) for line in lines]
        assert all(type(data) is dict for data in parsed)
        assert all(set(data) == {"sequence", "type", "payload"} for data in parsed)

    def test_json_events_rebuild_the_run_and_its_result(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        out, _ = run_demo(capsys, "--json")
        events = [al.event_from_dict(json.loads(line)) for line in out.splitlines()]
        assert [event.sequence for event in events] == list(range(len(events)))
        assert types_of(events).count("run.finished") == 1
        assert events[-1].type == "run.finished"
        result = events[-1].payload["result"]
        direct_events, direct = demo_run()
        assert events == direct_events
        assert result == direct
        assert result.status == "completed"
        assert result.final_text == "(20 + 22) * 2 = 84. Atlantis has no weather station."
        assert [message.id for message in result.messages] == [
            "user-001",
            "message-response-001",
            "tool-result-call-add-001",
            "message-response-002",
            "tool-result-call-multiply-001",
            "tool-result-call-weather-001",
            "message-response-003",
        ]

    def test_json_and_readable_output_describe_the_same_events(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        readable, _ = run_demo(capsys)
        as_json, _ = run_demo(capsys, "--json")
        events = [json.loads(line) for line in as_json.splitlines()]
        lines, _ = event_lines(readable)
        assert [line.split()[:2] for line in lines] == [
            [str(event["sequence"]), event["type"]] for event in events
        ]

    @pytest.mark.parametrize(
        ("max_steps", "status", "last_sequence", "result_lines"),
        [
            pytest.param(1, "maxSteps", 5, ["result: maxSteps, 1 step(s), 3 messages",
                                             "the budget of 1 step(s) ended the run"], id="1"),
            pytest.param(2, "maxSteps", 11, ["result: maxSteps, 2 step(s), 6 messages",
                                              "the budget of 2 step(s) ended the run"],
                         id="2-one-short"),
            pytest.param(3, "completed", 14, DEMO_OUTPUT.splitlines()[-2:], id="3-enough"),
            pytest.param(64, "completed", 14, DEMO_OUTPUT.splitlines()[-2:], id="64-ceiling"),
        ],
    )  # fmt: skip
    def test_max_steps(
        self,
        capsys: pytest.CaptureFixture[str],
        max_steps: int,
        status: str,
        last_sequence: int,
        result_lines: list[str],
    ) -> None:
        """Seed: "If the current step equals maxSteps, the loop emits run.finished with
        status maxSteps and does not open another model request." """
        out, _ = run_demo(capsys, "--max-steps", str(max_steps))
        events, results = event_lines(out)
        assert len(events) == last_sequence + 1
        assert events[-1].split()[:3] == [str(last_sequence), "run.finished", status]
        assert results == result_lines
        assert DEMO_OUTPUT.startswith("\n".join(events[:-1]))
        as_json, _ = run_demo(capsys, "--json", "--max-steps", str(max_steps))
        rebuilt = al.event_from_dict(json.loads(as_json.splitlines()[-1])).payload["result"]
        assert rebuilt == demo_run(max_steps)[1]
        assert rebuilt.status == status
        assert rebuilt.max_steps == (max_steps if status == "maxSteps" else None)

    @pytest.mark.parametrize(
        ("cancel_after", "steps", "messages", "open_calls"),
        [
            pytest.param(0, 0, 1, [], id="initial-emission"),
            pytest.param(3, 1, 2, ["call-add-001"], id="tool.started"),
            pytest.param(7, 2, 4, ["call-multiply-001", "call-weather-001"],
                         id="tool.started-of-two"),
            pytest.param(13, 3, 6, [], id="last-but-one"),
        ],
    )  # fmt: skip
    def test_cancel_after(
        self,
        capsys: pytest.CaptureFixture[str],
        cancel_after: int,
        steps: int,
        messages: int,
        open_calls: list[str],
    ) -> None:
        """Seed: "The last observable event is still run.finished with a cancelled result"."""
        out, _ = run_demo(capsys, "--cancel-after", str(cancel_after))
        events, results = event_lines(out)
        assert len(events) == cancel_after + 2
        assert "\n".join(events[:-1]) + "\n" == "\n".join(
            [*DEMO_OUTPUT.splitlines()[: cancel_after + 1], ""]
        )
        assert (
            events[-1]
            == f"{cancel_after + 1:3d}  run.finished      cancelled after {steps} step(s)"
        )
        expected = [f"result: cancelled, {steps} step(s), {messages} messages"]
        if open_calls:
            expected.append("left without a result: " + ", ".join(open_calls))
        assert results == expected
        as_json, _ = run_demo(capsys, "--json", "--cancel-after", str(cancel_after))
        logged = [al.event_from_dict(json.loads(line)) for line in as_json.splitlines()]
        assert len(logged) == cancel_after + 2
        result = logged[-1].payload["result"]
        assert (result.status, result.steps, len(result.messages)) == (
            "cancelled",
            steps,
            messages,
        )
        assert [c.id for c in al.open_tool_calls(result.messages)] == open_calls

    def test_cancel_after_the_last_event_changes_nothing(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """K = 14 is run.finished itself: the signal comes too late to cancel anything."""
        out, _ = run_demo(capsys, "--cancel-after", "14")
        assert out == DEMO_OUTPUT

    def test_help(self, capsys: pytest.CaptureFixture[str]) -> None:
        with pytest.raises(SystemExit) as exit_info:
            al._main(["--help"])
        assert exit_info.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith("usage: ")
        for option in ("--json", "--max-steps", "--cancel-after", "--help"):
            assert option in out

    @pytest.mark.parametrize(
        ("argv", "complaint"),
        [
            pytest.param(["--max-steps", "0"], "--max-steps", id="max-steps-below"),
            pytest.param(["--max-steps", "65"], "--max-steps", id="max-steps-above-ceiling"),
            pytest.param(["--max-steps", "x"], "--max-steps", id="max-steps-not-int"),
            pytest.param(["--max-steps"], "--max-steps", id="max-steps-no-value"),
            pytest.param(["--cancel-after", "-1"], "--cancel-after", id="cancel-after-negative"),
            pytest.param(["--cancel-after", "1.5"], "--cancel-after", id="cancel-after-float"),
            pytest.param(["--bogus"], "--bogus", id="unknown-option"),
            pytest.param(["extra"], "extra", id="positional"),
        ],
    )
    def test_bad_option_is_a_usage_error(
        self, capsys: pytest.CaptureFixture[str], argv: list[str], complaint: str
    ) -> None:
        with pytest.raises(SystemExit) as exit_info:
            al._main(argv)
        assert exit_info.value.code == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.startswith("usage: ")
        assert complaint in captured.err

    @pytest.mark.parametrize(
        ("city", "content", "is_error"),
        [
            pytest.param("Lisbon", "sunny, 19 C", False, id="known"),
            pytest.param("Oslo", "snow, -3 C", False, id="known-2"),
            pytest.param(
                "Atlantis",
                "tool 'weather' raised LookupError: no weather station in Atlantis",
                True,
                id="unknown-is-recoverable",
            ),
        ],
    )
    def test_the_demo_weather_tool(self, city: str, content: str, is_error: bool) -> None:
        """The demo's failing call fails because of its city, not because the tool is broken."""
        weather = al.ToolCall("call-weather-001", "weather", {"city": city})
        result = al.execute_tool_call(al._demo_tools(), weather, threading.Event())
        assert (result.content, result.is_error) == (content, is_error)

    def test_the_result_lines_of_a_failed_run(self) -> None:
        """The demo script never fails, but its result printer names a failure's code."""
        failed = al.RunResult("failed", (user(),), 1, error=al.RunError("MODEL_STREAM_ERROR", "x"))
        assert al._demo_result(failed) == (
            "result: failed, 1 step(s), 1 messages\nerror: MODEL_STREAM_ERROR: x"
        )


class TestDemonstrationPipes:
    def test_a_reader_that_leaves_early_gets_no_traceback(self) -> None:
        """`python agent_loop.py --json | head -1`: the demo stops quietly when its
        reader has gone (here, a pipe whose reading end is already closed)."""
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            finished = subprocess.run(
                [sys.executable, os.path.abspath(al.__file__), "--json"],
                stdout=write_end,
                stderr=subprocess.PIPE,
                check=False,
            )
        finally:
            os.close(write_end)
        assert finished.stderr == b""
        assert finished.returncode == 1


def readme_blocks(language: str) -> list[str]:
    """The README's fenced blocks of this language, in order."""
    readme = (REPOSITORY / "README.md").read_text(encoding="utf-8")
    return re.findall(rf"^```{language}\n(.*?)^```$", readme, flags=re.MULTILINE | re.DOTALL)


class TestReadme:
    """What the README tells a newcomer is true."""

    def test_it_opens_with_the_demonstration_and_the_test_command(self) -> None:
        first_block = readme_blocks("sh")[0]
        commands = [line.split("#")[0].strip() for line in first_block.splitlines()]
        assert commands == ["python agent_loop.py", "pip install tox && tox"]

    def test_its_python_blocks_run_and_their_assertions_hold(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        blocks = readme_blocks("python")
        assert len(blocks) >= 4  # quick start, adapter, cancellation, replay
        namespace: dict[str, Any] = {}
        for number, block in enumerate(blocks, start=1):
            exec(compile(block, f"README.md python block {number}", "exec"), namespace)
        assert namespace["result"].status == "completed"
        assert capsys.readouterr().out.splitlines()[0] == "0 message.accepted"

    def test_its_demonstration_output_is_what_the_demo_prints(self) -> None:
        assert readme_blocks("text")[0] == DEMO_OUTPUT


class TestReadmeBlocksRunAlone:
    """Every python block runs on its own when pasted into a fresh
    interpreter ...; the tests run each block alone."""

    def test_there_are_blocks(self) -> None:
        assert len(readme_blocks("python")) >= 4

    @pytest.mark.parametrize("index", range(len(readme_blocks("python"))))
    def test_each_block_alone(self, index: int) -> None:
        block = readme_blocks("python")[index]
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
        for index, block in enumerate(readme_blocks("python"), 1):
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
            *REPOSITORY.glob("*.md"),
            *REPOSITORY.glob("*.cfg"),
            *REPOSITORY.glob("*.toml"),
            *REPOSITORY.glob("*.ini"),
            *REPOSITORY.glob("benchmarks/*.py"),
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

    def test_typed_is_not_claimed(self) -> None:
        """A single module cannot carry py.typed (PEP 561), so the classifier is dropped."""
        assert "Typing :: Typed" not in (REPOSITORY / "setup.cfg").read_text("utf-8")
