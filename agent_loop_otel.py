# agent_loop_otel.py 1.0.0: OpenTelemetry spans of agent_loop.py's runs, by the GenAI conventions.
# Needs opentelemetry-api; copy it next to agent_loop.py. Home: the agent_loop repository.
"""Record a run of the Agent Loop as OpenTelemetry spans, named and attributed as the GenAI
semantic conventions say.

``traced(run)`` wraps a run's generator (``run_agent_loop()`` or ``durable_run()``): it
yields the same events and returns the same result, and it records, with the tracer given
(by default the global tracer provider's):

- one ``invoke_agent`` span for the run (``invoke_agent {agent_name}`` when an agent name
  is given), from the first event asked for to the end of the run;
- one ``chat`` span per model request (``chat {request_model}`` when a model name is
  given), from the moment the loop was asked for the event that turned out to be the
  request's first chunk, to the first event after its last chunk;
- one ``execute_tool {tool name}`` span per tool call, from its ``tool.started`` to its
  ``tool.finished``; calls run at once have their spans open at once.

The chat and tool spans are children of the run's span, and while the run's generator is
resumed the run's span is the current span, so a span that the model or a tool starts in
the consumer's thread is its child. Every span ends whatever way the run ends: completed,
``maxSteps``, cancelled, failed, closed by its consumer, or raising.

Rules:

- A chat span is recorded when the run ends, with the times its request began and ended:
  its response id, finish reason and token counts are read from the run's final
  transcript (the events do not carry them), so they are absent when the run was closed
  before its end. Each response the run appended is its request's, in order. The finish
  reason is the seed's stop reason (``stop`` or ``toolCall``).
- Token counts are absent when unknown, never 0: ``gen_ai.usage.input_tokens`` counts the
  cached input too (as the conventions ask; ``Usage.input_tokens`` leaves it out) and is
  present when ``Usage.input_tokens`` is known; the others are ``Usage``'s fields.
- ``error.type`` (and the span status ``ERROR``) marks a span that ended in an error.
  The values, as the conventions ask an instrumentation to list them: on a tool call,
  ``tool_error`` for an error result and ``refused`` for a call that ``before_tool_call``
  refused (its ``tool.finished`` says ``refused``); on a span that the run's end found
  open, and on the run's span, the run's failure code (``MODEL_STREAM_ERROR``...) when
  it failed, ``cancelled`` when it was cancelled, ``closed`` when its consumer closed it,
  and the exception's class name when the run raised (the exception is recorded on the
  run's span). A request whose response never joined the transcript was open at the end.
- A group of tool calls at once yields its ``tool.finished`` events in the assistant's
  order, so a call's span ends when its result is handed on, not when its tool returned.

It uses only agent_loop's public names, and the attribute names are written here as
strings, so that only opentelemetry-api is needed.
"""

from __future__ import annotations

import collections.abc
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Final, Generator, List, Optional, Tuple

import agent_loop as al

if TYPE_CHECKING:
    from contextvars import Token

try:
    from opentelemetry import context, trace
except ImportError as missing:  # only this companion needs OpenTelemetry
    raise ImportError(
        "agent_loop_otel.py needs the OpenTelemetry API: pip install opentelemetry-api"
    ) from missing

__version__: Final = "1.0.0"

__all__ = ["traced"]

