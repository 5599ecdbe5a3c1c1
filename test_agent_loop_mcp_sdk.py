"""agent_loop_mcp.py against servers built with the official MCP SDK (``tox -e mcp``).

The server (SDK_SERVER, written into tmp_path) is an ``MCPServer`` (the SDK's FastMCP) with
typed tools: optionals, defaults, enums, nested models and bounds. It runs over stdio, and
over Streamable HTTP on 127.0.0.1 and a free port. Every tool that runs appends its name to
a file, so a test sees that an invalid call never ran the effect. Real runs go through
run_agent_loop with a ScriptedModel that calls the server's tools. The tests skip where the
SDK is not importable, unless ``AGENT_LOOP_REQUIRE_MCP=1`` (set by tox's mcp env) turns
the skip into a failure.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

import agent_loop as al
import agent_loop_mcp as mcp
from loop_testing import run
from loop_testing_providers import free_port

_REQUIRED = os.environ.get("AGENT_LOOP_REQUIRE_MCP") == "1"
_HAS_SDK = (
    importlib.util.find_spec("mcp") is not None
    and importlib.util.find_spec("mcp.server.mcpserver") is not None
)

SDK_SERVER = '''
import enum, os, sys
from typing import List, Optional

import anyio
from pydantic import BaseModel, Field
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("typed")
effects = sys.argv[2]


def effect(name: str) -> None:
    with open(effects, "a") as log:
        log.write(name + "\\n")


class Unit(str, enum.Enum):
    celsius = "celsius"
    fahrenheit = "fahrenheit"


class Address(BaseModel):
    street: str
    zip_code: str = Field(min_length=5, max_length=5)


@server.tool()
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


@server.tool()
def fail(city: str) -> str:
    effect("fail")
    raise ValueError(f"the city {city} is unknown")


@server.tool()
async def slow(ctx: Context) -> str:
    effect("slow")
    await anyio.sleep(60)
    return "too late"


@server.tool()
async def progress(ctx: Context, steps: int) -> str:
    for step in range(steps):
        await anyio.sleep(0.1)
        await ctx.report_progress(step + 1, steps)
    return "done"


@server.tool()
def crash() -> str:
    os._exit(3)


@server.tool()
def big(size: int) -> str:
    return "x" * size


def added() -> str:
    return "new"


@server.tool()
async def change(ctx: Context) -> str:
    server.add_tool(added)
    await ctx.session.send_tool_list_changed()
    return "changed"


if sys.argv[1] == "stdio":
    server.run()
else:
    server.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
'''


@pytest.fixture(autouse=True)
def _sdk() -> None:
    if not _HAS_SDK:
        if _REQUIRED:
            pytest.fail("AGENT_LOOP_REQUIRE_MCP=1 but the mcp SDK (2.x) is not importable")
        pytest.skip("the mcp SDK (Python >= 3.10) is not installed: run `tox -e mcp`")


class Sdk:
    def __init__(self, tmp_path: Path) -> None:
        self.script = tmp_path / "sdk_server.py"
        self.script.write_text(SDK_SERVER, encoding="utf-8")
        self.effects = tmp_path / "effects.txt"

    def ran(self) -> List[str]:
        return self.effects.read_text().split() if self.effects.exists() else []


@pytest.fixture(params=["stdio", "http"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    sdk = Sdk(tmp_path)
    if request.param == "stdio":
        with mcp.StdioServer([sys.executable, str(sdk.script), "stdio", str(sdk.effects)]) as s:
            s.sdk = sdk  # type: ignore[attr-defined]
            yield s
        return
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(sdk.script), str(port), str(sdk.effects)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        deadline = time.monotonic() + 30
        while True:
            try:
                with mcp.HttpServer(url, timeout=2) as probe:
                    probe.tools()
                break
            except mcp.McpError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.1)
        with mcp.HttpServer(url) as s:
            s.sdk = sdk  # type: ignore[attr-defined]
            yield s
    finally:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def call(
    server: Any, name: str, arguments: Dict[str, Any], signal: Any = None
) -> al.ToolResultMessage:
    tools = al.ToolRegistry(server.tools())
    return al.execute_tool_call(
        tools, al.ToolCall("c", name, arguments), signal or threading.Event()
    )


VALID = [
    pytest.param("forecast", {"city": "Oslo"}, "Oslo: 1 day(s) in celsius", id="defaults"),
    pytest.param(
        "forecast",
        {"city": "Oslo", "days": 7, "unit": "fahrenheit", "note": "windy"},
        "Oslo: 7 day(s) in fahrenheit (windy)",
        id="all-given",
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
        '{"street": "Main", "parcels": 1}',
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
    pytest.param("ship", {"to": {"street": "Main"}}, id="nested-missing"),
    pytest.param("ship", {"to": {"street": "M", "zip_code": "12345"}, "parcels": [3]}, id="items"),
]


class TestTypedTools:
    """Every tool of a typed server can be built; invalid arguments never run the effect."""

    def test_every_tool_is_usable(self, server: Any) -> None:
        names = {tool.name for tool in server.tools()}
        assert {"forecast", "ship", "fail", "slow", "progress", "crash", "big", "change"} <= names

    @pytest.mark.parametrize(("name", "arguments", "content"), VALID)
    def test_valid_arguments(
        self, server: Any, name: str, arguments: Dict[str, Any], content: str
    ) -> None:
        result = call(server, name, arguments)
        assert not result.is_error, result.content
        assert result.content.replace(" ", "") == content.replace(" ", "")
        assert server.sdk.ran() == [name]

    @pytest.mark.parametrize(("name", "arguments"), INVALID)
    def test_invalid_arguments_are_an_error_result(
        self, server: Any, name: str, arguments: Dict[str, Any]
    ) -> None:
        result = call(server, name, arguments)
        assert result.is_error
        assert server.sdk.ran() == []

    def test_a_tool_error(self, server: Any) -> None:
        result = call(server, "fail", {"city": "Atlantis"})
        assert result.is_error
        assert "the city Atlantis is unknown" in result.content

    def test_a_large_result_is_cut(self, server: Any) -> None:
        result = call(server, "big", {"size": 100_000})
        assert result.content.startswith("x" * mcp.MAX_RESULT_TEXT)
        assert result.content.endswith(
            f"{100_000 - mcp.MAX_RESULT_TEXT} more characters of this result were cut]"
        )

    def test_progress(self, server: Any) -> None:
        assert call(server, "progress", {"steps": 3}).content == "done"

    def test_the_tool_list_changes(self, server: Any) -> None:
        assert "added" not in {tool.name for tool in server.tools()}
        assert call(server, "change", {}).content == "changed"
        deadline = time.monotonic() + 5
        while "added" not in {tool.name for tool in server.tools()}:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert call(server, "added", {}).content == "new"

    def test_many_calls_from_threads(self, server: Any) -> None:
        tools = al.ToolRegistry(server.tools())
        results: Dict[str, str] = {}

        def worker(number: int) -> None:
            for index in range(5):
                city = f"c{number}-{index}"
                tool_call = al.ToolCall(city, "forecast", {"city": city})
                results[city] = al.execute_tool_call(tools, tool_call, threading.Event()).content

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert results == {city: f"{city}: 1 day(s) in celsius" for city in results}
        assert len(results) == 30


class TestRuns:
    """Real runs: run_agent_loop with a ScriptedModel that calls the server's tools."""

    def test_a_run_calls_the_tools(self, server: Any) -> None:
        model = al.ScriptedModel(
            [
                al.scripted_response(
                    "r1",
                    [
                        al.ToolCall("c1", "forecast", {"city": "Oslo", "days": 2}),
                        al.ToolCall("c2", "forecast", {"city": "Oslo", "days": 99}),
                    ],
                    "toolCall",
                ),
                al.scripted_response("r2", [al.TextBlock("Rain.")], "stop"),
            ]
        )
        _, result, _ = run(model, server.tools())
        assert result.status == "completed"
        first, second = result.messages[2], result.messages[3]
        assert isinstance(first, al.ToolResultMessage)
        assert isinstance(second, al.ToolResultMessage)
        assert (first.content, first.is_error) == ("Oslo: 2 day(s) in celsius", False)
        assert second.is_error
        assert server.sdk.ran() == ["forecast"]

    def test_a_slow_tool_cancelled_mid_call(self, server: Any) -> None:
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
            fired.append(time.monotonic())
            signal.set()

        timer = threading.Timer(0.5, cancel)
        timer.start()
        _, result, _ = run(model, tools, signal=signal)
        ended = time.monotonic()
        timer.join()
        assert result.status == "cancelled"
        assert ended - fired[0] < 0.25
        assert call(server, "forecast", {"city": "Oslo"}).content == "Oslo: 1 day(s) in celsius"

    def test_a_server_that_crashes_mid_call(self, server: Any) -> None:
        result = call(server, "crash", {})
        assert result.is_error
        if isinstance(server, mcp.StdioServer):
            assert "the server exited with status 3" in result.content
        else:  # the process behind the endpoint is gone with the connection
            assert "the HTTP exchange failed" in result.content
