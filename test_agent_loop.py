"""Tests for agent_loop, the core, part one: the loop. Every rule, limit, failure code,
event order and cancellation case of the seed ("Checkpoint 07: Run the iterative Agent
Loop"). The rest, by layer, so that each file can be read as one, in tests/: the
transcript's checks and the model boundary (test_agent_loop_transcript_and_model.py), the
tool schemas (test_agent_loop_schemas.py), and the tools, the bounded plain JSON of their
arguments, the message IR with its JSON codec, and resumption
(test_agent_loop_tools_and_ir.py).

The suite imports ``agent_loop`` once, as ``al``: point it at another copy of the module
by putting that copy first on sys.path. Its builders, its one fake model (FakeModel, for
what al.ScriptedModel cannot do), its one driver (run(), which checks the run's
invariants with loop_invariants.check_run() every time) come from loop_testing.py, the
reference model that random scripts are checked against from loop_reference.py; a helper
that one class alone uses sits just above that class. replay() has its own file
(test_agent_loop_replay.py), the README and the demonstration theirs (test_docs_and_demo.py).

One canonical test per rule of the seed, named in the rule's words and quoting it
(``Seed: "..."``); more cases of the same rule are rows of its table. Every limit is
tested on both sides (ids ``at-limit`` and ``over-limit``); cancellation is a table over
every "signal aborts" edge of the seed's diagram. Attacker-style tests (a model, tool or
caller that tries to break the loop) carry the ``hostile`` mark (a class, or a row of a
table), marked [hostile] below: ``pytest -m hostile`` runs them alone.

Contents, in the module's order
    The module: TestRuntimeTyping
    Limits: TestLimits (thinking included)
    The loop, one class per acceptance criterion of the seed, in the seed's order:
        TestGoldenFragments (the seed's two fragments, translated),
        TestConstructionRejectsInvalidOptions, TestRunOwnsSnapshots,
        TestEachStepGetsFrozenTranscriptAndRequestId,
        TestAssistantMessagesPrecedeToolResults, TestRecoverableToolErrors,
        TestEventSequence, TestCancellation, TestStepBudget;
        then TestFailureCodes, TestStreamAndResponseAgree, TestRunUsage,
        TestMistakesNameTheirFix, TestRunHelpers, TestConsumerWalksAway [hostile],
        TestInterruptsAreNeverSwallowed [hostile],
        TestRandomScriptsAgainstAReference [hostile]
    The transcript and the model boundary: tests/test_agent_loop_transcript_and_model.py
    Events and results, Test helpers: no class of their own; TestEventSequence (here),
        TestJsonShapes and TestCopyingAndHashing (part two) exercise events and results,
        and every test that scripts a model runs al.ScriptedModel
"""

from __future__ import annotations

import asyncio
import collections.abc
import dataclasses
import gc
import inspect
import random
import threading
import typing
from types import MappingProxyType, SimpleNamespace
from typing import (
    Any,
    Callable,
    Generator,
    Iterator,
    Sequence,
)

import pytest

import agent_loop as al
from loop_invariants import SEED_EVENT_TYPES, check_run
from loop_reference import assert_predicted, predict, random_script, run_plans
from loop_testing import (
    AT_LIMIT,
    HISTORY,
    HOSTILE,
    OVER_LIMIT,
    PRIOR_ROUND,
    CancelAt,
    FakeModel,
    Fatal,
    Step,
    add_call,
    add_result,
    add_tool,
    assert_failed,
    assert_no_tool_ran,
    assert_tool_received,
    assistant,
    call,
    chunk_event_count,
    cyclic_array,
    echo_call,
    echo_result,
    echo_tool,
    failure_message,
    nested,
    no_arguments_tool,
    opaque,
    open_call_ids,
    raise_error,
    raising,
    recording_tools,
    returns,
    run,
    run_probe_call,
    scripted_step,
    settle,
    start_run,
    stop,
    stream_step,
    text,
    thought,
    tool_turn,
    turn,
    types_of,
    until,
    untyped,
    user,
)

# --- The module: its public names and their types ----------------------------------------


class TestRuntimeTyping:
    @pytest.mark.parametrize(
        "name", [name for name in al.__all__ if isinstance(getattr(al, name), type)]
    )
    def test_type_hints_of_every_public_class_resolve(self, name: str) -> None:
        """A copied file is introspected (dataclass tools, validators) on every Python it
        runs on: its annotations use typing's spelling, which 3.8 can evaluate."""
        assert isinstance(typing.get_type_hints(getattr(al, name)), dict)


# --- Limits ------------------------------------------------------------------------------