# The names of the GenAI semantic conventions (opentelemetry-semantic-conventions calls
# them GEN_AI_*; error.type is a stable attribute), as strings: no dependency for them.
OPERATION_NAME: Final = "gen_ai.operation.name"
PROVIDER_NAME: Final = "gen_ai.provider.name"
AGENT_NAME: Final = "gen_ai.agent.name"
REQUEST_MODEL: Final = "gen_ai.request.model"
REQUEST_STREAM: Final = "gen_ai.request.stream"
RESPONSE_ID: Final = "gen_ai.response.id"
RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
RESPONSE_TIME_TO_FIRST_CHUNK: Final = "gen_ai.response.time_to_first_chunk"
USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
USAGE_CACHE_READ_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
USAGE_CACHE_CREATION_INPUT_TOKENS: Final = "gen_ai.usage.cache_creation.input_tokens"
USAGE_REASONING_OUTPUT_TOKENS: Final = "gen_ai.usage.reasoning.output_tokens"
TOOL_NAME: Final = "gen_ai.tool.name"
TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
TOOL_TYPE: Final = "gen_ai.tool.type"
ERROR_TYPE: Final = "error.type"
# Not a convention's: the run's status, which no GenAI attribute holds.
RUN_STATUS: Final = "agent_loop.run.status"

# The error.type values of this file (the run's failure codes are the others).
TOOL_ERROR: Final = "tool_error"  # a call's result is an error
REFUSED: Final = "refused"  # before_tool_call refused the call
CANCELLED: Final = "cancelled"  # the run ended cancelled
CLOSED: Final = "closed"  # the consumer closed the run's generator

# Usage's counts that the conventions name one for one (input tokens are counted apart).
_USAGE_COUNTS: Final = (
    ("output_tokens", USAGE_OUTPUT_TOKENS),
    ("cache_read_tokens", USAGE_CACHE_READ_INPUT_TOKENS),
    ("cache_write_tokens", USAGE_CACHE_CREATION_INPUT_TOKENS),
    ("reasoning_tokens", USAGE_REASONING_OUTPUT_TOKENS),
)


def traced(
    run: Generator[al.Event, None, al.RunResult],
    tracer: Optional[trace.Tracer] = None,
    *,
    agent_name: Optional[str] = None,
    request_model: Optional[str] = None,
    provider_name: Optional[str] = None,
) -> Generator[al.Event, None, al.RunResult]:
    """Returns ``run``'s generator unchanged (the same events, the same result) that also
    records the run as OpenTelemetry spans with ``tracer`` (default: the global provider's
    tracer named ``agent_loop_otel``).

    The events do not say which agent or model ran: ``agent_name`` (``gen_ai.agent.name``),
    ``request_model`` (``gen_ai.request.model``, the model's name as sent) and
    ``provider_name`` (``gen_ai.provider.name``, such as ``openai``) are put on the spans
    when given. Raises TypeError for a ``run`` that is not a generator, a ``tracer`` that is
    not an OpenTelemetry Tracer, or an option that is not None or a str.
    """
    if not isinstance(run, collections.abc.Generator):
        raise TypeError(
            "run must be a run's generator (from run_agent_loop() or durable_run()), "
            f"got {type(run).__name__}"
        )
    if tracer is None:
        tracer = trace.get_tracer("agent_loop_otel", __version__)
    elif not isinstance(tracer, trace.Tracer):
        raise TypeError(
            f"tracer must be None or an opentelemetry.trace.Tracer, got {type(tracer).__name__}"
        )
    options = (
        ("agent_name", agent_name),
        ("request_model", request_model),
        ("provider_name", provider_name),
    )
    for option, value in options:
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{option} must be None or a str, got {type(value).__name__}")
    return _traced(run, _RunSpans(tracer, agent_name, request_model, provider_name))


def _traced(
    run: Generator[al.Event, None, al.RunResult], spans: _RunSpans
) -> Generator[al.Event, None, al.RunResult]:
    """The run's events, each seen by ``spans`` before the consumer gets it."""
    spans.start()  # at the first next(): the run begins when its first event is asked for
    try:
        while True:
            token = spans.resume()
            try:
                event = next(run)
            except StopIteration as done:
                result: al.RunResult = done.value
                return result
            finally:
                context.detach(token)
            spans.observe(event)
            yield event
    except BaseException as error:  # GeneratorExit when closed, or what the run raised
        spans.interrupted(error)
        raise
    finally:
        try:
            run.close()  # a consumer's close() ends the run at once; after its end, nothing
        finally:
            spans.end()  # even when the run raises as it closes


