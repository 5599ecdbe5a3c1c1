"""Tests only (not collected by pytest, not installed): the reference model, an oracle.

What the seed says a run does, for random scripts. A test oracle, as
loop_invariants.check_run() is: a script is a list of StepPlans (what each model step
streams and returns, and what its tool calls do); predict() says, from the seed's rules
alone, which events, status, steps, transcript and tool effects the run must have;
run_plans() runs the script with the driver of loop_testing.py (which checks the run's
invariants too) and assert_predicted() compares. The random script generator
(random_script) makes the seeded scripts that test_agent_loop.py's
TestRandomScriptsAgainstAReference runs against it.
"""

from __future__ import annotations

import dataclasses
import random
import threading
from typing import Any, Callable, Sequence, cast

import agent_loop as al
from loop_testing import (
    HISTORY,
    NUMBERS,
    FakeModel,
    cyclic_object,
    echo_call,
    nested,
    raise_error,
    respond,
    run,
    stream_step,
    untyped,
    user,
)


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
    stream: Sequence[object],
    content: Sequence[object],
) -> StepPlan:
    """A valid step: ``items`` are texts and CallPlans in assistant order, streamed as
    ``stream`` and returned as ``content`` (which normalise alike)."""
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
    opened = [f"request-{step:03d}" for step in range(1, min(prediction.steps, len(plans)) + 1)]
    assert model.finalized == opened


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


def random_valid_step(rng: random.Random, response_id: str, step: int, stop: bool) -> StepPlan:
    """A valid step with random text, calls and chunk splits."""
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
    return plan_step(response_id, items, "stop" if stop else "toolCall", stream, content)


def random_violation(
    rng: random.Random, response_id: str, step: int, used_ids: Sequence[str]
) -> StepPlan:
    """A step that breaks one rule; the reference knows how many chunks get an event."""
    kind = rng.choice(VIOLATIONS)
    plan = random_valid_step(rng, response_id, step, stop=kind == "toolCall-without-call")
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
        plan = random_valid_step(rng, response_id, step, stop=roll < 0.4)
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
