# agent_loop_otel.py 1.1.0: OpenTelemetry spans of agent_loop.py's runs, by the GenAI conventions.
# Needs opentelemetry-api; copy it next to agent_loop.py and agent_loop_replay.py.
# Home: the agent_loop repository.
"""Record a run of the Agent Loop as OpenTelemetry spans, named and attributed as the GenAI
semantic conventions say.

``traced(run)`` wraps a run's generator (``run_agent_loop()`` or ``durable_run()``): it
yields the same events and returns the same result, and it records, with the tracer given
(by default the global tracer provider's):

- one ``invoke_agent`` span for the run (``invoke_agent {agent_name}`` when an agent name
  is given), from the first event asked for to the end of the run;
- one ``chat`` span per model request (``chat {request_model}`` when the model's name is
  known), from the consumer's ``next()`` that resumed the run to open the request (the
  loop does nothing between two events, so the request is sent right then) to the first
  event after its last chunk;
- one ``execute_tool {tool name}`` span per tool call, from its ``tool.started`` to when
  its tool returned (the ``tool.finished`` event's time); calls run at once have their
  spans open at once, each with its own duration. A ``tool.progress`` event is a span
  event of its call's span.

The chat and tool spans are children of the run's span, and the run's span a child of
the span current when the run began. While the run's generator is resumed the run's span
is the current span, and after a ``tool.started`` that call's span (the loop runs a
sequential tool in that resume, and a call at once in a copy of its context), so a span
that the model or a tool starts is its child: a run traced inside a tool is a child of
that call's ``execute_tool`` span, in whichever thread the tool runs. Every span ends
whatever way the run ends: completed, ``maxSteps``, cancelled, failed, closed by its
consumer, or raising.

Rules:

- A chat span is recorded when the run ends, with the times its request began and ended:
  its response id, finish reason and token counts are read from the run's final
  transcript (the events do not carry them), so they are absent when the run was closed
  before its end. Each response the run appended is its request's, in order.
- ``gen_ai.response.id`` is the provider's own id of the answer
  (``AssistantMessage.provider_response_id``, OpenAI's ``chatcmpl-...``) when the model
  reported one, else the id the model gave the response (a ScriptedModel's scripted id).
- The finish reason is ``tool_calls`` for a response with tool calls, ``stop`` for one
  without; a request that failed has ``error``, or ``length`` or ``content_filter`` when
  the exception that failed it has a ``finish_reason`` attribute (as a ProviderError has)
  saying ``length`` or ``max_tokens``, ``content_filter`` or ``refusal``.
- Provider, model and server come from the arguments, else from the model object's public
  attributes ``provider_name``, ``model`` and ``base_url`` (as the adapters have them).
- Message content (``gen_ai.input.messages``, ``gen_ai.output.messages``,
  ``gen_ai.tool.call.arguments``, ``gen_ai.tool.call.result``, a progress event's value)
  is recorded only when the user opts in: ``capture_content=True``, or, when it is None,
  the environment variable ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` set to
  ``true``, ``span_only`` or ``span_and_event`` (any case).
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

It reads the run through ``agent_loop_replay.RunSteps`` (fed each event as it passes; a
log that no loop yields is its ValueError) and uses only public names; the attribute
names are written here as strings, so that only opentelemetry-api is needed.
"""

from __future__ import annotations

import collections.abc
import json
import os
import time
import urllib.parse
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    Final,
    Generator,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
    cast,
)

import agent_loop as al
from agent_loop_replay import Call, RunSteps, Step

if TYPE_CHECKING:
    from contextvars import Token

try:
    from opentelemetry import context, trace
except ImportError as missing:  # only this companion needs OpenTelemetry
    raise ImportError(
        "agent_loop_otel.py needs the OpenTelemetry API: pip install opentelemetry-api"
    ) from missing

__version__: Final = "1.1.0"

__all__ = ["traced"]

