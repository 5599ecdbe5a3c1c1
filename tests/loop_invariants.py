"""Tests only (not collected by pytest, not installed): the invariants every run keeps.

check_run() checks a run from the outside, whatever the model, the tools and the caller
did: one counter, exactly one run.finished carrying the result, complete messages with
unique ids, every tool result answering an earlier call, and (given the model) how the
requests, the chunks, the tools and the transcript agree. The driver of loop_testing.py
(run(), settle()) calls it after every run, so every test of the loop checks them too.

It imports agent_loop alone and writes again what it needs (the normalisation of text,
the sum of usages) rather than trusting the loop's own: an independent oracle, as the
reference model of loop_reference.py is for random scripts.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence, cast

import agent_loop as al

STATUSES = ("completed", "cancelled", "maxSteps", "failed")


CODES = ("INVALID_TRANSCRIPT", "MODEL_PROTOCOL_ERROR", "MODEL_STREAM_ERROR", "TOOL_PHASE_ERROR")


SEED_EVENT_TYPES = (
    "message.accepted",
    "model.chunk",
    "tool.started",
    "tool.finished",
    "run.finished",
)
"""The seed's five kinds of event: a run whose tools yield nothing has only these."""

EVENT_TYPES = (*SEED_EVENT_TYPES, "tool.progress")


MESSAGE_TYPES = (al.UserMessage, al.AssistantMessage, al.ToolResultMessage)


def normalized(items: Sequence[object]) -> list[object]:
    """Text coalesced, and thinking coalesced, between the other kinds of block; empty
    text and thinking dropped: the seed's normalisation (thinking as the loop extends it),
    written again here so that the checker does not trust the loop's own. Text is a str
    (or a TextBlock), thinking a ThinkingBlock whose signature is ignored; it comes out as
    ("thinking", text)."""
    normalized: list[object] = []
    pending = ""
    pending_kind = ""
    for item in items:
        kind = "call"
        if isinstance(item, al.TextBlock):
            item, kind = item.text, "text"
        elif isinstance(item, str):
            kind = "text"
        elif isinstance(item, al.ThinkingBlock):
            item, kind = item.thinking, "thinking"
        if kind != "call" and item == "":
            continue
        if pending and kind != pending_kind:
            normalized.append(pending if pending_kind == "text" else ("thinking", pending))
            pending = ""
        if kind == "call":
            normalized.append(item)
        else:
            pending += cast(str, item)
            pending_kind = kind
    if pending:
        normalized.append(pending if pending_kind == "text" else ("thinking", pending))
    return normalized


def chunk_item(chunk: object) -> object:
    if isinstance(chunk, al.TextDelta):
        return chunk.text
    if isinstance(chunk, al.ThinkingDelta):
        return al.ThinkingBlock(chunk.thinking)
    assert isinstance(chunk, al.ToolCallChunk)
    return chunk.tool_call


USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
)


def summed_usage(messages: Iterable[al.Message]) -> al.Usage | None:
    """The usage of a run that appended these assistant messages, summed as the README
    says (a field unknown in one of them is unknown; no response at all is None), written
    again here so that the checker does not trust the loop's own Usage.__add__."""
    usages = [m.usage for m in messages if isinstance(m, al.AssistantMessage)]
    if not usages:
        return None
    total: dict[str, int | None] = {}
    for name in USAGE_FIELDS:
        counts = [None if usage is None else getattr(usage, name) for usage in usages]
        total[name] = None if None in counts else sum(cast("list[int]", counts))
    return al.Usage(**total)


