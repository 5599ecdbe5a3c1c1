"""Tests for agent_loop, the core, part one and a half: the transcript and its checks, and
the model boundary (moved out of test_agent_loop.py, whose docstring says how the suite is
built: one ``al``, the builders and the one driver from loop_testing.py, one canonical
test per rule, the ``hostile`` mark).

Contents, in the module's order
    The transcript: TestInvalidStartingTranscript (a wrong field is named),
        TestMalformedThinkingAndUsage, TestDuplicateIdsSayHowTheyWereDerived,
        TestDerivedIdsArePublic, TestOnlyTheExactClasses
    Model boundary: TestSignalIsPublic, TestModelStreamCleanup [hostile],
        TestMalformedModelOutput [hostile]
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import tracemalloc
from typing import (
    Any,
    Callable,
    Dict,
    Generator,
    Iterator,
    Sequence,
    cast,
)

import pytest

import agent_loop as al
from loop_invariants import check_run
from loop_testing import (
    ADD_ROUND,
    HISTORY,
    FakeModel,
    Step,
    add_call,
    add_result,
    add_tool,
    assert_failed,
    assistant,
    call,
    cancelled_signal,
    chunk_event_count,
    copy_echo,
    echo_call,
    echo_tool,
    failure_message,
    no_arguments_tool,
    only_tool_result,
    recording_tools,
    respond,
    returns,
    run,
    start_run,
    stop,
    stream_step,
    text,
    tool_turn,
    turn,
    types_of,
    until,
    untyped,
    user,
)

THREE_STEPS = (
    tool_turn("response-001", add_call()),
    tool_turn("response-002", echo_call("call-echo-001")),
    stop("response-003", "The sum is 42."),
)
"""test_agent_loop.py's three-step script: an add call, an echo call, then the answer."""


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
    pytest.param([user(), 5], ["an int is not a message"], id="an-int-item"),
    pytest.param([user(), user().to_dict()],
                 ["a dict is not a message (read a dict with message_from_dict())"],
                 id="message-dict-is-pointed-at-message-from-dict"),
    pytest.param([SubclassedUserMessage("user-001", "Hi.")],
                 ["a SubclassedUserMessage is not a message"], id="message-subclass"),
    # Seed: "every call has one later matching result": a result without its call, before
    # it, for another tool or twice, and a call left without one, are invalid.
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
                 ["an assistant message: field 'id' must be a non-empty str, got None (NoneType)"],
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
        events, result, model = run(
            [stop("response-001", "The sum is 42.")], messages=messages, tools=[add_tool()]
        )
        assert_failed(events, result, "INVALID_TRANSCRIPT", *words)
        assert types_of(events) == ["run.finished"]
        assert (model.call_count, result.messages, result.steps) == (0, (), 0)

    def test_an_invalid_start_is_reported_even_when_the_signal_is_already_set(self) -> None:
        """Documented choice: the inputs decide before the signal is looked at."""
        events, result, model = run(
            [stop("response-001", "The sum is 42.")],
            messages=[user(), user()],
            signal=cancelled_signal(),
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

        events, result, model = run([stop("response-001", "The sum is 42.")], messages=endless())
        assert_failed(events, result, "INVALID_TRANSCRIPT")
        assert len(read) == al.MAX_INITIAL_MESSAGES + 1
        assert model.call_count == 0

    def test_an_empty_start_is_a_complete_transcript(self) -> None:
        """Documented choice: an empty starting transcript is complete, hence valid."""
        events, result, model = run([stop("response-001", "The sum is 42.")], messages=[])
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
    # A rejected value is quoted shortened to 160 characters, its two ends kept.
    pytest.param(al.ThinkingBlock("x" * 1000, "data", redacted=True),
                 "got thinking '" + "x" * 77 + "..." + "x" * 78 + "', signature 'data'",
                 id="long-value-quoted-in-160-characters"),
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


# The whole messages of a duplicate id, with the id in {}.
CALL_ID_TWICE = (
    "tool call id '{}' is used twice (tool-call ids must be unique across the whole transcript)"
)
MESSAGE_ID_TWICE = (
    "message id '{}' is used twice (an assistant message's id is \"message-\" + its response "
    'id, a tool result\'s is "tool-result-" + its call id: response ids and tool-call ids '
    "must be unique across the whole transcript)"
)


class TestDuplicateIdsSayHowTheyWereDerived:
    """A duplicate id error must "say how it was derived ("message-" + response id) and
    that response ids and tool-call ids must be unique across the whole transcript"; the
    step's calls never run and its message is not appended."""

    @pytest.mark.parametrize(
        ("start", "script", "ran", "kept", "message"),
        [
            pytest.param(HISTORY, [tool_turn("response-001", echo_call("call-old", "again"))],
                         [], len(HISTORY), CALL_ID_TWICE.format("call-old"),
                         id="call-id-of-the-starting-transcript"),
            pytest.param([al.UserMessage("message-r", "hi")], [stop("r", "x")], [], 1,
                         MESSAGE_ID_TWICE.format("message-r"),
                         id="message-id-of-the-starting-transcript"),
            pytest.param([al.UserMessage("tool-result-c", "hi")],
                         [tool_turn("r", echo_call("c", "x"))], [], 1,
                         "the result id of tool call 'c' (\"tool-result-\" + its id) is already "
                         "taken by another message (message ids must be unique across the "
                         "whole transcript)", id="result-id-of-the-starting-transcript"),
            pytest.param([user()], [tool_turn("response-001", echo_call("call-1", "first")),
                                    tool_turn("response-002", echo_call("call-1", "second"))],
                         ["first"], 3, CALL_ID_TWICE.format("call-1"),
                         id="call-id-of-an-earlier-step"),
            pytest.param([user()], [tool_turn("resp", echo_call("c1", "first")),
                                    stop("resp", "The sum is 42.")],
                         ["first"], 3, MESSAGE_ID_TWICE.format("message-resp"),
                         id="response-id-of-an-earlier-step"),
        ],
    )  # fmt: skip
    def test_an_id_already_in_the_transcript_fails_before_any_effect(
        self,
        start: Sequence[al.Message],
        script: list[Any],
        ran: list[str],
        kept: int,
        message: str,
    ) -> None:
        executed: list[str] = []
        _, result, model = run(script, [echo_tool(executed)], messages=start)
        assert failure_message(result, "MODEL_PROTOCOL_ERROR") == message
        assert executed == ran
        assert len(result.messages) == kept
        assert model.call_count == len(script)


class TestDerivedIdsArePublic:
    """The ids the loop derives are made by public functions, which companions call, and
    each of the two that a companion reads back has its inverse."""

    def test_a_run_derives_its_ids_with_the_public_functions(self) -> None:
        """Seed: "requestSnapshot() ... creates request-001, request-002, and so on"; the
        assistant message of response R is "message-" + R's id, the result of call C
        "tool-result-" + C's id."""
        assert (al.request_id(1), al.request_id(64)) == ("request-001", "request-064")
        assert al.assistant_message_id("response-001") == "message-response-001"
        assert al.tool_result_id("call-add-001") == "tool-result-call-add-001"
        _, result, model = run(THREE_STEPS, [add_tool(), echo_tool()], request_sequence_start=5)
        assert [request.id for request in model.requests] == [al.request_id(n) for n in (6, 7, 8)]
        responses = ["response-001", "response-002", "response-003"]  # THREE_STEPS's ids
        assert [m.id for m in result.messages if isinstance(m, al.AssistantMessage)] == [
            al.assistant_message_id(response) for response in responses
        ]
        calls = ["call-add-001", "call-echo-001"]
        assert [m.id for m in result.messages if isinstance(m, al.ToolResultMessage)] == [
            al.tool_result_id(call) for call in calls
        ]
        numbers = range(1, al.MAX_AGENT_STEPS + 1)
        assert [al.request_number(al.request_id(n)) for n in numbers] == list(numbers)

    @pytest.mark.parametrize(
        ("request_id", "number"),
        [
            ("request-001", 1),
            pytest.param("request-064", 64, id="at-limit"),
            pytest.param("request-065", None, id="over-limit"),
            ("request-000", None),
            ("request-1", None),
            ("request-0001", None),
            ("job-7", None),
            ("", None),
        ],
    )
    def test_request_number_reads_only_the_ids_a_run_makes(
        self, request_id: str, number: int | None
    ) -> None:
        assert al.request_number(request_id) == number

    @pytest.mark.parametrize(
        ("message_id", "response_id"),
        [
            ("message-response-001", "response-001"),
            ("message-message-r", "message-r"),
            ("message-", None),  # response ids are non-empty: no response makes it
            ("user-001", None),
            ("tool-result-c1", None),
        ],
    )
    def test_response_id_of_reads_only_the_ids_of_assistant_messages(
        self, message_id: str, response_id: str | None
    ) -> None:
        assert al.response_id_of(message_id) == response_id


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
        """The chunk cap (TestLimits) stops an endless stream, and the loop closes it
        however the stream behaves when closed."""
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


# Model output that the loop rejects, how many valid chunks came before the fault, and the
# words of the failure's message that tell this row from the others.
MALFORMED_OUTPUT: dict[str, tuple[Step | al.ScriptedResponse, int, str]] = {
    "stream-returns-None": (lambda m, r, s: None, 0,
                            "model.stream() must return a generator, got NoneType"),
    "stream-returns-a-list": (lambda m, r, s: [al.TextDelta(r.id, "x")], 0,
                              "model.stream() must return a generator, got list"),
    "stream-returns-an-iterator": (lambda m, r, s: iter([al.TextDelta(r.id, "x")]), 0,
                                   "model.stream() must return a generator, got list_iterator"),
    "stream-returns-a-str": (lambda m, r, s: "text", 0,
                             "model.stream() must return a generator, got str"),
    "generator-returns-None": (stream_step([text("x")], lambda r: None), 1,
                               "the model's stream returned a NoneType, not a ModelResponse "
                               "(did its generator end without `return ModelResponse(...)`?)"),
    "generator-returns-a-dict": (stream_step([text("x")], lambda r: {"id": "r"}), 1,
                                 "the model's stream returned a dict, not a ModelResponse"),
    "yields-None": (yielding(lambda r: None), 0, "the model streamed a NoneType, not a TextDelta"),
    "yields-a-str": (yielding(lambda r: "x"), 0, "the model streamed a str, not a TextDelta"),
    "yields-a-chunk-dict": (yielding(lambda r: {"type": "text", "requestId": r.id}), 0,
                            "the model streamed a dict, not a TextDelta"),
    "TextDelta-text-None": (yielding(lambda r: untyped.TextDelta(r.id, None)), 0,
                            "a text chunk's text must be a str, got NoneType"),
    "TextDelta-text-int": (yielding(lambda r: untyped.TextDelta(r.id, 5)), 0,
                           "a text chunk's text must be a str, got int"),
    "ToolCallChunk-carrying-a-TextBlock": (
        stream_step([text("a"), lambda r: untyped.ToolCallChunk(r.id, text("b"))],
                    respond("r", [text("ab")], "stop")), 1,
        "a tool-call chunk carries a TextBlock, not a ToolCall"),
    "ToolCallChunk-carrying-None": (yielding(lambda r: untyped.ToolCallChunk(r.id, None)), 0,
                                    "a tool-call chunk carries a NoneType, not a ToolCall"),
    "tool-call-id-empty": (tool_turn("r", untyped.ToolCall("", "echo", {})), 0,
                           "a tool call's id must be a non-empty str, got ''"),
    "tool-call-id-None": (tool_turn("r", untyped.ToolCall(None, "echo", {})), 0,
                          "a tool call's id must be a non-empty str, got None"),
    "tool-call-id-int": (tool_turn("r", untyped.ToolCall(7, "echo", {})), 0,
                         "a tool call's id must be a non-empty str, got 7"),
    "tool-call-name-None": (tool_turn("r", untyped.ToolCall("c", None, {})), 0,
                            "tool call 'c': name must be a non-empty str, got None"),
    "tool-call-name-empty": (tool_turn("r", untyped.ToolCall("c", "", {})), 0,
                             "tool call 'c': name must be a non-empty str, got ''"),
    "response-id-None": (answer(id=None), 1, "a response id must be a non-empty str, got None"),
    "response-id-empty": (answer(id=""), 1, "a response id must be a non-empty str, got ''"),
    "stop-reason-length": (answer(stop_reason="length"), 1, "unknown stop reason 'length'"),
    "stop-reason-None": (answer(stop_reason=None), 1, "unknown stop reason None"),
    "response-block-is-a-dict": (answer((), content=[{"type": "text", "text": "x"}]), 0,
                                 "message 'message-r': a dict is not a TextBlock"),
    "response-text-block-int": (answer((), content=[untyped.TextBlock(5)]), 0,
                                "a text block: field 'text' must be a str, got 5 (int)"),
    "response-content-a-str": (answer((), content="text"), 0,
                               "a str is not a TextBlock, ThinkingBlock or ToolCall: "
                               "wrap text in TextBlock(...)"),
    "duplicate-call-ids": (tool_turn("r", echo_call("c", "a"), echo_call("c", "b")), 2,
                           "tool call id 'c' is used twice"),
    "same-call-twice": (tool_turn("r", echo_call("c"), text("and"), echo_call("c")), 3,
                        "tool call id 'c' is used twice"),
    "tool-call-in-a-stop-response": (stop_with(echo_call("c")), 1,
                                     "a stop response holds tool calls"),
    "toolCall-response-without-a-call": (tool_turn("r", text("x")), 1,
                                         "a toolCall response holds no tool call"),
    "stream-and-response-disagree": (answer((text("abc"),), content=[text("abd")]), 1,
                                     "disagree at normalised block 0: "
                                     "streamed 'abc', terminal 'abd'"),
    "streamed-call-differs": (streamed([echo_call("c", "b")], [echo_call("c", "a")]), 1,
                              "disagree at normalised block 0: "
                              "streamed tool call 'c' to 'echo' with {'text': 'a'}, "
                              "terminal tool call 'c' to 'echo' with {'text': 'b'}"),
    "streamed-call-id-differs": (streamed([add_call()], [add_call("call-add-002")]), 1,
                                 "disagree at normalised block 0: "
                                 "streamed tool call 'call-add-002' to 'add' with "
                                 "{'left': 20, 'right': 22}, terminal tool call 'call-add-001'"),
    "order-differs": (streamed([text("Adding."), add_call()], [add_call(), text("Adding.")]), 2,
                      "disagree at normalised block 0: streamed tool call 'call-add-001' "
                      "to 'add' with {'left': 20, 'right': 22}, terminal 'Adding.'"),
    "missing-chunk": (streamed([text("Adding."), add_call()], [text("Adding.")]), 1,
                      "disagree at normalised block 1: "
                      "streamed nothing, terminal tool call 'call-add-001'"),
    "extra-chunk": (streamed([add_call()], [add_call(), text("More.")]), 2,
                    "disagree at normalised block 1: streamed 'More.', terminal nothing"),
    # A str subclass that raises from ==, len() or hash() is model output of the wrong
    # type, like any non-str: the run fails, it does not raise.
    "request-id-raising-eq": (yielding(lambda r: al.TextDelta(RaisingEq(r.id), "x")), 0,
                              "'request-001' (RaisingEq) is not the active request 'request-001'"),
    "text-raising-len": (yielding(lambda r: al.TextDelta(r.id, RaisingLen("x"))), 0,
                         "a text chunk's text must be a str, got RaisingLen"),
    "call-id-raising-hash": (tool_turn("r", al.ToolCall(RaisingHash("c"), "echo", {})), 0,
                             "a tool call's id must be a non-empty str, got 'c'"),
}  # fmt: skip


@pytest.mark.hostile
class TestMalformedModelOutput:
    """Whatever a model streams or returns, the run fails with one run.finished and
    MODEL_PROTOCOL_ERROR: it never raises, never hangs, never keeps a half-written message."""

    @pytest.mark.parametrize(
        ("step", "chunk_events", "words"), MALFORMED_OUTPUT.values(), ids=list(MALFORMED_OUTPUT)
    )
    def test_contradiction_or_excess_becomes_a_failed_model_protocol_error_result(
        self, step: Step | al.ScriptedResponse, chunk_events: int, words: str
    ) -> None:
        """Seed: "Contradiction or excess becomes a failed MODEL_PROTOCOL_ERROR result." """
        play_failing(step, chunk_events, words)

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