# The names of the GenAI semantic conventions (opentelemetry-semantic-conventions calls
# them GEN_AI_*; error.type and server.* are stable attributes), as strings: no dependency.
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
INPUT_MESSAGES: Final = "gen_ai.input.messages"
OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
TOOL_NAME: Final = "gen_ai.tool.name"
TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
TOOL_TYPE: Final = "gen_ai.tool.type"
TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
ERROR_TYPE: Final = "error.type"
# Not a convention's: the run's status, which no GenAI attribute holds, and a tool's
# progress, which is a span event of its call's span (its value only with the content).
RUN_STATUS: Final = "agent_loop.run.status"
PROGRESS: Final = "tool.progress"
PROGRESS_VALUE: Final = "agent_loop.tool.progress"

# The opt-in to message content, as the GenAI instrumentations name it; its values that
# put content on spans (a boolean, or the enum of opentelemetry-util-genai).
CAPTURE_MESSAGE_CONTENT: Final = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_CAPTURING: Final = frozenset({"true", "span_only", "span_and_event"})

# The error.type values of this file (the run's failure codes are the others).
TOOL_ERROR: Final = "tool_error"  # a call's result is an error
REFUSED: Final = "refused"  # before_tool_call refused the call
CANCELLED: Final = "cancelled"  # the run ended cancelled
CLOSED: Final = "closed"  # the consumer closed the run's generator

# The conventions' finish reasons (their examples spell OpenAI's tool_calls), and what a
# failed stream's exception says in its finish_reason attribute, by the conventions' name.
STOP: Final = "stop"
TOOL_CALLS: Final = "tool_calls"
ERROR: Final = "error"
_UNFINISHED: Final = {
    "length": "length",
    "max_tokens": "length",  # Anthropic's stop_reason
    "content_filter": "content_filter",
    "refusal": "content_filter",  # Anthropic's stop_reason
}

# The port a base URL without one reaches: server.port goes with every server.address.
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}

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
    model: object = None,
    agent_name: Optional[str] = None,
    request_model: Optional[str] = None,
    provider_name: Optional[str] = None,
    capture_content: Optional[bool] = None,
) -> Generator[al.Event, None, al.RunResult]:
    """Returns ``run``'s generator unchanged (the same events, the same result) that also
    records the run as OpenTelemetry spans with ``tracer`` (default: the global provider's
    tracer named ``agent_loop_otel``).

    The events do not say which agent or model ran: ``agent_name`` (``gen_ai.agent.name``),
    ``request_model`` (``gen_ai.request.model``, the model's name as sent) and
    ``provider_name`` (``gen_ai.provider.name``, such as ``openai``) are put on the spans
    when given; ``model``, the run's model object, gives the last two (its ``model`` and
    ``provider_name`` attributes) when they are not given, and ``server.address`` and
    ``server.port`` (from its ``base_url``). ``capture_content`` records message content
    when True, never when False, and as the environment variable
    ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` says when None. Raises TypeError
    for a ``run`` that is not a generator, a ``tracer`` that is not an OpenTelemetry
    Tracer, a ``model`` that is a str, or an option of another type than documented.
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
    if isinstance(model, str):
        raise TypeError(
            "model must be the run's model object (its provider_name, model and base_url "
            f"are read), got the str {model!r}: give a model's name as request_model"
        )
    options = (
        ("agent_name", agent_name),
        ("request_model", request_model),
        ("provider_name", provider_name),
    )
    for option, value in options:
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{option} must be None or a str, got {type(value).__name__}")
    if capture_content is None:
        setting = os.environ.get(CAPTURE_MESSAGE_CONTENT, "")
        capture_content = setting.strip().lower() in _CAPTURING
    elif not isinstance(capture_content, bool):
        raise TypeError(
            f"capture_content must be None or a bool, got {type(capture_content).__name__}"
        )
    named = {
        PROVIDER_NAME: _given_or_read(provider_name, model, "provider_name"),
        REQUEST_MODEL: _given_or_read(request_model, model, "model"),
    }
    spans = _RunSpans(
        tracer,
        agent_name,
        {key: value for key, value in named.items() if value is not None},
        _server_attributes(_given_or_read(None, model, "base_url")),
        capture_content,
    )
    return _traced(run, spans)


def _given_or_read(given: Optional[str], model: object, name: str) -> Optional[str]:
    """The argument when given, else the model object's attribute ``name`` when it is a str."""
    if given is not None:
        return given
    value = getattr(model, name, None)
    return value if isinstance(value, str) else None


