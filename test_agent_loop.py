"""Tests for agent_loop: every rule, limit, failure code, event order, cancellation
case and acceptance criterion of the seed ("Checkpoint 07: Run the iterative Agent
Loop"), then the contract of API.md.

The suite imports ``agent_loop`` once, as ``al``: point it at another copy of the
module by putting that copy first on sys.path.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import pytest

import agent_loop as al

# --- Helpers shared by every test class: the seed's own test vocabulary -----------------


def user(text: str = "Add 20 and 22.", id: str = "user-001") -> al.UserMessage:
    """The seed's user(): one user message."""
    return al.UserMessage(id, text)


def call(name: str, id: str, arguments: Dict[str, Any]) -> al.ToolCall:
    """The seed's call(name, id, arguments)."""
    return al.ToolCall(id, name, arguments)


NUMBERS = {
    "type": "object",
    "properties": {"left": {"type": "number"}, "right": {"type": "number"}},
    "required": ["left", "right"],
    "additionalProperties": False,
}


def add_tool() -> al.Tool:
    """The seed's addTool(): returns {"sum": left + right}."""
    return al.Tool(
        "add",
        "Adds two numbers.",
        NUMBERS,
        lambda arguments, signal: {"sum": arguments["left"] + arguments["right"]},
    )


def echo_tool(executed: Optional[List[str]] = None) -> al.Tool:
    """An echo tool that returns its ``text`` argument and records each text it ran with."""

    def echo(arguments: Dict[str, Any], signal: Any) -> object:
        if executed is not None:
            executed.append(arguments["text"])
        return arguments["text"]

    schema = {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    }
    return al.Tool("echo", "Returns its text.", schema, echo)


def text(value: str) -> al.TextBlock:
    return al.TextBlock(value)


def run(
    responses: Sequence[Any],
    *,
    messages: Optional[Iterable[al.Message]] = None,
    tools: Sequence[al.Tool] = (),
    max_steps: int = 4,
    signal: Optional[threading.Event] = None,
    request_sequence_start: int = 0,
) -> Tuple[List[al.Event], al.RunResult, al.ScriptedModel]:
    """Runs a ScriptedModel over ``responses`` to the end; returns events, result, model."""
    model = al.ScriptedModel(responses)
    events, result = al.settle_run(
        al.run_agent_loop(
            messages=[user()] if messages is None else messages,
            model=model,
            tools=al.ToolRegistry(tools),
            max_steps=max_steps,
            signal=signal,
            request_sequence_start=request_sequence_start,
        )
    )
    return events, result, model


def types_of(events: Iterable[al.Event]) -> List[str]:
    return [event.type for event in events]


def assert_well_formed(events: Sequence[al.Event], result: al.RunResult) -> None:
    """The invariants every run keeps, whatever happened in it."""
    assert [event.sequence for event in events] == list(range(len(events)))
    assert types_of(events).count("run.finished") == 1
    assert events[-1].type == "run.finished"
    assert events[-1].payload["result"] is result
