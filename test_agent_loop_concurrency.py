"""Tests for the tool phase with threads: current_tool_call(), the call a tool is running.

The suite imports ``agent_loop`` once, as ``al``, so that it can be aimed at any copy.
Builders and the one driver come from loop_testing.py.

Contents
    TestCurrentToolCall: inside execute, the call; outside, None; each thread its own
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional

import agent_loop as al
from loop_testing import echo_call, run, stop, tool_turn

WAIT: float = 10.0
"""Seconds a test thread waits for another before the test fails: generous, so that a
loaded machine never fails a test, and finite, so that a broken loop cannot hang one."""


class TestCurrentToolCall:
    """current_tool_call(): the ToolCall whose tool is executing, in the thread that runs
    it; None elsewhere."""

    @staticmethod
    def seeing_tool(seen: List[Optional[al.ToolCall]]) -> al.Tool:
        """An echo tool that records what current_tool_call() returns inside it."""

        def execute(arguments: Dict[str, Any], signal: al.Signal) -> object:
            seen.append(al.current_tool_call())
            return arguments["text"]

        return al.Tool("echo", "Echoes.", {"type": "object"}, execute)

    def test_inside_execute_it_is_the_call_and_outside_none(self) -> None:
        seen: List[Optional[al.ToolCall]] = []
        calls = [echo_call("call-echo-001"), echo_call("call-echo-002")]
        outside: List[Optional[al.ToolCall]] = []
        loop = al.run_agent_loop(
            messages=[al.UserMessage("u1", "Echo twice.")],
            model=al.ScriptedModel([tool_turn("response-001", *calls), stop("response-002")]),
            tools=al.ToolRegistry([self.seeing_tool(seen)]),
            max_steps=2,
        )
        _, result = al.settle_run(loop, lambda event: outside.append(al.current_tool_call()))
        assert result.status == "completed"
        assert seen == calls
        assert all(value is None for value in outside)  # the consumer runs outside any tool
        assert al.current_tool_call() is None

    def test_execute_tool_call_sets_it_too_and_resets_it_whatever_the_tool_does(self) -> None:
        seen: List[Optional[al.ToolCall]] = []

        def failing(arguments: Dict[str, Any], signal: al.Signal) -> object:
            seen.append(al.current_tool_call())
            raise LookupError("nothing here")

        tool = al.Tool("echo", "Fails.", {"type": "object"}, failing)
        result = al.execute_tool_call(
            al.ToolRegistry([tool]), echo_call("call-echo-001"), threading.Event()
        )
        assert seen == [echo_call("call-echo-001")]
        assert result.is_error
        assert "LookupError" in result.content
        assert al.current_tool_call() is None

    def test_a_tool_that_runs_a_nested_tool_sees_its_own_call_again_after_it(self) -> None:
        inner_seen: List[Optional[al.ToolCall]] = []
        inner = al.ToolRegistry([self.seeing_tool(inner_seen)])
        after: List[Optional[al.ToolCall]] = []

        def outer(arguments: Dict[str, Any], signal: al.Signal) -> object:
            al.execute_tool_call(inner, echo_call("call-inner"), signal)
            after.append(al.current_tool_call())
            return "done"

        outer_call = al.ToolCall("call-outer", "outer", {})
        tool = al.Tool("outer", "Runs a tool.", {"type": "object"}, outer)
        al.execute_tool_call(al.ToolRegistry([tool]), outer_call, threading.Event())
        assert inner_seen == [echo_call("call-inner")]
        assert after == [outer_call]

    def test_runs_in_threads_at_once_each_see_their_own_call(self) -> None:
        """Four runs on four threads, each tool waiting until all four are inside their
        tools: each sees its own call, never another thread's."""
        count = 4
        barrier = threading.Barrier(count, timeout=WAIT)
        seen: Dict[str, Optional[al.ToolCall]] = {}

        def execute(arguments: Dict[str, Any], signal: al.Signal) -> object:
            barrier.wait()  # every thread is inside its tool now
            seen[arguments["text"]] = al.current_tool_call()
            return arguments["text"]

        tool = al.Tool("echo", "Echoes.", {"type": "object"}, execute)
        results: Dict[str, al.RunResult] = {}

        def one_run(call_id: str) -> None:
            _, results[call_id], _ = run(
                [tool_turn("response-001", echo_call(call_id)), stop("response-002")], [tool]
            )

        threads = [threading.Thread(target=one_run, args=(f"call-{n}",)) for n in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        assert {call_id: result.status for call_id, result in results.items()} == {
            f"call-{n}": "completed" for n in range(count)
        }
        assert seen == {f"call-{n}": echo_call(f"call-{n}") for n in range(count)}