@dataclass
class _Step:
    """One model request's times (nanoseconds since the epoch, as OpenTelemetry counts)."""

    started: int
    first_chunk: Optional[int] = None
    ended: Optional[int] = None


class _RunSpans:
    """The spans of one run: its own, then each request's and each call's, from its events."""

    def __init__(
        self,
        tracer: trace.Tracer,
        agent_name: Optional[str],
        request_model: Optional[str],
        provider_name: Optional[str],
    ) -> None:
        self.tracer = tracer
        self.agent_name = agent_name
        self.request_model = request_model
        self.model_attributes = {
            key: value
            for key, value in ((PROVIDER_NAME, provider_name), (REQUEST_MODEL, request_model))
            if value is not None
        }
        self.resumed_at = 0  # when the run's generator was last resumed
        self.accepted = 0  # the starting messages (message.accepted events)
        self.steps: Dict[str, _Step] = {}  # by request id, in the order the requests began
        self.streaming: Optional[_Step] = None  # the request whose chunks come now
        self.calls: Dict[Tuple[str, str], trace.Span] = {}  # open, by (request id, call id)
        self.result: Optional[al.RunResult] = None  # from run.finished
        self.ending: Optional[str] = None  # error.type when the run ended without a result

    def start(self) -> None:
        """The run begins: its span opens."""
        name = "invoke_agent" if self.agent_name is None else f"invoke_agent {self.agent_name}"
        attributes = {OPERATION_NAME: "invoke_agent", **self.model_attributes}
        if self.agent_name is not None:
            attributes[AGENT_NAME] = self.agent_name
        self.run_span = self.tracer.start_span(
            name, kind=trace.SpanKind.INTERNAL, attributes=attributes
        )
        self.parent = trace.set_span_in_context(self.run_span)

    def resume(self) -> Token[context.Context]:
        """The run's generator is resumed: its span is current until the token is detached."""
        self.resumed_at = time.time_ns()
        token: Token[context.Context] = context.attach(self.parent)
        return token

    def observe(self, event: al.Event) -> None:
        """An event of the run: a request's first chunk, a call's start or its end."""
        now = time.time_ns()
        if event.type == "model.chunk":
            request_id = event.payload["request_id"]
            if request_id not in self.steps:
                # The request began after the loop was resumed: no event says when.
                self.streaming = self.steps[request_id] = _Step(self.resumed_at, now)
            return
        self._stream_ended(now)
        if event.type == "message.accepted":
            self.accepted += 1
        elif event.type == "tool.started":
            self._start_call(event, now)
        elif event.type == "run.finished":
            # The result the run returns: a consumer may close the run once it has seen it.
            self.result = event.payload["result"]
        else:  # tool.finished, the one kind of event left
            call: al.ToolCall = event.payload["tool_call"]
            # A tool.finished with no tool.started (not a loop's run): a span of no length.
            key = (event.payload["request_id"], call.id)
            span = self.calls.pop(key, None) or self._start_call(event, now, keep=False)
            result: al.ToolResultMessage = event.payload["tool_result"]
            if result.is_error:
                _mark(span, REFUSED if event.payload.get("refused", False) else TOOL_ERROR)
            span.end(now)

    def _start_call(self, event: al.Event, now: int, keep: bool = True) -> trace.Span:
        """ExecuteTools: a call's span opens."""
        call: al.ToolCall = event.payload["tool_call"]
        span = self.tracer.start_span(
            f"execute_tool {call.name}",
            context=self.parent,
            kind=trace.SpanKind.INTERNAL,
            attributes={
                OPERATION_NAME: "execute_tool",
                TOOL_NAME: call.name,
                TOOL_CALL_ID: call.id,
                TOOL_TYPE: "function",
            },
            start_time=now,
        )
        if keep:
            self.calls[(event.payload["request_id"], call.id)] = span
        return span

    def _stream_ended(self, now: int) -> None:
        """An event that is not a chunk: the request that was streaming has ended."""
        if self.streaming is not None:
            self.streaming.ended = now
            self.streaming = None

    def interrupted(self, error: BaseException) -> None:
        """The run's generator was closed by its consumer, or raised ``error``."""
        if isinstance(error, GeneratorExit):
            self.ending = CLOSED
        else:
            self.ending = type(error).__qualname__
            self.run_span.record_exception(error)

    def end(self) -> None:
        """The run has ended: the request spans are recorded, and every open span ends."""
        now, result = time.time_ns(), self.result
        self._stream_ended(now)
        error, description = self.ending, None
        responses: Dict[str, al.AssistantMessage] = {}
        if result is not None:  # the run ended: its result says how, whatever came after
            error = CANCELLED if result.status == "cancelled" else None
            if result.error is not None:
                error, description = result.error.code, result.error.message
            # A request with no chunk (the run's last) began when the loop was last resumed.
            first = result.next_request_sequence - result.steps
            for number in range(first + 1, first + result.steps + 1):
                self.steps.setdefault(al.request_id(number), _Step(self.resumed_at))
            added = result.messages[self.accepted :]
            appended = [item for item in added if isinstance(item, al.AssistantMessage)]
            responses = dict(zip(self.steps, appended))  # each request's, in order
        for request_id, step in self.steps.items():
            self._record_chat(step, responses.get(request_id), error, now)
        for span in self.calls.values():  # calls that have no tool.finished
            _mark(span, error)
            span.end(now)
        if result is not None:
            self.run_span.set_attribute(RUN_STATUS, result.status)
            self.run_span.set_attributes(_usage_attributes(result.usage))
        _mark(self.run_span, error, description)
        self.run_span.end(now)

    def _record_chat(
        self, step: _Step, response: Optional[al.AssistantMessage], error: Optional[str], now: int
    ) -> None:
        """A request's span, with its response when the run appended one."""
        name = "chat" if self.request_model is None else f"chat {self.request_model}"
        attributes: Dict[str, Any] = {
            OPERATION_NAME: "chat",
            REQUEST_STREAM: True,  # a Model always streams
            **self.model_attributes,
        }
        if step.first_chunk is not None:
            attributes[RESPONSE_TIME_TO_FIRST_CHUNK] = (step.first_chunk - step.started) / 1e9
        if response is not None:
            attributes[RESPONSE_ID] = al.response_id_of(response.id) or response.id
            calls = any(isinstance(block, al.ToolCall) for block in response.content)
            attributes[RESPONSE_FINISH_REASONS] = ("toolCall" if calls else "stop",)
            attributes.update(_usage_attributes(response.usage))
        span = self.tracer.start_span(
            name,
            context=self.parent,
            kind=trace.SpanKind.CLIENT,
            attributes=attributes,
            start_time=step.started,
        )
        _mark(span, error if response is None else None)
        span.end(step.ended or now)


def _usage_attributes(usage: Optional[al.Usage]) -> Dict[str, int]:
    """The token counts that ``usage`` knows, by the conventions' names."""
    if usage is None:
        return {}
    counts = {
        name: getattr(usage, field)
        for field, name in _USAGE_COUNTS
        if getattr(usage, field) is not None
    }
    if usage.input_tokens is not None:
        # The conventions count cached input in the input tokens; Usage counts it apart.
        cached: List[Optional[int]] = [usage.cache_read_tokens, usage.cache_write_tokens]
        counts[USAGE_INPUT_TOKENS] = usage.input_tokens + sum(n for n in cached if n)
    return counts


def _mark(span: trace.Span, error: Optional[str], description: Optional[str] = None) -> None:
    """A span that ended in an error gets its error.type and the status ERROR."""
    if error is not None:
        span.set_attribute(ERROR_TYPE, error)
        span.set_status(trace.Status(trace.StatusCode.ERROR, description))
