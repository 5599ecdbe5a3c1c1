"""Tests for agent_loop, the core: every rule, limit, failure code, event order and
cancellation case of the seed ("Checkpoint 07: Run the iterative Agent Loop"), then the
public contract that the module's docstrings and the README state.

The suite imports ``agent_loop`` once, as ``al``: point it at another copy of the module
by putting that copy first on sys.path. Its builders, its one fake model (FakeModel, for
what al.ScriptedModel cannot do) and its one driver (run(), which checks the run's
invariants with check_run() every time) come from loop_testing.py; a helper that one
class alone uses sits just above that class. replay() has its own file
(test_agent_loop_replay.py), the README and the demonstration theirs
(test_docs_and_demo.py). This file uses ``from __future__ import annotations`` on
purpose: Tool.from_function must read the string annotations that PEP 563 gives a
user's module.

One canonical test per rule of the seed, named in the rule's words and quoting it
(``Seed: "..."``); more cases of the same rule are rows of its table. Every limit is
tested on both sides (ids ``at-limit`` and ``over-limit``); cancellation is a table over
every "signal aborts" edge of the seed's diagram. Attacker-style tests (a model, tool or
caller that tries to break the loop) carry the ``hostile`` mark (a class, or a row of a
table), marked [hostile] below: ``pytest -m hostile`` runs them alone.

Contents, in the module's order
    The module: TestRuntimeTyping
    Limits: TestLimits, TestThinkingLimits
    The loop, one class per acceptance criterion of the seed, in the seed's order:
        TestGoldenFragments (the seed's two fragments, translated),
        TestConstructionRejectsInvalidOptions, TestRunOwnsSnapshots,
        TestEachStepGetsFrozenTranscriptAndRequestId,
        TestAssistantMessagesPrecedeToolResults, TestRecoverableToolErrors,
        TestEventSequence, TestCancellation, TestStepBudget;
        then TestFailureCodes, TestModelCorrelationAndAgreement,
        TestStreamDisagreementIsShown, TestThinkingAgreement, TestRunUsage,
        TestMistakesNameTheirFix, TestRunHelpers,
        TestCancellationAtEveryEvent [hostile], TestConsumerWalksAway [hostile],
        TestInterruptsAreNeverSwallowed [hostile],
        TestRandomScriptsAgainstAReference [hostile]
    The transcript: TestInvalidStartingTranscript, TestWrongFieldIsNamed,
        TestMalformedThinkingAndUsage,
        TestDuplicateIdsSayHowTheyWereDerived, TestOnlyTheExactClasses
    Model boundary: TestSignalIsPublic, TestSignalSaysWhatIsAccepted,
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
from types import MappingProxyType
from typing import (
    Any,
    Callable,
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
    assert_tool_received,
    assistant,
    call,
    cancels,
    check_run,
    copy_echo,
    cyclic_array,
    cyclic_object,
    echo_call,
    echo_result,
    echo_tool,
    failure_message,
    nested,
    no_arguments_tool,
    one_call,
    only_tool_result,
    open_call_ids,
    plain_copy,
    probe_tool,
    raise_error,
    recording_tools,
    respond,
    run,
    run_probe_call,
    same_json,
    settle,
    shared_array,
    start_run,
    stop,
    stream_of,
    stream_step,
    text,
    thinking_script,
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


def assert_bound(arguments: Any, passes: bool, limit: str) -> None:
    """Runs one call with ``arguments``: within the bound the tool receives exactly them;
    past it the run fails with MODEL_PROTOCOL_ERROR naming ``limit``, and no tool runs."""
    events, result, model, received = run_probe_call(arguments)
    if passes:
        assert_tool_received(events, result, received, arguments)
    else:
        assert_failed(events, result, "MODEL_PROTOCOL_ERROR", limit)
        assert_no_tool_ran(events, result, model, received)


def chunk_event_count(events: list[al.Event]) -> int:
    return types_of(events).count("model.chunk")


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

    @pytest.mark.parametrize(
        ("count", "passes"),
        [pytest.param(4096, True, id="at-limit"), pytest.param(4097, False, id="over-limit")],
    )
    def test_initial_messages(self, count: int, passes: bool) -> None:
        """Seed: "Initial messages are capped at 4096 ... An invalid starting transcript
        produces one run.finished event with a failed INVALID_TRANSCRIPT result and never
        invokes the model." """
        start = [al.UserMessage(f"user-{index:04d}", "hi") for index in range(count)]
        events, result, model = run(
            [al.scripted_response("response-001", [text("hello")], "stop")], messages=start
        )
        check_run(events, result)
        if passes:
            assert result.status == "completed"
            assert types_of(events)[:count] == ["message.accepted"] * count
            assert [event.payload["message"] for event in events[:count]] == start
            assert model.call_count == 1
            assert model.requests[0].messages == tuple(start)
            assert result.messages[:count] == tuple(start)
        else:
            assert_failed(events, result, "INVALID_TRANSCRIPT", "4096")
            assert types_of(events) == ["run.finished"]
            assert model.call_count == 0
            assert result.messages == ()

    @pytest.mark.parametrize(
        ("count", "passes"),
        [pytest.param(1024, True, id="at-limit"), pytest.param(1025, False, id="over-limit")],
    )
    def test_step_chunks(self, count: int, passes: bool) -> None:
        """Seed: "The loop caps one step at 1024 chunks". The chunk over the cap gets no
        model.chunk event, and the unfinished assistant message is not appended."""
        response = al.scripted_response(
            "response-001", [text("a" * count)], "stop", chunks=[text("a")] * count
        )
        events, result, model = run([response])
        check_run(events, result)
        assert chunk_event_count(events) == 1024
        if passes:
            assert result.status == "completed"
            assert result.final_text == "a" * 1024
        else:
            assert_failed(events, result, "MODEL_PROTOCOL_ERROR", "1024")
            assert result.messages == (user(),)
            assert model.call_count == 1

    @pytest.mark.parametrize(
        ("count", "passes"),
        [pytest.param(1024, True, id="at-limit"), pytest.param(1025, False, id="over-limit")],
    )
    def test_empty_chunks_count_toward_the_chunk_cap(self, count: int, passes: bool) -> None:
        """An empty text delta carries no text, but it is still a chunk of the step."""
        response = al.scripted_response("response-001", [], "stop", chunks=[text("")] * count)
        events, result, _ = run([response])
        assert chunk_event_count(events) == 1024
        if passes:
            assert result.status == "completed"
            assert result.final_text == ""
        else:
            assert_failed(events, result, "MODEL_PROTOCOL_ERROR", "1024")
            assert result.messages == (user(),)

    @pytest.mark.parametrize("passes", [AT_LIMIT, OVER_LIMIT])
    def test_step_text_in_code_points(self, passes: bool) -> None:
        """Seed: "65,536 Unicode code points of text": a non-BMP character is one code point
        (two UTF-16 units), so 65,536 emoji pass and one more fails."""
        chunks = [text("😀" * 1024)] * 64 + ([] if passes else [text("😀")])
        full = "".join(chunk.text for chunk in chunks)
        assert len(full.encode("utf-16-le")) // 2 > 65536  # in UTF-16 units it is far over
        response = al.scripted_response("response-001", [text(full)], "stop", chunks=chunks)
        events, result, _ = run([response])
        if passes:
            check_run(events, result)
            assert result.status == "completed"
            assert result.final_text == full
            assert len(full) == 65536
            assert chunk_event_count(events) == 64
        else:
            assert_failed(events, result, "MODEL_PROTOCOL_ERROR", "65536")
            assert chunk_event_count(events) == 64  # the chunk over the limit has no event
            assert result.messages == (user(),)

    @pytest.mark.parametrize("passes", [AT_LIMIT, OVER_LIMIT])
    def test_step_text_at_the_chunk_cap(self, passes: bool) -> None:
        """1024 chunks of 64 ASCII characters are exactly both caps and pass; one more
        character in the last chunk breaks the text cap alone."""
        chunks = [text("x" * 64)] * 1023 + [text("x" * (64 if passes else 65))]
        full = "".join(chunk.text for chunk in chunks)
        response = al.scripted_response("response-001", [text(full)], "stop", chunks=chunks)
        events, result, _ = run([response])
        if passes:
            check_run(events, result)
            assert result.status == "completed"
            assert result.final_text == "x" * 65536
            assert chunk_event_count(events) == 1024
        else:
            assert_failed(events, result, "MODEL_PROTOCOL_ERROR", "65536")
            assert chunk_event_count(events) == 1023
            assert result.messages == (user(),)

    @pytest.mark.parametrize(
        ("count", "passes"),
        [pytest.param(1024, True, id="at-limit"), pytest.param(1025, False, id="over-limit")],
    )
    def test_assistant_blocks_as_returned(self, count: int, passes: bool) -> None:
        """Seed: "... and 1024 assistant blocks", counted as the response returns them, before
        coalescing: 1025 text blocks streamed as one chunk are too many."""
        blocks = [text("a")] * count
        response = al.scripted_response("response-001", blocks, "stop", chunks=[text("a" * count)])
        events, result, model = run([response])
        assert chunk_event_count(events) == 1
        if passes:
            check_run(events, result)
            assert result.status == "completed"
            assert result.messages[-1] == al.AssistantMessage(
                "message-response-001", tuple(blocks)
            )
            assert len(result.messages[-1].content) == 1024
            assert result.final_text == "a" * 1024
        else:
            assert_failed(events, result, "MODEL_PROTOCOL_ERROR", "1024")
            assert result.messages == (user(),)
            assert model.call_count == 1

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
        assert_bound(make(), passes, limit)


def thought(value: str, signature: str | None = None) -> al.ThinkingBlock:
    """A thinking block (streamed by al.ScriptedModel as one ThinkingDelta of its text)."""
    return al.ThinkingBlock(value, signature)


class TestThinkingLimits:
    """What each limit counts with thinking: MAX_STEP_CHUNKS every chunk, thinking deltas
    included; MAX_ASSISTANT_BLOCKS every block, thinking blocks included; MAX_STEP_TEXT
    the code points of streamed text and, counted on its own against the same number,
    those of streamed thinking. Each at the limit and one over."""

    @pytest.mark.parametrize("passes", [AT_LIMIT, OVER_LIMIT])
    def test_thinking_deltas_count_toward_the_chunk_cap(self, passes: bool) -> None:
        count = 1024 if passes else 1025
        chunks: list[Any] = [thought("t")] * (count - 1) + [text("Done.")]
        content: list[Any] = [thought("t" * (count - 1), "sig"), text("Done.")]
        events, result, _ = run(
            [al.scripted_response("response-001", content, "stop", chunks=chunks)]
        )
        assert chunk_event_count(events) == 1024
        if passes:
            check_run(events, result)
            assert result.status == "completed"
            assert result.messages[-1] == al.AssistantMessage("message-response-001", content)
        else:
            assert_failed(events, result, "MODEL_PROTOCOL_ERROR", "more than 1024 chunks")
            assert result.messages == (user(),)

    @pytest.mark.parametrize("passes", [AT_LIMIT, OVER_LIMIT])
    def test_thinking_blocks_count_toward_the_block_cap(self, passes: bool) -> None:
        count = 1024 if passes else 1025
        content: list[Any] = [thought("t", f"sig-{i}") for i in range(count - 1)] + [text("ok")]
        chunks: list[Any] = [thought("t" * (count - 1)), text("ok")]
        events, result, _ = run(
            [al.scripted_response("response-001", content, "stop", chunks=chunks)]
        )
        if passes:
            check_run(events, result)
            assert result.status == "completed"
            assert len(result.messages[-1].content) == 1024
        else:
            assert_failed(events, result, "MODEL_PROTOCOL_ERROR", "more than 1024 blocks")
            assert result.messages == (user(),)

    @pytest.mark.parametrize(
        ("thinking", "text_length", "broken"),
        [
            pytest.param(65536, 65536, None, id="both-at-limit"),
            pytest.param(65537, 0, "thinking", id="thinking-over-limit"),
            pytest.param(65537, 65536, "thinking", id="thinking-over-text-at-limit"),
            pytest.param(65536, 65537, "text", id="text-over-thinking-at-limit"),
        ],
    )
    def test_thinking_code_points_are_bounded_apart_from_text(
        self, thinking: int, text_length: int, broken: str | None
    ) -> None:
        """A step may stream 65,536 code points of thinking and 65,536 of text; one more
        of either fails. A non-BMP character is one code point. The kind that breaks its
        limit streams last."""
        thinking_chunks = [thought("🤔" * 1024)] * 64 + [thought("🤔")] * (thinking - 65536)
        text_chunks = [text("x" * 1024)] * (text_length // 1024) + [text("x")] * (
            text_length % 1024
        )
        thinking_block, text_block = thought("🤔" * thinking, "sig"), text("x" * text_length)
        chunks: list[Any] = thinking_chunks + text_chunks
        content: list[Any] = [thinking_block, text_block]
        if broken == "thinking":
            chunks, content = text_chunks + thinking_chunks, [text_block, thinking_block]
        events, result, _ = run(
            [al.scripted_response("response-001", content, "stop", chunks=chunks)]
        )
        if broken is None:
            check_run(events, result)
            assert result.status == "completed"
            assert result.messages[-1].content == tuple(content)
            assert chunk_event_count(events) == 128
        else:
            assert_failed(
                events, result, "MODEL_PROTOCOL_ERROR", f"more than 65536 code points of {broken}"
            )
            assert chunk_event_count(events) == len(chunks) - 1  # the chunk over has no event
            assert result.messages == (user(),)


# --- The loop ----------------------------------------------------------------------------


