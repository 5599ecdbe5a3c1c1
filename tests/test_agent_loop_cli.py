"""Tests of agent_loop_cli.py: the command line, run as a user runs it.

``main(argv)`` runs in this process against loop_testing_providers' fixture server (a local
``http.server`` on 127.0.0.1 and a free port, started and stopped by a fixture whatever
happens), and a subprocess runs the file itself for Ctrl-C and a reader that leaves
early. What it prints is ``agent_loop.print_event``'s lines (tested line by line in
test_docs_and_demo.py) or, with ``--json``, ``agent_loop_replay.dump_events``'s lines
with each event's time; the run's times end stderr (their figures vary: tests match their
shape). ``view LOG -o PAGE.html`` reads a ``--json`` log, a ``dump_events`` log and a
durable journal.
``--mcp`` starts the canned MCP server of mcp_fake_server.py (as test_agent_loop_mcp.py
does); ``--confirm`` reads a fake stdin. No test reaches beyond 127.0.0.1, and none
names a private name of agent_loop_cli or of the modules it uses.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shlex
import signal as os_signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, TextIO, Tuple

import pytest

import agent_loop as al
import agent_loop_cli as cli
import agent_loop_replay as replay
from loop_testing import REPOSITORY
from loop_testing_providers import (
    END_HINT,
    OPENAI_REASONING_STREAM,
    REASONING_USAGE,
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
    openai_chunk,
    openai_sent_call,
    serving,
)
from test_agent_loop_mcp import Canned, alive


@pytest.fixture
def server() -> Iterator[Server]:
    with serving() as state:
        yield state


def argv(server: Server, provider: str = "openai", *more: str) -> List[str]:
    """A command line for the fixture server, with no retries, then more."""
    url = server.url + "/v1" if provider == "openai" else server.url
    return ["--provider", provider, "--base-url", url, "--model", "m", "--retries", "0", *more]


TIMES = re.compile(
    r"times: \d+(?: ms|\.\d\d s) in all\n"
    r"(?:  request-\d{3}: first chunk after [^\n]+, streamed [^\n]+\n"
    r"(?:    \w+ \[[^\]]+\]: [^\n]+\n)*)*\Z"
)
"""The run's times, which end what the command line writes on stderr."""


def before_times(err: str) -> str:
    """What the command line wrote on stderr before the run's times (whose figures vary)."""
    head, found, times = err.partition("times: ")
    assert found
    assert TIMES.match(found + times), found + times
    return head


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
            f"finish_reason: the answer is incomplete {END_HINT}",
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
        out = capsys.readouterr().out
        events = replay.load_events(io.StringIO(out))
        assert [event.sequence for event in events] == list(range(len(out.splitlines())))
        # Each line is dump_events' line with the event's time added.
        lines = [json.loads(line) for line in out.splitlines()]
        times = [line.pop("time") for line in lines]
        assert all(type(time) is float for time in times)
        assert times == sorted(times)
        assert times[0] >= 0
        written = io.StringIO()
        replay.dump_events(events, written)
        assert written.getvalue() == "".join(
            json.dumps(line, separators=(",", ":")) + "\n" for line in lines
        )
        assert events[1].payload["chunk"] == al.ThinkingDelta("request-001", "27 * 453: ")
        result = events[-1].payload["result"]
        assert (result.final_text, result.usage) == ("12,231", REASONING_USAGE)
        usage = json.loads(out.splitlines()[-1])["payload"]["result"]["usage"]
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
        assert before_times(captured.err) == (
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
                    ("openai", "concurrency-low", "--tool-concurrency 0", "0 is not >= 1"),
                    ("openai", "concurrency-text", "--tool-concurrency x", "'x' is not an"),
                    ("openai", "mcp-empty", "--mcp ''", "the command is empty"),
                    ("openai", "mcp-quote", "--mcp '\"server'", "is not a command line"),
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
            "--tool-concurrency",
            "--confirm",
            "--mcp",
            "--json",
        ]


ADD_AND_WEATHER: List[AnswerItem] = [
    ("c1", "add", {"left": 2, "right": 3}),
    ("c2", "weather", {"city": "Oslo"}),
]