def capped_thinking(thinking: int, text_length: int, first: str) -> tuple[list[Any], list[Any]]:
    """``thinking`` code points of thinking and ``text_length`` of text, in 1024-code-point
    chunks then one-code-point chunks; the kind named ``first`` ("thinking" or "text") is
    the first block and is streamed first."""
    thinking_chunks = [thought("🤔" * 1024)] * 64 + [thought("🤔")] * (thinking - 65536)
    text_chunks = [text("x" * 1024)] * (text_length // 1024) + [text("x")] * (text_length % 1024)
    thinking_block, text_block = thought("🤔" * thinking, "sig"), text("x" * text_length)
    if first == "text":
        return [text_block, thinking_block], text_chunks + thinking_chunks
    return [thinking_block, text_block], thinking_chunks + text_chunks


# Each row: (content and chunks of a stop response, the words of the failure or None, the
# model.chunk events: the chunk over a cap gets none).
STEP_CAPS = [
    pytest.param(lambda: ([text("a" * 1024)], [text("a")] * 1024), None, 1024,
                 id="chunks-at-limit"),
    pytest.param(lambda: ([text("a" * 1025)], [text("a")] * 1025), "more than 1024 chunks",
                 1024, id="chunks-over-limit"),
    # An empty text delta carries no text, but it is still a chunk of the step.
    pytest.param(lambda: ([], [text("")] * 1024), None, 1024, id="empty-chunks-at-limit"),
    pytest.param(lambda: ([], [text("")] * 1025), "more than 1024 chunks", 1024,
                 id="empty-chunks-over-limit"),
    # Thinking deltas are chunks too.
    pytest.param(lambda: ([thought("t" * 1023, "sig"), text("Done.")],
                          [thought("t")] * 1023 + [text("Done.")]), None, 1024,
                 id="thinking-chunks-at-limit"),
    pytest.param(lambda: ([thought("t" * 1024, "sig"), text("Done.")],
                          [thought("t")] * 1024 + [text("Done.")]), "more than 1024 chunks",
                 1024, id="thinking-chunks-over-limit"),
    # A non-BMP character is one code point (two UTF-16 units): 65,536 emoji pass.
    pytest.param(lambda: ([text("😀" * 65536)], [text("😀" * 1024)] * 64), None, 64,
                 id="text-in-code-points-at-limit"),
    pytest.param(lambda: ([text("😀" * 65537)], [text("😀" * 1024)] * 64 + [text("😀")]),
                 "more than 65536 code points of text", 64, id="text-in-code-points-over-limit"),
    # 1024 chunks of 64 characters are exactly both caps; one more character breaks one.
    pytest.param(lambda: ([text("x" * 65536)], [text("x" * 64)] * 1024), None, 1024,
                 id="text-at-the-chunk-cap-at-limit"),
    pytest.param(lambda: ([text("x" * 65537)], [text("x" * 64)] * 1023 + [text("x" * 65)]),
                 "more than 65536 code points of text", 1023,
                 id="text-at-the-chunk-cap-over-limit"),
    # Thinking is bounded by the same number, apart from text. The kind over its cap is
    # streamed last, so that the other is counted whole before it breaks.
    pytest.param(lambda: capped_thinking(65536, 65536, first="thinking"), None, 128,
                 id="thinking-and-text-at-limit"),
    pytest.param(lambda: capped_thinking(65537, 0, first="text"),
                 "more than 65536 code points of thinking", 64, id="thinking-over-limit"),
    pytest.param(lambda: capped_thinking(65537, 65536, first="text"),
                 "more than 65536 code points of thinking", 128,
                 id="thinking-over-limit-text-at-limit"),
    pytest.param(lambda: capped_thinking(65536, 65537, first="thinking"),
                 "more than 65536 code points of text", 128,
                 id="text-over-limit-thinking-at-limit"),
    # Blocks count as the response returns them, before coalescing; thinking included.
    pytest.param(lambda: ([text("a")] * 1024, [text("a" * 1024)]), None, 1,
                 id="blocks-at-limit"),
    pytest.param(lambda: ([text("a")] * 1025, [text("a" * 1025)]), "more than 1024 blocks", 1,
                 id="blocks-over-limit"),
    pytest.param(lambda: ([thought("t", f"s{i}") for i in range(1023)] + [text("ok")],
                          [thought("t" * 1023), text("ok")]), None, 2,
                 id="thinking-blocks-at-limit"),
    pytest.param(lambda: ([thought("t", f"s{i}") for i in range(1024)] + [text("ok")],
                          [thought("t" * 1024), text("ok")]), "more than 1024 blocks", 2,
                 id="thinking-blocks-over-limit"),
]  # fmt: skip


class TestLimits:
    """Seed: "The loop caps one step at 1024 chunks, 65,536 Unicode code points of text,
    and 1024 assistant blocks." Every limit is inclusive: the limit passes, one more fails."""

    def test_limit_constants_are_the_seeds_numbers(self) -> None:
        """Seed: "MAX_AGENT_STEPS, which is 64"; "Initial messages are capped at 4096"; "1024
        chunks, 65,536 Unicode code points of text, and 1024 assistant blocks"; "depth 32, at
        most 257 values including the root, 256 object fields plus array slots, and 4096
        Unicode code points across keys/string values"."""
        assert al.MAX_AGENT_STEPS == 64
        assert al.MAX_INITIAL_MESSAGES == 4096
        assert al.MAX_STEP_CHUNKS == 1024
        assert al.MAX_STEP_TEXT == 65536
        assert al.MAX_ASSISTANT_BLOCKS == 1024
        assert al.MAX_ARGUMENT_DEPTH == 32
        assert al.MAX_ARGUMENT_VALUES == 257
        assert al.MAX_ARGUMENT_SLOTS == 256
        assert al.MAX_ARGUMENT_TEXT == 4096

    @pytest.mark.parametrize("passes", [AT_LIMIT, OVER_LIMIT])
    def test_initial_messages(self, passes: bool) -> None:
        """Seed: "Initial messages are capped at 4096"; over it, one failed run.finished."""
        count = 4096 if passes else 4097
        start = [al.UserMessage(f"user-{index:04d}", "hi") for index in range(count)]
        events, result, model = run([stop("response-001", "The sum is 42.")], messages=start)
        if passes:
            assert result.status == "completed"
            assert model.requests[0].messages == tuple(start)
        else:
            assert_failed(events, result, "INVALID_TRANSCRIPT", "4096")
            assert model.call_count == 0

    @pytest.mark.parametrize(("make", "words", "chunk_events"), STEP_CAPS)
    def test_one_step_is_capped(
        self, make: Callable[[], tuple[list[Any], list[Any]]], words: str | None, chunk_events: int
    ) -> None:
        """Each cap of one step (thinking counted like text, on its own): the unfinished
        assistant message over a cap is not appended."""
        content, chunks = make()
        response = al.scripted_response("response-001", content, "stop", chunks=chunks)
        events, result, _ = run([response])
        assert chunk_event_count(events) == chunk_events
        if words is None:
            assert result.status == "completed"
            assert result.messages[-1] == al.AssistantMessage("message-response-001", content)
        else:
            assert_failed(events, result, "MODEL_PROTOCOL_ERROR", words)
            assert result.messages == (user(),)
            assert result.steps == 1

    @pytest.mark.parametrize(
        ("make", "passes", "limit"),
        [
            # depth 32: {} has depth 1 and a scalar 0; objects and arrays alike.
            pytest.param(lambda: nested(32), True, "32", id="depth-at-limit"),
            pytest.param(lambda: nested(33), False, "32", id="depth-over-limit"),
            pytest.param(lambda: nested(32, "object"), True, "32", id="depth-of-objects-at-limit"),
            pytest.param(lambda: nested(33, "object"), False, "32",
                         id="depth-of-objects-over-limit"),
            # 257 values with the root: the root, one array and 255 numbers in it.
            pytest.param(lambda: {"xs": list(range(255))}, True, "257", id="values-at-limit"),
            pytest.param(lambda: {"xs": list(range(256))}, False, "257", id="values-over-limit"),
            # {"a": [1]} counts 3 values: 128 such fields and the root are 257 values.
            pytest.param(lambda: {f"a{index:03d}": [1] for index in range(128)}, True, "257",
                         id="values-like-the-example-at-limit"),
            pytest.param(lambda: {**{f"a{i:03d}": [1] for i in range(127)}, "a127": [1, 2]},
                         False, "257", id="values-like-the-example-over-limit"),
            # 256 object fields plus array slots: fields of one object, or fields and slots.
            pytest.param(lambda: {f"f{index:03d}": index for index in range(256)}, True, "256",
                         id="slots-of-fields-at-limit"),
            pytest.param(lambda: {f"f{index:03d}": index for index in range(257)}, False, "256",
                         id="slots-of-fields-over-limit"),
            pytest.param(lambda: {**{f"f{i:03d}": None for i in range(127)}, "xs": [True] * 128},
                         True, "256", id="slots-of-fields-plus-array-slots-at-limit"),
            pytest.param(lambda: {**{f"f{i:03d}": None for i in range(127)}, "xs": [True] * 129},
                         False, "256", id="slots-of-fields-plus-array-slots-over-limit"),
            # 4096 code points across keys and strings: a 96-emoji key and a 4000-emoji
            # value are 4096 code points (8192 UTF-16 units).
            pytest.param(lambda: {"😀" * 96: "😀" * 4000}, True, "4096",
                         id="text-in-code-points-at-limit"),
            pytest.param(lambda: {"😀" * 96: "😀" * 4001}, False, "4096",
                         id="text-in-code-points-over-limit"),
            pytest.param(lambda: {"k": "a" * 4095}, True, "4096", id="text-counts-keys-at-limit"),
            pytest.param(lambda: {"k": "a" * 4096}, False, "4096",
                         id="text-counts-keys-over-limit"),
            # Keys a, b, c, n and the strings add up, in arrays and nested objects; 5 does not.
            pytest.param(lambda: {"a": ["😀" * 2048], "b": {"c": "é" * 2044, "n": 5}}, True,
                         "4096", id="text-adds-up-across-strings-at-limit"),
            pytest.param(lambda: {"a": ["😀" * 2048], "b": {"c": "é" * 2045, "n": 5}}, False,
                         "4096", id="text-adds-up-across-strings-over-limit"),
        ],
    )  # fmt: skip
    def test_tool_arguments_are_bounded_in_depth_values_slots_and_text(
        self, make: Callable[[], Any], passes: bool, limit: str
    ) -> None:
        """Seed: "... plain bounded JSON with depth 32, at most 257 values including the
        root, 256 object fields plus array slots, and 4096 Unicode code points across
        keys/string values." Over a bound, no tool runs. (What is plain JSON, and that it
        is checked before a Tool effect: test_agent_loop_tools_and_ir.py's
        TestPlainJsonArguments.)"""
        arguments = make()
        events, result, model, received = run_probe_call(arguments)
        if passes:
            assert_tool_received(events, result, received, arguments)
        else:
            assert_failed(events, result, "MODEL_PROTOCOL_ERROR", limit)
            assert_no_tool_ran(events, result, model, received)


# --- The loop ----------------------------------------------------------------------------


class TestGoldenFragments:
    def test_seed_fragment_the_first_continuation_boundary(self) -> None:
        """Seed: "The second request contains the assistant Tool call before its result,
        and both share call-add-001." (the seed's first fragment, which "shows the first
        continuation boundary", translated exactly)"""
        add_call_001 = call("add", "call-add-001", {"left": 20, "right": 22})
        model = al.ScriptedModel(
            [
                tool_turn("response-tool-001", add_call_001),
                stop("response-tool-002", "The sum is 42."),
            ]
        )

        events, result, _ = run(model, [add_tool()], max_steps=2, signal=threading.Event())

        assert model.call_count == 2
        assert [request.id for request in model.requests] == ["request-001", "request-002"]
        assert model.requests[1].messages == (
            user(),
            al.AssistantMessage("message-response-tool-001", (add_call_001,)),
            al.ToolResultMessage(
                "tool-result-call-add-001", "call-add-001", "add", '{"sum":42}', False
            ),
        )
        assert types_of(events) == [
            "message.accepted",
            "model.chunk",
            "tool.started",
            "tool.finished",
            "model.chunk",
            "run.finished",
        ]
        assert [event.sequence for event in events] == [0, 1, 2, 3, 4, 5]
        assert result.status == "completed"
        assert result.final_text == "The sum is 42."

    @pytest.mark.parametrize(
        ("max_steps", "status", "final_text"),
        [
            pytest.param(1, "maxSteps", None, id="one-step-completes-the-batch-only"),
            pytest.param(2, "completed", "must not run", id="two-steps-run-the-continuation"),
        ],
    )
    def test_seed_fragment_the_failure_experiment(
        self, max_steps: int, status: str, final_text: str | None
    ) -> None:
        """Seed: "All three calls execute in order, model.callCount remains 1, and the
        result is maxSteps." and "Change only maxSteps to 2; the queued continuation may
        run and complete." (the seed's second fragment, its "Failure experiment",
        translated exactly; the rule's canonical test is TestStepBudget's)"""
        executed: list[str] = []
        calls = [echo_call(f"call-echo-00{n}") for n in (1, 2, 3)]
        model = al.ScriptedModel(
            [tool_turn("response-budget-001", *calls), stop("response-budget-002", "must not run")]
        )
        start = [user("Echo three values.")]
        signal = threading.Event()
        events, result, _ = run(
            model, [echo_tool(executed)], messages=start, max_steps=max_steps, signal=signal
        )

        assert executed == ["call-echo-001", "call-echo-002", "call-echo-003"]
        assert model.call_count == max_steps
        assert (result.status, result.final_text) == (status, final_text)
        assert result.max_steps == (1 if status == "maxSteps" else None)
        assert (events[-1].type, events[-1].sequence) == ("run.finished", len(events) - 1)
        assert events[-1].payload["result"] is result


SIGNAL_LIKE = SimpleNamespace(is_set=lambda: False, wait=lambda timeout=None: False)
"""Not a threading.Event, but with the same reading side: is_set() and wait()."""


class HasWaitCoroutine:
    """Looks like a signal, but its wait() is a coroutine, as asyncio.Event's is."""

    def is_set(self) -> bool:
        return False

    async def wait(self) -> bool:
        return True


# Each row: the options that differ from a valid call, the error, and the words of its
# message that tell the row from the others (a bound's rule and the value given).
INVALID_OPTIONS = [
    pytest.param({"max_steps": 0}, ValueError, "max_steps must be an int in 1..64, got 0",
                 id="max_steps-under-limit-0"),
    pytest.param({"max_steps": 65}, ValueError, "max_steps must be an int in 1..64, got 65",
                 id="max_steps-over-limit-65"),
    pytest.param({"max_steps": -1}, ValueError, "max_steps must be an int in 1..64, got -1",
                 id="max_steps-negative"),
    pytest.param({"max_steps": True}, TypeError, "max_steps must be an int, got bool",
                 id="max_steps-bool"),
    pytest.param({"max_steps": 2.0}, TypeError, "max_steps must be an int, got float",
                 id="max_steps-float"),
    pytest.param({"max_steps": "2"}, TypeError, "max_steps must be an int, got str",
                 id="max_steps-str"),
    pytest.param({"max_steps": None}, TypeError, "max_steps must be an int, got NoneType",
                 id="max_steps-None"),
    pytest.param({"request_sequence_start": -1}, ValueError,
                 "request_sequence_start must be >= 0 with request_sequence_start + max_steps "
                 "<= 64, got -1 + 2", id="request_sequence_start-under-limit-negative"),
    pytest.param({"request_sequence_start": 61, "max_steps": 4}, ValueError,
                 "request_sequence_start + max_steps <= 64, got 61 + 4",
                 id="request_sequence_start-over-limit-61+4"),
    pytest.param({"request_sequence_start": 64, "max_steps": 1}, ValueError,
                 "request_sequence_start + max_steps <= 64, got 64 + 1",
                 id="request_sequence_start-over-limit-64+1"),
    pytest.param({"request_sequence_start": True}, TypeError,
                 "request_sequence_start must be an int, got bool",
                 id="request_sequence_start-bool"),
    pytest.param({"request_sequence_start": 1.0}, TypeError,
                 "request_sequence_start must be an int, got float",
                 id="request_sequence_start-float"),
    pytest.param({"model": object()}, TypeError, "model must have a callable stream(), got object",
                 id="model-without-stream"),
    pytest.param({"model": SimpleNamespace(stream="not a function")}, TypeError,
                 "model must have a callable stream(), got SimpleNamespace",
                 id="stream-not-callable"),
    pytest.param({"tools": [add_tool()]}, TypeError, "tools must be a ToolRegistry, got list",
                 id="tools-a-list"),
    pytest.param({"tools": None}, TypeError, "tools must be a ToolRegistry, got NoneType",
                 id="tools-None"),
    pytest.param({"signal": object()}, TypeError, "wait(timeout), got object",
                 id="signal-object"),
    # Not "must be a threading.Event" while anything with is_set() and wait() is accepted.
    pytest.param({"signal": True}, TypeError, "signal must be a threading.Event, or an object "
                 "with is_set() and wait(timeout), got bool", id="signal-bool"),
    pytest.param({"signal": SimpleNamespace(is_set=lambda: False)}, TypeError,
                 "wait(timeout), got SimpleNamespace", id="signal-without-wait"),
    pytest.param({"signal": HasWaitCoroutine()}, TypeError,
                 "HasWaitCoroutine.wait() is a coroutine", id="signal-wait-a-coroutine"),
    pytest.param({"messages": 42}, TypeError, "messages must be an iterable of messages, got int",
                 id="messages-int"),
    pytest.param({"messages": None}, TypeError,
                 "messages must be an iterable of messages, got NoneType", id="messages-None"),
]  # fmt: skip


VALID_OPTIONS = [
    pytest.param({"max_steps": 1}, id="max_steps-at-limit-1"),
    pytest.param({"max_steps": 64}, id="max_steps-at-limit-64"),
    pytest.param({"request_sequence_start": 0}, id="request_sequence_start-at-limit-0"),
    pytest.param({"request_sequence_start": 60, "max_steps": 4},
                 id="request_sequence_start-at-limit-60+4"),
    pytest.param({"request_sequence_start": 63, "max_steps": 1},
                 id="request_sequence_start-at-limit-63+1"),
    pytest.param({"signal": SIGNAL_LIKE}, id="signal-like-object"),
    pytest.param({"signal": None}, id="signal-None"),
    pytest.param({"messages": (user(),)}, id="messages-tuple"),
]  # fmt: skip


def options(model: al.ScriptedModel, overrides: dict[str, Any]) -> dict[str, Any]:
    """The options of a valid run_agent_loop() call, with ``overrides``."""
    valid = {"messages": [user()], "model": model, "tools": al.ToolRegistry([add_tool()])}
    return {**valid, "max_steps": 2, "signal": threading.Event(), **overrides}


class TestConstructionRejectsInvalidOptions:
    @pytest.mark.parametrize(("overrides", "error", "words"), INVALID_OPTIONS)
    def test_an_invalid_option_raises_at_call_time(
        self, overrides: dict[str, Any], error: type[Exception], words: str
    ) -> None:
        """Seed: "Invalid construction throws before an EventStream is returned." The
        call itself raises (nothing is iterated), naming the option; the model never runs.
        The rows: "maxSteps must be a positive safe integer no greater than
        MAX_AGENT_STEPS." "Optional requestSequenceStart must keep the requested range
        within the same ceiling." and the boundary shapes of model, tools and signal."""
        model = al.ScriptedModel([stop("response-001", "The sum is 42.")])
        with pytest.raises(error) as raised:
            al.run_agent_loop(**options(model, overrides))
        assert words in str(raised.value)
        assert model.call_count == 0

    def test_an_asyncio_event_is_told_to_use_threading_event(self) -> None:
        async def call_with_an_asyncio_event() -> str:
            with pytest.raises(TypeError) as raised:
                al.run_agent_loop(**options(al.ScriptedModel([]), {"signal": asyncio.Event()}))
            return str(raised.value)

        message = asyncio.run(call_with_an_asyncio_event())
        assert "Event.wait() is a coroutine (an asyncio.Event?)" in message
        assert "use threading.Event, and set it from your event loop" in message

    @pytest.mark.parametrize("overrides", VALID_OPTIONS)
    def test_a_valid_option_returns_a_generator_that_has_not_called_the_model(
        self, overrides: dict[str, Any]
    ) -> None:
        model = al.ScriptedModel([stop("response-001", "The sum is 42.")])
        loop = al.run_agent_loop(**options(model, overrides))
        assert isinstance(loop, collections.abc.Generator)
        assert inspect.getgeneratorstate(loop) == "GEN_CREATED"
        assert model.call_count == 0
        _, result = settle(loop, model)
        assert result.status == "completed"


def mutable_paths(root: object) -> list[str]:
    """Paths to every mutable container reachable from an object of the loop's API."""
    found: list[str] = []
    seen: set[int] = set()

    def walk(value: object, path: str) -> None:
        if id(value) in seen or value is None or isinstance(value, (str, int, float, bool)):
            return
        seen.add(id(value))
        if isinstance(value, (list, dict, set, bytearray)):
            found.append(path)
        elif isinstance(value, MappingProxyType):
            for key, item in value.items():
                walk(item, f"{path}[{key!r}]")
        elif isinstance(value, tuple):
            for index, item in enumerate(value):
                walk(item, f"{path}[{index}]")
        elif dataclasses.is_dataclass(value):
            for item in dataclasses.fields(value):
                try:
                    setattr(value, item.name, None)
                except dataclasses.FrozenInstanceError:
                    pass
                else:
                    found.append(f"{path}.{item.name} (assignable)")
                walk(getattr(value, item.name), f"{path}.{item.name}")
        else:
            found.append(f"{path} ({type(value).__name__})")

    walk(root, "root")
    return found


ADDING = (
    tool_turn("response-001", text("Adding."), add_call()),
    stop("response-002", "The sum is 42."),
)


class TestRunOwnsSnapshots:
    """Seed: "Before asynchronous work, the loop snapshots the Tool registry and starting
    transcript. The caller can later mutate its input array or register another Tool
    without changing the active run." """

    @pytest.mark.parametrize(
        "mutate",
        [
            pytest.param(lambda messages: messages.append(user("Later.", "user-2")), id="append"),
            pytest.param(lambda messages: messages.clear(), id="clear"),
            pytest.param(lambda messages: messages.insert(0, "not a message"), id="insert-junk"),
        ],
    )  # fmt: skip
    @pytest.mark.parametrize(
        "when",
        [
            pytest.param(None, id="after-the-call"),
            pytest.param(("message.accepted", 1), id="while-the-run-emits-it"),
            pytest.param(("model.chunk", 1), id="while-the-model-streams"),
            pytest.param(("tool.started", 1), id="while-a-tool-runs", marks=HOSTILE),
        ],
    )
    def test_the_caller_can_later_mutate_its_input_array_without_changing_the_active_run(
        self, mutate: Callable[[list[Any]], None], when: tuple[str, int] | None
    ) -> None:
        messages: list[Any] = [user()]
        model = al.ScriptedModel(ADDING)
        loop = start_run(model, [add_tool()], messages=messages, max_steps=2)
        events = [] if when is None else until(loop, *when)
        mutate(messages)
        more, result = al.settle_run(loop)
        check_run([*events, *more], result, model, max_steps=2, start=[user()])
        assert [request.messages[0] for request in model.requests] == [user(), user()]
        assert result.messages == (
            user(),
            assistant("response-001", text("Adding."), add_call()),
            add_result(),
            assistant("response-002", text("The sum is 42.")),
        )

    def test_a_generator_of_messages_is_read_completely_at_call_time(self) -> None:
        read: list[str] = []

        def start() -> Iterator[al.Message]:
            for message in (user(), user("And then?", "user-002")):
                read.append(message.id)
                yield message

        messages = start()
        model = al.ScriptedModel([stop("response-001", "The sum is 42.")])
        loop = start_run(model, messages=messages, max_steps=1)
        assert read == ["user-001", "user-002"]
        assert next(messages, None) is None  # consumed once, by the call
        settle(loop, model, max_steps=1)
        assert model.requests[0].messages == (user(), user("And then?", "user-002"))

    @pytest.mark.parametrize(
        "who",
        [
            pytest.param("caller-after-the-call", id="the-caller-after-the-call"),
            pytest.param("caller-during-the-run", id="the-caller-during-the-run", marks=HOSTILE),
            pytest.param("a-tool-of-the-run", id="a-tool-of-the-run-itself", marks=HOSTILE),
        ],
    )
    def test_the_caller_can_later_register_another_tool_without_changing_the_active_run(
        self, who: str
    ) -> None:
        """A call to the late tool gets an unknown-tool result; the late tool never runs
        and no request lists it."""
        executed: list[str] = []
        registry = al.ToolRegistry([add_tool()])

        def register_echo(arguments: dict[str, Any], signal: Any) -> object:
            registry.register(echo_tool(executed))
            return "registered"

        registry.register(no_arguments_tool("register", register_echo))
        first = call("register", "call-1", {}) if who == "a-tool-of-the-run" else add_call()
        model = al.ScriptedModel(
            [
                tool_turn("response-001", first),
                tool_turn("response-002", echo_call("call-echo-001", "late")),
                stop("response-003", "The sum is 42."),
            ]
        )
        loop = al.run_agent_loop(messages=[user()], model=model, tools=registry, max_steps=3)
        if who == "caller-after-the-call":
            registry.register(echo_tool(executed))
        events = until(loop, "model.chunk")
        if who == "caller-during-the-run":
            registry.register(echo_tool(executed))
        more, result = al.settle_run(loop)
        check_run([*events, *more], result, model, max_steps=3, start=[user()])

        assert "echo" in registry  # the caller's registry did change...
        assert executed == []  # ...but not the run's snapshot
        assert [[spec.name for spec in request.tools] for request in model.requests] == [
            ["add", "register"]
        ] * 3
        late = result.messages[4]
        assert isinstance(late, al.ToolResultMessage)
        assert (late.tool_call_id, late.is_error) == ("call-echo-001", True)
        assert "echo" in late.content
        assert result.status == "completed"

    @pytest.mark.hostile
    def test_nothing_reachable_from_events_results_or_requests_is_mutable(self) -> None:
        """Whatever the caller holds (events, the result, the requests a model saw) or
        sends into the run, it cannot change the run's transcript: all of it is frozen."""
        turns = [tool_turn("response-001", text("A."), add_call(), echo_call("call-2", "e"))]
        model = al.ScriptedModel([*turns, stop("response-002", "3")])
        enum_tool = al.Tool(
            "echo",
            "Echoes.",
            {"type": "object", "properties": {"text": {"type": "string", "enum": ["e", "f"]}}},
            lambda a, s: {"echo": [a["text"]]},
        )
        loop: Any = start_run(model, [add_tool(), enum_tool])
        events = [next(loop)]
        while True:
            try:
                events.append(loop.send("ignored value"))
            except StopIteration as done:
                result = done.value
                break
        check_run(events, result, model, max_steps=4, start=[user()])
        assert result.messages[2] == add_result()
        assert mutable_paths((tuple(events), result, tuple(model.requests))) == []


ROUND_ONE = (assistant("response-001", add_call()), add_result())


THREE_STEPS = (
    tool_turn("response-001", add_call()),
    tool_turn("response-002", echo_call("call-echo-001")),
    stop("response-003", "The sum is 42."),
)


class TestEachStepGetsFrozenTranscriptAndRequestId:
    def test_each_request_holds_the_complete_transcript_at_its_step(self) -> None:
        """Seed: "requestSnapshot() freezes the current transcript"; each request also
        carries the registry's specs, and later steps do not change earlier requests."""
        tools = [add_tool(), echo_tool()]
        _, result, model = run(FakeModel(*THREE_STEPS), tools=tools)

        assert result.messages == (
            user(),
            *ROUND_ONE,
            assistant("response-002", echo_call("call-echo-001")),
            echo_result("call-echo-001"),
            assistant("response-003", text("The sum is 42.")),
        )
        assert [len(held) for held in model.held] == [1, 3, 5]
        assert [list(request.messages) for request in model.requests] == model.held
        assert all(type(request.messages) is tuple for request in model.requests)
        specs = al.ToolRegistry(tools).specs()
        assert [spec.name for spec in specs] == ["add", "echo"]
        assert [request.tools for request in model.requests] == [specs] * 3

    @pytest.mark.parametrize(
        ("start", "max_steps", "ids"),
        [
            pytest.param(0, 4, ["request-001", "request-002", "request-003"], id="from-1"),
            pytest.param(5, 4, ["request-006", "request-007", "request-008"], id="offset-5"),
            pytest.param(61, 3, ["request-062", "request-063", "request-064"], id="at-ceiling"),
            pytest.param(63, 1, ["request-064"], id="the-last-request-is-064"),
        ],
    )
    def test_request_ids_count_steps_offset_by_the_sequence_start(
        self, start: int, max_steps: int, ids: list[str]
    ) -> None:
        """Seed: "creates request-001, request-002, and so on, offset by
        requestSequenceStart"; chunks and tool events carry the active request id."""
        events, result, model = run(
            THREE_STEPS,
            tools=[add_tool(), echo_tool()],
            max_steps=max_steps,
            request_sequence_start=start,
        )

        assert [request.id for request in model.requests] == ids
        # The result says where the ids started and where a resumed run's ids go on.
        assert (result.request_sequence_start, result.next_request_sequence) == (
            start,
            start + len(ids),
        )
        correlated = [
            (e.type, e.payload["request_id"]) for e in events if "request_id" in e.payload
        ]
        kinds = ("model.chunk", "tool.started", "tool.finished")
        assert correlated == [(kind, ids[step]) for step in range(len(ids)) for kind in kinds][:7]


BATCH = (echo_call("call-echo-001"), add_call(), echo_call("call-echo-002"))


BATCH_RESULTS = (echo_result("call-echo-001"), add_result(), echo_result("call-echo-002"))


class TestAssistantMessagesPrecedeToolResults:
    def test_calls_execute_and_results_append_in_assistant_order(self) -> None:
        """Seed: "Multiple calls execute sequentially in this workshop." and "For each call,
        it emits tool.started, awaits executeToolCall(), appends the linked Tool-result
        message, then emits tool.finished." and "After the complete Tool batch,
        validateTranscript() proves that every call has one later matching result." """
        executed: list[str] = []
        events, result, model = run(
            [
                tool_turn("response-001", *BATCH),
                tool_turn("response-002", echo_call("call-echo-003")),
                stop("response-003", "The sum is 42."),
            ],
            tools=recording_tools(executed),
        )

        assert executed == ["call-echo-001", "add", "call-echo-002", "call-echo-003"]
        assert result.messages == (
            user(),
            assistant("response-001", *BATCH),
            *BATCH_RESULTS,
            assistant("response-002", echo_call("call-echo-003")),
            echo_result("call-echo-003"),
            assistant("response-003", text("The sum is 42.")),
        )
        tool_events = [event for event in events if event.type.startswith("tool.")]
        assert types_of(tool_events) == ["tool.started", "tool.finished"] * 4
        for index, tool_call in enumerate(BATCH):
            started, finished = tool_events[2 * index : 2 * index + 2]
            assert dict(started.payload) == {"request_id": "request-001", "tool_call": tool_call}
            assert dict(finished.payload) == {
                "request_id": "request-001",
                "tool_call": tool_call,
                "tool_result": BATCH_RESULTS[index],
            }
            # already appended: the next request holds it at the same place
            assert model.requests[1].messages[2 + index] == finished.payload["tool_result"]


class UnprintableError(Exception):
    """An exception whose str() itself raises."""

    def __str__(self) -> str:
        raise RuntimeError("no message for you")


RAISED = [
    pytest.param(ValueError("bad value"), id="raises-ValueError"),
    pytest.param(RuntimeError(), id="raises-RuntimeError-without-message"),
    pytest.param(RecursionError("deep"), id="raises-RecursionError"),
    pytest.param(StopIteration("leaked"), id="raises-StopIteration"),
    pytest.param(UnprintableError(), id="raises-an-exception-whose-str-raises"),
]


NOT_JSON_RETURNS = [
    pytest.param(object(), id="returns-an-object"),
    pytest.param({1, 2}, id="returns-a-set"),
    pytest.param(b"bytes", id="returns-bytes"),
    pytest.param(float("nan"), id="returns-NaN"),
    pytest.param({"x": float("inf")}, id="returns-nested-Infinity"),
    pytest.param({(1, 2): "tuple key"}, id="returns-a-tuple-key"),
    pytest.param(cyclic_array(), id="returns-a-cyclic-value"),
    pytest.param(nested(100_001, "array"), id="returns-JSON-nested-100000-deep"),
]


class TestRecoverableToolErrors:
    @pytest.mark.parametrize(
        ("tool_call", "tools", "named"),
        [
            pytest.param(call("search", "call-search-001", {"q": "x"}), [add_tool()], "search",
                         id="unknown-tool"),
            pytest.param(call("add", "call-add-001", {"left": "20", "right": 22}), [add_tool()],
                         "left", id="schema-invalid-arguments"),
            pytest.param(call("explode", "call-explode-001", {}),
                         [no_arguments_tool("explode", raising(ValueError("the fuse blew")))],
                         "the fuse blew", id="tool-raises"),
            pytest.param(call("opaque", "call-opaque-001", {}),
                         [no_arguments_tool("opaque", opaque)], "opaque", id="non-json-return"),
            *[
                pytest.param(call("flaky", "call-flaky-001", {}),
                             [no_arguments_tool("flaky", raising(case.values[0]))],  # type: ignore[arg-type]
                             type(case.values[0]).__name__, id=case.id, marks=HOSTILE)
                for case in RAISED
            ],
            *[
                pytest.param(call("odd", "call-odd-001", {}),
                             [no_arguments_tool("odd", returns(case.values[0]))], "odd",
                             id=case.id, marks=HOSTILE)
                for case in NOT_JSON_RETURNS
            ],
        ],
    )  # fmt: skip
    def test_a_tool_error_is_a_linked_result_that_reaches_the_continuation(
        self, tool_call: al.ToolCall, tools: list[al.Tool], named: str
    ) -> None:
        """Seed: "A recoverable Tool error is still appended and sent to the next model
        request; it does not end the run by itself." """
        _, result, model = run(
            [tool_turn("response-001", tool_call), stop("response-002", "Sorry.")], tools=tools
        )

        error = result.messages[2]
        assert isinstance(error, al.ToolResultMessage)
        assert error.id == "tool-result-" + tool_call.id
        assert (error.tool_call_id, error.tool_name) == (tool_call.id, tool_call.name)
        assert error.is_error is True
        assert named in error.content
        assert model.requests[1].messages == (user(), assistant("response-001", tool_call), error)
        assert result.final_text == "Sorry."


class TestEventSequence:
    @pytest.mark.parametrize(
        ("status", "steps", "options"),
        [
            pytest.param("completed", 2, {}, id="completed"),
            pytest.param("maxSteps", 2, {"max_steps": 1}, id="maxSteps"),
            pytest.param("failed", 1, {}, id="failed"),
            pytest.param("cancelled", 2, {"cancel_at": ("model.chunk", 2)}, id="cancelled"),
        ],
    )
    def test_one_counter_numbers_every_kind_of_event_and_run_finished_is_last(
        self, status: str, steps: int, options: dict[str, Any]
    ) -> None:
        """Seed: "Event sequence values increase by one across message, model, Tool, and
        terminal events; run.finished is last." and "Each event receives the next integer
        sequence; no component owns a separate counter." and "It first emits one
        message.accepted event for every starting message." """
        script = [tool_turn("response-001", add_call()), stop("response-002", "The sum is 42.")]
        script = script[:steps]
        signal = threading.Event() if "cancel_at" in options else None
        events, result, _ = run(
            script, [add_tool()], messages=PRIOR_ROUND, signal=signal, **options
        )

        assert result.status == status
        assert set(types_of(events)) == set(SEED_EVENT_TYPES)
        accepted = [dict(event.payload) for event in events[: len(PRIOR_ROUND)]]
        assert accepted == [{"message": message} for message in PRIOR_ROUND]
        assert [event.sequence for event in events] == list(range(len(events)))
        assert types_of(events).count("run.finished") == 1
        assert dict(events[-1].payload) == {"result": result}

    def test_the_loop_drains_the_stream_before_awaiting_the_terminal_response(self) -> None:
        """Seed: "The loop calls model.stream() and drains its event channel before
        awaiting the terminal response." Each chunk is the consumer's event before the
        model is asked for the next one, and the response is taken after the last."""
        log: list[str] = []

        def streaming(
            model: FakeModel, request: al.ModelRequest, signal: Any
        ) -> Generator[object, None, object]:
            for piece in ("Hel", "lo"):
                log.append(f"streamed {piece!r}")
                yield al.TextDelta(request.id, piece)
            log.append("returned the response")
            return al.ModelResponse("response-001", request.id, (text("Hello"),), "stop")

        model = FakeModel(streaming)
        run_ = start_run(model)
        events = until(run_, "model.chunk")
        assert log == ["streamed 'Hel'"]
        events += until(run_, "model.chunk")
        assert log == ["streamed 'Hel'", "streamed 'lo'"]
        more, result = al.settle_run(run_)
        assert log == ["streamed 'Hel'", "streamed 'lo'", "returned the response"]
        check_run(events + more, result, model, max_steps=4, start=[user()])
        assert types_of(more) == ["run.finished"]
        assert result.final_text == "Hello"


CANCEL_START = (user("Add 20 and 22.", "user-001"), user("Then echo it.", "user-002"))


def cancel_script() -> list[Any]:
    """Step 1: text, add, echo (three chunks, two tools); step 2: the answer."""
    return [
        tool_turn("response-001", text("Adding."), add_call(), echo_call("call-echo-001")),
        stop("response-002", "The sum is 42."),
    ]


def index_of(events: Sequence[al.Event], at: tuple[str, int]) -> int:
    """The index of the ``at[1]``-th event of type ``at[0]`` (counting from 1)."""
    return [index for index, event in enumerate(events) if event.type == at[0]][at[1] - 1]


class Interruption:
    """How the signal reaches a tool or model that is running: it sets it itself, or it
    waits on it while another thread sets it ("thread")."""

    def __init__(self, who: str, signal: threading.Event) -> None:
        self.who = who
        self.ready = threading.Event()
        self.woke: list[bool] = []
        self.thread = threading.Thread(target=self.abort, args=(signal,))
        if who == "thread":
            self.thread.start()

    def abort(self, signal: threading.Event) -> None:
        if self.ready.wait(5):  # a safety net: the tool or model is ready long before
            signal.set()

    def arrive(self, signal: Any) -> None:
        if self.who == "thread":
            self.ready.set()
            self.woke.append(signal.wait(5))  # a safety net: the thread sets it at once
        else:
            signal.set()

    def check(self) -> None:
        """The other thread is done, and released the waiter (not its safety timeout)."""
        if self.who == "thread":
            self.thread.join(5)
            assert not self.thread.is_alive()
            assert self.woke == [True]


class TestCancellation:
    """Seed: "Cancellation retains only complete messages and never fabricates a Tool
    result for interrupted execution." Each case sets the signal at one point of the
    diagram; the run must match the uncancelled run up to that point, then finish."""

    @pytest.mark.parametrize(
        ("at", "kept", "steps", "open_ids", "executed"),
        [
            pytest.param(None, 2, 0, [], [], id="SnapshotRun-before-first-next"),
            pytest.param(("message.accepted", 1), 2, 0, [], [], id="EmitAccepted"),
            pytest.param(("message.accepted", 2), 2, 0, [], [], id="OpenModel-never-called"),
            pytest.param(("model.chunk", 1), 2, 1, [], [], id="ReadChunks-first-chunk"),
            pytest.param(("model.chunk", 3), 2, 1, [], [], id="ReadChunks-last-chunk"),
            pytest.param(("tool.started", 1), 3, 1, ["call-add-001", "call-echo-001"], [],
                         id="ExecuteTools-at-first-tool.started"),
            pytest.param(("tool.finished", 1), 4, 1, ["call-echo-001"], ["add"],
                         id="ExecuteTools-second-call-never-starts"),
            pytest.param(("tool.started", 2), 4, 1, ["call-echo-001"], ["add"],
                         id="ExecuteTools-at-second-tool.started"),
            pytest.param(("tool.finished", 2), 5, 1, [], ["add", "call-echo-001"],
                         id="between-steps"),
            pytest.param(("model.chunk", 4), 5, 2, [], ["add", "call-echo-001"],
                         id="ReadChunks-step-2"),
        ],
    )  # fmt: skip
    def test_the_signal_aborts(
        self,
        at: tuple[str, int] | None,
        kept: int,
        steps: int,
        open_ids: list[str],
        executed: list[str],
    ) -> None:
        full_events, full, _ = run(
            cancel_script(), messages=CANCEL_START, tools=[add_tool(), echo_tool()]
        )
        assert full.status == "completed"

        ran: list[str] = []
        signal = threading.Event()
        if at is None:
            signal.set()
        events, result, model = run(
            cancel_script(),
            recording_tools(ran),
            messages=CANCEL_START,
            signal=signal,
            cancel_at=at,
        )

        assert (result.status, result.final_text, result.max_steps, result.error) == (
            "cancelled",
            None,
            None,
            None,
        )
        # Up to the event that set the signal, the same events as the uncancelled run;
        # after it, nothing but run.finished.
        cut = 0 if at is None else index_of(full_events, at) + 1
        assert events[:-1] == full_events[:cut]
        assert result.messages == full.messages[:kept]
        assert result.steps == steps == model.call_count
        assert open_call_ids(result.messages) == open_ids
        assert ran == executed

    @pytest.mark.parametrize(
        ("who", "then"),
        [
            pytest.param("consumer", None, id="the-consumer-at-tool.started"),
            pytest.param("itself", None, id="the-tool-sets-it-then-returns"),
            pytest.param("itself", RuntimeError("aborted"), id="the-tool-sets-it-then-raises"),
            pytest.param("itself", al.ToolError("aborted"),
                         id="the-tool-sets-it-then-raises-ToolError"),
            pytest.param("itself", Fatal("aborted"),
                         id="the-tool-sets-it-then-raises-BaseException"),
            pytest.param("thread", None, id="another-thread-then-it-returns", marks=HOSTILE),
            pytest.param("thread", RuntimeError("aborted"), id="another-thread-then-it-raises",
                         marks=HOSTILE),
            pytest.param("thread", Fatal("aborted"), id="another-thread-then-BaseException",
                         marks=HOSTILE),
        ],
    )  # fmt: skip
    def test_cancellation_during_tool_execution_appends_no_fabricated_result(
        self, who: str, then: BaseException | None
    ) -> None:
        """Seed: "Cancellation during Tool execution retains the complete assistant
        Tool-call message, emits tool.started, and appends no fabricated result." However
        the signal comes and whatever the tool does then (the module docstring:
        "Cancellation wins over a stream or tool error that arrives after the signal was
        set"), the run ends cancelled right after that tool.started."""
        signal = threading.Event()
        interruption = Interruption(who, signal)

        def interrupted(arguments: dict[str, Any], tool_signal: Any) -> object:
            interruption.arrive(tool_signal)  # the consumer's case never gets here
            if then is not None:
                raise then
            return "a result that arrives too late"

        ran: list[str] = []
        calls = (text("Waiting."), call("wait", "call-wait-001", {}), echo_call("call-echo-001"))
        events, result, model = run(
            [tool_turn("response-001", *calls), stop("response-002", "The sum is 42.")],
            tools=[no_arguments_tool("wait", interrupted), echo_tool(ran)],
            signal=signal,
            cancel_at=("tool.started", 1) if who == "consumer" else None,
        )
        interruption.check()

        assert (result.status, result.error) == ("cancelled", None)
        assert types_of(events) == [
            "message.accepted",
            *["model.chunk"] * 3,
            "tool.started",
            "run.finished",
        ]
        assert events[-2].payload["tool_call"] == calls[1]
        assert result.messages == (user(), assistant("response-001", *calls))
        assert open_call_ids(result.messages) == ["call-wait-001", "call-echo-001"]
        assert ran == []
        assert result.steps == model.call_count == 1

    @pytest.mark.parametrize(
        ("who", "then", "chunks"),
        [
            pytest.param("itself", "returns", 1, id="terminal-response-waiting"),
            pytest.param("itself", "raises-at-once", 0, id="a-stream-error-after-the-signal"),
            pytest.param("thread", "yields", 1, id="another-thread-then-the-stream-yields",
                         marks=HOSTILE),
            pytest.param("thread", "raises", 1, id="another-thread-then-the-stream-raises",
                         marks=HOSTILE),
            pytest.param("thread", "returns", 1, id="another-thread-then-the-stream-returns",
                         marks=HOSTILE),
            pytest.param("thread", "stream()-raises", 0,
                         id="another-thread-while-stream()-blocks", marks=HOSTILE),
        ],
    )  # fmt: skip
    def test_a_partial_model_chunk_is_never_appended(
        self, who: str, then: str, chunks: int
    ) -> None:
        """Seed: "A partial model chunk may already have an event but its unfinished
        assistant message is not appended." Cancellation while the model streams or while
        the loop waits for its terminal response, whatever the model does then: the run
        ends cancelled, the step counted, and the model's stream closed."""
        signal = threading.Event()
        interruption = Interruption(who, signal)

        def streaming(
            model: FakeModel, request: al.ModelRequest, model_signal: Any
        ) -> Generator[object, None, object]:
            try:
                if then == "raises-at-once":
                    interruption.arrive(model_signal)
                    raise ConnectionError("closed because of the signal")
                yield al.TextDelta(request.id, "Hel")
                interruption.arrive(model_signal)  # before the terminal response
                if then == "yields":
                    yield al.TextDelta(request.id, "lo")
                elif then == "raises":
                    raise ConnectionError("stream aborted")
                return al.ModelResponse("response-001", request.id, (text("Hel"),), "stop")
            finally:
                model.finalized.append(request.id)

        def stream(model: FakeModel, request: al.ModelRequest, model_signal: Any) -> Any:
            if then == "stream()-raises":
                interruption.arrive(model_signal)
                raise ConnectionAbortedError("cancelled by the caller")
            return streaming(model, request, model_signal)

        events, result, model = run([stream], signal=signal)
        interruption.check()

        assert (result.status, result.error) == ("cancelled", None)
        assert types_of(events) == ["message.accepted", *["model.chunk"] * chunks, "run.finished"]
        assert result.messages == (user(),)
        assert result.steps == model.call_count == 1
        assert model.finalized == ([] if then == "stream()-raises" else ["request-001"])


class TestStepBudget:
    @pytest.mark.parametrize(
        "max_steps",
        [
            pytest.param(1, id="max_steps-1"),
            pytest.param(2, id="max_steps-2"),
            pytest.param(64, id="max_steps-at-limit-64"),
        ],
    )
    def test_with_max_steps_the_tool_batch_completes_and_no_continuation_request_opens(
        self, max_steps: int
    ) -> None:
        """Seed: "With maxSteps: 1, the current Tool batch completes, no continuation
        request opens, and the terminal result is maxSteps." At every budget: Seed: "If
        the current step equals maxSteps, the loop emits run.finished with status maxSteps
        and does not open another model request." Each step calls echo three times; the
        stop continuation queued after them is never requested."""
        executed: list[str] = []
        batches = [
            [echo_call(f"call-echo-{step:03d}-{n}") for n in (1, 2, 3)]
            for step in range(1, max_steps + 1)
        ]
        script = [
            tool_turn(f"response-{step:03d}", *batch) for step, batch in enumerate(batches, 1)
        ]
        events, result, model = run(
            [*script, stop("response-continuation", "must not run")],
            tools=[echo_tool(executed)],
            max_steps=max_steps,
        )

        # Every call of every batch ran, in order, and its result was appended after
        # its assistant message.
        assert executed == [tool_call.id for batch in batches for tool_call in batch]
        transcript: list[al.Message] = [user()]
        for step, batch in enumerate(batches, 1):
            transcript.append(assistant(f"response-{step:03d}", *batch))
            transcript += [echo_result(tool_call.id) for tool_call in batch]
        assert result.messages == tuple(transcript)
        # No continuation request: one request per step, the last one the budget's.
        assert model.call_count == result.steps == max_steps
        assert model.requests[-1].id == f"request-{max_steps:03d}"
        assert (result.status, result.max_steps) == ("maxSteps", max_steps)
        assert result.final_text is None
        assert types_of(events)[-2:] == ["tool.finished", "run.finished"]
        assert events[-1].sequence == len(events) - 1
        assert events[-1].payload["result"] is result

    @pytest.mark.parametrize("max_steps", [1, 2, 64])
    def test_a_stop_response_on_the_last_allowed_step_completes(self, max_steps: int) -> None:
        """The budget ends a run after a tool step only: a stop response on the step that
        equals maxSteps completes the run (AppendAssistant --> Completed)."""
        executed: list[str] = []
        script = [
            tool_turn(f"response-{step:03d}", echo_call(f"call-echo-{step:03d}"))
            for step in range(1, max_steps)
        ]
        _, result, model = run(
            [*script, stop(f"response-{max_steps:03d}", "Done within the budget.")],
            tools=[echo_tool(executed)],
            max_steps=max_steps,
        )

        assert executed == [f"call-echo-{step:03d}" for step in range(1, max_steps)]
        assert result.steps == model.call_count == max_steps
        assert (result.status, result.max_steps) == ("completed", None)
        assert result.final_text == "Done within the budget."

    def test_the_budget_counts_model_turns_not_tool_calls(self) -> None:
        """Seed: "the budget counts model turns, not individual Tool calls." """
        calls = [echo_call(f"call-echo-{n:03d}") for n in range(1, 6)]
        executed: list[str] = []
        _, result, _ = run(
            [tool_turn("response-001", *calls), stop("response-002", "The sum is 42.")],
            tools=[echo_tool(executed)],
            max_steps=2,
        )
        assert len(executed) == 5
        assert (result.status, result.steps) == ("completed", 2)


class TestFailureCodes:
    @pytest.mark.parametrize("earlier", [0, 1], ids=["in-the-first-step", "in-a-later-step"])
    @pytest.mark.parametrize(
        ("blocks", "stop_reason", "words"),
        [
            pytest.param([text("Done."), add_call("c2")], "stop",
                         "a stop response holds tool calls", id="stop-with-a-call"),
            # The converse, which the seed implies: toolCall says there is a call to run.
            pytest.param([text("Done.")], "toolCall",
                         "a toolCall response holds no tool call", id="toolCall-without-a-call"),
        ],
    )  # fmt: skip
    def test_tool_calls_are_forbidden_in_a_stop_response(
        self,
        earlier: int,
        blocks: list[al.TextBlock | al.ToolCall],
        stop_reason: al.StopReason,
        words: str,
    ) -> None:
        """Seed: "Tool calls are forbidden in a stop response." The step is not kept; the
        rounds before it are."""
        executed: list[str] = []
        violation = al.scripted_response("response-002", blocks, stop_reason)
        events, result, _ = run(
            [tool_turn("response-001", add_call()), violation] if earlier else [violation],
            tools=recording_tools(executed),
        )
        assert_failed(events, result, "MODEL_PROTOCOL_ERROR", words)
        assert executed == ["add"] * earlier
        assert result.messages == ((user(), *ROUND_ONE) if earlier else (user(),))
        assert result.steps == earlier + 1

    @pytest.mark.parametrize(
        ("chunks", "error", "message"),
        [
            pytest.param(None, ConnectionError("no route to the model"),
                         "model.stream() raised ConnectionError: no route to the model",
                         id="stream()-raises"),
            pytest.param(None, StopIteration("no stream"),
                         "model.stream() raised StopIteration: no stream",
                         id="StopIteration-from-stream()"),
            pytest.param(0, ConnectionResetError("peer"),
                         "the model's stream raised ConnectionResetError: peer",
                         id="the-stream-raises-at-once"),
            pytest.param(1, ConnectionResetError("peer"),
                         "the model's stream raised ConnectionResetError: peer",
                         id="the-stream-raises-after-a-call-chunk"),
            pytest.param(3, ConnectionResetError("peer"),
                         "the model's stream raised ConnectionResetError: peer",
                         id="the-stream-raises-after-3-chunks"),
            pytest.param(1, StopIteration(),
                         "the model's stream raised RuntimeError: generator raised StopIteration",
                         id="StopIteration-inside-the-generator"),
            pytest.param(1, Fatal("stop here"), "the model's stream raised Fatal: stop here",
                         id="a-BaseException-from-the-stream"),
        ],
    )  # fmt: skip
    def test_model_stream_error_when_the_model_fails(
        self, chunks: int | None, error: BaseException, message: str
    ) -> None:
        """The module docstring: "any other exception from a model fails the run with
        MODEL_STREAM_ERROR"; the chunks before it have events, nothing is appended, and
        a tool call already announced never runs. A StopIteration raised by stream() is a
        failure like any other, never a RuntimeError out of the run (PEP 479); one raised
        inside the generator is a stream error, never a silently empty response."""

        def raise_from_stream(model: FakeModel, request: al.ModelRequest, signal: Any) -> Any:
            raise error

        items = [echo_call("call-1", "a"), text("b"), text("c")][: chunks or 0]
        streaming = stream_step([*items, raise_error(error)], raise_error(AssertionError()))
        executed: list[str] = []
        events, result, model = run(
            [raise_from_stream if chunks is None else streaming], [echo_tool(executed)]
        )

        assert_failed(events, result, "MODEL_STREAM_ERROR", message)
        assert types_of(events) == [
            "message.accepted",
            *["model.chunk"] * (chunks or 0),
            "run.finished",
        ]
        assert result.messages == (user(),)
        assert result.steps == model.call_count == 1
        assert executed == []
        assert model.finalized == ([] if chunks is None else ["request-001"])
        assert result.error is not None
        assert result.error.to_dict() == {"code": "MODEL_STREAM_ERROR", "message": message}
        if "RuntimeError" not in message:  # PEP 479 made that StopIteration a RuntimeError
            assert result.error.exception is error

    def test_model_stream_error_when_a_scripted_model_runs_out_of_responses(self) -> None:
        events, result, model = run([tool_turn("response-001", add_call())], tools=[add_tool()])
        assert_failed(events, result, "MODEL_STREAM_ERROR")
        assert [request.id for request in model.requests] == ["request-001", "request-002"]
        assert model.requests[1].messages == result.messages == (user(), *ROUND_ONE)
        assert result.steps == 2

    @pytest.mark.parametrize(
        "error",
        [
            pytest.param(Fatal("the disk caught fire"), id="BaseException"),
            pytest.param(GeneratorExit(), id="GeneratorExit"),
        ],
    )
    def test_tool_phase_error_when_a_tool_raises_a_base_exception(
        self, error: BaseException
    ) -> None:
        """API: TOOL_PHASE_ERROR is "a tool phase that cannot be turned into a linked
        result message": the call stays open, no result is fabricated, and the calls
        after it never run."""
        executed: list[str] = []
        calls = (call("fatal", "call-fatal-001", {}), echo_call("call-echo-001"))
        events, result, model = run(
            [tool_turn("response-001", *calls), stop("response-002", "The sum is 42.")],
            tools=[no_arguments_tool("fatal", raising(error)), echo_tool(executed)],
            signal=threading.Event(),
        )

        assert_failed(events, result, "TOOL_PHASE_ERROR", str(error))
        assert result.error is not None
        assert result.error.exception is error
        assert types_of(events)[-2:] == ["tool.started", "run.finished"]
        assert result.messages == (user(), assistant("response-001", *calls))
        assert open_call_ids(result.messages) == ["call-fatal-001", "call-echo-001"]
        assert executed == []
        assert model.call_count == 1

    def test_run_errors_differing_only_in_exception_are_equal(self) -> None:
        """API: "RunError.exception ... is not part of to_dict() or of equality"."""
        first = al.RunError("MODEL_STREAM_ERROR", "m", ValueError("a"))
        assert first == al.RunError("MODEL_STREAM_ERROR", "m", KeyError("b"))
        assert first == al.RunError("MODEL_STREAM_ERROR", "m")
        assert "exception" not in first.to_dict()


REDACTED_BLOCK = al.ThinkingBlock("", "opaque-data", redacted=True)


# Each row: the content of a response and the chunks streamed for it, which agree.
AGREEING = [
    pytest.param([text("The sum is 42.")], [text("The su"), text("m is 42.")],
                 id="chunks-split-terminal-whole"),
    pytest.param([text("The su"), text("m is 42.")], [text("The sum is 42.")],
                 id="terminal-split-chunk-whole"),
    pytest.param([text("The "), text("sum is 42.")], [text("The sum"), text(" is 42.")],
                 id="both-split-differently"),
    pytest.param([text("Add"), text("ing "), add_call(), text("now.")],
                 [text("Adding "), add_call(), text("no"), text("w.")],
                 id="tool-calls-are-boundaries-of-coalesced-text"),
    pytest.param([add_call()], [text(""), add_call()], id="an-empty-text-chunk-carries-nothing"),
    pytest.param([thought("Let me add.", "sig")], [thought("Let me"), thought(" add.")],
                 id="deltas-split-signed-block-whole"),
    pytest.param([thought("Let me", "s1"), thought(" add.", "s2")], [thought("Let me add.")],
                 id="blocks-split-delta-whole"),
    pytest.param([REDACTED_BLOCK, text("Hi.")], [text("Hi.")],
                 id="redacted-block-needs-no-chunk"),
    pytest.param([text("Hi"), REDACTED_BLOCK, text(" there.")], [text("Hi there.")],
                 id="redacted-block-between-text-carries-nothing"),
    pytest.param([thought("a", "s1"), REDACTED_BLOCK, thought("b", "s2")], [thought("ab")],
                 id="redacted-block-between-thinking"),
    pytest.param([thought("Hm.", "s"), text("Hi.")],
                 [thought(""), thought("Hm."), text(""), text("Hi.")],
                 id="empty-deltas-carry-nothing"),
    pytest.param([thought("I should add.", "sig-1"), text("Adding."), REDACTED_BLOCK,
                  thought("", "sig-empty"), add_call()],
                 [thought("I should"), thought(" add."), text("Adding."), add_call()],
                 id="thinking-is-kept-where-the-model-gave-it"),
]  # fmt: skip


# Each row: content and chunks that disagree, and the words of the failure.
DISAGREEING = [
    pytest.param([text("Hello"), text(" world")], [text("Hello"), text(" there")],
                 ["the streamed chunks and the terminal response disagree at normalised block "
                  "0: streamed 'Hello there', terminal 'Hello world'"],
                 id="the-first-differing-block-is-shown-on-each-side"),
    pytest.param([text("a"), echo_call("c1", "x")], [text("a")],
                 ["disagree at normalised block 1: streamed nothing, terminal tool call 'c1' "
                  "to 'echo' with {'text': 'x'}"], id="a-missing-block-is-shown-as-nothing"),
    pytest.param([add_call("call-add-001")], [add_call("call-add-002")],
                 ["streamed tool call 'call-add-002' to 'add' with {'left': 20, 'right': 22}, "
                  "terminal tool call 'call-add-001' to 'add'"],
                 id="a-tool-call-is-shown-by-its-id-name-and-arguments"),
    pytest.param([text("x" * 5000)], [text("y" * 5000)], ["block 0: streamed 'yyy", "..."],
                 id="long-blocks-are-shortened"),
    pytest.param([text("a"), text("b")], [],
                 ["the model streamed nothing, but its terminal response holds 2 block(s): a "
                  "model must yield a chunk for each block it returns (a TextDelta per text, a "
                  "ThinkingDelta per thinking, a ToolCallChunk per tool call)"],
                 id="a-model-that-streamed-nothing-is-told-to-yield-a-chunk-per-block"),
    pytest.param([text("Adding "), add_call(), text("now.")], [text("Adding now."), add_call()],
                 ["streamed 'Adding now.', terminal 'Adding '"],
                 id="text-cannot-move-across-a-tool-call"),
    pytest.param([thought("Hm."), text("Hi.")], [text("Hm."), text("Hi.")],
                 ["streamed 'Hm.Hi.'", "terminal thinking 'Hm.'"], id="thinking-streamed-as-text"),
    pytest.param([text("Hm.")], [thought("Hm.")], ["streamed thinking 'Hm.'", "terminal 'Hm.'"],
                 id="text-streamed-as-thinking"),
    pytest.param([thought("a"), text("x"), thought("b")], [thought("ab"), text("x")],
                 ["streamed thinking 'ab'", "terminal thinking 'a'"],
                 id="thinking-moved-across-text"),
    pytest.param([thought("a"), add_call(), thought("b")], [thought("ab"), add_call()],
                 ["streamed thinking 'ab'", "terminal thinking 'a'"],
                 id="thinking-moved-across-a-call"),
    pytest.param([thought("Hm.", "s")], [], ["a ThinkingDelta per thinking"],
                 id="thinking-not-streamed"),
]  # fmt: skip


def delta(block: Any) -> al.ModelChunk:
    """The chunk that streams ``block`` for request-001."""
    if isinstance(block, al.TextBlock):
        return al.TextDelta("request-001", block.text)
    if isinstance(block, al.ThinkingBlock):
        return al.ThinkingDelta("request-001", block.thinking)
    return al.ToolCallChunk("request-001", block)


def agreement_run(content: list[Any], chunks: list[Any], executed: list[str]) -> Any:
    """A response of ``content`` streamed as ``chunks`` (toolCall when it holds a call),
    then a stop response; the tools record into ``executed``."""
    calls = any(isinstance(block, al.ToolCall) for block in content)
    response = al.scripted_response(
        "response-001", content, "toolCall" if calls else "stop", chunks=chunks
    )
    return run([response, stop("response-002", "The sum is 42.")], recording_tools(executed))


class TestStreamAndResponseAgree:
    """Seed: "The resulting normalized block sequences must agree in content and order;
    raw text-chunk segmentation may differ." The loop "coalesces adjacent streamed text
    deltas and adjacent terminal text blocks, using Tool calls as boundaries"; thinking
    coalesces the same way, text, thinking and calls are each other's boundaries, empty
    text or thinking (a redacted block) carries nothing, and a signature arrives only in
    the terminal response."""

    @pytest.mark.parametrize(("content", "chunks"), AGREEING)
    def test_segmentation_may_differ(self, content: list[Any], chunks: list[Any]) -> None:
        events, result, _ = agreement_run(content, chunks, [])
        assert result.status == "completed"
        # The message appended (and sent in the next request) is the response as returned.
        assert result.messages[1] == al.AssistantMessage("message-response-001", content)
        # Each chunk has its model.chunk event, which carries the request id and the chunk.
        streamed = [dict(event.payload) for event in events if event.type == "model.chunk"]
        assert streamed[: len(chunks)] == [
            {"request_id": "request-001", "chunk": delta(chunk)} for chunk in chunks
        ]

    @pytest.mark.parametrize(("content", "chunks", "words"), DISAGREEING)
    def test_the_first_differing_block_is_shown_on_each_side(
        self, content: list[Any], chunks: list[Any], words: list[str]
    ) -> None:
        """When they disagree: MODEL_PROTOCOL_ERROR naming the first differing normalised
        block on each side, shortened; nothing appended, no tool run."""
        executed: list[str] = []
        events, result, _ = agreement_run(content, chunks, executed)
        assert_failed(events, result, "MODEL_PROTOCOL_ERROR", *words)
        assert len(failure_message(result, "MODEL_PROTOCOL_ERROR")) < 300
        assert result.messages == (user(),)
        assert executed == []

    @pytest.mark.parametrize(("content", "chunks"), AGREEING)
    def test_check_stream_agreement_accepts_what_the_loop_accepts(
        self, content: list[Any], chunks: list[Any]
    ) -> None:
        response = al.ModelResponse("response-001", "request-001", content, "stop")
        al.check_stream_agreement([delta(chunk) for chunk in chunks], response)

    @pytest.mark.parametrize(("content", "chunks", "words"), DISAGREEING)
    def test_check_stream_agreement_refuses_in_the_loops_words(
        self, content: list[Any], chunks: list[Any], words: list[str]
    ) -> None:
        response = al.ModelResponse("response-001", "request-001", content, "stop")
        with pytest.raises(ValueError, match=r"normalised block|streamed nothing") as raised:
            al.check_stream_agreement([delta(chunk) for chunk in chunks], response)
        assert all(word in str(raised.value) for word in words)

    @pytest.mark.parametrize(
        ("chunks", "words"),
        [
            pytest.param([al.TextDelta("request-001", "a")] * al.MAX_STEP_CHUNKS, None,
                         id="at-limit"),
            pytest.param([al.TextDelta("request-001", "a")] * (al.MAX_STEP_CHUNKS + 1),
                         f"the model streamed more than {al.MAX_STEP_CHUNKS} chunks",
                         id="over-limit"),
            pytest.param([al.TextDelta("request-002", "a")],
                         "'request-002' is not the active request 'request-001'",
                         id="a-chunk-of-another-request"),
            pytest.param([al.TextBlock("a")],
                         "the model streamed a TextBlock, not a TextDelta, ThinkingDelta or "
                         "ToolCallChunk", id="a-block-for-a-chunk"),
        ],
    )  # fmt: skip
    def test_check_stream_agreement_checks_each_chunk_as_the_loop_does(
        self, chunks: list[Any], words: str | None
    ) -> None:
        """Each chunk keeps the rules of a step's chunks, limits included."""
        response = al.ModelResponse(
            "response-001", "request-001", [text("a" * len(chunks))], "stop"
        )
        if words is None:
            al.check_stream_agreement(chunks, response)
        else:
            with pytest.raises(ValueError, match=words):
                al.check_stream_agreement(chunks, response)

    def test_check_stream_agreement_takes_a_model_response(self) -> None:
        with pytest.raises(TypeError, match="response must be a ModelResponse, got list"):
            al.check_stream_agreement([], [text("a")])  # type: ignore[arg-type]


def usage_step(response_id: str, usage: al.Usage | None, *blocks: Any) -> al.ScriptedResponse:
    """A scripted turn with this usage: a toolCall turn when a block is a call, else stop."""
    content = list(blocks) or [text("The sum is 42.")]
    calls = any(isinstance(block, al.ToolCall) for block in content)
    return al.scripted_response(response_id, content, "toolCall" if calls else "stop", usage=usage)


EARLIER = al.AssistantMessage("message-response-000", (text("Hello."),), al.Usage(500, 50))


UNCHECKED_USAGE = al.scripted_response(
    "response-002", [text("a")], "stop", chunks=[], usage=al.Usage(99, 99)
)
"""A response that breaks a rule (it streamed nothing): never appended, never counted."""


class TestRunUsage:
    """The message the loop appends keeps its response's usage; RunResult.usage is the
    sum over the responses this run appended (None: it appended none; a response without
    usage makes every field of the sum None; a failed or cancelled run sums what it
    appended; a resumed transcript's earlier usage is not this run's)."""

    def test_each_message_keeps_its_responses_usage(self) -> None:
        first = al.Usage(120, 30, 2048, 64, 10)
        _, result, model = run(
            [usage_step("response-001", first, add_call()), usage_step("response-002", None)],
            [add_tool()],
            messages=[user("Hi.", "user-000"), EARLIER, user()],
        )
        usages = [m.usage for m in result.messages if isinstance(m, al.AssistantMessage)]
        assert usages == [EARLIER.usage, first, None]
        assert model.requests[1].messages[-2].usage == first

    @pytest.mark.parametrize(
        ("steps", "start", "cancel_at", "expected"),
        [
            pytest.param([usage_step("r1", al.Usage(120, 30, 2048, 64, 10), add_call()),
                          usage_step("r2", al.Usage(180, 12, 2048, 0, 0))], None, None,
                         al.Usage(300, 42, 4096, 64, 10), id="the-run-sums-them"),
            pytest.param([usage_step("r1", al.Usage(10, 5, None, None, 2), add_call()),
                          usage_step("r2", al.Usage(20, 7, 3, None, None))], None, None,
                         al.Usage(30, 12, None, None, None), id="a-field-one-leaves-unknown"),
            pytest.param([usage_step("r1", None, add_call()),
                          usage_step("r2", al.Usage(1, 2, 3, 4, 5))], None, None,
                         al.Usage(), id="a-response-without-usage-makes-every-field-unknown"),
            pytest.param([usage_step("r1", al.Usage(1, 2))], None, 0, None,
                         id="cancelled-before-any-response"),
            pytest.param([dataclasses.replace(UNCHECKED_USAGE, id="r1")], None, None, None,
                         id="the-first-response-broke-a-rule"),
            pytest.param([], [al.ToolResultMessage("t", "c", "x", "", False)], None, None,
                         id="an-invalid-start"),
            pytest.param([usage_step("r1", al.Usage(10, 1), add_call()), UNCHECKED_USAGE],
                         None, None, al.Usage(10, 1), id="a-failed-run-sums-what-it-appended"),
            pytest.param([usage_step("r1", al.Usage(10, 1), add_call()),
                          usage_step("r2", al.Usage(5, 5))], None, ("tool.started", 1),
                         al.Usage(10, 1), id="a-cancelled-run-sums-what-it-appended"),
            pytest.param([usage_step("r1", al.Usage(7, 3))],
                         [user("Hi.", "user-000"), EARLIER, user()], None, al.Usage(7, 3),
                         id="the-starting-messages-usage-is-not-this-runs"),
        ],
    )  # fmt: skip
    def test_the_run_sums_the_usage_of_the_responses_it_appended(
        self,
        steps: list[al.ScriptedResponse],
        start: list[al.Message] | None,
        cancel_at: CancelAt,
        expected: al.Usage | None,
    ) -> None:
        _, result, _ = run(
            steps, [add_tool()], messages=start, signal=threading.Event(), cancel_at=cancel_at
        )
        assert result.usage == expected
        assert ("usage" in result.to_dict()) == (expected is not None)


# Each row: a model step, and the whole message of the MODEL_PROTOCOL_ERROR it causes.
MISTAKES = [
    pytest.param(stream_step([text("hi")], lambda request: None),
                 "the model's stream returned a NoneType, not a ModelResponse (did its generator "
                 "end without `return ModelResponse(...)`?)",
                 id="a-generator-that-returns-nothing-is-asked-for-its-response"),
    pytest.param(stream_step([text("hi")], lambda request: {}),
                 "the model's stream returned a dict, not a ModelResponse",
                 id="another-wrong-response-type-is-named-without-the-hint"),
    pytest.param(untyped.scripted_response("r1", [text("hi")], "end_turn"),
                 "unknown stop reason 'end_turn' (expected one of ('stop', 'toolCall'))",
                 id="an-unknown-stop-reason-lists-the-known-ones"),
    pytest.param(al.scripted_response("r1", [text("hi")], "stop", request_id="request-1"),
                 "'request-1' is not the active request 'request-001': every chunk's and the "
                 "response's request_id must be the request's id",
                 id="a-foreign-request-id-says-which-id-is-expected"),
    pytest.param(stream_step([], lambda request: al.ModelResponse(
                     "r1", request.id, [untyped.TextBlock(None)], "stop")),
                 "message 'message-r1': a text block: field 'text' must be a str, got None "
                 "(NoneType)", id="a-response-block-names-its-wrong-field"),
]  # fmt: skip


class TestMistakesNameTheirFix:
    """The mistakes a newcomer makes first: each error says what to change (for a
    starting transcript, see TestInvalidStartingTranscript)."""

    @pytest.mark.parametrize(("step", "message"), MISTAKES)
    def test_the_error_says_what_to_change(self, step: Any, message: str) -> None:
        _, result, _ = run([step])
        assert failure_message(result, "MODEL_PROTOCOL_ERROR") == message

    @pytest.mark.parametrize("field", ["content", "chunks"])
    def test_a_script_given_text_as_a_str_is_a_type_error(self, field: str) -> None:
        blocks = {"content": [al.TextBlock("hello")], field: "hello"}
        with pytest.raises(TypeError, match=f"^scripted {field} must be a sequence .* got a str"):
            untyped.ScriptedResponse("r1", blocks["content"], "stop", chunks=blocks.get("chunks"))


class TestRunHelpers:
    def test_settle_run_hands_each_event_to_on_event_as_it_comes(self) -> None:
        """settle_run returns every event and the run's return value; with on_event, it
        hands each event over as the run yields it."""
        seen: list[tuple[int, int]] = []  # (sequence, events the run had yielded by then)
        yielded = 0
        result = al.RunResult("completed", (), 0, final_text="")

        def counted() -> Generator[al.Event, None, al.RunResult]:
            nonlocal yielded
            for sequence in range(3):
                yielded += 1
                yield al.Event(sequence, "message.accepted", {"message": user()})
            return result

        events, returned = al.settle_run(
            counted(), on_event=lambda e: seen.append((e.sequence, yielded))
        )
        assert seen == [(0, 1), (1, 2), (2, 3)]
        assert [event.sequence for event in events] == [0, 1, 2]
        assert returned is result
        assert al.settle_run(counted()) == (events, result)

    def test_settle_run_closes_the_run_when_on_event_raises(self) -> None:
        closed: list[bool] = []

        def endless() -> Generator[al.Event, None, al.RunResult]:
            try:
                while True:
                    yield al.Event(0, "message.accepted", {"message": user()})
            finally:
                closed.append(True)

        def refuse(event: al.Event) -> None:
            raise KeyError("the screen is gone")

        with pytest.raises(KeyError, match="the screen is gone"):
            al.settle_run(endless(), on_event=refuse)
        assert closed == [True]

    @pytest.mark.parametrize(
        ("blocks", "expected"),
        [
            pytest.param((text("The sum"), text(" is 42.")), "The sum is 42.", id="no-separator"),
            pytest.param((text("A"), add_call(), text("B"), echo_call("call-echo-001")), "AB",
                         id="skips-calls"),
            pytest.param((add_call(),), "", id="calls-only"),
            pytest.param((), "", id="empty"),
        ],
    )  # fmt: skip
    def test_text_from_assistant_concatenates_text_blocks(
        self, blocks: tuple[Any, ...], expected: str
    ) -> None:
        assert al.text_from_assistant(al.AssistantMessage("message-x", blocks)) == expected

    def test_final_text_is_the_text_of_the_stop_response(self) -> None:
        """Seed: "the assistant message is appended and textFromAssistant() becomes
        finalText." """
        _, result, _ = run([scripted_step([text("The sum"), text(" is 42.")], "stop")])
        assert result.final_text == "The sum is 42."
        assert result.messages[-1] == assistant("response-001", text("The sum"), text(" is 42."))

    @pytest.mark.parametrize("given", ["None", "Event", "signal-like"])
    def test_the_model_and_every_tool_receive_the_run_signal(self, given: str) -> None:
        signal: Any = {"None": None, "Event": threading.Event(), "signal-like": SIGNAL_LIKE}[given]
        received: list[Any] = []

        def noted(step: Step) -> Step:
            def stream(model: FakeModel, request: al.ModelRequest, model_signal: Any) -> Any:
                received.append(model_signal)
                return step(model, request, model_signal)

            return stream

        model = FakeModel(
            noted(turn("response-001", [call("note", "call-note-001", {})], "toolCall")),
            noted(turn("response-002", [text("ok")], "stop")),
        )
        tool = no_arguments_tool(
            "note", lambda arguments, tool_signal: received.append(tool_signal)
        )
        _, result, _ = run(model, tools=[tool], signal=signal)
        assert result.status == "completed"
        assert len(received) == 3
        assert received[0] is received[1] is received[2]
        if signal is None:
            assert isinstance(received[0], threading.Event)
            assert not received[0].is_set()
        else:
            assert received[0] is signal


@pytest.mark.hostile
class TestConsumerWalksAway:
    """API: "A consumer that calls close() ends the run at once: the model's stream is
    closed, no tool runs, and nothing more is yielded." So does a consumer that drops the
    run or throws into it; what it throws reaches it unchanged."""

    @pytest.mark.parametrize(
        ("how", "at", "executed"),
        [
            pytest.param("close", ("message.accepted", 1), [], id="close-at-message.accepted"),
            pytest.param("close", ("model.chunk", 1), [], id="close-at-a-model.chunk"),
            pytest.param("close", ("tool.started", 1), [], id="close-at-the-first-tool.started"),
            pytest.param("close", ("tool.started", 2), ["a"],
                         id="close-at-the-second-tool.started"),
            pytest.param("close", ("tool.finished", 1), ["a"], id="close-at-tool.finished"),
            pytest.param("drop", ("model.chunk", 2), [], id="drop-the-generator-at-a-model.chunk"),
            pytest.param(ValueError("x"), ("model.chunk", 2), [],
                         id="throw-ValueError-at-a-chunk"),
            pytest.param(KeyboardInterrupt(), ("model.chunk", 2), [],
                         id="throw-KeyboardInterrupt-at-a-chunk"),
            pytest.param(SystemExit(3), ("model.chunk", 2), [], id="throw-SystemExit-at-a-chunk"),
            pytest.param(ValueError("x"), ("tool.started", 1), [],
                         id="throw-ValueError-at-tool.started"),
        ],
    )  # fmt: skip
    def test_the_run_ends_at_once(
        self, how: str | BaseException, at: tuple[str, int], executed: list[str]
    ) -> None:
        ran: list[str] = []
        model = FakeModel(
            turn(
                "response-001",
                [text("Echo twice."), echo_call("call-1", "a"), echo_call("call-2", "b")],
                "toolCall",
            ),
            turn("response-002", [text("done")], "stop"),
        )
        run_ = start_run(model, [echo_tool(ran)], messages=list(HISTORY))
        events = until(run_, *at)
        if how == "close":
            assert run_.close() is None
        elif how == "drop":
            del run_
            gc.collect()
        else:
            assert isinstance(how, BaseException)
            with pytest.raises(type(how)) as raised:
                run_.throw(how)
            assert raised.value is how
        assert ran == executed  # an announced call never runs
        assert "run.finished" not in types_of(events)
        opened = at[0] != "message.accepted"
        assert model.call_count == int(opened)
        assert model.finalized == (["request-001"] if opened else [])
        # Closed while suspended at a chunk; exhausted before any tool ran.
        assert model.exits == (["request-001"] if at[0] == "model.chunk" else [])
        if how != "drop":
            with pytest.raises(StopIteration):
                next(run_)


@pytest.mark.hostile
class TestInterruptsAreNeverSwallowed:
    """KeyboardInterrupt and SystemExit from the model or a tool propagate out of next()
    unchanged; the model's stream is closed and no tool runs after them."""

    @pytest.mark.parametrize("error_type", [KeyboardInterrupt, SystemExit])
    @pytest.mark.parametrize(
        ("where", "kinds"),
        [
            pytest.param("stream()", [], id="from-the-model's-stream()"),
            pytest.param("generator", ["model.chunk"], id="from-the-model's-generator"),
            pytest.param("tool", ["model.chunk"] * 2 + ["tool.started"], id="from-a-tool"),
        ],
    )
    def test_they_propagate_unchanged(
        self, error_type: type, where: str, kinds: list[str]
    ) -> None:
        error = error_type()
        executed: list[str] = []

        def raise_from_stream(model: FakeModel, request: al.ModelRequest, signal: Any) -> object:
            raise error

        steps: dict[str, Step] = {
            "stream()": raise_from_stream,
            "generator": stream_step(
                [echo_call("call-1", "a"), raise_error(error)], raise_error(AssertionError())
            ),
            "tool": turn(
                "response-001", [call("stop", "call-1", {}), echo_call("call-2", "b")], "toolCall"
            ),
        }
        model = FakeModel(steps[where])
        run_ = start_run(model, [no_arguments_tool("stop", raising(error)), echo_tool(executed)])
        events: list[al.Event] = []
        with pytest.raises(error_type) as raised:
            events.extend(run_)
        assert raised.value is error
        assert types_of(events) == ["message.accepted", *kinds]
        assert executed == []  # the next call of the batch never ran
        assert model.finalized == ([] if where == "stream()" else ["request-001"])
        with pytest.raises(StopIteration):
            next(run_)


RANDOM_SEEDS = 40


SCRIPTS_PER_SEED = 10


@pytest.mark.hostile
class TestRandomScriptsAgainstAReference:
    """Seeded random scripts (loop_reference.random_script) mixing text, tool calls, bad
    arguments, raising tools, random chunk splits, protocol violations, budgets and
    cancellation. Each run keeps every invariant and ends as the reference model
    (loop_reference.predict) says: status, failure code, steps, events, transcript and
    tool effects."""

    @pytest.mark.parametrize("seed", range(RANDOM_SEEDS))
    def test_random_scripts(self, seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(SCRIPTS_PER_SEED):
            start, plans, max_steps, cancel_at = random_script(rng)
            prediction = predict(start, plans, max_steps, cancel_at)
            events, result, model, log = run_plans(start, plans, max_steps, cancel_at)
            assert_predicted(prediction, events, result, model, log, plans)

    def test_random_scripts_reach_every_outcome(self) -> None:
        """The generator is not vacuous: across the seeds it produces every status and
        every code it can, and cancels at every kind of event."""
        statuses = set()
        cancelled_at = set()
        for seed in range(RANDOM_SEEDS):
            rng = random.Random(seed)
            for _ in range(SCRIPTS_PER_SEED):
                prediction = predict(*random_script(rng))
                statuses.add((prediction.status, prediction.code))
                if prediction.status == "cancelled":
                    cancelled_at.add(prediction.events[-2][0])
        assert statuses == {
            ("completed", None),
            ("maxSteps", None),
            ("cancelled", None),
            ("failed", "MODEL_PROTOCOL_ERROR"),
            ("failed", "MODEL_STREAM_ERROR"),
        }
        assert cancelled_at == set(SEED_EVENT_TYPES) - {"run.finished"}