class TestGoldenFragments:
    def test_appends_one_tool_call_and_its_matching_result_before_the_second_model_request(
        self,
    ) -> None:
        """Seed: "The second request contains the assistant Tool call before its result,
        and both share call-add-001." (the seed's first fragment, translated exactly)"""
        add_call_001 = call("add", "call-add-001", {"left": 20, "right": 22})
        model = al.ScriptedModel(
            [
                al.scripted_response("response-tool-001", [add_call_001], "toolCall"),
                al.scripted_response(
                    "response-tool-002", [al.TextBlock("The sum is 42.")], "stop"
                ),
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

    @staticmethod
    def budget_run(max_steps: int) -> tuple[list[str], list[al.Event], al.RunResult, Any]:
        """The seed's failure experiment: three echo calls, then a continuation response."""
        executed: list[str] = []
        calls = [
            echo_call("call-echo-001"),
            echo_call("call-echo-002"),
            echo_call("call-echo-003"),
        ]
        model = al.ScriptedModel(
            [
                al.scripted_response("response-budget-001", calls, "toolCall"),
                al.scripted_response(
                    "response-budget-002", [al.TextBlock("must not run")], "stop"
                ),
            ]
        )
        events, result, _ = run(
            model,
            [echo_tool(executed)],
            messages=[user("Echo three values.")],
            max_steps=max_steps,
            signal=threading.Event(),
        )
        return executed, events, result, model

    def test_a_one_step_budget_completes_the_tool_batch_and_opens_no_continuation(self) -> None:
        """Seed: "All three calls execute in order, model.callCount remains 1, and the
        result is maxSteps." (the seed's second fragment, translated exactly)"""
        executed, events, result, model = self.budget_run(max_steps=1)

        assert executed == ["call-echo-001", "call-echo-002", "call-echo-003"]
        assert model.call_count == 1
        assert result.status == "maxSteps"
        assert result.max_steps == 1
        last = events[-1]
        assert last.type == "run.finished"
        assert last.sequence == len(events) - 1
        assert last.payload["result"].status == "maxSteps"
        assert last.payload["result"].max_steps == 1

    def test_the_same_script_with_two_steps_runs_the_continuation_and_completes(self) -> None:
        """Seed: "Change only maxSteps to 2; the queued continuation may run and complete." """
        executed, events, result, model = self.budget_run(max_steps=2)

        assert executed == ["call-echo-001", "call-echo-002", "call-echo-003"]
        assert model.call_count == 2
        assert result.status == "completed"
        assert result.final_text == "must not run"
        assert result.max_steps is None
        check_run(events, result)


class SignalLike:
    """Not a threading.Event, but with the same reading side: is_set() and wait()."""

    def is_set(self) -> bool:
        return False

    def wait(self, timeout: float | None = None) -> bool:
        return False


class OnlyIsSet:
    def is_set(self) -> bool:
        return False


class StreamNotCallable:
    stream = "not a function"


INVALID_OPTIONS = [
    pytest.param({"max_steps": 0}, ValueError, "max_steps", id="max_steps-under-limit-0"),
    pytest.param({"max_steps": 65}, ValueError, "max_steps", id="max_steps-over-limit-65"),
    pytest.param({"max_steps": -1}, ValueError, "max_steps", id="max_steps-negative"),
    pytest.param({"max_steps": True}, TypeError, "max_steps", id="max_steps-bool"),
    pytest.param({"max_steps": 2.0}, TypeError, "max_steps", id="max_steps-float"),
    pytest.param({"max_steps": "2"}, TypeError, "max_steps", id="max_steps-str"),
    pytest.param({"max_steps": None}, TypeError, "max_steps", id="max_steps-None"),
    pytest.param(
        {"request_sequence_start": -1},
        ValueError,
        "request_sequence_start",
        id="request_sequence_start-under-limit-negative",
    ),
    pytest.param(
        {"request_sequence_start": 61, "max_steps": 4},
        ValueError,
        "request_sequence_start",
        id="request_sequence_start-over-limit-61+4",
    ),
    pytest.param(
        {"request_sequence_start": 64, "max_steps": 1},
        ValueError,
        "request_sequence_start",
        id="request_sequence_start-over-limit-64+1",
    ),
    pytest.param(
        {"request_sequence_start": True},
        TypeError,
        "request_sequence_start",
        id="request_sequence_start-bool",
    ),
    pytest.param(
        {"request_sequence_start": 1.0},
        TypeError,
        "request_sequence_start",
        id="request_sequence_start-float",
    ),
    pytest.param({"model": object()}, TypeError, "model", id="model-without-stream"),
    pytest.param({"model": StreamNotCallable()}, TypeError, "model", id="stream-not-callable"),
    pytest.param({"tools": [add_tool()]}, TypeError, "tools", id="tools-a-list"),
    pytest.param({"tools": None}, TypeError, "tools", id="tools-None"),
    pytest.param({"signal": object()}, TypeError, "signal", id="signal-object"),
    pytest.param({"signal": True}, TypeError, "signal", id="signal-bool"),
    pytest.param({"signal": OnlyIsSet()}, TypeError, "signal", id="signal-without-wait"),
    pytest.param({"messages": 42}, TypeError, "messages", id="messages-int"),
    pytest.param({"messages": None}, TypeError, "messages", id="messages-None"),
]


VALID_OPTIONS = [
    pytest.param({"max_steps": 1}, id="max_steps-at-limit-1"),
    pytest.param({"max_steps": 64}, id="max_steps-at-limit-64"),
    pytest.param({"request_sequence_start": 0}, id="request_sequence_start-at-limit-0"),
    pytest.param(
        {"request_sequence_start": 60, "max_steps": 4}, id="request_sequence_start-at-limit-60+4"
    ),
    pytest.param(
        {"request_sequence_start": 63, "max_steps": 1}, id="request_sequence_start-at-limit-63+1"
    ),
    pytest.param({"signal": SignalLike()}, id="signal-like-object"),
    pytest.param({"signal": None}, id="signal-None"),
    pytest.param({"messages": (user(),)}, id="messages-tuple"),
]


class TestConstructionRejectsInvalidOptions:
    @staticmethod
    def options(model: al.ScriptedModel, overrides: dict[str, Any]) -> dict[str, Any]:
        options: dict[str, Any] = {
            "messages": [user()],
            "model": model,
            "tools": al.ToolRegistry([add_tool()]),
            "max_steps": 2,
            "signal": threading.Event(),
        }
        options.update(overrides)
        return options

    @pytest.mark.parametrize(("overrides", "error", "names"), INVALID_OPTIONS)
    def test_an_invalid_option_raises_at_call_time(
        self, overrides: dict[str, Any], error: type[Exception], names: str
    ) -> None:
        """Seed: "Invalid construction throws before an EventStream is returned." The
        call itself raises (nothing is iterated), naming the option; the model never runs."""
        model = al.ScriptedModel([stop("response-001")])
        with pytest.raises(error, match=names):
            al.run_agent_loop(**self.options(model, overrides))
        assert model.call_count == 0

    @pytest.mark.parametrize("overrides", VALID_OPTIONS)
    def test_a_valid_option_returns_a_generator_that_has_not_called_the_model(
        self, overrides: dict[str, Any]
    ) -> None:
        model = al.ScriptedModel([stop("response-001")])
        run = al.run_agent_loop(**self.options(model, overrides))

        assert isinstance(run, collections.abc.Generator)
        assert inspect.getgeneratorstate(run) == "GEN_CREATED"
        assert model.call_count == 0
        events, result = settle(run, model)
        assert result.status == "completed"
        assert model.call_count == 1
        check_run(events, result)


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
        self, mutate: Callable[[list[Any]], None], when: CancelAt
    ) -> None:
        messages: list[Any] = [user()]
        model = al.ScriptedModel(
            [tool_turn("response-001", text("Adding."), add_call()), stop("response-002")]
        )
        loop = al.run_agent_loop(
            messages=messages, model=model, tools=al.ToolRegistry([add_tool()]), max_steps=2
        )
        if when is None:
            mutate(messages)
        events: list[al.Event] = []
        while True:
            try:
                events.append(next(loop))
            except StopIteration as done:
                result: al.RunResult = done.value
                break
            if cancels(when, events):
                mutate(messages)
        check_run(events, result, model, max_steps=2, start=[user()])
        assert result.status == "completed"
        assert [request.messages[0] for request in model.requests] == [user(), user()]
        assert [event.payload["message"] for event in events[:1]] == [user()]
        assert types_of(events).count("message.accepted") == 1
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
        run = al.run_agent_loop(
            messages=messages, model=model, tools=al.ToolRegistry(), max_steps=1
        )
        assert read == ["user-001", "user-002"]
        assert next(messages, None) is None  # consumed once, by the call

        _events, result = settle(run, model, max_steps=1)
        assert model.requests[0].messages == (user(), user("And then?", "user-002"))
        assert result.status == "completed"

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
        first = call("register" if who == "a-tool-of-the-run" else "add", "call-1", {})
        if first.name == "add":
            first = add_call("call-1")
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
        """Whatever the caller holds (events, the result, the requests a model saw), it
        cannot change the run's transcript through it: all of it is frozen."""
        model = al.ScriptedModel(
            [
                tool_turn(
                    "response-001",
                    text("A."),
                    call("add", "call-1", {"left": 1, "right": 2}),
                    echo_call("call-2", "e"),
                ),
                al.scripted_response("response-002", [text("3")], "stop"),
            ]
        )
        echo_schema_tool = al.Tool(
            "echo",
            "Echoes.",
            {"type": "object", "properties": {"text": {"type": "string", "enum": ["e", "f"]}}},
            lambda a, s: {"echo": [a["text"]]},
        )
        events, result, _ = run(model, [add_tool(), echo_schema_tool])
        assert result.status == "completed"
        assert mutable_paths((tuple(events), result, tuple(model.requests))) == []

    @pytest.mark.hostile
    def test_mutation_attempts_leave_the_transcript_unchanged(self) -> None:
        model = al.ScriptedModel(
            [
                tool_turn("response-001", text("Adding."), add_call("call-1")),
                al.scripted_response("response-002", [text("3")], "stop"),
            ]
        )
        run_: Any = al.run_agent_loop(
            messages=[user()], model=model, tools=al.ToolRegistry([add_tool()]), max_steps=2
        )
        events: list[al.Event] = []
        while True:
            try:
                event = run_.send(None) if not events else run_.send("ignored value")
            except StopIteration as done:
                result = done.value
                break
            events.append(event)
            payload: Any = event.payload
            with pytest.raises(TypeError):
                payload["extra"] = 1
            if event.type == "tool.started":
                with pytest.raises(TypeError):
                    event.payload["tool_call"].arguments["left"] = 100
        check_run(events, result, model, max_steps=2, start=[user()])
        assert result.status == "completed"
        added = result.messages[2]
        assert isinstance(added, al.ToolResultMessage)
        assert added.content == '{"sum":42}'


THREE_STEPS = (
    tool_turn("response-001", add_call()),
    tool_turn("response-002", echo_call("call-echo-001")),
    stop("response-003"),
)


class TestEachStepGetsFrozenTranscriptAndRequestId:
    def test_each_request_holds_the_complete_transcript_at_its_step(self) -> None:
        """Seed: "requestSnapshot() freezes the current transcript"."""
        _events, result, model = run(THREE_STEPS, tools=[add_tool(), echo_tool()])

        first_round = (assistant("response-001", add_call()), add_result())
        second_round = (
            assistant("response-002", echo_call("call-echo-001")),
            echo_result("call-echo-001"),
        )
        assert [request.messages for request in model.requests] == [
            (user(),),
            (user(), *first_round),
            (user(), *first_round, *second_round),
        ]
        assert all(type(request.messages) is tuple for request in model.requests)
        assert result.messages == (
            user(),
            *first_round,
            *second_round,
            assistant("response-003", text("The sum is 42.")),
        )

    def test_later_steps_do_not_change_earlier_requests(self) -> None:
        _, _, model = run(FakeModel(*THREE_STEPS), tools=[add_tool(), echo_tool()])

        assert [len(held) for held in model.held] == [1, 3, 5]
        assert [list(request.messages) for request in model.requests] == model.held

    @pytest.mark.parametrize(
        ("start", "max_steps", "ids"),
        [
            pytest.param(0, 4, ["request-001", "request-002", "request-003"], id="from-1"),
            pytest.param(5, 4, ["request-006", "request-007", "request-008"], id="offset-5"),
            pytest.param(61, 3, ["request-062", "request-063", "request-064"], id="at-ceiling"),
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

        assert result.status == "completed"
        assert [request.id for request in model.requests] == ids
        correlated = [
            (event.type, event.payload["request_id"])
            for event in events
            if "request_id" in event.payload
        ]
        assert correlated == [
            ("model.chunk", ids[0]),
            ("tool.started", ids[0]),
            ("tool.finished", ids[0]),
            ("model.chunk", ids[1]),
            ("tool.started", ids[1]),
            ("tool.finished", ids[1]),
            ("model.chunk", ids[2]),
        ]

    def test_the_last_request_number_of_the_ceiling_is_064(self) -> None:
        _events, result, model = run(
            [stop("response-001")], max_steps=1, request_sequence_start=63
        )

        assert [request.id for request in model.requests] == ["request-064"]
        assert result.status == "completed"

    def test_each_request_carries_the_registry_specs(self) -> None:
        tools = [add_tool(), echo_tool()]
        _events, _result, model = run(THREE_STEPS, tools=tools)

        expected = al.ToolRegistry(tools).specs()
        assert [spec.name for spec in expected] == ["add", "echo"]
        assert [request.tools for request in model.requests] == [expected] * 3


BATCH = (echo_call("call-echo-001"), add_call(), echo_call("call-echo-002"))


BATCH_RESULTS = (echo_result("call-echo-001"), add_result(), echo_result("call-echo-002"))


class TestAssistantMessagesPrecedeToolResults:
    def test_calls_execute_and_results_append_in_assistant_order(self) -> None:
        """Seed: "Multiple calls execute sequentially in this workshop." and "appends
        the linked Tool-result message" after the assistant message."""
        executed: list[str] = []
        _events, result, model = run(
            [tool_turn("response-001", *BATCH), stop("response-002")],
            tools=recording_tools(executed),
        )

        assert executed == ["call-echo-001", "add", "call-echo-002"]
        assert model.requests[1].messages == (
            user(),
            assistant("response-001", *BATCH),
            *BATCH_RESULTS,
        )
        assert result.status == "completed"

    def test_each_call_has_started_then_finished_with_its_appended_result(self) -> None:
        """Seed: "For each call, it emits tool.started, awaits executeToolCall(), appends
        the linked Tool-result message, then emits tool.finished." """
        events, _result, model = run(
            [tool_turn("response-001", *BATCH), stop("response-002")],
            tools=[add_tool(), echo_tool()],
        )

        tool_events = [event for event in events if event.type.startswith("tool.")]
        assert types_of(tool_events) == ["tool.started", "tool.finished"] * 3
        for index, tool_call in enumerate(BATCH):
            started, finished = tool_events[2 * index : 2 * index + 2]
            assert dict(started.payload) == {"request_id": "request-001", "tool_call": tool_call}
            assert set(finished.payload) == {"request_id", "tool_call", "tool_result"}
            assert finished.payload["request_id"] == "request-001"
            assert finished.payload["tool_call"] == tool_call
            assert finished.payload["tool_result"] == BATCH_RESULTS[index]
            # already appended: the next request holds it at the same place
            assert model.requests[1].messages[2 + index] == finished.payload["tool_result"]

    def test_several_tool_rounds_each_append_assistant_then_results(self) -> None:
        events, result, _model = run(
            [
                tool_turn("response-001", add_call()),
                tool_turn("response-002", echo_call("call-echo-001"), echo_call("call-echo-002")),
                stop("response-003"),
            ],
            tools=[add_tool(), echo_tool()],
        )

        assert result.messages == (
            user(),
            assistant("response-001", add_call()),
            add_result(),
            assistant("response-002", echo_call("call-echo-001"), echo_call("call-echo-002")),
            echo_result("call-echo-001"),
            echo_result("call-echo-002"),
            assistant("response-003", text("The sum is 42.")),
        )
        assert types_of(events) == [
            "message.accepted",
            "model.chunk",
            "tool.started",
            "tool.finished",
            "model.chunk",
            "model.chunk",
            "tool.started",
            "tool.finished",
            "tool.started",
            "tool.finished",
            "model.chunk",
            "run.finished",
        ]
        assert result.steps == 3


def explode(arguments: dict[str, Any], signal: Any) -> object:
    raise ValueError("the fuse blew")


def opaque(arguments: dict[str, Any], signal: Any) -> object:
    return {1, 2}


class UnprintableError(Exception):
    """An exception whose str() itself raises."""

    def __str__(self) -> str:
        raise RuntimeError("no message for you")


def cyclic_value() -> object:
    value: list[Any] = []
    value.append(value)
    return value


def raising(error: BaseException) -> Callable[[dict[str, Any], Any], object]:
    """A tool function that raises ``error``."""

    def execute(arguments: dict[str, Any], signal: Any) -> object:
        raise error

    return execute


def returns(value: object) -> Callable[[dict[str, Any], Any], object]:
    """A tool function that returns ``value``."""
    return lambda arguments, signal: value


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
    pytest.param(cyclic_value(), id="returns-a-cyclic-value"),
    pytest.param(nested(100_001, "array"), id="returns-JSON-nested-100000-deep"),
]


class TestRecoverableToolErrors:
    @pytest.mark.parametrize(
        ("tool_call", "tools", "named"),
        [
            pytest.param(
                call("search", "call-search-001", {"q": "x"}),
                [add_tool()],
                "search",
                id="unknown-tool",
            ),
            pytest.param(
                call("add", "call-add-001", {"left": "20", "right": 22}),
                [add_tool()],
                "left",
                id="schema-invalid-arguments",
            ),
            pytest.param(
                call("explode", "call-explode-001", {}),
                [no_arguments_tool("explode", explode)],
                "the fuse blew",
                id="tool-raises",
            ),
            pytest.param(
                call("opaque", "call-opaque-001", {}),
                [no_arguments_tool("opaque", opaque)],
                "opaque",
                id="non-json-return",
            ),
            *[
                pytest.param(
                    call("flaky", "call-flaky-001", {}),
                    [no_arguments_tool("flaky", raising(cast(BaseException, case.values[0])))],
                    type(case.values[0]).__name__,
                    id=case.id,
                    marks=HOSTILE,
                )
                for case in RAISED
            ],
            *[
                pytest.param(
                    call("odd", "call-odd-001", {}),
                    [no_arguments_tool("odd", returns(case.values[0]))],
                    "odd",
                    id=case.id,
                    marks=HOSTILE,
                )
                for case in NOT_JSON_RETURNS
            ],
        ],
    )
    def test_a_tool_error_is_a_linked_result_that_reaches_the_continuation(
        self, tool_call: al.ToolCall, tools: list[al.Tool], named: str
    ) -> None:
        """Seed: "A recoverable Tool error is still appended and sent to the next model
        request; it does not end the run by itself." """
        events, result, model = run(
            [tool_turn("response-001", tool_call), stop("response-002", "Sorry.")],
            tools=tools,
        )

        error = result.messages[2]
        assert isinstance(error, al.ToolResultMessage)
        assert error.id == "tool-result-" + tool_call.id
        assert error.tool_call_id == tool_call.id
        assert error.tool_name == tool_call.name
        assert error.is_error is True
        assert named in error.content
        assert model.requests[1].messages == (user(), assistant("response-001", tool_call), error)
        finished = [event for event in events if event.type == "tool.finished"]
        assert [event.payload["tool_result"] for event in finished] == [error]
        assert result.status == "completed"
        assert result.final_text == "Sorry."


def run_ending(status: str) -> tuple[list[al.Event], al.RunResult]:
    """A run with every kind of event that ends with ``status``."""
    script = [tool_turn("response-001", add_call()), stop("response-002")]
    if status == "completed":
        events, result, _ = run(script, messages=PRIOR_ROUND, tools=[add_tool()])
    elif status == "maxSteps":
        events, result, _ = run(script, messages=PRIOR_ROUND, tools=[add_tool()], max_steps=1)
    elif status == "failed":
        events, result, _ = run(script[:1], messages=PRIOR_ROUND, tools=[add_tool()])
    else:
        signal = threading.Event()
        events, result, _ = run(
            script,
            messages=PRIOR_ROUND,
            tools=[add_tool()],
            signal=signal,
            cancel_at=("model.chunk", 2),
        )
    return events, result


class TestEventSequence:
    @pytest.mark.parametrize("status", ["completed", "maxSteps", "failed", "cancelled"])
    def test_one_counter_numbers_every_kind_of_event_and_run_finished_is_last(
        self, status: str
    ) -> None:
        """Seed: "Event sequence values increase by one across message, model, Tool, and
        terminal events; run.finished is last." """
        events, result = run_ending(status)

        assert result.status == status
        assert {"message.accepted", "model.chunk", "tool.started", "tool.finished"} <= set(
            types_of(events)
        )
        assert [event.sequence for event in events] == list(range(len(events)))
        assert types_of(events).count("run.finished") == 1
        assert events[-1].type == "run.finished"
        assert set(events[-1].payload) == {"result"}
        assert events[-1].payload["result"] is result

    def test_one_message_accepted_per_starting_message_in_order_first(self) -> None:
        """Seed: "It first emits one message.accepted event for every starting message." """
        events, _result, model = run([stop("response-001")], messages=PRIOR_ROUND)

        accepted = events[: len(PRIOR_ROUND)]
        assert types_of(accepted) == ["message.accepted"] * len(PRIOR_ROUND)
        assert [dict(event.payload) for event in accepted] == [
            {"message": message} for message in PRIOR_ROUND
        ]
        assert types_of(events).count("message.accepted") == len(PRIOR_ROUND)
        assert model.requests[0].messages == PRIOR_ROUND

    def test_each_chunk_event_carries_the_request_id_and_the_chunk(self) -> None:
        events, _result, _model = run(
            [
                al.scripted_response(
                    "response-001",
                    [text("Adding."), add_call()],
                    "toolCall",
                    chunks=[text("Add"), text("ing."), add_call()],
                ),
                stop("response-002"),
            ],
            tools=[add_tool()],
        )

        chunks = [dict(event.payload) for event in events if event.type == "model.chunk"]
        assert chunks == [
            {"request_id": "request-001", "chunk": al.TextDelta("request-001", "Add")},
            {"request_id": "request-001", "chunk": al.TextDelta("request-001", "ing.")},
            {"request_id": "request-001", "chunk": al.ToolCallChunk("request-001", add_call())},
            {"request_id": "request-002", "chunk": al.TextDelta("request-002", "The sum is 42.")},
        ]


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


def abort_from_another_thread(ready: threading.Event, signal: threading.Event) -> threading.Thread:
    """Starts a helper thread that sets ``signal`` once ``ready`` is set."""

    def abort() -> None:
        if ready.wait(5):  # a safety net: the test sets ready long before
            signal.set()

    thread = threading.Thread(target=abort)
    thread.start()
    return thread


def assert_joined(thread: threading.Thread) -> None:
    thread.join(5)
    assert not thread.is_alive()


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
            pytest.param(
                ("tool.started", 1),
                3,
                1,
                ["call-add-001", "call-echo-001"],
                [],
                id="ExecuteTools-at-first-tool.started",
            ),
            pytest.param(
                ("tool.finished", 1),
                4,
                1,
                ["call-echo-001"],
                ["add"],
                id="ExecuteTools-second-call-never-starts",
            ),
            pytest.param(
                ("tool.started", 2),
                4,
                1,
                ["call-echo-001"],
                ["add"],
                id="ExecuteTools-at-second-tool.started",
            ),
            pytest.param(
                ("tool.finished", 2), 5, 1, [], ["add", "call-echo-001"], id="between-steps"
            ),
            pytest.param(
                ("model.chunk", 4), 5, 2, [], ["add", "call-echo-001"], id="ReadChunks-step-2"
            ),
        ],
    )
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
        model = al.ScriptedModel(cancel_script())
        if at is None:
            signal.set()
        events, result, _ = run(
            model, recording_tools(ran), messages=CANCEL_START, signal=signal, cancel_at=at
        )

        assert result.status == "cancelled"
        check_run(events, result)
        # Up to the event that set the signal, the same events as the uncancelled run;
        # after it, nothing but run.finished.
        cut = 0 if at is None else index_of(full_events, at) + 1
        assert events[:-1] == full_events[:cut]
        assert result.messages == full.messages[:kept]
        assert result.steps == steps == model.call_count
        assert open_call_ids(result.messages) == open_ids
        assert ran == executed
        assert (result.final_text, result.max_steps, result.error) == (None, None, None)

    @pytest.mark.parametrize(
        "how",
        [
            pytest.param("observer", id="the-consumer-at-tool.started"),
            pytest.param("returns", id="the-tool-sets-it-then-returns"),
            pytest.param("raises", id="the-tool-sets-it-then-raises"),
            pytest.param("tool-error", id="the-tool-sets-it-then-raises-ToolError"),
            pytest.param("base-exception", id="the-tool-sets-it-then-raises-BaseException"),
            pytest.param("thread-returns", id="another-thread-then-it-returns", marks=HOSTILE),
            pytest.param("thread-raises", id="another-thread-then-it-raises", marks=HOSTILE),
            pytest.param("thread-base-exception", id="another-thread-then-BaseException",
                         marks=HOSTILE),
        ],
    )  # fmt: skip
    def test_cancellation_during_tool_execution_appends_no_fabricated_result(
        self, how: str
    ) -> None:
        """Seed: "Cancellation during Tool execution retains the complete assistant
        Tool-call message, emits tool.started, and appends no fabricated result." However
        the signal comes and whatever the tool does then (the module docstring:
        "Cancellation wins over a stream or tool error that arrives after the signal was
        set"), the run ends cancelled right after that tool.started, and the calls after
        it never start."""
        signal = threading.Event()
        waiting = threading.Event()
        woke: list[bool] = []

        def interrupted(arguments: dict[str, Any], tool_signal: Any) -> object:
            if how.startswith("thread-"):
                waiting.set()
                woke.append(tool_signal.wait(5))  # a safety net: the thread sets it at once
            else:
                tool_signal.set()  # the observer's case never gets here
            ending = how[len("thread-") :] if how.startswith("thread-") else how
            if ending == "raises":
                raise RuntimeError("aborted")
            if ending == "tool-error":
                raise al.ToolError("aborted")
            if ending == "base-exception":
                raise Fatal("aborted")
            return "a result that arrives too late"

        ran: list[str] = []
        wait_call = call("wait", "call-wait-001", {})
        calls = (text("Waiting."), wait_call, echo_call("call-echo-001"))
        thread = abort_from_another_thread(waiting, signal) if how.startswith("thread-") else None
        events, result, model = run(
            [tool_turn("response-001", *calls), stop("response-002")],
            tools=[no_arguments_tool("wait", interrupted), echo_tool(ran)],
            signal=signal,
            cancel_at=("tool.started", 1) if how == "observer" else None,
        )
        if thread is not None:
            assert_joined(thread)
            assert woke == [True]  # released by the signal, not by the safety timeout

        assert (result.status, result.error) == ("cancelled", None)
        assert types_of(events) == [
            "message.accepted",
            *["model.chunk"] * 3,
            "tool.started",
            "run.finished",
        ]
        assert events[-2].payload["tool_call"] == wait_call
        assert result.messages == (user(), assistant("response-001", *calls))
        assert open_call_ids(result.messages) == ["call-wait-001", "call-echo-001"]
        assert ran == []
        assert result.steps == model.call_count == 1

    @pytest.mark.parametrize(
        ("how", "chunks"),
        [
            pytest.param("sets-then-returns", 1, id="terminal-response-waiting"),
            pytest.param("sets-then-raises", 0, id="a-stream-error-after-the-signal"),
            pytest.param("thread-yields", 1, id="another-thread-then-the-stream-yields",
                         marks=HOSTILE),
            pytest.param("thread-raises", 1, id="another-thread-then-the-stream-raises",
                         marks=HOSTILE),
            pytest.param("thread-returns", 1, id="another-thread-then-the-stream-returns",
                         marks=HOSTILE),
            pytest.param("call-blocks-then-raises", 0, id="another-thread-while-stream()-blocks",
                         marks=HOSTILE),
        ],
    )  # fmt: skip
    def test_a_partial_model_chunk_is_never_appended(self, how: str, chunks: int) -> None:
        """Seed: "A partial model chunk may already have an event but its unfinished
        assistant message is not appended." Cancellation while the model streams or while
        the loop waits for its terminal response, whatever the model does then: the run
        ends cancelled, the step counted, and the model's stream closed."""
        signal = threading.Event()
        waiting = threading.Event()
        woke: list[bool] = []

        def streaming(
            model: FakeModel, request: al.ModelRequest, model_signal: Any
        ) -> Generator[object, None, object]:
            try:
                if how == "sets-then-raises":
                    signal.set()
                    raise ConnectionError("closed because of the signal")
                yield al.TextDelta(request.id, "Hel")
                if how == "sets-then-returns":
                    signal.set()  # after the last chunk, before the terminal response
                else:
                    waiting.set()
                    woke.append(model_signal.wait(5))
                if how == "thread-yields":
                    yield al.TextDelta(request.id, "lo")
                elif how == "thread-raises":
                    raise ConnectionError("stream aborted")
                return al.ModelResponse("response-001", request.id, (text("Hel"),), "stop")
            finally:
                model.finalized.append(request.id)

        def stream(model: FakeModel, request: al.ModelRequest, model_signal: Any) -> Any:
            if how == "call-blocks-then-raises":
                waiting.set()
                woke.append(model_signal.wait(5))
                raise ConnectionAbortedError("cancelled by the caller")
            return streaming(model, request, model_signal)

        model = FakeModel(stream)
        thread = (
            abort_from_another_thread(waiting, signal)
            if "thread" in how or "blocks" in how
            else None
        )
        events, result, _ = run(model, signal=signal)
        if thread is not None:
            assert_joined(thread)
            assert woke == [True]

        assert (result.status, result.error) == ("cancelled", None)
        assert types_of(events) == ["message.accepted", *["model.chunk"] * chunks, "run.finished"]
        assert result.messages == (user(),)
        assert result.steps == model.call_count == 1
        assert model.finalized == ([] if how == "call-blocks-then-raises" else ["request-001"])


def budget_script(tool_steps: int) -> list[Any]:
    """``tool_steps`` toolCall steps (one echo each), then a stop response."""
    return [
        tool_turn(f"response-{step:03d}", echo_call(f"call-echo-{step:03d}"))
        for step in range(1, tool_steps + 1)
    ] + [stop(f"response-{tool_steps + 1:03d}")]


class TestStepBudget:
    @pytest.mark.parametrize("max_steps", [1, 2, 64])
    def test_tool_steps_up_to_the_budget_end_max_steps_without_a_continuation(
        self, max_steps: int
    ) -> None:
        """Seed: "If the current step equals maxSteps, the loop emits run.finished with
        status maxSteps and does not open another model request." """
        executed: list[str] = []
        events, result, model = run(
            budget_script(max_steps), tools=[echo_tool(executed)], max_steps=max_steps
        )

        assert result.status == "maxSteps"
        assert result.max_steps == max_steps
        assert result.steps == model.call_count == max_steps
        assert model.requests[-1].id == f"request-{max_steps:03d}"
        assert executed == [f"call-echo-{step:03d}" for step in range(1, max_steps + 1)]
        assert open_call_ids(result.messages) == []
        assert result.final_text is None
        check_run(events, result)

    @pytest.mark.parametrize("max_steps", [1, 2, 64])
    def test_a_stop_response_on_the_last_allowed_step_completes(self, max_steps: int) -> None:
        _events, result, model = run(
            budget_script(max_steps - 1), tools=[echo_tool()], max_steps=max_steps
        )

        assert result.status == "completed"
        assert result.max_steps is None
        assert result.steps == model.call_count == max_steps
        assert result.final_text == "The sum is 42."

    def test_the_budget_counts_model_turns_not_tool_calls(self) -> None:
        """Seed: "the budget counts model turns, not individual Tool calls." """
        calls = [echo_call(f"call-echo-{n:03d}") for n in range(1, 6)]
        executed: list[str] = []
        _events, result, _model = run(
            [tool_turn("response-001", *calls), stop("response-002")],
            tools=[echo_tool(executed)],
            max_steps=2,
        )

        assert len(executed) == 5
        assert result.status == "completed"
        assert result.steps == 2


def scripted_step(
    content: Sequence[Any], stop_reason: str = "toolCall", chunks: Sequence[Any] | None = None
) -> al.ScriptedResponse:
    """One scripted step, of any stop reason (even one the loop does not know)."""
    return al.scripted_response("response-001", content, cast(Any, stop_reason), chunks=chunks)


class TestFailureCodes:
    def test_invalid_transcript(self) -> None:
        events, result, _model = run([stop("response-001")], messages=[user(), add_result()])

        assert_failed(events, result, "INVALID_TRANSCRIPT")
        assert "tool-result-call-add-001" in result.error.message  # type: ignore[union-attr]

    def test_model_protocol_error(self) -> None:
        """Seed: "Tool calls are forbidden in a stop response." """
        events, result, _model = run([scripted_step([add_call()], "stop")], tools=[add_tool()])

        assert_failed(events, result, "MODEL_PROTOCOL_ERROR")
        assert result.messages == (user(),)

    @pytest.mark.parametrize(
        ("how", "chunks", "message"),
        [
            pytest.param("stream()-raises", 0, "no route to the model", id="stream()-raises"),
            pytest.param("stop-iteration-from-stream()", 0,
                         "model.stream() raised StopIteration: no stream",
                         id="StopIteration-from-stream()"),
            pytest.param(0, 0, "ConnectionResetError", id="the-stream-raises-at-once"),
            pytest.param(1, 1, "ConnectionResetError", id="the-stream-raises-after-a-call-chunk"),
            pytest.param(3, 3, "ConnectionResetError", id="the-stream-raises-after-3-chunks"),
            pytest.param("stop-iteration-inside", 1, "RuntimeError",
                         id="StopIteration-inside-the-generator"),
            pytest.param("base-exception", 1, "the model's stream raised Fatal: stop here",
                         id="a-BaseException-from-the-stream"),
        ],
    )  # fmt: skip
    def test_model_stream_error_when_the_model_fails(
        self, how: str | int, chunks: int, message: str
    ) -> None:
        """The module docstring: "any other exception from a model fails the run with
        MODEL_STREAM_ERROR"; the chunks before it have events, nothing is appended, and
        a tool call already announced never runs. A StopIteration raised by stream() is a
        failure like any other, never a RuntimeError out of the run (PEP 479); one raised
        inside the generator is a stream error, never a silently empty response."""
        raised: BaseException = ConnectionResetError("peer")

        def stream(model: FakeModel, request: al.ModelRequest, signal: Any) -> Any:
            nonlocal raised
            if how == "stream()-raises":
                raised = ConnectionError("no route to the model")
                raise raised
            if how == "stop-iteration-from-stream()":
                raised = StopIteration("no stream")
                raise raised
            return streaming(model, request)

        def streaming(model: FakeModel, request: al.ModelRequest) -> Generator[Any, None, Any]:
            nonlocal raised
            try:
                if isinstance(how, int):
                    items: list[al.ModelChunk] = [
                        al.ToolCallChunk(request.id, echo_call("call-1", "a"))
                    ]
                    items += [al.TextDelta(request.id, "b"), al.TextDelta(request.id, "c")]
                    yield from items[:how]
                    raise raised
                yield al.TextDelta(request.id, "x")
                if how == "stop-iteration-inside":
                    raise StopIteration
                raised = Fatal("stop here")
                raise raised
            finally:
                model.finalized.append(request.id)

        executed: list[str] = []
        model = FakeModel(stream, turn("response-unused", [text("unused")], "stop"))
        events, result, _ = run(model, [echo_tool(executed)])

        assert_failed(events, result, "MODEL_STREAM_ERROR", message)
        assert types_of(events) == ["message.accepted", *["model.chunk"] * chunks, "run.finished"]
        assert result.messages == (user(),)
        assert result.steps == model.call_count == 1
        assert executed == []
        assert model.finalized == ([] if "stream()" in str(how) else ["request-001"])
        assert result.error is not None
        if how != "stop-iteration-inside":
            assert result.error.exception is raised
        if how in ("base-exception", "stop-iteration-from-stream()"):
            assert result.error.message == message
            assert result.error.to_dict() == {"code": "MODEL_STREAM_ERROR", "message": message}

    def test_model_stream_error_when_a_scripted_model_runs_out_of_responses(self) -> None:
        events, result, model = run([tool_turn("response-001", add_call())], tools=[add_tool()])

        assert_failed(events, result, "MODEL_STREAM_ERROR")
        assert model.call_count == 2
        assert [request.id for request in model.requests] == ["request-001", "request-002"]
        round_one = (user(), assistant("response-001", add_call()), add_result())
        assert model.requests[1].messages == round_one
        assert result.messages == round_one
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

        def fatal(arguments: dict[str, Any], signal: Any) -> object:
            raise error

        executed: list[str] = []
        fatal_call = call("fatal", "call-fatal-001", {})
        events, result, model = run(
            [
                tool_turn("response-001", fatal_call, echo_call("call-echo-001")),
                stop("response-002"),
            ],
            tools=[no_arguments_tool("fatal", fatal), echo_tool(executed)],
            signal=threading.Event(),
        )

        assert_failed(events, result, "TOOL_PHASE_ERROR", str(error))
        assert result.error is not None
        assert result.error.exception is error
        assert types_of(events)[-2:] == ["tool.started", "run.finished"]
        assert "tool.finished" not in types_of(events)
        assert result.messages == (
            user(),
            assistant("response-001", fatal_call, echo_call("call-echo-001")),
        )
        assert open_call_ids(result.messages) == ["call-fatal-001", "call-echo-001"]
        assert executed == []
        assert model.call_count == 1

    def test_run_errors_differing_only_in_exception_are_equal(self) -> None:
        """API: "RunError.exception ... is not part of to_dict() or of equality"."""
        first = al.RunError("MODEL_STREAM_ERROR", "m", ValueError("a"))
        second = al.RunError("MODEL_STREAM_ERROR", "m", KeyError("b"))
        assert first == second
        assert first == al.RunError("MODEL_STREAM_ERROR", "m")
        assert "exception" not in first.to_dict()