def check_run(
    events: Sequence[al.Event],
    result: al.RunResult,
    model: Any = None,
    *,
    max_steps: int | None = None,
    start: Sequence[al.Message] | None = None,
    tool_concurrency: int = 1,
    consent: bool = False,
) -> None:
    """The invariants every run keeps whatever the model, the tools and the caller did,
    checked from the outside: one counter (sequences 0..n-1, no gap), exactly one
    run.finished, last, carrying the returned result; complete messages with unique ids,
    every tool result answering an earlier call. Given the ``model`` (which needs
    ``call_count`` and ``requests``), also how the requests, chunks, tools and the
    transcript agree; given ``start``, that the starting messages are the prefix. With
    ``tool_concurrency`` > 1 a group of calls is scheduled at once; with ``consent`` a
    run may be cancelled while before_tool_call asks, its last response appended."""
    # One counter: sequences 0, 1, 2, ... and exactly one run.finished, last, carrying the result.
    assert [event.sequence for event in events] == list(range(len(events)))
    kinds = [event.type for event in events]
    assert set(kinds) <= set(EVENT_TYPES)
    assert kinds.count("run.finished") == 1
    assert kinds[-1] == "run.finished"
    assert events[-1].payload["result"] is result
    status = result.status
    assert status in STATUSES
    assert (result.final_text is not None) == (status == "completed")
    # A run ends on a tool only completed, and only after a tool.finished that says so.
    ending = [event for event in events if event.payload.get("ends_run", False)]
    assert result.output is None or (status == "completed" and ending)
    assert result.awaiting == ()
    if max_steps is not None:
        assert result.max_steps == (max_steps if status == "maxSteps" else None)
    assert (result.error is not None) == (status == "failed")
    code = None
    if result.error is not None:
        code = result.error.code
        assert code in CODES
        assert isinstance(result.error.message, str)
        assert result.error.message

    # message.accepted events come first.
    accepted = [event.payload["message"] for event in events if event.type == "message.accepted"]
    assert kinds[: len(accepted)] == ["message.accepted"] * len(accepted)

    # Complete protocol messages with unique ids and valid linkage.
    messages = result.messages
    assert isinstance(messages, tuple)
    assert all(type(message) in MESSAGE_TYPES for message in messages)
    assert len({message.id for message in messages}) == len(messages)
    calls: dict[str, tuple[str, int]] = {}  # call id -> (tool name, index of its message)
    answered: dict[str, int] = {}
    assistant_indexes = []
    for index, message in enumerate(messages):
        if isinstance(message, al.AssistantMessage):
            assistant_indexes.append(index)
            assert message.usage is None or type(message.usage) is al.Usage
            for block in message.content:
                assert type(block) in (al.TextBlock, al.ThinkingBlock, al.ToolCall)
                if isinstance(block, al.TextBlock):
                    assert isinstance(block.text, str)
                    continue
                if isinstance(block, al.ThinkingBlock):
                    assert isinstance(block.thinking, str)
                    assert not block.redacted or (block.thinking == "" and block.signature)
                    continue
                assert isinstance(block.id, str)
                assert block.id
                assert isinstance(block.name, str)
                assert block.name
                assert block.id not in calls, "tool-call ids are unique in a transcript"
                calls[block.id] = (block.name, index)
        elif isinstance(message, al.ToolResultMessage):
            # Every result answers an earlier call with the same tool name, exactly once.
            assert message.tool_call_id in calls
            assert calls[message.tool_call_id][0] == message.tool_name
            assert message.tool_call_id not in answered
            answered[message.tool_call_id] = index
            assert isinstance(message.content, str)
            assert isinstance(message.is_error, bool)
        else:
            assert isinstance(message.content, str)
    open_calls = [call_id for call_id in calls if call_id not in answered]
    if open_calls:
        # Only a run interrupted inside its last tool batch leaves calls without a result,
        # and only those of the last assistant message.
        assert status == "cancelled" or code == "TOOL_PHASE_ERROR"
        assert {calls[call_id][1] for call_id in open_calls} == {assistant_indexes[-1]}

    # The starting messages: accepted in order, then kept as the transcript's prefix.
    if code == "INVALID_TRANSCRIPT":
        assert kinds == ["run.finished"]
        assert messages == ()
        assert result.steps == 0
        assert result.usage is None
    else:
        assert accepted == list(messages[: len(accepted)])
        if start is not None:
            assert messages[: len(start)] == tuple(start)
            assert accepted == list(start[: len(accepted)])
            if result.steps > 0 or status != "cancelled":
                assert len(accepted) == len(start)
            start_count = len(start)
        elif result.steps > 0 or status != "cancelled":
            start_count = len(accepted)
        else:
            start_count = len(messages)
        # The run's usage: the sum over the responses it appended, and only those.
        assert result.usage == summed_usage(messages[start_count:])

    if model is None:
        return
    # The model: one call per step, within the budget; every request a prefix of the end.
    assert model.call_count == result.steps
    assert max_steps is None or result.steps <= max_steps
    requests = list(model.requests)
    assert len(requests) == result.steps
    request_ids = [request.id for request in requests]
    if request_ids:
        first = int(request_ids[0][len("request-") :])
        assert request_ids == [f"request-{n:03d}" for n in range(first, first + len(requests))]
    for request in requests:
        assert request.messages == messages[: len(request.messages)]
    if code == "INVALID_TRANSCRIPT":
        return

    # Chunks: every chunk event belongs to an opened request and carries its id.
    for event in events:
        if event.type == "model.chunk":
            assert event.payload["request_id"] in request_ids
            assert event.payload["chunk"].request_id == event.payload["request_id"]

    # No assistant message for a response whose stream was interrupted: the run added one
    # assistant message per step, except a last step that never reached tool.started or
    # completion. Each added message agrees with the chunks streamed for its request.
    added = messages[start_count:]
    added_assistants = [m for m in added if isinstance(m, al.AssistantMessage)]
    if result.steps == 0:
        assert added == ()
    else:
        last_accepted = status == "completed" or any(
            event.type == "tool.started" and event.payload["request_id"] == request_ids[-1]
            for event in events
        )
        # Cancelled or failed while before_tool_call asked about the first call (or
        # group): the response was appended and none of its calls started.
        stopped = status == "cancelled" or code == "TOOL_PHASE_ERROR"
        asked = consent and stopped and len(added_assistants) == result.steps
        assert len(added_assistants) == result.steps - 1 + int(last_accepted or asked)
    for request_id, message in zip(request_ids, added_assistants):
        streamed = [
            chunk_item(event.payload["chunk"])
            for event in events
            if event.type == "model.chunk" and event.payload["request_id"] == request_id
        ]
        assert normalized(streamed) == normalized(message.content)
        # Tools ran in assistant order, for this request only.
        started = [
            event.payload["tool_call"]
            for event in events
            if event.type == "tool.started" and event.payload["request_id"] == request_id
        ]
        message_calls = [block for block in message.content if isinstance(block, al.ToolCall)]
        assert started == message_calls[: len(started)]

    # Tools: each tool.finished carries a result that is in the transcript. The calls of
    # a group (one call; with tool_concurrency > 1, consecutive calls run at once) get
    # their tool.started events in a row, then their tool.finished events in the same
    # order, at once; a call left without one is open, and only a run that ended right
    # there leaves one (a cancelled one may keep the results that came after it).
    finished = [event for event in events if event.type == "tool.finished"]
    added_results = [m for m in added if isinstance(m, al.ToolResultMessage)]
    assert len(finished) == len(added_results)
    for event, message in zip(finished, added_results):
        assert event.payload["tool_result"] is message
        assert event.payload["tool_call"].id == message.tool_call_id
        assert event.payload["tool_call"].name == message.tool_name
    index = 0
    while index < len(events):
        group = []
        while events[index].type == "tool.started":
            group.append(events[index])
            index += 1
        if not group:
            index += 1
            continue
        assert tool_concurrency > 1 or len(group) == 1
        assert len({event.payload["request_id"] for event in group}) == 1
        group_calls = [event.payload["tool_call"] for event in group]
        last = -1  # the position in the group of the last call that finished
        while events[index].type in ("tool.finished", "tool.progress"):
            assert events[index].payload["request_id"] == group[0].payload["request_id"]
            if events[index].type == "tool.progress":
                # A progress of a call of the group that has started and not finished.
                running = [c.id for c in group_calls[last + 1 :]]
                assert events[index].payload["tool_call_id"] in running
                index += 1
                continue
            # Results in assistant order, and none after a call left without one.
            position = group_calls.index(events[index].payload["tool_call"])
            assert position == last + 1
            assert events[index].payload["tool_call"] is group_calls[position]
            last = position
            index += 1
        unfinished = group_calls[last + 1 :]
        if unfinished:
            assert events[index].type == "run.finished"
            assert status == "cancelled" or code == "TOOL_PHASE_ERROR"
            for open_call in unfinished:
                assert open_call.id in open_calls, "no result for an open call"
