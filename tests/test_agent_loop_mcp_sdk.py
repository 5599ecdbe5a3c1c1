"""agent_loop_mcp.py against servers built with the official MCP SDK (``tox -e mcp``).

SDK_SERVER is an ``MCPServer`` (the SDK's FastMCP) with typed tools: optionals, defaults,
enums, nested models and bounds. It runs over stdio, and over Streamable HTTP on
127.0.0.1 and a free port. Each tool writes what it does to an effects file, one line
each, and a middleware writes each ``notifications/cancelled`` the server receives, so a
test sees that an invalid call never ran the effect and that a cancel reached the server.

The SDK takes a second or more to import, so one server per transport serves the module
and each test starts from an empty effects file; the tests that end a server (a crash,
``close()``) start their own. Real runs go through run_agent_loop with a ScriptedModel
that calls the server's tools. The tests skip where the SDK is not importable, unless
``AGENT_LOOP_REQUIRE_MCP=1`` (set by tox's mcp env) turns the skip into a failure.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest

import agent_loop as al
import agent_loop_cli as cli
import agent_loop_mcp as mcp
from loop_testing import AT_LIMIT, OVER_LIMIT, plain_copy, run
from loop_testing_providers import Reply, answer_parts, eventually, free_port, serving
from test_agent_loop_mcp import CANCEL_BOUND, alive

_REQUIRED = os.environ.get("AGENT_LOOP_REQUIRE_MCP") == "1"
_HAS_SDK = (
    importlib.util.find_spec("mcp") is not None
    and importlib.util.find_spec("mcp.server.mcpserver") is not None
)

SDK_SERVER = '''
import enum, os, subprocess, sys
from typing import List, Optional

import anyio
from pydantic import BaseModel, Field
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

effects = sys.argv[2]


def effect(what: str) -> None:
    with open(effects, "a") as log:
        log.write(what + "\\n")


async def told(ctx, call_next):
    """Writes each notifications/cancelled the client sends, as the server received it."""
    if ctx.method == "notifications/cancelled":
        effect(f"told: cancelled {ctx.params['requestId']}: {ctx.params.get('reason')}")
    return await call_next(ctx)


server = MCPServer("typed", middleware=[told])


class Unit(str, enum.Enum):
    celsius = "celsius"
    fahrenheit = "fahrenheit"


class Address(BaseModel):
    street: str
    zip_code: str = Field(min_length=5, max_length=5)


@server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=True))
def forecast(
    city: str,
    days: int = Field(default=1, ge=1, le=7),
    unit: Unit = Unit.celsius,
    note: Optional[str] = None,
) -> str:
    """The forecast for a city."""
    effect("forecast")
    return f"{city}: {days} day(s) in {unit.value}" + (f" ({note})" if note else "")


@server.tool()
def ship(to: Address, parcels: List[Address] = []) -> dict:
    """Ships parcels to an address."""
    effect("ship")
    return {"street": to.street, "parcels": len(parcels)}


@server.tool(
    title="Remove a city",
    annotations=ToolAnnotations(title="Old title", destructive_hint=True, idempotent_hint=True),
)
def remove(city: str) -> str:
    """Removes a city (a destructive tool, as its annotations say)."""
    effect(f"remove {city}")
    return f"{city} removed"


@server.tool()
def fail(city: str) -> str:
    """An anticipated failure: the SDK sends its text to the client."""
    effect("fail")
    raise ToolError(f"the city {city} is unknown")


@server.tool()
def broken(city: str) -> str:
    """An unexpected exception: the SDK keeps its text on the server."""
    effect("broken")
    raise ValueError(f"a secret about {city}")


@server.tool()
async def slow() -> str:
    effect("slow")
    try:
        await anyio.sleep(60)
    except anyio.get_cancelled_exc_class():
        effect("slow: cancelled")
        raise
    effect("slow: finished")
    return "too late"


gate = []  # its anyio.Event, made in the server's loop


@server.tool()
async def progress(ctx: Context, steps: int, interval: float, gated: bool = False) -> str:
    """Reports each step; gated, it waits after the first until open_gate() is called."""
    for step in range(steps):
        await anyio.sleep(interval)
        await ctx.report_progress(step + 1, steps)
        if gated and step == 0:
            gate[:] = [anyio.Event()]
            with anyio.move_on_after(30):
                await gate[0].wait()
            if not gate[0].is_set():
                return "the gate never opened"
    return "done"


@server.tool()
def open_gate() -> str:
    gate[0].set()
    return "open"


@server.tool()
def crash() -> str:
    os._exit(3)


@server.tool()
def big(size: int) -> str:
    return "x" * size


@server.tool()
async def change(ctx: Context, name: str) -> str:
    """Adds a tool of that name, and says the list changed."""
    server.add_tool(lambda: "new", name=name)
    await ctx.session.send_tool_list_changed()
    return "changed"


@server.tool()
def spawn() -> str:
    """Starts a process that outlives this call; answers the server's pid and its own."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    return f"{os.getpid()} {child.pid}"