class TestModelCorrelationAndAgreement:
    @pytest.mark.parametrize(
        "script",
        [
            pytest.param(
                scripted_step(
                    [text("The sum is 42.")], "stop", [text("The su"), text("m is 42.")]
                ),
                id="chunks-split-terminal-whole",
            ),
            pytest.param(
                scripted_step(
                    [text("The su"), text("m is 42.")], "stop", [text("The sum is 42.")]
                ),
                id="terminal-split-chunk-whole",
            ),
            pytest.param(
                scripted_step(
                    [text("The "), text("sum is 42.")], "stop", [text("The sum"), text(" is 42.")]
                ),
                id="both-split-differently",
            ),
        ],
    )
    def test_text_segmentation_may_differ(self, script: al.ScriptedResponse) -> None:
        """Seed: "The resulting normalized block sequences must agree in content and
        order; raw text-chunk segmentation may differ." """
        events, result, _model = run([script])

        assert result.status == "completed"
        assert result.final_text == "The sum is 42."
        assert script.chunks is not None
        assert types_of(events).count("model.chunk") == len(script.chunks)

    def test_tool_calls_are_boundaries_of_coalesced_text(self) -> None:
        """Seed: "coalesces adjacent streamed text deltas and adjacent terminal text
        blocks, using Tool calls as boundaries"."""
        content: list[Any] = [text("Add"), text("ing "), add_call(), text("now.")]
        chunks: list[Any] = [text("Adding "), add_call(), text("no"), text("w.")]
        _events, result, _model = run(
            [
                al.scripted_response("response-001", content, "toolCall", chunks=chunks),
                stop("response-002"),
            ],
            tools=[add_tool()],
        )

        assert result.status == "completed"
        assert result.messages[1] == assistant("response-001", *content)  # as returned

    def test_an_empty_text_chunk_carries_nothing(self) -> None:
        """Documented choice: normalisation drops empty text."""
        events, result, _model = run(
            [
                al.scripted_response(
                    "response-001", [add_call()], "toolCall", chunks=[text(""), add_call()]
                ),
                stop("response-002"),
            ],
            tools=[add_tool()],
        )

        assert result.status == "completed"
        assert types_of(events)[1:3] == ["model.chunk", "model.chunk"]

    def test_text_cannot_move_across_a_tool_call(self) -> None:
        content: list[Any] = [text("Adding "), add_call(), text("now.")]
        chunks: list[Any] = [text("Adding now."), add_call()]
        executed: list[str] = []
        events, result, _model = run(
            [al.scripted_response("response-001", content, "toolCall", chunks=chunks)],
            tools=recording_tools(executed),
        )

        assert_failed(events, result, "MODEL_PROTOCOL_ERROR")
        assert executed == []

    def test_a_violation_in_a_later_step_keeps_the_earlier_rounds(self) -> None:
        executed: list[str] = []
        events, result, _model = run(
            [
                tool_turn("response-001", add_call()),
                al.scripted_response(
                    "response-002", [text("Done."), add_call("call-add-002")], "stop"
                ),
            ],
            tools=recording_tools(executed),
        )

        assert_failed(events, result, "MODEL_PROTOCOL_ERROR")
        assert executed == ["add"]
        assert result.messages == (user(), assistant("response-001", add_call()), add_result())
        assert result.steps == 2


class TestStreamDisagreementIsShown:
    """Show the first differing normalised block on each side (shortened
    reprs), and when nothing was streamed at all, say that a model must yield a chunk
    for each block it returns."""

    def test_the_first_differing_block_is_shown_on_each_side(self) -> None:
        model = al.ScriptedModel(
            [
                al.scripted_response(
                    "r1",
                    [al.TextBlock("Hello"), al.TextBlock(" world")],
                    "stop",
                    chunks=[al.TextBlock("Hello"), al.TextBlock(" there")],
                )
            ]
        )
        _, result, _ = run(model)
        message = failure_message(result, "MODEL_PROTOCOL_ERROR")
        assert message == (
            "the streamed chunks and the terminal response disagree at normalised block 0: "
            "streamed 'Hello there', terminal 'Hello world'"
        )

    def test_a_missing_block_is_shown_as_nothing(self) -> None:
        call = al.ToolCall("c1", "echo", {"text": "x"})
        model = al.ScriptedModel(
            [
                al.scripted_response(
                    "r1", [al.TextBlock("a"), call], "toolCall", chunks=[al.TextBlock("a")]
                )
            ]
        )
        _, result, _ = run(model)
        message = failure_message(result, "MODEL_PROTOCOL_ERROR")
        assert "disagree at normalised block 1: streamed nothing, terminal ToolCall(" in message

    def test_long_blocks_are_shortened(self) -> None:
        model = al.ScriptedModel(
            [
                al.scripted_response(
                    "r1", [al.TextBlock("x" * 5000)], "stop", chunks=[al.TextBlock("y" * 5000)]
                )
            ]
        )
        _, result, _ = run(model)
        message = failure_message(result, "MODEL_PROTOCOL_ERROR")
        assert len(message) < 200
        assert "..." in message

    def test_a_model_that_streamed_nothing_is_told_to_yield_a_chunk_per_block(self) -> None:
        model = al.ScriptedModel(
            [al.scripted_response("r1", [al.TextBlock("a"), al.TextBlock("b")], "stop", chunks=[])]
        )
        _, result, _ = run(model)
        assert failure_message(result, "MODEL_PROTOCOL_ERROR") == (
            "the model streamed nothing, but its terminal response holds 2 block(s): a model "
            "must yield a chunk for each block it returns (a TextDelta per text, a "
            "ThinkingDelta per thinking, a ToolCallChunk per tool call)"
        )


def thinking_delta(value: str) -> Callable[[al.ModelRequest], object]:
    """A stream item: a ThinkingDelta of ``value`` for the active request."""
    return lambda request: al.ThinkingDelta(request.id, value)


REDACTED_BLOCK = al.ThinkingBlock("", "opaque-data", redacted=True)


class TestThinkingAgreement:
    """Streamed thinking agrees with the response's thinking blocks as text agrees with
    text blocks: adjacent thinking coalesces; text, thinking and tool calls are each
    other's boundaries; empty thinking (a redacted block) carries nothing and needs no
    chunk; a signature arrives only in the terminal response."""

    @pytest.mark.parametrize(
        ("content", "chunks"),
        [
            pytest.param([thought("Let me add.", "sig")], [thought("Let me"), thought(" add.")],
                         id="deltas-split-signed-block-whole"),
            pytest.param([thought("Let me", "s1"), thought(" add.", "s2")],
                         [thought("Let me add.")], id="blocks-split-delta-whole"),
            pytest.param([REDACTED_BLOCK, text("Hi.")], [text("Hi.")],
                         id="redacted-block-needs-no-chunk"),
            pytest.param([text("Hi"), REDACTED_BLOCK, text(" there.")], [text("Hi there.")],
                         id="redacted-block-between-text-carries-nothing"),
            pytest.param([thought("a", "s1"), REDACTED_BLOCK, thought("b", "s2")],
                         [thought("ab")], id="redacted-block-between-thinking"),
            pytest.param([thought("Hm.", "s"), text("Hi.")],
                         [thought(""), thought("Hm."), text(""), text("Hi.")],
                         id="empty-deltas-carry-nothing"),
        ],
    )  # fmt: skip
    def test_thinking_segmentation_may_differ(self, content: list[Any], chunks: list[Any]) -> None:
        events, result, _ = run(
            [al.scripted_response("response-001", content, "stop", chunks=chunks)]
        )
        assert result.status == "completed"
        assert result.messages[-1] == al.AssistantMessage("message-response-001", content)
        assert chunk_event_count(events) == len(chunks)

    @pytest.mark.parametrize(
        ("content", "chunks", "streamed", "terminal"),
        [
            pytest.param([thought("Hm."), text("Hi.")], [text("Hm."), text("Hi.")],
                         "'Hm.Hi.'", "thinking 'Hm.'", id="thinking-streamed-as-text"),
            pytest.param([text("Hm.")], [thought("Hm.")], "thinking 'Hm.'",
                         "'Hm.'", id="text-streamed-as-thinking"),
            pytest.param([thought("a"), text("x"), thought("b")],
                         [thought("ab"), text("x")], "thinking 'ab'", "thinking 'a'",
                         id="thinking-moved-across-text"),
            pytest.param([thought("a"), add_call(), thought("b")],
                         [thought("ab"), add_call()], "thinking 'ab'", "thinking 'a'",
                         id="thinking-moved-across-a-call"),
            pytest.param([thought("Hm.", "s")], [], None, None, id="thinking-not-streamed"),
        ],
    )  # fmt: skip
    def test_text_thinking_and_tool_calls_are_each_others_boundaries(
        self, content: list[Any], chunks: list[Any], streamed: str | None, terminal: str | None
    ) -> None:
        executed: list[str] = []
        stop_reason: Any = (
            "toolCall" if any(isinstance(b, al.ToolCall) for b in content) else "stop"
        )
        _, result, _ = run(
            [al.scripted_response("response-001", content, stop_reason, chunks=chunks)],
            recording_tools(executed),
        )
        message = failure_message(result, "MODEL_PROTOCOL_ERROR")
        if streamed is None:
            assert "a ThinkingDelta per thinking" in message
        else:
            assert f"streamed {streamed}" in message
            assert f"terminal {terminal}" in message
        assert result.messages == (user(),)
        assert executed == []

    def test_the_assistant_message_keeps_thinking_where_the_model_gave_it(self) -> None:
        """Thinking before and after text, a redacted block, then the call: the message
        appended, and the next request, hold the blocks exactly, in the model's order."""
        content: list[Any] = [
            thought("I should add.", "sig-1"),
            text("Adding."),
            REDACTED_BLOCK,
            thought("", "sig-empty"),
            add_call(),
        ]
        chunks: list[Any] = [thought("I should"), thought(" add."), text("Adding."), add_call()]
        events, result, model = run(
            [
                al.scripted_response("response-001", content, "toolCall", chunks=chunks),
                stop("response-002"),
            ],
            [add_tool()],
        )
        assert result.status == "completed"
        message = al.AssistantMessage("message-response-001", content)
        assert result.messages == (
            user(),
            message,
            add_result(),
            assistant("response-002", text("The sum is 42.")),
        )
        assert model.requests[1].messages[1] == message
        assert model.requests[1].messages[1].content == tuple(content)
        assert [e.payload["chunk"] for e in events if e.type == "model.chunk"][:2] == [
            al.ThinkingDelta("request-001", "I should"),
            al.ThinkingDelta("request-001", " add."),
        ]
        assert result.final_text == "The sum is 42."


def usage_step(response_id: str, usage: al.Usage | None, *blocks: Any) -> al.ScriptedResponse:
    """A scripted turn with this usage: a toolCall turn when a block is a call, else stop."""
    content = list(blocks) or [text("The sum is 42.")]
    calls = any(isinstance(block, al.ToolCall) for block in content)
    return al.scripted_response(response_id, content, "toolCall" if calls else "stop", usage=usage)


class TestRunUsage:
    """The message the loop appends keeps its response's usage; RunResult.usage is the
    sum over the responses this run appended (None: it appended none; a response without
    usage makes every field of the sum None; a failed or cancelled run sums what it
    appended)."""

    def test_each_message_keeps_its_responses_usage_and_the_run_sums_them(self) -> None:
        first, second = al.Usage(120, 30, 2048, 64, 10), al.Usage(180, 12, 2048, 0, 0)
        events, result, _ = run(
            [usage_step("response-001", first, add_call()), usage_step("response-002", second)],
            [add_tool()],
        )
        assert result.status == "completed"
        assert [m.usage for m in result.messages if isinstance(m, al.AssistantMessage)] == [
            first,
            second,
        ]
        assert result.usage == al.Usage(300, 42, 4096, 64, 10)
        assert events[-1].payload["result"].usage == result.usage

    def test_a_field_one_response_leaves_unknown_is_unknown_in_the_sum(self) -> None:
        _, result, _ = run(
            [
                usage_step("response-001", al.Usage(10, 5, None, None, 2), add_call()),
                usage_step("response-002", al.Usage(20, 7, 3, None, None)),
            ],
            [add_tool()],
        )
        assert result.usage == al.Usage(30, 12, None, None, None)

    def test_a_response_without_usage_makes_every_field_unknown(self) -> None:
        _, result, _ = run(
            [
                usage_step("response-001", None, add_call()),
                usage_step("response-002", al.Usage(1, 2, 3, 4, 5)),
            ],
            [add_tool()],
        )
        assert result.messages[1].usage is None  # type: ignore[union-attr]
        assert result.usage == al.Usage()

    def test_a_run_that_appended_no_response_has_no_usage(self) -> None:
        signal = threading.Event()
        signal.set()
        runs = [
            run([usage_step("response-001", al.Usage(1, 2))], signal=signal),  # cancelled
            run(  # the first response broke a rule
                [
                    al.scripted_response(
                        "response-001", [text("a")], "stop", chunks=[], usage=al.Usage(1, 2)
                    )
                ]
            ),
            run([], messages=[al.ToolResultMessage("t", "c", "x", "", False)]),
        ]
        for _, result, _ in runs:
            assert result.status in ("cancelled", "failed")
            assert result.usage is None
            assert "usage" not in result.to_dict()

    def test_a_failed_run_sums_the_responses_it_appended(self) -> None:
        """The response that broke a rule was not appended, and its usage is not counted."""
        _, result, _ = run(
            [
                usage_step("response-001", al.Usage(10, 1), add_call()),
                al.scripted_response(
                    "response-002", [text("a")], "stop", chunks=[], usage=al.Usage(99, 99)
                ),
            ],
            [add_tool()],
        )
        assert result.error is not None
        assert result.error.code == "MODEL_PROTOCOL_ERROR"
        assert result.usage == al.Usage(10, 1)

    def test_a_cancelled_run_sums_the_responses_it_appended(self) -> None:
        _, result, _ = run(
            [
                usage_step("response-001", al.Usage(10, 1), add_call()),
                usage_step("response-002", al.Usage(5, 5)),
            ],
            [add_tool()],
            signal=threading.Event(),
            cancel_at=("tool.started", 1),
        )
        assert result.status == "cancelled"
        assert result.usage == al.Usage(10, 1)

    def test_the_starting_messages_usage_is_not_this_runs(self) -> None:
        """A resumed transcript carries the cost of its earlier runs; this run's usage
        counts only the responses it appended."""
        earlier = al.AssistantMessage("message-response-000", (text("Hello."),), al.Usage(500, 50))
        _, result, model = run(
            [usage_step("response-001", al.Usage(7, 3))],
            messages=[user("Hi.", "user-000"), earlier, user()],
        )
        assert result.usage == al.Usage(7, 3)
        assert model.requests[0].messages[1].usage == al.Usage(500, 50)


class TestMistakesNameTheirFix:
    """The mistakes a newcomer makes first: each error says what to change."""

    def test_a_generator_that_returns_nothing_is_asked_for_its_response(self) -> None:
        def no_return(model: FakeModel, request: al.ModelRequest, signal: Any) -> Any:
            return stream_of(model, request, [al.TextBlock("hi")], lambda request: None)

        _, result, _ = run(FakeModel(no_return))
        assert failure_message(result, "MODEL_PROTOCOL_ERROR") == (
            "the model's stream returned a NoneType, not a ModelResponse (did its "
            "generator end without `return ModelResponse(...)`?)"
        )

    def test_another_wrong_response_type_is_named_without_the_hint(self) -> None:
        def returns_a_dict(model: FakeModel, request: al.ModelRequest, signal: Any) -> Any:
            return stream_of(model, request, [al.TextBlock("hi")], lambda request: {})

        _, result, _ = run(FakeModel(returns_a_dict))
        assert failure_message(result, "MODEL_PROTOCOL_ERROR") == (
            "the model's stream returned a dict, not a ModelResponse"
        )

    def test_an_unknown_stop_reason_lists_the_known_ones(self) -> None:
        model = al.ScriptedModel(
            [untyped.scripted_response("r1", [al.TextBlock("hi")], "end_turn")]
        )
        _, result, _ = run(model)
        assert failure_message(result, "MODEL_PROTOCOL_ERROR") == (
            "unknown stop reason 'end_turn' (expected one of ('stop', 'toolCall'))"
        )

    def test_a_foreign_request_id_says_which_id_is_expected(self) -> None:
        model = al.ScriptedModel(
            [al.scripted_response("r1", [al.TextBlock("hi")], "stop", request_id="request-1")]
        )
        _, result, _ = run(model)
        assert failure_message(result, "MODEL_PROTOCOL_ERROR") == (
            "'request-1' is not the active request 'request-001': every chunk's and the "
            "response's request_id must be the request's id"
        )

    def test_text_given_as_a_str_block_is_told_to_wrap_it(self) -> None:
        _, result, _ = run(al.ScriptedModel([]), messages=[untyped.AssistantMessage("a1", ["hi"])])
        assert failure_message(result, "INVALID_TRANSCRIPT") == (
            "message 'a1': a str is not a TextBlock, ThinkingBlock or ToolCall: wrap text in "
            "TextBlock(...)"
        )

    def test_a_dict_message_is_pointed_at_message_from_dict(self) -> None:
        _, result, _ = run(
            al.ScriptedModel([]), messages=[{"id": "u1", "role": "user", "content": "x"}]
        )
        assert failure_message(result, "INVALID_TRANSCRIPT") == (
            "a dict is not a message (read a dict with message_from_dict())"
        )

    @pytest.mark.parametrize("field", ["content", "chunks"])
    def test_a_script_given_text_as_a_str_is_a_type_error(self, field: str) -> None:
        blocks = {"content": [al.TextBlock("hello")], field: "hello"}
        with pytest.raises(TypeError, match=f"^scripted {field} must be a sequence .* got a str"):
            untyped.ScriptedResponse("r1", blocks["content"], "stop", chunks=blocks.get("chunks"))


class TestRunHelpers:
    def test_settle_run_returns_every_event_and_the_return_value(self) -> None:
        result = al.RunResult("completed", (), 0, final_text="")
        finished = al.Event(1, "run.finished", {"result": result})
        accepted = al.Event(0, "message.accepted", {"message": user()})

        def two_events() -> Generator[al.Event, None, al.RunResult]:
            yield accepted
            yield finished
            return result

        events, returned = al.settle_run(two_events())

        assert events == [accepted, finished]
        assert returned is result

    def test_settle_run_hands_each_event_to_on_event_as_it_comes(self) -> None:
        seen: list[tuple[int, int]] = []  # (sequence, events the run had yielded by then)
        yielded = 0

        def counted() -> Generator[al.Event, None, al.RunResult]:
            nonlocal yielded
            for sequence in range(3):
                yielded += 1
                yield al.Event(sequence, "message.accepted", {"message": user()})
            return al.RunResult("completed", (), 0, final_text="")

        events, result = al.settle_run(
            counted(), on_event=lambda e: seen.append((e.sequence, yielded))
        )

        assert seen == [(0, 1), (1, 2), (2, 3)]
        assert [event.sequence for event in events] == [0, 1, 2]
        assert result.status == "completed"

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
            pytest.param(
                (text("A"), add_call(), text("B"), echo_call("call-echo-001")),
                "AB",
                id="skips-calls",
            ),
            pytest.param((add_call(),), "", id="calls-only"),
            pytest.param((), "", id="empty"),
        ],
    )
    def test_text_from_assistant_concatenates_text_blocks(
        self, blocks: tuple[Any, ...], expected: str
    ) -> None:
        assert al.text_from_assistant(al.AssistantMessage("message-x", blocks)) == expected

    def test_final_text_is_the_text_of_the_stop_response(self) -> None:
        """Seed: "the assistant message is appended and textFromAssistant() becomes
        finalText." """
        _events, result, _model = run([scripted_step([text("The sum"), text(" is 42.")], "stop")])

        assert result.final_text == "The sum is 42."
        assert result.messages[-1] == assistant("response-001", text("The sum"), text(" is 42."))

    @pytest.mark.parametrize("given", ["None", "Event", "signal-like"])
    def test_the_model_and_every_tool_receive_the_run_signal(self, given: str) -> None:
        signal: Any = {"None": None, "Event": threading.Event(), "signal-like": SignalLike()}[
            given
        ]
        received: list[Any] = []

        def stream(model: FakeModel, request: al.ModelRequest, model_signal: Any) -> Any:
            received.append(model_signal)
            if len(received) == 1:
                yield al.ToolCallChunk(request.id, call("note", "call-note-001", {}))
                return al.ModelResponse(
                    "response-001", request.id, (call("note", "call-note-001", {}),), "toolCall"
                )
            yield al.TextDelta(request.id, "Done.")
            return al.ModelResponse("response-002", request.id, (text("Done."),), "stop")

        def note(arguments: dict[str, Any], tool_signal: Any) -> object:
            received.append(tool_signal)
            return "noted"

        _events, result, _ = run(
            FakeModel(stream, stream), tools=[no_arguments_tool("note", note)], signal=signal
        )

        assert result.status == "completed"
        assert len(received) == 3
        assert received[0] is received[1] is received[2]
        if signal is None:
            assert isinstance(received[0], threading.Event)
            assert not received[0].is_set()
        else:
            assert received[0] is signal


@dataclasses.dataclass
class CallPlan:
    """One tool call of a script and what the reference expects of it."""

    call: al.ToolCall
    runs: bool  # whether the tool's function is entered
    record: tuple[object, ...]  # what the tool logs when it runs
    is_error: bool
    content: str | None  # the expected result content, when it is predictable


@dataclasses.dataclass
class StepPlan:
    """One model step of a script. ``stream`` items: a block (streamed as its chunk) or a
    callable(request) whose return value is yielded raw (or which raises)."""

    response_id: str
    stream: list[object]
    response: Callable[[al.ModelRequest], object]
    chunk_events: int  # model.chunk events this step yields
    code: str | None = None  # the failure this step causes, if any
    stop: bool = False
    calls: list[CallPlan] = dataclasses.field(default_factory=list)
    final_text: str = ""


def echo_plan(call_id: str, value: str) -> CallPlan:
    return CallPlan(echo_call(call_id, value), True, ("echo", value), False, value)


def add_plan(call_id: str, left: int, right: int) -> CallPlan:
    return CallPlan(
        al.ToolCall(call_id, "add", {"left": left, "right": right}),
        True,
        ("add", left, right),
        False,
        f'{{"sum":{left + right}}}',
    )


def boom_plan(call_id: str, value: str) -> CallPlan:
    """A tool that runs and raises: a recoverable error result."""
    return CallPlan(
        al.ToolCall(call_id, "boom", {"text": value}), True, ("boom", value), True, None
    )


def plan_tools(log: list[tuple[object, ...]]) -> list[al.Tool]:
    """echo, add and boom; each appends what it was called with to ``log``."""
    string = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

    def echo(arguments: dict[str, Any], signal: Any) -> object:
        log.append(("echo", arguments["text"]))
        return arguments["text"]

    def add(arguments: dict[str, Any], signal: Any) -> object:
        log.append(("add", arguments["left"], arguments["right"]))
        return {"sum": arguments["left"] + arguments["right"]}

    def boom(arguments: dict[str, Any], signal: Any) -> object:
        log.append(("boom", arguments["text"]))
        raise ValueError("boom " + arguments["text"])

    return [
        al.Tool("echo", "Returns its text.", string, echo),
        al.Tool("add", "Adds two numbers.", NUMBERS, add),
        al.Tool("boom", "Always raises.", string, boom),
    ]


def plan_step(
    response_id: str,
    items: Sequence[object],
    stop_reason: str,
    *,
    stream: Sequence[object] | None = None,
    content: Sequence[object] | None = None,
) -> StepPlan:
    """A valid step: ``items`` are texts and CallPlans in assistant order."""
    blocks = [
        al.TextBlock(item) if isinstance(item, str) else cast(CallPlan, item).call
        for item in items
    ]
    content = blocks if content is None else list(content)
    stream = blocks if stream is None else list(stream)
    return StepPlan(
        response_id,
        list(stream),
        respond(response_id, content, stop_reason),
        len(stream),
        stop=stop_reason == "stop",
        calls=[item for item in items if isinstance(item, CallPlan)],
        final_text="".join(item for item in items if isinstance(item, str)),
    )


@dataclasses.dataclass
class Prediction:
    events: list[tuple[str, int, str | None]]  # (type, step, tool-call id)
    status: str
    code: str | None
    steps: int
    message_ids: list[str]
    results: dict[str, CallPlan]  # result message id -> its call's plan
    executed: list[tuple[object, ...]]
    final_text: str | None


