"""Tests of agent_loop_cli.py: the command line, run as a user runs it.

``main(argv)`` runs in this process against loop_testing's fixture server (a local
``http.server`` on 127.0.0.1 and a free port, started and stopped by a fixture whatever
happens), and a subprocess runs the file itself for Ctrl-C and a reader that leaves
early. What it prints is ``agent_loop.print_event``'s lines (tested line by line in
test_docs_and_demo.py) or, with ``--json``, one ``to_dict()`` line per event. No test
reaches beyond 127.0.0.1, and none names a private name of agent_loop_cli or of the
modules it uses.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import signal as os_signal
import subprocess
import sys
import threading
import time
from typing import Any, Dict, Iterator, List, Tuple

import pytest

import agent_loop as al
import agent_loop_cli as cli
from loop_testing import (
    OPENAI_REASONING_STREAM,
    REASONING_USAGE,
    REPOSITORY,
    SERVER_BOUND,
    AnswerItem,
    Reply,
    Server,
    answer_parts,
    anthropic_end,
    anthropic_event,
    anthropic_text,
    anthropic_thinking,
    anthropic_tool,
    eventually,
    openai_chunk,
    openai_sent_call,
    serving,
)


@pytest.fixture
def server() -> Iterator[Server]:
    with serving() as state:
        yield state


def argv(server: Server, provider: str = "openai", *more: str) -> List[str]:
    """A command line for the fixture server, with no retries, then more."""
    url = server.url + "/v1" if provider == "openai" else server.url
    return ["--provider", provider, "--base-url", url, "--model", "m", "--retries", "0", *more]


def start(server: Server, *more: str) -> subprocess.Popen[str]:
    """``python agent_loop_cli.py`` against the fixture server, in a real process."""
    return subprocess.Popen(
        [sys.executable, "agent_loop_cli.py", *argv(server, "openai", *more)],
        cwd=REPOSITORY,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class TestTools:
    """TOOLS: add, multiply and weather, whose missing station is a ToolError."""

    def test_each_tool_and_its_schema(self) -> None:
        registry = al.ToolRegistry(cli.TOOLS)
        assert [spec.name for spec in registry.specs()] == ["add", "multiply", "weather"]
        assert registry.specs()[0].parameters["properties"] == {
            "left": {"type": "number"},
            "right": {"type": "number"},
        }
        calls: List[Tuple[str, Dict[str, Any], str, bool]] = [
            ("add", {"left": 2, "right": 0.5}, '{"sum":2.5}', False),
            ("multiply", {"left": 6, "right": 7}, '{"product":42}', False),
            ("weather", {"city": "Oslo"}, "snow, -3 C", False),
            ("weather", {"city": "Atlantis"}, "no weather station in Atlantis", True),
        ]
        for name, arguments, content, is_error in calls:
            result = al.execute_tool_call(
                registry, al.ToolCall("c", name, arguments), threading.Event()
            )
            assert (result.content, result.is_error) == (content, is_error)


class TestWhatItPrints:
    """One print_event line per event, the result last; --json: one to_dict() line each."""

    def test_one_line_per_event_with_the_calls_and_results(
        self, server: Server, capsys: pytest.CaptureFixture[str]
    ) -> None:
        calls: List[Tuple[str, str, Dict[str, Any]]] = [
            ("c1", "add", {"left": 2, "right": 3}),
            ("c2", "weather", {"city": "Atlantis"}),
        ]
        server.script(
            Reply(answer_parts("openai", ["Adding", " now.", *calls])),
            Reply(answer_parts("openai", ["5, and", " no."])),
        )
        assert cli.main(argv(server, "openai", "--system", "S", "2+3?")) == 0
        assert capsys.readouterr().out == (
            '  0  message.accepted  user user-001: "2+3?"\n'
            '  1  model.chunk       request-001 text "Adding"\n'
            '  2  model.chunk       request-001 text " now."\n'
            '  3  model.chunk       request-001 toolCall add({"left":2,"right":3}) [c1]\n'
            '  4  model.chunk       request-001 toolCall weather({"city":"Atlantis"}) [c2]\n'
            '  5  tool.started      request-001 add({"left":2,"right":3}) [c1]\n'
            '  6  tool.finished     request-001 add ok: {"sum":5}\n'
            '  7  tool.started      request-001 weather({"city":"Atlantis"}) [c2]\n'
            "  8  tool.finished     request-001 weather error: no weather station in Atlantis\n"
            '  9  model.chunk       request-002 text "5, and"\n'
            ' 10  model.chunk       request-002 text " no."\n'
            " 11  run.finished      completed after 2 step(s), 5 messages, usage: unknown\n"
        )
        assert server.body()["messages"][0] == {"role": "system", "content": "S"}
        tools = [tool["function"]["name"] for tool in server.body()["tools"]]
        assert tools == ["add", "multiply", "weather"]
        sent = [openai_sent_call(id, name, json.dumps(arguments)) for id, name, arguments in calls]
        assert server.body(1)["messages"][2] == {
            "role": "assistant",
            "content": "Adding now.",
            "tool_calls": sent,
        }

    @pytest.mark.parametrize(
        ("more", "answers", "status", "out"),
        [
            pytest.param(
                ["--max-steps", "1"],
                [[("c1", "add", {"left": 2, "right": 3})], ["5."]],
                1,
                '  0  message.accepted  user user-001: "Hi"\n'
                '  1  model.chunk       request-001 toolCall add({"left":2,"right":3}) [c1]\n'
                '  2  tool.started      request-001 add({"left":2,"right":3}) [c1]\n'
                '  3  tool.finished     request-001 add ok: {"sum":5}\n'
                "  4  run.finished      maxSteps after 1 step(s), 3 messages, usage: unknown\n",
                id="a-budget-of-1-step-ends-the-run-with-status-1",
            ),
            pytest.param(
                ["--max-steps", "64"],
                [[("c1", "add", {"left": 2, "right": 3})], ["5."]],
                0,
                '  0  message.accepted  user user-001: "Hi"\n'
                '  1  model.chunk       request-001 toolCall add({"left":2,"right":3}) [c1]\n'
                '  2  tool.started      request-001 add({"left":2,"right":3}) [c1]\n'
                '  3  tool.finished     request-001 add ok: {"sum":5}\n'
                '  4  model.chunk       request-002 text "5."\n'
                "  5  run.finished      completed after 2 step(s), 4 messages, usage: unknown\n",
                id="the-ceiling-of-64-steps",
            ),
            pytest.param(
                [],
                [[al.ThinkingBlock("One.\n\nTwo"), al.ThinkingBlock(" and three.\n"), "Done."]],
                0,
                '  0  message.accepted  user user-001: "Hi"\n'
                '  1  model.chunk       request-001 thinking "One.\\n\\nTwo"\n'
                '  2  model.chunk       request-001 thinking " and three.\\n"\n'
                '  3  model.chunk       request-001 text "Done."\n'
                "  4  run.finished      completed after 1 step(s), 2 messages, usage: unknown\n",
                id="thinking-with-its-line-breaks-escaped",
            ),
        ],
    )
    def test_what_it_prints(
        self,
        server: Server,
        capsys: pytest.CaptureFixture[str],
        more: List[str],
        answers: List[List[AnswerItem]],
        status: int,
        out: str,
    ) -> None:
        server.script(*(Reply(answer_parts("openai", items)) for items in answers))
        assert cli.main(argv(server, "openai", *more, "Hi")) == status
        assert capsys.readouterr().out == out

    def test_a_failed_run_prints_its_error(
        self, server: Server, capsys: pytest.CaptureFixture[str]
    ) -> None:
        server.script(Reply([openai_chunk({"content": "Half"})]))
        assert cli.main(argv(server, "openai", "Hi")) == 1
        assert capsys.readouterr().out.splitlines()[1:] == [
            '  1  model.chunk       request-001 text "Half"',
            "  2  run.finished      failed after 1 step(s), 1 messages, error: "
            "MODEL_STREAM_ERROR: the model's stream raised ProviderProtocolError: the stream from "
            f"{server.url}/v1/chat/completions ended before data: [DONE] and without a "
            "finish_reason: the answer is incomplete",
        ]

    def test_reasoning_then_the_answer_and_the_usage(
        self, server: Server, capsys: pytest.CaptureFixture[str]
    ) -> None:
        server.script(Reply([OPENAI_REASONING_STREAM]))
        assert cli.main(argv(server, "openai", "27 * 453?")) == 0
        assert capsys.readouterr().out.splitlines()[1:] == [
            '  1  model.chunk       request-001 thinking "27 * 453: "',
            '  2  model.chunk       request-001 thinking "10,800 + 1,431."',
            '  3  model.chunk       request-001 text "12,231"',
            "  4  run.finished      completed after 1 step(s), 2 messages, usage: input 4, "
            "output 45, cacheRead 16, reasoning 41",
        ]

    def test_anthropic_thinking_tools_and_the_usage_summed(
        self, server: Server, capsys: pytest.CaptureFixture[str]
    ) -> None:
        def message_start(input_tokens: int) -> bytes:
            usage = {"input_tokens": input_tokens, "cache_read_input_tokens": 30}
            return anthropic_event("message_start", message={"id": "m", "usage": usage})

        server.script(
            Reply(
                [
                    message_start(100),
                    *anthropic_thinking(0, "Add:\n", "2 + 3", signature="sig-add"),
                    *anthropic_tool(1, "toolu_01", "add", '{"left": 2, "right": 3}'),
                    *anthropic_end("tool_use", {"output_tokens": 20}),
                ]
            ),
            Reply(
                [
                    message_start(120),
                    *anthropic_thinking(0, "Say it.", signature="sig-say"),
                    *anthropic_text(1, "5."),
                    *anthropic_end("end_turn", {"output_tokens": 4}),
                ]
            ),
        )
        assert cli.main(argv(server, "anthropic", "--thinking", "2048", "2+3?")) == 0
        assert capsys.readouterr().out.splitlines()[1:] == [
            '  1  model.chunk       request-001 thinking "Add:\\n"',
            '  2  model.chunk       request-001 thinking "2 + 3"',
            '  3  model.chunk       request-001 toolCall add({"left":2,"right":3}) [toolu_01]',
            '  4  tool.started      request-001 add({"left":2,"right":3}) [toolu_01]',
            '  5  tool.finished     request-001 add ok: {"sum":5}',
            '  6  model.chunk       request-002 thinking "Say it."',
            '  7  model.chunk       request-002 text "5."',
            "  8  run.finished      completed after 2 step(s), 4 messages, usage: input 220, "
            "output 24, cacheRead 60",
        ]
        thought = {"type": "thinking", "thinking": "Add:\n2 + 3", "signature": "sig-add"}
        assert server.body(1)["messages"][1]["content"][0] == thought

    def test_anthropic_json_and_a_failed_run(
        self, server: Server, capsys: pytest.CaptureFixture[str]
    ) -> None:
        server.script(Reply([b"{}"], status=500))
        status = cli.main(argv(server, "anthropic", "--json", "--max-steps", "1", "Hi"))
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert status == 1
        assert [line["type"] for line in lines] == ["message.accepted", "run.finished"]
        assert lines[-1]["payload"]["result"]["error"]["code"] == "MODEL_STREAM_ERROR"

    def test_json_lines_replay_as_events(
        self, server: Server, capsys: pytest.CaptureFixture[str]
    ) -> None:
        server.script(Reply([OPENAI_REASONING_STREAM]))
        assert cli.main(argv(server, "openai", "--json", "27 * 453?")) == 0
        lines = capsys.readouterr().out.splitlines()
        events = [al.event_from_dict(json.loads(line)) for line in lines]
        assert [event.sequence for event in events] == list(range(len(lines)))
        assert [json.dumps(event.to_dict(), ensure_ascii=False) for event in events] == lines
        assert events[1].payload["chunk"] == al.ThinkingDelta("request-001", "27 * 453: ")
        result = events[-1].payload["result"]
        assert (result.final_text, result.usage) == ("12,231", REASONING_USAGE)
        usage = json.loads(lines[-1])["payload"]["result"]["usage"]
        assert usage == {"input": 4, "output": 45, "cacheRead": 16, "reasoning": 41}

    def test_accept_truncated_and_its_warning_on_stderr(
        self, server: Server, capsys: pytest.CaptureFixture[str]
    ) -> None:
        server.script(Reply(answer_parts("openai", ["Once upon"], end="length")))
        status = cli.main(argv(server, "openai", "--accept-truncated", "Tell"))
        captured = capsys.readouterr()
        assert status == 0
        assert captured.out.splitlines()[-1] == (
            "  2  run.finished      completed after 1 step(s), 2 messages, usage: unknown"
        )
        assert captured.err == (
            "warning: request-001: the answer was cut by the token limit (finish_reason "
            "'length'); accepted as the model's answer (accept_truncated=True)\n"
        )
        handlers = logging.getLogger("agent_loop.providers").handlers
        assert not any(isinstance(handler, logging.StreamHandler) for handler in handlers)


class TestOptions:
    """Each option reaches the model or the run; a bad one is a usage error, status 2."""

    @pytest.mark.parametrize(
        ("provider", "more", "sent"),
        [
            pytest.param(
                "openai",
                '--max-tokens 7 --option temperature=0 --option stop=[\\"\\\\n\\"]',
                {"max_tokens": 7, "temperature": 0, "stop": ["\n"]},
                id="openai-max-tokens-and-options",
            ),
            pytest.param("anthropic", "--max-tokens 9", {"max_tokens": 9}, id="max-tokens"),
            pytest.param(
                "anthropic", "--option top_k=3", {"max_tokens": 4096, "top_k": 3}, id="default"
            ),
            *[
                pytest.param(
                    "anthropic",
                    more,
                    {"thinking": {"type": "enabled", "budget_tokens": budget}},
                    id=name,
                )
                for name, more, budget in [
                    ("thinking-the-least", "--thinking 1024", 1024),
                    ("thinking-below-the-default-limit", "--thinking 4095", 4095),
                    ("thinking-below-limit", "--thinking 2048 --max-tokens 2049", 2048),
                ]
            ],
        ],
    )
    def test_the_arguments_reach_the_body(
        self, server: Server, provider: str, more: str, sent: Dict[str, Any]
    ) -> None:
        server.script(Reply(answer_parts(provider, ["Hi"])))
        assert cli.main(argv(server, provider, *shlex.split(more), "Hi")) == 0
        assert {key: server.body()[key] for key in sent} == sent

    @pytest.mark.parametrize(
        ("provider", "more", "complaint"),
        [
            pytest.param("", "", "required", id="nothing"),
            *[
                pytest.param(provider, more, complaint, id=name)
                for provider, name, more, complaint in [
                    ("x", "provider", "", "invalid choice: 'x'"),
                    ("openai", "url", "--base-url ftp://h", "base_url must be an http://"),
                    ("openai", "model", "--model ''", "model must name the provider's model"),
                    ("openai", "steps-low", "--max-steps 0", "0 is not in 1..64"),
                    ("openai", "steps-high", "--max-steps 65", "65 is not in 1..64"),
                    ("openai", "steps-text", "--max-steps x", "'x' is not an integer"),
                    ("openai", "tokens-low", "--max-tokens 0", "0 is not >= 1"),
                    ("openai", "tokens-text", "--max-tokens x", "'x' is not an integer"),
                    ("openai", "retries-low", "--retries -1", "-1 is not >= 0"),
                    ("openai", "retries-text", "--retries x", "'x' is not an integer"),
                    ("openai", "option-no-equals", "--option temperature", "is not KEY=JSON"),
                    ("openai", "option-no-key", "--option =1", "'=1' is not KEY=JSON"),
                    ("openai", "option-not-json", "--option temperature=warm", "is not JSON"),
                    ("openai", "option-nan", "--option temperature=NaN", "plain JSON"),
                    ("openai", "option-owned", "--option stream=false", "may not set stream"),
                    ("openai", "tokens-twice", "--max-tokens 5 --option max_tokens=6", "once"),
                    ("openai", "thinking-for-openai", "--thinking 2048", "is for --provider"),
                    ("anthropic", "thinking-below-1024", "--thinking 1023", "1023 is not >= 1024"),
                    ("anthropic", "thinking-text", "--thinking lots", "'lots' is not an integer"),
                    ("anthropic", "thinking-at-the-default-limit", "--thinking 4096", ", 4096"),
                    ("anthropic", "thinking-at-the-limit", "--thinking 2048 --max-tokens 2048",
                     "2048 must be below the token limit, 2048"),
                    ("anthropic", "thinking-owned", '--option \'thinking={"type": "adaptive"}\'',
                     "may not set thinking"),
                    ("anthropic", "anthropic-owned", "--option max_tokens=6",
                     "may not set max_tokens"),
                ]
            ],
        ],
    )  # fmt: skip
    def test_bad_options_exit_2_with_usage(
        self, provider: str, more: str, complaint: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        # Each row: a good command line but for one argument (the later one wins).
        good = ["--provider", provider, "--base-url", "http://h", "--model", "m"]
        with pytest.raises(SystemExit) as exited:
            cli.main([*good, *shlex.split(more), "p"] if provider else [])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("usage: python agent_loop_cli.py")
        assert complaint in err

    def test_help_names_every_option(self, capsys: pytest.CaptureFixture[str]) -> None:
        with pytest.raises(SystemExit) as exited:
            cli.main(["--help"])
        assert exited.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith("usage: python agent_loop_cli.py")
        options = re.findall(r"^  (-[-\w]+)", out, flags=re.MULTILINE)
        assert options == [
            "-h",
            "--provider",
            "--base-url",
            "--model",
            "--system",
            "--max-tokens",
            "--thinking",
            "--option",
            "--retries",
            "--accept-truncated",
            "--max-steps",
            "--json",
        ]


class TestCancellation:
    """Ctrl-C sets the run's signal: the run ends cancelled and its result is printed."""

    def test_sigint_sets_the_signal(
        self, server: Server, capsys: pytest.CaptureFixture[str]
    ) -> None:
        server.script(Reply([openai_chunk({"content": "Thinking"})], stall=True))

        def interrupt() -> None:
            # Once the request arrived, main() has installed its handler: the server
            # holds the stream open, so main() is still running when SIGINT comes.
            if eventually(lambda: bool(server.requests)):
                time.sleep(0.1)
                os.kill(os.getpid(), os_signal.SIGINT)

        before = os_signal.getsignal(os_signal.SIGINT)
        interrupter = threading.Thread(target=interrupt)
        interrupter.start()
        try:
            status = cli.main(argv(server, "openai", "Hi"))
        finally:
            interrupter.join(SERVER_BOUND)
        assert status == 1
        assert capsys.readouterr().out.splitlines()[1:] == [
            '  1  model.chunk       request-001 text "Thinking"',
            "  2  run.finished      cancelled after 1 step(s), 1 messages",
        ]
        assert os_signal.getsignal(os_signal.SIGINT) is before  # restored

    def test_ctrl_c_cancels_and_prints_the_result(self, server: Server) -> None:
        server.script(Reply([openai_chunk({"content": "Thinking"})], stall=True))
        process = start(server, "Hi")
        try:
            # The request arrives once main() has installed its handler; the server then
            # holds the stream open, so the run is waiting on the network.
            assert eventually(lambda: bool(server.requests))
            time.sleep(0.2)
            process.send_signal(os_signal.SIGINT)
            out, err = process.communicate(timeout=SERVER_BOUND)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
        assert process.returncode == 1
        assert out.splitlines()[1:] == [
            '  1  model.chunk       request-001 text "Thinking"',
            "  2  run.finished      cancelled after 1 step(s), 1 messages",
        ]
        assert err == ""
        assert server.disconnected.wait(SERVER_BOUND)