def _server_attributes(base_url: Optional[str]) -> Dict[str, Any]:
    """server.address and server.port of the URL the model sends its requests to."""
    if base_url is None:
        return {}
    try:
        parts = urllib.parse.urlsplit(base_url)
        host, port = parts.hostname, parts.port or _DEFAULT_PORTS.get(parts.scheme)
    except ValueError:  # not a URL (its port is not a number): no server rather than no run
        return {}
    server = {SERVER_ADDRESS: host, SERVER_PORT: port}
    return {} if host is None else {key: value for key, value in server.items() if value}


def _traced(
    run: Generator[al.Event, None, al.RunResult], spans: _RunSpans
) -> Generator[al.Event, None, al.RunResult]:
    """The run's events, each seen by ``spans`` before the consumer gets it."""
    # Driven by hand, not by agent_loop_replay.passed_on: the run's context is attached
    # around each next(), which a hook that sees the event after it cannot do.
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


class _RunSpans:
    """The spans of one run: its own, then each request's and each call's, projected from
    the run's steps as RunSteps reads them from its events."""

    def __init__(
        self,
        tracer: trace.Tracer,
        agent_name: Optional[str],
        model_attributes: Dict[str, str],
        server_attributes: Dict[str, Any],
        capture: bool,
    ) -> None:
        self.tracer = tracer
        self.agent_name = agent_name
        self.model_attributes = model_attributes
        self.server_attributes = server_attributes
        self.capture = capture  # whether message content goes on the spans
        self.log = RunSteps()  # the run's steps, fed each event as it passes
        self.resumed_at = 0  # when the run's generator was last resumed
        self.began: Dict[str, int] = {}  # when each request began, by request id
        self.calls: Dict[int, trace.Span] = {}  # the open calls' spans, by tool.started
        self.ending: Optional[str] = None  # error.type when the run ended without a result

    def start(self) -> None:
        """The run begins: its span opens, a child of the current span (a tool's call's,
        when the run is traced inside a tool)."""
        name = "invoke_agent" if self.agent_name is None else f"invoke_agent {self.agent_name}"
        attributes = {OPERATION_NAME: "invoke_agent", **self.model_attributes}
        if self.agent_name is not None:
            attributes[AGENT_NAME] = self.agent_name
        self.run_span = self.tracer.start_span(
            name, kind=trace.SpanKind.INTERNAL, attributes=attributes
        )
        self.parent = self.current = trace.set_span_in_context(self.run_span)

    def resume(self) -> Token[context.Context]:
        """The run's generator is resumed: its span, or the span of the call whose tool runs
        in this resume, is current until the token is detached."""
        self.resumed_at = time.time_ns()
        token: Token[context.Context] = context.attach(self.current)
        return token

    def observe(self, event: al.Event) -> None:
        """An event of the run: a request begins, a call starts, progresses or ends."""
        # When the event does not say when it happened, it happened as it passes here.
        self.log.feed(event, time.time() if event.time is None else None)
        position = len(self.log.events) - 1
        if event.type in ("message.accepted", "run.finished"):
            return
        step = self.log.steps[-1]
        if step.first == position:  # the loop opened the request in this resume
            self.began[step.request_id] = self.resumed_at
        at = self._time(position)
        if event.type == "tool.started":
            self._start_call(step.calls[-1], at)
        elif event.type == "tool.progress":
            (call,) = [call for call in step.calls if position in call.progress]
            value = event.payload["progress"]
            attributes = {PROGRESS_VALUE: _json(value)} if self.capture else {}
            self.calls[call.started].add_event(PROGRESS, attributes, timestamp=at)
        elif event.type == "tool.finished":
            (call,) = [call for call in step.calls if call.finished == position]
            self._finish_call(call, at)
        # The call started last is current in the next resume while it is open: a
        # sequential tool runs in that resume, and each call at once in a copy of the
        # context of the resume after its tool.started (the loop's rule), so every tool
        # runs with its own call's span current.
        last = step.calls[-1] if step.calls else None
        if last is None or last.finished is not None:
            self.current = self.parent
        else:
            self.current = trace.set_span_in_context(self.calls[last.started], self.parent)

    def _time(self, position: int) -> int:
        """When the event fed at ``position`` happened, in nanoseconds."""
        return int(cast(float, self.log.times[position]) * 1e9)  # every feed has a time

    def _start_call(self, call: Call, at: int) -> None:
        """ExecuteTools: a call's span opens; its tool runs in the next resume or a worker."""
        tool_call = call.tool_call
        attributes = {
            OPERATION_NAME: "execute_tool",
            TOOL_NAME: tool_call.name,
            TOOL_CALL_ID: tool_call.id,
            TOOL_TYPE: "function",
        }
        if self.capture:
            attributes[TOOL_CALL_ARGUMENTS] = _json(tool_call.plain_arguments())
        self.calls[call.started] = self.tracer.start_span(
            f"execute_tool {tool_call.name}",
            context=self.parent,
            kind=trace.SpanKind.INTERNAL,
            attributes=attributes,
            start_time=at,
        )

    def _finish_call(self, call: Call, at: int) -> None:
        """ExecuteTools: a call's result is handed on; its span ends when its tool returned."""
        span = self.calls.pop(call.started)
        result = cast(al.ToolResultMessage, call.result)  # a finished call has its result
        if result.is_error:
            _mark(span, REFUSED if call.refused else TOOL_ERROR)
        elif self.capture:
            span.set_attribute(TOOL_CALL_RESULT, result.content)
        span.end(at)

    def interrupted(self, error: BaseException) -> None:
        """The run's generator was closed by its consumer, or raised ``error``."""
        if isinstance(error, GeneratorExit):
            self.ending = CLOSED
        else:
            self.ending = type(error).__qualname__
            self.run_span.record_exception(error)

    def end(self) -> None:
        """The run has ended: the request spans are recorded, and every open span ends."""
        now, result, log = time.time_ns(), self.log.result, self.log
        error, description, reason = self.ending, None, None
        steps: Dict[str, Optional[Step]] = {step.request_id: step for step in log.steps}
        messages: Tuple[al.Message, ...] = ()  # the final transcript, when the run returned
        if result is not None:  # the run ended: its result says how, whatever came after
            error = CANCELLED if result.status == "cancelled" else None
            if result.error is not None:
                error, description = result.error.code, result.error.message
                reason = _unfinished(result.error.exception)
            messages = result.messages
            # A request that yielded no event (the run's last) has no step.
            first = result.next_request_sequence - result.steps
            numbers = range(first + 1, first + result.steps + 1)
            steps.update(
                {al.request_id(n): None for n in numbers if al.request_id(n) not in steps}
            )
        # Each response the run appended is its request's, in order; the request after the
        # last response was sent the whole final transcript.
        answers = [
            (position, message)
            for position, message in enumerate(messages)
            if position >= len(log.accepted) and isinstance(message, al.AssistantMessage)
        ]
        for index, (request_id, step) in enumerate(steps.items()):
            began = self.began.get(request_id, self.resumed_at)  # no event: the last resume
            times = (began, *self._chunk_times(step, now))
            if index < len(answers):
                position, answer = answers[index]
                self._record_chat(times, messages[:position], answer, None, now)
            else:
                self._record_chat(times, messages, None, error, now, reason)
        for step in log.steps:
            for call in step.calls:
                if call.finished is None:  # no tool.finished: the run ended while it ran
                    span = self.calls[call.started]
                    _mark(span, error)
                    span.end(now)
        if result is not None:
            self.run_span.set_attribute(RUN_STATUS, result.status)
            self.run_span.set_attributes(_usage_attributes(result.usage))
        _mark(self.run_span, error, description)
        self.run_span.end(now)

    def _chunk_times(self, step: Optional[Step], now: int) -> Tuple[Optional[int], int]:
        """When a request's first chunk came (None: none did) and when it ended: at the
        first event after its last chunk (or its first, a tool.started), else now."""
        if step is None:
            return None, now
        after = step.chunks[-1] + 1 if step.chunks else step.first
        first = self._time(step.chunks[0]) if step.chunks else None
        return first, self._time(after) if after < len(self.log.events) else now

    def _record_chat(
        self,
        times: Tuple[int, Optional[int], int],
        inputs: Sequence[al.Message],
        response: Optional[al.AssistantMessage],
        error: Optional[str],
        now: int,
        reason: Optional[str] = None,
    ) -> None:
        """A request's span (begun, first chunk, ended): what it was sent, and its response
        when the run appended one (else ``error``, and the finish ``reason`` of a failure)."""
        started, first_chunk, ended = times
        model = self.model_attributes.get(REQUEST_MODEL)
        attributes: Dict[str, Any] = {
            OPERATION_NAME: "chat",
            REQUEST_STREAM: True,  # a Model always streams
            **self.model_attributes,
            **self.server_attributes,
        }
        if first_chunk is not None:
            waited = max(first_chunk - started, 0)  # two clocks' readings
            attributes[RESPONSE_TIME_TO_FIRST_CHUNK] = waited / 1e9
        if self.capture and inputs:
            attributes[INPUT_MESSAGES] = _json([_message(message) for message in inputs])
        if response is not None:
            own_id = al.response_id_of(response.id) or response.id
            attributes[RESPONSE_ID] = response.provider_response_id or own_id
            calls = any(isinstance(block, al.ToolCall) for block in response.content)
            attributes[RESPONSE_FINISH_REASONS] = (TOOL_CALLS if calls else STOP,)
            attributes.update(_usage_attributes(response.usage))
            if self.capture:
                # The output messages' schema spells it tool_call.
                ended_by = {"finish_reason": "tool_call" if calls else STOP}
                attributes[OUTPUT_MESSAGES] = _json([{**_message(response), **ended_by}])
        elif reason is not None:
            attributes[RESPONSE_FINISH_REASONS] = (reason,)
        span = self.tracer.start_span(
            "chat" if model is None else f"chat {model}",
            context=self.parent,
            kind=trace.SpanKind.CLIENT,
            attributes=attributes,
            start_time=started,
        )
        _mark(span, error)
        span.end(max(ended, started))


