"""Tests for agent_loop_otel.traced(): a run's generator, unchanged, that records the run as
OpenTelemetry spans named and attributed as the GenAI semantic conventions say.

The spans go to an in-memory exporter of opentelemetry-sdk, and every attribute is looked
up by the name that opentelemetry-semantic-conventions gives it, so a name this file
writes as a string is checked against the conventions' own. These tests run in
``tox -e otel`` (``AGENT_LOOP_REQUIRE_OTEL=1`` there turns a skip into a failure); where
OpenTelemetry is not installed only the ImportError test runs.

Contents
    TestTheSameRun: the same events and the same result, for every ending
    TestTheRunSpan: invoke_agent, its status and its error.type for every ending
    TestChatSpans: one per request, its response, its tokens, and the requests left open
    TestToolSpans: one per call, errors and refusals, calls at once, calls left open
    TestEndings: a consumer that closes the run early, a run that raises
    TestContext: the run's span is current while the run works, and only then
    TestOptions: the call-time errors, the default tracer
    TestLLMock: a run against llmock's OpenAI-compatible server
    TestTracingGuide: docs/tracing.md's OpenTelemetry blocks run
    TestImportError: without opentelemetry-api, a clear ImportError
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, Generator, List, Optional, Sequence, Tuple, cast

import pytest

import agent_loop as al
import agent_loop_durable
from loop_testing import (
    add_call,
    add_result,
    add_tool,
    call,
    echo_call,
    echo_tool,
    every_kind_of_tool,
    model_of,
    raise_error,
    settle,
    start_run,
    stop,
    stream_step,
    thought,
    tool_turn,
    until,
    user,
)

# The llmock server of the providers' tests: its fixture, started once for this module.
from test_agent_loop_providers_connection import LLMock, llmock_process  # noqa: F401

try:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
    from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
    from opentelemetry.semconv.attributes.server_attributes import SERVER_ADDRESS, SERVER_PORT

    import agent_loop_otel as otel
except ImportError:  # the default envs: only TestImportError runs
    HAS_OTEL = False
else:
    HAS_OTEL = True

REPOSITORY = Path(__file__).resolve().parent.parent
_REQUIRED = os.environ.get("AGENT_LOOP_REQUIRE_OTEL") == "1"
_BOUND = 10.0  # seconds: generous, for threads that must meet on a loaded machine


# --- The exporter, the traced runs and the spans ---------------------------------------------


class Recorded:
    """A tracer whose finished spans are kept in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("tests")

    def spans(self) -> List[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def run_span(self) -> ReadableSpan:
        (span,) = [span for span in self.spans() if span.name.startswith("invoke_agent")]
        return span

    def chat_spans(self) -> List[ReadableSpan]:
        """In the order their requests began."""
        spans = [span for span in self.spans() if span.name.startswith("chat")]
        return sorted(spans, key=lambda span: span.start_time or 0)

    def tool_spans(self) -> Dict[str, ReadableSpan]:
        """By call id."""
        return {
            attributes(span)[gen_ai.GEN_AI_TOOL_CALL_ID]: span
            for span in self.spans()
            if span.name.startswith("execute_tool")
        }

    def check_tree(self) -> None:
        """Every span ended; the others are children of the run's span, inside its times."""
        root = self.run_span()
        assert root.parent is None
        run_start, run_end = times(root)
        for span in self.spans():
            start, end = times(span)
            assert start <= end
            if span is not root:
                assert span.parent is not None
                assert span.parent.span_id == root.context.span_id
                assert run_start <= start
                assert end <= run_end


@pytest.fixture
def recorded() -> Recorded:
    if not HAS_OTEL:
        if _REQUIRED:
            pytest.fail("AGENT_LOOP_REQUIRE_OTEL=1 but OpenTelemetry is not importable")
        pytest.skip("opentelemetry-sdk is not installed: run `tox -e otel`")
    return Recorded()


def attributes(span: ReadableSpan) -> Dict[str, Any]:
    return dict(span.attributes or {})


def times(span: ReadableSpan) -> Tuple[int, int]:
    """When the span began and ended (it has ended)."""
    assert span.start_time is not None
    assert span.end_time is not None
    return span.start_time, span.end_time


def error_type(span: ReadableSpan) -> Optional[str]:
    """The span's error.type, checked to go with the status ERROR (and only with it)."""
    marked = attributes(span).get(ERROR_TYPE)
    assert (span.status.status_code == trace.StatusCode.ERROR) == (marked is not None)
    return marked


Script = List[Any]


def traced_run(
    recorded: Recorded,
    script: Script,
    tools: Sequence[al.Tool] = (),
    *,
    cancel_at: Any = None,
    max_steps: int = 4,
    messages: Optional[List[Any]] = None,
    **options: Any,
) -> Tuple[List[al.Event], al.RunResult]:
    """A run of ``script`` through traced(), settled by the driver (which checks the run's
    invariants on the events the consumer got)."""
    signal = threading.Event()
    run_options = {
        key: options.pop(key)
        for key in ("tool_concurrency", "before_tool_call", "request_sequence_start")
        if key in options
    }
    model = model_of(script)
    loop = start_run(
        model, tools, messages=messages, max_steps=max_steps, signal=signal, **run_options
    )
    return settle(
        otel.traced(loop, recorded.tracer, **options),
        model,
        max_steps=max_steps,
        signal=signal,
        cancel_at=cancel_at,
        tool_concurrency=run_options.get("tool_concurrency", 1),
        consent="before_tool_call" in run_options,
    )


def untraced_run(
    script: Script,
    tools: Sequence[al.Tool] = (),
    *,
    cancel_at: Any = None,
    max_steps: int = 4,
    messages: Optional[List[Any]] = None,
) -> Tuple[List[al.Event], al.RunResult]:
    signal = threading.Event()
    model = al.ScriptedModel(script)
    loop = start_run(model, tools, messages=messages, max_steps=max_steps, signal=signal)
    return settle(loop, model, max_steps=max_steps, signal=signal, cancel_at=cancel_at)


def two_steps() -> Script:
    return [tool_turn("response-001", add_call()), stop("response-002", "The sum is 42.")]


# Every ending of a run: its script, its tools, where the consumer cancels, max_steps and
# the starting messages (None: one user message).
ENDINGS = {
    "completed": (two_steps(), [add_tool()], None, 4, None),
    "maxSteps": (two_steps(), [add_tool()], None, 1, None),
    "cancelled": (two_steps(), [add_tool()], ("tool.started", 1), 4, None),
    # A ScriptedModel with no response left raises: MODEL_STREAM_ERROR at request-002.
    "failed": (two_steps()[:1], [add_tool()], None, 4, None),
    "invalid": ([], [], None, 4, ["not a message"]),
}


def ending_run(
    recorded: Recorded, ending: str, **options: Any
) -> Tuple[List[al.Event], al.RunResult]:
    script, tools, cancel_at, max_steps, messages = ENDINGS[ending]
    return traced_run(
        recorded,
        script,
        tools,
        cancel_at=cancel_at,
        max_steps=max_steps,
        messages=messages,
        **options,
    )


# --- The run -------------------------------------------------------------------------------


class TestTheSameRun:
    """traced() "yields the same events and returns the same result"."""

    @pytest.mark.parametrize("ending", ENDINGS)
    def test_the_same_events_and_result_as_the_run_untraced(
        self, recorded: Recorded, ending: str
    ) -> None:
        script, tools, cancel_at, max_steps, messages = ENDINGS[ending]
        events, result = ending_run(recorded, ending)
        expected_events, expected = untraced_run(
            script, tools, cancel_at=cancel_at, max_steps=max_steps, messages=messages
        )
        assert [event.to_dict() for event in events] == [e.to_dict() for e in expected_events]
        assert result.to_dict() == expected.to_dict()
        recorded.check_tree()

    def test_yield_from_gets_the_result(self, recorded: Recorded) -> None:
        def consumer() -> Generator[al.Event, None, al.RunResult]:
            loop = start_run(al.ScriptedModel(two_steps()), [add_tool()])
            result = yield from otel.traced(loop, recorded.tracer)
            return result

        events, result = al.settle_run(consumer())
        assert result.status == "completed"
        assert events[-1].payload["result"] is result


class TestTheRunSpan:
    """One invoke_agent span for the run, ended and marked by the way the run ended."""

    @pytest.mark.parametrize(
        ("ending", "status", "marked"),
        [
            ("completed", "completed", None),
            ("maxSteps", "maxSteps", None),
            ("cancelled", "cancelled", "cancelled"),
            ("failed", "failed", "MODEL_STREAM_ERROR"),
            ("invalid", "failed", "INVALID_TRANSCRIPT"),
        ],
    )
    def test_its_status_and_error_type(
        self, recorded: Recorded, ending: str, status: str, marked: Optional[str]
    ) -> None:
        _, result = ending_run(recorded, ending)
        span = recorded.run_span()
        assert span.name == "invoke_agent"
        assert span.kind == trace.SpanKind.INTERNAL
        assert attributes(span)[gen_ai.GEN_AI_OPERATION_NAME] == "invoke_agent"
        assert attributes(span)["agent_loop.run.status"] == status
        assert error_type(span) == marked
        if result.error is not None:
            assert span.status.description == result.error.message

    def test_an_agent_name_names_the_span(self, recorded: Recorded) -> None:
        traced_run(recorded, two_steps(), [add_tool()], agent_name="Adder")
        span = recorded.run_span()
        assert span.name == "invoke_agent Adder"
        assert attributes(span)[gen_ai.GEN_AI_AGENT_NAME] == "Adder"

    def test_the_runs_tokens_are_the_sum_and_absent_when_a_part_is_unknown(
        self, recorded: Recorded
    ) -> None:
        known = [
            al.scripted_response("r1", [add_call()], "toolCall", usage=al.Usage(10, 2)),
            al.scripted_response("r2", [al.TextBlock("42")], "stop", usage=al.Usage(30, 4)),
        ]
        traced_run(recorded, known, [add_tool()])
        assert attributes(recorded.run_span())[gen_ai.GEN_AI_USAGE_INPUT_TOKENS] == 40
        assert attributes(recorded.run_span())[gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS] == 6
        unknown = Recorded()
        traced_run(unknown, [known[0], stop("r2", "42")], [add_tool()])
        assert gen_ai.GEN_AI_USAGE_INPUT_TOKENS not in attributes(unknown.run_span())
        assert gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS not in attributes(unknown.run_span())


# Each request's (response id, error.type, whether a first chunk came), by how it ended.
ANSWERED = [("response-001", None, True), ("response-002", None, True)]
HISTORY = [user(), al.AssistantMessage("old", [al.TextBlock("Earlier.")])]
REQUESTS: Dict[str, Tuple[Script, Dict[str, Any], List[Any]]] = {
    # An empty answer streams nothing; its request still has a span, its response.
    "no-chunk": ([al.scripted_response("r1", [], "stop")], {}, [("r1", None, False)]),
    "failed": (two_steps()[:1], {}, [ANSWERED[0], (None, "MODEL_STREAM_ERROR", False)]),
    "cancelled-streaming": (
        [stop("r1", "Hi.")],
        {"cancel_at": ("model.chunk", 1)},
        [(None, "cancelled", True)],
    ),
    # The responses are the ones the run appended, after its starting messages.
    "after-history": ([stop("r-new", "Now.")], {"messages": HISTORY}, [("r-new", None, True)]),
    "resumed": (two_steps(), {"request_sequence_start": 5}, ANSWERED),
}


class TestChatSpans:
    """A chat span per model request, with its response where the run appended one."""

    def test_one_per_request_with_its_response(self, recorded: Recorded) -> None:
        traced_run(recorded, two_steps(), [add_tool()], request_model="gpt-4o")
        first, second = recorded.chat_spans()
        for span, response_id, reason in [
            (first, "response-001", "tool_calls"),
            (second, "response-002", "stop"),
        ]:
            assert span.name == "chat gpt-4o"
            assert span.kind == trace.SpanKind.CLIENT
            assert attributes(span)[gen_ai.GEN_AI_OPERATION_NAME] == "chat"
            assert attributes(span)[gen_ai.GEN_AI_REQUEST_STREAM] is True
            assert attributes(span)[gen_ai.GEN_AI_RESPONSE_ID] == response_id
            assert attributes(span)[gen_ai.GEN_AI_RESPONSE_FINISH_REASONS] == (reason,)
            assert attributes(span)[gen_ai.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] >= 0
            assert error_type(span) is None
        # The tool ran between the two requests.
        (tool,) = recorded.tool_spans().values()
        assert times(first)[1] <= times(tool)[0]
        assert times(tool)[1] <= times(second)[0]

    @pytest.mark.parametrize(
        ("usage", "expected"),
        [
            pytest.param(None, {}, id="unknown"),
            pytest.param(
                al.Usage(0, 0),
                {"GEN_AI_USAGE_INPUT_TOKENS": 0, "GEN_AI_USAGE_OUTPUT_TOKENS": 0},
                id="zero-is-known",
            ),
            pytest.param(
                al.Usage(output_tokens=7), {"GEN_AI_USAGE_OUTPUT_TOKENS": 7}, id="output-only"
            ),
            pytest.param(
                al.Usage(100, 20, cache_read_tokens=30, cache_write_tokens=5, reasoning_tokens=8),
                {
                    "GEN_AI_USAGE_INPUT_TOKENS": 135,  # the cached input counted in
                    "GEN_AI_USAGE_OUTPUT_TOKENS": 20,
                    "GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS": 30,
                    "GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS": 5,
                    "GEN_AI_USAGE_REASONING_OUTPUT_TOKENS": 8,
                },
                id="every-count",
            ),
        ],
    )
    def test_tokens_where_known_and_absent_where_unknown(
        self, recorded: Recorded, usage: Optional[al.Usage], expected: Dict[str, int]
    ) -> None:
        """``expected`` by the conventions package's constant names."""
        script = [al.scripted_response("r1", [al.TextBlock("Hi.")], "stop", usage=usage)]
        traced_run(recorded, script)
        (span,) = recorded.chat_spans()
        counts = {k: v for k, v in attributes(span).items() if k.startswith("gen_ai.usage.")}
        assert counts == {getattr(gen_ai, name): count for name, count in expected.items()}

    @pytest.mark.parametrize("ending", REQUESTS)
    def test_each_request_has_its_response_or_its_error(
        self, recorded: Recorded, ending: str
    ) -> None:
        script, options, expected = REQUESTS[ending]
        traced_run(recorded, script, [add_tool()], **options)
        assert [
            (
                attributes(span).get(gen_ai.GEN_AI_RESPONSE_ID),
                error_type(span),
                gen_ai.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK in attributes(span),
            )
            for span in recorded.chat_spans()
        ] == expected


class TestToolSpans:
    """An execute_tool span per call, from tool.started to tool.finished."""

    def test_its_name_and_attributes(self, recorded: Recorded) -> None:
        traced_run(recorded, two_steps(), [add_tool()])
        span = recorded.tool_spans()["call-add-001"]
        assert span.name == "execute_tool add"
        assert span.kind == trace.SpanKind.INTERNAL
        assert attributes(span) == {
            gen_ai.GEN_AI_OPERATION_NAME: "execute_tool",
            gen_ai.GEN_AI_TOOL_NAME: "add",
            gen_ai.GEN_AI_TOOL_CALL_ID: "call-add-001",
            gen_ai.GEN_AI_TOOL_TYPE: "function",
        }
        assert error_type(span) is None

    def test_an_error_result_is_a_tool_error_and_a_refusal_is_refused(
        self, recorded: Recorded
    ) -> None:
        calls = [
            call("echo", "call-echo", {"text": "hi"}),
            call("refuse", "call-tool-error", {}),
            call("boom", "call-raises", {}),
            call("missing", "call-unknown-tool", {}),
            call("echo", "call-refused", {"text": "no"}),
        ]

        def consent(tool_call: al.ToolCall, signal: al.Signal) -> Optional[str]:
            return "Not this one." if tool_call.id == "call-refused" else None

        script = [tool_turn("r1", *calls), stop("r2", "Done.")]
        traced_run(recorded, script, every_kind_of_tool(), before_tool_call=consent)
        spans = recorded.tool_spans()
        assert {call_id: error_type(span) for call_id, span in spans.items()} == {
            "call-echo": None,
            "call-tool-error": "tool_error",
            "call-raises": "tool_error",
            "call-unknown-tool": "tool_error",
            "call-refused": "refused",
        }
        recorded.check_tree()

    def test_calls_at_once_have_their_spans_open_at_once(self, recorded: Recorded) -> None:
        """Each tool waits until the other has begun: the two ran at the same time."""
        together = threading.Barrier(2, timeout=_BOUND)

        def meet(arguments: Dict[str, Any], signal: al.Signal) -> object:
            together.wait()
            return arguments["text"]

        tool = al.Tool("meet", "Meets.", {"type": "object"}, meet)
        calls = [call("meet", "call-1", {"text": "a"}), call("meet", "call-2", {"text": "b"})]
        script = [tool_turn("r1", *calls), stop("r2", "Both.")]
        _, result = traced_run(recorded, script, [tool], tool_concurrency=2)
        assert result.status == "completed"
        first, second = recorded.tool_spans()["call-1"], recorded.tool_spans()["call-2"]
        assert times(first)[0] < times(second)[1]
        assert times(second)[0] < times(first)[1]
        assert error_type(first) is None
        assert error_type(second) is None
        recorded.check_tree()

    def test_a_call_whose_result_came_after_the_signal_ends_with_the_run(
        self, recorded: Recorded
    ) -> None:
        """The tool sets the signal: its result is discarded, and no tool.finished comes;
        its span ends with the run, marked cancelled. The next call never starts."""
        signal = threading.Event()

        def cancel(arguments: Dict[str, Any], signal_: al.Signal) -> object:
            signal.set()
            return "too late"

        tools = [al.Tool("cancel", "Cancels.", {"type": "object"}, cancel), echo_tool()]
        script = [
            tool_turn("r1", call("cancel", "call-1", {}), echo_call("call-2")),
            stop("r", ""),
        ]
        model = al.ScriptedModel(script)
        loop = start_run(model, tools, signal=signal)
        events, result = settle(otel.traced(loop, recorded.tracer), model, signal=signal)
        assert result.status == "cancelled"
        assert list(recorded.tool_spans()) == ["call-1"]
        assert error_type(recorded.tool_spans()["call-1"]) == "cancelled"
        recorded.check_tree()
        assert "tool.finished" not in [event.type for event in events]

    def test_a_group_cancelled_while_its_tools_run(self, recorded: Recorded) -> None:
        """Two calls at once, the signal set while both run: their spans end with the run."""
        signal = threading.Event()
        started = threading.Barrier(3, timeout=_BOUND)

        def wait(arguments: Dict[str, Any], signal_: al.Signal) -> object:
            started.wait()
            signal_.wait(_BOUND)
            return "late"

        tool = al.Tool("wait", "Waits.", {"type": "object"}, wait)
        script = [tool_turn("r1", call("wait", "call-1", {}), call("wait", "call-2", {}))]
        model = al.ScriptedModel(script)
        loop = otel.traced(
            start_run(model, [tool], signal=signal, tool_concurrency=2), recorded.tracer
        )
        until(loop, "tool.started", 2)  # both calls scheduled

        def cancel_once_both_run() -> None:
            started.wait()
            signal.set()

        canceller = threading.Thread(target=cancel_once_both_run)
        canceller.start()
        try:
            _, result = al.settle_run(loop)
        finally:
            canceller.join(_BOUND)
        assert result.status == "cancelled"
        spans = recorded.tool_spans()
        assert sorted(spans) == ["call-1", "call-2"]
        assert [error_type(span) for span in spans.values()] == ["cancelled", "cancelled"]
        recorded.check_tree()

    def test_a_log_no_loop_yields_is_refused_and_its_spans_end(self, recorded: Recorded) -> None:
        """The run is read through RunSteps: a tool.finished with no tool.started is its
        ValueError, raised to the consumer as the run's own error would be."""
        finished = al.Event(
            0,
            "tool.finished",
            {"request_id": "request-001", "tool_call": add_call(), "tool_result": add_result()},
        )

        def events() -> Generator[al.Event, None, al.RunResult]:
            yield finished
            return al.RunResult("completed", (), 0, final_text="")

        with pytest.raises(ValueError, match="finished without starting"):
            list(otel.traced(events(), recorded.tracer))
        assert error_type(recorded.run_span()) == "ValueError"
        assert recorded.tool_spans() == {}


class TestDurableRuns:
    """A durable run is traced as any run; given again from its journal, its spans again."""

    def test_a_finished_journal_gives_the_same_spans_again(
        self, recorded: Recorded, tmp_path: Path
    ) -> None:
        def run() -> Generator[al.Event, None, al.RunResult]:
            return agent_loop_durable.durable_run(
                tmp_path / "run.jsonl",
                messages=[user()],
                model=al.ScriptedModel(two_steps()),
                tools=al.ToolRegistry([add_tool()]),
                max_steps=4,
            )

        first, result = settle(otel.traced(run(), recorded.tracer))
        again = Recorded()
        events, given_again = settle(otel.traced(run(), again.tracer))
        assert [event.to_dict() for event in events] == [event.to_dict() for event in first]
        assert given_again == result
        for spans in (recorded, again):
            spans.check_tree()
            ids = [attributes(span)[gen_ai.GEN_AI_RESPONSE_ID] for span in spans.chat_spans()]
            assert ids == ["response-001", "response-002"]
            assert list(spans.tool_spans()) == ["call-add-001"]


class TestEndings:
    """Every span ends, whatever way the run ends."""

    def test_a_consumer_that_closes_mid_run(self, recorded: Recorded) -> None:
        model = al.ScriptedModel(two_steps())
        loop = start_run(model, [add_tool()])
        run = otel.traced(loop, recorded.tracer)
        while next(run).type != "tool.started":
            pass
        assert recorded.spans() == []  # all open
        run.close()
        assert loop.gi_frame is None  # the run itself was closed
        recorded.check_tree()
        assert error_type(recorded.run_span()) == "closed"
        assert "agent_loop.run.status" not in attributes(recorded.run_span())
        assert error_type(recorded.tool_spans()["call-add-001"]) == "closed"
        # The request's response is in no transcript the wrapper saw: unknown.
        (chat,) = recorded.chat_spans()
        assert error_type(chat) == "closed"
        assert gen_ai.GEN_AI_RESPONSE_ID not in attributes(chat)

    def test_a_consumer_that_closes_before_the_first_event(self, recorded: Recorded) -> None:
        run = otel.traced(start_run(al.ScriptedModel(two_steps())), recorded.tracer)
        run.close()
        assert recorded.spans() == []  # the run never began

    def test_a_consumer_that_closes_once_it_has_the_result(self, recorded: Recorded) -> None:
        """run.finished carries the result: the run is not marked closed."""
        run = otel.traced(start_run(al.ScriptedModel(two_steps()), [add_tool()]), recorded.tracer)
        for event in run:
            if event.type == "run.finished":
                break
        run.close()
        assert error_type(recorded.run_span()) is None
        assert attributes(recorded.run_span())["agent_loop.run.status"] == "completed"
        assert len(recorded.chat_spans()) == 2

    def test_a_run_whose_closing_raises(self, recorded: Recorded) -> None:
        """Closed mid-run, the run raises as it ends (its journal cannot be closed, say):
        that goes on to the consumer, and the spans end all the same."""

        def events() -> Generator[al.Event, None, al.RunResult]:
            loop = start_run(al.ScriptedModel(two_steps()), [add_tool()])
            try:
                yield next(loop)
                yield next(loop)
            finally:
                loop.close()
                raise OSError("the journal cannot be closed")

        run = otel.traced(events(), recorded.tracer)
        next(run)
        with pytest.raises(OSError, match="cannot be closed"):
            run.close()
        assert error_type(recorded.run_span()) == "closed"
        recorded.check_tree()

    def test_a_run_that_raises(self, recorded: Recorded) -> None:
        """What the run raises goes on to the consumer, recorded on the run's span."""

        class Broken(Exception):
            pass

        def events() -> Generator[al.Event, None, al.RunResult]:
            loop = start_run(al.ScriptedModel(two_steps()), [add_tool()])
            yield next(loop)
            yield next(loop)
            raise Broken("the journal is gone")

        run = otel.traced(events(), recorded.tracer)
        with pytest.raises(Broken):
            list(run)
        span = recorded.run_span()
        assert error_type(span) == "TestEndings.test_a_run_that_raises.<locals>.Broken"
        assert [event.name for event in span.events] == ["exception"]
        assert dict(span.events[0].attributes or {})["exception.message"] == "the journal is gone"
        (chat,) = recorded.chat_spans()  # its first chunk came
        assert error_type(chat) == attributes(span)[ERROR_TYPE]
        recorded.check_tree()


class TestContext:
    """While the run's generator works, the run's span is the current span, and the span
    of the call whose tool runs then; a run traced inside a tool is that call's child."""

    def test_a_span_a_tool_starts_is_a_child_of_its_call(self, recorded: Recorded) -> None:
        def traced_tool(arguments: Dict[str, Any], signal: al.Signal) -> object:
            with recorded.tracer.start_as_current_span("inside the tool"):
                return "done"

        tool = al.Tool("inside", "Starts a span.", {"type": "object"}, traced_tool)
        script = [tool_turn("r1", call("inside", "call-1", {})), stop("r2", "Done.")]
        traced_run(recorded, script, [tool])
        (inner,) = [span for span in recorded.spans() if span.name == "inside the tool"]
        assert inner.parent is not None
        assert inner.parent.span_id == recorded.tool_spans()["call-1"].context.span_id

    @pytest.mark.parametrize("concurrency", [1, 2], ids=["sequential", "at-once"])
    def test_a_run_traced_inside_a_tool_nests_under_its_execute_tool_span(
        self, recorded: Recorded, concurrency: int
    ) -> None:
        inner = Recorded()
        current: Dict[str, int] = {}

        def agent(arguments: Dict[str, Any], signal: al.Signal) -> object:
            tool_call = al.current_tool_call()
            assert tool_call is not None
            current[tool_call.id] = trace.get_current_span().get_span_context().span_id
            run = start_run(al.ScriptedModel([stop("inner", "Done inside.")]))
            _, result = al.settle_run(otel.traced(run, inner.tracer, agent_name=tool_call.id))
            return result.final_text

        tool = al.Tool("agent", "Runs an agent.", {"type": "object"}, agent)
        calls = [call("agent", "call-1", {}), call("agent", "call-2", {})]
        script = [tool_turn("r1", *calls), stop("r2", "Both.")]
        traced_run(recorded, script, [tool], tool_concurrency=concurrency)
        recorded.check_tree()
        runs = {span.name: span for span in inner.spans() if span.name.startswith("invoke")}
        for call_id, span in recorded.tool_spans().items():
            parent = runs[f"invoke_agent {call_id}"].parent
            assert parent is not None
            assert parent.span_id == span.context.span_id
            # In the consumer's thread or a worker, the call's span is current in its tool.
            assert current[call_id] == span.context.span_id

    def test_between_events_the_consumers_context_is_its_own(self, recorded: Recorded) -> None:
        run = otel.traced(start_run(al.ScriptedModel(two_steps()), [add_tool()]), recorded.tracer)
        for _ in run:
            assert trace.get_current_span() is trace.INVALID_SPAN


class Described(SimpleNamespace):
    """A model object's public attributes, as traced() reads them."""


class Unfinished(Exception):
    """As a ProviderError is: its finish_reason says why the stream ended unfinished."""

    def __init__(self, finish_reason: object) -> None:
        super().__init__(f"the stream ended unfinished: {finish_reason!r}")
        self.finish_reason = finish_reason


def failing(error: BaseException) -> Any:
    """A step whose stream gives one chunk, then raises ``error``."""
    return stream_step([al.TextBlock("The")], raise_error(error))


def provider_step(provider_response_id: Optional[str]) -> Any:
    """A step whose response carries the provider's own id of the answer."""
    blocks = [al.TextBlock("Hi.")]
    response = al.ModelResponse(
        "r1", "request-001", blocks, "stop", provider_response_id=provider_response_id
    )
    return stream_step(blocks, lambda request: response)


class TestWhatTheSpansSay:
    """The provider, the model, the server, the response id and the finish reasons."""

    @pytest.mark.parametrize(
        ("model", "given", "expected"),
        [
            pytest.param(None, {}, {}, id="nothing-known"),
            pytest.param(
                Described(provider_name="openai", model="gpt-4o", base_url="https://a.example/v1"),
                {},
                {"provider": "openai", "model": "gpt-4o", "address": "a.example", "port": 443},
                id="read-from-the-model",
            ),
            pytest.param(
                Described(provider_name="openai", model="gpt-4o"),
                {"provider_name": "azure.ai.openai", "request_model": "mine"},
                {"provider": "azure.ai.openai", "model": "mine"},
                id="the-arguments-win",
            ),
            pytest.param(None, {"provider_name": "p"}, {"provider": "p"}, id="argument-alone"),
            pytest.param(
                Described(base_url="http://127.0.0.1:8080/v1"),
                {},
                {"address": "127.0.0.1", "port": 8080},
                id="a-port",
            ),
            pytest.param(
                Described(base_url="http://[::1]/v1"),
                {},
                {"address": "::1", "port": 80},
                id="ipv6-default-port",
            ),
            pytest.param(
                Described(base_url="ftp://a.example"), {}, {"address": "a.example"}, id="no-port"
            ),
            pytest.param(Described(base_url="unix:///s"), {}, {}, id="no-host"),
            pytest.param(Described(base_url="http://a:b/v1"), {}, {}, id="port-not-a-number"),
            pytest.param(Described(base_url="http://[::1/v1"), {}, {}, id="not-a-url"),
            pytest.param(
                Described(provider_name=1, model=None, base_url=b"http://a"),
                {},
                {},
                id="attributes-not-str",
            ),
        ],
    )
    def test_provider_model_and_server_from_the_model_object(
        self,
        recorded: Recorded,
        model: object,
        given: Dict[str, Any],
        expected: Dict[str, object],
    ) -> None:
        traced_run(recorded, two_steps(), [add_tool()], model=model, **given)
        names = {
            "provider": gen_ai.GEN_AI_PROVIDER_NAME,
            "model": gen_ai.GEN_AI_REQUEST_MODEL,
            "address": SERVER_ADDRESS,
            "port": SERVER_PORT,
        }
        wanted = {names[key]: value for key, value in expected.items()}
        for span in recorded.chat_spans():
            assert {k: v for k, v in attributes(span).items() if k in names.values()} == wanted
        on_run = {k: v for k, v in attributes(recorded.run_span()).items() if k in names.values()}
        assert on_run == {k: v for k, v in wanted.items() if k.startswith("gen_ai.")}
        expected_name = "chat" if "model" not in expected else f"chat {expected['model']}"
        assert {span.name for span in recorded.chat_spans()} == {expected_name}

    @pytest.mark.parametrize(
        ("script", "reasons"),
        [
            pytest.param([stop("r1", "Hi.")], [("stop",)], id="text"),
            pytest.param(two_steps(), [("tool_calls",), ("stop",)], id="tool-calls"),
            pytest.param([failing(RuntimeError("reset"))], [("error",)], id="failed"),
            pytest.param([failing(Unfinished("length"))], [("length",)], id="length"),
            pytest.param([failing(Unfinished("max_tokens"))], [("length",)], id="max-tokens"),
            pytest.param(
                [failing(Unfinished("content_filter"))], [("content_filter",)], id="filtered"
            ),
            pytest.param([failing(Unfinished("refusal"))], [("content_filter",)], id="refusal"),
            pytest.param([failing(Unfinished("pause_turn"))], [("error",)], id="other-reason"),
            pytest.param([failing(Unfinished(7))], [("error",)], id="reason-not-str"),
        ],
    )
    def test_the_conventions_finish_reasons(
        self, recorded: Recorded, script: Script, reasons: List[Tuple[str, ...]]
    ) -> None:
        traced_run(recorded, script, [add_tool()])
        chats = recorded.chat_spans()
        assert [attributes(span)[gen_ai.GEN_AI_RESPONSE_FINISH_REASONS] for span in chats] == (
            reasons
        )

    @pytest.mark.parametrize(
        ("provider_response_id", "expected"),
        [
            pytest.param("chatcmpl-9", "chatcmpl-9", id="the-providers"),
            pytest.param(None, "r1", id="else-the-responses-own"),
        ],
    )
    def test_the_response_id_is_the_providers_own(
        self, recorded: Recorded, provider_response_id: Optional[str], expected: str
    ) -> None:
        traced_run(recorded, [provider_step(provider_response_id)])
        (chat,) = recorded.chat_spans()
        assert attributes(chat)[gen_ai.GEN_AI_RESPONSE_ID] == expected


# The attributes that hold message content: present only when the user opts in.
CONTENT = (
    "GEN_AI_INPUT_MESSAGES",
    "GEN_AI_OUTPUT_MESSAGES",
    "GEN_AI_TOOL_CALL_ARGUMENTS",
    "GEN_AI_TOOL_CALL_RESULT",
)


class TestContent:
    """Message content only when the user opts in: the argument, else the variable."""

    @pytest.mark.parametrize(
        ("argument", "setting", "captured"),
        [
            pytest.param(None, None, False, id="by-default-never"),
            pytest.param(None, "true", True, id="true"),
            pytest.param(None, " TRUE ", True, id="any-case"),
            pytest.param(None, "span_only", True, id="span-only"),
            pytest.param(None, "SPAN_AND_EVENT", True, id="span-and-event"),
            pytest.param(None, "false", False, id="false"),
            pytest.param(None, "NO_CONTENT", False, id="no-content"),
            pytest.param(None, "EVENT_ONLY", False, id="events-only-is-not-spans"),
            pytest.param(None, "1", False, id="not-a-value-of-the-variable"),
            pytest.param(True, None, True, id="the-argument"),
            pytest.param(False, "true", False, id="the-argument-wins-off"),
            pytest.param(True, "false", True, id="the-argument-wins-on"),
        ],
    )
    def test_content_only_when_the_user_opts_in(
        self,
        recorded: Recorded,
        monkeypatch: pytest.MonkeyPatch,
        argument: Optional[bool],
        setting: Optional[str],
        captured: bool,
    ) -> None:
        variable = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
        if setting is None:
            monkeypatch.delenv(variable, raising=False)
        else:
            monkeypatch.setenv(variable, setting)
        traced_run(recorded, two_steps(), [add_tool()], capture_content=argument)
        names = {getattr(gen_ai, name) for name in CONTENT}
        found = {name for span in recorded.spans() for name in attributes(span) if name in names}
        assert found == (names if captured else set())

    def test_what_the_content_is(self, recorded: Recorded) -> None:
        """The conventions' messages: parts by type, the failed request's input too."""
        first = al.scripted_response(
            "r1", [thought("Add them."), add_call(), call("missing", "call-2", {})], "toolCall"
        )
        script = [first, failing(RuntimeError("reset"))]
        traced_run(recorded, script, [add_tool()], capture_content=True)
        asked = {"role": "user", "parts": [{"type": "text", "content": "Add 20 and 22."}]}
        answer = {
            "role": "assistant",
            "parts": [
                {"type": "reasoning", "content": "Add them."},
                {"type": "tool_call", "id": "call-add-001", "name": "add", **ADD_ARGUMENTS},
                {"type": "tool_call", "id": "call-2", "name": "missing", "arguments": {}},
            ],
        }
        results = [
            {"role": "tool", "parts": [{"type": "tool_call_response", "id": call_id, **part}]}
            for call_id, part in [
                ("call-add-001", {"response": '{"sum":42}'}),
                ("call-2", {"response": "unknown tool 'missing' (available: add)"}),
            ]
        ]
        first_chat, second_chat = [attributes(span) for span in recorded.chat_spans()]
        assert json.loads(first_chat[gen_ai.GEN_AI_INPUT_MESSAGES]) == [asked]
        output = json.loads(first_chat[gen_ai.GEN_AI_OUTPUT_MESSAGES])
        assert output == [{**answer, "finish_reason": "tool_call"}]
        # The request that failed was sent the whole transcript, and answered nothing.
        assert json.loads(second_chat[gen_ai.GEN_AI_INPUT_MESSAGES]) == [asked, answer, *results]
        assert gen_ai.GEN_AI_OUTPUT_MESSAGES not in second_chat
        tools = {key: attributes(span) for key, span in recorded.tool_spans().items()}
        assert (
            json.loads(tools["call-add-001"][gen_ai.GEN_AI_TOOL_CALL_ARGUMENTS])
            == (ADD_ARGUMENTS["arguments"])
        )
        assert tools["call-add-001"][gen_ai.GEN_AI_TOOL_CALL_RESULT] == '{"sum":42}'
        assert gen_ai.GEN_AI_TOOL_CALL_RESULT not in tools["call-2"]  # an error result


ADD_ARGUMENTS: Dict[str, Any] = {"arguments": dict(add_call().plain_arguments())}


class TestProgressAndTimes:
    """A tool.progress is a span event of its call's span; the spans take the events' times."""

    @pytest.mark.parametrize("concurrency", [1, 2], ids=["sequential", "at-once"])
    @pytest.mark.parametrize("capture", [False, True], ids=["no-content", "content"])
    def test_a_progress_is_an_event_of_its_calls_span(
        self, recorded: Recorded, concurrency: int, capture: bool
    ) -> None:
        def counting(arguments: Dict[str, Any], signal: al.Signal) -> Any:
            yield {"done": 1}
            yield {"done": 2}
            return "counted"

        tool = al.Tool("count", "Counts.", {"type": "object"}, counting)
        calls = [call("count", "call-1", {}), call("count", "call-2", {})]
        script = [tool_turn("r1", *calls), stop("r2", "Counted.")]
        events, _ = traced_run(
            recorded, script, [tool], tool_concurrency=concurrency, capture_content=capture
        )
        for call_id, span in recorded.tool_spans().items():
            progress = [
                event
                for event in events
                if event.type == "tool.progress" and event.payload["tool_call_id"] == call_id
            ]
            assert [event.name for event in span.events] == ["tool.progress"] * 2
            stamps = [event.timestamp for event in span.events]  # taken as each was yielded
            assert len(progress) == 2
            assert cast(int, span.start_time) <= stamps[0] <= stamps[1] <= cast(int, span.end_time)
            values = [dict(event.attributes or {}) for event in span.events]
            expected = [{"agent_loop.tool.progress": f'{{"done":{n}}}'} for n in (1, 2)]
            assert values == (expected if capture else [{}, {}])

    def test_a_calls_span_ends_when_its_tool_returned(self, recorded: Recorded) -> None:
        """Calls at once: each span ends when its own tool returned (its tool.finished's time),
        not when its turn to be reported came."""
        events, _ = traced_run(recorded, *ADD_TWICE, tool_concurrency=2)
        spans = recorded.tool_spans()
        for event in events:
            if event.type == "tool.finished":
                span = spans[event.payload["tool_call"].id]
                assert cast(int, span.start_time) <= cast(int, span.end_time) == nanoseconds(event)

    def test_a_chat_span_begins_when_the_consumer_resumed_the_run(
        self, recorded: Recorded
    ) -> None:
        """Not before: the consumer's time between two events is not the request's."""
        run = otel.traced(start_run(al.ScriptedModel(two_steps()), [add_tool()]), recorded.tracer)
        resumed: Dict[str, int] = {}  # by request id: the next() that gave its first chunk
        for _ in range(64):
            asked = time.time_ns()
            event = next(run, None)
            if event is None:
                break
            if event.type == "model.chunk":
                resumed.setdefault(event.payload["request_id"], asked)
        chats = recorded.chat_spans()
        assert [times(chat)[0] >= at for chat, at in zip(chats, resumed.values())] == [True] * 2


ADD_TWICE: Tuple[Script, List[al.Tool]] = (
    [tool_turn("r1", add_call("call-1"), add_call("call-2")), stop("r2", "Twice.")],
    [add_tool()],
)


def nanoseconds(event: al.Event) -> int:
    """The event's time, as a span's."""
    assert event.time is not None
    return int(event.time * 1e9)


class TestOptions:
    """Call-time errors name the parameter; the default tracer is the global provider's."""

    @pytest.mark.parametrize(
        ("arguments", "message"),
        [
            ({"run": [1]}, "run must be a run's generator"),
            ({"tracer": "tracer"}, "tracer must be None or an opentelemetry.trace.Tracer"),
            ({"agent_name": 1}, "agent_name must be None or a str, got int"),
            ({"request_model": b"m"}, "request_model must be None or a str, got bytes"),
            ({"provider_name": 1.0}, "provider_name must be None or a str, got float"),
            ({"model": "gpt-4o"}, "model must be the run's model object"),
            ({"capture_content": "yes"}, "capture_content must be None or a bool, got str"),
        ],
    )
    def test_a_wrong_argument_is_a_type_error(
        self, recorded: Recorded, arguments: Dict[str, Any], message: str
    ) -> None:
        loop = start_run(al.ScriptedModel(two_steps()))
        arguments.setdefault("run", loop)
        with pytest.raises(TypeError, match=re.escape(message)):
            otel.traced(**arguments)
        loop.close()

    def test_the_default_tracer(self, recorded: Recorded, monkeypatch: pytest.MonkeyPatch) -> None:
        """The global provider's tracer, named after the module, at the first event."""
        named: List[Tuple[str, Optional[str]]] = []

        def get_tracer(name: str, version: Optional[str] = None) -> trace.Tracer:
            named.append((name, version))
            return recorded.tracer

        monkeypatch.setattr(trace, "get_tracer", get_tracer)
        _, result = al.settle_run(
            otel.traced(start_run(al.ScriptedModel(two_steps()), [add_tool()]))
        )
        assert result.status == "completed"
        assert named == [("agent_loop_otel", otel.__version__)]
        assert len(recorded.chat_spans()) == 2


# --- Against a server --------------------------------------------------------------------


@pytest.fixture
def server(request: pytest.FixtureRequest) -> LLMock:
    """The providers' tests' llmock (skipped where llmock is not installed), reset."""
    process: LLMock = request.getfixturevalue("llmock_process")
    process.admin("POST", "/_llmock/reset", {})
    return process


@pytest.mark.llmock
class TestLLMock:
    """A run of OpenAIChatModel against llmock 0.2.2, traced."""

    def test_a_tool_round_trip(self, recorded: Recorded, server: LLMock) -> None:
        server.scenario(
            {
                "type": "reply",
                "text": "Adding.",
                "tool_calls": [{"name": "add", "arguments": {"left": 20, "right": 22}}],
            },
            {"type": "reply", "text": "The sum is 42."},
        )
        model = server.openai()
        loop = al.run_agent_loop(
            messages=[user()], model=model, tools=al.ToolRegistry([add_tool()]), max_steps=4
        )
        # The model object says its provider, its name and its server.
        run = otel.traced(loop, recorded.tracer, model=model)
        _, result = settle(run)
        assert result.status == "completed", result.error
        recorded.check_tree()
        responses = [m for m in result.messages if isinstance(m, al.AssistantMessage)]
        chats = recorded.chat_spans()
        assert [span.name for span in chats] == ["chat gpt-4o", "chat gpt-4o"]
        port = int(server.url.rsplit(":", 1)[1])
        for span, response in zip(chats, responses):
            assert attributes(span)[gen_ai.GEN_AI_PROVIDER_NAME] == "openai"
            assert attributes(span)[SERVER_ADDRESS] == "127.0.0.1"
            assert attributes(span)[SERVER_PORT] == port
            # The provider's own id of each answer, as llmock sent it.
            assert response.provider_response_id is not None
            assert response.provider_response_id.startswith("chatcmpl-")
            assert attributes(span)[gen_ai.GEN_AI_RESPONSE_ID] == response.provider_response_id
            assert response.usage is not None
            assert response.usage.input_tokens is not None
            tokens = attributes(span)[gen_ai.GEN_AI_USAGE_INPUT_TOKENS]
            assert tokens == response.usage.input_tokens + (response.usage.cache_read_tokens or 0)
            output_tokens = attributes(span)[gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS]
            assert output_tokens == response.usage.output_tokens
        assert [attributes(s)[gen_ai.GEN_AI_RESPONSE_FINISH_REASONS] for s in chats] == [
            ("tool_calls",),
            ("stop",),
        ]
        (tool,) = recorded.tool_spans().values()
        assert attributes(tool)[gen_ai.GEN_AI_TOOL_NAME] == "add"

    def test_a_server_error_marks_the_request_and_the_run(
        self, recorded: Recorded, server: LLMock
    ) -> None:
        server.scenario({"type": "fail", "status": 500})
        loop = al.run_agent_loop(
            messages=[user()], model=server.openai(), tools=al.ToolRegistry(), max_steps=4
        )
        _, result = settle(otel.traced(loop, recorded.tracer, request_model="gpt-4o"))
        assert result.status == "failed"
        (chat,) = recorded.chat_spans()
        assert error_type(chat) == error_type(recorded.run_span()) == "MODEL_STREAM_ERROR"
        recorded.check_tree()


# --- The guide and the missing package ---------------------------------------------------


def otel_blocks() -> List[str]:
    """docs/tracing.md's blocks that need OpenTelemetry, fenced ```python otel (GitHub
    shows them as Python; the docs test, which runs ```python blocks, leaves them here)."""
    text = (REPOSITORY / "docs" / "tracing.md").read_text(encoding="utf-8")
    return re.findall(r"^```python otel\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)


class TestTracingGuide:
    def test_its_opentelemetry_blocks_run_and_their_assertions_hold(
        self, recorded: Recorded
    ) -> None:
        blocks = otel_blocks()
        assert len(blocks) >= 1
        namespace: Dict[str, Any] = {}
        for number, block in enumerate(blocks, start=1):
            exec(compile(block, f"tracing.md otel block {number}", "exec"), namespace)

    def test_its_opentelemetry_blocks_pass_mypy_strict(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Run by `tox -e type`, which has mypy and OpenTelemetry; skipped elsewhere."""
        mypy = pytest.importorskip("mypy.api")
        if not HAS_OTEL:
            pytest.skip("OpenTelemetry is not installed")
        files = []
        for index, block in enumerate(otel_blocks(), 1):
            path = tmp_path / f"tracing_block_{index}.py"
            path.write_text(block, encoding="utf-8")
            files.append(str(path))
        monkeypatch.setenv("MYPYPATH", str(REPOSITORY))
        report, errors, status = mypy.run(["--strict", "--no-incremental", *files])
        assert status == 0, report + errors


class TestImportError:
    def test_without_opentelemetry_api_the_error_names_the_package(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The module is loaded again, under another name, with OpenTelemetry unimportable."""
        for name in ("opentelemetry", "opentelemetry.trace", "opentelemetry.context"):
            monkeypatch.setitem(sys.modules, name, None)
        spec = importlib.util.spec_from_file_location(
            "agent_loop_otel_without_opentelemetry", REPOSITORY / "agent_loop_otel.py"
        )
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        with pytest.raises(ImportError, match=re.escape("pip install opentelemetry-api")):
            spec.loader.exec_module(module)