if sys.argv[1] == "stdio":
    server.run()
else:
    server.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
'''

TRANSPORTS = ("stdio", "http")


class Sdk:
    """The server's script and its effects file, in a folder of their own."""

    def __init__(self, folder: Path) -> None:
        self.script = folder / "sdk_server.py"
        self.script.write_text(SDK_SERVER, encoding="utf-8")
        self.effects = folder / "effects.txt"

    def ran(self) -> List[str]:
        """What the server did (and was told) since the last reset, in order."""
        return self.effects.read_text().splitlines() if self.effects.exists() else []

    def reset(self) -> None:
        self.effects.unlink(missing_ok=True)


@pytest.fixture(scope="module", autouse=True)
def _sdk() -> None:
    if not _HAS_SDK:
        if _REQUIRED:
            pytest.fail("AGENT_LOOP_REQUIRE_MCP=1 but the mcp SDK (2.x) is not importable")
        pytest.skip("the mcp SDK (Python >= 3.10) is not installed: run `tox -e mcp`")


@pytest.fixture(scope="module")
def sdk(tmp_path_factory: pytest.TempPathFactory) -> Sdk:
    return Sdk(tmp_path_factory.mktemp("sdk"))


@pytest.fixture(scope="module")
def http_endpoint(_sdk: None, sdk: Sdk) -> Iterator[Callable[[], str]]:
    """Starts SDK servers over HTTP (each on a free port), and stops each whatever happens."""
    processes: List[subprocess.Popen[bytes]] = []

    def start() -> str:
        port = free_port()
        process = subprocess.Popen(
            [sys.executable, str(sdk.script), str(port), str(sdk.effects)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        processes.append(process)
        url = f"http://127.0.0.1:{port}/mcp"
        deadline = time.monotonic() + 30
        while True:  # until it answers
            try:
                with mcp.HttpServer(url, timeout=2) as probe:
                    probe.tools()
                return url
            except mcp.McpError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.1)

    try:
        yield start
    finally:
        for process in processes:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def connect(transport: str, sdk: Sdk, http_endpoint: Callable[[], str]) -> Any:
    """A new server of that transport (for a with block, which opens its session)."""
    if transport == "stdio":
        return mcp.StdioServer([sys.executable, str(sdk.script), "stdio", str(sdk.effects)])
    return mcp.HttpServer(http_endpoint())


@pytest.fixture(scope="module", params=TRANSPORTS)
def shared(
    request: pytest.FixtureRequest, _sdk: None, sdk: Sdk, http_endpoint: Callable[[], str]
) -> Iterator[Any]:
    """The module's server of each transport."""
    with connect(request.param, sdk, http_endpoint) as server:
        yield server


@pytest.fixture
def server(shared: Any, sdk: Sdk) -> Any:
    """The module's server, its effects file empty."""
    sdk.reset()
    return shared


@pytest.fixture(params=TRANSPORTS)
def own_server(
    request: pytest.FixtureRequest, _sdk: None, sdk: Sdk, http_endpoint: Callable[[], str]
) -> Iterator[Any]:
    """A server of its own, for a test that ends it."""
    sdk.reset()
    with connect(request.param, sdk, http_endpoint) as server:
        yield server


def call(
    server: Any, name: str, arguments: Dict[str, Any], signal: Any = None
) -> al.ToolResultMessage:
    """One call as the loop makes it: the arguments checked, then the tool executed."""
    tools = al.ToolRegistry(server.tools())
    return al.execute_tool_call(
        tools, al.ToolCall("c", name, arguments), signal or threading.Event()
    )


def sdk_tool(server: Any, name: str) -> al.Tool:
    tool = al.ToolRegistry(server.tools()).get(name)
    assert tool is not None
    return tool


VALID = [
    pytest.param("forecast", {"city": "Oslo"}, "Oslo: 1 day(s) in celsius", id="defaults"),
    pytest.param(
        "forecast",
        {"city": "Oslo", "days": 7, "unit": "fahrenheit", "note": "windy"},
        "Oslo: 7 day(s) in fahrenheit (windy)",
        id="all-given-maximum",
    ),
    pytest.param(
        "forecast", {"city": "Oslo", "days": 1}, "Oslo: 1 day(s) in celsius", id="minimum"
    ),
    pytest.param(
        "forecast", {"city": "Oslo", "note": None}, "Oslo: 1 day(s) in celsius", id="null"
    ),
    pytest.param(
        "ship",
        {
            "to": {"street": "Main", "zip_code": "12345"},
            "parcels": [{"street": "A", "zip_code": "00000"}],
        },
        {"street": "Main", "parcels": 1},
        id="nested",
    ),
]

INVALID = [
    pytest.param("forecast", {}, id="missing"),
    pytest.param("forecast", {"city": "Oslo", "days": 8}, id="over-maximum"),
    pytest.param("forecast", {"city": "Oslo", "days": 0}, id="under-minimum"),
    pytest.param("forecast", {"city": "Oslo", "unit": "kelvin"}, id="not-in-enum"),
    pytest.param("forecast", {"city": 3}, id="wrong-type"),
    pytest.param("ship", {"to": {"street": "Main", "zip_code": "123"}}, id="nested-min-length"),
    pytest.param("ship", {"to": {"street": "M", "zip_code": "123456"}}, id="nested-max-length"),
    pytest.param("ship", {"to": {"street": "Main"}}, id="nested-missing"),
    pytest.param("ship", {"to": {"street": "M", "zip_code": "12345"}, "parcels": [3]}, id="items"),
]


class TestTypedTools:
    """Every tool of a typed server can be built; invalid arguments never run the effect."""

    def test_every_tool_is_usable(self, server: Any) -> None:
        tools = {tool.name: tool for tool in server.tools()}
        assert {"forecast", "ship", "fail", "broken", "slow", "crash", "big"} <= set(tools)
        # The schemas are the server's, as pydantic wrote them.
        forecast = plain_copy(tools["forecast"].parameters)
        assert forecast["required"] == ["city"]
        assert forecast["properties"]["days"] == {
            "default": 1,
            "maximum": 7,
            "minimum": 1,
            "title": "Days",
            "type": "integer",
        }
        assert "$defs" in forecast
        assert "$ref" in json.dumps(forecast["properties"]["unit"])

    @pytest.mark.parametrize(("name", "arguments", "content"), VALID)
    def test_valid_arguments(
        self, server: Any, sdk: Sdk, name: str, arguments: Dict[str, Any], content: Any
    ) -> None:
        result = call(server, name, arguments)
        assert not result.is_error, result.content
        if isinstance(content, dict):
            # A dict result: the SDK's text block is its JSON, indented; the model reads it.
            assert json.loads(result.content) == content
        else:
            assert result.content == content
        assert sdk.ran() == [name]

    @pytest.mark.parametrize(("name", "arguments"), INVALID)
    def test_invalid_arguments_are_an_error_result(
        self, server: Any, sdk: Sdk, name: str, arguments: Dict[str, Any]
    ) -> None:
        result = call(server, name, arguments)
        assert result.is_error
        assert result.content.startswith(f"invalid arguments for tool {name!r}: ")
        assert sdk.ran() == []

    @pytest.mark.parametrize(("name", "arguments"), INVALID)
    def test_the_server_refuses_them_too(
        self, server: Any, sdk: Sdk, name: str, arguments: Dict[str, Any]
    ) -> None:
        """Past the loop's check (execute called directly, its generator drained), the SDK
        validates: the model gets its words as an error, and the effect does not run either."""
        steps = sdk_tool(server, name).execute(arguments, threading.Event())
        with pytest.raises(al.ToolError, match=f"^Error executing tool {name}: .*validation"):
            list(steps)  # type: ignore[call-overload]  # an MCP tool's execute is a generator
        assert sdk.ran() == []

    @pytest.mark.parametrize(
        ("name", "content"),
        [
            pytest.param(
                "fail", "Error executing tool fail: the city Atlantis is unknown", id="ToolError"
            ),
            # The SDK sends no word of an unexpected exception, by design: its text (and
            # traceback) stay on the server's stderr, which the client reads and drops.
            pytest.param("broken", "Error executing tool broken", id="unexpected"),
        ],
    )
    def test_a_tool_error(self, server: Any, sdk: Sdk, name: str, content: str) -> None:
        result = call(server, name, {"city": "Atlantis"})
        assert (result.content, result.is_error) == (content, True)
        assert sdk.ran() == [name]

    @pytest.mark.parametrize("fits", [AT_LIMIT, OVER_LIMIT])
    def test_a_large_result_is_cut(self, server: Any, fits: bool) -> None:
        size = mcp.MAX_RESULT_TEXT if fits else 100_000
        result = call(server, "big", {"size": size})
        assert not result.is_error
        if fits:
            assert result.content == "x" * size
        else:
            assert result.content == "x" * mcp.MAX_RESULT_TEXT + (
                f"\n[agent_loop_mcp: {size - mcp.MAX_RESULT_TEXT} more characters of this "
                "result were cut]"
            )

    def test_progress_restarts_the_wait(self, server: Any) -> None:
        """A call of 2 s whose server reports progress every 0.05 s ends well with a
        timeout of 1.5 s: each notification starts the wait again."""
        before = server.timeout
        server.timeout = 1.5
        try:
            result = call(server, "progress", {"steps": 40, "interval": 0.05})
        finally:
            server.timeout = before
        assert (result.content, result.is_error) == ("done", False)

    def test_progress_is_the_calls_tool_progress_events(self, server: Any) -> None:
        """ctx.report_progress(n, total) reaches the run as tool.progress events, in order,
        between the call's tool.started and tool.finished, while the call runs: the server's
        tool waits after its first report until the consumer, holding that event, opens
        its gate."""
        arguments = {"steps": 3, "interval": 0, "gated": True}
        script = [
            al.scripted_response("r1", [al.ToolCall("c1", "progress", arguments)], "toolCall"),
            al.scripted_response("r2", [al.TextBlock("done")], "stop"),
        ]
        opened: List[str] = []

        def open_at_first_progress(event: al.Event) -> bool:
            if event.type == "tool.progress" and not opened:
                opened.append(call(server, "open_gate", {}).content)
            return False  # it never cancels

        events, result, _ = run(
            al.ScriptedModel(script), server.tools(), cancel_at=open_at_first_progress
        )
        assert result.status == "completed"
        assert opened == ["open"]
        assert result.messages[2].content == "done"
        types = [event.type for event in events]
        progress = [e.payload["progress"] for e in events if e.type == "tool.progress"]
        assert progress == [{"progress": n, "total": 3} for n in (1, 2, 3)]
        first = types.index("tool.progress")
        assert types[first - 1] == "tool.started"
        assert types[first + 3] == "tool.finished"

    def test_the_tool_list_changes(self, server: Any) -> None:
        name = f"added_{type(server).__name__}"
        assert name not in {tool.name for tool in server.tools()}
        assert call(server, "change", {"name": name}).content == "changed"
        # stdio: the notification came before the answer; HTTP lists at every call.
        assert name in {tool.name for tool in server.tools()}
        assert call(server, name, {}).content == "new"

    def test_many_calls_from_threads(self, server: Any, sdk: Sdk) -> None:
        tools = al.ToolRegistry(server.tools())
        results: Dict[str, Tuple[str, bool]] = {}

        def worker(number: int) -> None:
            for index in range(10):
                city = f"c{number}-{index}"
                tool_call = al.ToolCall(city, "forecast", {"city": city})
                result = al.execute_tool_call(tools, tool_call, threading.Event())
                results[city] = (result.content, result.is_error)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(results) == 80
        assert results == {city: (f"{city}: 1 day(s) in celsius", False) for city in results}
        assert sdk.ran() == ["forecast"] * 80


class TestRuns:
    """Real runs: run_agent_loop with a ScriptedModel that calls the server's tools."""

    def test_tools_carry_the_servers_annotations_and_title(self, server: Any) -> None:
        tools = al.ToolRegistry(server.tools())
        remove, forecast, fail = tools.get("remove"), tools.get("forecast"), tools.get("fail")
        assert remove is not None
        assert forecast is not None
        assert fail is not None
        # Tool.title wins over annotations.title: both are MCP's, the first the newer.
        assert dict(remove.annotations) == {
            "title": "Remove a city",
            "destructiveHint": True,
            "idempotentHint": True,
        }
        assert dict(forecast.annotations) == {"readOnlyHint": True, "openWorldHint": True}
        assert dict(fail.annotations) == {}
        assert "Remove a city" not in json.dumps(remove.spec().to_dict())  # the model: never

    def test_a_consent_hook_asks_only_for_destructive_tools(self, server: Any, sdk: Sdk) -> None:
        tools = al.ToolRegistry(server.tools())
        asked: List[str] = []

        def ask(call: al.ToolCall, signal: al.Signal) -> Any:
            tool = tools.get(call.name)
            if tool is None or not tool.annotations.get("destructiveHint", False):
                return None
            asked.append(str(tool.annotations["title"]))
            return "The user said no."

        model = al.ScriptedModel(
            [
                al.scripted_response(
                    "r1",
                    [
                        al.ToolCall("c1", "forecast", {"city": "Oslo"}),
                        al.ToolCall("c2", "remove", {"city": "Oslo"}),
                    ],
                    "toolCall",
                ),
                al.scripted_response("r2", [al.TextBlock("Kept.")], "stop"),
            ]
        )
        _, result, _ = run(model, list(tools), before_tool_call=ask)
        assert result.status == "completed"
        assert asked == ["Remove a city"]
        assert sdk.ran() == ["forecast"]  # the refused call never reached the server
        results = [m for m in result.messages if isinstance(m, al.ToolResultMessage)]
        assert [(m.content, m.is_error) for m in results] == [
            ("Oslo: 1 day(s) in celsius", False),
            ("The user said no.", True),
        ]

    def test_a_run_calls_the_tools(self, server: Any, sdk: Sdk) -> None:
        model = al.ScriptedModel(
            [
                al.scripted_response(
                    "r1",
                    [
                        al.ToolCall("c1", "forecast", {"city": "Oslo", "days": 2}),
                        al.ToolCall("c2", "forecast", {"city": "Oslo", "days": 99}),
                        al.ToolCall("c3", "fail", {"city": "Atlantis"}),
                    ],
                    "toolCall",
                ),
                al.scripted_response("r2", [al.TextBlock("Rain.")], "stop"),
            ]
        )
        _, result, _ = run(model, server.tools(), tool_concurrency=3)
        assert (result.status, result.final_text) == ("completed", "Rain.")
        results = [
            (m.content, m.is_error) for m in result.messages if isinstance(m, al.ToolResultMessage)
        ]
        assert results[0] == ("Oslo: 2 day(s) in celsius", False)
        assert results[1][1]
        assert results[1][0].startswith("invalid arguments for tool 'forecast': ")
        assert results[2] == ("Error executing tool fail: the city Atlantis is unknown", True)
        assert sorted(sdk.ran()) == ["fail", "forecast"]

    def test_a_slow_tool_cancelled_mid_call(self, server: Any, sdk: Sdk) -> None:
        """The run ends cancelled within the bound, the server is told and stops the tool,
        and the next call works."""
        signal = threading.Event()
        model = al.ScriptedModel(
            [
                al.scripted_response("r1", [al.ToolCall("c1", "slow", {})], "toolCall"),
                al.scripted_response("r2", [al.TextBlock("never")], "stop"),
            ]
        )
        tools = server.tools()
        fired: List[float] = []

        def cancel() -> None:
            # Once the tool runs on the server, the run is waiting for its answer.
            if eventually(lambda: "slow" in sdk.ran()):
                fired.append(time.monotonic())
                signal.set()

        canceller = threading.Thread(target=cancel)
        canceller.start()
        _, result, _ = run(model, tools, signal=signal)
        ended = time.monotonic()
        canceller.join()
        assert result.status == "cancelled"
        assert al.open_tool_calls(result.messages) == (al.ToolCall("c1", "slow", {}),)
        assert ended - fired[0] < CANCEL_BOUND
        assert eventually(lambda: "slow: cancelled" in sdk.ran())
        # Over HTTP the closed stream may stop the tool before the notice's POST arrives.
        assert eventually(lambda: any(line.startswith("told: cancelled ") for line in sdk.ran()))
        told = [line for line in sdk.ran() if line.startswith("told: cancelled ")]
        assert len(told) == 1
        assert told[0].endswith(": the run was cancelled")
        assert call(server, "forecast", {"city": "Oslo"}).content == "Oslo: 1 day(s) in celsius"
        assert "slow: finished" not in sdk.ran()


class TestEnds:
    """A server that crashes, and a server closed with work in flight: each its own."""

    def test_a_server_that_crashes_mid_call(self, own_server: Any) -> None:
        result = call(own_server, "crash", {})
        assert result.is_error
        if isinstance(own_server, mcp.StdioServer):
            assert result.content == (
                "MCP tool 'crash': tools/call did not finish: the server exited with status 3"
            )
        else:  # the process behind the endpoint is gone with the answer's stream
            assert result.content == (
                "MCP tool 'crash': tools/call: the answer ended before the response: the "
                "server closed the stream or went away (resuming a stream is not supported)"
            )
        with pytest.raises(mcp.McpError):
            own_server.tools()  # stdio: the session is lost; HTTP: nobody listens

    @pytest.mark.parametrize("own_server", ["stdio"], indirect=True)
    def test_no_process_outlives_close(self, own_server: Any, sdk: Sdk) -> None:
        """close() with a call in flight: the call ends with an error result, and the
        server and the process it started are gone."""
        pids = [int(pid) for pid in call(own_server, "spawn", {}).content.split()]
        assert all(alive(pid) for pid in pids)
        results: List[al.ToolResultMessage] = []
        caller = threading.Thread(target=lambda: results.append(call(own_server, "slow", {})))
        caller.start()
        assert eventually(lambda: "slow" in sdk.ran())
        own_server.close()
        caller.join()
        assert results[0].is_error
        assert results[0].content == (
            "MCP tool 'slow': tools/call did not finish: the session was closed"
        )
        server_pid, child_pid = pids
        assert not alive(server_pid)
        # What the server started was sent SIGKILL, which takes a moment.
        assert eventually(lambda: not alive(child_pid))


class TestCommandLine:
    """``python agent_loop_cli.py --mcp "COMMAND ARGS"`` with the SDK's server."""

    def test_the_model_gets_the_servers_typed_tools(
        self, sdk: Sdk, capsys: pytest.CaptureFixture[str]
    ) -> None:
        sdk.reset()
        command = shlex.join([sys.executable, str(sdk.script), "stdio", str(sdk.effects)])
        calls = [
            ("c1", "forecast", {"city": "Oslo", "days": 2}),
            ("c2", "forecast", {"city": "Oslo", "days": 8}),
        ]
        with serving() as model:
            model.script(
                Reply(answer_parts("openai", calls)), Reply(answer_parts("openai", ["Rain."]))
            )
            more = ["--model", "m", "--retries", "0", "--mcp", command, "Oslo?"]
            status = cli.main(["--provider", "openai", "--base-url", model.url + "/v1", *more])
            sent = {tool["function"]["name"]: tool["function"] for tool in model.body()["tools"]}
        lines = capsys.readouterr().out.splitlines()
        assert status == 0
        assert lines[3:5] == [
            '  3  tool.started      request-001 forecast({"city":"Oslo","days":2}) [c1]',
            "  4  tool.finished     request-001 forecast ok: Oslo: 2 day(s) in celsius",
        ]
        assert lines[6].startswith(
            "  6  tool.finished     request-001 forecast error: invalid arguments for tool "
            "'forecast': "
        )
        assert sdk.ran() == ["forecast"]
        assert {"add", "multiply", "weather", "forecast", "ship"} <= set(sent)
        assert sent["forecast"]["parameters"]["properties"]["days"]["maximum"] == 7