def predict(
    start: Sequence[al.Message],
    plans: Sequence[StepPlan],
    max_steps: int,
    cancel_at: int | None = None,
) -> Prediction:
    """What the seed says the run does: events, status, steps, transcript, tool effects.
    ``cancel_at``: the signal is set when the event with that sequence arrives."""
    events: list[tuple[str, int, str | None]] = [("message.accepted", 0, None)] * len(start)
    # Each message with the index of the first event that proves it was appended.
    messages: list[tuple[str, int]] = [(message.id, -1) for message in start]
    executed: list[tuple[tuple[object, ...], int]] = []
    results: dict[str, CallPlan] = {}
    code: str | None = None
    final_text: str | None = None
    status = "maxSteps"
    steps = max_steps
    for step in range(1, max_steps + 1):
        if step > len(plans):  # the model has nothing left: its stream() raises
            status, code, steps = "failed", "MODEL_STREAM_ERROR", step
            break
        plan = plans[step - 1]
        events += [("model.chunk", step, None)] * plan.chunk_events
        if plan.code is not None:
            status, code, steps = "failed", plan.code, step
            break
        # The assistant message is appended before the first tool.started (or run.finished).
        messages.append(("message-" + plan.response_id, len(events)))
        if plan.stop:
            status, final_text, steps = "completed", plan.final_text, step
            break
        for call_plan in plan.calls:
            events.append(("tool.started", step, call_plan.call.id))
            events.append(("tool.finished", step, call_plan.call.id))
            messages.append(("tool-result-" + call_plan.call.id, len(events) - 1))
            results["tool-result-" + call_plan.call.id] = call_plan
            if call_plan.runs:
                executed.append((call_plan.record, len(events) - 1))
    events.append(("run.finished", steps, None))
    if cancel_at is not None and cancel_at < len(events) - 1:
        # The loop looks at the signal right after each event: it stops there, keeping
        # the messages appended so far and opening no further request.
        events = events[: cancel_at + 1]
        steps = max(step for _, step, _ in events)
        events.append(("run.finished", steps, None))
        status, code, final_text = "cancelled", None, None
        messages = [(message_id, proof) for message_id, proof in messages if proof <= cancel_at]
        executed = [(record, proof) for record, proof in executed if proof <= cancel_at]
    return Prediction(
        events,
        status,
        code,
        steps,
        [message_id for message_id, _ in messages],
        results,
        [record for record, _ in executed],
        final_text,
    )


def run_plans(
    start: Sequence[al.Message],
    plans: Sequence[StepPlan],
    max_steps: int,
    cancel_at: int | None = None,
) -> tuple[list[al.Event], al.RunResult, FakeModel, list[tuple[object, ...]]]:
    """Runs a script; the consumer sets the signal when event ``cancel_at`` arrives."""
    log: list[tuple[object, ...]] = []
    model = FakeModel(*[stream_step(plan.stream, plan.response) for plan in plans])
    events, result, _ = run(
        model,
        plan_tools(log),
        messages=list(start),
        max_steps=max_steps,
        signal=threading.Event(),
        cancel_at=cancel_at,
    )
    return events, result, model, log


def assert_predicted(
    prediction: Prediction,
    events: Sequence[al.Event],
    result: al.RunResult,
    model: FakeModel,
    log: Sequence[tuple[object, ...]],
    plans: Sequence[StepPlan],
) -> None:
    def request_id(step: int) -> str:
        return f"request-{step:03d}"

    observed = []
    for event in events:
        payload = event.payload
        call_id = payload["tool_call"].id if "tool_call" in payload else None
        step = int(payload["request_id"][len("request-") :]) if "request_id" in payload else 0
        observed.append((event.type, step, call_id))
    # run.finished carries no request id; the prediction tags it with the step count.
    assert observed[:-1] == prediction.events[:-1]
    assert observed[-1][0] == "run.finished"
    assert result.status == prediction.status
    assert (result.error.code if result.error else None) == prediction.code
    assert result.steps == prediction.steps
    assert model.call_count == prediction.steps
    assert [message.id for message in result.messages] == prediction.message_ids
    assert result.final_text == prediction.final_text
    assert log == prediction.executed
    for message in result.messages:
        if message.id in prediction.results and isinstance(message, al.ToolResultMessage):
            expected = prediction.results[message.id]
            assert message.is_error is expected.is_error
            if expected.content is not None:
                assert message.content == expected.content
    # Every stream the loop opened was finished or closed: none is left suspended.
    opened = [request_id(step) for step in range(1, prediction.steps + 1) if step <= len(plans)]
    assert model.finalized == opened


def sweep_scripts() -> dict[str, tuple[Sequence[al.Message], list[StepPlan], int]]:
    """Multi-step scripts with several tool calls, ending in each natural status."""
    step_one = plan_step(
        "response-001",
        ["Let me ", echo_plan("call-echo-001", "a"), add_plan("call-add-001", 20, 22)],
        "toolCall",
        stream=[
            al.TextBlock("Let "),
            al.TextBlock("me "),
            echo_call("call-echo-001", "a"),
            al.ToolCall("call-add-001", "add", {"left": 20, "right": 22}),
        ],
    )
    step_two = plan_step(
        "response-002",
        [boom_plan("call-boom-001", "b"), "and ", echo_plan("call-echo-002", "c")],
        "toolCall",
    )
    step_three = plan_step(
        "response-003",
        ["The sum is 42."],
        "stop",
        stream=[al.TextBlock("The "), al.TextBlock("sum is "), al.TextBlock("42.")],
    )
    violation = dataclasses.replace(
        plan_step("response-003", ["Bad ", echo_plan("call-echo-003", "d")], "stop"),
        code="MODEL_PROTOCOL_ERROR",
    )
    return {
        "completed": (HISTORY, [step_one, step_two, step_three], 3),
        "maxSteps": (HISTORY, [step_one, step_two, step_three], 2),
        "failed": ([user()], [step_one, step_two, violation], 3),
    }


def sweep_params() -> list[Any]:
    params = []
    for name, (start, plans, max_steps) in sweep_scripts().items():
        count = len(predict(start, plans, max_steps).events)
        params += [pytest.param(name, k, id=f"{name}-event-{k}") for k in range(count)]
    return params


@pytest.mark.hostile
class TestCancellationAtEveryEvent:
    """Seed: "Cancellation can arrive during initial emission, model streaming, terminal
    response waiting, Tool execution, or between phases. The result retains only complete
    messages." The signal is set when event k arrives, for every k of three scripts."""

    @pytest.mark.parametrize(("script", "k"), sweep_params())
    def test_cancel_when_event_k_arrives(self, script: str, k: int) -> None:
        start, plans, max_steps = sweep_scripts()[script]
        natural_events, natural, _, natural_log = run_plans(start, plans, max_steps)
        events, result, model, log = run_plans(start, plans, max_steps, cancel_at=k)

        last = len(natural_events) - 1
        assert result.status == ("cancelled" if k < last else natural.status)
        # The run is the natural run up to event k, then run.finished.
        assert [(e.sequence, e.type, dict(e.payload)) for e in events[:-1]] == [
            (e.sequence, e.type, dict(e.payload)) for e in natural_events[: min(k, last - 1) + 1]
        ]
        # Only complete messages: what the natural run had appended when event k arrived.
        assert result.messages == natural.messages[: len(result.messages)]
        assert log == natural_log[: len(log)]
        assert_predicted(predict(start, plans, max_steps, k), events, result, model, log, plans)
        if natural_events[k].type == "tool.started":
            # Seed: "appends no fabricated result" for the call that was interrupted.
            interrupted = natural_events[k].payload["tool_call"]
            assert interrupted.id not in [
                m.tool_call_id for m in result.messages if isinstance(m, al.ToolResultMessage)
            ]
            assert interrupted == events[-2].payload["tool_call"]

    def test_sweep_visits_every_kind_of_event(self) -> None:
        """The sweep is not vacuous: each script has all five event types, several tool
        calls, and ends with the status it is named after."""
        for name, (start, plans, max_steps) in sweep_scripts().items():
            events, result, _, _ = run_plans(start, plans, max_steps)
            assert set(types_of(events)) == set(EVENT_TYPES)
            assert result.status == name
            assert types_of(events).count("tool.started") >= 3


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


def drain(run_: Any, events: list[al.Event]) -> None:
    """Appends each event of a run to ``events`` until the run ends or raises."""
    for event in run_:
        events.append(event)


@pytest.mark.hostile
class TestInterruptsAreNeverSwallowed:
    """KeyboardInterrupt and SystemExit from the model or a tool propagate out of next()
    unchanged; the model's stream is closed and no tool runs after them."""

    @pytest.mark.parametrize("error_type", [KeyboardInterrupt, SystemExit])
    @pytest.mark.parametrize("where", ["stream()", "generator"])
    def test_from_the_model(self, error_type: type, where: str) -> None:
        error = error_type()
        executed: list[str] = []

        def raise_from_stream(model: FakeModel, request: al.ModelRequest, signal: Any) -> object:
            raise error

        if where == "stream()":
            step: Step = raise_from_stream
        else:
            step = stream_step(
                [echo_call("call-1", "a"), raise_error(error)], raise_error(AssertionError())
            )
        model = FakeModel(step)
        run_ = start_run(model, [echo_tool(executed)])
        events: list[al.Event] = []
        with pytest.raises(error_type) as raised:
            drain(run_, events)
        assert raised.value is error
        assert "run.finished" not in types_of(events)
        assert model.finalized == ([] if where == "stream()" else ["request-001"])
        assert executed == []
        with pytest.raises(StopIteration):
            next(run_)

    @pytest.mark.parametrize("error_type", [KeyboardInterrupt, SystemExit])
    def test_from_a_tool(self, error_type: type) -> None:
        error = error_type()
        executed: list[str] = []

        def interrupt(arguments: dict[str, Any], signal: Any) -> object:
            raise error

        tools = [
            al.Tool("stop", "Interrupts.", {"type": "object"}, interrupt),
            echo_tool(executed),
        ]
        model = FakeModel(
            turn(
                "response-001",
                [al.ToolCall("call-1", "stop", {}), echo_call("call-2", "b")],
                "toolCall",
            )
        )
        run_ = start_run(model, tools)
        events: list[al.Event] = []
        with pytest.raises(error_type) as raised:
            drain(run_, events)
        assert raised.value is error
        assert types_of(events) == ["message.accepted", *["model.chunk"] * 2, "tool.started"]
        assert executed == []  # the next call of the batch never ran
        assert model.finalized == ["request-001"]
        with pytest.raises(StopIteration):
            next(run_)


def bad_schema_plan(call_id: str) -> CallPlan:
    """Arguments that fail the echo schema: a recoverable error, the tool never runs."""
    return CallPlan(al.ToolCall(call_id, "echo", {"text": 5}), False, (), True, None)


def unknown_tool_plan(call_id: str) -> CallPlan:
    return CallPlan(al.ToolCall(call_id, "missing", {"x": 1}), False, (), True, None)


BAD_ARGUMENTS: tuple[Callable[[], Any], ...] = (
    lambda: {"x": float("nan")},
    lambda: {1: "key"},
    cyclic_object,
    lambda: nested(41, "object"),
    lambda: {"x": {1, 2}},
)


BAD_CHUNKS: tuple[Callable[[al.ModelRequest], object], ...] = (
    lambda r: None,
    lambda r: "text",
    lambda r: untyped.TextDelta(r.id, None),
    lambda r: untyped.TextDelta(r.id, 5),
    lambda r: untyped.ToolCallChunk(r.id, untyped.TextBlock("x")),
    lambda r: untyped.ToolCallChunk(r.id, None),
    lambda r: al.TextDelta("request-999", "x"),
)


BAD_RESPONSES: tuple[Callable[[al.ModelRequest], object], ...] = (
    lambda r: None,
    lambda r: {"id": "r"},
    lambda r: al.ModelResponse("", r.id, [], "stop"),
    lambda r: untyped.ModelResponse(None, r.id, [], "stop"),
    lambda r: untyped.ModelResponse("r-bad", r.id, [], "length"),
    lambda r: al.ModelResponse("r-bad", "request-999", [], "stop"),
)


VIOLATIONS = (
    "stop-with-call",
    "toolCall-without-call",
    "disagree",
    "duplicate-id",
    "reused-id",
    "bad-arguments",
    "bad-chunk",
    "bad-response",
    "stream-raises",
)


def random_text(rng: random.Random) -> str:
    return "".join(rng.choice(["a", "b", " ", "é", "🙂", "42"]) for _ in range(rng.randint(0, 5)))


def split_text(rng: random.Random, value: str) -> list[al.TextBlock]:
    """Random chunk boundaries, empty pieces included: all of it normalises to ``value``."""
    cuts = sorted(rng.randint(0, len(value)) for _ in range(rng.randint(0, 3)))
    bounds = [0, *cuts, len(value)]
    return [al.TextBlock(value[a:b]) for a, b in zip(bounds, bounds[1:])]


def random_call(rng: random.Random, call_id: str) -> CallPlan:
    kind = rng.randrange(5)
    if kind == 0:
        return echo_plan(call_id, random_text(rng))
    if kind == 1:
        return add_plan(call_id, rng.randint(-9, 9), rng.randint(0, 99))
    if kind == 2:
        return boom_plan(call_id, random_text(rng))
    if kind == 3:
        return bad_schema_plan(call_id)
    return unknown_tool_plan(call_id)


def random_valid_step(
    rng: random.Random, response_id: str, step: int, stop: bool
) -> tuple[list[object], StepPlan]:
    """A valid step with random text, calls and chunk splits; returns its items too."""
    items: list[object] = []
    if stop:
        items = [random_text(rng) for _ in range(rng.randint(0, 3))]
    else:
        if rng.random() < 0.5:
            items.append(random_text(rng))
        for index in range(rng.randint(1, 3)):
            items.append(random_call(rng, f"call-{step}-{index}"))
            if rng.random() < 0.3:
                items.append(random_text(rng))
    stream: list[object] = []
    content: list[object] = []
    for item in items:
        if isinstance(item, str):
            stream += split_text(rng, item)
            # The terminal response may split its text differently, or drop empty text.
            if item and rng.random() < 0.5:
                content += split_text(rng, item)
            elif item or rng.random() < 0.5:
                content.append(al.TextBlock(item))
        else:
            stream.append(cast(CallPlan, item).call)
            content.append(cast(CallPlan, item).call)
    plan = plan_step(
        response_id, items, "stop" if stop else "toolCall", stream=stream, content=content
    )
    return items, plan


def random_violation(
    rng: random.Random, response_id: str, step: int, used_ids: Sequence[str]
) -> StepPlan:
    """A step that breaks one rule; the reference knows how many chunks get an event."""
    kind = rng.choice(VIOLATIONS)
    _, plan = random_valid_step(rng, response_id, step, stop=kind == "toolCall-without-call")
    stream = list(plan.stream)
    if kind == "stop-with-call":
        # A toolCall script answered with stopReason stop: all chunks stream, then it fails.
        calls: list[object] = [block for block in stream if isinstance(block, al.ToolCall)]
        return dataclasses.replace(
            plan,
            response=respond(response_id, calls, "stop"),
            stream=calls,
            chunk_events=len(calls),
            code="MODEL_PROTOCOL_ERROR",
        )
    if kind == "toolCall-without-call":
        return dataclasses.replace(
            plan,
            response=respond(response_id, [al.TextBlock("x")], "toolCall"),
            stream=[*stream, al.TextBlock("x")],
            chunk_events=len(stream) + 1,
            code="MODEL_PROTOCOL_ERROR",
        )
    if kind == "disagree":
        return dataclasses.replace(
            plan,
            stream=[*stream, al.TextBlock("!")],
            chunk_events=len(stream) + 1,
            code="MODEL_PROTOCOL_ERROR",
        )
    if kind in ("duplicate-id", "reused-id"):
        reused = rng.choice(list(used_ids)) if kind == "reused-id" and used_ids else None
        stream_calls = [block for block in stream if isinstance(block, al.ToolCall)]
        duplicate_id = reused or stream_calls[0].id
        duplicate = al.ToolCall(duplicate_id, "echo", {"text": "dup"})
        content: list[object] = [*stream_calls, duplicate] if reused is None else [duplicate]
        return dataclasses.replace(
            plan,
            stream=content,
            response=respond(response_id, content, "toolCall"),
            chunk_events=len(content),
            code="MODEL_PROTOCOL_ERROR",
        )
    position = rng.randint(0, len(stream))
    if kind == "bad-arguments":
        bad: object = al.ToolCall(f"call-{step}-bad", "echo", rng.choice(BAD_ARGUMENTS)())
        code = "MODEL_PROTOCOL_ERROR"
    elif kind == "bad-chunk":
        bad = rng.choice(BAD_CHUNKS)
        code = "MODEL_PROTOCOL_ERROR"
    elif kind == "stream-raises":
        bad = raise_error(ConnectionResetError("peer"))
        code = "MODEL_STREAM_ERROR"
    else:  # bad-response: every chunk streams, then the terminal response is wrong
        return dataclasses.replace(
            plan, response=rng.choice(BAD_RESPONSES), code="MODEL_PROTOCOL_ERROR"
        )
    return dataclasses.replace(
        plan,
        stream=[*stream[:position], bad, *stream[position:]],
        chunk_events=position,
        code=code,
    )


def random_script(
    rng: random.Random,
) -> tuple[list[al.Message], list[StepPlan], int, int | None]:
    start: list[al.Message] = list(HISTORY) if rng.random() < 0.3 else [user()]
    used_ids = ["call-old"] if len(start) > 1 else []
    plans: list[StepPlan] = []
    for step in range(1, rng.randint(1, 7) + 1):
        response_id = f"response-{step:03d}"
        roll = rng.random()
        if roll < 0.2:
            plans.append(random_violation(rng, response_id, step, used_ids))
            break
        _, plan = random_valid_step(rng, response_id, step, stop=roll < 0.4)
        plans.append(plan)
        used_ids += [call_plan.call.id for call_plan in plan.calls]
        if plan.stop:
            break
    if rng.random() < 0.1:
        plans = plans[: rng.randint(0, len(plans) - 1)]  # the model runs out of answers
    max_steps = rng.randint(1, 6)
    cancel_at = None
    if rng.random() < 0.3:
        cancel_at = rng.randrange(len(predict(start, plans, max_steps).events))
    return start, plans, max_steps, cancel_at


RANDOM_SEEDS = 40


SCRIPTS_PER_SEED = 10