def _unfinished(exception: Optional[BaseException]) -> str:
    """The finish reason of a request that failed with ``exception``."""
    said = getattr(exception, "finish_reason", None)
    return _UNFINISHED.get(said, ERROR) if isinstance(said, str) else ERROR


def _message(message: al.Message) -> Dict[str, Any]:
    """A message as the conventions' input and output messages have it."""
    if isinstance(message, al.UserMessage):
        return {"role": "user", "parts": [{"type": "text", "content": message.content}]}
    if isinstance(message, al.ToolResultMessage):
        part = {"type": "tool_call_response", "id": message.tool_call_id}
        return {"role": "tool", "parts": [{**part, "response": message.content}]}
    return {"role": "assistant", "parts": [_part(block) for block in message.content]}


def _part(block: Union[al.TextBlock, al.ThinkingBlock, al.ToolCall]) -> Dict[str, Any]:
    """An assistant's block as a part of a message, by the conventions."""
    if isinstance(block, al.TextBlock):
        return {"type": "text", "content": block.text}
    if isinstance(block, al.ThinkingBlock):
        return {"type": "reasoning", "content": block.thinking}
    arguments = block.plain_arguments()
    return {"type": "tool_call", "id": block.id, "name": block.name, "arguments": arguments}


def _json(value: object) -> str:
    """A value of message content as the JSON string a span attribute holds (plain JSON
    already: the loop checked it; not json_line's ASCII, so that a backend shows the text)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


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
