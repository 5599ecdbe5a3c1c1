"""Tests of agent_loop_providers.py: what fails, and what the failure says.

The sans-IO layer's refusals as data rows (each broken answer, the words of its error,
its kind), the cost a failed answer reported, and the response heads that decide an
error (``check_response_head()``). From bytes alone, through the public names and the
models' ``transport=`` seam (loop_testing_providers.py builds the streams); no socket.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any, Dict, List, Optional, Tuple

import pytest

import agent_loop as al
import agent_loop_providers as providers
from loop_testing_providers import (
    ADD,
    DONE,
    DONE_HINT,
    END_HINT,
    MESSAGE_START,
    OPENAI_TEXT_STREAM,
    PROVIDERS,
    STOP,
    Hurried,
    answer_parts,
    anthropic_delta,
    anthropic_end,
    anthropic_event,
    anthropic_redacted,
    anthropic_start,
    anthropic_text,
    anthropic_thinking,
    anthropic_tool,
    assert_stream_error,
    canned_anthropic,
    canned_model,
    canned_openai,
    chunk_texts,
    exchanges,
    new_answer,
    openai_call,
    openai_chunk,
    openai_usage,
    parsed,
    settle_prompt,
    sse,
)

# --- Failures -----------------------------------------------------------------------


def usage_delta(usage: Any) -> bytes:
    return anthropic_event("message_delta", delta={}, usage=usage)


TEXT_START, TOOL_START = anthropic_text(0)[0], anthropic_tool(0, "t", "add")[0]
THINKING_START = anthropic_thinking(0)[0]
HI = openai_chunk({"content": "Hi"})
OBJECT = {"name": "add", "arguments": {}}  # arguments that are not a string
DEEP = "[" * 200_000  # json's C code recurses per level: deeper than the recursion limit
NESTED = (
    "malformed event: JSON nested too deeply to read"
    " (in the event's data or in a tool call's arguments)"
)
# Each broken answer, and the words of its refusal that no other row's refusal has (rows
# that one check refuses share them): a refusal swapped for another one fails its row.
OPENAI_BROKEN: List[Tuple[str, List[bytes], str]] = [
    ("no-done", [HI, openai_chunk({}, "stop")],
     "the stream ended before data: [DONE]: the answer is incomplete"),
    (
        "done-without-finish",
        [HI, DONE],
        f"the stream ended with data: [DONE] but no finish_reason: the answer is incomplete "
        f"{DONE_HINT}",
    ),
    ("empty-finish", [HI, openai_chunk({}, ""), DONE],
     "the stream ended with data: [DONE] but no finish_reason: the answer is incomplete"),
    (
        "end-without-finish",
        [HI],
        "the stream ended before data: [DONE] and without a finish_reason: the answer is "
        f"incomplete {END_HINT}",
    ),
    ("finish-not-str", [sse({"choices": [{"delta": {}, "finish_reason": ["stop"]}]})],
     "malformed event: a finish_reason that is not a string"),
    ("length-then-the-end", [HI, openai_chunk({}, "length")],
     "the answer was cut: finish_reason 'length' (the token limit)"),
    ("length", [HI, openai_chunk({}, "length"), DONE],
     "the answer was cut: finish_reason 'length' (the token limit)"),
    ("length-in-a-call", [openai_call(0, "a", "add", "{"), openai_chunk({}, "length"), DONE],
     "the answer was cut: finish_reason 'length' (the token limit) while a tool call"),
    ("filter", [openai_chunk({}, "content_filter"), DONE],
     "the answer was cut: finish_reason 'content_filter' (the provider's content filter)"),
    ("error", [HI, sse({"error": {"message": "Crash", "type": "s_e"}})],
     "the stream reported an error: s_e: Crash"),
    ("error-event", [sse({"error": "busy"}, "error")], "the stream reported an error: busy"),
    ("error-text", [b"event: error\ndata: gone\n\n"], "the stream reported an error: gone"),
    ("not-json", [b'data: {"choices": [\n\n'],
     'malformed event: its data is not JSON: {"choices": ['),
    ("not-object", [b"data: [1, 2]\n\n"],
     "malformed event: its data is not a JSON object: [1, 2]"),
    ("no-choices", [sse({"id": "x"})], "malformed event: a chunk without a choices list"),
    ("choice", [sse({"choices": [1]})],
     "malformed event: a choice that is not an object with a delta object"),
    ("delta", [sse({"choices": [{"delta": []}]})],
     "malformed event: a choice that is not an object with a delta object"),
    ("content", [openai_chunk({"content": 5})], "malformed event: delta.content is not a string"),
    ("calls", [openai_chunk({"tool_calls": {}})],
     "malformed event: delta.tool_calls is not a list"),
    ("fragment", [openai_chunk({"tool_calls": [1]})],
     "malformed event: a tool-call fragment that is not an object"),
    ("index", [openai_chunk({"tool_calls": [{"index": "0"}]})],
     "malformed event: a tool-call fragment without an int index or a function"),
    ("function", [openai_chunk({"tool_calls": [{"function": []}]})],
     "malformed event: a tool-call fragment without an int index or a function"),
    ("arguments", [openai_chunk({"tool_calls": [{"function": OBJECT}]})],
     "malformed event: tool-call arguments that are not a string"),
    (
        "continued",
        [*[openai_call(n, str(n), "add", "{}") for n in (0, 1)], openai_call(0, None, None, "1")],
        "malformed event: tool call 0 continues after it was complete",
    ),
    ("no-name", [openai_call(0, "a", None, "{}"), STOP, DONE],
     "malformed event stream: a tool call has no name (None)"),
    ("bad-json", [openai_call(0, "a", "add", '{"left": 1,'), STOP, DONE],
     "tool call 'add' has arguments that are not JSON ("),
    ("bad-json-quoted", [openai_call(0, "a", "add", '{"left": 1,'), STOP, DONE], '): {"left": 1,'),
    ("array", [openai_call(0, "a", "add", "[1]"), STOP, DONE],
     "tool call 'add' has arguments that are not a JSON object: [1]"),
    ("utf-8", [b"data: \xff\xfe\n\n"],
     "malformed event stream: it is not UTF-8 ('utf-8' codec can't decode byte 0xff"),
    ("reasoning", [openai_chunk({"reasoning_content": 1})],
     "malformed event: delta.reasoning is not a string"),
    ("deep", [b"data: " + DEEP.encode() + b"\n\n"], NESTED),
    ("deep-arguments", [openai_call(0, "c1", "add", DEEP), openai_chunk({}, "tool_calls"), DONE],
     NESTED),
    ("usage-list", [openai_usage([1]), DONE], "malformed event: usage is not an object"),
    *[
        (name, [openai_usage(usage), DONE], words)
        for name, usage, words in [
            ("prompt-str", {"prompt_tokens": "7"},
             "malformed event: usage prompt_tokens is not an int >= 0"),
            ("output-bool", {"completion_tokens": True},
             "malformed event: usage completion_tokens is not an int >= 0"),
            ("prompt-negative", {"prompt_tokens": -1},
             "malformed event: usage prompt_tokens is not an int >= 0"),
            ("details-int", {"prompt_tokens_details": 3},
             "malformed event: prompt details is not an object"),
            ("completion-details", {"completion_tokens_details": []},
             "malformed event: completion details is not an object"),
            ("reasoning-float", {"completion_tokens_details": {"reasoning_tokens": 1.0}},
             "malformed event: usage reasoning_tokens is not an int >= 0"),
            (
                "cached-over-prompt",
                {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}},
                "malformed event: usage with more cached tokens than prompt tokens",
            ),
        ]
    ],
    *[
        (f"after-the-finish-{name}", [HI, STOP, openai_usage(usage), DONE],
         f"malformed event: {words}")
        for name, usage, words in [
            ("usage-int", 5, "usage is not an object"),
            ("completion-float", {"completion_tokens": 1.5},
             "usage completion_tokens is not an int >= 0"),
            ("details-list", {"prompt_tokens_details": []}, "prompt details is not an object"),
            ("cached-str", {"prompt_tokens_details": {"cached_tokens": "2"}},
             "usage cached_tokens is not an int >= 0"),
            ("completion-details-int", {"completion_tokens_details": 1},
             "completion details is not an object"),
            ("reasoning-negative", {"completion_tokens_details": {"reasoning_tokens": -3}},
             "usage reasoning_tokens is not an int >= 0"),
            (
                "cached-over-prompt",
                {"prompt_tokens": 1, "prompt_tokens_details": {"cached_tokens": 2}},
                "usage with more cached tokens than prompt tokens",
            ),
        ]
    ],
]  # fmt: skip
ANTHROPIC_BROKEN: List[Tuple[str, List[bytes], str]] = [
    ("no-stop", [MESSAGE_START, *anthropic_text(0, "Hi"), anthropic_end()[0]],
     "the stream ended before message_stop: the answer is incomplete"),
    *[
        (stop, [MESSAGE_START, *anthropic_end(stop)],
         f"the answer was cut: stop_reason {stop!r} ({meaning})")
        for stop, meaning in [
            ("max_tokens", "the max_tokens limit"),
            ("refusal", "the provider's safety classifier"),
            ("pause_turn", "a paused turn, which this adapter does not resume"),
            ("model_context_window_exceeded", "the model's context window"),
        ]
    ],
    ("error-event", [MESSAGE_START, sse({"error": {"type": "o_e", "message": "Busy"}}, "error")],
     "the stream reported an error: o_e: Busy"),
    ("error-type", [sse({"type": "error", "error": {"type": "api_error", "message": "Boom"}})],
     "the stream reported an error: api_error: Boom"),
    ("error-nested-too-deeply", [b"event: error\ndata: " + DEEP.encode() + b"\n\n"],
     "the stream reported an error: " + "[" * 200 + "..."),
    ("not-json", [b"event: message_start\ndata: {\n\n"],
     "malformed event: its data is not JSON: {"),
    ("unstarted-delta", [anthropic_text(0, "x")[1]],
     "malformed event: an index that is not a started block's"),
    ("unstarted-stop", [anthropic_text(3)[1]],
     "malformed event: an index that is not a started block's"),
    ("restarted", [TEXT_START, TEXT_START], "malformed event: an index that is not a new block's"),
    ("reused", [MESSAGE_START, *anthropic_text(0, "a"), TEXT_START],
     "malformed event: an index that is not a new block's"),
    ("index", [anthropic_start("0", {"type": "text"})],
     "malformed event: an index that is not a new block's"),
    ("block", [anthropic_start(0, "text")],
     "malformed event: content_block_start without a content_block object"),
    ("start-text", [anthropic_start(0, {"type": "text", "text": 1})],
     "malformed event: text that is not a string"),
    ("delta", [TEXT_START, anthropic_event("content_block_delta", index=0, delta="x")],
     "malformed event: content_block_delta without a delta object"),
    ("delta-text", [TEXT_START, anthropic_delta(0, type="text_delta", text=None)],
     "malformed event: text that is not a string"),
    ("no-partial-json", [TOOL_START, anthropic_delta(0, type="input_json_delta")],
     "malformed event: input_json_delta without a tool_use block or partial_json"),
    ("message-delta", [anthropic_event("message_delta", delta=None)],
     "malformed event: message_delta without a delta object"),
    ("stop-reason-not-str", [anthropic_event("message_delta", delta={"stop_reason": ["refusal"]})],
     "malformed event: a stop_reason that is not a string"),
    *[
        (f"open-{name}", [MESSAGE_START, *block, *end],
         f"malformed event: message_stop before block {i} stopped")
        for name, block, end, i in [
            ("tool", anthropic_tool(0, "t", "add", "{}")[:2], anthropic_end()[1:], 0),
            ("thinking", anthropic_thinking(0, "hm", signature=None)[:2], anthropic_end()[1:], 0),
            ("text", [*anthropic_text(0, "a"), *anthropic_text(1, "b")[:2]], anthropic_end(), 1),
            ("other", [anthropic_start(0, {"type": "server_tool_use"})], anthropic_end()[1:], 0),
        ]
    ],
    (
        "bad-json",
        [MESSAGE_START, *anthropic_tool(0, "t", "add", '{"a": '), *anthropic_end("tool_use")],
        "tool call 'add' has arguments that are not JSON (",
    ),
    ("no-name", [MESSAGE_START, *anthropic_tool(0, "t", "", "{}"), *anthropic_end("tool_use")],
     "malformed event stream: a tool call has no name ('')"),
    ("deep", [b"event: message_start\ndata: " + DEEP.encode() + b"\n\n"], NESTED),
    ("deep-arguments", [MESSAGE_START, *anthropic_tool(0, "t1", "add", DEEP), *anthropic_end()],
     NESTED),
    *[
        (name, [MESSAGE_START, start, delta], words)
        for name, start, delta, words in [
            (
                "thinking-for-text",
                TEXT_START,
                anthropic_delta(0, type="thinking_delta", thinking="x"),
                "malformed event: thinking_delta for a block that is not thinking",
            ),
            (
                "signature-for-text",
                TEXT_START,
                anthropic_delta(0, type="signature_delta", signature="s"),
                "malformed event: signature_delta for a block that is not thinking",
            ),
            ("text-for-tool", TOOL_START, anthropic_delta(0, type="text_delta", text="x"),
             "malformed event: text_delta for a block that is not text"),
            (
                "json-for-text",
                TEXT_START,
                anthropic_delta(0, type="input_json_delta", partial_json="{}"),
                "malformed event: input_json_delta without a tool_use block or partial_json",
            ),
            ("text-for-thinking", THINKING_START, anthropic_delta(0, type="text_delta", text="x"),
             "malformed event: text_delta for a block that is not text"),
            (
                "json-for-thinking",
                THINKING_START,
                anthropic_delta(0, type="input_json_delta", partial_json="{}"),
                "malformed event: input_json_delta without a tool_use block or partial_json",
            ),
            (
                "thinking-not-str",
                THINKING_START,
                anthropic_delta(0, type="thinking_delta", thinking=5),
                "malformed event: thinking that is not a string",
            ),
            (
                "signature-not-str",
                THINKING_START,
                anthropic_delta(0, type="signature_delta", signature=["s"]),
                "malformed event: a signature that is not a string",
            ),
        ]
    ],
    *[
        (name, [MESSAGE_START, TEXT_START, usage_delta(usage)], words)
        for name, usage, words in [
            ("usage-list", [1], "malformed event: usage is not an object"),
            ("usage-negative", {"output_tokens": -1},
             "malformed event: usage output_tokens is not an int >= 0"),
            ("usage-bool", {"input_tokens": True},
             "malformed event: usage input_tokens is not an int >= 0"),
            ("usage-str", {"cache_read_input_tokens": "5"},
             "malformed event: usage cache_read_input_tokens is not an int >= 0"),
        ]
    ],
    ("redacted-empty", [MESSAGE_START, *anthropic_redacted(0, "")],
     "malformed event: a redacted_thinking block without its data"),
    (
        "redacted-no-data",
        [MESSAGE_START, anthropic_start(0, {"type": "redacted_thinking"}), anthropic_text(0)[-1]],
        "malformed event: a redacted_thinking block without its data",
    ),
    ("message-not-object", [anthropic_event("message_start", message="msg_1")],
     "malformed event: message_start's message is not an object"),
    (
        "message-start-usage",
        [anthropic_event("message_start", message={"usage": {"input_tokens": -1}})],
        "malformed event: usage input_tokens is not an int >= 0",
    ),
    *[
        (name, [MESSAGE_START, anthropic_start(0, block)], words)
        for name, block, words in [
            ("start-thinking-not-str", {"type": "thinking", "thinking": 5},
             "malformed event: thinking that is not a string"),
            ("start-signature-not-str", {"type": "thinking", "thinking": "", "signature": 5},
             "malformed event: a signature that is not a string"),
        ]
    ],
]  # fmt: skip
BROKEN_ANSWERS = [
    pytest.param(provider, parts, words, id=f"{provider}-{name}")
    for provider, rows in [("openai", OPENAI_BROKEN), ("anthropic", ANTHROPIC_BROKEN)]
    for name, parts, words in rows
]


REPORTED = "the stream reported an error: "
CUT = re.compile(r"the answer was cut: (?:finish|stop)_reason '(\w+)'")


def failure_kind(words: str) -> Tuple[type, Optional[bool]]:
    """What a refusal is, by its words: what the provider said (a cut, an error event) is
    a ProviderError; the rest is about the bytes, a ProviderProtocolError, incomplete or
    malformed."""
    if words.startswith(("the answer was cut", REPORTED)):
        return providers.ProviderError, None
    return providers.ProviderProtocolError, "the answer is incomplete" in words


def what_it_carries(words: str) -> Tuple[Optional[str], Optional[str], bool]:
    """By a refusal's words: its error_type (an error event's type, said before its
    message), its finish_reason (a cut's), and whether the cut was the context window."""
    reported = words[len(REPORTED) :] if words.startswith(REPORTED) else ""
    error_type = reported.split(": ")[0] if ": " in reported else None
    cut = CUT.match(words)
    reason = cut.group(1) if cut else None
    return error_type, reason, reason == "model_context_window_exceeded"


UNQUOTED = (
    "malformed event: its data is not",  # quotes the data as it came, not as JSON
    "malformed event: JSON nested too deeply",
)


def quoted_events(parts: List[bytes]) -> List[str]:
    """How a refusal quotes each JSON object event of parts: the object in JSON, cut to
    200 characters."""
    quoted = []
    for line in b"".join(parts).decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            with contextlib.suppress(ValueError, RecursionError):
                text = json.dumps(json.loads(line[len("data: ") :]))
                quoted.append(text if len(text) <= 200 else text[:200] + "...")
    return quoted


class TestIncompleteAnswers:
    """Never accept a broken answer: the parser refuses each case and says what happened."""

    @pytest.mark.parametrize(("provider", "parts", "words"), BROKEN_ANSWERS)
    def test_a_broken_answer_is_refused_saying_why(
        self, provider: str, parts: List[bytes], words: str
    ) -> None:
        with pytest.raises(providers.ProviderError) as caught:
            parsed(new_answer(provider), *parts)
        error = caught.value
        assert words in str(error)
        assert (error.status, error.retry_after, error.code) == (None, None, None)
        kind, incomplete = failure_kind(words)
        assert type(error) is kind
        assert getattr(error, "incomplete", None) is incomplete
        assert (error.error_type, error.finish_reason, error.context_exceeded) == (
            what_it_carries(words)
        )
        message = str(error)
        if message.startswith("malformed event: ") and not message.startswith(UNQUOTED):
            # The rest of a malformed event's refusal quotes the event that broke the rule.
            assert any(message.endswith(": " + quoted) for quoted in quoted_events(parts)), message

    @PROVIDERS
    def test_a_broken_answer_fails_the_run_and_adds_nothing(self, provider: str) -> None:
        events, result = settle_prompt(canned_model(provider, answer_parts(provider, ["Hi"])[:-2]))
        error = assert_stream_error(
            result,
            "ended before",
            "the answer is incomplete",
            kind=providers.ProviderProtocolError,
        )
        assert (error.status, error.retry_after) == (None, None)
        assert result.messages == (al.UserMessage("user-001", "What is 2 + 3?"),)
        assert [event.type for event in events] == [
            "message.accepted",
            "model.chunk",
            "run.finished",
        ]

    @PROVIDERS
    def test_no_response_without_the_end_marker(self, provider: str) -> None:
        with pytest.raises(providers.ProviderProtocolError, match="the answer is incomplete"):
            new_answer(provider).response()

    def test_the_end_of_the_input_after_the_marker_is_fine(self) -> None:
        answer = new_answer("openai")
        assert answer.feed(OPENAI_TEXT_STREAM) == [
            al.TextDelta("request-001", "Hello"),
            al.TextDelta("request-001", ", world"),
        ]
        assert answer.feed(b"") == []
        assert answer.response().content == (al.TextBlock("Hello, world"),)


def anthropic_message_start(usage: Dict[str, Any]) -> bytes:
    """message_start with the usage of the answer so far."""
    return anthropic_event("message_start", message={"id": "m", "content": [], "usage": usage})


SEVEN_IN = {"prompt_tokens": 7, "completion_tokens": 2}
CUT_CALL = openai_call(0, "c1", "add", '{"left": ')
# Failed answers after the provider reported usage, the words of the failure, and the
# usage it reported. OpenAI's usage chunk comes after the cut's finish, and is read.
FAILED_WITH_USAGE = [
    pytest.param(
        "openai",
        [HI, openai_chunk({}, "length"), openai_usage(SEVEN_IN), DONE],
        "the answer was cut: finish_reason 'length' (the token limit)",
        al.Usage(7, 2),
        id="openai-length",
    ),
    pytest.param(
        "openai",
        [HI, openai_chunk({}, "length"), openai_usage(SEVEN_IN)],
        "the answer was cut: finish_reason 'length' (the token limit)",
        al.Usage(7, 2),
        id="openai-length-then-the-end-of-the-input",
    ),
    pytest.param(
        "openai",
        [HI, openai_chunk({}, "content_filter"), openai_usage(SEVEN_IN), DONE],
        "the answer was cut: finish_reason 'content_filter'",
        al.Usage(7, 2),
        id="openai-content-filter",
    ),
    pytest.param(
        "openai",
        [HI, CUT_CALL, openai_chunk({}, "length"), openai_usage(SEVEN_IN), DONE],
        "the answer was cut: finish_reason 'length' (the token limit) while a tool call",
        al.Usage(7, 2),
        id="openai-length-in-a-tool-call",
    ),
    pytest.param(
        "openai",
        [HI, openai_chunk({}, "length"), DONE],
        "the answer was cut: finish_reason 'length' (the token limit)",
        None,
        id="openai-no-usage-chunk",
    ),
    pytest.param(
        "openai",
        [HI, openai_chunk({}, "length"), openai_chunk({"content": "more"}), DONE],
        "the answer was cut: finish_reason 'length' (the token limit)",
        None,
        id="openai-nothing-after-the-cut-is-the-answer",
    ),
    pytest.param(
        "anthropic",
        [
            anthropic_message_start({"input_tokens": 9, "output_tokens": 1}),
            *anthropic_text(0, "Hi"),
            anthropic_end("refusal", {"output_tokens": 5})[0],  # it fails here, at once
        ],
        "the answer was cut: stop_reason 'refusal'",
        al.Usage(9, 5),
        id="anthropic-refusal",
    ),
    pytest.param(
        "anthropic",
        [
            anthropic_message_start({"input_tokens": 9, "output_tokens": 1}),
            *anthropic_text(0, "Hi")[:2],
        ],
        "the stream from http://canned/v1/messages ended before message_stop",
        al.Usage(9, 1),
        id="anthropic-broken",
    ),
]


class TestWhatAFailedAnswerCost:
    """ProviderError.usage: what the provider reported for an answer that then failed;
    the run's own usage counts only the responses it appended."""

    @pytest.mark.parametrize(("provider", "parts", "words", "usage"), FAILED_WITH_USAGE)
    def test_the_error_carries_the_usage_the_provider_reported(
        self, provider: str, parts: List[bytes], words: str, usage: Optional[al.Usage]
    ) -> None:
        model = canned_model(provider, parts)
        (exchange,) = exchanges(model)
        events, result = settle_prompt(model)
        error = assert_stream_error(result, words)
        assert error.usage == usage
        assert chunk_texts(events) == ["Hi"]
        assert exchange.reads >= len(parts)  # every part read: the usage after a cut too
        assert result.usage is None  # no response was appended

    def test_a_retried_answer_keeps_the_usage_of_its_last_attempt(self) -> None:
        attempts = [
            [anthropic_message_start({"input_tokens": tokens, "output_tokens": 1})]
            for tokens in (9, 10)
        ]
        model = canned_anthropic(*attempts, retries=1)
        _, result = settle_prompt(model, signal=Hurried())
        error = assert_stream_error(result, "ended before message_stop", "(after 1 retry)")
        assert error.usage == al.Usage(10, 1)

    def test_the_run_sums_the_responses_it_appended_and_not_the_failed_one(self) -> None:
        model = canned_openai(
            [
                *answer_parts("openai", [("c1", "add", ADD)])[:-1],
                openai_usage({"prompt_tokens": 20, "completion_tokens": 5}),
                DONE,
            ],
            [HI, openai_chunk({}, "length"), openai_usage(SEVEN_IN), DONE],
        )
        _, result = settle_prompt(model)
        error = assert_stream_error(result, "finish_reason 'length'")
        assert result.usage == al.Usage(20, 5)
        assert error.usage == al.Usage(7, 2)