@pytest.mark.hostile
class TestRandomScriptsAgainstAReference:
    """Seeded random scripts mixing text, tool calls, bad arguments, raising tools, random
    chunk splits, protocol violations, budgets and cancellation. Each run keeps every
    invariant and ends as the reference model predicts: status, failure code, steps,
    events, transcript and tool effects."""

    @pytest.mark.parametrize("seed", range(RANDOM_SEEDS))
    def test_random_scripts(self, seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(SCRIPTS_PER_SEED):
            start, plans, max_steps, cancel_at = random_script(rng)
            prediction = predict(start, plans, max_steps, cancel_at)
            events, result, model, log = run_plans(start, plans, max_steps, cancel_at)
            assert_predicted(prediction, events, result, model, log, plans)
            assert model.call_count == result.steps <= max_steps

    def test_random_scripts_reach_every_outcome(self) -> None:
        """The generator is not vacuous: across the seeds it produces every status and
        every code it can, and cancels at every kind of event."""
        statuses = set()
        cancelled_at = set()
        for seed in range(RANDOM_SEEDS):
            rng = random.Random(seed)
            for _ in range(SCRIPTS_PER_SEED):
                start, plans, max_steps, cancel_at = random_script(rng)
                prediction = predict(start, plans, max_steps, cancel_at)
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


INVALID_STARTS = [
    pytest.param([user(), "Add 20 and 22."], id="non-message-item"),
    pytest.param([user(), user().to_dict()], id="message-dict-not-a-message"),
    pytest.param([user(), add_result()], id="result-without-call"),
    pytest.param(
        [user(), add_result(), assistant("response-000", add_call())], id="result-before-call"
    ),
    pytest.param(
        [
            user(),
            assistant("response-000", add_call()),
            al.ToolResultMessage("tool-result-call-add-001", "call-add-001", "echo", "42", False),
        ],
        id="mismatched-tool-name",
    ),
    pytest.param(
        [
            user(),
            *ADD_ROUND,
            al.ToolResultMessage("tool-result-again", "call-add-001", "add", "42", False),
        ],
        id="two-results-for-one-call",
    ),
    pytest.param([user("One.", "user-001"), user("Two.", "user-001")], id="duplicate-message-ids"),
    pytest.param(
        [user(), *ADD_ROUND, assistant("response-001", add_call())], id="duplicate-tool-call-ids"
    ),
    pytest.param(
        [user(), assistant("response-000", add_call(), add_call()), add_result()],
        id="duplicate-tool-call-ids-in-one-message",
    ),
    pytest.param([user(), assistant("response-000", add_call())], id="incomplete-open-call"),
    pytest.param(
        [user(), assistant("response-000", add_call(), echo_call("call-echo-001")), add_result()],
        id="incomplete-one-of-two-calls",
    ),
    pytest.param([al.UserMessage("user-001", cast(Any, 42))], id="user-content-int"),
    pytest.param([al.UserMessage("", "Hi.")], id="empty-id"),
    pytest.param([al.UserMessage(cast(Any, 7), "Hi.")], id="int-id"),
    pytest.param(
        [user(), al.AssistantMessage("message-response-000", cast(Any, ("Hello.",)))],
        id="assistant-block-not-a-block",
    ),
    pytest.param(
        [
            user(),
            assistant("response-000", add_call()),
            al.ToolResultMessage(
                "tool-result-call-add-001", "call-add-001", "add", "42", cast(Any, "no")
            ),
        ],
        id="result-is_error-not-bool",
    ),
    pytest.param(
        [
            user(),
            assistant(
                "response-000", al.ToolCall("call-add-001", "add", cast(Any, {"left": object()}))
            ),
            add_result(),
        ],
        id="tool-call-arguments-not-json",
    ),
]


class TestInvalidStartingTranscript:
    @pytest.mark.parametrize("messages", INVALID_STARTS)
    def test_an_invalid_start_fails_with_one_event_and_never_calls_the_model(
        self, messages: list[Any]
    ) -> None:
        """Seed: "An invalid starting transcript produces one run.finished event with a
        failed INVALID_TRANSCRIPT result and never invokes the model." """
        events, result, model = run([stop("response-001")], messages=messages, tools=[add_tool()])

        assert types_of(events) == ["run.finished"]
        assert_failed(events, result, "INVALID_TRANSCRIPT")
        assert model.call_count == 0
        assert result.messages == ()
        assert result.steps == 0

    def test_an_invalid_start_is_reported_even_when_the_signal_is_already_set(self) -> None:
        """Documented choice: the inputs decide before the signal is looked at."""
        signal = threading.Event()
        signal.set()
        events, result, model = run(
            [stop("response-001")], messages=[user(), user()], signal=signal
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

    def test_a_start_with_complete_prior_tool_rounds_is_valid(self) -> None:
        _events, result, model = run(
            [tool_turn("response-001", add_call()), stop("response-002")],
            messages=PRIOR_ROUND,
            tools=[add_tool()],
        )

        assert result.status == "completed"
        assert result.messages[: len(PRIOR_ROUND)] == PRIOR_ROUND
        assert model.requests[0].messages == PRIOR_ROUND


# Every field of every message kind that _checked_message checks, with a wrong value.
FIELD_CASES = [
    pytest.param(al.UserMessage("u", "hi"), "id", 5, "user", "non-empty str", id="u-id"),
    pytest.param(al.UserMessage("u", "hi"), "id", "", "user", "non-empty str", id="u-empty-id"),
    pytest.param(al.UserMessage("u", "hi"), "content", 5, "message 'u'", "str", id="u-content"),
    pytest.param(
        al.AssistantMessage("a", ()), "id", None, "assistant", "non-empty str", id="a-id"
    ),
    pytest.param(
        al.ToolResultMessage("t", "c", "n", "x", False),
        "id",
        b"t",
        "toolResult",
        "non-empty str",
        id="t-id",
    ),
    pytest.param(
        al.ToolResultMessage("t", "c", "n", "x", False),
        "tool_call_id",
        1,
        "message 't'",
        "non-empty str",
        id="t-tool_call_id",
    ),
    pytest.param(
        al.ToolResultMessage("t", "c", "n", "x", False),
        "tool_name",
        "",
        "message 't'",
        "non-empty str",
        id="t-tool_name",
    ),
    pytest.param(
        al.ToolResultMessage("t", "c", "n", "x", False),
        "content",
        ["x"],
        "message 't'",
        "str",
        id="t-content",
    ),
    pytest.param(
        al.ToolResultMessage("t", "c", "n", "x", False),
        "is_error",
        0,
        "message 't'",
        "bool",
        id="t-is_error",
    ),
]


class TestWrongFieldIsNamed:
    """An error about a message field names the field, with the type expected and the
    type given, not just "message 'u' has a field of the wrong type"."""

    @pytest.mark.parametrize(("message", "name", "value", "where", "expected"), FIELD_CASES)
    def test_every_field_of_every_message_kind(
        self, message: al.Message, name: str, value: object, where: str, expected: str
    ) -> None:
        broken = dataclasses.replace(cast(Any, message), **{name: value})
        _, result, _ = run(al.ScriptedModel([]), messages=[broken])
        said = failure_message(result, "INVALID_TRANSCRIPT")
        assert where in said.split(":")[0]  # the message, or for its id, its role
        assert f"field {name!r} must be a {expected}, got " in said
        assert said.endswith(f"got {value!r} ({type(value).__name__})")

    def test_a_text_block_names_its_text_field(self) -> None:
        block = al.TextBlock(5)  # type: ignore[arg-type]
        _, result, _ = run(al.ScriptedModel([]), messages=[al.AssistantMessage("a", [block])])
        said = failure_message(result, "INVALID_TRANSCRIPT")
        assert said.startswith("message 'a': a text block")
        assert said.endswith("field 'text' must be a str, got 5 (int)")

    def test_a_response_block_names_its_field_too(self) -> None:
        model = FakeModel(self._streams_a_bad_text_block)
        _, result, _ = run(model)
        said = failure_message(result, "MODEL_PROTOCOL_ERROR")
        assert said.startswith("message 'message-r1': a text block")
        assert said.endswith("field 'text' must be a str, got None (NoneType)")

    @staticmethod
    def _streams_a_bad_text_block(
        model: FakeModel, request: al.ModelRequest, signal: al.Signal
    ) -> Generator[al.ModelChunk, None, al.ModelResponse]:
        yield from ()
        block = al.TextBlock(None)  # type: ignore[arg-type]
        return al.ModelResponse("r1", request.id, [block], "stop")


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


class TestMalformedThinkingAndUsage:
    """A malformed ThinkingBlock or usage fails the run where it enters, with the field
    named: MODEL_PROTOCOL_ERROR from a model (before any tool runs), INVALID_TRANSCRIPT in
    the starting messages; a malformed ThinkingDelta is a MODEL_PROTOCOL_ERROR."""

    @pytest.mark.parametrize(("block", "words"), MALFORMED_THINKING)
    def test_a_malformed_thinking_block_from_a_model(self, block: Any, words: str) -> None:
        executed: list[str] = []
        response = al.scripted_response(
            "response-001", [block, add_call()], "toolCall", chunks=[add_call()]
        )
        events, result, _ = run([response], recording_tools(executed))
        assert_failed(
            events, result, "MODEL_PROTOCOL_ERROR", "message 'message-response-001'", words
        )
        assert executed == []
        assert result.messages == (user(),)

    @pytest.mark.parametrize(("block", "words"), MALFORMED_THINKING)
    def test_a_malformed_thinking_block_in_the_start(self, block: Any, words: str) -> None:
        start = [user(), untyped.AssistantMessage("message-old", (block,))]
        events, result, model = run([], messages=start)
        assert_failed(events, result, "INVALID_TRANSCRIPT", "message 'message-old'", words)
        assert model.call_count == 0

    @pytest.mark.parametrize(("usage", "words"), MALFORMED_USAGE)
    def test_a_response_with_malformed_usage(self, usage: Any, words: str) -> None:
        response = untyped.scripted_response("response-001", [text("Hi.")], "stop", usage=usage)
        events, result, _ = run([response])
        assert_failed(
            events, result, "MODEL_PROTOCOL_ERROR", "message 'message-response-001'", words
        )
        assert result.messages == (user(),)
        assert result.usage is None

    @pytest.mark.parametrize(("usage", "words"), MALFORMED_USAGE)
    def test_a_starting_message_with_malformed_usage(self, usage: Any, words: str) -> None:
        start = [user(), untyped.AssistantMessage("message-old", (text("Hi."),), usage)]
        events, result, _ = run([], messages=start)
        assert_failed(events, result, "INVALID_TRANSCRIPT", "message 'message-old'", words)

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
    """A duplicate id error must "say how it was derived ("message-" +
    response id) and that response ids and tool-call ids must be unique across the
    whole transcript"."""

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
        """A duplicate id error must "say how it was derived ("message-" + response id)
        and that response ids and tool-call ids must be unique across the whole
        transcript"; the step's calls never run and its message is not appended."""
        executed: list[str] = []
        events, result, model = run(script, [echo_tool(executed)], messages=start)
        assert_failed(events, result, "MODEL_PROTOCOL_ERROR")
        if message is not None:
            assert failure_message(result, "MODEL_PROTOCOL_ERROR") == message
        assert executed == ran
        assert result.messages[: len(start)] == tuple(start)
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


class SubclassedUserMessage(al.UserMessage):
    """A caller's UserMessage subclass whose fields can change after acceptance."""

    __setattr__ = object.__setattr__


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

    def test_a_message_subclass_in_the_start_is_an_invalid_transcript(self) -> None:
        message = SubclassedUserMessage("user-001", "Hi.")
        events, result, model = run([stop("response-001")], messages=[message])
        assert_failed(events, result, "INVALID_TRANSCRIPT")
        assert model.call_count == 0

    def test_a_return_value_whose_encoding_raises_is_recoverable(self) -> None:
        tool = al.Tool(
            "odd", "Returns an odd dict.", {"type": "object"}, lambda a, s: RaisingItems(a=1)
        )
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


class TestSignalIsPublic:
    """The signal protocol is public (Signal), so a model or tool annotated with
    threading.Event or Signal passes mypy --strict (this module is checked by it)."""

    def test_signal_annotations_run(self) -> None:
        tool = al.Tool("annotated", "d", {"type": "object"}, signal_annotated_tool)
        _, result, _ = run(SignalAnnotatedModel(), tools=[tool])
        assert result.status == "completed"
        assert only_tool_result(result).content == '{"waited":false}'

    def test_threading_event_annotations_run(self) -> None:
        tool = al.Tool("annotated", "d", {"type": "object"}, event_annotated_tool)
        signal = threading.Event()
        model: al.Model = EventAnnotatedModel()  # mypy --strict checks this assignment
        _, result, _ = run(model, tools=[tool], signal=signal)
        assert result.status == "completed"
        assert only_tool_result(result).content == '{"waited":false}'

    def test_signal_is_exported(self) -> None:
        assert "Signal" in al.__all__
        for method in ("is_set", "wait"):
            assert callable(getattr(al.Signal, method))
            assert callable(getattr(threading.Event, method))


class HasWaitCoroutine:
    """Looks like a signal, but its wait() is a coroutine, as asyncio.Event's is."""

    def is_set(self) -> bool:
        return False

    async def wait(self) -> bool:
        return True


class TestSignalSaysWhatIsAccepted:
    """Not "signal must be a threading.Event, got bool" while anything with is_set() and
    wait() is accepted: the error says what is accepted. An asyncio.Event (its wait is a
    coroutine) is a TypeError at call time that says to use threading.Event."""

    def test_a_bool_is_told_what_is_accepted(self) -> None:
        with pytest.raises(TypeError) as raised:
            al.run_agent_loop(
                messages=[],
                model=al.ScriptedModel([]),
                tools=al.ToolRegistry(),
                max_steps=1,
                signal=cast(Any, True),
            )
        assert str(raised.value) == (
            "signal must be a threading.Event, or an object with is_set() and wait(timeout), "
            "got bool"
        )

    def test_an_asyncio_event_is_a_type_error_at_call_time(self) -> None:
        async def call_with_an_asyncio_event() -> str:
            with pytest.raises(TypeError) as raised:
                al.run_agent_loop(
                    messages=[],
                    model=al.ScriptedModel([]),
                    tools=al.ToolRegistry(),
                    max_steps=1,
                    signal=cast(Any, asyncio.Event()),
                )
            return str(raised.value)

        message = asyncio.run(call_with_an_asyncio_event())
        assert "Event.wait() is a coroutine (an asyncio.Event?)" in message
        assert "use threading.Event, and set it from your event loop" in message

    def test_any_object_whose_wait_is_a_coroutine(self) -> None:
        with pytest.raises(TypeError, match=r"HasWaitCoroutine\.wait\(\) is a coroutine"):
            al.run_agent_loop(
                messages=[],
                model=al.ScriptedModel([]),
                tools=al.ToolRegistry(),
                max_steps=1,
                signal=cast(Any, HasWaitCoroutine()),
            )


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
class TestModelStreamCleanup:
    """A model stream whose cleanup raises, or that ignores GeneratorExit, when the loop
    closes it: the run still ends with exactly one run.finished, for its first cause."""

    @staticmethod
    def _endless(how: str, pulled: list[int]) -> Step:
        def step(
            model: FakeModel, request: al.ModelRequest, signal: Any
        ) -> Generator[object, None, object]:
            ignored = False
            try:
                while True:
                    try:
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
        """Seed: "The loop caps one step at 1024 chunks", however the stream behaves closed."""
        pulled: list[int] = []
        model = FakeModel(self._endless(how, pulled))
        events, result, _ = run(model)
        assert_failed(events, result, "MODEL_PROTOCOL_ERROR", "1024")
        assert types_of(events).count("model.chunk") == al.MAX_STEP_CHUNKS
        # One pull over the cap (and one more by the stream that ignores its closing).
        assert len(pulled) == al.MAX_STEP_CHUNKS + 1 + (how == "ignores-exit")
        assert model.finalized == ["request-001"]
        assert result.messages == (user(),)

    @pytest.mark.parametrize("how", ["cleanup-raises", "ignores-exit"])
    @pytest.mark.parametrize("by", ["signal", "consumer-close"])
    def test_a_run_stopped_mid_stream_does_not_raise(self, how: str, by: str) -> None:
        """Cancelled, the run ends cancelled; closed by its consumer, close() returns."""
        model = FakeModel(self._endless(how, []))
        signal = threading.Event()
        run_ = start_run(model, signal=signal)
        events = until(run_, "model.chunk", 3)
        if by == "consumer-close":
            run_.close()
        else:
            signal.set()
            more, result = al.settle_run(run_)
            check_run(events + more, result, model, max_steps=4, start=[user()])
            assert result.status == "cancelled"
            assert result.messages == (user(),)
        assert model.finalized[:1] == ["request-001"]


def streamed(content: Sequence[Any], chunks: Sequence[Any]) -> al.ScriptedResponse:
    """A toolCall step whose stream (``chunks``) may differ from its response (``content``)."""
    return al.scripted_response("r", content, "toolCall", chunks=chunks)


def stop_with(*blocks: object) -> al.ScriptedResponse:
    """A stop response holding these blocks."""
    response: al.ScriptedResponse = untyped.scripted_response("r", blocks, "stop")
    return response


def yielding(chunk: Callable[[al.ModelRequest], object]) -> Step:
    """A step that yields ``chunk(request)``, then answers the text "x"."""
    return stream_step([chunk], respond("r", [text("x")], "stop"))


def answer(stream: Sequence[object] = (text("x"),), **fields: object) -> Step:
    """A step that streams ``stream``, then returns ModelResponse("r", the active request
    id, [text("x")], "stop") with the ``fields`` given changed."""

    def response(request: al.ModelRequest) -> object:
        given = {
            "id": "r",
            "request_id": request.id,
            "content": [text("x")],
            "stop_reason": "stop",
        }
        return untyped.ModelResponse(**{**given, **fields})  # fmt: skip

    return stream_step(stream, response)


class RaisingEquality:
    """A value whose == raises: `in` would run it, and its exception would escape the run."""

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("eq raised")

    __hash__ = object.__hash__


def play_failing(step: Step | al.ScriptedResponse, chunk_events: int, *words: str) -> al.RunResult:
    """Plays ``step``: the run fails with MODEL_PROTOCOL_ERROR naming ``words`` in a short
    message; the valid chunks before the fault have events; no tool runs, nothing is appended."""
    executed: list[str] = []
    model = FakeModel(step, turn("response-unused", [text("unused")], "stop"))
    events, result, _ = run(model, recording_tools(executed))
    assert_failed(events, result, "MODEL_PROTOCOL_ERROR", *words)
    assert len(failure_message(result, "MODEL_PROTOCOL_ERROR")) < 1_000  # values shortened
    assert types_of(events).count("model.chunk") == chunk_events
    assert (result.messages, result.steps, model.call_count, executed) == ((user(),), 1, 1, [])
    return result


# Model output that the loop rejects, and how many valid chunks came before the fault.
MALFORMED_OUTPUT: dict[str, tuple[Step | al.ScriptedResponse, int]] = {
    "stream-returns-None": (lambda m, r, s: None, 0),
    "stream-returns-a-list": (lambda m, r, s: [al.TextDelta(r.id, "x")], 0),
    "stream-returns-an-iterator": (lambda m, r, s: iter([al.TextDelta(r.id, "x")]), 0),
    "stream-returns-a-str": (lambda m, r, s: "text", 0),
    "generator-returns-None": (stream_step([text("x")], lambda r: None), 1),
    "generator-returns-a-dict": (stream_step([text("x")], lambda r: {"id": "r"}), 1),
    "yields-None": (yielding(lambda r: None), 0),
    "yields-a-str": (yielding(lambda r: "x"), 0),
    "yields-a-chunk-dict": (yielding(lambda r: {"type": "text", "requestId": r.id}), 0),
    "TextDelta-text-None": (yielding(lambda r: untyped.TextDelta(r.id, None)), 0),
    "TextDelta-text-int": (yielding(lambda r: untyped.TextDelta(r.id, 5)), 0),
    "ToolCallChunk-carrying-a-TextBlock": (
        stream_step([text("a"), lambda r: untyped.ToolCallChunk(r.id, text("b"))],
                    respond("r", [text("ab")], "stop")), 1),
    "ToolCallChunk-carrying-None": (yielding(lambda r: untyped.ToolCallChunk(r.id, None)), 0),
    "tool-call-id-empty": (tool_turn("r", untyped.ToolCall("", "echo", {})), 0),
    "tool-call-id-None": (tool_turn("r", untyped.ToolCall(None, "echo", {})), 0),
    "tool-call-id-int": (tool_turn("r", untyped.ToolCall(7, "echo", {})), 0),
    "tool-call-name-None": (tool_turn("r", untyped.ToolCall("c", None, {})), 0),
    "tool-call-name-empty": (tool_turn("r", untyped.ToolCall("c", "", {})), 0),
    "response-id-None": (answer(id=None), 1),
    "response-id-empty": (answer(id=""), 1),
    "stop-reason-length": (answer(stop_reason="length"), 1),
    "stop-reason-None": (answer(stop_reason=None), 1),
    "response-block-is-a-dict": (answer((), content=[{"type": "text", "text": "x"}]), 0),
    "response-text-block-int": (answer((), content=[untyped.TextBlock(5)]), 0),
    "response-content-a-str": (answer((), content="text"), 0),
    "duplicate-call-ids": (tool_turn("r", echo_call("c", "a"), echo_call("c", "b")), 2),
    "same-call-twice": (tool_turn("r", echo_call("c"), text("and"), echo_call("c")), 3),
    "tool-call-in-a-stop-response": (stop_with(echo_call("c")), 1),
    "toolCall-response-without-a-call": (tool_turn("r", text("x")), 1),
    "stream-and-response-disagree": (answer((text("abc"),), content=[text("abd")]), 1),
    "streamed-call-differs": (streamed([echo_call("c", "b")], [echo_call("c", "a")]), 1),
    "streamed-call-id-differs": (streamed([add_call()], [add_call("call-add-002")]), 1),
    "order-differs": (streamed([text("Adding."), add_call()], [add_call(), text("Adding.")]), 2),
    "missing-chunk": (streamed([text("Adding."), add_call()], [text("Adding.")]), 1),
    "extra-chunk": (streamed([add_call()], [add_call(), text("More.")]), 2),
    # A str subclass that raises from ==, len() or hash() is model output of the wrong
    # type, like any non-str: the run fails, it does not raise.
    "request-id-raising-eq": (yielding(lambda r: al.TextDelta(RaisingEq(r.id), "x")), 0),
    "text-raising-len": (yielding(lambda r: al.TextDelta(r.id, RaisingLen("x"))), 0),
    "call-id-raising-hash": (tool_turn("r", al.ToolCall(RaisingHash("c"), "echo", {})), 0),
}  # fmt: skip


@pytest.mark.hostile
class TestMalformedModelOutput:
    """Whatever a model streams or returns, the run fails with one run.finished and
    MODEL_PROTOCOL_ERROR: it never raises, never hangs, never keeps a half-written message."""

    @pytest.mark.parametrize(
        ("step", "chunk_events"), MALFORMED_OUTPUT.values(), ids=list(MALFORMED_OUTPUT)
    )
    def test_contradiction_or_excess_becomes_a_failed_model_protocol_error_result(
        self, step: Step | al.ScriptedResponse, chunk_events: int
    ) -> None:
        """Seed: "Contradiction or excess becomes a failed MODEL_PROTOCOL_ERROR result." """
        play_failing(step, chunk_events)

    @pytest.mark.parametrize(
        ("step", "chunk_events", "word"),
        [
            # Seed: "Request IDs must match the active request."
            pytest.param(yielding(lambda r: al.TextDelta("request-999", "x")), 0, "request-001",
                         id="chunk-of-another-request"),
            pytest.param(yielding(lambda r: untyped.TextDelta(None, "x")), 0, "request-001",
                         id="chunk-of-request-None"),
            pytest.param(yielding(lambda r: al.ToolCallChunk("q", add_call())), 0, "request-001",
                         id="call-chunk-of-another-request"),
            pytest.param(answer(request_id="request-999"), 1, "request-001",
                         id="response-to-another-request"),
            # `in` would run the value's own __eq__, and its exception would escape the run.
            pytest.param(answer(stop_reason=RaisingEquality()), 1, "unknown stop reason",
                         id="stop-reason-whose-eq-raises"),
            # A rejected value is named in the error, not copied into it.
            pytest.param(stop_with(untyped.ThinkingBlock("t", "x" * 10**6, True)), 1,
                         "a redacted thinking block holds its data", id="megabyte-redacted-data"),
        ],
    )  # fmt: skip
    def test_the_error_says_what_was_wrong(self, step: Step, chunk_events: int, word: str) -> None:
        play_failing(step, chunk_events, word)

    def test_a_stale_request_id_on_the_second_step(self) -> None:
        executed: list[str] = []
        stale = yielding(lambda r: al.TextDelta("request-001", "done"))
        model = FakeModel(turn("response-001", [echo_call("call-1", "a")], "toolCall"), stale)
        events, result, _ = run(model, [echo_tool(executed)])
        assert_failed(events, result, "MODEL_PROTOCOL_ERROR", "request-002")
        assert executed == ["a"]
        assert [m.id for m in result.messages] == [
            "user-001",
            "message-response-001",
            "tool-result-call-1",
        ]
        assert types_of(events).count("model.chunk") == 1  # the stale chunk got no event

    def test_ten_megabyte_argument_is_rejected_without_a_copy(self) -> None:
        """The text bound is measured, not copied: rejecting 10 MB costs far less than 10 MB."""
        step = tool_turn("r", echo_call("call-1", "x" * 10_000_000))
        tracemalloc.start()
        try:
            play_failing(step, 0, "4096")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 1_000_000


# --- Tools -------------------------------------------------------------------------------


EXAMPLE_OF_TYPE: dict[str, Any] = {"object": {"k": 1}, "string": "s", "number": 1.5, "integer": 3,
    "boolean": True, "array": [1], "null": None}  # fmt: skip
ENUM_VALUES = [1, "a", None, [1, 2], {"k": True}]
OBJECT = {"type": "object"}
INTEGER_N = {"type": "object", "properties": {"n": {"type": "integer"}}}
INTEGER_XS = {"type": "object",
    "properties": {"xs": {"type": "array", "items": {"type": "integer"}}}}  # fmt: skip
ITEM_N = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
OBJECT_XS = {"type": "object", "properties": {"xs": {"type": "array", "items": ITEM_N}}}
INNER = {"type": "object", "properties": {"inner": {**ITEM_N, "additionalProperties": False}},
    "required": ["inner"]}  # fmt: skip
ANNOTATED = {"type": "object", "title": "Probe", "description": "The probe's arguments.",
    "properties": {"n": {"type": "integer", "description": "A number.", "title": "N"}},
}  # fmt: skip
MANY_CODES = [f"c{n:03d}" for n in range(al.MAX_ARGUMENT_VALUES + 100)]  # fmt: skip


def one_property(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Parameters whose one required property ``v`` has this schema."""
    return {"type": "object", "properties": {"v": schema}, "required": ["v"]}


SCHEMA_CASES = [
    # Each type accepts its own kind and rejects the others; a number also accepts an integer.
    *[pytest.param(one_property({"type": schema_type}), {"v": value},
                   None if kind == schema_type or (schema_type, kind) == ("number", "integer")
                   else ("$.v", schema_type, kind),
                   id=f"type-{schema_type}-given-{kind}")
      for schema_type in EXAMPLE_OF_TYPE for kind, value in EXAMPLE_OF_TYPE.items()],
    # bool is never a number or an integer.
    *[pytest.param(one_property({"type": schema_type}), {"v": value},
                   ("$.v", schema_type, "boolean"), id=f"{value}-is-no-{schema_type}")
      for schema_type in ("number", "integer") for value in (True, False)],
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
                   id=f"enum-accepts-{value}")
      for value in (1, "a", None, [1, 2], {"k": True})],
    # The documented choice: enum compares as strict JSON, so True is not 1.
    *[pytest.param(one_property({"enum": ENUM_VALUES}), {"v": value}, ("$.v", "one of"),
                   id=f"enum-is-strict-{value}")
      for value in (True, 1.0, "b", [1, 2.0], [2, 1], {"k": 1}, 0)],
    pytest.param(one_property({"enum": [True]}), {"v": 1}, ("$.v", "one of"),
                 id="enum-true-rejects-1"),
    pytest.param(one_property({"enum": [True]}), {"v": True}, None, id="enum-true-accepts-true"),
    # An enum may list more members than one argument may hold values.
    pytest.param(one_property({"enum": MANY_CODES}), {"v": "c300"}, None,
                 id="enum-over-the-bounds"),
    # Nested objects are checked at every level.
    pytest.param(INNER, {"inner": {"n": 1}}, None, id="nested-pass"),
    pytest.param(INNER, {"inner": {}}, ("$.inner", "required", "'n'"), id="nested-required"),
    pytest.param(INNER, {"inner": {"n": 1, "x": 2}}, ("$.inner", "unexpected", "'x'"),
                 id="nested-additionalProperties"),
    pytest.param(INNER, {"inner": {"n": "one"}}, ("$.inner.n", "integer"), id="nested-type"),
    pytest.param(INNER, {"inner": [1]}, ("$.inner", "object", "array"), id="nested-not-an-object"),
    pytest.param(ANNOTATED, {"n": 1}, None, id="annotations-are-accepted"),
    # Arguments that are not plain bounded JSON, given to execute_tool_call directly.
    pytest.param(OBJECT, {"x": float("nan")}, ("arguments",), id="not-plain-nan"),
    pytest.param(OBJECT, shared_array(), ("arguments",), id="not-plain-shared-list"),
    pytest.param(OBJECT, nested(33), ("arguments",), id="not-plain-too-deep"),
    pytest.param(OBJECT, [1], ("arguments",), id="not-plain-list-root"),
]  # fmt: skip
"""(parameters, arguments, None if accepted, else the words the error result names)."""


def ok(arguments: Dict[str, Any], signal: al.Signal) -> object:
    return "ok"


def probe_with(parameters: Any) -> Callable[[], object]:
    """Builds a probe Tool with these parameters."""
    return lambda: al.Tool("probe", "A tool.", parameters, ok)


def add(left: float, right: float) -> float:
    """Adds two numbers.

    Both may be integers."""
    return left + right


async def fetch(url: str) -> str:
    return url


def from_source(source: str, future_annotations: bool = False) -> Callable[..., object]:
    """The function ``f`` of a module made of this source, compiled with or without
    PEP 563 (``from __future__ import annotations``), as a user's module would be."""
    header = "from __future__ import annotations\n" if future_annotations else ""
    namespace: Dict[str, Any] = {}
    source = header + "from typing import *\nimport agent_loop as al\n" + source
    exec(compile(source, "<user module>", "exec", dont_inherit=True), namespace)  # no PEP 563 here
    function: Callable[..., object] = namespace["f"]
    return function


class Executor:
    def method(self, arguments: Dict[str, Any], signal: al.Signal) -> object:
        return "method"

    def __call__(self, arguments: Dict[str, Any], signal: al.Signal) -> object:
        return "callable object"


def from_function(source: str, future_annotations: bool = False) -> Callable[[], object]:
    """Builds a Tool from the function ``f`` of this source (see from_source)."""
    return lambda: al.Tool.from_function(from_source(source, future_annotations))


LONG_TEXT = "x" * (al.MAX_ARGUMENT_TEXT + 1)
CANNOT_CALL = "cannot be called as execute(arguments, signal); give it two positional parameters"


# What Tool, ToolSpec and Tool.from_function refuse when they are built, and what the error says.


# What Tool, ToolSpec and Tool.from_function refuse when they are built, and what the error says.
REFUSED_TOOLS: dict[str, tuple[Callable[[], object], type[Exception], str]] = {
    "minimum": (probe_with({**OBJECT, "minimum": 1}), ValueError, "minimum"),
    "nested-pattern": (probe_with(one_property({"pattern": "x"})), ValueError, "pattern"),
    "ref-in-items": (probe_with(one_property({"items": {"$ref": "#"}})), ValueError, "$ref"),
    "root-string": (probe_with({"type": "string"}), ValueError, "object"),
    "root-without-type": (probe_with({}), ValueError, "object"),
    "root-properties-only": (probe_with({"properties": {}}), ValueError, "object"),
    "parameters-list": (probe_with([]), TypeError, "parameters"),
    "parameters-str": (probe_with("object"), TypeError, "parameters"),
    "parameters-None": (probe_with(None), TypeError, "parameters"),
    "type-unknown": (probe_with({"type": "float"}), ValueError, "float"),
    "type-list": (probe_with({"type": ["object", "null"]}), ValueError, "type"),
    "required-str": (probe_with({**OBJECT, "required": "left"}), TypeError, "required"),
    "required-int": (probe_with({**OBJECT, "required": [1]}), TypeError, "required"),
    "additional-str": (probe_with({**OBJECT, "additionalProperties": "no"}), TypeError,
                       "additionalProperties"),
    "additional-schema": (probe_with({**OBJECT, "additionalProperties": OBJECT}), TypeError,
                          "additionalProperties"),
    "enum-str": (probe_with({**OBJECT, "enum": "a"}), TypeError, "enum"),
    "enum-nan": (probe_with({**OBJECT, "enum": [float("nan")]}), ValueError, "enum"),
    "enum-member-over-the-bounds": (probe_with(one_property({"enum": [LONG_TEXT]})), ValueError,
                                    "enum member 0 is no value arguments may hold: "),
    "properties-list": (probe_with({**OBJECT, "properties": []}), TypeError, "properties"),
    "property-not-a-schema": (probe_with({**OBJECT, "properties": {"n": "int"}}), TypeError,
                              "properties.n"),
    "items-str": (probe_with(one_property({"type": "array", "items": "int"})), TypeError, "items"),
    "items-list": (probe_with(one_property({"items": [{"type": "integer"}]})), TypeError, "items"),
    "description": (probe_with({**OBJECT, "description": 5}), TypeError, "description"),
    "title": (probe_with(one_property({"title": None})), TypeError, "title"),
    "name-empty": (lambda: al.Tool("", "A tool.", OBJECT, ok), TypeError, "name"),
    "name-int": (lambda: untyped.Tool(1, "A tool.", OBJECT, ok), TypeError, "name"),
    "name-None": (lambda: untyped.Tool(None, "A tool.", OBJECT, ok), TypeError, "name"),
    "description-None": (lambda: untyped.Tool("t", None, OBJECT, ok), TypeError, "description"),
    "execute-str": (lambda: untyped.Tool("t", "A tool.", OBJECT, "ok"), TypeError, "execute"),
    # An execute that cannot be called as execute(arguments, signal) is refused, not a
    # recoverable "raised TypeError" that hides the bug.
    "execute-of-one": (lambda: untyped.Tool("t", "d", OBJECT, lambda arguments: "one"), TypeError,
                       CANNOT_CALL),
    "execute-of-three": (lambda: untyped.Tool("t", "d", OBJECT, lambda arguments, signal,
                                              extra: "three"), TypeError,
                         CANNOT_CALL),
    "execute-keyword-only": (lambda: untyped.Tool("t", "d", OBJECT, lambda *, arguments,
                                                  signal: "keyword"), TypeError,
                             CANNOT_CALL),
    # ToolSpec's docstring: "Checked as a Tool is (TypeError or ValueError naming the field)".
    "spec-bogus-type-read-only": (lambda: al.ToolSpec("x", "d", MappingProxyType({"type": "b"})),
                                  ValueError, "type must be one of"),
    "spec-root-string": (lambda: al.ToolSpec("x", "d", {"type": "string"}), ValueError,
                         "ToolSpec 'x' parameters must have \"type\""),
    "spec-name-empty": (lambda: al.ToolSpec("", "d", OBJECT), TypeError, "ToolSpec"),
    "spec-name-int": (lambda: untyped.ToolSpec(1, "d", OBJECT), TypeError, "ToolSpec"),
    "spec-description-None": (lambda: untyped.ToolSpec("x", None, OBJECT), TypeError, "ToolSpec"),
    # Tool.from_function: a parameter it cannot pass by name, a hint it cannot resolve,
    # anything but a plain function or method.
    "no-hint": (from_function("def f(x): pass"), TypeError, "(f): parameter 'x' has no type hint"),
    "*args": (from_function("def f(ok: int, *x: int): pass"), TypeError,
              "parameter 'x' is variadic positional"),
    "**kwargs": (from_function("def f(ok: int, **x: int): pass"), TypeError,
                 "parameter 'x' is variadic keyword"),
    "positional-only": (from_function("def f(x: int, /): pass"), TypeError,
                        "parameter 'x' is positional-only"),
    "positional-only-signal": (from_function("def f(signal, /): pass"), TypeError,
                               "Tool.from_function(f): parameter 'signal' is positional-only"),
    "unresolvable-hint": (from_function("def f(x: Undefined): pass", future_annotations=True),
                          TypeError, "Tool.from_function: cannot resolve the type hints of f: "
                          "NameError: name 'Undefined' is not defined"),
    "builtin": (lambda: al.Tool.from_function(len), TypeError, "takes a function or a method, "),
    "class": (lambda: al.Tool.from_function(int), TypeError, "takes a function or a method, got "),
    "object": (lambda: al.Tool.from_function(Executor()), TypeError, "takes a function or a "),
    # Its result would be a coroutine that nobody awaits: an error result each time.
    "async": (lambda: al.Tool.from_function(fetch), TypeError,
              "fetch is an async function, and the loop calls tools synchronously; give it a "
              "plain def"),
    "lambda-without-a-name": (lambda: al.Tool.from_function(lambda: "ok"), TypeError,
                              "a lambda has no name of its own; give it name="),
    "empty-name": (lambda: al.Tool.from_function(add, name=""), TypeError,
                   "Tool name must be a non-empty str"),
}  # fmt: skip


class TestToolSchemas:
    """A tool's parameters are a JSON Schema subset (type, properties, required,
    additionalProperties, items, enum); bool is no number. Failures are recoverable results."""

    @pytest.mark.parametrize(("parameters", "arguments", "rejected"), SCHEMA_CASES)
    def test_arguments_are_checked_against_the_schema(
        self, parameters: Any, arguments: Any, rejected: tuple[str, ...] | None
    ) -> None:
        """Accepted arguments reach the tool exactly; a rejection names the path and problem."""
        received: list[dict[str, Any]] = []
        registry = al.ToolRegistry([probe_tool(received, parameters)])
        result = al.execute_tool_call(registry, call("probe", "c1", arguments), threading.Event())
        assert (result.id, result.tool_call_id) == ("tool-result-c1", "c1")
        if rejected is None:
            assert (result.content, result.is_error) == ("ok", False)
            assert len(received) == 1
            assert same_json(received[0], arguments)
            return
        assert result.is_error is True
        assert received == []
        for word in ("probe", *rejected):
            assert word in result.content

    @pytest.mark.parametrize(
        ("build", "error", "words"), REFUSED_TOOLS.values(), ids=list(REFUSED_TOOLS)
    )
    def test_a_bad_tool_is_refused_when_it_is_built(
        self, build: Callable[[], object], error: type[Exception], words: str
    ) -> None:
        """A keyword the loop would ignore, or a malformed field, fails the build, named."""
        with pytest.raises(error) as raised:
            build()
        assert words in str(raised.value)

    @pytest.mark.parametrize("through", ["object", "array"])
    @pytest.mark.parametrize("passes", [AT_LIMIT, OVER_LIMIT])
    def test_schema_depth(self, passes: bool, through: str) -> None:
        """A schema nests as deep as arguments can (32 containers); one more is a ValueError."""
        schema: dict[str, Any] = {"type": "integer"}
        for _ in range(31 if passes else 32):
            if through == "object":
                schema = {"type": "object", "properties": {"k": schema}, "required": ["k"]}
            else:
                schema = {"type": "array", "items": schema}
        schema = {"type": "object", "properties": {"k": schema}, "required": ["k"]}
        if not passes:
            with pytest.raises(ValueError, match="32"):
                al.Tool("probe", "A tool.", schema, ok)
            return
        arguments = {"k": nested(31, through)}
        received: list[dict[str, Any]] = []
        registry = al.ToolRegistry([probe_tool(received, schema)])
        result = al.execute_tool_call(registry, call("probe", "c1", arguments), threading.Event())
        assert (result.content, received) == ("ok", [arguments])

    def test_parameters_are_frozen(self) -> None:
        """Mutating the original dict after construction changes nothing of the tool."""
        parameters: dict[str, Any] = copy.deepcopy(NUMBERS)
        tool = al.Tool("add", "Adds.", parameters, ok)
        parameters["required"].append("third")
        parameters["properties"]["left"]["type"] = "string"
        parameters["additionalProperties"] = True
        assert plain_copy(tool.parameters) == plain_copy(tool.spec().parameters) == NUMBERS
        with pytest.raises(TypeError):
            tool.parameters["type"] = "string"  # type: ignore[index]
        with pytest.raises(TypeError):
            tool.parameters["properties"]["left"] = {}
        _, result, _ = run(one_call("add", {"left": 1, "right": 2, "third": 3}), [tool])
        assert "unexpected property 'third'" in only_tool_result(result).content


class NoSignature:
    """A callable that inspect.signature() cannot read: its __signature__ is not a
    Signature, which is a TypeError on every Python."""

    __signature__ = 42

    def __call__(self, *values: Any) -> object:
        return "no signature"


def undocumented(text: str) -> str:
    return text


class Stations:
    def weather(self, city: str) -> str:
        """Reports the weather in a city."""
        raise al.ToolError(f"No station in {city}.")


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


SINCE_3_9 = pytest.mark.skipif(sys.version_info < (3, 9), reason="list[int] needs Python 3.9")
SINCE_3_10 = pytest.mark.skipif(sys.version_info < (3, 10), reason="X | Y needs Python 3.10")


STRING = {"type": "string"}
# Parameters, as source, and the schema each gets; both with and without PEP 563. A
# parameter with a default is not required (and Optional[X] needs the default None).
HINT_SCHEMAS: dict[str, Any] = {
    "x: str": {"type": "string"},
    "x: int": {"type": "integer"},
    "x: float": {"type": "number"},
    "x: bool": {"type": "boolean"},
    "x: None": {"type": "null"},
    "x: list": {"type": "array"},
    "x: List": {"type": "array"},
    "x: List[int]": {"type": "array", "items": {"type": "integer"}},
    "x: List[List[str]]": {"type": "array", "items": {"type": "array", "items": STRING}},
    "x: dict": {"type": "object"},
    "x: Dict": {"type": "object"},
    "x: Dict[str, Any]": {"type": "object"},
    'x: Literal["a", "b"]': {"type": "string", "enum": ["a", "b"]},
    "x: Literal[1, 2]": {"type": "integer", "enum": [1, 2]},
    'x: Literal[1, "a"]': {"enum": [1, "a"]},
    'x: Optional[Literal["a"]]': {"enum": ["a", None]},
    "x: List[Literal[True]]": {"type": "array", "items": {"type": "boolean", "enum": [True]}},
    "x: int = 3": {"type": "integer"},
    "x: Optional[int] = None": {"type": "integer"},
    "x: Union[None, int] = None": {"type": "integer"},
}  # fmt: skip
DEFAULT_OF = {"x: int = 3": 3, "x: Optional[int] = None": None, "x: Union[None, int] = None": None,
              "x: int | None = None": None}  # fmt: skip
NEWER_HINT_SCHEMAS = [
    pytest.param("x: list[int]", {"type": "array", "items": {"type": "integer"}}, marks=SINCE_3_9),
    pytest.param("x: dict[str, Any]", {"type": "object"}, marks=SINCE_3_9),
    pytest.param("x: int | None = None", {"type": "integer"}, marks=SINCE_3_10),
]


# Hints whose schema would need more than the enforced subset, and what the error says.
UNEXPRESSIBLE_HINTS = [
    ("Optional[int]", "give the parameter the default None"),
    ("Union[int, str]", "a schema here has one type (no anyOf)"),
    ("Union[int, str, None]", "a schema here has one type (no anyOf)"),
    ("List[Optional[int]]", "a schema here has one type (no anyOf)"),
    pytest.param("str | int", "a schema here has one type (no anyOf)", marks=SINCE_3_10),
    ("Dict[str, int]", "use dict or Dict[str, Any]"),
    ("Tuple[int, int]", "has no schema in the subset this loop enforces"),
    ("Any", "has no schema in the subset this loop enforces"),
    ("set", "has no schema in the subset this loop enforces"),
    ("al.Tool", "has no schema in the subset this loop enforces"),
    ('Literal[b"x"]', "Literal value b'x' is a bytes, not a JSON scalar"),
]


class TestToolFromFunction:
    """Tool.from_function: the schema from the type hints, the description from the docstring;
    what the enforced subset cannot express is a TypeError naming the parameter."""

    def test_a_function_becomes_a_tool_named_and_described_by_it(self) -> None:
        tool = al.Tool.from_function(add)
        assert tool.description == "Adds two numbers.\n\nBoth may be integers."
        assert tool.spec().to_dict()["parameters"] == NUMBERS
        assert al.Tool.from_function(undocumented).description == ""
        plus = al.Tool.from_function(add, name="plus", description="Sums.")
        assert (plus.name, plus.description) == ("plus", "Sums.")
        assert al.Tool.from_function(lambda: "ok", name="ok").name == "ok"

    @pytest.mark.parametrize(
        ("function", "arguments", "content", "is_error"),
        [
            # float means JSON number (an int argument is accepted); the result is JSON.
            pytest.param(add, {"left": 20, "right": 22.5}, "42.5", False, id="function"),
            pytest.param(undocumented, {"text": "as is"}, "as is", False, id="str-verbatim"),
            pytest.param(Stations().weather, {"city": "Atlantis"}, "No station in Atlantis.", True,
                         id="bound-method-raising-a-tool-error"),
            # None is no value of a parameter whose default is None: the model leaves it out.
            pytest.param(search, {"query": "q", "tags": None},
                         "invalid arguments for tool 'search': $.tags must be array, got null",
                         True,
                         id="null-for-a-default-none"),
        ],
    )  # fmt: skip
    def test_it_runs_and_its_return_value_is_the_result(
        self, function: Any, arguments: Any, content: str, is_error: bool
    ) -> None:
        tool = al.Tool.from_function(function)
        _, result, _ = run(one_call(tool.name, arguments), tools=[tool])
        tool_result = only_tool_result(result)
        assert (tool_result.content, tool_result.is_error) == (content, is_error)

    def test_defaults_keyword_only_and_signal(self) -> None:
        """signal gets the run's signal and is not in the schema; defaults are not required."""
        tool = al.Tool.from_function(search)
        parameters = tool.spec().to_dict()["parameters"]
        assert parameters["properties"] == {
            "query": {"type": "string"},
            "limit": {"type": "integer"},
            "exact": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "order": {"type": "string", "enum": ["asc", "desc"]},
        }
        assert (parameters["required"], parameters["additionalProperties"]) == (["query"], False)
        returned = tool.execute({"query": "q", "order": "desc"}, threading.Event())
        assert returned == {"query": "q", "limit": 10, "tags": None, "order": "desc", "set": False}

    @pytest.mark.parametrize("future_annotations", [False, True], ids=["hints", "pep563"])
    @pytest.mark.parametrize(
        ("parameter", "schema"), [*HINT_SCHEMAS.items(), *NEWER_HINT_SCHEMAS], ids=lambda v: str(v)
    )
    def test_each_hint_and_its_schema(
        self, parameter: str, schema: Any, future_annotations: bool
    ) -> None:
        function = from_source(f"def f({parameter}): return x", future_annotations)
        tool = al.Tool.from_function(function)
        assert plain_copy(tool.parameters["properties"]) == {"x": schema}
        assert list(tool.parameters["required"]) == ([] if parameter in DEFAULT_OF else ["x"])
        if parameter in DEFAULT_OF:
            assert tool.execute({}, threading.Event()) == DEFAULT_OF[parameter]

    @pytest.mark.parametrize("future_annotations", [False, True], ids=["hints", "pep563"])
    @pytest.mark.parametrize(("hint", "says"), UNEXPRESSIBLE_HINTS)
    def test_an_unexpressible_hint_is_a_type_error_naming_the_parameter(
        self, hint: str, says: str, future_annotations: bool
    ) -> None:
        function = from_source(f"def f(ok: str, x: {hint}): pass", future_annotations)
        with pytest.raises(TypeError) as raised:
            al.Tool.from_function(function)
        assert str(raised.value).startswith("Tool.from_function(f): parameter 'x': ")
        assert says in str(raised.value)


def named_tool(name: str) -> al.Tool:
    return al.Tool(name, f"The {name} tool.", {"type": "object"}, lambda arguments, signal: name)


class TestToolRegistry:
    """The registry's contract: ToolRegistry(tools) with register(tool) (a duplicate name
    raises ValueError), get(name), __contains__, __len__, __iter__ and specs()."""

    def test_it_holds_its_tools_in_registration_order(self) -> None:
        tools = [named_tool(name) for name in ("zeta", "alpha", "mid")]
        registry = al.ToolRegistry(tools[:2])
        registry.register(tools[2])
        assert list(registry) == tools
        assert (len(registry), len(al.ToolRegistry())) == (3, 0)
        assert (registry.get("alpha"), registry.get("two")) == (tools[1], None)
        assert ("zeta" in registry, "two" in registry, 1 in registry) == (True, False, False)
        assert registry.specs() == tuple(tool.spec() for tool in tools)
        assert add_tool().spec() == al.ToolSpec("add", "Adds two numbers.", NUMBERS)

    @pytest.mark.parametrize(
        ("item", "error", "word"),
        [
            pytest.param(named_tool("one"), ValueError, "one", id="duplicate-name"),
            pytest.param("one", TypeError, "Tool", id="str"),
            pytest.param(None, TypeError, "Tool", id="none"),
            pytest.param(al.ToolSpec("one", "", {"type": "object"}), TypeError, "Tool", id="spec"),
        ],
    )
    def test_a_duplicate_or_a_non_tool_is_refused_and_changes_nothing(
        self, item: Any, error: type[Exception], word: str
    ) -> None:
        registry = al.ToolRegistry([named_tool("one")])
        original = registry.get("one")
        with pytest.raises(error, match=word):
            registry.register(item)
        assert list(registry) == [original]
        with pytest.raises(ValueError, match="one"):
            al.ToolRegistry([named_tool("one"), named_tool("one")])

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


class StrSubclass(str):
    """Only an exact str is taken verbatim: a subclass is just another JSON value."""


def raises_lookup_error(arguments: Dict[str, Any], signal: al.Signal) -> object:
    raise LookupError("no such station")


def raises_tool_error(arguments: Dict[str, Any], signal: al.Signal) -> object:
    raise al.ToolError("Try another city.")


def not_json(arguments: Dict[str, Any], signal: al.Signal) -> object:
    return {1, 2}


def giving(value: Any) -> list[al.Tool]:
    """A tool named "t" that returns ``value``."""
    return [no_arguments_tool("t", lambda arguments, signal: value)]


def interrupt(arguments: dict[str, Any], signal: Any) -> object:
    raise KeyboardInterrupt


# Tools (and the call "t" runs one of them or none), and the content of the call's result:
# exactly this str, or naming each of these words; and whether it is an error.
EXECUTED: dict[str, tuple[list[al.Tool], str | tuple[str, ...], bool]] = {
    "str-verbatim": (giving('He said "hi"\n'), 'He said "hi"\n', False),
    "dict": (giving({"sum": 42}), '{"sum":42}', False),  # Seed: content: '{"sum":42}'
    "non-ascii": (giving({"word": "café 😀"}), '{"word":"café 😀"}', False),
    "none": (giving(None), "null", False),
    "list": (giving([1, "a", None, True, 1.5]), '[1,"a",null,true,1.5]', False),
    "nested": (giving({"a": [{"b": []}]}), '{"a":[{"b":[]}]}', False),
    "int": (giving(7), "7", False),
    "bool": (giving(False), "false", False),
    "str-subclass": (giving(StrSubclass("hi")), '"hi"', False),
    # A value that is not JSON is a recoverable error that names the tool.
    "set": (giving({1, 2}), ("'t'", "JSON"), True),
    "object": (giving(Custom()), ("'t'", "JSON"), True),
    "nan": (giving(float("nan")), ("'t'", "JSON"), True),
    "inf": (giving({"x": float("inf")}), ("'t'", "JSON"), True),
    "cyclic-list": (giving(cyclic_array()), ("'t'", "JSON"), True),
    "bytes": (giving(b"bytes"), ("'t'", "JSON"), True),
    "raising-tool": ([no_arguments_tool("t", raises_lookup_error)], ("'t'", "LookupError",
                                                                     "no such station"), True),
    # ToolError's docstring: "The call's result is is_error=True with content exactly message".
    "tool-error": ([no_arguments_tool("t", raises_tool_error)], "Try another city.", True),
    "unknown-tool": ([], ("'t'",), True),
    "unknown-tool-among-others": ([add_tool(), echo_tool()], ("'t'", "add", "echo"), True),
    # Any callable that can take (arguments, signal) runs; one whose signature cannot be
    # read is trusted.
    "execute-function": ([no_arguments_tool("t", two_parameters)], "two", False),
    "execute-*args": ([no_arguments_tool("t", lambda *values: "variadic")], "variadic", False),
    "execute-lambda": ([no_arguments_tool("t", lambda a, s: "lambda")], "lambda", False),
    "execute-bound-method": ([no_arguments_tool("t", Executor().method)], "method", False),
    "execute-callable-object": ([no_arguments_tool("t", Executor())], "callable object", False),
    "execute-without-signature": ([no_arguments_tool("t", NoSignature())], "no signature", False),
}  # fmt: skip


class TestExecuteToolCall:
    """execute_tool_call: one result linked to the call; an unknown tool, bad arguments or
    an exception become a recoverable result, never an exception."""

    @pytest.mark.parametrize(
        ("tools", "expected", "is_error"), EXECUTED.values(), ids=list(EXECUTED)
    )
    def test_each_call_gets_one_linked_result(
        self, tools: list[al.Tool], expected: str | tuple[str, ...], is_error: bool
    ) -> None:
        result = al.execute_tool_call(
            al.ToolRegistry(tools), call("t", "c1", {}), threading.Event()
        )
        assert (result.id, result.tool_call_id, result.tool_name, result.is_error) == (
            "tool-result-c1", "c1", "t", is_error,
        )  # fmt: skip
        if isinstance(expected, str):
            assert result.content == expected
        for word in () if isinstance(expected, str) else expected:
            assert word in result.content

    @pytest.mark.parametrize(("id", "name"), [(1, "echo"), ("c1", ["echo"]), ("", "echo")])
    def test_a_call_no_result_can_be_linked_to_is_a_type_error(self, id: Any, name: Any) -> None:
        registry = al.ToolRegistry([echo_tool()])
        with pytest.raises(TypeError, match="id and name must be non-empty str"):
            al.execute_tool_call(registry, untyped.ToolCall(id, name, {}), threading.Event())

    def test_a_tool_error_message_must_be_a_str(self) -> None:
        assert al.ToolError("x").message == "x"
        for message in (1, None, b"x"):
            with pytest.raises(TypeError, match="ToolError message must be a str, got "):
                untyped.ToolError(message)

    def test_keyboard_interrupt_is_not_turned_into_a_result(self) -> None:
        """Only Exceptions become results: a KeyboardInterrupt propagates."""
        registry = al.ToolRegistry([no_arguments_tool("stop", interrupt)])
        with pytest.raises(KeyboardInterrupt):
            al.execute_tool_call(registry, call("stop", "c1", {}), threading.Event())

    def test_execute_receives_the_signal_given(self) -> None:
        seen: list[Any] = []
        tool = no_arguments_tool("probe", lambda arguments, signal: seen.append(signal))
        signal = threading.Event()
        al.execute_tool_call(al.ToolRegistry([tool]), call("probe", "c", {}), signal)
        assert len(seen) == 1
        assert seen[0] is signal


class TestRecoverableExceptionsAreLogged:
    """An exception that becomes a recoverable result is logged with its traceback through
    logging.getLogger("agent_loop"), which has only a NullHandler."""

    @pytest.mark.parametrize(
        ("execute", "exception"),
        [(raises_lookup_error, LookupError), (not_json, TypeError), (raises_tool_error, None)],
        ids=["raises", "not-json", "tool-error-is-not-logged"],
    )
    def test_the_record_has_the_traceback(
        self,
        caplog: pytest.LogCaptureFixture,
        execute: Callable[..., object],
        exception: type | None,
    ) -> None:
        caplog.set_level(logging.DEBUG, logger="agent_loop")
        _, result, _ = run(one_call("t"), tools=[no_arguments_tool("t", execute)])
        assert only_tool_result(result).is_error
        records = [r for r in caplog.records if r.name == "agent_loop"]
        assert len(records) == (0 if exception is None else 1)
        for record in records:
            assert record.levelno == logging.WARNING
            assert "'t'" in record.getMessage()
            assert record.exc_info is not None
            assert isinstance(record.exc_info[1], cast(type, exception))
        handlers = logging.getLogger("agent_loop").handlers
        assert [type(handler) for handler in handlers] == [logging.NullHandler]


@pytest.mark.hostile
class TestMisbehavingTools:
    """Seed: "A recoverable Tool error is still appended and sent to the next model
    request; it does not end the run by itself.\""""

    def test_returning_a_huge_string_is_kept_verbatim(self) -> None:
        huge = "y" * 5_000_000
        _, result, _ = run(one_call("huge"), [no_arguments_tool("huge", lambda a, s: huge)])
        assert only_tool_result(result) == al.ToolResultMessage(
            "tool-result-c1", "c1", "huge", huge, False
        )

    def test_tool_that_drives_the_run_reentrantly_is_recoverable(self) -> None:
        """next() on the run it is part of is a ValueError, an ordinary recoverable error."""
        holder: list[Any] = []
        model = one_call("reenter")
        run_ = start_run(model, [no_arguments_tool("reenter", lambda a, s: next(holder[0]))])
        holder.append(run_)
        _, result = settle(run_, model, max_steps=4, start=[user()])
        assert result.status == "completed"
        assert only_tool_result(result).is_error
        assert "ValueError" in only_tool_result(result).content


# --- Bounded plain JSON ------------------------------------------------------------------


class Grumpy(typing.Mapping[str, Any]):
    """A mapping whose own items() raises, though it can be read key by key."""

    def __getitem__(self, key: str) -> object:
        return {"a": 1}[key]

    def __iter__(self) -> Iterator[str]:
        return iter(["a"])

    def __len__(self) -> int:
        return 1

    def items(self) -> Any:
        raise RuntimeError("no items today")


def made_valid_after_construction() -> al.ToolCall:
    arguments: Dict[str, Any] = {"bad": float("inf")}
    tool_call = al.ToolCall("c1", "t", arguments)
    arguments["bad"] = 1.0  # now plain JSON, but not when the call was built
    return tool_call


class TestPlainJsonArguments:
    """Seed: "Tool arguments must be plain bounded JSON ... These checks occur before a Tool
    effect. Contradiction or excess becomes a failed MODEL_PROTOCOL_ERROR result." Arguments
    that are not are kept as given, and fail where they enter: the run, the start, or
    execute_tool_call (an error result)."""

    @pytest.mark.parametrize("make", NOT_PLAIN_JSON)
    def test_not_plain_arguments_fail_before_any_tool(self, make: Callable[[], Any]) -> None:
        """Anything but plain bounded JSON fails the step before any of its tools runs."""
        received: list[dict[str, Any]] = []
        good = al.ToolCall("call-probe-001", "probe", {"n": 1})
        bad = al.ToolCall("call-probe-002", "probe", make())  # construction never raises
        assert (bad.id, bad.name) == ("call-probe-002", "probe")
        model = FakeModel(tool_turn("response-001", good, bad), stop("response-002"))
        events, result, _ = run(model, tools=[probe_tool(received)])
        assert_failed(events, result, "MODEL_PROTOCOL_ERROR", "call-probe-002")
        assert_no_tool_ran(events, result, model, received)
        assert types_of(events).count("model.chunk") == 1
        assert model.finalized == ["request-001"]
        # The same where only the terminal response holds the call.
        response = al.scripted_response("response-001", [bad], "toolCall", chunks=[])
        events, result, model = run([response], tools=[probe_tool(received)])
        assert_failed(events, result, "MODEL_PROTOCOL_ERROR", "call-probe-002")
        assert_no_tool_ran(events, result, model, received)

    @pytest.mark.parametrize(
        ("arguments", "received"),
        [
            # Frozen arrays are tuples, so a tuple is an array; the tool receives lists.
            pytest.param({"xs": (1, (2, "three"), [])}, {"xs": [1, [2, "three"], []]},
                         id="tuples-are-arrays"),
            pytest.param(al.ToolCall("c", "t", {"o": {"k": [1, None]}, "s": "x"}).arguments,
                         {"o": {"k": [1, None]}, "s": "x"}, id="frozen-arguments-of-another-call"),
            # CPython shares the empty tuple: an immutable value reached twice is no aliasing.
            pytest.param(al.ToolCall("c", "t", {"a": [], "b": [], "c": {"d": []}}).arguments,
                         {"a": [], "b": [], "c": {"d": []}}, id="shared-empty-frozen-arrays"),
            # Only a container reachable twice is a violation: a scalar may repeat.
            pytest.param({"a": "same", "b": "same", "c": ["same", "same"], "d": 1, "e": 1},
                         {"a": "same", "b": "same", "c": ["same", "same"], "d": 1, "e": 1},
                         id="equal-scalars-repeat"),
        ],
    )  # fmt: skip
    def test_plain_arguments_reach_the_tool_as_plain_json(
        self, arguments: Any, received: Any
    ) -> None:
        events, result, _, given = run_probe_call(arguments)
        assert_tool_received(events, result, given, received)

    def test_invalid_arguments_are_kept_as_given(self) -> None:
        """ToolCall's docstring: arguments that are not plain bounded JSON "are kept as
        given" (read-only, or a mapping of another kind, as a plain dict)."""
        arguments = {"bad": float("inf")}
        assert al.ToolCall("c1", "t", arguments).arguments is arguments
        read_only = MappingProxyType({"bad": {1, 2}})
        kept = untyped.ToolCall("c1", "t", read_only)
        assert (type(kept.arguments), kept.arguments) == (dict, dict(read_only))
        grumpy = untyped.ToolCall("c1", "t", MappingProxyType(Grumpy()))
        assert (type(grumpy.arguments), grumpy.arguments) == (dict, {"a": 1})

    @pytest.mark.parametrize(
        ("make", "problem"),
        [
            pytest.param(lambda: untyped.ToolCall("c1", "t", MappingProxyType({"bad": {1, 2}})),
                         "arguments hold a set, which is not plain JSON", id="read-only-set"),
            pytest.param(made_valid_after_construction,
                         "arguments were not plain bounded JSON when the call was built",
                         id="made-valid-after-construction"),
            pytest.param(lambda: untyped.ToolCall("c1", "t", MappingProxyType(Grumpy())),
                         "arguments were not plain bounded JSON when the call was built",
                         id="mapping-whose-items-raise"),
            pytest.param(lambda: untyped.ToolCall("c1", "t", {"n": MappingProxyType(Grumpy())}),
                         "arguments cannot be read: RuntimeError: no items today",
                         id="nested-mapping-whose-items-raise"),
            pytest.param(lambda: untyped.ToolCall("c1", "t", [1]),
                         "arguments must be a JSON object, got list", id="list"),
            pytest.param(lambda: untyped.ToolCall("c1", "t", "text"),
                         "arguments must be a JSON object, got str", id="str"),
            pytest.param(lambda: untyped.ToolCall("c1", "t", None),
                         "arguments must be a JSON object, got NoneType", id="None"),
        ],
    )  # fmt: skip
    def test_they_fail_where_they_enter_and_no_tool_runs(self, make: Any, problem: str) -> None:
        """From the model, in the start or given to execute_tool_call: it fails, never raises."""
        ran: List[str] = []
        tool = no_arguments_tool("t", lambda a, s: ran.append("ran"))
        tool_call = make()
        _, result, _ = run([tool_turn("r1", tool_call)], tools=[tool])
        assert failure_message(result, "MODEL_PROTOCOL_ERROR") == f"tool call 'c1': {problem}"
        _, started, _ = run([], messages=[user(), assistant("r0", tool_call)])
        assert problem in failure_message(started, "INVALID_TRANSCRIPT")
        message = al.execute_tool_call(al.ToolRegistry([tool]), tool_call, threading.Event())
        assert (message.content, message.is_error) == (
            f"invalid arguments for tool 't': {problem}",
            True,
        )
        assert ran == []


# --- Message IR --------------------------------------------------------------------------


FIRST = al.ToolCall("c", "t", {"a": [1, {"b": None}], "s": "x"})


# Pairs of IR values and whether they are equal (a pair of blocks is also compared inside
# two assistant messages).
EQUALITY = [
    # Key order and list-or-tuple do not matter, nor frozen or not.
    pytest.param(FIRST, al.ToolCall("c", "t", {"s": "x", "a": [1, {"b": None}]}), True,
                 id="key-order"),
    pytest.param(FIRST, al.ToolCall("c", "t", {"a": (1, {"b": None}), "s": "x"}), True,
                 id="tuple-list"),
    pytest.param(FIRST, al.ToolCall("c", "t", FIRST.arguments), True, id="frozen-arguments"),
    pytest.param(FIRST, dataclasses.replace(FIRST), True, id="replaced"),
    pytest.param(add_result(), add_result(), True, id="tool-result"),
    # Every field counts.
    pytest.param(al.TextBlock("a"), al.TextBlock("b"), False, id="text"),
    pytest.param(user("a"), user("a", "user-002"), False, id="user-id"),
    pytest.param(add_result(), dataclasses.replace(add_result(), is_error=True), False,
                 id="is-error"),
    pytest.param(al.ToolCall("c", "t", {}), al.ToolCall("d", "t", {}), False, id="call-id"),
    pytest.param(al.ToolCall("c", "t", {}), al.ToolCall("c", "u", {}), False, id="call-name"),
    pytest.param(al.ToolCall("c", "t", {}), al.TextBlock("c"), False, id="call-text"),
    # The documented choice: JSON equality is strict, True is not 1 and 1 is not 1.0.
    *[pytest.param(untyped.ToolCall("c", "t", left), untyped.ToolCall("c", "t", right), False,
                   id=name)
      for name, left, right in [
          ("1-true", {"x": 1}, {"x": True}), ("1-1.0", {"x": 1}, {"x": 1.0}),
          ("true-1.0", {"x": True}, {"x": 1.0}), ("0-false", {"x": 0}, {"x": False}),
          ("nested-array", {"x": [1]}, {"x": [True]}), ("nested-object", {"x": {"y": 0}},
                                                        {"x": {"y": 0.0}}),
          ("1-string", {"x": 1}, {"x": "1"}), ("array-length", {"x": [1]}, {"x": [1, 1]}),
          ("keys", {"x": 1}, {"y": 1})]],
]  # fmt: skip


# How each value keeps the blocks it was given as a list.
KEPT_AS_TUPLES: dict[str, Callable[[list[Any]], Any]] = {
    "AssistantMessage": lambda blocks: al.AssistantMessage("m", blocks).content,
    "ModelResponse": lambda blocks: al.ModelResponse("r", "q", blocks, "stop").content,
    "ScriptedResponse": lambda blocks: al.ScriptedResponse("r", blocks, "stop").content,
    "scripted_response": lambda blocks: al.scripted_response("r", blocks, "stop").content,
    "scripted_response-chunks": lambda blocks: al.scripted_response("r", [], "stop",
                                                                    chunks=blocks).chunks,
}  # fmt: skip


class TestToolCallIsFrozen:
    """The Message IR is frozen dataclasses compared by value (TestRunOwnsSnapshots proves
    nothing reachable from a run is mutable): the run's transcript never changes under anyone."""

    @pytest.mark.parametrize(("left", "right", "equal"), EQUALITY)
    def test_ir_values_compare_by_value(self, left: Any, right: Any, equal: bool) -> None:
        assert (left == right) is equal
        if isinstance(left, (al.TextBlock, al.ToolCall)):
            messages = [al.AssistantMessage("m", (block,)) for block in (left, right)]
            assert (messages[0] == messages[1]) is equal

    def test_arguments_are_a_frozen_copy(self) -> None:
        """Mutating the caller's dict changes nothing; the call's own cannot be mutated."""
        arguments: dict[str, Any] = {"xs": [1, 2], "o": {"k": "v"}}
        tool_call = al.ToolCall("call-001", "probe", arguments)
        arguments["xs"].append(3)
        arguments["o"]["k"] = "changed"
        del arguments["o"]
        with pytest.raises(TypeError):
            tool_call.arguments["o"]["k"] = "changed"  # type: ignore[index]
        assert type(tool_call.arguments["xs"]) is tuple
        assert plain_copy(tool_call.arguments) == {"xs": [1, 2], "o": {"k": "v"}}

    @pytest.mark.parametrize(
        "plain",
        [lambda tool_call: tool_call.plain_arguments(),
         lambda tool_call: tool_call.to_dict()["arguments"]],
        ids=["plain_arguments", "to_dict"],
    )  # fmt: skip
    def test_plain_arguments_are_a_fresh_plain_copy_each_time(self, plain: Any) -> None:
        """plain_arguments() and to_dict(): a fresh plain copy of the arguments, for json."""
        arguments: dict[str, Any] = {"a": [1, {"b": [True, None, 1.5]}], "c": {"d": "e"}}
        tool_call = al.ToolCall("c1", "t", arguments)
        first, second = plain(tool_call), plain(tool_call)
        assert json.loads(json.dumps(first)) == first == arguments
        types = [type(first), type(first["a"]), type(first["a"][1]), type(first["a"][1]["b"])]
        assert types == [dict, list, dict, list]
        assert first["a"] is not second["a"]
        first["a"][1]["b"].append("changed")
        assert plain(tool_call) == arguments
        assert tool_call == al.ToolCall("c1", "t", arguments)

    def test_each_execution_gets_a_fresh_plain_dict_it_may_mutate(self) -> None:
        """execute gets a fresh plain dict it may mutate with no effect on the transcript."""
        original: dict[str, Any] = {"xs": [1, 2], "o": {"k": "v"}, "s": "text"}
        received: list[dict[str, Any]] = []
        kinds = (dict, list, dict)

        def execute(arguments: dict[str, Any], signal: Any) -> object:
            received.append(copy.deepcopy(arguments))
            assert (type(arguments), type(arguments["xs"]), type(arguments["o"])) == kinds
            arguments["xs"].append(99)
            arguments["o"]["k"] = "mutated"
            del arguments["s"]
            return "ok"

        calls = [call("probe", "call-001", original), call("probe", "call-002", original)]
        tools = [no_arguments_tool("probe", execute)]
        events, _, model = run([tool_turn("r1", *calls), stop("r2")], tools)
        assert received == [original, original]
        assert model.requests[1].messages[1] == assistant("r1", *calls)
        chunks = [e.payload["chunk"] for e in events if e.type == "model.chunk"]
        carried = [chunk.tool_call for chunk in chunks if isinstance(chunk, al.ToolCallChunk)]
        carried += [e.payload["tool_call"] for e in events if "tool_call" in e.payload]
        carried += model.requests[1].messages[1].content
        assert len(carried) == 8  # two calls, each streamed, started, finished and kept
        assert all(plain_copy(tool_call.arguments) == original for tool_call in carried)

    @pytest.mark.parametrize("make", KEPT_AS_TUPLES.values(), ids=list(KEPT_AS_TUPLES))
    def test_content_given_as_a_list_is_stored_as_a_tuple(self, make: Any) -> None:
        """What the caller does to its list afterwards changes nothing (a script's too)."""
        blocks: list[Any] = [al.TextBlock("a"), FIRST]
        content = make(blocks)
        blocks.append(al.TextBlock("later"))
        assert content == (al.TextBlock("a"), FIRST)

    def test_discriminators_have_the_protocol_values(self) -> None:
        """Protocol values are spelled as in the seed ("toolResult", "toolCall")."""
        values: list[Any] = [
            al.TextBlock("a"),
            FIRST,
            al.ThinkingBlock("a"),
            al.TextDelta("r", ""),
        ]
        values += [al.ToolCallChunk("r", FIRST), al.ThinkingDelta("r", "a")]
        assert [value.type for value in values] == ["text", "toolCall", "thinking"] * 2
        messages = (user(), assistant("r"), add_result())
        assert [message.role for message in messages] == ["user", "assistant", "toolResult"]


class TestCopyingAndHashing:
    """Values survive pickle and copy equal, read-only mappings frozen again; a value that
    holds a mapping says __hash__ = None; messages and blocks hash."""

    def test_an_event_keeps_a_read_only_payload_and_copies_any_other(self) -> None:
        read_only = MappingProxyType({"message": user()})
        assert al.Event(0, "message.accepted", read_only).payload is read_only
        plain = {"message": user()}
        event = al.Event(0, "message.accepted", plain)
        plain["message"] = user("changed", "user-002")
        assert event.payload == {"message": user()}
        assert type(event.payload) is MappingProxyType

    @pytest.mark.parametrize(
        "duplicate",
        [
            pytest.param(lambda value: pickle.loads(pickle.dumps(value)), id="pickle"),
            pytest.param(copy.deepcopy, id="deepcopy"),
            pytest.param(copy.copy, id="copy"),
        ],
    )
    def test_results_events_requests_and_tools_copy_equal(self, duplicate: Any) -> None:
        script = [tool_turn("r1", text("Adding."), add_call()), stop("r2")]
        tool = al.Tool("add", "Adds two numbers.", NUMBERS, copy_echo)
        events, result, model = run(script, tools=[add_tool()])
        assert duplicate(result) == result
        assert [duplicate(event) for event in events] == events
        assert [duplicate(request) for request in model.requests] == model.requests
        assert isinstance(duplicate(result.messages[1].content[1]).arguments, MappingProxyType)
        for value in (tool, tool.spec()):
            assert duplicate(value) == value
            assert isinstance(duplicate(value).parameters, MappingProxyType)
        # A loop-built request's snapshot is lazy: its pickle holds only its own messages.
        pickled = pickle.dumps(model.requests[0])
        assert b"The sum is 42." not in pickled
        assert pickle.loads(pickled).messages == result.messages[:1]

    def test_a_spec_built_from_a_plain_dict_is_frozen(self) -> None:
        parameters: dict[str, Any] = {"type": "object", "properties": {}}
        spec = al.ToolSpec("echo", "Echoes.", parameters)
        parameters["type"] = "string"
        parameters["properties"]["text"] = {"type": "string"}
        assert type(spec.parameters) is MappingProxyType
        assert spec.parameters == {"type": "object", "properties": {}}

    def test_messages_and_blocks_hash_by_value(self) -> None:
        first = call("add", "call-1", {"left": 1, "right": [2]})
        same = call("add", "call-1", {"left": 1, "right": [2]})
        assert len({first, same}) == 1
        message = al.AssistantMessage("message-1", (text("Adding."), first))
        assert message in {al.AssistantMessage("message-1", [text("Adding."), same])}
        values = [al.TextBlock("x"), user(), add_result(), thinking_assistant()]
        assert [hash(value) for value in values] == [hash(copy.deepcopy(v)) for v in values]

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
    blocks = (SIGNED, text("Adding."), REDACTED, al.ThinkingBlock(""), add_call())
    return al.AssistantMessage("message-response-001", blocks, usage)


class TestThinkingBlocksAndUsage:
    """ThinkingBlock and Usage (their JSON is in TestJsonShapes): a count is None or an int
    >= 0; "a field that is None on either side is None in the sum"."""

    @pytest.mark.parametrize(
        ("value", "error", "words"),
        [
            pytest.param(0, None, "", id="0"),
            pytest.param(10**12, None, "", id="large"),
            pytest.param(None, None, "", id="None"),
            pytest.param(-1, ValueError, "must be None or an int >= 0, got -1", id="negative"),
            pytest.param(True, TypeError, "must be None or an int, got bool", id="bool"),
            pytest.param(1.0, TypeError, "must be None or an int, got float", id="float"),
            pytest.param("3", TypeError, "must be None or an int, got str", id="str"),
        ],
    )
    def test_a_usage_count_is_none_or_an_int_at_least_zero(
        self, value: Any, error: type[Exception] | None, words: str
    ) -> None:
        for name in USAGE_FIELDS:
            if error is None:
                assert getattr(al.Usage(**{name: value}), name) == value
                continue
            with pytest.raises(error, match=re.escape(f"Usage {name} {words}")):
                al.Usage(**{name: value})

    @pytest.mark.parametrize(
        ("left", "right", "total"),
        [
            (FULL_USAGE, al.Usage(1, 2, 3, 4, 5), al.Usage(101, 22, 3003, 44, 10)),
            (FULL_USAGE, al.Usage(1, 2, None, 4, None), al.Usage(101, 22, None, 44, None)),
            (al.Usage(None, 2), al.Usage(1, 2), al.Usage(None, 4)),
            (FULL_USAGE, al.Usage(), al.Usage()),
        ],
        ids=["known", "unknown-right", "unknown-left", "all-unknown"],
    )
    def test_usages_add_field_by_field(self, left: al.Usage, right: Any, total: al.Usage) -> None:
        assert left + right == total
        for other in (object(), {"input": 1}):
            with pytest.raises(TypeError):
                left + other

    def test_thinking_is_kept_in_order_and_left_out_of_the_text(self) -> None:
        """An assistant message equals another only with the same blocks and usage."""
        assert al.text_from_assistant(thinking_assistant()) == "Adding."
        assert thinking_assistant() == thinking_assistant(al.Usage(100, 20, 3000, 40, 5))
        assert thinking_assistant() != thinking_assistant(None)
        assert thinking_assistant().content[:3] == (SIGNED, text("Adding."), REDACTED)


# --- Interop and resumption -------------------------------------------------------------


ADD_JSON = {"type": "toolCall", "id": "call-add-001", "name": "add",
    "arguments": {"left": 20, "right": 22}}  # fmt: skip
USER_JSON = {"id": "user-001", "role": "user", "content": "Add 20 and 22."}
DELTA_JSON = {"type": "text", "requestId": "request-001", "text": "Hi"}
USAGE_JSON = {"input": 1, "output": 2}
ADD_SPEC_JSON = {"name": "add", "description": "Adds two numbers.", "parameters": NUMBERS}
ON_REQUEST = {"request_id": "request-001", "tool_call": add_call()}
# Seed: {id: "tool-result-call-add-001", role: "toolResult", toolCallId: "call-add-001",
# toolName: "add", content: '{"sum":42}', isError: false}
RESULT_JSON = {"id": "tool-result-call-add-001", "role": "toolResult",
    "toolCallId": "call-add-001", "toolName": "add", "content": '{"sum":42}', "isError": False,
}  # fmt: skip


# Each value of the IR, events and results, and its to_dict() written out literally: the
# seed's keys (Pi's for thinking and usage), optional keys absent when None or False.
JSON_SHAPES: dict[str, tuple[Any, Dict[str, Any]]] = {
    "text-block": (al.TextBlock("hi"), {"type": "text", "text": "hi"}),
    "tool-call": (add_call(), ADD_JSON),
    "user": (user(), USER_JSON),
    "assistant": (assistant("r", text("Adding."), add_call()),
                  {"id": "message-r", "role": "assistant", "content": [{"type": "text",
                                                                        "text": "Adding."},
                                                                       ADD_JSON]}),
    "tool-result": (add_result(), RESULT_JSON),
    "thinking": (al.ThinkingBlock("hmm"), {"type": "thinking", "thinking": "hmm"}),
    "thinking-signed": (SIGNED,
                        {"type": "thinking", "thinking": SIGNED.thinking,
                         "thinkingSignature": "sig-001"}),
    "thinking-redacted": (REDACTED, {"type": "thinking", "thinking": "",
                                     "thinkingSignature": "opaque-data",
                                     "redacted": True}),
    "usage": (FULL_USAGE,
              {"input": 100, "output": 20, "cacheRead": 3000, "cacheWrite": 40, "reasoning": 5}),
    "usage-partly-known": (al.Usage(output_tokens=0), {"output": 0}),
    "usage-unknown": (al.Usage(), {}),
    "assistant-with-usage": (al.AssistantMessage("m", (), al.Usage(1, 2)),
                             {"id": "m", "role": "assistant", "content": [], "usage": USAGE_JSON}),
    "text-delta": (al.TextDelta("request-001", "Hi"), DELTA_JSON),
    "thinking-delta": (al.ThinkingDelta("request-001", "Hm"),
                       {"type": "thinking", "requestId": "request-001", "thinking": "Hm"}),
    "tool-call-chunk": (al.ToolCallChunk("request-001", add_call()),
                        {"type": "toolCall", "requestId": "request-001", "toolCall": ADD_JSON}),
    "response": (al.ModelResponse("r", "request-001", (add_call(),), "toolCall"),
                 {"id": "r", "requestId": "request-001", "content": [ADD_JSON],
                  "stopReason": "toolCall"}),
    "response-with-usage": (al.ModelResponse("r", "request-001", (), "stop", al.Usage(1, 2)),
                            {"id": "r", "requestId": "request-001", "content": [],
                             "stopReason": "stop",
                             "usage": USAGE_JSON}),
    "request": (al.ModelRequest("request-001", (user(),), (add_tool().spec(),)),
                {"id": "request-001", "messages": [USER_JSON], "tools": [ADD_SPEC_JSON]}),
    "run-error": (al.RunError("MODEL_STREAM_ERROR", "boom"),
                  {"code": "MODEL_STREAM_ERROR", "message": "boom"}),
    "completed": (al.RunResult("completed", (user(),), 1, final_text="Done."),
                  {"status": "completed", "messages": [USER_JSON], "steps": 1,
                   "finalText": "Done."}),
    "completed-empty-text-and-usage": (al.RunResult("completed", (), 1, final_text="",
                                                    usage=al.Usage()),
                                       {"status": "completed", "messages": [], "steps": 1,
                                        "finalText": "",
                                        "usage": {}}),
    "maxSteps": (al.RunResult("maxSteps", (), 3, max_steps=3),
                 {"status": "maxSteps", "messages": [], "steps": 3, "maxSteps": 3}),
    "failed": (al.RunResult("failed", (), 0, error=al.RunError("INVALID_TRANSCRIPT", "bad")),
               {"status": "failed", "messages": [], "steps": 0,
                "error": {"code": "INVALID_TRANSCRIPT", "message": "bad"}}),
    "cancelled-resumed": (al.RunResult("cancelled", (), 2, request_sequence_start=3),
                          {"status": "cancelled", "messages": [], "steps": 2,
                           "requestSequenceStart": 3}),
    "message.accepted": (al.Event(0, "message.accepted", {"message": user()}),
                         {"sequence": 0, "type": "message.accepted",
                          "payload": {"message": USER_JSON}}),
    "model.chunk": (al.Event(1, "model.chunk", {"request_id": "request-001",
                                                "chunk": al.TextDelta("request-001", "Hi")}),
                    {"sequence": 1, "type": "model.chunk",
                     "payload": {"requestId": "request-001", "chunk": DELTA_JSON}}),
    "tool.started": (al.Event(2, "tool.started", ON_REQUEST),
                     {"sequence": 2, "type": "tool.started",
                      "payload": {"requestId": "request-001", "toolCall": ADD_JSON}}),
    "tool.finished": (al.Event(3, "tool.finished", {**ON_REQUEST, "tool_result": add_result()}),
                      {"sequence": 3, "type": "tool.finished",
                       "payload": {"requestId": "request-001", "toolCall": ADD_JSON,
                                   "toolResult": RESULT_JSON}}),
    "run.finished": (al.Event(4, "run.finished", {"result": al.RunResult("cancelled", (), 0)}),
                     {"sequence": 4, "type": "run.finished",
                      "payload": {"result": {"status": "cancelled", "messages": [], "steps": 0}}}),
}  # fmt: skip


class TestJsonShapes:
    """The JSON keys are the seed's (toolCallId, toolName, isError, stopReason, requestId,
    finalText, maxSteps, ...) and Pi's for thinking and usage; each is written out here."""

    @pytest.mark.parametrize(("value", "expected"), JSON_SHAPES.values(), ids=list(JSON_SHAPES))
    def test_to_dict_writes_the_seeds_keys(self, value: Any, expected: Dict[str, Any]) -> None:
        """Plain dicts and lists (a list is never equal to a tuple), optional keys absent."""
        assert value.to_dict() == expected


def through_json(value: Any) -> Any:
    """A value after a trip through JSON text, as a log file would carry it."""
    return json.loads(json.dumps(value))


EXTRA_ARGUMENTS: dict[str, Any] = {"text": 'héllo, wörld 🙂 \u2028 "quoted" \\ back', "meta": {
    "numbers": [0, -7, 2.5, 1.0, 1e-300, 12345678901234567890], "flags": [True, False],
    "nothing": None, "nested": {"deeper": [{"ключ": "значение"}, []], "empty": {}}}}  # fmt: skip
"""Echo arguments with every JSON kind: nested, unicode, floats, bools, null."""


def recorded_run() -> tuple[list[al.Event], al.RunResult, FakeModel]:
    """Three steps: text and a tool call; three calls of which two fail recoverably (bad
    arguments, unknown tool); then the answer."""
    script = [
        tool_turn("response-001", text("Let me add."), add_call()),
        tool_turn(
            "response-002",
            call("echo", "call-echo-001", EXTRA_ARGUMENTS),
            call("add", "call-add-002", {"left": "twenty", "right": 22}),
            call("missing", "call-missing-001", {}),
            text("Three calls; two will fail."),
        ),
        stop("response-003", "The sum is 42. Ünïcödé 🙂"),
    ]
    return run(script, tools=[add_tool(), echo_tool()], max_steps=4)


def cancelling(arguments: dict[str, Any], signal: Any) -> object:
    """A tool that sets the run's signal while it runs (so its result is discarded)."""
    signal.set()
    return "too late"


# One real run of each RunResult status (and one with thinking and usage, one resumed).
RUNS_OF_EVERY_STATUS: dict[str, Callable[[], tuple[list[al.Event], al.RunResult, Any]]] = {
    "completed": recorded_run,
    "thinking": lambda: run(thinking_script(), [add_tool()]),
    "cancelled": lambda: run([tool_turn("r1", text("Slowly."), call("slow", "c1",
                                                                    {"why": ["x"]}))],
                             [no_arguments_tool("slow", cancelling)], signal=threading.Event()),
    "failed": lambda: run([al.scripted_response("r1", [text("Hi")], "stop",
                                                request_id="request-9")]),
    "maxSteps": lambda: run([tool_turn("r1", add_call())], [add_tool()], max_steps=1),
    "resumed": lambda: run([stop("r1")], request_sequence_start=3),
}  # fmt: skip


class TestRoundTrips:
    """message_from_dict(m.to_dict()) == m and event_from_dict(e.to_dict()) == e, through
    JSON text too; equality is strict JSON (TestToolCallIsFrozen), so every JSON kind of
    EXTRA_ARGUMENTS (1.0 and 1, true, null, [] and {}) survives the trip."""

    @pytest.mark.parametrize(
        "message",
        [
            pytest.param(user(), id="user"),
            pytest.param(user("Ünïcödé 🙂 \u0000 \n", "user-ü"), id="user-unicode"),
            pytest.param(user("", "user-empty"), id="user-empty-content"),
            pytest.param(assistant("r"), id="assistant-empty"),
            pytest.param(assistant("r", text("")), id="assistant-empty-text"),
            pytest.param(assistant("r", text("a"), call("echo", "c1", EXTRA_ARGUMENTS), text("b"),
                                   call("add", "c2", {})), id="assistant-mixed-nested"),
            pytest.param(thinking_assistant(FULL_USAGE), id="thinking-full-usage"),
            pytest.param(thinking_assistant(al.Usage(output_tokens=7)), id="thinking-some-usage"),
            pytest.param(thinking_assistant(al.Usage()), id="thinking-usage-unknown"),
            pytest.param(thinking_assistant(None), id="thinking-no-usage"),
            pytest.param(add_result(), id="ok"),
            pytest.param(al.ToolResultMessage("tool-result-c", "c", "add", "no such tool", True),
                         id="error"),
        ],
    )  # fmt: skip
    def test_message(self, message: al.Message) -> None:
        for data in (message.to_dict(), through_json(message.to_dict())):
            again = al.message_from_dict(data)
            assert (again, type(again)) == (message, type(message))
            assert again.content == message.content  # the blocks in the model's order

    @pytest.mark.parametrize("make", RUNS_OF_EVERY_STATUS.values(), ids=list(RUNS_OF_EVERY_STATUS))
    def test_every_event_of_a_run_survives_json_text_exactly(
        self, make: Callable[[], tuple[list[al.Event], al.RunResult, Any]]
    ) -> None:
        """Read back, each event equals its original and writes the same JSON text."""
        events, result, _ = make()
        log = [json.dumps(event.to_dict()) for event in events]
        rebuilt = [al.event_from_dict(json.loads(line)) for line in log]
        assert rebuilt == [al.event_from_dict(event.to_dict()) for event in events] == events
        assert [json.dumps(event.to_dict()) for event in rebuilt] == log
        assert rebuilt[-1].payload["result"] == result


def event_dict(type: str, payload: Any, sequence: Any = 0) -> dict[str, Any]:
    return {"sequence": sequence, "type": type, "payload": payload}


def without(data: dict[str, Any], key: str) -> dict[str, Any]:
    return {name: value for name, value in data.items() if name != key}


def assistant_dict(content: Any, usage: Any = None) -> dict[str, Any]:
    data = {"id": "m", "role": "assistant", "content": content}
    return data if usage is None else {**data, "usage": usage}


def assistant_dict_with(arguments: Any) -> dict[str, Any]:
    """An assistant message dict whose one block is a call with these arguments."""
    return assistant_dict([{"type": "toolCall", "id": "c", "name": "n", "arguments": arguments}])


def thinking_dict(**fields: Any) -> dict[str, Any]:
    """An assistant message dict whose one block is a thinking block with these fields."""
    return assistant_dict([{"type": "thinking", **fields}])


def chunk_dict(chunk: Any) -> dict[str, Any]:
    return event_dict("model.chunk", {"requestId": "r", "chunk": chunk})


def result_dict(**changes: Any) -> dict[str, Any]:
    """A run.finished event dict whose result has these keys changed."""
    return event_dict("run.finished", {"result": {**RUN_RESULT_DICT, **changes}})


def finished_dict(**payload: Any) -> dict[str, Any]:
    return event_dict("tool.finished", {"requestId": "r", "toolCall": CALL_DICT, **payload})


USER_DICT = {"id": "u", "role": "user", "content": "hi"}
TEXT_BLOCK = {"type": "text", "text": "x"}
CALL_DICT = {"type": "toolCall", "id": "call-1", "name": "add", "arguments": {}}
THINKING_DICT = {"type": "thinking", "thinking": "t", "thinkingSignature": "s", "redacted": False}
USAGE_DICT = {"input": 1, "output": 1, "cacheRead": 1, "cacheWrite": 1, "reasoning": 1}
TOOL_RESULT_DICT = {"id": "tool-result-call-1", "role": "toolResult", "toolCallId": "call-1",
    "toolName": "add", "content": "3", "isError": False}  # fmt: skip
CALL_ARRAY = {**CALL_DICT, "arguments": []}
ERROR_DICT = {"code": "MODEL_STREAM_ERROR", "message": "m"}
RUN_RESULT_DICT = {"status": "completed", "messages": [], "steps": 1, "finalText": "ok"}
FULL_RESULT_DICT = {**RUN_RESULT_DICT, "maxSteps": 1, "error": ERROR_DICT,
                    "requestSequenceStart": 0,
                    "usage": USAGE_DICT}  # fmt: skip
OPTIONAL_KEYS = {"thinkingSignature", "redacted", "usage", *USAGE_DICT, "finalText", "maxSteps",
                 "error", "requestSequenceStart"}  # fmt: skip
OF_ANOTHER_TYPE = {str: 5, bool: "x", int: "x", list: {}, dict: []}


# Every object a reader reads: (the reader, its path, a valid one, how to embed it).
READ_OBJECTS: list[tuple[Callable[[Any], object], str, dict[str, Any], Callable[[Any], Any]]] = [
    (al.message_from_dict, "message", USER_DICT, lambda data: data),
    (al.message_from_dict, "message", TOOL_RESULT_DICT, lambda data: data),
    (al.message_from_dict, "message", assistant_dict([], USAGE_DICT), lambda data: data),
    (al.message_from_dict, "message.content[0]", TEXT_BLOCK,
     lambda block: assistant_dict([block])),
    (al.message_from_dict, "message.content[0]", CALL_DICT, lambda block: assistant_dict([block])),
    (al.message_from_dict, "message.content[0]", THINKING_DICT,
     lambda block: assistant_dict([block])),
    (al.message_from_dict, "message.usage", USAGE_DICT, lambda usage: assistant_dict([], usage)),
    (al.event_from_dict, "event", event_dict("message.accepted", {"message": USER_DICT}),
     lambda data: data),
    (al.event_from_dict, "event.payload", {"message": USER_DICT},
     lambda payload: event_dict("message.accepted", payload)),
    (al.event_from_dict, "event.payload", {"requestId": "r", "chunk": {**TEXT_BLOCK,
                                                                       "requestId": "r"}},
     lambda payload: event_dict("model.chunk", payload)),
    (al.event_from_dict, "event.payload.chunk", {**TEXT_BLOCK, "requestId": "r"}, chunk_dict),
    (al.event_from_dict, "event.payload.chunk", {"type": "thinking", "requestId": "r",
                                                 "thinking": "t"},
     chunk_dict),
    (al.event_from_dict, "event.payload.chunk", {"type": "toolCall", "requestId": "r",
                                                 "toolCall": CALL_DICT},
     chunk_dict),
    (al.event_from_dict, "event.payload", {"requestId": "r", "toolCall": CALL_DICT},
     lambda payload: event_dict("tool.started", payload)),
    (al.event_from_dict, "event.payload", {"requestId": "r", "toolCall": CALL_DICT,
                                           "toolResult": TOOL_RESULT_DICT},
     lambda payload: event_dict("tool.finished", payload)),
    (al.event_from_dict, "event.payload", {"result": FULL_RESULT_DICT},
     lambda payload: event_dict("run.finished", payload)),
    (al.event_from_dict, "event.payload.result", FULL_RESULT_DICT,
     lambda result: event_dict("run.finished", {"result": result})),
    (al.event_from_dict, "event.payload.result.error", ERROR_DICT,
     lambda error: event_dict("run.finished", {"result": {**RUN_RESULT_DICT, "error": error}})),
]  # fmt: skip


# Each required key of each object left out, and each key given a value of another JSON
# type: the reader, the dict, and the start of the message.
BROKEN_FIELDS = [
    *[pytest.param(read, embed(without(valid, key)), f"{path}.{key} is missing",
                   id=f"{path}.{key}-missing")
      for read, path, valid, embed in READ_OBJECTS for key in valid if key not in OPTIONAL_KEYS],
    *[pytest.param(read, embed({**valid, key: OF_ANOTHER_TYPE[type(value)]}),
                   f"{path}.{key} must be ",
                   id=f"{path}.{key}-of-another-type")
      for read, path, valid, embed in READ_OBJECTS for key, value in valid.items()],
]  # fmt: skip


# What a missing key or a wrong type does not cover: unknown values, index paths, bounds,
# and the rules that tie fields together.
MALFORMED_MESSAGES: dict[str, tuple[Any, str]] = {
    "not-an-object": ([], "message must be an object"),
    "unknown-role": ({**USER_DICT, "role": "system"}, "message.role: unknown value 'system'"),
    "toolCallId-null": ({**TOOL_RESULT_DICT, "toolCallId": None}, "message.toolCallId"),
    "isError-int": ({**TOOL_RESULT_DICT, "isError": 1}, "message.isError must be a boolean"),
    "block-not-object": (assistant_dict(["hi"]), "message.content[0] must be an object"),
    "unknown-block-type": (assistant_dict([{"type": "image"}]),
                           ".content[0].type: unknown value 'image'"),
    "text-without-text": (assistant_dict([TEXT_BLOCK, {"type": "text"}]),
                          ".content[1].text is missing"),
    "arguments-null": (assistant_dict_with(None), "message.content[0].arguments"),
    "arguments-too-deep": (assistant_dict_with(nested(al.MAX_ARGUMENT_DEPTH + 1)),
                           "content[0].arguments: arguments nest containers deeper than 32"),
    "arguments-too-many-values": (assistant_dict_with({"a": [0] * al.MAX_ARGUMENT_SLOTS}),
                                  "content[0].arguments: arguments hold more than 257 values"),
    "arguments-too-much-text": (assistant_dict_with({"a": "x" * al.MAX_ARGUMENT_TEXT}),
                                "content[0].arguments: arguments hold more than 4096 code points"),
    "arguments-nan": (assistant_dict_with({"a": float("nan")}),
                      "content[0].arguments: arguments hold nan, which is not a JSON number"),
    "redacted-with-thinking": (thinking_dict(thinking="secret", thinkingSignature="s",
                                             redacted=True),
                               "message.content[0]: a redacted thinking block holds its data"),
    "redacted-without-signature": (thinking_dict(thinking="", redacted=True),
                                   "got thinking '', signature None"),
    "usage-float": (assistant_dict([], {"output": 2.0}),
                    "message.usage.output must be an integer"),
    "usage-bool": (assistant_dict([], {"cacheRead": True}),
                   ".cacheRead must be an integer, got bool"),
    "usage-negative": (assistant_dict([], {"cacheWrite": -1}), ".cacheWrite must be >= 0, got -1"),
}  # fmt: skip
MALFORMED_EVENTS: dict[str, tuple[Any, str]] = {
    "not-an-object": ("event", "event must be an object"),
    "sequence-true": (event_dict("message.accepted", {"message": USER_DICT}, True), "got bool"),
    "sequence-float": (event_dict("message.accepted", {"message": USER_DICT}, 1.0), "got float"),
    "unknown-type": (event_dict("agent_start", {}), "event.type: unknown value 'agent_start'"),
    "message-malformed": (event_dict("message.accepted", {"message": without(USER_DICT, "id")}),
                          "event.payload.message.id is missing"),
    "unknown-chunk-type": (chunk_dict({"type": "image", "requestId": "r"}),
                           ".chunk.type: unknown value 'image'"),
    "chunk-toolCall-is-text": (chunk_dict({"type": "toolCall", "requestId": "r",
                                           "toolCall": TEXT_BLOCK}),
                               "event.payload.chunk.toolCall must be a toolCall block"),
    "started-toolCall-is-text": (event_dict("tool.started", {"requestId": "r",
                                                             "toolCall": TEXT_BLOCK}),
                                 "event.payload.toolCall must be a toolCall block"),
    "started-arguments-list": (event_dict("tool.started", {"requestId": "r",
                                                           "toolCall": CALL_ARRAY}),
                               "event.payload.toolCall.arguments must be an object"),
    "finished-toolResult-is-user": (finished_dict(toolResult=USER_DICT),
                                    "event.payload.toolResult must be a toolResult message"),
    "finished-isError-string": (finished_dict(toolResult={**TOOL_RESULT_DICT, "isError": "no"}),
                                "event.payload.toolResult.isError must be a boolean"),
    "steps-float": (result_dict(steps=1.5),
                    "event.payload.result.steps must be an integer, got float"),
    "unknown-status": (result_dict(status="done"),
                       "event.payload.result.status: unknown value 'done'"),
    "result-message-malformed": (result_dict(messages=[USER_DICT, {"id": "x"}]),
                                 "event.payload.result.messages[1].role is missing"),
    "unknown-error-code": (result_dict(error={"code": "OOPS", "message": "m"}),
                           ".code: unknown value 'OOPS'"),
    "run-usage-negative": (result_dict(usage={"input": -5}),
                           "event.payload.result.usage.input must be >= 0"),
}  # fmt: skip


class TestMalformedDicts:
    """A malformed message or event dict raises ValueError naming the field."""

    def test_the_objects_read_are_valid_as_given(self) -> None:
        """The valid objects whose fields test_a_broken_field_is_named breaks."""
        for read, _, valid, embed in READ_OBJECTS:
            read(embed(valid))

    @pytest.mark.parametrize(("read", "data", "field"), BROKEN_FIELDS)
    def test_a_broken_field_is_named(self, read: Any, data: Any, field: str) -> None:
        with pytest.raises(ValueError, match=re.escape(field)):
            read(data)

    @pytest.mark.parametrize(
        ("data", "field"), MALFORMED_MESSAGES.values(), ids=list(MALFORMED_MESSAGES)
    )
    def test_a_malformed_message(self, data: Any, field: str) -> None:
        with pytest.raises(ValueError, match=re.escape(field)):
            al.message_from_dict(data)

    @pytest.mark.parametrize(
        ("data", "field"), MALFORMED_EVENTS.values(), ids=list(MALFORMED_EVENTS)
    )
    def test_a_malformed_event(self, data: Any, field: str) -> None:
        with pytest.raises(ValueError, match=re.escape(field)):
            al.event_from_dict(data)

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
        assert message == al.AssistantMessage("m", (al.ToolCall("c", "n", arguments),))

    def test_nan_from_json_text_is_rejected(self) -> None:
        """json.loads accepts NaN, which is not JSON: the reader must not."""
        line = json.dumps(assistant_dict_with({"x": 0})).replace('"x": 0', '"x": NaN')
        with pytest.raises(ValueError, match=r"arguments: .*not a JSON number"):
            al.message_from_dict(json.loads(line))

    def test_a_rejected_dict_is_left_unchanged(self) -> None:
        data = finished_dict(toolResult=USER_DICT)
        before = json.dumps(data, sort_keys=True)
        with pytest.raises(ValueError, match="toolResult"):
            al.event_from_dict(data)
        assert json.dumps(data, sort_keys=True) == before

    @pytest.mark.parametrize(
        ("read", "data", "expected"),
        [
            pytest.param(al.message_from_dict,
                         {**thinking_dict(thinking="", thinkingSignature=None, redacted=None),
                          "usage": None},
                         al.AssistantMessage("m", (al.ThinkingBlock(""),)),
                         id="thinking-and-usage"),
            pytest.param(al.message_from_dict, assistant_dict([], {"input": None, "output": 3}),
                         al.AssistantMessage("m", (), al.Usage(output_tokens=3)),
                         id="usage-count"),
            pytest.param(al.event_from_dict,
                         result_dict(status="cancelled", steps=0, finalText=None, maxSteps=None,
                                     error=None,
                                     requestSequenceStart=None),
                         al.Event(0, "run.finished", {"result": al.RunResult("cancelled", (), 0)}),
                         id="result"),
        ],
    )  # fmt: skip
    def test_null_keys_are_absent_keys(self, read: Any, data: Any, expected: object) -> None:
        """An optional key may be absent or null: both mean unset."""
        assert read(data) == expected


def replay_added(
    recorded: al.RunResult, start: Sequence[al.Message], tools: Sequence[al.Tool]
) -> tuple[list[al.Event], al.RunResult, al.ScriptedModel]:
    """Replays the part of a recorded transcript that the run added, from the same start."""
    model = al.ScriptedModel.from_transcript(recorded.messages[len(start) :])
    events, result, _ = run(model, tools, messages=start, max_steps=4)
    return events, result, model


class TestScriptedModelFromTranscript:
    """ScriptedModel.from_transcript: running the loop again from the same starting
    messages, with tools that behave the same, reproduces the recorded transcript exactly."""

    def test_each_assistant_message_becomes_a_response_in_order(self) -> None:
        """Response id = message id without "message-" (or the whole id); toolCall when it
        holds a call, else stop; one chunk per block; from any iterable."""
        transcript: list[al.Message] = [
            user(),
            assistant("response-001", text("A."), add_call()),
            add_result(),
        ]
        model = al.ScriptedModel.from_transcript(
            iter([*transcript, al.AssistantMessage("a2", ())])
        )
        events, result, _ = run(model, [add_tool()])
        assert result.messages == (*transcript, assistant("a2"))
        assert (result.status, types_of(events).count("model.chunk")) == ("completed", 2)
        with pytest.raises(RuntimeError):  # a request after the last response has none left
            model.stream(al.ModelRequest("request-003", (), ()), threading.Event())

    def test_replay_reproduces_the_transcript_and_the_events(self) -> None:
        events, result, recorder = recorded_run()
        replayed_events, replayed, model = replay_added(
            result, [user()], [add_tool(), echo_tool()]
        )
        assert (replayed, replayed_events, model.requests) == (result, events, recorder.requests)

    def test_it_replays_thinking_and_usage_one_chunk_per_block(self) -> None:
        """One chunk per block, though the recording streamed its thinking in pieces."""
        events, recorded, _ = run(thinking_script(), [add_tool()])
        replayed_events, replayed, _ = replay_added(recorded, [user()], [add_tool()])
        assert replayed == recorded
        assert replayed.usage == al.Usage(942, 114, 4096, 0, None)
        chunks = [e.payload["chunk"] for e in replayed_events if e.type == "model.chunk"]
        assert chunks[:2] == [
            al.ThinkingDelta("request-001", "The user wants a sum; the add tool gives it."),
            al.ThinkingDelta("request-001", ""),
        ]
        assert events[1].payload["chunk"] == al.ThinkingDelta(
            "request-001", "The user wants a sum; "
        )

    def test_history_must_be_left_out_of_the_replayed_part(self) -> None:
        """Every assistant message given is replayed: pass only the part the run added."""
        history: list[al.Message] = [user("Hi.", "user-000"), assistant("response-000"), user()]
        script = [tool_turn("response-001", add_call()), stop("response-002", "42.")]
        _, recorded, _ = run(script, messages=history, tools=[add_tool()])
        _, replayed, _ = replay_added(recorded, history, [add_tool()])
        assert (recorded.status, replayed) == ("completed", recorded)
        # Passed whole, the old turn is replayed first: its message id is taken already.
        whole = al.ScriptedModel.from_transcript(recorded.messages)
        _, wrong, _ = run(whole, [add_tool()], messages=history, max_steps=8)
        assert "message-response-000" in failure_message(wrong, "MODEL_PROTOCOL_ERROR")


# A transcript cancelled during its second tool batch: two calls of it have no result.
CANCELLED: tuple[al.Message, ...] = (
    user(),
    assistant("response-001", text("Echo first."), echo_call("call-echo-001")),
    echo_result("call-echo-001"),
    assistant("response-002", call("slow", "call-slow-001", {}), echo_call("call-echo-002")),
)


class TestResumeAfterCancellation:
    """open_tool_calls and resolve_open_tool_calls let a cancelled run's transcript start a
    new run (the resumed runs themselves: test_docs_and_demo.py resumes one,
    test_agent_loop_replay.py a chain of them, with thinking too)."""

    def test_open_calls_are_in_transcript_order_across_messages(self) -> None:
        first, second, third = (echo_call(id) for id in ("call-b", "call-a", "call-c"))
        transcript: list[al.Message] = [
            user(),
            assistant("1", first, second),
            echo_result("call-b"),
        ]
        transcript.append(assistant("2", third))
        assert al.open_tool_calls(transcript) == (second, third)
        assert al.open_tool_calls(iter(transcript)) == (second, third)
        assert al.open_tool_calls([*transcript[:3], echo_result("call-a")]) == ()
        assert al.open_tool_calls([]) == ()

    def test_resolve_appends_one_error_result_per_open_call(self) -> None:
        given = list(CANCELLED)
        resolved = al.resolve_open_tool_calls(iter(given), "interrupted")
        assert given == list(CANCELLED)
        assert resolved == (
            *CANCELLED,
            al.ToolResultMessage("tool-result-call-slow-001", "call-slow-001", "slow",
                                 "interrupted", True),
            al.ToolResultMessage("tool-result-call-echo-002", "call-echo-002", "echo",
                                 "interrupted", True),
        )  # fmt: skip
        assert al.open_tool_calls(resolved) == ()
        assert al.resolve_open_tool_calls(resolved, "again") == resolved
        for content in (None, b"interrupted", 1, ["interrupted"]):
            with pytest.raises(TypeError, match="content"):
                untyped.resolve_open_tool_calls([user()], content)

    def test_an_unresolved_transcript_cannot_start_a_new_run(self) -> None:
        """Seed: "An invalid starting transcript produces one run.finished event with a
        failed INVALID_TRANSCRIPT result and never invokes the model." """
        events, result, model = run([stop("response-003", "No.")], messages=CANCELLED)
        assert_failed(events, result, "INVALID_TRANSCRIPT", "call-slow-001")
        assert model.call_count == 0