ONE_BY_ONE = [
    '  3  tool.started      request-001 add({"left":2,"right":3}) [c1]',
    '  4  tool.finished     request-001 add ok: {"sum":5}',
    '  5  tool.started      request-001 weather({"city":"Oslo"}) [c2]',
    "  6  tool.finished     request-001 weather ok: snow, -3 C",
]

QUESTIONS = 'run add({"left":2,"right":3}) [c1]? [y/N] run weather({"city":"Oslo"}) [c2]? [y/N] '

REFUSED = "the user refused to run this tool call"


class TestToolsAtOnceAndConsent:
    """--tool-concurrency N reaches the run; --confirm asks before each call, on stderr,
    and reads the answer from stdin: y runs the call, anything else refuses it."""

    @pytest.mark.parametrize(
        ("more", "tool_lines"),
        [
            pytest.param([], ONE_BY_ONE, id="default-one-by-one"),
            pytest.param(["--tool-concurrency", "1"], ONE_BY_ONE, id="the-least"),
            pytest.param(
                ["--tool-concurrency", "2"],
                [
                    '  3  tool.started      request-001 add({"left":2,"right":3}) [c1]',
                    '  4  tool.started      request-001 weather({"city":"Oslo"}) [c2]',
                    '  5  tool.finished     request-001 add ok: {"sum":5}',
                    "  6  tool.finished     request-001 weather ok: snow, -3 C",
                ],
                id="at-once-started-first",
            ),
        ],
    )
    def test_tool_concurrency(
        self,
        server: Server,
        capsys: pytest.CaptureFixture[str],
        more: List[str],
        tool_lines: List[str],
    ) -> None:
        server.script(
            Reply(answer_parts("openai", ADD_AND_WEATHER)),
            Reply(answer_parts("openai", ["5; snow."])),
        )
        assert cli.main(argv(server, "openai", *more, "2+3? Oslo?")) == 0
        assert capsys.readouterr().out.splitlines()[3:7] == tool_lines

    @pytest.mark.parametrize(
        ("answers", "runs"),
        [
            pytest.param("y\nn\n", (True, False), id="y-runs-n-refuses"),
            pytest.param("Yes\n  y  \n", (True, True), id="yes-and-spaces"),
            pytest.param("\nyy\n", (False, False), id="empty-and-other-words-refuse"),
            pytest.param("no\n", (False, False), id="the-end-of-input-refuses"),
        ],
    )
    def test_confirm(
        self,
        server: Server,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
        answers: str,
        runs: Tuple[bool, bool],
    ) -> None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(answers))
        server.script(
            Reply(answer_parts("openai", ADD_AND_WEATHER)),
            Reply(answer_parts("openai", ["Done."])),
        )
        assert cli.main(argv(server, "openai", "--confirm", "2+3? Oslo?")) == 0
        captured = capsys.readouterr()
        refused = [
            f"  4  tool.finished     request-001 add refused: {REFUSED}",
            f"  6  tool.finished     request-001 weather refused: {REFUSED}",
        ]
        outcomes = [
            ONE_BY_ONE[1] if runs[0] else refused[0],
            ONE_BY_ONE[3] if runs[1] else refused[1],
        ]
        assert captured.out.splitlines()[3:7] == [
            ONE_BY_ONE[0],
            outcomes[0],
            ONE_BY_ONE[2],
            outcomes[1],
        ]
        # The questions on stderr; past the end of input, a line break ends the question.
        assert before_times(captured.err) == QUESTIONS + ("\n" if answers.count("\n") < 2 else "")
        # The model reads the refusal as the call's error result.
        sent = [message.get("content") for message in server.body(1)["messages"][2:4]]
        assert sent == [
            '{"sum":5}' if runs[0] else REFUSED,
            "snow, -3 C" if runs[1] else REFUSED,
        ]

    def test_an_unreadable_stdin_refuses(
        self, server: Server, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        closed = io.StringIO("y\n")
        closed.close()  # readline raises ValueError
        monkeypatch.setattr(sys, "stdin", closed)
        server.script(
            Reply(answer_parts("openai", ADD_AND_WEATHER[:1])),
            Reply(answer_parts("openai", ["Done."])),
        )
        assert cli.main(argv(server, "openai", "--confirm", "2+3?")) == 0
        captured = capsys.readouterr()
        assert captured.out.splitlines()[3] == (
            f"  3  tool.finished     request-001 add refused: {REFUSED}"
        )
        assert before_times(captured.err) == 'run add({"left":2,"right":3}) [c1]? [y/N] \n'

    def test_questions_come_before_a_group_is_scheduled(
        self, server: Server, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(sys, "stdin", io.StringIO("n\ny\n"))
        server.script(
            Reply(answer_parts("openai", ADD_AND_WEATHER)),
            Reply(answer_parts("openai", ["Done."])),
        )
        more = ["--confirm", "--tool-concurrency", "2", "2+3? Oslo?"]
        assert cli.main(argv(server, "openai", *more)) == 0
        captured = capsys.readouterr()
        assert captured.out.splitlines()[3:7] == [
            ONE_BY_ONE[0],
            '  4  tool.started      request-001 weather({"city":"Oslo"}) [c2]',
            f"  5  tool.finished     request-001 add refused: {REFUSED}",
            "  6  tool.finished     request-001 weather ok: snow, -3 C",
        ]
        assert before_times(captured.err) == QUESTIONS

    def test_ctrl_c_at_the_question_cancels_the_run(
        self, server: Server, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The question does not hold the run: the call stays open, no tool runs."""

        class Waiting:
            """A terminal nobody answers, until the test ends."""

            asked = threading.Event()
            released = threading.Event()

            def readline(self) -> str:
                self.asked.set()
                self.released.wait(SERVER_BOUND)
                return "y\n"

        stdin = Waiting()
        monkeypatch.setattr(sys, "stdin", stdin)
        server.script(Reply(answer_parts("openai", ADD_AND_WEATHER[:1])))

        def interrupt() -> None:
            if stdin.asked.wait(SERVER_BOUND):
                time.sleep(0.2)  # a person thinks it over: the question polls its signal a while
                os.kill(os.getpid(), os_signal.SIGINT)

        interrupter = threading.Thread(target=interrupt)
        interrupter.start()
        try:
            status = cli.main(argv(server, "openai", "--confirm", "2+3?"))
        finally:
            stdin.released.set()
            interrupter.join(SERVER_BOUND)
        captured = capsys.readouterr()
        assert status == 1
        assert captured.out.splitlines()[2:] == [
            "  2  run.finished      cancelled after 1 step(s), 2 messages, usage: unknown, "
            "left without a result: c1",
        ]
        assert before_times(captured.err) == 'run add({"left":2,"right":3}) [c1]? [y/N] \n'


def mcp_option(canned: Canned) -> List[str]:
    return ["--mcp", shlex.join(canned.command)]


def canned_in(folder: Path, **config: Any) -> Canned:
    folder.mkdir()
    return Canned(folder, **config)


class TestMcp:
    """--mcp "COMMAND ARGS": a server's tools join TOOLS; the servers end with the run."""

    def test_a_servers_tools_join_the_command_lines(
        self, server: Server, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        canned = Canned(tmp_path)
        server.script(
            Reply(
                answer_parts(
                    "openai",
                    [("c1", "echo", {"text": "hi"}), ("c2", "add", {"left": 2, "right": 3})],
                )
            ),
            Reply(answer_parts("openai", ["hi, 5"])),
        )
        assert cli.main(argv(server, "openai", *mcp_option(canned), "Echo hi, add")) == 0
        assert capsys.readouterr().out.splitlines()[3:7] == [
            '  3  tool.started      request-001 echo({"text":"hi"}) [c1]',
            "  4  tool.finished     request-001 echo ok: hi",
            '  5  tool.started      request-001 add({"left":2,"right":3}) [c2]',
            '  6  tool.finished     request-001 add ok: {"sum":5}',
        ]
        names = [tool["function"]["name"] for tool in server.body()["tools"]]
        assert names[:4] == ["add", "multiply", "weather", "echo"]
        assert "slow" in names
        calls = [m for m in canned.received() if m.get("method") == "tools/call"]
        assert [m["params"]["name"] for m in calls] == ["echo"]
        assert not alive(canned.pid())  # ended with the run

    def test_many_servers(
        self, server: Server, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        first = canned_in(tmp_path / "first", only=["echo"])
        second = canned_in(tmp_path / "second", only=["big"])
        server.script(
            Reply(
                answer_parts(
                    "openai", [("c1", "echo", {"text": "hi"}), ("c2", "big", {"size": 3})]
                )
            ),
            Reply(answer_parts("openai", ["hi, xxx"])),
        )
        more = ["--tool-concurrency", "2", *mcp_option(first), *mcp_option(second), "Hi"]
        assert cli.main(argv(server, "openai", *more)) == 0
        assert capsys.readouterr().out.splitlines()[5:7] == [
            "  5  tool.finished     request-001 echo ok: hi",
            "  6  tool.finished     request-001 big ok: xxx",
        ]
        names = [tool["function"]["name"] for tool in server.body()["tools"]]
        assert names == ["add", "multiply", "weather", "echo", "big"]
        assert not any(alive(canned.pid()) for canned in (first, second))

    @pytest.mark.parametrize("clash", ["add", "echo"])
    def test_a_tool_name_given_twice_is_a_usage_error(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path, clash: str
    ) -> None:
        extra = [{"name": "add", "description": "Adds.", "inputSchema": {"type": "object"}}]
        first = canned_in(tmp_path / "first", extra_tools=extra if clash == "add" else [])
        second = canned_in(tmp_path / "second")
        more = [*mcp_option(first), *([] if clash == "add" else mcp_option(second))]
        good = ["--provider", "openai", "--base-url", "http://h", "--model", "m"]
        with pytest.raises(SystemExit) as exited:
            cli.main([*good, *more, "p"])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("usage: python agent_loop_cli.py")
        where = f"--mcp {shlex.join(first.command)!r}"
        if clash == "add":
            tools = "the command line's own tools"
            assert f"two tools are named 'add': one of {tools} and one of {where}" in err
        else:
            other = f"--mcp {shlex.join(second.command)!r}"
            assert f"two tools are named 'echo': one of {where} and one of {other}" in err
        # Every server started is closed, whatever happened.
        pids = [canned.pid() for canned in (first, second) if canned.pid_file.exists()]
        assert len(pids) == (1 if clash == "add" else 2)
        assert not any(alive(pid) for pid in pids)

    def test_a_server_that_cannot_be_used_is_a_usage_error(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        missing = tmp_path / "no-such-server"
        good = ["--provider", "openai", "--base-url", "http://h", "--model", "m"]
        with pytest.raises(SystemExit) as exited:
            cli.main([*good, "--mcp", f"{missing} --flag", "p"])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert f"error: --mcp '{missing} --flag': MCP server '{missing}': could not start" in err


class TestCancellation:
    """Ctrl-C sets the run's signal: the run ends cancelled and its result is printed."""

    def test_sigint_sets_the_signal(
        self,
        server: Server,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        server.script(Reply([openai_chunk({"content": "Thinking"})], stall=True))
        print_event = al.print_event

        def interrupting(event: al.Event, file: Optional[TextIO] = None) -> None:
            """Prints the line as main() does; SIGINT comes once the chunk is printed.

            main() is still running (the server holds the stream open), with its handler
            installed. (A signal that lands in another thread: TestCtrlCInAnyThread.)
            """
            print_event(event, file)
            if event.type == "model.chunk":
                os.kill(os.getpid(), os_signal.SIGINT)

        monkeypatch.setattr(al, "print_event", interrupting)
        before = os_signal.getsignal(os_signal.SIGINT)
        status = cli.main(argv(server, "openai", "Hi"))
        assert status == 1
        assert capsys.readouterr().out.splitlines()[1:] == [
            '  1  model.chunk       request-001 text "Thinking"',
            "  2  run.finished      cancelled after 1 step(s), 1 messages",
        ]
        assert os_signal.getsignal(os_signal.SIGINT) is before  # restored

    def test_ctrl_c_cancels_and_prints_the_result(self, server: Server) -> None:
        server.script(Reply([openai_chunk({"content": "Thinking"})], stall=True))
        lines: List[str] = []
        printed = threading.Event()
        with start(server, "Hi") as process:
            assert process.stdout is not None
            assert process.stderr is not None
            stdout = process.stdout

            def read() -> None:
                """The child's stdout, each line as it is printed (print_event flushes)."""
                for line in stdout:
                    lines.append(line)
                    if " model.chunk " in line:
                        printed.set()

            reader = threading.Thread(target=read)
            reader.start()
            try:
                # Once the chunk is printed, main() has installed its handler; the server
                # holds the stream open, so the run waits on the network.
                assert printed.wait(SERVER_BOUND)
                process.send_signal(os_signal.SIGINT)
                process.wait(SERVER_BOUND)
            finally:
                if process.poll() is None:
                    process.kill()
                reader.join(SERVER_BOUND)  # the child has ended: its stdout ends
            err = process.stderr.read()
        assert process.returncode == 1
        assert "".join(lines).splitlines()[1:] == [
            '  1  model.chunk       request-001 text "Thinking"',
            "  2  run.finished      cancelled after 1 step(s), 1 messages",
        ]
        assert before_times(err) == ""
        assert server.disconnected.wait(SERVER_BOUND)


class TestCtrlCInAnyThread:
    """A SIGINT that lands in another thread than the main one sets the run's signal at
    once: Python would run its handler only when the main thread's wait returns."""

    def test_it_sets_the_signal_while_the_main_thread_blocks(self) -> None:
        signal = threading.Event()
        handled: List[int] = []
        before = os_signal.signal(os_signal.SIGINT, lambda number, frame: handled.append(number))
        try:
            with cli._ctrl_c_sets(signal):
                # pthread_kill: the signal lands in the sending thread, so no signal
                # interrupts the main thread's wait, as none interrupts a socket read then.
                sender = threading.Thread(
                    target=lambda: os_signal.pthread_kill(threading.get_ident(), os_signal.SIGINT)
                )
                sender.start()
                assert signal.wait(SERVER_BOUND)
                sender.join(SERVER_BOUND)
        finally:
            os_signal.signal(os_signal.SIGINT, before)
        assert handled == [os_signal.SIGINT]  # Python's handler ran too, once main woke

    def test_another_signal_does_not_set_it(self) -> None:
        signal = threading.Event()
        before = os_signal.signal(os_signal.SIGUSR1, lambda number, frame: None)
        try:
            with cli._ctrl_c_sets(signal):
                os_signal.raise_signal(os_signal.SIGUSR1)
        finally:
            os_signal.signal(os_signal.SIGUSR1, before)
        # The block's end waits for the thread, which read SIGUSR1's number first.
        assert not signal.is_set()

    def test_the_wakeup_fd_before_it_is_given_back(self) -> None:
        receiving, sending = socket.socketpair()
        with receiving, sending:
            sending.setblocking(False)
            before = os_signal.set_wakeup_fd(sending.fileno())
            try:
                with cli._ctrl_c_sets(threading.Event()):
                    pass
                assert os_signal.set_wakeup_fd(before) == sending.fileno()
            finally:
                os_signal.set_wakeup_fd(before)


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

    def test_the_providers_file_says_where_its_command_line_went(self) -> None:
        """Its command line moved here in 1.3.0: `python agent_loop_providers.py` says so."""
        finished = subprocess.run(
            [sys.executable, "agent_loop_providers.py", "--provider", "openai"],
            cwd=REPOSITORY,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert (finished.returncode, finished.stdout) == (1, "")
        assert finished.stderr == (
            "agent_loop_providers.py has no command line: run python agent_loop_cli.py\n"
        )

    def test_it_uses_only_public_names_of_the_modules_it_imports(self) -> None:
        source = (REPOSITORY / "agent_loop_cli.py").read_text(encoding="utf-8")
        assert re.findall(r"\b(?:al|providers|replay|mcp|view|workspace)\._\w+", source) == []
        assert re.findall(r"^import (\w+)", source, flags=re.MULTILINE) == [
            "argparse",
            "contextlib",
            "inspect",
            "json",
            "logging",
            "os",
            "shlex",
            "signal",
            "socket",
            "sys",
            "threading",
            "time",
            "agent_loop",
            "agent_loop_mcp",
            "agent_loop_providers",
            "agent_loop_replay",
            "agent_loop_view",
            "agent_loop_workspace",
        ]

    def test_the_header_names_the_file_and_its_version(self) -> None:
        first = (REPOSITORY / "agent_loop_cli.py").read_text(encoding="utf-8").splitlines()[0]
        assert first.startswith(f"# agent_loop_cli.py {cli.__version__}: ")


class TestTimes:
    """After a run, its times on stderr: the run's, each step's, each call's."""

    @pytest.mark.parametrize("more", [[], ["--json"]], ids=["printed", "json"])
    def test_the_times_of_each_step_and_call_end_stderr(
        self, server: Server, capsys: pytest.CaptureFixture[str], more: List[str]
    ) -> None:
        server.script(
            Reply(answer_parts("openai", ["Adding", *ADD_AND_WEATHER])),
            Reply(answer_parts("openai", ["5."])),
        )
        assert cli.main(argv(server, "openai", *more, "2+3?")) == 0
        err = capsys.readouterr().err
        assert before_times(err) == ""  # and the times' lines have their shape
        names = [re.sub(r": [^:]*$", "", line) for line in err.splitlines()[1:]]
        assert names == [
            "  request-001",
            "    add [c1]",
            "    weather [c2]",
            "  request-002",
        ]

    def test_a_json_line_is_timed_when_what_it_reports_happened(
        self, server: Server, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # The loop's clock runs an hour ahead: only what the loop times itself (a
        # tool.finished: when its tool returned) is an hour into the run.
        clock = time.time
        monkeypatch.setattr(al, "time", type("Clock", (), {"time": lambda: clock() + 3600}))
        server.script(
            Reply(answer_parts("openai", ["Adding", *ADD_AND_WEATHER])),
            Reply(answer_parts("openai", ["5."])),
        )
        assert cli.main(argv(server, "openai", "--json", "2+3?")) == 0
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        late = [line["type"] for line in lines if line["time"] >= 3600]
        assert late == ["tool.finished", "tool.finished"]


def write_lines(path: Path, lines: List[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def add_then_answer() -> Tuple[al.ScriptedModel, al.ToolRegistry]:
    """A scripted model that calls add once, then answers, and the command line's tools."""
    model = al.ScriptedModel(
        [
            al.scripted_response(
                "r1", [al.ToolCall("c1", "add", {"left": 2, "right": 3})], "toolCall"
            ),
            al.scripted_response("r2", [al.TextBlock("5.")], "stop"),
        ]
    )
    return model, al.ToolRegistry(cli.TOOLS)


def add_run_log(path: Path) -> Path:
    """A log of dump_events, of a run of add_then_answer(), at path."""
    model, tools = add_then_answer()
    run = al.run_agent_loop(
        messages=[al.UserMessage("u", "2+3?")], model=model, tools=tools, max_steps=2
    )
    with path.open("w", encoding="utf-8") as file:
        replay.dump_events(al.settle_run(run)[0], file)
    return path


def shown(page: Path) -> Dict[str, Any]:
    """The run's data that a page written by view embeds."""
    match = re.search(r'id="run-data">(.*?)</script>', page.read_text(encoding="utf-8"))
    assert match is not None
    return json.loads(match.group(1))  # type: ignore[no-any-return]


ACCEPTED = (
    '{"sequence":0,"type":"message.accepted","payload":'
    '{"message":{"id":"u","role":"user","content":"Hi"}}}'
)
"""The line of an event that event_from_dict() reads."""


class TestView:
    """`view LOG -o PAGE.html`: the page of a --json log, a dump_events log or a journal."""

    def test_a_json_log_of_the_command_line(
        self, server: Server, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        server.script(
            Reply(answer_parts("openai", ["Adding", *ADD_AND_WEATHER])),
            Reply(answer_parts("openai", ["5."])),
        )
        assert cli.main(argv(server, "openai", "--json", "2+3?")) == 0
        log = tmp_path / "run.jsonl"
        log.write_text(capsys.readouterr().out, encoding="utf-8")
        page = tmp_path / "run.html"
        assert cli.main(["view", str(log), "-o", str(page)]) == 0
        data = shown(page)
        assert (data["title"], data["timed"]) == ("Agent run: run.jsonl", True)
        calls = data["steps"][0]["calls"]
        assert [(call["name"], call["status"]) for call in calls] == [
            ("add", "ok"),
            ("weather", "ok"),
        ]
        assert all(call["duration"].endswith(" ms") for call in calls)
        assert data["result"]["status"] == "completed"

    def test_a_log_of_dump_events_without_times(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        log = add_run_log(tmp_path / "run.jsonl")
        page = tmp_path / "run.html"
        # Run as a user runs it: the arguments come from the command line.
        monkeypatch.setattr(sys, "argv", ["agent_loop_cli.py", "view", str(log), "-o", str(page)])
        assert cli.main() == 0
        data = shown(page)
        assert (data["timed"], data["span"]) == (False, 5)  # 6 events
        assert [step["requestId"] for step in data["steps"]] == ["request-001", "request-002"]

    def test_a_durable_journal_with_a_resume_record(self, tmp_path: Path) -> None:
        model, tools = add_then_answer()
        journal = tmp_path / "run.journal"
        al.settle_run(
            replay.durable_run(
                journal,
                messages=[al.UserMessage("u", "2+3?")],
                model=model,
                tools=tools,
                max_steps=2,
            )
        )
        lines = journal.read_text(encoding="utf-8").splitlines()
        assert json.loads(lines[0])["record"] == "run"
        # A process took over after the call's tool.started (event 2): the events from 2
        # on are void and come again (here, the same lines). Read twice, the call would
        # be two calls at once.
        started = next(n for n, line in enumerate(lines) if '"tool.started"' in line)
        resumed = [*lines[: started + 1], '{"record":"resume","sequence":2}', *lines[started:]]
        page = tmp_path / "run.html"
        assert cli.main(["view", str(write_lines(journal, resumed)), "-o", str(page)]) == 0
        data = shown(page)
        assert data["result"]["status"] == "completed"
        assert [step["requestId"] for step in data["steps"]] == ["request-001", "request-002"]
        assert [call["status"] for call in data["steps"][0]["calls"]] == ["ok"]

    @pytest.mark.parametrize(
        ("lines", "complaint"),
        [
            pytest.param([], "no event in the file", id="empty"),
            pytest.param(['{"sequence":0', "x"], "line 1: not JSON (", id="not-json"),
            pytest.param(["[1]"], "line 1: event must be", id="json-not-an-event"),
            pytest.param(
                ['{"sequence":0,"type":"model.chunk","payload":{}}'],
                "line 1: event.payload.requestId is missing",
                id="an-event-without-its-payload",
            ),
            pytest.param(
                [ACCEPTED[:-1] + ',"time":"soon"}'],
                "line 1: time must be a number of seconds >= 0, got 'soon'",
                id="time-a-str",
            ),
            pytest.param(
                [ACCEPTED[:-1] + ',"time":-0.5}'],
                "line 1: time must be a number of seconds >= 0, got -0.5",
                id="time-below-0",
            ),
            pytest.param(
                ['{"record":"run"}', '{"record":"resume","sequence":"1"}'],
                "journal {log}, line 1: a journal of format None; this durable_run() reads",
                id="a-journal-that-durable-runs-refuse",
            ),
        ],
    )
    def test_a_log_that_holds_no_run_exits_2_naming_the_line(
        self,
        tmp_path: Path,
        capsys: pytest.CaptureFixture[str],
        lines: List[str],
        complaint: str,
    ) -> None:
        log = write_lines(tmp_path / "bad.jsonl", lines)
        page = tmp_path / "bad.html"
        with pytest.raises(SystemExit) as exited:
            cli.main(["view", str(log), "-o", str(page)])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("usage: python agent_loop_cli.py view")
        assert f"error: {log}: {complaint.format(log=log)}" in err
        assert not page.exists()

    @pytest.mark.parametrize("where", ["log", "not-utf-8", "page", "no-page-option"])
    def test_files_it_cannot_use_exit_2(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
    ) -> None:
        log = add_run_log(tmp_path / "run.jsonl")
        if where == "not-utf-8":
            log.write_bytes(b"\xff\n")
        missing = tmp_path / "missing"
        arguments = {
            "log": [str(missing / "run.jsonl"), "-o", str(tmp_path / "run.html")],
            "not-utf-8": [str(log), "-o", str(tmp_path / "run.html")],
            "page": [str(log), "-o", str(missing / "run.html")],
            "no-page-option": [str(log)],
        }[where]
        with pytest.raises(SystemExit) as exited:
            cli.main(["view", *arguments])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert {
            "log": f"error: {missing / 'run.jsonl'}: [Errno 2] No such file",
            "not-utf-8": f"error: {log}: 'utf-8' codec can't decode byte 0xff",
            "page": f"error: {missing / 'run.html'}: [Errno 2] No such file",
            "no-page-option": "error: the following arguments are required: -o/--output",
        }[where] in err
