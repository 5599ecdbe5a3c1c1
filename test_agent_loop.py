"""Tests for agent_loop, the core: every rule, limit, failure code, event order and
cancellation case of the seed ("Checkpoint 07: Run the iterative Agent Loop"), then the
public contract that the module's docstrings and the README state.

The suite imports ``agent_loop`` once, as ``al``: point it at another copy of the module
by putting that copy first on sys.path. Its builders, its one fake model (FakeModel, for
what al.ScriptedModel cannot do), its one driver (run(), which checks the run's
invariants with check_run() every time) and the reference model that random scripts are
checked against come from loop_testing.py; a helper that one class alone uses sits just
above that class. replay() has its own file (test_agent_loop_replay.py), the README and
the demonstration theirs (test_docs_and_demo.py). This file uses ``from __future__
import annotations`` on purpose: Tool.from_function must read the string annotations
that PEP 563 gives a user's module.

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
    The transcript: TestInvalidStartingTranscript (a wrong field is named),
        TestMalformedThinkingAndUsage, TestDuplicateIdsSayHowTheyWereDerived,
        TestOnlyTheExactClasses
    Model boundary: TestSignalIsPublic,
        TestMalformedModelOutput [hostile], TestModelStrSubclasses [hostile],
        TestModelStreamCleanup [hostile]
    Tools: TestToolSchemas, TestToolSpecIsChecked, TestToolFromFunction,
        TestToolRegistry, TestExecuteToolCall, TestExecuteMustTakeArgumentsAndSignal,
        TestToolError, TestRecoverableExceptionsAreLogged, TestMisbehavingTools [hostile]
    Bounded plain JSON: TestPlainJsonArguments, TestInvalidToolCallArguments
    Message IR: TestToolCallIsFrozen, TestPlainArguments, TestCopyingAndHashing,
        TestThinkingBlocksAndUsage, TestMalformedThinkingAndUsageDicts
    Events and results, Test helpers: no class of their own; TestEventSequence,
        TestJsonShapes and TestCopyingAndHashing exercise events and results, and every
        test that scripts a model runs al.ScriptedModel
    Interop and resumption: TestJsonShapes, TestRoundTrips, TestMalformedDicts,
        TestScriptedModelFromTranscript, TestNextRequestSequence,
        TestResumeAfterCancellation, TestThinkingAndUsageResume
"""

from __future__ import annotations

import asyncio
import collections.abc
import copy
import dataclasses
import gc
import inspect
import itertools
import json
import logging
import pickle
import random
import re
import sys
import threading
import tracemalloc
import typing
from types import MappingProxyType, SimpleNamespace
from typing import (
    Any,
    Callable,
    ClassVar,
    Dict,
    Generator,
    Iterator,
    List,
    Literal,
    Mapping,
    Optional,
    Sequence,
    cast,
)

import pytest