class TestTheFile:
    """The file as it is run and copied."""

    def test_a_reader_that_leaves_early_gets_no_traceback(self, server: Server) -> None:
        """`python agent_loop_cli.py ... --json | head -1`: the command stops quietly when
        its reader has gone (here, a pipe whose reading end is already closed)."""
        server.script(Reply(answer_parts("openai", ["Hi", " there."])))
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            finished = subprocess.run(
                [sys.executable, "agent_loop_cli.py", *argv(server, "openai", "--json", "Hi")],
                cwd=REPOSITORY,
                stdout=write_end,
                stderr=subprocess.PIPE,
                timeout=60,
                check=False,
            )
        finally:
            os.close(write_end)
        assert (finished.returncode, finished.stderr) == (1, b"")

    def test_it_uses_only_public_names_of_the_modules_it_imports(self) -> None:
        source = (REPOSITORY / "agent_loop_cli.py").read_text(encoding="utf-8")
        assert re.findall(r"\b(?:al|providers)\._\w+", source) == []
        assert re.findall(r"^import (\w+)", source, flags=re.MULTILINE) == [
            "argparse",
            "inspect",
            "json",
            "logging",
            "os",
            "signal",
            "sys",
            "threading",
            "agent_loop",
            "agent_loop_providers",
        ]

    def test_the_header_names_the_file_and_its_version(self) -> None:
        first = (REPOSITORY / "agent_loop_cli.py").read_text(encoding="utf-8").splitlines()[0]
        assert first.startswith(f"# agent_loop_cli.py {cli.__version__}: ")