import agent_loop as al
from loop_testing import (
    ADD_ROUND,
    AT_LIMIT,
    EVENT_TYPES,
    HISTORY,
    HOSTILE,
    NOT_PLAIN_JSON,
    NUMBERS,
    OVER_LIMIT,
    PRIOR_ROUND,
    REPOSITORY,
    USAGE_FIELDS,
    CancelAt,
    Custom,
    FakeModel,
    Fatal,
    Step,
    add_call,
    add_result,
    add_tool,
    assert_failed,
    assert_no_tool_ran,
    assert_predicted,
    assert_tool_received,
    assistant,
    call,
    cancelled_signal,
    check_run,
    chunk_event_count,
    copy_echo,
    cyclic_array,
    echo_call,
    echo_result,
    echo_tool,
    failure_message,
    nested,
    no_arguments_tool,
    one_call,
    only_tool_result,
    opaque,
    open_call_ids,
    plain_copy,
    predict,
    probe_tool,
    raise_error,
    raising,
    random_script,
    record_run,
    recording_tools,
    respond,
    returns,
    run,
    run_plans,
    run_probe_call,
    same_json,
    scripted_step,
    settle,
    shared_array,
    start_run,
    stop,
    stream_step,
    text,
    thinking_script,
    thought,
    tool_turn,
    turn,
    two_parameters,
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


def capped_thinking(thinking: int, text_length: int, broken: str) -> tuple[list[Any], list[Any]]:
    """``thinking`` code points of thinking and ``text_length`` of text, in 1024-code-point
    chunks then one-code-point chunks; the kind that breaks its limit (``broken``) last."""
    thinking_chunks = [thought("🤔" * 1024)] * 64 + [thought("🤔")] * (thinking - 65536)
    text_chunks = [text("x" * 1024)] * (text_length // 1024) + [text("x")] * (text_length % 1024)
    blocks: list[Any] = [thought("🤔" * thinking, "sig"), text("x" * text_length)]
    if broken == "thinking":
        return blocks[::-1], text_chunks + thinking_chunks
    return blocks, thinking_chunks + text_chunks


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
    # Thinking is bounded by the same number, apart from text.
    pytest.param(lambda: capped_thinking(65536, 65536, ""), None, 128,
                 id="thinking-and-text-at-limit"),
    pytest.param(lambda: capped_thinking(65537, 0, "thinking"),
                 "more than 65536 code points of thinking", 64, id="thinking-over-limit"),
    pytest.param(lambda: capped_thinking(65537, 65536, "thinking"),
                 "more than 65536 code points of thinking", 128,
                 id="thinking-over-limit-text-at-limit"),
    pytest.param(lambda: capped_thinking(65536, 65537, "text"),
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
        events, result, model = run([stop("response-001")], messages=start)
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
    def test_tool_arguments_must_be_plain_bounded_json(
        self, make: Callable[[], Any], passes: bool, limit: str
    ) -> None:
        """Seed: "Tool arguments must be plain bounded JSON with depth 32, at most 257 values
        including the root, 256 object fields plus array slots, and 4096 Unicode code
        points across keys/string values. These checks occur before a Tool effect." """
        arguments = make()
        events, result, model, received = run_probe_call(arguments)
        if passes:
            assert_tool_received(events, result, received, arguments)
        else:
            assert_failed(events, result, "MODEL_PROTOCOL_ERROR", limit)
            assert_no_tool_ran(events, result, model, received)


# --- The loop ----------------------------------------------------------------------------


class TestGoldenFragments:
    def test_appends_one_tool_call_and_its_matching_result_before_the_second_model_request(
        self,
    ) -> None:
        """Seed: "The second request contains the assistant Tool call before its result,
        and both share call-add-001." (the seed's first fragment, translated exactly)"""
        add_call_001 = call("add", "call-add-001", {"left": 20, "right": 22})
        model = al.ScriptedModel(
            [tool_turn("response-tool-001", add_call_001), stop("response-tool-002")]
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
    def test_a_one_step_budget_completes_the_tool_batch_and_opens_no_continuation(
        self, max_steps: int, status: str, final_text: str | None
    ) -> None:
        """Seed: "All three calls execute in order, model.callCount remains 1, and the
        result is maxSteps." and "Change only maxSteps to 2; the queued continuation may
        run and complete." (the seed's second fragment, translated exactly)"""
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
        assert events[-1].payload["result"] is result


SIGNAL_LIKE = SimpleNamespace(is_set=lambda: False, wait=lambda timeout=None: False)
"""Not a threading.Event, but with the same reading side: is_set() and wait()."""


class HasWaitCoroutine:
    """Looks like a signal, but its wait() is a coroutine, as asyncio.Event's is."""

    def is_set(self) -> bool:
        return False

    async def wait(self) -> bool:
        return True


# Each row: the options that differ from a valid call, the error, and words of its message.
INVALID_OPTIONS = [
    pytest.param({"max_steps": 0}, ValueError, "max_steps", id="max_steps-under-limit-0"),
    pytest.param({"max_steps": 65}, ValueError, "max_steps", id="max_steps-over-limit-65"),
    pytest.param({"max_steps": -1}, ValueError, "max_steps", id="max_steps-negative"),
    pytest.param({"max_steps": True}, TypeError, "max_steps", id="max_steps-bool"),
    pytest.param({"max_steps": 2.0}, TypeError, "max_steps", id="max_steps-float"),
    pytest.param({"max_steps": "2"}, TypeError, "max_steps", id="max_steps-str"),
    pytest.param({"max_steps": None}, TypeError, "max_steps", id="max_steps-None"),
    pytest.param({"request_sequence_start": -1}, ValueError, "request_sequence_start",
                 id="request_sequence_start-under-limit-negative"),
    pytest.param({"request_sequence_start": 61, "max_steps": 4}, ValueError,
                 "request_sequence_start", id="request_sequence_start-over-limit-61+4"),
    pytest.param({"request_sequence_start": 64, "max_steps": 1}, ValueError,
                 "request_sequence_start", id="request_sequence_start-over-limit-64+1"),
    pytest.param({"request_sequence_start": True}, TypeError, "request_sequence_start",
                 id="request_sequence_start-bool"),
    pytest.param({"request_sequence_start": 1.0}, TypeError, "request_sequence_start",
                 id="request_sequence_start-float"),
    pytest.param({"model": object()}, TypeError, "model", id="model-without-stream"),
    pytest.param({"model": SimpleNamespace(stream="not a function")}, TypeError, "model",
                 id="stream-not-callable"),
    pytest.param({"tools": [add_tool()]}, TypeError, "tools", id="tools-a-list"),
    pytest.param({"tools": None}, TypeError, "tools", id="tools-None"),
    pytest.param({"signal": object()}, TypeError, "signal", id="signal-object"),
    # Not "must be a threading.Event" while anything with is_set() and wait() is accepted.
    pytest.param({"signal": True}, TypeError, "signal must be a threading.Event, or an object "
                 "with is_set() and wait(timeout), got bool", id="signal-bool"),
    pytest.param({"signal": SimpleNamespace(is_set=lambda: False)}, TypeError, "signal",
                 id="signal-without-wait"),
    pytest.param({"signal": HasWaitCoroutine()}, TypeError,
                 "HasWaitCoroutine.wait() is a coroutine", id="signal-wait-a-coroutine"),
    pytest.param({"messages": 42}, TypeError, "messages", id="messages-int"),
    pytest.param({"messages": None}, TypeError, "messages", id="messages-None"),
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
        call itself raises (nothing is iterated), naming the option; the model never runs."""
        model = al.ScriptedModel([stop("response-001")])
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
        model = al.ScriptedModel([stop("response-001")])
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


ADDING = (tool_turn("response-001", text("Adding."), add_call()), stop("response-002"))


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
        model = al.ScriptedModel([stop("response-001")])
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
                stop("response-003"),
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
    stop("response-003"),
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
        events, _, model = run(
            THREE_STEPS,
            tools=[add_tool(), echo_tool()],
            max_steps=max_steps,
            request_sequence_start=start,
        )

        assert [request.id for request in model.requests] == ids
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
        message, then emits tool.finished." """
        executed: list[str] = []
        events, result, model = run(
            [
                tool_turn("response-001", *BATCH),
                tool_turn("response-002", echo_call("call-echo-003")),
                stop("response-003"),
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
        terminal events; run.finished is last." and "It first emits one message.accepted
        event for every starting message." """
        script = [tool_turn("response-001", add_call()), stop("response-002")][:steps]
        signal = threading.Event() if "cancel_at" in options else None
        events, result, _ = run(
            script, [add_tool()], messages=PRIOR_ROUND, signal=signal, **options
        )

        assert result.status == status
        assert set(types_of(events)) == set(EVENT_TYPES)
        accepted = [dict(event.payload) for event in events[: len(PRIOR_ROUND)]]
        assert accepted == [{"message": message} for message in PRIOR_ROUND]
        assert [event.sequence for event in events] == list(range(len(events)))
        assert types_of(events).count("run.finished") == 1
        assert dict(events[-1].payload) == {"result": result}


CANCEL_START = (user("Add 20 and 22.", "user-001"), user("Then echo it.", "user-002"))


def cancel_script() -> list[Any]:
    """Step 1: text, add, echo (three chunks, two tools); step 2: the answer."""
    return [
        tool_turn("response-001", text("Adding."), add_call(), echo_call("call-echo-001")),
        stop("response-002"),
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
            [tool_turn("response-001", *calls), stop("response-002")],
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
    @pytest.mark.parametrize("max_steps", [1, 2, 64])
    @pytest.mark.parametrize("stops", [False, True], ids=["tool-steps-only", "then-a-stop"])
    def test_tool_steps_up_to_the_budget_end_max_steps_without_a_continuation(
        self, max_steps: int, stops: bool
    ) -> None:
        """Seed: "If the current step equals maxSteps, the loop emits run.finished with
        status maxSteps and does not open another model request." A stop response on the
        last allowed step completes."""
        tool_steps = max_steps - 1 if stops else max_steps
        executed: list[str] = []
        script = [
            tool_turn(f"response-{step:03d}", echo_call(f"call-echo-{step:03d}"))
            for step in range(1, tool_steps + 1)
        ]
        _, result, model = run(
            [*script, stop(f"response-{tool_steps + 1:03d}")],
            tools=[echo_tool(executed)],
            max_steps=max_steps,
        )

        assert result.status == ("completed" if stops else "maxSteps")
        assert result.max_steps == (None if stops else max_steps)
        assert result.steps == model.call_count == max_steps
        assert model.requests[-1].id == f"request-{max_steps:03d}"
        assert executed == [f"call-echo-{step:03d}" for step in range(1, tool_steps + 1)]
        assert result.final_text == ("The sum is 42." if stops else None)

    def test_the_budget_counts_model_turns_not_tool_calls(self) -> None:
        """Seed: "the budget counts model turns, not individual Tool calls." """
        calls = [echo_call(f"call-echo-{n:03d}") for n in range(1, 6)]
        executed: list[str] = []
        _, result, _ = run(
            [tool_turn("response-001", *calls), stop("response-002")],
            tools=[echo_tool(executed)],
            max_steps=2,
        )
        assert len(executed) == 5
        assert (result.status, result.steps) == ("completed", 2)


class TestFailureCodes:
    @pytest.mark.parametrize("earlier", [0, 1], ids=["in-the-first-step", "in-a-later-step"])
    def test_model_protocol_error(self, earlier: int) -> None:
        """Seed: "Tool calls are forbidden in a stop response." The step is not kept; the
        rounds before it are."""
        executed: list[str] = []
        violation = al.scripted_response("response-002", [text("Done."), add_call("c2")], "stop")
        events, result, _ = run(
            [tool_turn("response-001", add_call()), violation] if earlier else [violation],
            tools=recording_tools(executed),
        )
        assert_failed(events, result, "MODEL_PROTOCOL_ERROR")
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
            [tool_turn("response-001", *calls), stop("response-002")],
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
                 ["disagree at normalised block 1: streamed nothing, terminal ToolCall("],
                 id="a-missing-block-is-shown-as-nothing"),
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
    return run([response, stop("response-002")], recording_tools(executed))


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


# Each row: the model, the starting messages (None: one user message), the failure code
# and its whole message.
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
    """Seeded random scripts (loop_testing.random_script) mixing text, tool calls, bad
    arguments, raising tools, random chunk splits, protocol violations, budgets and
    cancellation. Each run keeps every invariant and ends as the reference model
    (loop_testing.predict) says: status, failure code, steps, events, transcript and
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
        assert cancelled_at == set(EVENT_TYPES) - {"run.finished"}


# --- The transcript ----------------------------------------------------------------------


class SubclassedUserMessage(al.UserMessage):
    """A caller's UserMessage subclass whose fields can change after acceptance."""

    __setattr__ = object.__setattr__


RESULT: Any = al.ToolResultMessage("t", "c", "n", "x", False)
"""Untyped: the table below gives its fields values of the wrong type."""


# Each row: a starting transcript, and the words of its failure: for a field of the wrong
# type, the field, the type expected and the value given.
INVALID_STARTS = [
    pytest.param([user(), "Add 20 and 22."], ["a str is not a message"], id="non-message-item"),
    pytest.param([user(), user().to_dict()],
                 ["a dict is not a message (read a dict with message_from_dict())"],
                 id="message-dict-is-pointed-at-message-from-dict"),
    pytest.param([SubclassedUserMessage("user-001", "Hi.")],
                 ["a SubclassedUserMessage is not a message"], id="message-subclass"),
    pytest.param([user(), add_result()],
                 ["tool result 'tool-result-call-add-001' answers no open tool call"],
                 id="result-without-call"),
    pytest.param([user(), add_result(), assistant("response-000", add_call())],
                 ["tool result 'tool-result-call-add-001' answers no open tool call"],
                 id="result-before-call"),
    pytest.param([user(), assistant("response-000", add_call()), al.ToolResultMessage(
                     "tool-result-call-add-001", "call-add-001", "echo", "42", False)],
                 ["tool result 'tool-result-call-add-001' names tool 'echo', but its call "
                  "names 'add'"], id="mismatched-tool-name"),
    pytest.param([user(), *ADD_ROUND, al.ToolResultMessage(
                     "tool-result-again", "call-add-001", "add", "42", False)],
                 ["tool result 'tool-result-again' answers no open tool call"],
                 id="two-results-for-one-call"),
    pytest.param([user("One.", "user-001"), user("Two.", "user-001")],
                 ["message id 'user-001' is used twice"], id="duplicate-message-ids"),
    pytest.param([user(), *ADD_ROUND, assistant("response-001", add_call())],
                 ["tool call id 'call-add-001' is used twice (tool-call ids must be unique "
                  "across the whole transcript)"], id="duplicate-tool-call-ids"),
    pytest.param([user(), assistant("response-000", add_call(), add_call()), add_result()],
                 ["tool call id 'call-add-001' is used twice"],
                 id="duplicate-tool-call-ids-in-one-message"),
    pytest.param([user(), assistant("response-000", add_call())],
                 ["tool calls without a result: ['call-add-001']"], id="incomplete-open-call"),
    pytest.param([user(), assistant("response-000", add_call(), echo_call("call-echo-001")),
                  add_result()], ["tool calls without a result: ['call-echo-001']"],
                 id="incomplete-one-of-two-calls"),
    pytest.param([untyped.UserMessage(5, "hi")],
                 ["a user message: field 'id' must be a non-empty str, got 5 (int)"], id="u-id"),
    pytest.param([al.UserMessage("", "hi")],
                 ["a user message: field 'id' must be a non-empty str, got '' (str)"],
                 id="u-empty-id"),
    pytest.param([untyped.UserMessage("u", 5)],
                 ["message 'u': field 'content' must be a str, got 5 (int)"], id="u-content"),
    pytest.param([untyped.AssistantMessage(None, ())],
                 ["assistant message: field 'id' must be a non-empty str, got None (NoneType)"],
                 id="a-id"),
    pytest.param([untyped.AssistantMessage("a1", ["hi"])],
                 ["message 'a1': a str is not a TextBlock, ThinkingBlock or ToolCall: wrap text "
                  "in TextBlock(...)"], id="text-given-as-a-str-block-is-told-to-wrap-it"),
    pytest.param([untyped.AssistantMessage("a", [untyped.TextBlock(5)])],
                 ["message 'a': a text block: field 'text' must be a str, got 5 (int)"],
                 id="a-text-block-names-its-text-field"),
    pytest.param([user(), assistant("response-000", al.ToolCall(
                     "call-add-001", "add", cast(Any, {"left": object()}))), add_result()],
                 ["message 'message-response-000': tool call 'call-add-001': arguments hold",
                  "which is not plain JSON"], id="tool-call-arguments-not-json"),
    pytest.param([dataclasses.replace(RESULT, id=b"t")],
                 ["a toolResult message: field 'id' must be a non-empty str, got b't' (bytes)"],
                 id="t-id"),
    pytest.param([dataclasses.replace(RESULT, tool_call_id=1)],
                 ["message 't': field 'tool_call_id' must be a non-empty str, got 1 (int)"],
                 id="t-tool_call_id"),
    pytest.param([dataclasses.replace(RESULT, tool_name="")],
                 ["message 't': field 'tool_name' must be a non-empty str, got '' (str)"],
                 id="t-tool_name"),
    pytest.param([dataclasses.replace(RESULT, content=["x"])],
                 ["message 't': field 'content' must be a str, got ['x'] (list)"],
                 id="t-content"),
    pytest.param([dataclasses.replace(RESULT, is_error=0)],
                 ["message 't': field 'is_error' must be a bool, got 0 (int)"], id="t-is_error"),
]  # fmt: skip


class TestInvalidStartingTranscript:
    @pytest.mark.parametrize(("messages", "words"), INVALID_STARTS)
    def test_an_invalid_start_fails_with_one_event_and_never_calls_the_model(
        self, messages: list[Any], words: list[str]
    ) -> None:
        """Seed: "An invalid starting transcript produces one run.finished event with a
        failed INVALID_TRANSCRIPT result and never invokes the model." Its message says
        what is wrong: a field of the wrong type is named, with the type it must be."""
        events, result, model = run([stop("response-001")], messages=messages, tools=[add_tool()])
        assert_failed(events, result, "INVALID_TRANSCRIPT", *words)
        assert types_of(events) == ["run.finished"]
        assert (model.call_count, result.messages, result.steps) == (0, (), 0)

    def test_an_invalid_start_is_reported_even_when_the_signal_is_already_set(self) -> None:
        """Documented choice: the inputs decide before the signal is looked at."""
        events, result, model = run(
            [stop("response-001")], messages=[user(), user()], signal=cancelled_signal()
        )
        assert_failed(events, result, "INVALID_TRANSCRIPT")
        assert model.call_count == 0

    def test_an_endless_generator_of_messages_fails_instead_of_hanging(self) -> None:
        """Documented choice: at most MAX_INITIAL_MESSAGES + 1 items are read."""
        read = []

        def endless() -> Iterator[al.Message]:
            for n in itertools.count():
                assert n < 100_000, "the loop kept reading an endless iterable"
                read.append(n)
                yield al.UserMessage(f"user-{n}", "Hi.")

        events, result, model = run([stop("response-001")], messages=endless())
        assert_failed(events, result, "INVALID_TRANSCRIPT")
        assert len(read) == al.MAX_INITIAL_MESSAGES + 1
        assert model.call_count == 0

    def test_an_empty_start_is_a_complete_transcript(self) -> None:
        """Documented choice: an empty starting transcript is complete, hence valid."""
        events, result, model = run([stop("response-001")], messages=[])
        assert result.status == "completed"
        assert model.requests[0].messages == ()
        assert types_of(events) == ["model.chunk", "run.finished"]


class UsageSubclass(al.Usage):
    """A Usage subclass: the loop takes exactly the IR's classes."""


class ThinkingBlockSubclass(al.ThinkingBlock):
    """A ThinkingBlock subclass, refused as any subclass of a block is."""


class ThinkingDeltaSubclass(al.ThinkingDelta):
    """A ThinkingDelta subclass, refused as any subclass of a chunk is."""


MALFORMED_THINKING = [
    pytest.param(untyped.ThinkingBlock(5), "a thinking block: field 'thinking' must be a str, "
                 "got 5 (int)", id="thinking-int"),
    pytest.param(untyped.ThinkingBlock("hm", b"sig"), "a thinking block: field 'signature' "
                 "must be None or a str, got b'sig' (bytes)", id="signature-bytes"),
    pytest.param(untyped.ThinkingBlock("hm", "sig", 1), "a thinking block: field 'redacted' "
                 "must be a bool, got 1 (int)", id="redacted-int"),
    pytest.param(al.ThinkingBlock("secret", "data", redacted=True),
                 "a redacted thinking block holds its data as a non-empty 'signature' and its "
                 "'thinking' is \"\": got thinking 'secret', signature 'data'",
                 id="redacted-with-thinking"),
    pytest.param(al.ThinkingBlock("", None, redacted=True), "got thinking '', signature None",
                 id="redacted-without-signature"),
    pytest.param(al.ThinkingBlock("", "", redacted=True), "got thinking '', signature ''",
                 id="redacted-with-empty-signature"),
    pytest.param(ThinkingBlockSubclass("hm"), "a ThinkingBlockSubclass is not a TextBlock, "
                 "ThinkingBlock or ToolCall", id="subclass"),
]  # fmt: skip


MALFORMED_USAGE = [
    pytest.param({"input": 1}, "field 'usage' must be None or a Usage, got {'input': 1} (dict)",
                 id="dict"),
    pytest.param(0, "field 'usage' must be None or a Usage, got 0 (int)", id="zero"),
    pytest.param(UsageSubclass(1), "field 'usage' must be None or a Usage, got "
                 "UsageSubclass(input_tokens=1", id="subclass"),
]  # fmt: skip


WHERE = pytest.mark.parametrize("where", ["from-a-model", "in-the-start"])


def run_with_assistant(where: str, block: Any, usage: Any = None) -> al.RunResult:
    """A run whose assistant message holds ``block`` and ``usage``: a starting message, or
    a model's response (then with a call, and ``block`` streamed unless it is thinking).
    Checks that the failure names the message, and that nothing ran or was appended."""
    executed: list[str] = []
    if where == "in-the-start":
        start = [user(), untyped.AssistantMessage("message-old", (block,), usage)]
        events, result, model = run([], messages=start)
        assert_failed(events, result, "INVALID_TRANSCRIPT", "message 'message-old'")
        assert model.call_count == 0
        return result
    response = untyped.scripted_response(
        "response-001",
        [block, add_call()],
        "toolCall",
        chunks=[add_call()] if isinstance(block, al.ThinkingBlock) else [block, add_call()],
        usage=usage,
    )
    events, result, _ = run([response], recording_tools(executed))
    assert_failed(events, result, "MODEL_PROTOCOL_ERROR", "message 'message-response-001'")
    assert (executed, result.messages, result.usage) == ([], (user(),), None)
    return result


class TestMalformedThinkingAndUsage:
    """A malformed ThinkingBlock or usage fails the run where it enters, with the field
    named: MODEL_PROTOCOL_ERROR from a model (before any tool runs), INVALID_TRANSCRIPT in
    the starting messages; a malformed ThinkingDelta is a MODEL_PROTOCOL_ERROR."""

    @WHERE
    @pytest.mark.parametrize(("block", "words"), MALFORMED_THINKING)
    def test_a_malformed_thinking_block(self, where: str, block: Any, words: str) -> None:
        assert words in run_with_assistant(where, block).error.message  # type: ignore[union-attr]

    @WHERE
    @pytest.mark.parametrize(("usage", "words"), MALFORMED_USAGE)
    def test_malformed_usage(self, where: str, usage: Any, words: str) -> None:
        result = run_with_assistant(where, text("Hi."), usage)
        assert words in result.error.message  # type: ignore[union-attr]

    @pytest.mark.parametrize(
        ("chunk", "words"),
        [
            pytest.param(lambda request: untyped.ThinkingDelta(request.id, None),
                         "a thinking chunk's thinking must be a str, got NoneType",
                         id="thinking-none"),
            pytest.param(lambda request: al.ThinkingDelta("request-999", "hm"),
                         "'request-999' is not the active request 'request-001'",
                         id="foreign-request-id"),
            pytest.param(lambda request: ThinkingDeltaSubclass(request.id, "hm"),
                         "the model streamed a ThinkingDeltaSubclass, not a TextDelta, "
                         "ThinkingDelta or ToolCallChunk", id="subclass"),
        ],
    )  # fmt: skip
    def test_a_malformed_thinking_chunk(self, chunk: Any, words: str) -> None:
        step = stream_step([chunk], respond("response-001", [text("Hi.")], "stop"))
        events, result, _ = run([step])
        assert_failed(events, result, "MODEL_PROTOCOL_ERROR", words)
        assert chunk_event_count(events) == 0


class TestDuplicateIdsSayHowTheyWereDerived:
    """A duplicate id error must "say how it was derived ("message-" + response id) and
    that response ids and tool-call ids must be unique across the whole transcript"; the
    step's calls never run and its message is not appended."""

    @pytest.mark.parametrize(
        ("start", "script", "ran", "kept", "message"),
        [
            pytest.param(HISTORY, [tool_turn("response-001", echo_call("call-old", "again"))],
                         [], len(HISTORY), None, id="call-id-of-the-starting-transcript"),
            pytest.param([al.UserMessage("message-r", "hi")], [stop("r", "x")], [], 1, None,
                         id="message-id-of-the-starting-transcript"),
            pytest.param([al.UserMessage("tool-result-c", "hi")],
                         [tool_turn("r", echo_call("c", "x"))], [], 1, None,
                         id="result-id-of-the-starting-transcript"),
            pytest.param([user()], [tool_turn("response-001", echo_call("call-1", "first")),
                                    tool_turn("response-002", echo_call("call-1", "second"))],
                         ["first"], 3,
                         "tool call id 'call-1' is used twice (tool-call ids must be unique "
                         "across the whole transcript)", id="call-id-of-an-earlier-step"),
            pytest.param([user()], [tool_turn("resp", echo_call("c1", "first")), stop("resp")],
                         ["first"], 3,
                         "message id 'message-resp' is used twice (an assistant message's id is "
                         '"message-" + its response id, a tool result\'s is "tool-result-" + its '
                         "call id: response ids and tool-call ids must be unique across the "
                         "whole transcript)", id="response-id-of-an-earlier-step"),
        ],
    )  # fmt: skip
    def test_an_id_already_in_the_transcript_fails_before_any_effect(
        self,
        start: Sequence[al.Message],
        script: list[Any],
        ran: list[str],
        kept: int,
        message: str | None,
    ) -> None:
        executed: list[str] = []
        _, result, model = run(script, [echo_tool(executed)], messages=start)
        said = failure_message(result, "MODEL_PROTOCOL_ERROR")
        assert message is None or said == message
        assert executed == ran
        assert len(result.messages) == kept
        assert model.call_count == len(script)

    def test_the_readme_states_the_id_rules(self) -> None:
        readme = " ".join((REPOSITORY / "README.md").read_text(encoding="utf-8").split())
        assert '"message-" + response id' in readme
        assert '"tool-result-" + call id' in readme
        assert "unique across the whole transcript" in readme


class SubclassedToolCall(al.ToolCall):
    """A model's own ToolCall subclass that agrees with anything."""

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = al.ToolCall.__hash__


class RaisingItems(dict):  # type: ignore[type-arg]
    def items(self) -> Any:
        raise KeyError("items")


class TestOnlyTheExactClasses:
    """Blocks, chunks, messages and responses must be exactly the IR classes, as ids
    and text must be exactly str: a subclass could redefine == or unfreeze itself."""

    def test_a_streamed_tool_call_subclass_is_a_protocol_error(self) -> None:
        executed: list[str] = []
        liar = SubclassedToolCall("call-1", "echo", {"text": "streamed"})
        terminal = call("echo", "call-1", {"text": "DIFFERENT"})
        events, result, _ = run(
            [al.scripted_response("response-001", [terminal], "toolCall", chunks=[liar])],
            tools=[echo_tool(executed)],
        )
        assert_failed(events, result, "MODEL_PROTOCOL_ERROR")
        assert executed == []

    def test_a_return_value_whose_encoding_raises_is_recoverable(self) -> None:
        tool = no_arguments_tool("odd", returns(RaisingItems(a=1)))
        result = al.execute_tool_call(
            al.ToolRegistry([tool]), call("odd", "call-1", {}), threading.Event()
        )
        assert result.is_error is True
        assert "not JSON" in result.content

    def test_a_tool_name_and_resolved_content_must_be_exactly_str(self) -> None:
        class Name(str):
            pass

        with pytest.raises(TypeError, match="name"):
            al.Tool(Name("echo"), "Echoes.", {"type": "object"}, copy_echo)
        with pytest.raises(TypeError, match="content"):
            al.resolve_open_tool_calls([user()], Name("cancelled"))


# --- Model boundary ----------------------------------------------------------------------


def one_tool_step(request: al.ModelRequest) -> Generator[al.ModelChunk, None, al.ModelResponse]:
    """Calls the tool "annotated" in the first step, then answers "done"."""
    if len(request.messages) == 1:
        call = al.ToolCall("c1", "annotated", {})
        yield al.ToolCallChunk(request.id, call)
        return al.ModelResponse("r1", request.id, [call], "toolCall")
    yield al.TextDelta(request.id, "done")
    return al.ModelResponse("r2", request.id, [al.TextBlock("done")], "stop")


class SignalAnnotatedModel:
    """A model whose signal is annotated with the public protocol, al.Signal."""

    def stream(
        self, request: al.ModelRequest, signal: al.Signal
    ) -> Generator[al.ModelChunk, None, al.ModelResponse]:
        assert not signal.is_set()
        return one_tool_step(request)


class EventAnnotatedModel:
    """A model whose signal is annotated with threading.Event."""

    def stream(
        self, request: al.ModelRequest, signal: threading.Event
    ) -> Generator[al.ModelChunk, None, al.ModelResponse]:
        assert not signal.is_set()
        return one_tool_step(request)


def signal_annotated_tool(arguments: Dict[str, Any], signal: al.Signal) -> object:
    return {"waited": signal.wait(0)}


def event_annotated_tool(arguments: Dict[str, Any], signal: threading.Event) -> object:
    return {"waited": signal.wait(0)}


SIGNAL_MODEL: al.Model = SignalAnnotatedModel()  # mypy --strict checks these assignments
EVENT_MODEL: al.Model = EventAnnotatedModel()


class TestSignalIsPublic:
    """The signal protocol is public (Signal), so a model or tool annotated with
    threading.Event or Signal passes mypy --strict (this module is checked by it)."""

    @pytest.mark.parametrize(
        ("model", "execute"),
        [
            pytest.param(SIGNAL_MODEL, signal_annotated_tool, id="Signal"),
            pytest.param(EVENT_MODEL, event_annotated_tool, id="threading.Event"),
        ],
    )
    def test_signal_annotations_run(self, model: al.Model, execute: Any) -> None:
        tool = al.Tool("annotated", "d", {"type": "object"}, execute)
        _, result, _ = run(model, tools=[tool], signal=threading.Event())
        assert only_tool_result(result).content == '{"waited":false}'


class RaisingEq(str):
    """A str that cannot be compared: what a hostile model may put where a str belongs."""

    def __eq__(self, other: object) -> bool:
        raise ValueError("cannot compare")

    def __ne__(self, other: object) -> bool:
        raise ValueError("cannot compare")

    __hash__ = str.__hash__


class RaisingLen(str):
    def __len__(self) -> int:
        raise ValueError("cannot measure")


class RaisingHash(str):
    def __hash__(self) -> int:
        raise ValueError("cannot hash")


@pytest.mark.hostile
class TestMalformedModelOutput:
    """Whatever a model streams or returns, a run fails with one run.finished and the
    right code: it never raises, never hangs, never keeps a half-written message."""

    @staticmethod
    def _failed(
        step: Step | al.ScriptedResponse, code: str, chunk_events: int
    ) -> tuple[list[al.Event], al.RunResult, FakeModel, list[str]]:
        executed: list[str] = []
        model = FakeModel(step, turn("response-unused", [text("unused")], "stop"))
        events, result, _ = run(model, recording_tools(executed))
        assert_failed(events, result, code)
        assert types_of(events).count("model.chunk") == chunk_events
        assert "tool.started" not in types_of(events)
        assert result.messages == (user(),)  # nothing was appended
        assert result.steps == model.call_count == 1
        assert executed == []
        return events, result, model, executed

    def test_a_stop_reason_whose_eq_raises_is_a_protocol_error(self) -> None:
        """The stop reason is compared only once it is exactly a str: `in` would run the
        value's own __eq__, and its exception would escape the run."""

        class RaisingEquality:
            def __eq__(self, other: object) -> bool:
                raise RuntimeError("eq raised")

            __hash__ = object.__hash__

        step = stream_step(
            [lambda request: al.TextDelta(request.id, "Hi.")],
            lambda request: untyped.ModelResponse(
                "response-001", request.id, (text("Hi."),), RaisingEquality()
            ),
        )
        _, result, _, _ = self._failed(step, "MODEL_PROTOCOL_ERROR", 1)
        assert "unknown stop reason" in failure_message(result, "MODEL_PROTOCOL_ERROR")

    def test_a_rejected_value_is_quoted_shortened(self) -> None:
        """A megabyte of redacted data is named in the error, not copied into it."""
        data = "x" * 1_000_000
        block = untyped.ThinkingBlock("thought", signature=data, redacted=True)
        step = turn("response-001", [block, text("Hi.")], "stop")
        _, result, _, _ = self._failed(step, "MODEL_PROTOCOL_ERROR", 2)
        message = failure_message(result, "MODEL_PROTOCOL_ERROR")
        assert "a redacted thinking block holds its data" in message
        assert len(message) < 1_000

    def test_ten_megabyte_argument_is_rejected_without_a_copy(self) -> None:
        """The text bound is measured, not copied: the run allocates far less than the
        string it rejects (a copy, an encoding or a repr of it would cost 10 MB)."""
        big = "x" * 10_000_000
        tracemalloc.start()
        try:
            bad = echo_call("call-1", big)
            step = turn("response-001", [bad], "toolCall")
            _, result, _, _ = self._failed(step, "MODEL_PROTOCOL_ERROR", 0)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 1_000_000
        assert result.error is not None
        assert "4096" in result.error.message
        assert len(result.error.message) < 1000

    @pytest.mark.parametrize(
        ("step", "chunk_events"),
        [
            pytest.param(lambda m, r, s: None, 0, id="stream-returns-None"),
            pytest.param(lambda m, r, s: [al.TextDelta(r.id, "x")], 0, id="stream-returns-a-list"),
            pytest.param(
                lambda m, r, s: iter([al.TextDelta(r.id, "x")]), 0, id="stream-returns-an-iterator"
            ),
            pytest.param(lambda m, r, s: "text", 0, id="stream-returns-a-str"),
            pytest.param(stream_step([text("x")], lambda r: None), 1, id="generator-returns-None"),
            pytest.param(
                stream_step([text("x")], lambda r: {"id": "r", "requestId": r.id, "content": []}),
                1,
                id="generator-returns-a-dict",
            ),
            pytest.param(
                stream_step([lambda r: None], respond("r", [], "stop")), 0, id="yields-None"
            ),
            pytest.param(
                stream_step([lambda r: "x"], respond("r", [text("x")], "stop")),
                0,
                id="yields-a-str",
            ),
            pytest.param(
                stream_step([lambda r: untyped.TextDelta(r.id, None)], respond("r", [], "stop")),
                0,
                id="TextDelta-text-None",
            ),
            pytest.param(
                stream_step([lambda r: untyped.TextDelta(r.id, 5)], respond("r", [], "stop")),
                0,
                id="TextDelta-text-int",
            ),
            pytest.param(
                stream_step(
                    [text("a"), lambda r: untyped.ToolCallChunk(r.id, text("b"))],
                    respond("r", [text("ab")], "stop"),
                ),
                1,
                id="ToolCallChunk-carrying-a-TextBlock",
            ),
            pytest.param(
                stream_step(
                    [lambda r: untyped.ToolCallChunk(r.id, None)], respond("r", [], "stop")
                ),
                0,
                id="ToolCallChunk-carrying-None",
            ),
            pytest.param(
                stream_step(
                    [lambda r: {"type": "text", "requestId": r.id, "text": "x"}],
                    respond("r", [text("x")], "stop"),
                ),
                0,
                id="yields-a-chunk-dict",
            ),
            pytest.param(
                turn("r", [al.ToolCall("", "echo", {"text": "x"})], "toolCall"),
                0,
                id="tool-call-id-empty",
            ),
            pytest.param(
                turn("r", [untyped.ToolCall(None, "echo", {"text": "x"})], "toolCall"),
                0,
                id="tool-call-id-None",
            ),
            pytest.param(
                turn("r", [untyped.ToolCall(7, "echo", {"text": "x"})], "toolCall"),
                0,
                id="tool-call-id-int",
            ),
            pytest.param(
                turn("r", [untyped.ToolCall("c", None, {"text": "x"})], "toolCall"),
                0,
                id="tool-call-name-None",
            ),
            pytest.param(
                turn("r", [al.ToolCall("c", "", {"text": "x"})], "toolCall"),
                0,
                id="tool-call-name-empty",
            ),
            pytest.param(
                stream_step(
                    [text("x")],
                    lambda r: untyped.ModelResponse(None, r.id, [text("x")], "stop"),
                ),
                1,
                id="response-id-None",
            ),
            pytest.param(
                stream_step(
                    [text("x")], lambda r: al.ModelResponse("", r.id, [text("x")], "stop")
                ),
                1,
                id="response-id-empty",
            ),
            pytest.param(
                stream_step(
                    [text("x")],
                    lambda r: untyped.ModelResponse("r", r.id, [text("x")], "length"),
                ),
                1,
                id="stop-reason-length",
            ),
            pytest.param(
                stream_step(
                    [text("x")], lambda r: untyped.ModelResponse("r", r.id, [text("x")], None)
                ),
                1,
                id="stop-reason-None",
            ),
            pytest.param(
                stream_step(
                    [],
                    lambda r: untyped.ModelResponse(
                        "r", r.id, [{"type": "text", "text": "x"}], "stop"
                    ),
                ),
                0,
                id="response-block-is-a-dict",
            ),
            pytest.param(
                stream_step(
                    [],
                    lambda r: untyped.ModelResponse("r", r.id, [untyped.TextBlock(5)], "stop"),
                ),
                0,
                id="response-text-block-int",
            ),
            pytest.param(
                stream_step([], lambda r: untyped.ModelResponse("r", r.id, "text", "stop")),
                0,
                id="response-content-a-str",
            ),
            pytest.param(
                turn("r", [echo_call("c", "a"), echo_call("c", "b")], "toolCall"),
                2,
                id="duplicate-call-ids-in-one-response",
            ),
            pytest.param(
                turn("r", [echo_call("c", "a"), text("and"), echo_call("c", "a")], "toolCall"),
                3,
                id="same-call-twice-in-one-response",
            ),
            pytest.param(
                turn("r", [al.ToolCall("c", "echo", {"text": "x"})], "stop"),
                1,
                id="tool-call-in-a-stop-response",
            ),
            pytest.param(
                turn("r", [text("x")], "toolCall"), 1, id="toolCall-response-without-a-call"
            ),
            pytest.param(
                stream_step([text("abc")], respond("r", [text("abd")], "stop")),
                1,
                id="stream-and-response-disagree",
            ),
            pytest.param(
                stream_step(
                    [echo_call("c", "a")], respond("r", [echo_call("c", "b")], "toolCall")
                ),
                1,
                id="streamed-call-differs-from-terminal-call",
            ),
            pytest.param(
                scripted_step([add_call()], chunks=[add_call("call-add-002")]),
                1,
                id="streamed-call-id-differs",
            ),
            pytest.param(
                scripted_step([text("Adding."), add_call()], chunks=[add_call(), text("Adding.")]),
                2,
                id="order-differs",
            ),
            pytest.param(
                scripted_step([text("Adding."), add_call()], chunks=[text("Adding.")]),
                1,
                id="missing-chunk",
            ),
            pytest.param(
                scripted_step([add_call()], chunks=[add_call(), text("More.")]),
                2,
                id="extra-chunk",
            ),
            pytest.param(
                stream_step(
                    [lambda r: al.ToolCallChunk("request-999", add_call())],
                    respond("r", [add_call()], "toolCall"),
                ),
                0,
                id="tool-call-chunk-with-another-request-id",
            ),
            # A str subclass that raises from ==, len() or hash() is model output of the
            # wrong type, like any non-str: the run fails, it does not raise.
            pytest.param(
                stream_step(
                    [lambda r: al.TextDelta(RaisingEq(r.id), "x")],
                    respond("r", [text("x")], "stop"),
                ),
                0,
                id="request-id-raising-eq",
            ),
            pytest.param(
                stream_step(
                    [lambda r: al.TextDelta(r.id, RaisingLen("x"))],
                    respond("r", [text("x")], "stop"),
                ),
                0,
                id="text-raising-len",
            ),
            pytest.param(
                turn("r", [al.ToolCall(RaisingHash("c"), "echo", {"text": "x"})], "toolCall"),
                0,
                id="call-id-raising-hash",
            ),
        ],
    )
    def test_contradiction_or_excess_becomes_a_failed_model_protocol_error_result(
        self, step: Step | al.ScriptedResponse, chunk_events: int
    ) -> None:
        """Seed: "These checks occur before a Tool effect. Contradiction or excess becomes
        a failed MODEL_PROTOCOL_ERROR result." Output of the wrong type, a response that
        contradicts its stream or the rules of a stop reason: the valid chunks before it
        have events, no tool runs, nothing is appended."""
        self._failed(step, "MODEL_PROTOCOL_ERROR", chunk_events)

    @pytest.mark.parametrize(
        ("step", "chunk_events"),
        [
            pytest.param(
                stream_step(
                    [lambda r: al.TextDelta("request-999", "x")],
                    respond("r", [text("x")], "stop"),
                ),
                0,
                id="chunk-with-another-request-id",
            ),
            pytest.param(
                stream_step(
                    [lambda r: untyped.TextDelta(None, "x")],
                    respond("r", [text("x")], "stop"),
                ),
                0,
                id="chunk-request-id-None",
            ),
            pytest.param(
                stream_step(
                    [text("x")],
                    lambda r: al.ModelResponse("r", "request-999", [text("x")], "stop"),
                ),
                1,
                id="response-with-another-request-id",
            ),
        ],
    )
    def test_model_that_ignores_the_request_id(self, step: Step, chunk_events: int) -> None:
        """Seed: "Request IDs must match the active request.\""""
        _, result, _, _ = self._failed(step, "MODEL_PROTOCOL_ERROR", chunk_events)
        assert result.error is not None
        assert "request-001" in result.error.message

    def test_model_that_replays_a_stale_request_id_on_the_second_step(self) -> None:
        executed: list[str] = []
        stale = lambda r: al.TextDelta("request-001", "done")  # noqa: E731
        model = FakeModel(
            turn("response-001", [echo_call("call-1", "a")], "toolCall"),
            stream_step([stale], respond("response-002", [text("done")], "stop")),
        )
        events, result, _ = run(model, [echo_tool(executed)])
        assert result.error is not None
        assert result.error.code == "MODEL_PROTOCOL_ERROR"
        assert executed == ["a"]
        assert [m.id for m in result.messages] == [
            "user-001",
            "message-response-001",
            "tool-result-call-1",
        ]
        assert types_of(events).count("model.chunk") == 1  # the stale chunk got no event


@pytest.mark.hostile
class TestModelStreamCleanup:
    """A model stream whose cleanup raises, or that ignores GeneratorExit, when the loop
    closes it: the run still ends with exactly one run.finished, for its first cause."""

    @staticmethod
    def _endless(how: str, pulled: list[int] | None = None) -> Step:
        def step(
            model: FakeModel, request: al.ModelRequest, signal: Any
        ) -> Generator[object, None, object]:
            ignored = False
            try:
                while True:
                    try:
                        if pulled is not None:
                            pulled.append(1)
                        yield al.TextDelta(request.id, "x")
                    except GeneratorExit:
                        if how != "ignores-exit" or ignored:
                            raise
                        ignored = True  # keeps going once: close() raises RuntimeError
            finally:
                model.finalized.append(request.id)
                if how == "cleanup-raises":
                    raise OSError("cleanup failed")

        return step

    @pytest.mark.parametrize("how", ["well-behaved", "cleanup-raises", "ignores-exit"])
    def test_endless_stream_is_stopped_by_the_chunk_limit(self, how: str) -> None:
        """Seed: "The loop caps one step at 1024 chunks": a stream that never ends is
        closed after the first chunk over the cap, however it behaves when closed."""
        pulled: list[int] = []
        model = FakeModel(self._endless(how, pulled))
        events, result, _ = run(model)
        assert_failed(events, result, "MODEL_PROTOCOL_ERROR", "1024")
        assert types_of(events).count("model.chunk") == al.MAX_STEP_CHUNKS
        # One pull over the cap (and one more by the stream that ignores its closing).
        assert len(pulled) == al.MAX_STEP_CHUNKS + 1 + (how == "ignores-exit")
        assert model.finalized == ["request-001"]
        assert result.messages == (user(),)
        assert result.steps == model.call_count == 1

    @pytest.mark.parametrize("how", ["cleanup-raises", "ignores-exit"])
    def test_cancelled_mid_stream(self, how: str) -> None:
        model = FakeModel(self._endless(how))
        signal = threading.Event()
        run_ = start_run(model, signal=signal)
        events = until(run_, "model.chunk", 3)
        signal.set()
        more, result = al.settle_run(run_)
        events += more
        check_run(events, result, model, max_steps=4, start=[user()])
        assert result.status == "cancelled"
        assert result.messages == (user(),)

    @pytest.mark.parametrize("how", ["cleanup-raises", "ignores-exit"])
    def test_consumer_close_does_not_raise(self, how: str) -> None:
        model = FakeModel(self._endless(how))
        run_ = start_run(model)
        until(run_, "model.chunk", 3)
        run_.close()
        assert model.finalized[:1] == ["request-001"]


# --- Tools -------------------------------------------------------------------------------


EXAMPLE_OF_TYPE: dict[str, Any] = {
    "object": {"k": 1},
    "string": "s",
    "number": 1.5,
    "integer": 3,
    "boolean": True,
    "array": [1],
    "null": None,
}


ENUM_VALUES = [1, "a", None, [1, 2], {"k": True}]


def execute_probe(
    parameters: Mapping[str, Any], arguments: Any
) -> tuple[al.ToolResultMessage, list[dict[str, Any]]]:
    """Runs ``probe`` with this schema on these arguments through execute_tool_call."""
    received: list[dict[str, Any]] = []
    registry = al.ToolRegistry([probe_tool(received, parameters)])
    tool_call = al.ToolCall("call-001", "probe", arguments)
    return al.execute_tool_call(registry, tool_call, threading.Event()), received


def execute_probe_property(schema: Mapping[str, Any], value: Any) -> Any:
    """Runs ``probe`` whose one required property ``v`` has this schema, with ``v`` = value."""
    parameters = {"type": "object", "properties": {"v": schema}, "required": ["v"]}
    return execute_probe(parameters, {"v": value})


def assert_accepted(result: al.ToolResultMessage, received: list[dict[str, Any]]) -> None:
    assert result.is_error is False
    assert result.content == "ok"
    assert len(received) == 1


def assert_rejected(
    result: al.ToolResultMessage, received: list[dict[str, Any]], *words: str
) -> None:
    """A recoverable result that names the problem; the tool did not run."""
    assert result.is_error is True
    assert result.id == "tool-result-call-001"
    assert result.tool_call_id == "call-001"
    assert result.tool_name == "probe"
    assert "probe" in result.content
    for word in words:
        assert word in result.content
    assert received == []


def one_property(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Parameters whose one required property ``v`` has this schema."""
    return {"type": "object", "properties": {"v": schema}, "required": ["v"]}


INTEGER_N = {"type": "object", "properties": {"n": {"type": "integer"}}}
INTEGER_XS = {
    "type": "object",
    "properties": {"xs": {"type": "array", "items": {"type": "integer"}}},
}
ITEM_N = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
OBJECT_XS = {"type": "object", "properties": {"xs": {"type": "array", "items": ITEM_N}}}
INNER = {
    "type": "object",
    "properties": {"inner": {**ITEM_N, "additionalProperties": False}},
    "required": ["inner"],
}
ANNOTATED = {
    "type": "object",
    "title": "Probe",
    "description": "The probe's arguments.",
    "properties": {"n": {"type": "integer", "description": "A number.", "title": "N"}},
}


SCHEMA_CASES = [
    # Each type accepts its own kind and rejects the others; a number also accepts an integer.
    *[
        pytest.param(one_property({"type": schema_type}), {"v": value},
                     None if kind == schema_type or (schema_type, kind) == ("number", "integer")
                     else ("$.v", schema_type, kind),
                     id=f"type-{schema_type}-given-{kind}")
        for schema_type in EXAMPLE_OF_TYPE
        for kind, value in EXAMPLE_OF_TYPE.items()
    ],
    # bool is never a number or an integer.
    *[
        pytest.param(one_property({"type": schema_type}), {"v": value},
                     ("$.v", schema_type, "boolean"), id=f"{value}-is-no-{schema_type}")
        for schema_type in ("number", "integer")
        for value in (True, False)
    ],
    *[pytest.param(one_property({"type": "number"}), {"v": value}, None,
                   id=f"int-{value}-is-a-number")
      for value in (0, 42, -7, 2**70)],
    # The documented choice: a schema integer is an int, never a float (even 1.0).
    *[pytest.param(one_property({"type": "integer"}), {"v": value}, ("$.v", "integer", "number"),
                   id=f"float-{value}-is-no-integer")
      for value in (1.0, 0.0, -3.0, 1.5)],
    pytest.param(NUMBERS, {"left": 20, "right": "22"}, ("$.right", "number", "string"),
                 id="properties-are-checked"),
    pytest.param(NUMBERS, {"left": 20}, ("required", "'right'"), id="a-missing-required-property"),
    pytest.param(NUMBERS, {"left": 20, "right": 22.5}, None, id="required-properties-present"),
    pytest.param(NUMBERS, {"left": 1, "right": 2, "extra": 3}, ("unexpected", "'extra'"),
                 id="additionalProperties-false-rejects-an-extra"),
    pytest.param(INTEGER_N, {"n": 1, "extra": [None]}, None, id="additionalProperties-default"),
    pytest.param({**INTEGER_N, "additionalProperties": True}, {"n": 1, "extra": [None]}, None,
                 id="additionalProperties-true"),
    pytest.param({**INTEGER_N, "additionalProperties": True}, {"n": "one", "extra": 1},
                 ("$.n", "integer"), id="additionalProperties-true-checks-declared-properties"),
    pytest.param(INTEGER_XS, {"xs": [1, 2, 3]}, None, id="items-pass"),
    pytest.param(INTEGER_XS, {"xs": [1, "two", 3]}, ("$.xs[1]", "integer", "string"),
                 id="items-names-the-index"),
    pytest.param(OBJECT_XS, {"xs": [{"n": 1}, {"n": 2}]}, None, id="items-of-objects-pass"),
    pytest.param(OBJECT_XS, {"xs": [{"n": 1}, {"n": "x"}]}, ("$.xs[1].n",),
                 id="items-path-reaches-into-objects"),
    pytest.param(OBJECT_XS, {"xs": [{"n": 1}, {}, {"n": 3}]}, ("$.xs[1]", "'n'"),
                 id="items-path-names-a-missing-property"),
    *[pytest.param(one_property({"enum": ENUM_VALUES}), {"v": value}, None,
                   id=f"enum-accepts-{name}")
      for name, value in [("1", 1), ("a", "a"), ("null", None), ("array", [1, 2]),
                          ("object", {"k": True})]],
    # The documented choice: enum compares as strict JSON, so True is not 1.
    *[pytest.param(one_property({"enum": ENUM_VALUES}), {"v": value}, ("$.v", "one of"),
                   id=f"enum-is-strict-{name}")
      for name, value in [("true-is-not-1", True), ("1.0-is-not-1", 1.0), ("b", "b"),
                          ("array-of-float", [1, 2.0]), ("array-order", [2, 1]),
                          ("object-1-is-not-true", {"k": 1}), ("0", 0)]],
    pytest.param(one_property({"enum": [True]}), {"v": 1}, ("$.v", "one of"),
                 id="enum-true-rejects-1"),
    pytest.param(one_property({"enum": [True]}), {"v": True}, None, id="enum-true-accepts-true"),
    # Nested objects are checked at every level.
    pytest.param(INNER, {"inner": {"n": 1}}, None, id="nested-pass"),
    pytest.param(INNER, {"inner": {}}, ("$.inner", "required", "'n'"), id="nested-required"),
    pytest.param(INNER, {"inner": {"n": 1, "x": 2}}, ("$.inner", "unexpected", "'x'"),
                 id="nested-additionalProperties"),
    pytest.param(INNER, {"inner": {"n": "one"}}, ("$.inner.n", "integer"), id="nested-type"),
    pytest.param(INNER, {"inner": [1]}, ("$.inner", "object", "array"), id="nested-not-an-object"),
    pytest.param(ANNOTATED, {"n": 1}, None, id="annotations-are-accepted"),
]  # fmt: skip
"""(parameters, arguments, None if accepted, else the words the error result names)."""


class TestToolSchemas:
    """A tool's parameters are a JSON Schema subset: "type (object, string, number, integer,
    boolean, array, null), properties, required, additionalProperties (bool), items, enum.
    bool is never a number or an integer." Failures are recoverable results."""

    def test_an_enum_longer_than_the_argument_bounds_is_accepted(self) -> None:
        codes = [f"c{index:03d}" for index in range(al.MAX_ARGUMENT_VALUES + 100)]
        schema = {"type": "object", "properties": {"code": {"type": "string", "enum": codes}}}
        tool = al.Tool("country", "Picks one.", schema, lambda arguments, signal: "ok")
        registry = al.ToolRegistry([tool])
        chosen = al.execute_tool_call(
            registry, al.ToolCall("c1", "country", {"code": "c300"}), threading.Event()
        )
        assert (chosen.content, chosen.is_error) == ("ok", False)

    def test_an_enum_member_over_the_bounds_is_named(self) -> None:
        member = "x" * (al.MAX_ARGUMENT_TEXT + 1)
        schema = {"type": "object", "properties": {"a": {"enum": [member]}}}
        with pytest.raises(ValueError, match="enum member 0 is no value arguments may hold: "):
            al.Tool("t", "d", schema, lambda arguments, signal: "ok")

    @pytest.mark.parametrize(("parameters", "arguments", "rejected"), SCHEMA_CASES)
    def test_arguments_are_checked_against_the_schema(
        self, parameters: Any, arguments: Any, rejected: tuple[str, ...] | None
    ) -> None:
        """Accepted arguments reach the tool exactly; rejected ones are a recoverable
        result that names the path and the problem, and the tool does not run."""
        result, received = execute_probe(parameters, arguments)
        if rejected is None:
            assert_accepted(result, received)
            assert same_json(received[0], arguments)
        else:
            assert_rejected(result, received, *rejected)

    @pytest.mark.parametrize(
        ("parameters", "error", "word"),
        [
            pytest.param({"type": "object", "minimum": 1}, ValueError, "minimum", id="minimum"),
            pytest.param(
                {"type": "object", "properties": {"s": {"type": "string", "pattern": "x"}}},
                ValueError,
                "pattern",
                id="nested-pattern",
            ),
            pytest.param(
                {
                    "type": "object",
                    "properties": {"xs": {"type": "array", "items": {"$ref": "#"}}},
                },
                ValueError,
                "$ref",
                id="ref-in-items",
            ),
            pytest.param({"type": "string"}, ValueError, "object", id="root-string"),
            pytest.param({}, ValueError, "object", id="root-without-type"),
            pytest.param({"properties": {}}, ValueError, "object", id="root-properties-only"),
            pytest.param([], TypeError, "parameters", id="list"),
            pytest.param("object", TypeError, "parameters", id="str"),
            pytest.param(None, TypeError, "parameters", id="none"),
            pytest.param({"type": "float"}, ValueError, "float", id="type-unknown"),
            pytest.param({"type": ["object", "null"]}, ValueError, "type", id="type-list"),
            pytest.param(
                {"type": "object", "required": "left"}, TypeError, "required", id="required-str"
            ),
            pytest.param(
                {"type": "object", "required": [1]}, TypeError, "required", id="required-int"
            ),
            pytest.param(
                {"type": "object", "additionalProperties": "no"},
                TypeError,
                "additionalProperties",
                id="additional-str",
            ),
            pytest.param(
                {"type": "object", "additionalProperties": {"type": "string"}},
                TypeError,
                "additionalProperties",
                id="additional-schema",
            ),
            pytest.param({"type": "object", "enum": "a"}, TypeError, "enum", id="enum-str"),
            pytest.param(
                {"type": "object", "enum": [float("nan")]}, ValueError, "enum", id="enum-nan"
            ),
            pytest.param(
                {"type": "object", "properties": []}, TypeError, "properties", id="properties-list"
            ),
            pytest.param(
                {"type": "object", "properties": {"n": "integer"}},
                TypeError,
                "properties.n",
                id="property-not-a-schema",
            ),
            pytest.param(
                {"type": "object", "properties": {"xs": {"type": "array", "items": "integer"}}},
                TypeError,
                "items",
                id="items-str",
            ),
            pytest.param(
                {"type": "object", "properties": {"xs": {"items": [{"type": "integer"}]}}},
                TypeError,
                "items",
                id="items-list",
            ),
            pytest.param(
                {"type": "object", "description": 5}, TypeError, "description", id="description"
            ),
            pytest.param(
                {"type": "object", "properties": {"n": {"title": None}}},
                TypeError,
                "title",
                id="title",
            ),
        ],
    )
    def test_bad_parameters_are_rejected_when_the_tool_is_built(
        self, parameters: Any, error: type, word: str
    ) -> None:
        """The documented choice: a keyword the loop would silently ignore, or a malformed
        value of a supported one, is an error when the Tool is built, naming it."""
        with pytest.raises(error) as raised:
            al.Tool("probe", "A tool.", parameters, lambda arguments, signal: "ok")
        assert word in str(raised.value)

    @pytest.mark.parametrize(
        "name",
        [pytest.param("", id="empty"), pytest.param(1, id="int"), pytest.param(None, id="none")],
    )
    def test_bad_name_is_a_type_error(self, name: Any) -> None:
        with pytest.raises(TypeError, match="name"):
            al.Tool(name, "A tool.", {"type": "object"}, lambda arguments, signal: "ok")

    def test_non_str_description_is_a_type_error(self) -> None:
        with pytest.raises(TypeError, match="description"):
            al.Tool("probe", None, {"type": "object"}, lambda arguments, signal: "ok")  # type: ignore[arg-type]

    def test_non_callable_execute_is_a_type_error(self) -> None:
        with pytest.raises(TypeError, match="execute"):
            al.Tool("probe", "A tool.", {"type": "object"}, "ok")  # type: ignore[arg-type]

    @pytest.mark.parametrize("passes", [AT_LIMIT, OVER_LIMIT])
    def test_schema_depth(self, passes: bool) -> None:
        """A schema may nest as deep as arguments can (MAX_ARGUMENT_DEPTH containers, a scalar
        inside the last); one level more describes values no call can have: ValueError."""
        schema: dict[str, Any] = {"type": "integer"}
        for _ in range(32 if passes else 33):
            schema = {"type": "object", "properties": {"k": schema}, "required": ["k"]}
        if not passes:
            with pytest.raises(ValueError, match="32"):
                al.Tool("probe", "A tool.", schema, lambda arguments, signal: "ok")
            return
        arguments = nested(32, "object")
        result, received = execute_probe(schema, arguments)
        assert_accepted(result, received)
        assert received == [arguments]

    def test_parameters_are_frozen(self) -> None:
        """Mutating the original dict after construction changes nothing of the tool."""
        parameters: dict[str, Any] = {
            "type": "object",
            "properties": {"n": {"type": "integer"}},
            "required": ["n"],
            "additionalProperties": False,
        }
        before = copy.deepcopy(parameters)
        tool = probe_tool([], parameters)
        parameters["required"].append("m")
        parameters["properties"]["n"]["type"] = "string"
        parameters["properties"]["m"] = {"type": "string"}
        parameters["additionalProperties"] = True
        assert plain_copy(tool.parameters) == before
        assert plain_copy(tool.spec().parameters) == before
        with pytest.raises(TypeError):
            tool.parameters["type"] = "string"  # type: ignore[index]
        with pytest.raises(TypeError):
            tool.parameters["properties"]["n"] = {}
        received: list[dict[str, Any]] = []
        registry = al.ToolRegistry(
            [al.Tool("probe", "A tool.", tool.parameters, probe_tool(received).execute)]
        )
        result = al.execute_tool_call(
            registry, call("probe", "call-001", {"n": 1}), threading.Event()
        )
        assert_accepted(result, received)
        result = al.execute_tool_call(
            registry, call("probe", "call-001", {"n": 1, "m": "x"}), threading.Event()
        )
        assert_rejected(result, [], "unexpected", "'m'")


class TestToolSpecIsChecked:
    """ToolSpec's docstring: "Checked as a Tool is (TypeError or ValueError naming the
    field), and its parameters are frozen"."""

    def test_a_bogus_type_in_a_read_only_mapping(self) -> None:
        with pytest.raises(ValueError, match="type must be one of"):
            al.ToolSpec("x", "d", MappingProxyType({"type": "bogus"}))

    def test_the_root_must_be_an_object(self) -> None:
        with pytest.raises(ValueError, match=r"ToolSpec 'x' parameters must have \"type\""):
            al.ToolSpec("x", "d", {"type": "string"})

    @pytest.mark.parametrize(("name", "description"), [("", "d"), (1, "d"), ("x", None)])
    def test_name_and_description(self, name: Any, description: Any) -> None:
        with pytest.raises(TypeError, match="ToolSpec"):
            al.ToolSpec(name, description, {"type": "object"})


class Executor:
    def method(self, arguments: Dict[str, Any], signal: al.Signal) -> object:
        return "method"

    def __call__(self, arguments: Dict[str, Any], signal: al.Signal) -> object:
        return "callable object"


def add(left: float, right: float) -> float:
    """Adds two numbers.

    Both may be integers."""
    return left + right


def undocumented(text: str) -> str:
    return text


def search(
    query: str,
    limit: int = 10,
    exact: bool = False,
    tags: Optional[List[str]] = None,
    *,
    order: Literal["asc", "desc"] = "asc",
    signal: al.Signal,
) -> Dict[str, Any]:
    """Searches the notes."""
    return {"query": query, "limit": limit, "tags": tags, "order": order, "set": signal.is_set()}


def from_source(source: str, future_annotations: bool) -> Callable[..., object]:
    """The function ``f`` of a module made of this source, compiled with or without
    PEP 563 (``from __future__ import annotations``), as a user's module would be."""
    header = "from __future__ import annotations\n" if future_annotations else ""
    namespace: Dict[str, Any] = {}
    code = compile(
        header + "from typing import *\nimport agent_loop as al\n" + source,
        "<user module>",
        "exec",
        dont_inherit=True,  # not this module's PEP 563
    )
    exec(code, namespace)
    function: Callable[..., object] = namespace["f"]
    return function


def parameter_schema(tool: al.Tool, name: str = "x") -> Any:
    return al.ToolSpec(tool.name, tool.description, tool.parameters).to_dict()["parameters"][
        "properties"
    ][name]


# Hints, as source, and the schema each gives; both with and without PEP 563.
HINT_SCHEMAS = [
    ("str", {"type": "string"}),
    ("int", {"type": "integer"}),
    ("float", {"type": "number"}),
    ("bool", {"type": "boolean"}),
    ("None", {"type": "null"}),
    ("list", {"type": "array"}),
    ("List", {"type": "array"}),
    ("List[int]", {"type": "array", "items": {"type": "integer"}}),
    (
        "List[List[str]]",
        {"type": "array", "items": {"type": "array", "items": {"type": "string"}}},
    ),
    ("dict", {"type": "object"}),
    ("Dict", {"type": "object"}),
    ("Dict[str, Any]", {"type": "object"}),
    ('Literal["a", "b"]', {"type": "string", "enum": ["a", "b"]}),
    ("Literal[1, 2]", {"type": "integer", "enum": [1, 2]}),
    ('Literal[1, "a"]', {"enum": [1, "a"]}),
    ('Optional[Literal["a"]]', {"enum": ["a", None]}),
    ("List[Literal[True]]", {"type": "array", "items": {"type": "boolean", "enum": [True]}}),
]


# Hints whose schema would need more than the enforced subset, and what the error says.
UNEXPRESSIBLE_HINTS = [
    ("Optional[int]", "give the parameter the default None"),
    ("Union[int, str]", "a schema here has one type (no anyOf)"),
    ("Union[int, str, None]", "a schema here has one type (no anyOf)"),
    ("List[Optional[int]]", "a schema here has one type (no anyOf)"),
    ("Dict[str, int]", "use dict or Dict[str, Any]"),
    ("Tuple[int, int]", "has no schema in the subset this loop enforces"),
    ("Any", "has no schema in the subset this loop enforces"),
    ("set", "has no schema in the subset this loop enforces"),
    ("al.Tool", "has no schema in the subset this loop enforces"),
    ('Literal[b"x"]', "Literal value b'x' is a bytes, not a JSON scalar"),
]


class TestToolFromFunction:
    """Tool.from_function(fn, *, name=None, description=None) -> Tool: the
    schema from the function's type hints ..., the description from its docstring,
    required = parameters without defaults; anything it cannot express in the enforced
    schema subset is a TypeError naming the parameter."""

    def test_a_lambda_needs_a_name(self) -> None:
        with pytest.raises(TypeError, match="a lambda has no name of its own; give it name="):
            al.Tool.from_function(lambda: "ok")
        assert al.Tool.from_function(lambda: "ok", name="ok").name == "ok"

    def test_a_function_of_keyword_parameters_becomes_a_tool(self) -> None:
        tool = al.Tool.from_function(add)
        assert tool.name == "add"
        assert tool.description == "Adds two numbers.\n\nBoth may be integers."
        assert tool.spec().to_dict()["parameters"] == {
            "type": "object",
            "properties": {"left": {"type": "number"}, "right": {"type": "number"}},
            "required": ["left", "right"],
            "additionalProperties": False,
        }

    def test_it_runs_and_its_return_value_is_the_result(self) -> None:
        """float means JSON number (an int argument is accepted); the result is JSON."""
        _, result, _ = run(
            one_call("add", {"left": 20, "right": 22.5}), tools=[al.Tool.from_function(add)]
        )
        assert result.status == "completed"
        assert only_tool_result(result).content == "42.5"
        assert not only_tool_result(result).is_error

    def test_a_str_return_is_the_content_verbatim(self) -> None:
        _, result, _ = run(
            one_call("undocumented", {"text": "as is"}),
            tools=[al.Tool.from_function(undocumented)],
        )
        assert only_tool_result(result).content == "as is"

    def test_name_and_description_override(self) -> None:
        tool = al.Tool.from_function(add, name="plus", description="Sums.")
        assert (tool.name, tool.description) == ("plus", "Sums.")

    def test_no_docstring_gives_an_empty_description(self) -> None:
        assert al.Tool.from_function(undocumented).description == ""

    def test_defaults_keyword_only_and_signal(self) -> None:
        """A parameter named signal (if present) receives the run's signal and is not in
        the schema; parameters with defaults are not required."""
        tool = al.Tool.from_function(search)
        parameters = tool.spec().to_dict()["parameters"]
        assert parameters["properties"] == {
            "query": {"type": "string"},
            "limit": {"type": "integer"},
            "exact": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "order": {"type": "string", "enum": ["asc", "desc"]},
        }
        assert parameters["required"] == ["query"]
        assert parameters["additionalProperties"] is False
        signal = threading.Event()
        assert tool.execute({"query": "q", "order": "desc"}, signal) == {
            "query": "q",
            "limit": 10,
            "tags": None,
            "order": "desc",
            "set": False,
        }

    def test_the_schema_is_enforced(self) -> None:
        model = al.ScriptedModel(
            [
                al.scripted_response(
                    "r1", [al.ToolCall("c1", "search", {"query": "q", "other": 1})], "toolCall"
                ),
                al.scripted_response(
                    "r2", [al.ToolCall("c2", "search", {"query": "q", "tags": None})], "toolCall"
                ),
                al.scripted_response("r3", [al.TextBlock("done")], "stop"),
            ]
        )
        _, result, _ = run(model, tools=[al.Tool.from_function(search)])
        contents = [m.content for m in result.messages if isinstance(m, al.ToolResultMessage)]
        assert contents == [
            "invalid arguments for tool 'search': $ has the unexpected property 'other'",
            "invalid arguments for tool 'search': $.tags must be array, got null",
        ]

    def test_a_bound_method_and_a_tool_error(self) -> None:
        class Stations:
            def weather(self, city: str) -> str:
                """Reports the weather in a city."""
                raise al.ToolError(f"No station in {city}.")

        tool = al.Tool.from_function(Stations().weather)
        assert tool.name == "weather"
        assert list(tool.parameters["properties"]) == ["city"]
        _, result, _ = run(one_call("weather", {"city": "Atlantis"}), tools=[tool])
        assert only_tool_result(result).content == "No station in Atlantis."
        assert only_tool_result(result).is_error

    @pytest.mark.parametrize("future_annotations", [False, True], ids=["hints", "pep563"])
    @pytest.mark.parametrize(("hint", "schema"), HINT_SCHEMAS)
    def test_each_hint_and_its_schema(
        self, hint: str, schema: Dict[str, Any], future_annotations: bool
    ) -> None:
        function = from_source(f"def f(x: {hint}): pass", future_annotations)
        assert parameter_schema(al.Tool.from_function(function)) == schema

    @pytest.mark.parametrize("future_annotations", [False, True], ids=["hints", "pep563"])
    @pytest.mark.parametrize("hint", ["Optional[int]", "Union[None, int]", "int"])
    def test_optional_with_the_default_none_is_x_not_required(
        self, hint: str, future_annotations: bool
    ) -> None:
        """Optional[X] / X | None: a schema has one type, so the model leaves the
        parameter out to get None (and a null is refused)."""
        function = from_source(f"def f(x: {hint} = None): return x", future_annotations)
        tool = al.Tool.from_function(function)
        assert parameter_schema(tool) == {"type": "integer"}
        assert tool.parameters["required"] == ()
        assert tool.execute({}, threading.Event()) is None

    @pytest.mark.skipif(sys.version_info < (3, 9), reason="list[int] needs Python 3.9")
    def test_builtin_generic_spelling(self) -> None:
        for future_annotations in (False, True):
            function = from_source(
                "def f(x: list[int], y: dict[str, Any]): pass", future_annotations
            )
            tool = al.Tool.from_function(function)
            assert parameter_schema(tool) == {"type": "array", "items": {"type": "integer"}}
            assert parameter_schema(tool, "y") == {"type": "object"}

    @pytest.mark.skipif(sys.version_info < (3, 10), reason="X | None needs Python 3.10")
    def test_union_operator_spelling(self) -> None:
        for future_annotations in (False, True):
            function = from_source(
                "def f(x: int | None = None, y: str | int = 1): pass", future_annotations
            )
            with pytest.raises(TypeError, match=r"parameter 'y': .* one type"):
                al.Tool.from_function(function)
            function = from_source("def f(x: int | None = None): pass", future_annotations)
            assert parameter_schema(al.Tool.from_function(function)) == {"type": "integer"}

    @pytest.mark.parametrize(("hint", "says"), UNEXPRESSIBLE_HINTS)
    def test_an_unexpressible_hint_is_a_type_error_naming_the_parameter(
        self, hint: str, says: str
    ) -> None:
        function = from_source(f"def f(ok: str, x: {hint}): pass", future_annotations=False)
        with pytest.raises(TypeError) as raised:
            al.Tool.from_function(function)
        assert str(raised.value).startswith("Tool.from_function(f): parameter 'x': ")
        assert says in str(raised.value)

    @pytest.mark.parametrize(
        ("source", "says"),
        [
            ("def f(x): pass", "parameter 'x' has no type hint"),
            ("def f(ok: int, *x: int): pass", "parameter 'x' is variadic positional"),
            ("def f(ok: int, **x: int): pass", "parameter 'x' is variadic keyword"),
            ("def f(x: int, /): pass", "parameter 'x' is positional-only"),
            ("def f(signal, /): pass", "parameter 'signal' is positional-only"),
        ],
    )
    def test_parameters_it_cannot_pass_by_name(self, source: str, says: str) -> None:
        with pytest.raises(TypeError) as raised:
            al.Tool.from_function(from_source(source, future_annotations=False))
        assert str(raised.value).startswith("Tool.from_function(f): " + says)

    def test_an_annotation_that_cannot_be_resolved(self) -> None:
        function = from_source("def f(x: Undefined): pass", future_annotations=True)
        with pytest.raises(TypeError) as raised:
            al.Tool.from_function(function)
        assert str(raised.value) == (
            "Tool.from_function: cannot resolve the type hints of f: "
            "NameError: name 'Undefined' is not defined"
        )

    @pytest.mark.parametrize("fn", [len, Executor(), int], ids=["builtin", "object", "class"])
    def test_only_functions_and_methods(self, fn: Callable[..., object]) -> None:
        with pytest.raises(TypeError, match="takes a function or a method, got "):
            al.Tool.from_function(fn)

    def test_an_async_function_is_refused(self) -> None:
        """Its result would be a coroutine that nobody awaits: an error result each time."""

        async def fetch(url: str) -> str:
            return url

        with pytest.raises(TypeError) as raised:
            al.Tool.from_function(fetch)
        assert "fetch is an async function" in str(raised.value)
        assert "give it a plain def" in str(raised.value)

    def test_the_name_is_checked_as_tool_checks_it(self) -> None:
        with pytest.raises(TypeError, match="Tool name must be a non-empty str"):
            al.Tool.from_function(add, name="")


def named_tool(name: str) -> al.Tool:
    return al.Tool(name, f"The {name} tool.", {"type": "object"}, lambda arguments, signal: name)


class TestToolRegistry:
    """The registry's contract: ToolRegistry(tools) with register(tool) (a duplicate name
    raises ValueError), get(name), __contains__, __len__, __iter__ and specs()."""

    def test_register_and_get(self) -> None:
        registry = al.ToolRegistry()
        assert len(registry) == 0
        tool = named_tool("one")
        registry.register(tool)
        assert registry.get("one") is tool
        assert registry.get("two") is None
        assert len(registry) == 1

    def test_duplicate_name_is_a_value_error(self) -> None:
        registry = al.ToolRegistry([named_tool("one")])
        original = registry.get("one")
        with pytest.raises(ValueError, match="one"):
            registry.register(named_tool("one"))
        assert registry.get("one") is original
        assert len(registry) == 1

    def test_duplicate_in_the_constructor_is_a_value_error(self) -> None:
        with pytest.raises(ValueError, match="one"):
            al.ToolRegistry([named_tool("one"), named_tool("one")])

    @pytest.mark.parametrize(
        "item",
        [
            pytest.param("one", id="str"),
            pytest.param(None, id="none"),
            pytest.param(al.ToolSpec("one", "", {"type": "object"}), id="spec"),
        ],
    )
    def test_non_tool_is_a_type_error(self, item: Any) -> None:
        registry = al.ToolRegistry()
        with pytest.raises(TypeError, match="Tool"):
            registry.register(item)
        assert len(registry) == 0

    def test_contains(self) -> None:
        registry = al.ToolRegistry([named_tool("one")])
        assert "one" in registry
        assert "two" not in registry
        assert 1 not in registry

    def test_iterates_in_registration_order(self) -> None:
        tools = [named_tool(name) for name in ("zeta", "alpha", "mid")]
        registry = al.ToolRegistry(tools[:2])
        registry.register(tools[2])
        assert list(registry) == tools
        assert len(registry) == 3

    def test_specs(self) -> None:
        registry = al.ToolRegistry([add_tool(), echo_tool()])
        specs = registry.specs()
        assert type(specs) is tuple
        assert [spec.name for spec in specs] == ["add", "echo"]
        assert specs[0] == al.ToolSpec("add", "Adds two numbers.", registry.get("add").parameters)  # type: ignore[union-attr]
        assert specs[1].description == "Returns its text."
        assert plain_copy(specs[0].parameters) == NUMBERS
        assert all(isinstance(spec, al.ToolSpec) for spec in specs)

    def test_iterating_while_registering_is_safe(self) -> None:
        """Registering during iteration neither raises nor changes what that iteration sees."""
        tools = [named_tool("one"), named_tool("two")]
        registry = al.ToolRegistry(tools)
        seen = []
        for tool in registry:
            seen.append(tool)
            registry.register(named_tool(tool.name + "-copy"))
        assert seen == tools
        assert [tool.name for tool in registry] == ["one", "two", "one-copy", "two-copy"]


def returning(value: Any) -> tuple[al.ToolResultMessage, al.ToolCall]:
    """Runs a tool named "give" that returns ``value``, through execute_tool_call."""
    tool = al.Tool("give", "Returns a value.", {"type": "object"}, lambda arguments, signal: value)
    tool_call = call("give", "call-give-001", {})
    return al.execute_tool_call(al.ToolRegistry([tool]), tool_call, threading.Event()), tool_call


class StrSubclass(str):
    """Only an exact str is taken verbatim: a subclass is just another JSON value."""


class TestExecuteToolCall:
    """execute_tool_call(registry, call, signal) -> ToolResultMessage; an unknown tool,
    bad arguments or an exception become a recoverable result; it never raises for those."""

    @pytest.mark.parametrize(("id", "name"), [(1, "echo"), ("c1", ["echo"]), ("", "echo")])
    def test_a_call_no_result_can_be_linked_to_is_a_type_error(
        self, id: object, name: object
    ) -> None:
        registry = al.ToolRegistry([echo_tool()])
        with pytest.raises(TypeError, match="id and name must be non-empty str"):
            al.execute_tool_call(registry, untyped.ToolCall(id, name, {}), threading.Event())

    def test_a_str_return_is_the_content_verbatim(self) -> None:
        result, _ = returning('He said "hi"\n')
        assert result.is_error is False
        assert result.content == 'He said "hi"\n'

    def test_the_seeds_add_result(self) -> None:
        """Seed: content: '{"sum":42}'."""
        result = al.execute_tool_call(
            al.ToolRegistry([add_tool()]),
            call("add", "call-add-001", {"left": 20, "right": 22}),
            threading.Event(),
        )
        assert result == al.ToolResultMessage(
            "tool-result-call-add-001", "call-add-001", "add", '{"sum":42}', False
        )

    @pytest.mark.parametrize(
        ("value", "content"),
        [
            pytest.param({"sum": 42}, '{"sum":42}', id="dict"),
            pytest.param({"word": "café 😀"}, '{"word":"café 😀"}', id="non-ascii"),
            pytest.param(None, "null", id="none"),
            pytest.param([1, "a", None, True, 1.5], '[1,"a",null,true,1.5]', id="list"),
            pytest.param({"a": [{"b": []}]}, '{"a":[{"b":[]}]}', id="nested"),
            pytest.param(7, "7", id="int"),
            pytest.param(False, "false", id="bool"),
            pytest.param(StrSubclass("hi"), '"hi"', id="str-subclass"),
        ],
    )
    def test_other_json_is_encoded_compactly(self, value: Any, content: str) -> None:
        result, _ = returning(value)
        assert result.is_error is False
        assert result.content == content

    @pytest.mark.parametrize(
        "make",
        [
            pytest.param(lambda: {1, 2}, id="set"),
            pytest.param(Custom, id="object"),
            pytest.param(lambda: float("nan"), id="nan"),
            pytest.param(lambda: {"x": float("inf")}, id="inf"),
            pytest.param(cyclic_array, id="cyclic-list"),
            pytest.param(lambda: b"bytes", id="bytes"),
        ],
    )
    def test_a_value_that_is_not_json_is_a_recoverable_error(
        self, make: Callable[[], Any]
    ) -> None:
        result, _tool_call = returning(make())
        assert result.is_error is True
        assert "give" in result.content
        assert "JSON" in result.content
        assert result.id == "tool-result-call-give-001"

    def test_a_raising_tool_is_a_recoverable_error(self) -> None:
        def execute(arguments: dict[str, Any], signal: Any) -> object:
            raise LookupError("no weather station in Atlantis")

        tool = al.Tool("weather", "Weather.", {"type": "object"}, execute)
        result = al.execute_tool_call(
            al.ToolRegistry([tool]), call("weather", "call-w-001", {}), threading.Event()
        )
        assert result.is_error is True
        assert "weather" in result.content
        assert "LookupError" in result.content
        assert "no weather station in Atlantis" in result.content
        assert (result.id, result.tool_call_id, result.tool_name) == (
            "tool-result-call-w-001",
            "call-w-001",
            "weather",
        )

    def test_keyboard_interrupt_is_not_turned_into_a_result(self) -> None:
        """Only Exceptions become results: a KeyboardInterrupt propagates."""

        def execute(arguments: dict[str, Any], signal: Any) -> object:
            raise KeyboardInterrupt

        tool = al.Tool("stop", "Interrupts.", {"type": "object"}, execute)
        with pytest.raises(KeyboardInterrupt):
            al.execute_tool_call(
                al.ToolRegistry([tool]), call("stop", "call-001", {}), threading.Event()
            )

    def test_an_unknown_tool_names_it_and_the_available_ones(self) -> None:
        registry = al.ToolRegistry([add_tool(), echo_tool()])
        result = al.execute_tool_call(
            registry, call("divide", "call-d-001", {}), threading.Event()
        )
        assert result.is_error is True
        for name in ("divide", "add", "echo"):
            assert name in result.content
        assert (result.id, result.tool_call_id, result.tool_name) == (
            "tool-result-call-d-001",
            "call-d-001",
            "divide",
        )

    def test_an_unknown_tool_in_an_empty_registry(self) -> None:
        result = al.execute_tool_call(
            al.ToolRegistry(), call("divide", "call-d-001", {}), threading.Event()
        )
        assert result.is_error is True
        assert "divide" in result.content

    def test_result_ids_link_to_the_call(self) -> None:
        result, tool_call = returning("fine")
        assert result.id == "tool-result-" + tool_call.id
        assert result.tool_call_id == tool_call.id
        assert result.tool_name == tool_call.name
        assert result.role == "toolResult"

    def test_execute_receives_the_signal_given(self) -> None:
        seen: list[Any] = []
        tool = al.Tool("probe", "", {"type": "object"}, lambda a, signal: seen.append(signal))
        signal = threading.Event()
        al.execute_tool_call(al.ToolRegistry([tool]), call("probe", "c", {}), signal)
        assert len(seen) == 1
        assert seen[0] is signal

    @pytest.mark.parametrize(
        "make",
        [
            pytest.param(lambda: {"x": float("nan")}, id="nan"),
            pytest.param(shared_array, id="shared-list"),
            pytest.param(lambda: nested(33), id="too-deep"),
            pytest.param(lambda: [1], id="list-root"),
        ],
    )
    def test_invalid_arguments_passed_directly_are_a_recoverable_error(
        self, make: Callable[[], Any]
    ) -> None:
        result, received = execute_probe({"type": "object"}, make())
        assert_rejected(result, received, "arguments")


def one_parameter(arguments: Dict[str, Any]) -> object:
    return "one"


def three_required(arguments: Dict[str, Any], signal: al.Signal, extra: int) -> object:
    return "three"


def keyword_only(*, arguments: Dict[str, Any], signal: al.Signal) -> object:
    return "keyword"


def variadic(*values: Any) -> object:
    return "variadic"


class NoSignature:
    """A callable that inspect.signature() cannot read: its __signature__ is not a
    Signature, which is a TypeError on every Python."""

    __signature__ = 42

    def __call__(self, *values: Any) -> object:
        return "no signature"


class TestExecuteMustTakeArgumentsAndSignal:
    """A tool whose execute cannot take (arguments, signal) is a TypeError when the Tool
    is built, not a recoverable "raised TypeError" that hides the bug."""

    @pytest.mark.parametrize(
        "execute", [one_parameter, three_required, keyword_only], ids=lambda f: f.__name__
    )
    def test_a_function_that_cannot_take_them_is_refused(
        self, execute: Callable[..., object]
    ) -> None:
        with pytest.raises(TypeError) as raised:
            no_arguments_tool("t", execute)
        assert str(raised.value).startswith("Tool 't': execute(")
        assert "cannot be called as execute(arguments, signal)" in str(raised.value)

    @pytest.mark.parametrize(
        ("execute", "returned"),
        [
            pytest.param(two_parameters, "two", id="function"),
            pytest.param(variadic, "variadic", id="*args"),
            pytest.param(lambda a, s: "lambda", "lambda", id="lambda"),
            pytest.param(Executor().method, "method", id="bound-method"),
            pytest.param(Executor(), "callable object", id="callable-object"),
            pytest.param(NoSignature(), "no signature", id="no-signature"),
        ],
    )
    def test_a_callable_that_can_take_them_is_accepted_and_runs(
        self, execute: Callable[..., object], returned: str
    ) -> None:
        _, result, _ = run(one_call("t"), tools=[no_arguments_tool("t", execute)])
        assert result.status == "completed"
        assert only_tool_result(result).content == returned

    def test_a_callable_with_no_signature_is_trusted(self) -> None:
        with pytest.raises(TypeError):
            __import__("inspect").signature(NoSignature())
        assert no_arguments_tool("t", NoSignature()).name == "t"


class TestToolError:
    """ToolError's docstring: "The call's result is is_error=True with content exactly
    message, with no prefix"."""

    def test_its_message_is_the_content(self) -> None:
        tool = no_arguments_tool("t", lambda a, s: (_ for _ in ()).throw(al.ToolError("x")))
        message = al.execute_tool_call(
            al.ToolRegistry([tool]), al.ToolCall("c1", "t", {}), threading.Event()
        )
        assert (message.content, message.is_error) == ("x", True)
        assert al.ToolError("x").message == "x"

    @pytest.mark.parametrize("message", [1, None, b"x"])
    def test_a_message_that_is_not_a_str(self, message: Any) -> None:
        with pytest.raises(TypeError, match="ToolError message must be a str, got "):
            al.ToolError(message)


def not_json(arguments: Dict[str, Any], signal: al.Signal) -> object:
    return {1, 2}


def raises_lookup_error(arguments: Dict[str, Any], signal: al.Signal) -> object:
    raise LookupError("no such station")


def raises_tool_error(arguments: Dict[str, Any], signal: al.Signal) -> object:
    raise al.ToolError("Try another city.")


class TestRecoverableExceptionsAreLogged:
    """Every exception that becomes a recoverable tool result is also logged through
    logging.getLogger("agent_loop") with its traceback (the library adds only a
    NullHandler)."""

    @pytest.mark.parametrize(
        ("execute", "exception"),
        [(raises_lookup_error, LookupError), (not_json, TypeError)],
        ids=["raises", "not-json"],
    )
    def test_the_record_has_the_traceback(
        self,
        caplog: pytest.LogCaptureFixture,
        execute: Callable[..., object],
        exception: type,
    ) -> None:
        caplog.set_level(logging.WARNING, logger="agent_loop")
        _, result, _ = run(one_call("t"), tools=[no_arguments_tool("t", execute)])
        assert only_tool_result(result).is_error
        [record] = [r for r in caplog.records if r.name == "agent_loop"]
        assert record.levelno == logging.WARNING
        assert "'t'" in record.getMessage()
        assert record.exc_info is not None
        assert isinstance(record.exc_info[1], exception)

    def test_a_tool_error_is_not_logged(self, caplog: pytest.LogCaptureFixture) -> None:
        caplog.set_level(logging.DEBUG, logger="agent_loop")
        _, result, _ = run(one_call("t"), tools=[no_arguments_tool("t", raises_tool_error)])
        assert only_tool_result(result).content == "Try another city."
        assert [r for r in caplog.records if r.name == "agent_loop"] == []

    def test_the_library_adds_only_a_null_handler(self) -> None:
        handlers = logging.getLogger("agent_loop").handlers
        assert len(handlers) == 1
        assert type(handlers[0]) is logging.NullHandler


class Abort(BaseException):
    """A BaseException that is neither KeyboardInterrupt nor SystemExit."""


@pytest.mark.hostile
class TestMisbehavingTools:
    """Seed: "A recoverable Tool error is still appended and sent to the next model
    request; it does not end the run by itself.\""""

    @staticmethod
    def _one_call_then_stop(
        tool: al.Tool,
    ) -> tuple[list[al.Event], al.RunResult, al.ScriptedModel]:
        model = al.ScriptedModel(
            [
                al.scripted_response(
                    "response-001", [al.ToolCall("call-1", tool.name, {"text": "hi"})], "toolCall"
                ),
                al.scripted_response("response-002", [text("noted")], "stop"),
            ]
        )
        events, result, _ = run(model, [tool])
        return events, result, model

    def test_returning_a_huge_string_is_kept_verbatim(self) -> None:
        huge = "y" * 5_000_000
        tool = al.Tool("huge", "Returns a lot.", {"type": "object"}, lambda a, s: huge)
        _, result, _ = self._one_call_then_stop(tool)
        assert result.status == "completed"
        tool_result = result.messages[2]
        assert isinstance(tool_result, al.ToolResultMessage)
        assert tool_result.is_error is False
        assert tool_result.content == huge

    def test_tool_that_drives_the_run_reentrantly_is_recoverable(self) -> None:
        """A tool that calls next() on the very run it is part of gets ValueError
        ("generator already executing"), which is an ordinary, recoverable error."""
        holder: list[Any] = []

        def reenter(arguments: dict[str, Any], signal: Any) -> object:
            return next(holder[0])

        tool = al.Tool("reenter", "Re-enters.", {"type": "object"}, reenter)
        model = al.ScriptedModel(
            [
                al.scripted_response(
                    "response-001", [al.ToolCall("call-1", "reenter", {})], "toolCall"
                ),
                al.scripted_response("response-002", [text("done")], "stop"),
            ]
        )
        run_ = start_run(model, [tool])
        holder.append(run_)
        _events, result = settle(run_, model, max_steps=4, start=[user()])
        assert result.status == "completed"
        tool_result = result.messages[2]
        assert isinstance(tool_result, al.ToolResultMessage)
        assert tool_result.is_error is True
        assert "ValueError" in tool_result.content


# --- Bounded plain JSON ------------------------------------------------------------------


class TestPlainJsonArguments:
    """Seed: "Tool arguments must be plain bounded JSON ... These checks occur before a Tool
    effect. Contradiction or excess becomes a failed MODEL_PROTOCOL_ERROR result." """

    def test_a_call_rebuilt_from_frozen_arguments_is_plain(self) -> None:
        """Frozen arrays are tuples and CPython shares the empty one: an immutable value
        reached twice is not aliasing, so a call rebuilt from another's arguments runs."""
        original = al.ToolCall("call-1", "anything", {"a": [], "b": [], "c": {"d": []}})
        received: list[Any] = []
        tool = al.Tool(
            "anything", "Takes any object.", {"type": "object"}, lambda a, s: received.append(a)
        )
        rebuilt = dataclasses.replace(original, id="call-2")
        _, result, _ = run(
            [
                al.scripted_response("response-001", [rebuilt], "toolCall"),
                al.scripted_response("response-002", [text("Done.")], "stop"),
            ],
            tools=[tool],
        )
        assert result.status == "completed"
        assert received == [{"a": [], "b": [], "c": {"d": []}}]
        assert rebuilt == al.ToolCall("call-2", "anything", original.arguments)

    @pytest.mark.parametrize("make", NOT_PLAIN_JSON)
    def test_not_plain_arguments_fail_before_any_tool(self, make: Callable[[], Any]) -> None:
        """Plain JSON is dict with str keys, list, str, int, finite float, bool and None, with
        no object reachable twice; anything else fails the run before any tool of the
        batch runs, even a valid call before it (which streamed; the bad one did not)."""
        received: list[dict[str, Any]] = []
        good = al.ToolCall("call-probe-001", "probe", {"n": 1})
        bad = al.ToolCall("call-probe-002", "probe", make())
        model = FakeModel(tool_turn("response-001", good, bad), stop("response-002"))
        events, result, _ = run(model, tools=[probe_tool(received)])
        assert_failed(events, result, "MODEL_PROTOCOL_ERROR", "call-probe-002")
        assert_no_tool_ran(events, result, model, received)
        assert chunk_event_count(events) == 1
        assert model.finalized == ["request-001"]

    @pytest.mark.parametrize(
        ("arguments", "limit"),
        [
            pytest.param({"deep": nested(100_000, "array")}, "32", id="arrays-100000-deep"),
            pytest.param(nested(100_000, "object"), "32", id="objects-100000-deep"),
        ],
    )
    @pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "terminal-response-only"])
    def test_arguments_far_past_a_bound_fail_without_recursion_error(
        self, arguments: Any, limit: str, streamed: bool
    ) -> None:
        """A pathological nesting is found at the 33rd level, not by exhausting the stack,
        and the same where only the terminal response holds the call."""
        received: list[dict[str, Any]] = []
        bad = al.ToolCall("call-probe-001", "probe", arguments)  # does not raise
        response = al.scripted_response(
            "response-001", [bad], "toolCall", chunks=None if streamed else []
        )
        events, result, model = run([response], tools=[probe_tool(received)])
        assert_failed(events, result, "MODEL_PROTOCOL_ERROR", limit)
        assert_no_tool_ran(events, result, model, received)
        assert chunk_event_count(events) == 0  # a streamed bad call gets no chunk event

    @pytest.mark.parametrize("make", NOT_PLAIN_JSON)
    def test_tool_call_construction_never_raises(self, make: Callable[[], Any]) -> None:
        """The documented choice (ToolCall's docstring): the constructor
        never rejects arguments, it keeps them for the loop to reject."""
        tool_call = al.ToolCall("call-001", "probe", make())
        assert tool_call.id == "call-001"
        assert tool_call.name == "probe"

    def test_tuples_are_accepted_as_arrays(self) -> None:
        """Frozen arrays are tuples, so a tuple is an array; the tool receives lists."""
        events, result, _, received = run_probe_call({"xs": (1, (2, "three"), [])})
        assert_tool_received(events, result, received, {"xs": [1, [2, "three"], []]})
        assert type(received[0]["xs"][1]) is list

    def test_frozen_arguments_of_another_call_are_accepted(self) -> None:
        """A call built from another call's (frozen) arguments is plain JSON and equal."""
        first = al.ToolCall("call-probe-001", "probe", {"o": {"k": [1, None]}, "s": "x"})
        events, result, _, received = run_probe_call(first.arguments)
        assert_tool_received(events, result, received, {"o": {"k": [1, None]}, "s": "x"})
        assert al.ToolCall("call-probe-001", "probe", first.arguments) == first

    def test_equal_scalars_may_repeat(self) -> None:
        """Only a container reachable twice is a violation: the same string or number may
        appear any number of times."""
        same = "same"
        arguments = {"a": same, "b": same, "c": [same, same], "d": 1, "e": 1, "f": [[], []]}
        events, result, _, received = run_probe_call(arguments)
        assert_tool_received(events, result, received, arguments)


class TestInvalidToolCallArguments:
    """ToolCall's docstring: "arguments that are not plain bounded JSON are kept as
    given, and the run that receives such a call fails with MODEL_PROTOCOL_ERROR before
    any tool runs (execute_tool_call makes it an error result)"."""

    def test_a_mapping_whose_items_raise_is_kept_as_a_plain_copy(self) -> None:
        class Grumpy(typing.Mapping[str, Any]):
            def __getitem__(self, key: str) -> object:
                return {"a": 1}[key]

            def __iter__(self) -> Iterator[str]:
                return iter(["a"])

            def __len__(self) -> int:
                return 1

            def items(self) -> Any:
                raise RuntimeError("no items today")

        grumpy = untyped.ToolCall("c1", "echo", MappingProxyType(Grumpy()))
        assert type(grumpy.arguments) is dict
        assert grumpy.arguments == {"a": 1}
        _, result, _ = run([tool_turn("r1", grumpy)], [echo_tool()])
        assert "not plain bounded JSON when the call was built" in failure_message(
            result, "MODEL_PROTOCOL_ERROR"
        )

    def test_invalid_arguments_in_a_read_only_mapping_are_kept_as_a_plain_dict(self) -> None:
        arguments = MappingProxyType({"bad": float("nan")})
        call = al.ToolCall("c1", "t", arguments)
        assert type(call.arguments) is dict
        assert dict(call.arguments) == dict(arguments)

    def test_the_run_fails_before_any_tool_runs(self) -> None:
        ran: List[str] = []
        tool = no_arguments_tool("t", lambda a, s: ran.append("ran"))
        call = al.ToolCall("c1", "t", cast(Any, MappingProxyType({"bad": {1, 2}})))
        _, result, _ = run(
            al.ScriptedModel([al.scripted_response("r1", [call], "toolCall")]), tools=[tool]
        )
        assert "arguments hold a set, which is not plain JSON" in failure_message(
            result, "MODEL_PROTOCOL_ERROR"
        )
        assert ran == []

    def test_arguments_made_valid_after_construction_still_fail(self) -> None:
        arguments: Dict[str, Any] = {"bad": float("inf")}
        call = al.ToolCall("c1", "t", arguments)
        assert call.arguments is arguments
        arguments["bad"] = 1.0  # now plain JSON, but not when the call was built
        ran: List[str] = []
        tool = no_arguments_tool("t", lambda a, s: ran.append("ran"))
        _, result, _ = run(
            al.ScriptedModel([al.scripted_response("r1", [call], "toolCall")]), tools=[tool]
        )
        assert failure_message(result, "MODEL_PROTOCOL_ERROR") == (
            "tool call 'c1': arguments were not plain bounded JSON when the call was built"
        )
        assert ran == []
        message = al.execute_tool_call(al.ToolRegistry([tool]), call, threading.Event())
        assert message == al.ToolResultMessage(
            "tool-result-c1",
            "c1",
            "t",
            "invalid arguments for tool 't': arguments were not plain bounded JSON when "
            "the call was built",
            True,
        )
        assert ran == []

    @pytest.mark.parametrize(
        ("arguments", "kind"),
        [pytest.param([1], "list", id="list"), pytest.param("text", "str", id="str"),
         pytest.param(None, "NoneType", id="None")],
    )  # fmt: skip
    def test_arguments_that_are_not_an_object_are_named_so(
        self, arguments: Any, kind: str
    ) -> None:
        """The run's failure and execute_tool_call's error result both say what the
        arguments are instead of an object."""
        problem = f"arguments must be a JSON object, got {kind}"
        ran: List[str] = []
        tool = no_arguments_tool("t", lambda a, s: ran.append("ran"))
        tool_call = al.ToolCall("c1", "t", arguments)
        _, result, _ = run([tool_turn("r1", tool_call)], tools=[tool])
        assert failure_message(result, "MODEL_PROTOCOL_ERROR") == f"tool call 'c1': {problem}"
        message = al.execute_tool_call(al.ToolRegistry([tool]), tool_call, threading.Event())
        assert (message.content, message.is_error) == (
            f"invalid arguments for tool 't': {problem}",
            True,
        )
        assert ran == []

    def test_arguments_that_cannot_be_read_fail_where_they_enter(self) -> None:
        """Nested, a read-only view of a mapping whose own items() raises: the run fails
        before any tool runs, the start is INVALID_TRANSCRIPT, and execute_tool_call
        gives an error result; none of them raises."""

        class Unreadable(collections.abc.Mapping):  # type: ignore[type-arg]
            def __getitem__(self, key: str) -> int:
                return 1

            def __iter__(self) -> Iterator[str]:
                return iter(["a"])

            def __len__(self) -> int:
                return 1

            def items(self) -> Any:
                raise RuntimeError("no items today")

        problem = "arguments cannot be read: RuntimeError: no items today"
        unreadable = untyped.ToolCall("c1", "t", {"nested": MappingProxyType(Unreadable())})
        ran: List[str] = []
        tool = no_arguments_tool("t", lambda a, s: ran.append("ran"))
        _, result, _ = run([tool_turn("r1", unreadable)], tools=[tool])
        assert failure_message(result, "MODEL_PROTOCOL_ERROR") == f"tool call 'c1': {problem}"
        start = [user(), assistant("r0", unreadable)]
        _, started, model = run([], messages=start)
        assert problem in failure_message(started, "INVALID_TRANSCRIPT")
        message = al.execute_tool_call(al.ToolRegistry([tool]), unreadable, threading.Event())
        assert (message.content, message.is_error) == (
            f"invalid arguments for tool 't': {problem}",
            True,
        )
        assert ran == []
        assert model.call_count == 0


# --- Message IR --------------------------------------------------------------------------


def ir_instances() -> list[Any]:
    return [
        al.TextBlock("hello"),
        al.ToolCall("call-001", "add", {"left": 1, "right": 2}),
        al.UserMessage("user-001", "hi"),
        al.AssistantMessage("message-001", (al.TextBlock("hello"),)),
        al.ToolResultMessage("tool-result-call-001", "call-001", "add", "3", False),
    ]


class TestToolCallIsFrozen:
    """The Message IR is frozen dataclasses compared by value: the run's transcript never
    changes under anyone."""

    @pytest.mark.parametrize(
        ("index", "field_name"),
        [
            pytest.param(0, "text", id="TextBlock"),
            pytest.param(1, "arguments", id="ToolCall"),
            pytest.param(1, "id", id="ToolCall-id"),
            pytest.param(2, "content", id="UserMessage"),
            pytest.param(3, "content", id="AssistantMessage"),
            pytest.param(4, "is_error", id="ToolResultMessage"),
        ],
    )
    def test_ir_classes_are_frozen(self, index: int, field_name: str) -> None:
        instance = ir_instances()[index]
        before = getattr(instance, field_name)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(instance, field_name, "changed")
        assert getattr(instance, field_name) is before

    def test_ir_classes_compare_by_value(self) -> None:
        assert ir_instances() == ir_instances()
        assert al.TextBlock("a") != al.TextBlock("b")
        assert al.UserMessage("user-001", "a") != al.UserMessage("user-002", "a")
        assert al.ToolResultMessage("r", "c", "t", "x", False) != al.ToolResultMessage(
            "r", "c", "t", "x", True
        )
        assert al.ToolCall("c", "t", {}) != al.ToolCall("d", "t", {})
        assert al.ToolCall("c", "t", {}) != al.ToolCall("c", "u", {})
        assert al.ToolCall("c", "t", {}) != al.TextBlock("c")

    def test_mutating_the_callers_dict_changes_nothing(self) -> None:
        arguments: dict[str, Any] = {"xs": [1, 2], "o": {"k": "v"}}
        tool_call = al.ToolCall("call-001", "probe", arguments)
        arguments["xs"].append(3)
        arguments["o"]["k"] = "changed"
        arguments["new"] = True
        del arguments["o"]
        assert plain_copy(tool_call.arguments) == {"xs": [1, 2], "o": {"k": "v"}}

    def test_arguments_cannot_be_mutated(self) -> None:
        tool_call = al.ToolCall("call-001", "probe", {"xs": [1, 2], "o": {"k": "v"}})
        with pytest.raises(TypeError):
            tool_call.arguments["new"] = 1  # type: ignore[index]
        with pytest.raises(TypeError):
            del tool_call.arguments["xs"]  # type: ignore[attr-defined]
        with pytest.raises(TypeError):
            tool_call.arguments["o"]["k"] = "changed"  # type: ignore[index]
        assert type(tool_call.arguments["xs"]) is tuple
        assert plain_copy(tool_call.arguments) == {"xs": [1, 2], "o": {"k": "v"}}

    def test_calls_from_equal_arguments_are_equal(self) -> None:
        """Two ToolCalls built from equal arguments compare equal (key order and
        list-or-tuple do not matter)."""
        first = al.ToolCall("c", "t", {"a": [1, {"b": None}], "s": "x"})
        assert first == al.ToolCall("c", "t", {"s": "x", "a": [1, {"b": None}]})
        assert first == al.ToolCall("c", "t", {"a": (1, {"b": None}), "s": "x"})

    @pytest.mark.parametrize(
        ("left", "right"),
        [
            pytest.param({"x": 1}, {"x": True}, id="1-true"),
            pytest.param({"x": 1}, {"x": 1.0}, id="1-1.0"),
            pytest.param({"x": True}, {"x": 1.0}, id="true-1.0"),
            pytest.param({"x": 0}, {"x": False}, id="0-false"),
            pytest.param({"x": [1]}, {"x": [True]}, id="nested-array"),
            pytest.param({"x": {"y": 0}}, {"x": {"y": 0.0}}, id="nested-object"),
            pytest.param({"x": 1}, {"x": "1"}, id="1-string"),
            pytest.param({"x": [1]}, {"x": [1, 1]}, id="array-length"),
            pytest.param({"x": 1}, {"y": 1}, id="keys"),
        ],
    )
    def test_equality_is_json_strict(self, left: dict[str, Any], right: dict[str, Any]) -> None:
        """The documented choice: JSON equality is strict, True is not 1 and 1 is not 1.0;
        so are the assistant messages that hold such calls."""
        assert al.ToolCall("c", "t", left) != al.ToolCall("c", "t", right)
        assert al.AssistantMessage("m", (al.ToolCall("c", "t", left),)) != al.AssistantMessage(
            "m", (al.ToolCall("c", "t", right),)
        )

    def test_each_execution_gets_a_fresh_plain_dict_it_may_mutate(self) -> None:
        """A tool's execute receives a fresh plain dict (lists as list) that it may mutate
        freely without any effect on the transcript."""
        original: dict[str, Any] = {"xs": [1, 2], "o": {"k": "v"}, "s": "text"}
        received: list[dict[str, Any]] = []
        snapshots: list[dict[str, Any]] = []

        def execute(arguments: dict[str, Any], signal: Any) -> object:
            received.append(arguments)
            snapshots.append(copy.deepcopy(arguments))
            arguments["xs"].append(99)
            arguments["o"]["k"] = "mutated"
            arguments["added"] = True
            del arguments["s"]
            return "ok"

        tool = al.Tool("probe", "Mutates its arguments.", {"type": "object"}, execute)
        calls = [call("probe", "call-001", original), call("probe", "call-002", original)]
        events, result, model = run(
            [
                al.scripted_response("response-001", calls, "toolCall"),
                al.scripted_response("response-002", [text("done")], "stop"),
            ],
            tools=[tool],
        )
        check_run(events, result)
        assert result.status == "completed"
        assert snapshots == [original, original]
        assert received[0] is not received[1]
        for arguments in received:
            assert type(arguments) is dict
            assert type(arguments["xs"]) is list
            assert type(arguments["o"]) is dict
        assert result.messages[1] == al.AssistantMessage("message-response-001", tuple(calls))
        assert model.requests[1].messages[1] == al.AssistantMessage(
            "message-response-001", tuple(calls)
        )
        for message in (result.messages[1], model.requests[1].messages[1]):
            for block in message.content:
                assert plain_copy(block.arguments) == original  # type: ignore[union-attr]
        carried = [
            event.payload["tool_call"]
            for event in events
            if event.type in ("tool.started", "tool.finished")
        ] + [
            event.payload["chunk"].tool_call
            for event in events
            if isinstance(event.payload.get("chunk"), al.ToolCallChunk)
        ]
        assert len(carried) == 6  # two calls, each streamed, started and finished
        assert all(plain_copy(tool_call.arguments) == original for tool_call in carried)

    @pytest.mark.parametrize(
        "make",
        [
            pytest.param(lambda blocks: al.AssistantMessage("m", blocks), id="AssistantMessage"),
            pytest.param(lambda blocks: al.ModelResponse("r", "q", blocks, "stop"), id="Response"),
        ],
    )
    def test_content_given_as_a_list_is_stored_as_a_tuple(
        self, make: Callable[[list[Any]], Any]
    ) -> None:
        blocks: list[Any] = [al.TextBlock("a"), al.ToolCall("c", "t", {})]
        instance = make(blocks)
        blocks.append(al.TextBlock("later"))
        assert type(instance.content) is tuple
        assert instance.content == (al.TextBlock("a"), al.ToolCall("c", "t", {}))

    def test_a_scripts_content_and_chunks_given_as_lists_are_stored_as_tuples(self) -> None:
        """ScriptedResponse is a frozen value like the IR: what the caller does to its
        lists afterwards does not change the script."""
        for build in (al.ScriptedResponse, al.scripted_response):
            content: list[Any] = [al.TextBlock("ab")]
            chunks: list[Any] = [al.TextBlock("a"), al.TextBlock("b")]
            response = build("r", content, "stop", chunks=chunks)
            content.append(al.TextBlock("later"))
            chunks.append(al.TextBlock("later"))
            assert (type(response.content), type(response.chunks)) == (tuple, tuple)
            assert response.content == (al.TextBlock("ab"),)
            assert response.chunks == (al.TextBlock("a"), al.TextBlock("b"))

    def test_discriminators_have_the_protocol_values(self) -> None:
        """Protocol values are spelled as in the seed ("toolResult", "toolCall")."""
        text_block, tool_call, user_message, assistant, tool_result = ir_instances()
        assert text_block.type == "text"
        assert tool_call.type == "toolCall"
        assert user_message.role == "user"
        assert assistant.role == "assistant"
        assert tool_result.role == "toolResult"
        assert al.TextDelta("request-001", "a").type == "text"
        assert al.ToolCallChunk("request-001", tool_call).type == "toolCall"


class TestPlainArguments:
    """ToolCall.plain_arguments(): a fresh plain copy (dicts and lists) of a
    call's arguments, ready for json.dumps."""

    ARGUMENTS: ClassVar[Dict[str, Any]] = {"a": [1, {"b": [True, None, 1.5]}], "c": {"d": "e"}}

    def test_plain_types_at_every_depth(self) -> None:
        plain = al.ToolCall("c1", "t", self.ARGUMENTS).plain_arguments()
        assert plain == self.ARGUMENTS
        assert type(plain) is dict
        assert type(plain["a"]) is list
        assert type(plain["a"][1]) is dict
        assert type(plain["a"][1]["b"]) is list
        assert type(plain["c"]) is dict

    def test_json_dumps_accepts_it(self) -> None:
        plain = al.ToolCall("c1", "t", self.ARGUMENTS).plain_arguments()
        assert json.loads(json.dumps(plain)) == self.ARGUMENTS

    def test_a_fresh_copy_each_time_that_mutation_does_not_reach(self) -> None:
        call = al.ToolCall("c1", "t", self.ARGUMENTS)
        first = call.plain_arguments()
        second = call.plain_arguments()
        assert first is not second
        assert first["a"] is not second["a"]
        first["a"][1]["b"].append("changed")
        first["new"] = 1
        assert call.plain_arguments() == self.ARGUMENTS
        assert call == al.ToolCall("c1", "t", self.ARGUMENTS)


NUMBERS_20_22 = {"left": 20, "right": 22}


class TestCopyingAndHashing:
    """Messages, events, requests and results survive pickle and copy.deepcopy, equal to
    the originals; a read-only mapping cannot be pickled, so each is rebuilt from plain
    JSON and frozen again. A value that holds a mapping says __hash__ = None; messages
    and blocks hash."""

    def test_an_event_keeps_a_read_only_payload_and_copies_any_other(self) -> None:
        read_only = MappingProxyType({"message": user()})
        assert al.Event(0, "message.accepted", read_only).payload is read_only
        plain = {"message": user()}
        event = al.Event(0, "message.accepted", plain)
        plain["message"] = user("changed", "user-002")
        assert event.payload["message"] == user()
        assert isinstance(event.payload, MappingProxyType)
        with pytest.raises(TypeError):
            event.payload["message"] = user("x", "user-003")  # type: ignore[index]

    def _recorded(self) -> tuple[list[al.Event], al.RunResult, FakeModel]:
        return run(
            [
                tool_turn("response-001", text("Adding."), call("add", "call-1", NUMBERS_20_22)),
                stop("response-002"),
            ],
            tools=[add_tool()],
        )

    @pytest.mark.parametrize(
        "duplicate",
        [
            pytest.param(lambda value: pickle.loads(pickle.dumps(value)), id="pickle"),
            pytest.param(copy.deepcopy, id="deepcopy"),
            pytest.param(copy.copy, id="copy"),
        ],
    )
    def test_results_events_and_requests_copy_equal(self, duplicate: Callable[[Any], Any]) -> None:
        events, result, model = self._recorded()
        assert duplicate(result) == result
        assert [duplicate(event) for event in events] == events
        assert [duplicate(request) for request in model.requests] == model.requests
        copied_call = duplicate(result.messages[1].content[1])
        assert isinstance(copied_call.arguments, MappingProxyType)

    def test_a_pickled_request_holds_only_its_own_snapshot(self) -> None:
        """A loop-built request's snapshot is lazy; its pickle must not carry the
        messages that were appended after it."""
        _, result, model = self._recorded()
        pickled = pickle.dumps(model.requests[0])
        assert b"The sum is 42." not in pickled
        assert pickle.loads(pickled).messages == result.messages[:1]

    def test_tools_and_specs_copy_equal_and_stay_frozen(self) -> None:
        tool = al.Tool("echo", "Echoes.", {"type": "object"}, copy_echo)
        copied = pickle.loads(pickle.dumps(tool))
        assert copied == tool
        assert isinstance(copied.parameters, MappingProxyType)
        spec = pickle.loads(pickle.dumps(tool.spec()))
        assert spec == tool.spec()
        assert isinstance(spec.parameters, MappingProxyType)

    def test_a_spec_built_from_a_plain_dict_is_frozen(self) -> None:
        parameters: dict[str, Any] = {"type": "object", "properties": {}}
        spec = al.ToolSpec("echo", "Echoes.", parameters)
        parameters["type"] = "string"
        parameters["properties"]["text"] = {"type": "string"}
        assert type(spec.parameters) is MappingProxyType
        assert spec.parameters == {"type": "object", "properties": {}}
        with pytest.raises(TypeError):
            spec.parameters["type"] = "string"  # type: ignore[index]

    def test_messages_and_blocks_hash_by_value(self) -> None:
        first = call("add", "call-1", {"left": 1, "right": [2]})
        same = call("add", "call-1", {"left": 1, "right": [2]})
        assert hash(first) == hash(same)
        assert len({first, same}) == 1
        message = al.AssistantMessage("message-1", (text("Adding."), first))
        assert message in {al.AssistantMessage("message-1", [text("Adding."), same])}
        values: List[object] = [
            al.TextBlock("x"),
            al.UserMessage("u", "x"),
            al.ToolResultMessage("t", "c1", "t", "x", False),
        ]
        for value in values:
            assert hash(value) == hash(copy.deepcopy(value))

    def test_values_holding_mappings_are_unhashable(self) -> None:
        spec = al.ToolSpec("x", "d", {"type": "object"})
        values: List[object] = [
            al.Event(0, "run.finished", {"result": None}),
            no_arguments_tool("t", two_parameters),
            spec,
            al.ModelRequest("request-001", (), (spec,)),
        ]
        for value in values:
            with pytest.raises(TypeError):
                hash(value)


SIGNED = al.ThinkingBlock("Add first, then answer.", signature="sig-001")
REDACTED = al.ThinkingBlock("", signature="opaque-data", redacted=True)
FULL_USAGE = al.Usage(100, 20, 3000, 40, 5)


def thinking_assistant(usage: al.Usage | None = FULL_USAGE) -> al.AssistantMessage:
    """An assistant message with every kind of thinking block, in a mixed order, and usage."""
    return al.AssistantMessage(
        "message-response-001",
        (SIGNED, text("Adding."), REDACTED, al.ThinkingBlock(""), add_call()),
        usage,
    )


class TestThinkingBlocksAndUsage:
    """ThinkingBlock, ThinkingDelta and Usage: their fields, JSON (Pi's keys, absent when
    None or False) and round trips, and the sum of two Usages."""

    def test_a_thinking_block_is_written_as_pi_writes_it(self) -> None:
        assert al.ThinkingBlock("hmm").to_dict() == {"type": "thinking", "thinking": "hmm"}
        assert SIGNED.to_dict() == {
            "type": "thinking",
            "thinking": "Add first, then answer.",
            "thinkingSignature": "sig-001",
        }
        assert REDACTED.to_dict() == {
            "type": "thinking",
            "thinking": "",
            "thinkingSignature": "opaque-data",
            "redacted": True,
        }

    def test_a_thinking_delta_is_a_chunk_of_type_thinking(self) -> None:
        delta = al.ThinkingDelta("request-001", "Let me see")
        assert delta.type == "thinking"
        assert delta.to_dict() == {
            "type": "thinking",
            "requestId": "request-001",
            "thinking": "Let me see",
        }

    def test_usage_is_written_in_pis_keys_each_absent_when_unknown(self) -> None:
        assert FULL_USAGE.to_dict() == {
            "input": 100,
            "output": 20,
            "cacheRead": 3000,
            "cacheWrite": 40,
            "reasoning": 5,
        }
        assert al.Usage(output_tokens=0).to_dict() == {"output": 0}
        assert al.Usage().to_dict() == {}

    def test_usage_is_written_only_where_it_is_known(self) -> None:
        message = thinking_assistant()
        assert message.to_dict()["usage"] == FULL_USAGE.to_dict()
        assert "usage" not in thinking_assistant(None).to_dict()
        response = al.ModelResponse("r", "request-001", (), "stop", al.Usage(1, 2))
        assert response.to_dict()["usage"] == {"input": 1, "output": 2}
        assert "usage" not in al.ModelResponse("r", "request-001", (), "stop").to_dict()
        result = al.RunResult("completed", (), 1, final_text="", usage=al.Usage())
        assert result.to_dict()["usage"] == {}
        assert "usage" not in al.RunResult("completed", (), 1, final_text="").to_dict()

    @pytest.mark.parametrize("value", [0, 1, 10**12, None])
    def test_a_usage_count_is_none_or_an_int_at_least_zero(self, value: Any) -> None:
        for name in USAGE_FIELDS:
            assert getattr(al.Usage(**{name: value}), name) == value

    @pytest.mark.parametrize(
        ("value", "error", "words"),
        [
            pytest.param(-1, ValueError, "must be None or an int >= 0, got -1", id="negative"),
            pytest.param(True, TypeError, "must be None or an int, got bool", id="bool"),
            pytest.param(1.0, TypeError, "must be None or an int, got float", id="float"),
            pytest.param("3", TypeError, "must be None or an int, got str", id="str"),
        ],
    )
    def test_a_usage_count_of_another_kind_is_refused_when_built(
        self, value: Any, error: type[Exception], words: str
    ) -> None:
        for name in USAGE_FIELDS:
            with pytest.raises(error, match=re.escape(f"Usage {name} {words}")):
                al.Usage(**{name: value})

    def test_usages_add_field_by_field(self) -> None:
        assert FULL_USAGE + al.Usage(1, 2, 3, 4, 5) == al.Usage(101, 22, 3003, 44, 10)

    def test_a_sum_with_an_unknown_part_is_unknown(self) -> None:
        """ "a field that is None on either side is None in the sum"."""
        assert FULL_USAGE + al.Usage(1, 2, None, 4, None) == al.Usage(101, 22, None, 44, None)
        assert al.Usage(None, 2) + al.Usage(1, 2) == al.Usage(None, 4)
        assert FULL_USAGE + al.Usage() == al.Usage()

    def test_a_usage_adds_only_a_usage(self) -> None:
        usage: Any = FULL_USAGE
        with pytest.raises(TypeError):
            usage + object()
        with pytest.raises(TypeError):
            usage + {"input": 1}

    def test_text_from_assistant_leaves_thinking_out(self) -> None:
        assert al.text_from_assistant(thinking_assistant()) == "Adding."

    @pytest.mark.parametrize("usage", [FULL_USAGE, al.Usage(output_tokens=7), al.Usage(), None])
    def test_a_message_with_thinking_and_usage_round_trips_through_json(
        self, usage: al.Usage | None
    ) -> None:
        message = thinking_assistant(usage)
        again = al.message_from_dict(json.loads(json.dumps(message.to_dict())))
        assert again == message
        assert again.content == message.content  # the blocks in the model's order
        assert isinstance(again, al.AssistantMessage)
        assert again.usage == usage

    def test_events_with_thinking_and_usage_round_trip_through_json(self) -> None:
        message = thinking_assistant()
        events = [
            al.Event(0, "message.accepted", {"message": message}),
            al.Event(
                1,
                "model.chunk",
                {"request_id": "request-001", "chunk": al.ThinkingDelta("request-001", "Hm")},
            ),
            al.Event(
                2,
                "run.finished",
                {"result": al.RunResult("cancelled", (message,), 1, usage=FULL_USAGE)},
            ),
        ]
        for event in events:
            assert al.event_from_dict(json.loads(json.dumps(event.to_dict()))) == event

    def test_an_assistant_message_equals_another_only_with_the_same_usage(self) -> None:
        assert thinking_assistant() == thinking_assistant(al.Usage(100, 20, 3000, 40, 5))
        assert thinking_assistant() != thinking_assistant(None)
        assert hash(thinking_assistant()) == hash(thinking_assistant())


def thinking_dict(**fields: Any) -> dict[str, Any]:
    """An assistant message dict whose one block is a thinking block with these fields."""
    return {"id": "m", "role": "assistant", "content": [{"type": "thinking", **fields}]}


def usage_dict(**counts: Any) -> dict[str, Any]:
    """An assistant message dict with this usage."""
    return {"id": "m", "role": "assistant", "content": [], "usage": counts}


class TestMalformedThinkingAndUsageDicts:
    """A malformed thinking block, thinking chunk or usage raises ValueError naming the field."""

    @pytest.mark.parametrize(
        ("data", "field"),
        [
            pytest.param(thinking_dict(), r"message\.content\[0\]\.thinking is missing",
                         id="no-thinking"),
            pytest.param(thinking_dict(thinking=1),
                         r"message\.content\[0\]\.thinking must be a string, got int",
                         id="thinking-int"),
            pytest.param(thinking_dict(thinking="", thinkingSignature=7),
                         r"message\.content\[0\]\.thinkingSignature must be a string, got int",
                         id="signature-int"),
            pytest.param(thinking_dict(thinking="", thinkingSignature="s", redacted="yes"),
                         r"message\.content\[0\]\.redacted must be a boolean, got str",
                         id="redacted-str"),
            pytest.param(thinking_dict(thinking="secret", thinkingSignature="s", redacted=True),
                         r"message\.content\[0\]: a redacted thinking block .* got thinking "
                         r"'secret', signature 's'", id="redacted-with-thinking"),
            pytest.param(thinking_dict(thinking="", redacted=True),
                         r"message\.content\[0\]: a redacted thinking block .* signature None",
                         id="redacted-without-signature"),
            pytest.param({"id": "m", "role": "assistant", "content": [], "usage": 3},
                         r"message\.usage must be an object, got int", id="usage-int"),
            pytest.param(usage_dict(input="1"), r"message\.usage\.input must be an integer",
                         id="input-str"),
            pytest.param(usage_dict(output=2.0), r"message\.usage\.output must be an integer",
                         id="output-float"),
            pytest.param(usage_dict(cacheRead=True),
                         r"message\.usage\.cacheRead must be an integer, got bool",
                         id="cacheRead-bool"),
            pytest.param(usage_dict(cacheWrite=-1),
                         r"message\.usage\.cacheWrite must be >= 0, got -1",
                         id="cacheWrite-negative"),
            pytest.param(usage_dict(reasoning=[]),
                         r"message\.usage\.reasoning must be an integer, got list",
                         id="reasoning-list"),
        ],
    )  # fmt: skip
    def test_a_malformed_message_names_the_field(self, data: Any, field: str) -> None:
        with pytest.raises(ValueError, match=field):
            al.message_from_dict(data)

    def test_null_keys_are_absent_keys(self) -> None:
        """As for the other optional keys: null is read as absent."""
        data = {**thinking_dict(thinking="", thinkingSignature=None, redacted=None), "usage": None}
        assert al.message_from_dict(data) == al.AssistantMessage("m", (al.ThinkingBlock(""),))
        assert al.message_from_dict(usage_dict(input=None, output=3)) == al.AssistantMessage(
            "m", (), al.Usage(output_tokens=3)
        )

    @pytest.mark.parametrize(
        ("chunk", "field"),
        [
            pytest.param({"type": "thinking", "requestId": "request-001"},
                         r"event\.payload\.chunk\.thinking is missing", id="no-thinking"),
            pytest.param({"type": "thinking", "requestId": "request-001", "thinking": None},
                         r"event\.payload\.chunk\.thinking must be a string, got NoneType",
                         id="thinking-null"),
        ],
    )  # fmt: skip
    def test_a_malformed_thinking_chunk_names_the_field(self, chunk: Any, field: str) -> None:
        data = event_dict("model.chunk", {"requestId": "request-001", "chunk": chunk})
        with pytest.raises(ValueError, match=field):
            al.event_from_dict(data)

    def test_a_malformed_run_usage_names_the_field(self) -> None:
        data = event_dict("run.finished", {"result": {**RUN_RESULT_DICT, "usage": {"input": -5}}})
        with pytest.raises(ValueError, match=r"event\.payload\.result\.usage\.input must be >= 0"):
            al.event_from_dict(data)


# --- Interop and resumption -------------------------------------------------------------


EXTRA_ARGUMENTS: dict[str, Any] = {
    "text": 'héllo, wörld 🙂 \u2028 "quoted" \\ back',
    "meta": {
        "numbers": [0, -7, 2.5, 1.0, 1e-300, 12345678901234567890],
        "flags": [True, False],
        "nothing": None,
        "nested": {"deeper": [{"ключ": "значение"}, []], "empty": {}},
    },
}
"""Echo arguments with every JSON kind: nested, unicode, floats, bools, null."""


def recorded_responses() -> list[Any]:
    """A three-step script: text and a tool call; three calls of which two fail
    recoverably (bad arguments, unknown tool); then the answer."""
    return [
        al.scripted_response(
            "response-001",
            [text("Let me add."), call("add", "call-add-001", {"left": 20, "right": 22})],
            "toolCall",
        ),
        al.scripted_response(
            "response-002",
            [
                call("echo", "call-echo-001", EXTRA_ARGUMENTS),
                call("add", "call-add-002", {"left": "twenty", "right": 22}),
                call("missing", "call-missing-001", {}),
                text("Three calls; two will fail."),
            ],
            "toolCall",
        ),
        al.scripted_response("response-003", [text("The sum is 42. Ünïcödé 🙂")], "stop"),
    ]


def recorded_run() -> tuple[list[al.Event], al.RunResult, FakeModel]:
    return run(recorded_responses(), tools=[add_tool(), echo_tool()], max_steps=4)


class TestJsonShapes:
    """The JSON keys are the seed's (toolCallId, toolName, isError, stopReason, requestId,
    finalText, maxSteps, ...); each to_dict() is written out literally here."""

    def test_blocks(self) -> None:
        assert al.TextBlock("hi").to_dict() == {"type": "text", "text": "hi"}
        assert call("add", "call-1", {"left": 1, "right": [2.5, None]}).to_dict() == {
            "type": "toolCall",
            "id": "call-1",
            "name": "add",
            "arguments": {"left": 1, "right": [2.5, None]},
        }

    def test_messages(self) -> None:
        """Seed: {id: "tool-result-call-add-001", role: "toolResult", toolCallId:
        "call-add-001", toolName: "add", content: '{"sum":42}', isError: false}"""
        assert user().to_dict() == {"id": "user-001", "role": "user", "content": "Add 20 and 22."}
        assistant = al.AssistantMessage(
            "message-response-tool-001",
            (text("Adding."), call("add", "call-add-001", {"left": 20, "right": 22})),
        )
        assert assistant.to_dict() == {
            "id": "message-response-tool-001",
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Adding."},
                {
                    "type": "toolCall",
                    "id": "call-add-001",
                    "name": "add",
                    "arguments": {"left": 20, "right": 22},
                },
            ],
        }
        result = al.ToolResultMessage(
            "tool-result-call-add-001", "call-add-001", "add", '{"sum":42}', False
        )
        assert result.to_dict() == {
            "id": "tool-result-call-add-001",
            "role": "toolResult",
            "toolCallId": "call-add-001",
            "toolName": "add",
            "content": '{"sum":42}',
            "isError": False,
        }

    def test_chunks_and_response(self) -> None:
        add = call("add", "call-add-001", {"left": 20, "right": 22})
        add_json = {
            "type": "toolCall",
            "id": "call-add-001",
            "name": "add",
            "arguments": {"left": 20, "right": 22},
        }
        assert al.TextDelta("request-001", "Hel").to_dict() == {
            "type": "text",
            "requestId": "request-001",
            "text": "Hel",
        }
        assert al.ToolCallChunk("request-001", add).to_dict() == {
            "type": "toolCall",
            "requestId": "request-001",
            "toolCall": add_json,
        }
        response = al.ModelResponse("response-001", "request-001", (text("Hi"), add), "toolCall")
        assert response.to_dict() == {
            "id": "response-001",
            "requestId": "request-001",
            "content": [{"type": "text", "text": "Hi"}, add_json],
            "stopReason": "toolCall",
        }

    def test_request_and_tool_spec(self) -> None:
        """Public, and written in the same style."""
        request = al.ModelRequest("request-001", (user(),), (add_tool().spec(),))
        assert request.to_dict() == {
            "id": "request-001",
            "messages": [{"id": "user-001", "role": "user", "content": "Add 20 and 22."}],
            "tools": [{"name": "add", "description": "Adds two numbers.", "parameters": NUMBERS}],
        }
        assert type(request.to_dict()["tools"][0]["parameters"]["required"]) is list

    def test_run_error(self) -> None:
        error = al.RunError("MODEL_STREAM_ERROR", "boom")
        assert error.to_dict() == {"code": "MODEL_STREAM_ERROR", "message": "boom"}

    @pytest.mark.parametrize(
        ("result", "expected"),
        [
            pytest.param(
                al.RunResult("completed", (user(),), 1, final_text="Done."),
                {"status": "completed", "messages": [user().to_dict()], "steps": 1,
                 "finalText": "Done."},
                id="completed",
            ),
            pytest.param(
                al.RunResult("completed", (), 1, final_text=""),
                {"status": "completed", "messages": [], "steps": 1, "finalText": ""},
                id="completed-empty-text-is-kept",
            ),
            pytest.param(
                al.RunResult("maxSteps", (), 3, max_steps=3),
                {"status": "maxSteps", "messages": [], "steps": 3, "maxSteps": 3},
                id="maxSteps",
            ),
            pytest.param(
                al.RunResult("cancelled", (), 0),
                {"status": "cancelled", "messages": [], "steps": 0},
                id="cancelled",
            ),
            pytest.param(
                al.RunResult("failed", (), 0, error=al.RunError("INVALID_TRANSCRIPT", "bad")),
                {"status": "failed", "messages": [], "steps": 0,
                 "error": {"code": "INVALID_TRANSCRIPT", "message": "bad"}},
                id="failed",
            ),
        ],
    )  # fmt: skip
    def test_run_result_writes_optional_keys_only_when_set(
        self, result: al.RunResult, expected: dict[str, Any]
    ) -> None:
        assert result.to_dict() == expected

    def test_events_use_the_seeds_payload_keys(self) -> None:
        add = call("add", "call-add-001", {"left": 20, "right": 22})
        add_json = add.to_dict()
        outcome = al.ToolResultMessage(
            "tool-result-call-add-001", "call-add-001", "add", "42", False
        )
        finished = al.RunResult("cancelled", (user(),), 0)
        events = [
            al.Event(0, "message.accepted", {"message": user()}),
            al.Event(1, "model.chunk", {"request_id": "request-001",
                                        "chunk": al.TextDelta("request-001", "Hi")}),
            al.Event(2, "tool.started", {"request_id": "request-001", "tool_call": add}),
            al.Event(3, "tool.finished", {"request_id": "request-001", "tool_call": add,
                                          "tool_result": outcome}),
            al.Event(4, "run.finished", {"result": finished}),
        ]  # fmt: skip
        assert [event.to_dict() for event in events] == [
            {"sequence": 0, "type": "message.accepted", "payload": {"message": user().to_dict()}},
            {"sequence": 1, "type": "model.chunk",
             "payload": {"requestId": "request-001",
                         "chunk": {"type": "text", "requestId": "request-001", "text": "Hi"}}},
            {"sequence": 2, "type": "tool.started",
             "payload": {"requestId": "request-001", "toolCall": add_json}},
            {"sequence": 3, "type": "tool.finished",
             "payload": {"requestId": "request-001", "toolCall": add_json,
                         "toolResult": outcome.to_dict()}},
            {"sequence": 4, "type": "run.finished",
             "payload": {"result": {"status": "cancelled", "messages": [user().to_dict()],
                                    "steps": 0}}},
        ]  # fmt: skip

    def test_the_seeds_continuation_transcript_is_the_seeds_json(self) -> None:
        """Seed: the second request of the focused test, as the course spells it."""
        _, result, model = run(
            [
                al.scripted_response(
                    "response-tool-001",
                    [call("add", "call-add-001", {"left": 20, "right": 22})],
                    "toolCall",
                ),
                al.scripted_response("response-tool-002", [text("The sum is 42.")], "stop"),
            ],
            tools=[add_tool()],
            max_steps=2,
        )
        assert result.status == "completed"
        assert [message.to_dict() for message in model.requests[1].messages] == [
            {"id": "user-001", "role": "user", "content": "Add 20 and 22."},
            {
                "id": "message-response-tool-001",
                "role": "assistant",
                "content": [
                    {
                        "type": "toolCall",
                        "id": "call-add-001",
                        "name": "add",
                        "arguments": {"left": 20, "right": 22},
                    }
                ],
            },
            {
                "id": "tool-result-call-add-001",
                "role": "toolResult",
                "toolCallId": "call-add-001",
                "toolName": "add",
                "content": '{"sum":42}',
                "isError": False,
            },
        ]

    def test_tool_call_arguments_are_plain_json_and_a_fresh_copy_each_time(self) -> None:
        arguments = {"list": [1, {"inner": [True, None]}], "object": {"x": 1.5}}
        tool_call = call("echo", "call-1", arguments)
        first = tool_call.to_dict()["arguments"]
        assert type(first) is dict
        assert type(first["list"]) is list
        assert type(first["list"][1]) is dict
        assert type(first["list"][1]["inner"]) is list
        assert type(first["object"]) is dict
        assert json.loads(json.dumps(first)) == arguments
        second = tool_call.to_dict()["arguments"]
        assert first is not second
        assert first["list"] is not second["list"]
        first["list"][1]["inner"].append("changed")
        first["object"]["y"] = 2
        assert tool_call.to_dict()["arguments"] == arguments
        assert tool_call == call("echo", "call-1", arguments)

    def test_every_event_of_a_run_serialises_to_json(self) -> None:
        events, result, _ = recorded_run()
        assert result.status == "completed"
        for event in events:
            data = event.to_dict()
            assert set(data) == {"sequence", "type", "payload"}
            assert json.loads(json.dumps(data)) == data


def through_json(value: Any) -> Any:
    """A value after a trip through JSON text, as a log file would carry it."""
    return json.loads(json.dumps(value))


def slow_tool(executed: list[str]) -> al.Tool:
    """A tool that sets the run's signal while it runs (so its result is discarded)."""

    def slow(arguments: dict[str, Any], signal: Any) -> object:
        executed.append("slow")
        signal.set()
        return "too late"

    return al.Tool("slow", "Takes long enough to be cancelled.", {"type": "object"}, slow)


def runs_of_every_status() -> dict[str, tuple[list[al.Event], al.RunResult]]:
    """One real run for each RunResult status."""
    cancel_signal = threading.Event()
    cancelled = run(
        [
            al.scripted_response(
                "response-001",
                [text("Slowly."), call("slow", "call-slow-001", {"why": ["x"]})],
                "toolCall",
            )
        ],
        tools=[slow_tool([])],
        signal=cancel_signal,
    )
    failed = run(
        [al.scripted_response("response-001", [text("Hi")], "stop", request_id="request-999")]
    )
    max_steps = run(
        [
            al.scripted_response(
                "response-001", [call("add", "call-add-001", {"left": 1, "right": 2})], "toolCall"
            )
        ],
        tools=[add_tool()],
        max_steps=1,
    )
    events, result, _ = recorded_run()
    return {
        "completed": (events, result),
        "cancelled": cancelled[:2],
        "failed": failed[:2],
        "maxSteps": max_steps[:2],
    }


class TestRoundTrips:
    """message_from_dict(m.to_dict()) == m and event_from_dict(e.to_dict()) == e."""

    @pytest.mark.parametrize(
        "message",
        [
            pytest.param(user(), id="user"),
            pytest.param(user("Ünïcödé 🙂 \u0000 \n", "user-ü"), id="user-unicode"),
            pytest.param(user("", "user-empty"), id="user-empty-content"),
            pytest.param(al.AssistantMessage("message-r", ()), id="assistant-empty"),
            pytest.param(al.AssistantMessage("message-r", (text(""),)), id="assistant-empty-text"),
            pytest.param(
                al.AssistantMessage(
                    "message-r",
                    (
                        text("a"),
                        call("echo", "call-1", EXTRA_ARGUMENTS),
                        text("b"),
                        call("add", "call-2", {}),
                    ),
                ),
                id="assistant-mixed-nested",
            ),
            pytest.param(
                al.ToolResultMessage("tool-result-c", "c", "add", '{"sum":42}', False), id="ok"
            ),
            pytest.param(
                al.ToolResultMessage("tool-result-c", "c", "add", "no such tool", True), id="error"
            ),
        ],
    )
    def test_message(self, message: al.Message) -> None:
        assert al.message_from_dict(message.to_dict()) == message
        assert al.message_from_dict(through_json(message.to_dict())) == message
        assert type(al.message_from_dict(message.to_dict())) is type(message)

    @pytest.mark.parametrize(
        ("left", "right"),
        [
            pytest.param({"n": 1}, {"n": 1.0}, id="int-is-not-float"),
            pytest.param({"n": True}, {"n": 1}, id="bool-is-not-int"),
            pytest.param({"n": None}, {"n": False}, id="null-is-not-false"),
            pytest.param({"n": []}, {"n": {}}, id="array-is-not-object"),
        ],
    )
    def test_json_kinds_survive_json_text(
        self, left: dict[str, Any], right: dict[str, Any]
    ) -> None:
        """A trip through json.dumps/json.loads keeps each JSON kind: the copy equals its
        original and still differs from a look-alike of another kind."""
        original = al.AssistantMessage("message-r", (call("echo", "call-1", left),))
        look_alike = al.AssistantMessage("message-r", (call("echo", "call-1", right),))
        copy = al.message_from_dict(through_json(original.to_dict()))
        assert copy == original
        assert copy != look_alike

    @pytest.mark.parametrize("status", ["completed", "cancelled", "failed", "maxSteps"])
    def test_every_event_of_a_run_round_trips(self, status: str) -> None:
        events, result = runs_of_every_status()[status]
        assert result.status == status
        check_run(events, result)
        for event in events:
            assert al.event_from_dict(event.to_dict()) == event
            assert al.event_from_dict(through_json(event.to_dict())) == event

    def test_the_recorded_run_has_what_the_round_trip_must_carry(self) -> None:
        """The run used above holds text chunks, tool calls and a recoverable error."""
        events, result, _ = recorded_run()
        assert types_of(events) == (
            ["message.accepted"]
            + ["model.chunk"] * 2
            + ["tool.started", "tool.finished"]
            + ["model.chunk"] * 4
            + ["tool.started", "tool.finished"] * 3
            + ["model.chunk", "run.finished"]
        )
        errors = [
            event.payload["tool_result"].is_error
            for event in events
            if event.type == "tool.finished"
        ]
        assert errors == [False, False, True, True]
        assert result.final_text == "The sum is 42. Ünïcödé 🙂"

    def test_the_full_event_log_survives_json_text_exactly(self) -> None:
        events, result, _ = recorded_run()
        log = "\n".join(json.dumps(event.to_dict()) for event in events)
        rebuilt = [al.event_from_dict(json.loads(line)) for line in log.split("\n")]
        assert rebuilt == events
        assert "\n".join(json.dumps(event.to_dict()) for event in rebuilt) == log
        final = rebuilt[-1].payload["result"]
        assert isinstance(final, al.RunResult)
        assert final == result
        assert final.messages == result.messages

    def test_null_optional_result_fields_read_as_unset(self) -> None:
        """finalText, maxSteps and error may be absent or null: both mean "not set"."""
        unset = {"finalText": None, "maxSteps": None, "error": None}
        result: dict[str, Any] = {"status": "cancelled", "messages": [], "steps": 0, **unset}
        data = {"sequence": 0, "type": "run.finished", "payload": {"result": result}}
        assert al.event_from_dict(data) == al.Event(
            0, "run.finished", {"result": al.RunResult("cancelled", (), 0)}
        )


def event_dict(type: str, payload: Any, sequence: Any = 0) -> dict[str, Any]:
    return {"sequence": sequence, "type": type, "payload": payload}


def assistant_dict_with(arguments: Any) -> dict[str, Any]:
    block = {"type": "toolCall", "id": "c", "name": "n", "arguments": arguments}
    return {"id": "m", "role": "assistant", "content": [block]}


CALL_DICT = {"type": "toolCall", "id": "call-1", "name": "add", "arguments": {}}


TOOL_RESULT_DICT = {
    "id": "tool-result-call-1",
    "role": "toolResult",
    "toolCallId": "call-1",
    "toolName": "add",
    "content": "3",
    "isError": False,
}


RUN_RESULT_DICT = {"status": "completed", "messages": [], "steps": 1, "finalText": "ok"}


class TestMalformedDicts:
    """A malformed dict (a missing key, a value of the wrong JSON type, an unknown role,
    block type, event type or status) raises ValueError naming the field."""

    @pytest.mark.parametrize(
        ("data", "field"),
        [
            pytest.param([], r"^message must be an object", id="not-an-object"),
            pytest.param({"role": "user", "content": "hi"}, r"message\.id is missing", id="no-id"),
            pytest.param({"id": "u", "content": "hi"}, r"message\.role is missing", id="no-role"),
            pytest.param({"id": "u", "role": "user"}, r"message\.content is missing",
                         id="no-content"),
            pytest.param({"id": "u", "role": "system", "content": "hi"},
                         r"message\.role: unknown value 'system'", id="unknown-role"),
            pytest.param({"id": 7, "role": "user", "content": "hi"},
                         r"message\.id must be a string", id="id-int"),
            pytest.param({"id": "u", "role": "user", "content": 5},
                         r"message\.content must be a string, got int", id="content-int"),
            pytest.param({**TOOL_RESULT_DICT, "toolCallId": None}, r"message\.toolCallId",
                         id="toolCallId-null"),
            pytest.param({k: v for k, v in TOOL_RESULT_DICT.items() if k != "toolCallId"},
                         r"message\.toolCallId is missing", id="no-toolCallId"),
            pytest.param({k: v for k, v in TOOL_RESULT_DICT.items() if k != "toolName"},
                         r"message\.toolName is missing", id="no-toolName"),
            pytest.param({**TOOL_RESULT_DICT, "isError": "yes"},
                         r"message\.isError must be a boolean", id="isError-string"),
            pytest.param({**TOOL_RESULT_DICT, "isError": 1}, r"message\.isError must be a boolean",
                         id="isError-int"),
            pytest.param({"id": "a", "role": "assistant", "content": "hi"},
                         r"message\.content must be an array", id="assistant-content-string"),
            pytest.param({"id": "a", "role": "assistant", "content": ["hi"]},
                         r"message\.content\[0\] must be an object", id="block-not-object"),
            pytest.param({"id": "a", "role": "assistant", "content": [{"type": "image"}]},
                         r"message\.content\[0\]\.type: unknown value 'image'",
                         id="unknown-block-type"),
            pytest.param({"id": "a", "role": "assistant", "content": [{"text": "hi"}]},
                         r"message\.content\[0\]\.type is missing", id="block-without-type"),
            pytest.param({"id": "a", "role": "assistant",
                          "content": [{"type": "text", "text": "ok"}, {"type": "text"}]},
                         r"message\.content\[1\]\.text is missing", id="text-without-text"),
            pytest.param({"id": "a", "role": "assistant",
                          "content": [{**CALL_DICT, "name": 3}]},
                         r"message\.content\[0\]\.name must be a string", id="call-name-int"),
            pytest.param(assistant_dict_with([1, 2]),
                         r"message\.content\[0\]\.arguments must be an object, got list",
                         id="arguments-list"),
            pytest.param(assistant_dict_with(None), r"message\.content\[0\]\.arguments",
                         id="arguments-null"),
            pytest.param(assistant_dict_with(nested(al.MAX_ARGUMENT_DEPTH + 1)),
                         r"message\.content\[0\]\.arguments: .*deeper than 32",
                         id="arguments-too-deep"),
            pytest.param(assistant_dict_with({"a": [0] * al.MAX_ARGUMENT_SLOTS}),
                         r"message\.content\[0\]\.arguments: .*more than 257 values",
                         id="arguments-too-many-values"),
            pytest.param(assistant_dict_with({"a": "x" * al.MAX_ARGUMENT_TEXT}),
                         r"message\.content\[0\]\.arguments: .*code points",
                         id="arguments-too-much-text"),
            pytest.param(assistant_dict_with({"a": float("nan")}),
                         r"message\.content\[0\]\.arguments: .*not a JSON number",
                         id="arguments-nan"),
        ],
    )  # fmt: skip
    def test_message(self, data: Any, field: str) -> None:
        with pytest.raises(ValueError, match=field):
            al.message_from_dict(data)

    @pytest.mark.parametrize(
        "arguments",
        [
            pytest.param(nested(al.MAX_ARGUMENT_DEPTH), id="depth-at-limit"),
            pytest.param({"a": [0] * (al.MAX_ARGUMENT_SLOTS - 1)}, id="values-at-limit"),
            pytest.param({"a": "x" * (al.MAX_ARGUMENT_TEXT - 1)}, id="text-at-limit"),
        ],
    )
    def test_arguments_at_the_bounds_are_read(self, arguments: dict[str, Any]) -> None:
        """The over-limit twins of these are in test_message."""
        message = al.message_from_dict(assistant_dict_with(arguments))
        assert isinstance(message, al.AssistantMessage)
        assert message.content[0] == al.ToolCall("c", "n", arguments)

    def test_nan_from_json_text_is_rejected(self) -> None:
        """json.loads accepts NaN, which is not JSON: the reader must not."""
        line = (
            '{"id":"m","role":"assistant","content":[{"type":"toolCall","id":"c",'
            '"name":"n","arguments":{"x":NaN}}]}'
        )
        with pytest.raises(ValueError, match=r"arguments: .*not a JSON number"):
            al.message_from_dict(json.loads(line))

    @pytest.mark.parametrize(
        ("data", "field"),
        [
            pytest.param("event", r"^event must be an object", id="not-an-object"),
            pytest.param({"type": "message.accepted", "payload": {"message": user().to_dict()}},
                         r"event\.sequence is missing", id="no-sequence"),
            pytest.param(event_dict("message.accepted", {"message": user().to_dict()}, "1"),
                         r"event\.sequence must be an integer, got str", id="sequence-string"),
            pytest.param(event_dict("message.accepted", {"message": user().to_dict()}, True),
                         r"event\.sequence must be an integer, got bool", id="sequence-true"),
            pytest.param(event_dict("message.accepted", {"message": user().to_dict()}, 1.0),
                         r"event\.sequence must be an integer, got float", id="sequence-float"),
            pytest.param({"sequence": 0, "payload": {}}, r"event\.type is missing", id="no-type"),
            pytest.param(event_dict("agent_start", {}),
                         r"event\.type: unknown value 'agent_start'", id="unknown-type"),
            pytest.param(event_dict("message.accepted", [user().to_dict()]),
                         r"event\.payload must be an object, got list", id="payload-list"),
            pytest.param({"sequence": 0, "type": "message.accepted"},
                         r"event\.payload is missing", id="no-payload"),
            pytest.param(event_dict("message.accepted", {}), r"event\.payload\.message",
                         id="no-message"),
            pytest.param(event_dict("message.accepted", {"message": {"id": "u", "role": "user"}}),
                         r"event\.payload\.message\.content is missing", id="message-malformed"),
            pytest.param(event_dict("model.chunk",
                                   {"chunk": {"type": "text", "requestId": "r", "text": "x"}}),
                         r"event\.payload\.requestId", id="no-requestId"),
            pytest.param(event_dict("model.chunk", {"requestId": 1, "chunk": {}}),
                         r"event\.payload\.requestId must be a string, got int",
                         id="requestId-int"),
            pytest.param(event_dict("model.chunk", {"requestId": "r"}), r"event\.payload\.chunk",
                         id="no-chunk"),
            pytest.param(event_dict("model.chunk", {"requestId": "r",
                                                   "chunk": {"type": "image", "requestId": "r"}}),
                         r"event\.payload\.chunk\.type: unknown value 'image'",
                         id="unknown-chunk-type"),
            pytest.param(event_dict("model.chunk", {"requestId": "r",
                                                   "chunk": {"type": "text", "text": "x"}}),
                         r"event\.payload\.chunk\.requestId is missing", id="chunk-no-requestId"),
            pytest.param(event_dict("model.chunk",
                                   {"requestId": "r",
                                    "chunk": {"type": "toolCall", "requestId": "r",
                                              "toolCall": {"type": "text", "text": "x"}}}),
                         r"event\.payload\.chunk\.toolCall must be a toolCall block",
                         id="chunk-toolCall-is-text"),
            pytest.param(event_dict("tool.started", {"requestId": "r",
                                                    "toolCall": {"type": "text", "text": "x"}}),
                         r"event\.payload\.toolCall must be a toolCall block",
                         id="started-toolCall-is-text"),
            pytest.param(event_dict("tool.started", {"requestId": "r"}),
                         r"event\.payload\.toolCall", id="started-no-toolCall"),
            pytest.param(event_dict("tool.started", {"requestId": "r",
                                                    "toolCall": {**CALL_DICT, "arguments": []}}),
                         r"event\.payload\.toolCall\.arguments must be an object",
                         id="started-arguments-list"),
            pytest.param(event_dict("tool.finished", {"requestId": "r", "toolCall": CALL_DICT,
                                                     "toolResult": user().to_dict()}),
                         r"event\.payload\.toolResult must be a toolResult message",
                         id="finished-toolResult-is-user"),
            pytest.param(event_dict("tool.finished", {"requestId": "r", "toolCall": CALL_DICT}),
                         r"event\.payload\.toolResult", id="finished-no-toolResult"),
            pytest.param(event_dict("tool.finished", {"requestId": "r", "toolCall": CALL_DICT,
                                                     "toolResult": {**TOOL_RESULT_DICT,
                                                                    "isError": "no"}}),
                         r"event\.payload\.toolResult\.isError must be a boolean",
                         id="finished-isError-string"),
            pytest.param(event_dict("run.finished", {}), r"event\.payload\.result",
                         id="no-result"),
            pytest.param(event_dict("run.finished", {"result": {**RUN_RESULT_DICT, "steps": 1.5}}),
                         r"event\.payload\.result\.steps must be an integer, got float",
                         id="steps-float"),
            pytest.param(event_dict("run.finished",
                                   {"result": {k: v for k, v in RUN_RESULT_DICT.items()
                                               if k != "steps"}}),
                         r"event\.payload\.result\.steps is missing", id="no-steps"),
            pytest.param(event_dict("run.finished", {"result": {**RUN_RESULT_DICT,
                                                               "status": "done"}}),
                         r"event\.payload\.result\.status: unknown value 'done'",
                         id="unknown-status"),
            pytest.param(event_dict("run.finished", {"result": {**RUN_RESULT_DICT,
                                                               "messages": {}}}),
                         r"event\.payload\.result\.messages must be an array",
                         id="messages-object"),
            pytest.param(event_dict("run.finished",
                                   {"result": {**RUN_RESULT_DICT,
                                               "messages": [user().to_dict(), {"id": "x"}]}}),
                         r"event\.payload\.result\.messages\[1\]\.role is missing",
                         id="result-message-malformed"),
            pytest.param(event_dict("run.finished", {"result": {**RUN_RESULT_DICT,
                                                               "finalText": 5}}),
                         r"event\.payload\.result\.finalText must be a string",
                         id="finalText-int"),
            pytest.param(event_dict("run.finished", {"result": {**RUN_RESULT_DICT,
                                                               "maxSteps": "1"}}),
                         r"event\.payload\.result\.maxSteps must be an integer",
                         id="maxSteps-string"),
            pytest.param(event_dict("run.finished", {"result": {**RUN_RESULT_DICT,
                                                               "error": "boom"}}),
                         r"event\.payload\.result\.error must be an object",
                         id="error-string"),
            pytest.param(event_dict("run.finished",
                                   {"result": {**RUN_RESULT_DICT,
                                               "error": {"code": "OOPS", "message": "m"}}}),
                         r"event\.payload\.result\.error\.code: unknown value 'OOPS'",
                         id="unknown-error-code"),
            pytest.param(event_dict("run.finished",
                                   {"result": {**RUN_RESULT_DICT,
                                               "error": {"code": "MODEL_STREAM_ERROR"}}}),
                         r"event\.payload\.result\.error\.message is missing",
                         id="error-no-message"),
        ],
    )  # fmt: skip
    def test_event(self, data: Any, field: str) -> None:
        with pytest.raises(ValueError, match=field):
            al.event_from_dict(data)

    def test_a_rejected_dict_is_left_unchanged(self) -> None:
        data = event_dict(
            "tool.finished",
            {"requestId": "r", "toolCall": CALL_DICT, "toolResult": user().to_dict()},
        )
        before = json.dumps(data, sort_keys=True)
        with pytest.raises(ValueError, match="toolResult"):
            al.event_from_dict(data)
        assert json.dumps(data, sort_keys=True) == before


def drain_stream(
    stream: Generator[al.ModelChunk, None, al.ModelResponse],
) -> tuple[list[al.ModelChunk], al.ModelResponse]:
    """Drains one model stream; returns its chunks and its terminal response."""
    chunks: list[al.ModelChunk] = []
    while True:
        try:
            chunks.append(next(stream))
        except StopIteration as done:
            return chunks, done.value


def replay_added(
    recorded: al.RunResult, start: Sequence[al.Message], tools: Sequence[al.Tool]
) -> tuple[list[al.Event], al.RunResult, al.ScriptedModel]:
    """Replays the part of a recorded transcript that the run added, from the same start."""
    model = al.ScriptedModel.from_transcript(recorded.messages[len(start) :])
    events, result, _ = run(model, tools, messages=start, max_steps=4)
    return events, result, model


class TestScriptedModelFromTranscript:
    """Running the loop again from the same starting messages, with tools that behave the
    same, reproduces the recorded transcript exactly."""

    def test_an_id_without_the_message_prefix_is_the_response_id_itself(self) -> None:
        """(ScriptedModel.from_transcript) Response id = message id without its "message-"
        prefix; an id without it is taken whole."""
        history = [
            al.AssistantMessage("message-r1", [al.TextBlock("one")]),
            al.AssistantMessage("a2", [al.TextBlock("two")]),
        ]
        model = al.ScriptedModel.from_transcript(history)
        _, first = al.settle_run(
            al.run_agent_loop(messages=[user()], model=model, tools=al.ToolRegistry(), max_steps=1)
        )
        _, second = al.settle_run(
            al.run_agent_loop(messages=[user()], model=model, tools=al.ToolRegistry(), max_steps=1)
        )
        assert [first.messages[-1].id, second.messages[-1].id] == ["message-r1", "message-a2"]

    def test_replay_reproduces_the_transcript_and_the_events(self) -> None:
        events, result, recorder = recorded_run()
        assert result.status == "completed"
        assert result.steps == 3
        replayed_events, replayed, model = replay_added(
            result, [user()], [add_tool(), echo_tool()]
        )
        assert replayed.messages == result.messages
        assert replayed == result
        assert types_of(replayed_events) == types_of(events)
        assert replayed_events == events
        assert [event.to_dict() for event in replayed_events] == [
            event.to_dict() for event in events
        ]
        assert model.call_count == 3
        assert model.requests == recorder.requests

    def test_replay_of_a_transcript_read_back_from_json(self) -> None:
        """A transcript saved as JSON text and read back replays the same run."""
        _, result, _ = recorded_run()
        saved = json.dumps([message.to_dict() for message in result.messages])
        loaded = tuple(al.message_from_dict(data) for data in json.loads(saved))
        assert loaded == result.messages
        _, replayed, _ = replay_added(
            al.RunResult("completed", loaded, 3), [user()], [add_tool(), echo_tool()]
        )
        assert replayed == result

    def test_replay_reproduces_the_transcript_even_when_chunking_differed(self) -> None:
        """The replay streams one chunk per block: the transcript is the same, the
        model.chunk events may be fewer."""
        events, result, _ = run(
            [
                al.scripted_response(
                    "response-001",
                    [text("Hello, world.")],
                    "stop",
                    chunks=[text("Hel"), text("lo, "), text("world.")],
                )
            ]
        )
        replayed_events, replayed, _ = replay_added(result, [user()], [])
        assert replayed == result
        assert types_of(events).count("model.chunk") == 3
        assert types_of(replayed_events).count("model.chunk") == 1

    def test_from_transcript_derives_response_ids_and_stop_reasons(self) -> None:
        add = call("add", "call-add-001", {"left": 20, "right": 22})
        transcript: list[al.Message] = [
            user(),
            al.AssistantMessage("message-response-001", (text("Adding."), add)),
            al.ToolResultMessage("tool-result-call-add-001", "call-add-001", "add", "42", False),
            al.AssistantMessage("message-response-002", (text("The sum is 42."),)),
            user("And now?", "user-002"),
            al.AssistantMessage("message-response-003", ()),
        ]
        model = al.ScriptedModel.from_transcript(transcript)
        expected: list[tuple[str, tuple[Any, ...], Any]] = [
            ("response-001", (text("Adding."), add), "toolCall"),
            ("response-002", (text("The sum is 42."),), "stop"),
            ("response-003", (), "stop"),
        ]
        for step, (response_id, content, stop_reason) in enumerate(expected, start=1):
            request = al.ModelRequest(f"request-{step:03d}", (), ())
            chunks, response = drain_stream(model.stream(request, threading.Event()))
            assert response == al.ModelResponse(response_id, request.id, content, stop_reason)
            assert all(chunk.request_id == request.id for chunk in chunks)
            assert len(chunks) == len(content)
        # Only assistant messages became responses: a fourth request has none left.
        with pytest.raises(RuntimeError):
            model.stream(al.ModelRequest("request-004", (), ()), threading.Event())
        assert model.call_count == 4

    def test_from_transcript_accepts_any_iterable(self) -> None:
        message = al.AssistantMessage("message-response-001", (text("Hi"),))
        model = al.ScriptedModel.from_transcript(iter([message]))
        _, result, _ = run(model, max_steps=8)
        assert result.status == "completed"
        assert result.messages == (user(), message)

    def test_history_must_be_left_out_of_the_replayed_part(self) -> None:
        """Every assistant message given is replayed, so when the start held history,
        pass only the part that the run added."""
        history: list[al.Message] = [
            user("Hi.", "user-000"),
            al.AssistantMessage("message-response-000", (text("Hello."),)),
            user(),
        ]
        _, recorded, _ = run(
            [
                al.scripted_response(
                    "response-001",
                    [call("add", "call-add-001", {"left": 20, "right": 22})],
                    "toolCall",
                ),
                al.scripted_response("response-002", [text("42.")], "stop"),
            ],
            messages=history,
            tools=[add_tool()],
        )
        assert recorded.status == "completed"
        _, replayed, _ = replay_added(recorded, history, [add_tool()])
        assert replayed == recorded
        # Passed whole, the old turn is replayed first: its message id is taken already.
        whole = al.ScriptedModel.from_transcript(recorded.messages)
        _, wrong, _ = run(whole, [add_tool()], messages=history, max_steps=8)
        assert wrong.status == "failed"
        assert wrong.error is not None
        assert wrong.error.code == "MODEL_PROTOCOL_ERROR"
        assert wrong.messages == tuple(history)
        assert whole.call_count == 1


class TestThinkingAndUsageResume:
    """A transcript holding thinking and usage starts a new run as it is (resumption), and
    ScriptedModel.from_transcript replays its thinking and its usage."""

    def test_a_transcript_with_thinking_and_usage_starts_a_new_run(self) -> None:
        _, first, _ = run(thinking_script(), [add_tool()])
        assert first.status == "completed"
        saved = json.dumps([message.to_dict() for message in first.messages])
        for start in (first.messages, [al.message_from_dict(m) for m in json.loads(saved)]):
            messages = [*start, user("And 1 and 2?", "user-002")]
            events, result, model = run([stop("response-003", "3.")], messages=messages)
            assert result.status == "completed"
            assert [e.payload["message"] for e in events[: len(messages)]] == messages
            assert model.requests[0].messages == (*first.messages, messages[-1])
            assert result.usage == al.Usage()  # its one response had no usage

    def test_from_transcript_replays_thinking_and_usage(self) -> None:
        events, recorded, _ = run(thinking_script(), [add_tool()])
        replayed_events, replayed, _ = replay_added(recorded, [user()], [add_tool()])
        assert replayed == recorded
        assert replayed.usage == al.Usage(942, 114, 4096, 0, None)
        # One chunk per block, a redacted one too (as an empty ThinkingDelta); the
        # recording streamed its thinking in two pieces, and nothing for the redacted block.
        replayed_chunks = [e.payload["chunk"] for e in replayed_events if e.type == "model.chunk"]
        assert replayed_chunks[:2] == [
            al.ThinkingDelta("request-001", "The user wants a sum; the add tool gives it."),
            al.ThinkingDelta("request-001", ""),
        ]
        assert events[1].payload["chunk"] == al.ThinkingDelta(
            "request-001", "The user wants a sum; "
        )


class TestNextRequestSequence:
    """RunResult.next_request_sequence says where the next run's request ids go on
    (request_sequence_start + steps), so that a run resumed twice does not repeat a
    request id."""

    def test_it_is_the_start_plus_the_steps(self) -> None:
        script = [tool_turn("r1", call("echo", "c1", {"text": "a"})), stop("r2", "Done.")]
        _, result = record_run(script, request_sequence_start=5)
        assert (result.request_sequence_start, result.steps) == (5, 2)
        assert result.next_request_sequence == 7

    def test_request_sequence_start_is_written_only_when_it_is_not_0(self) -> None:
        _, ordinary = record_run([stop("r1", "Done.")])
        assert "requestSequenceStart" not in ordinary.to_dict()
        _, resumed = record_run([stop("r1", "Done.")], request_sequence_start=3)
        assert resumed.to_dict()["requestSequenceStart"] == 3
        for result in (ordinary, resumed):
            event = al.Event(0, "run.finished", {"result": result})
            assert al.event_from_dict(json.loads(json.dumps(event.to_dict()))) == event

    def test_a_result_without_the_key_reads_as_0(self) -> None:
        data = {
            "sequence": 0,
            "type": "run.finished",
            "payload": {
                "result": {
                    "status": "cancelled",
                    "messages": [],
                    "steps": 0,
                    "requestSequenceStart": None,
                }
            },
        }
        result = al.event_from_dict(data).payload["result"]
        assert result.request_sequence_start == 0
        assert result.next_request_sequence == 0


def first_run(
    mode: str,
) -> tuple[list[al.Event], al.RunResult, list[str], al.ScriptedModel]:
    """Two steps; the second is cancelled during the first of its two calls, either by the
    tool itself (mode "tool") or by the observer at its tool.started (mode "observer")."""
    executed: list[str] = []
    model = al.ScriptedModel(
        [
            al.scripted_response(
                "response-001",
                [text("Echo first."), call("echo", "call-echo-001", {"text": "one"})],
                "toolCall",
            ),
            al.scripted_response(
                "response-002",
                [
                    call("slow", "call-slow-001", {}),
                    call("echo", "call-echo-002", {"text": "two"}),
                ],
                "toolCall",
            ),
            al.scripted_response("response-003", [text("must not run")], "stop"),
        ]
    )
    # The observer sets the signal at the second tool.started, that of call-slow-001.
    events, result, _ = run(
        model,
        [echo_tool(executed), slow_tool(executed)],
        max_steps=8,
        signal=threading.Event(),
        cancel_at=("tool.started", 2) if mode == "observer" else None,
    )
    assert events[-2].payload["tool_call"].id == "call-slow-001"
    return events, result, executed, model


CANCEL_MODES = ["tool", "observer"]


class TestResumeAfterCancellation:
    """Seed: "Cancellation during Tool execution retains the complete assistant Tool-call
    message, emits tool.started, and appends no fabricated result." open_tool_calls
    and resolve_open_tool_calls let a cancelled run's transcript start a new run."""

    def test_a_complete_transcript_has_no_open_calls(self) -> None:
        _, result, _ = recorded_run()
        assert al.open_tool_calls(result.messages) == ()
        assert al.open_tool_calls([]) == ()
        assert al.open_tool_calls([user()]) == ()

    def test_open_calls_are_in_transcript_order_across_messages(self) -> None:
        first = call("echo", "call-b", {"text": "1"})
        second = call("echo", "call-a", {"text": "2"})
        third = call("echo", "call-c", {"text": "3"})
        transcript: list[al.Message] = [
            user(),
            al.AssistantMessage("message-1", (first, second)),
            al.ToolResultMessage("tool-result-call-b", "call-b", "echo", "1", False),
            al.AssistantMessage("message-2", (third,)),
        ]
        assert al.open_tool_calls(transcript) == (second, third)
        assert al.open_tool_calls(iter(transcript)) == (second, third)

    @pytest.mark.parametrize("mode", CANCEL_MODES)
    def test_resolve_appends_one_error_result_per_open_call(self, mode: str) -> None:
        _, result, _, _ = first_run(mode)
        given = list(result.messages)
        snapshot = list(given)
        resolved = al.resolve_open_tool_calls(given, "interrupted by cancellation")
        assert given == snapshot
        assert isinstance(resolved, tuple)
        assert resolved == (
            *tuple(snapshot),
            al.ToolResultMessage(
                "tool-result-call-slow-001",
                "call-slow-001",
                "slow",
                "interrupted by cancellation",
                True,
            ),
            al.ToolResultMessage(
                "tool-result-call-echo-002",
                "call-echo-002",
                "echo",
                "interrupted by cancellation",
                True,
            ),
        )
        assert al.open_tool_calls(resolved) == ()
        assert al.resolve_open_tool_calls(resolved, "again") == resolved

    def test_resolve_reads_any_iterable(self) -> None:
        _, result, _, _ = first_run("tool")
        assert al.resolve_open_tool_calls(iter(result.messages), "x") == (
            al.resolve_open_tool_calls(result.messages, "x")
        )

    @pytest.mark.parametrize("content", [None, b"interrupted", 1, ["interrupted"]])
    def test_resolve_needs_str_content(self, content: Any) -> None:
        _, result, _, _ = first_run("tool")
        with pytest.raises(TypeError, match="content"):
            al.resolve_open_tool_calls(result.messages, content)

    @pytest.mark.parametrize("mode", CANCEL_MODES)
    def test_a_resolved_transcript_starts_a_new_run_that_continues_the_request_ids(
        self, mode: str
    ) -> None:
        _, cancelled, _, _ = first_run(mode)
        resolved = al.resolve_open_tool_calls(cancelled.messages, "interrupted")
        model = al.ScriptedModel(
            [al.scripted_response("response-003", [text("Resumed.")], "stop")]
        )
        events, result, _ = run(
            model,
            [echo_tool()],
            messages=resolved,
            max_steps=2,
            request_sequence_start=cancelled.steps,
        )
        check_run(events, result)
        assert [request.id for request in model.requests] == ["request-003"]
        assert model.requests[0].messages == resolved
        accepted = events[: len(resolved)]
        assert types_of(accepted) == ["message.accepted"] * len(resolved)
        assert [event.payload["message"] for event in accepted] == list(resolved)
        assert types_of(events[len(resolved) :]) == ["model.chunk", "run.finished"]
        assert events[len(resolved)].payload["request_id"] == "request-003"
        assert result.status == "completed"
        assert result.final_text == "Resumed."
        assert result.steps == 1
        assert result.messages == (
            *resolved,
            al.AssistantMessage("message-response-003", (text("Resumed."),)),
        )

    @pytest.mark.parametrize("mode", CANCEL_MODES)
    def test_an_unresolved_transcript_cannot_start_a_new_run(self, mode: str) -> None:
        """Seed: "An invalid starting transcript produces one run.finished event with a
        failed INVALID_TRANSCRIPT result and never invokes the model." """
        _, cancelled, _, _ = first_run(mode)
        model = al.ScriptedModel([al.scripted_response("response-003", [text("No.")], "stop")])
        events, result, _ = run(
            model,
            [echo_tool()],
            messages=cancelled.messages,
            max_steps=8,
            request_sequence_start=cancelled.steps,
        )
        assert types_of(events) == ["run.finished"]
        assert result.status == "failed"
        assert result.error is not None
        assert result.error.code == "INVALID_TRANSCRIPT"
        assert model.call_count == 0
        assert result.messages == ()
