"""Tests of agent_loop_providers.py: the adapters and their wire formats, from bytes alone.

The layer tested here is sans-IO, through its public names: request bodies from
``openai_request_body()`` / ``anthropic_request_body()`` (and the requests a model sends),
answers by feeding byte-exact event streams to ``OpenAIAnswer`` / ``AnthropicAnswer``,
heads to ``check_response_head()``. Streams through ``stream()`` and ``run_agent_loop``
read canned bytes through the models' public seam, ``transport=`` (``CannedTransport``,
below), so the loop's own limit checks judge them. No test here opens a socket or starts
a process: what needs one (connecting, timeouts, TLS, the default transport's failures,
cancellation, closing, llmock) is in test_agent_loop_providers_connection.py, and the
command line in test_agent_loop_cli.py. The builders that both files use (event streams,
the transport seam's ``Canned`` exchanges, ``settle_prompt``...) are in
loop_testing_providers.py.
"""

from __future__ import annotations

import copy
import email.utils
import json
import logging
import re
import ssl
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union, cast

import pytest

import agent_loop as al
import agent_loop_providers as providers
from loop_testing import add_tool, documentation
from loop_testing_providers import (
    DONE,
    MESSAGE_START,
    OPENAI_REASONING_STREAM,
    OPENAI_TEXT_STREAM,
    OPENAI_TOOL_STREAM,
    PROVIDERS,
    REASONING_USAGE,
    REQUEST_HISTORY,
    ROLE,
    SPECS,
    STOP,
    AnswerItem,
    AnyModel,
    Attempt,
    Canned,
    CannedTransport,
    Hurried,
    answer_parts,
    anthropic_delta,
    anthropic_end,
    anthropic_event,
    anthropic_sent_result,
    anthropic_start,
    anthropic_stop,
    anthropic_text,
    anthropic_thinking,
    anthropic_tool,
    assert_stream_error,
    backoff_bounds,
    canned_anthropic,
    canned_model,
    canned_openai,
    chunk_texts,
    exchanges,
    in_pieces,
    openai_call,
    openai_chunk,
    openai_sent_call,
    posted,
    request,
    retry_logs,
    settle_prompt,
    sse,
    stream,
)

# --- Builders -----------------------------------------------------------------------


def anthropic_redacted(index: int, data: str) -> List[bytes]:
    """A redacted_thinking block: whole in its start, no delta."""
    block = {"type": "redacted_thinking", "data": data}
    return [
        anthropic_start(index, block),
        anthropic_stop(index),
    ]


def openai_usage(usage: Any) -> bytes:
    """The usage chunk: an empty choices list, and the usage of the whole request."""
    data = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [], "usage": usage}
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def anthropic_sent_use(id: str, name: str, arguments: Dict[str, Any]) -> Dict[str, Any]:
    """A tool call as the Anthropic adapter sends it back."""
    return {"type": "tool_use", "id": id, "name": name, "input": arguments}


Answer = Union[providers.OpenAIAnswer, providers.AnthropicAnswer]


def new_answer(provider: str, accept_truncated: bool = False) -> Answer:
    """The provider's answer parser for request()."""
    if provider == "openai":
        return providers.OpenAIAnswer(request(), accept_truncated=accept_truncated)
    return providers.AnthropicAnswer(request(), accept_truncated=accept_truncated)


MODEL_CLASSES = {
    "openai": providers.OpenAIChatModel,
    "anthropic": providers.AnthropicMessagesModel,
}
ADD = {"left": 1, "right": 2}
CANNED_URL = {
    "openai": "http://canned/v1/chat/completions",
    "anthropic": "http://canned/v1/messages",
}
TOKEN_LIMIT = {"openai": "length", "anthropic": "max_tokens"}
"""The finish (OpenAI) or stop (Anthropic) reason of an answer cut by the token limit."""


# A byte-exact recording, in the shape Anthropic sends it (a ping event too).
ANTHROPIC_STREAM = (
    b"event: message_start\n"
    b'data: {"type":"message_start","message":{"id":"msg_01","type":"message","role":'
    b'"assistant","content":[],"model":"claude","stop_reason":null,"usage":{"input_tokens":9,'
    b'"output_tokens":1}}}\n\n'
    b"event: content_block_start\n"
    b'data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}'
    b"\n\n"
    b'event: ping\ndata: {"type": "ping"}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":'
    b'"Adding."}}\n\n'
    b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
    b"event: content_block_start\n"
    b'data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":'
    b'"toolu_01","name":"add","input":{}}}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta",'
    b'"partial_json":""}}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta",'
    b'"partial_json":"{\\"left\\": 2, \\"right\\""}}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta",'
    b'"partial_json":": 3}"}}\n\n'
    b'event: content_block_stop\ndata: {"type":"content_block_stop","index":1}\n\n'
    b"event: message_delta\n"
    b'data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},'
    b'"usage":{"output_tokens":20}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)

# Anthropic's "Streaming Messages" documentation, "Streaming request with extended
# thinking" (the request: thinking {"type": "enabled", "budget_tokens": 16000}, the
# prompt "What is 27 * 453?"), verbatim. It reports no usage.
ANTHROPIC_THINKING_STREAM = (
    b"event: message_start\n"
    b'data: {"type": "message_start", "message": {"id": "msg_01...", "type": "message", '
    b'"role": "assistant", "content": [], "model": "claude-opus-4-1-20250805", '
    b'"stop_reason": null, "stop_sequence": null}}\n\n'
    b"event: content_block_start\n"
    b'data: {"type": "content_block_start", "index": 0, '
    b'"content_block": {"type": "thinking", "thinking": ""}}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type": "content_block_delta", "index": 0, '
    b'"delta": {"type": "thinking_delta", '
    b'"thinking": "Let me solve this step by step:\\n\\n1. First break down 27 * 453"}}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type": "content_block_delta", "index": 0, '
    b'"delta": {"type": "thinking_delta", "thinking": "\\n2. 453 = 400 + 50 + 3"}}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type": "content_block_delta", "index": 0, '
    b'"delta": {"type": "thinking_delta", "thinking": "\\n3. 27 * 400 = 10,800"}}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type": "content_block_delta", "index": 0, '
    b'"delta": {"type": "thinking_delta", "thinking": "\\n4. 27 * 50 = 1,350"}}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type": "content_block_delta", "index": 0, '
    b'"delta": {"type": "thinking_delta", "thinking": "\\n5. 27 * 3 = 81"}}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type": "content_block_delta", "index": 0, '
    b'"delta": {"type": "thinking_delta", '
    b'"thinking": "\\n6. 10,800 + 1,350 + 81 = 12,231"}}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type": "content_block_delta", "index": 0, '
    b'"delta": {"type": "signature_delta", '
    b'"signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds..."}}\n\n'
    b"event: content_block_stop\n"
    b'data: {"type": "content_block_stop", "index": 0}\n\n'
    b"event: content_block_start\n"
    b'data: {"type": "content_block_start", "index": 1, "content_block": {"type": "text", '
    b'"text": ""}}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", '
    b'"text": "27 * 453 = 12,231"}}\n\n'
    b"event: content_block_stop\n"
    b'data: {"type": "content_block_stop", "index": 1}\n\n'
    b"event: message_delta\n"
    b'data: {"type": "message_delta", "delta": {"stop_reason": "end_turn", '
    b'"stop_sequence": null}}\n\n'
    b"event: message_stop\n"
    b'data: {"type": "message_stop"}\n\n'
)


def parsed(answer: Answer, *parts: bytes) -> Tuple[List[al.ModelChunk], al.ModelResponse]:
    """Feeds an answer its parts, then the end of the input: its chunks and response."""
    chunks = [chunk for part in parts for chunk in answer.feed(part)]
    chunks.extend(answer.feed(b""))
    return chunks, answer.response()


def assert_protocol_error(result: al.RunResult, words: str) -> None:
    """The run failed MODEL_PROTOCOL_ERROR saying words, and added nothing."""
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.code == "MODEL_PROTOCOL_ERROR"
    assert words in result.error.message
    assert len(result.messages) == 1


# --- Public classes -----------------------------------------------------------------


class TestConstruction:
    """Arguments are checked when a model is built; errors name the parameter."""

    def test_defaults(self) -> None:
        openai_model = providers.OpenAIChatModel("gpt-4o")
        anthropic_model = providers.AnthropicMessagesModel("claude")
        assert openai_model.base_url == "https://api.openai.com/v1"
        assert anthropic_model.base_url == "https://api.anthropic.com"
        assert (openai_model.timeout, anthropic_model.timeout) == (60.0, 60.0)
        assert anthropic_model.max_tokens == 4096
        assert openai_model.options == {}
        assert openai_model.system is None
        assert (openai_model.retries, anthropic_model.retries) == (2, 2)
        assert openai_model.ssl_context is None  # the default context, made when needed
        assert not anthropic_model.accept_truncated
        assert (openai_model.max_concurrency, anthropic_model.max_concurrency) == (None, None)
        assert openai_model.require_finish_reason is True

    def test_a_trailing_slash_is_dropped_and_an_int_timeout_is_seconds(self) -> None:
        model = providers.OpenAIChatModel("m", base_url="http://localhost:11434/v1/", timeout=2)
        assert model.base_url == "http://localhost:11434/v1"
        assert model.timeout == 2.0

    @pytest.mark.parametrize(
        ("arguments", "error", "words"),
        [
            pytest.param({"model": 1}, TypeError, "model must be a str", id="model-type"),
            pytest.param({"model": ""}, ValueError, "model must name", id="model-empty"),
            pytest.param({"base_url": b"x"}, TypeError, "base_url must be a str", id="url-type"),
            pytest.param({"base_url": "ftp://h"}, ValueError, "base_url must be", id="scheme"),
            pytest.param({"base_url": "http://"}, ValueError, "base_url must be", id="no-host"),
            pytest.param({"base_url": "http://h/?a=1"}, ValueError, "no query", id="query"),
            pytest.param({"base_url": "http://h/#a"}, ValueError, "base_url", id="fragment"),
            pytest.param({"base_url": "http://h:x/"}, ValueError, "invalid port", id="port"),
            pytest.param({"api_key": 1}, TypeError, "api_key must be a str", id="api-key"),
            pytest.param({"system": 1}, TypeError, "system must be a str", id="system"),
            pytest.param({"timeout": True}, TypeError, "timeout must be a number", id="bool"),
            pytest.param({"timeout": "1"}, TypeError, "timeout must be a number", id="str"),
            pytest.param({"timeout": 0}, ValueError, "timeout must be a finite", id="zero"),
            pytest.param({"timeout": -1.0}, ValueError, "timeout must be", id="negative"),
            pytest.param({"timeout": float("inf")}, ValueError, "timeout must be", id="inf"),
            pytest.param({"options": [1]}, TypeError, "options must be a mapping", id="opt-type"),
            pytest.param({"options": {"a": {1}}}, TypeError, "options must be plain", id="set"),
            pytest.param(
                {"options": {"a": float("nan")}}, TypeError, "options must be plain", id="nan"
            ),
            pytest.param(
                {"options": {"messages": [], "stream": False}},
                ValueError,
                "options may not set messages, stream",
                id="owned",
            ),
            pytest.param({"retries": True}, TypeError, "retries must be an int", id="retry-bool"),
            pytest.param({"retries": 1.0}, TypeError, "retries must be an int", id="retry-float"),
            pytest.param(
                {"retries": -1}, ValueError, r"retries must be an int >= 0 \(0: no", id="retry-neg"
            ),
            pytest.param(
                {"ssl_context": "ca.pem"}, TypeError, "ssl_context must be an ssl", id="ssl"
            ),
            pytest.param(
                {"accept_truncated": 1}, TypeError, "accept_truncated must be a bool", id="cut"
            ),
            *[
                pytest.param({"max_concurrency": value}, error, words, id=f"concurrency-{name}")
                for name, value, error, words in [
                    ("bool", True, TypeError, "max_concurrency must be an int or None, got True"),
                    ("float", 2.0, TypeError, "max_concurrency must be an int or None, got 2.0"),
                    ("str", "2", TypeError, "max_concurrency must be an int or None, got '2'"),
                    ("zero", 0, ValueError, r"max_concurrency must be an int >= 1 \(None: no"),
                    ("negative", -1, ValueError, "max_concurrency must be an int >= 1 .*got -1"),
                ]
            ],
        ],
    )
    @pytest.mark.parametrize(
        "model_class", [providers.OpenAIChatModel, providers.AnthropicMessagesModel]
    )
    def test_bad_arguments(
        self, model_class: Any, arguments: Dict[str, Any], error: type, words: str
    ) -> None:
        arguments = {"model": "m", **arguments}
        with pytest.raises(error, match=words):
            model_class(arguments.pop("model"), **arguments)

    @pytest.mark.parametrize(
        ("thinking", "sent"),
        [
            pytest.param(None, None, id="none"),
            pytest.param("adaptive", {"type": "adaptive"}, id="adaptive"),
            pytest.param(
                {"type": "enabled", "budget_tokens": 2048},
                {"type": "enabled", "budget_tokens": 2048},
                id="enabled",
            ),
            pytest.param(
                {"type": "some_future_mode", "effort": "low"},
                {"type": "some_future_mode", "effort": "low"},
                id="passed-through",
            ),
        ],
    )
    def test_thinking_is_the_apis_setting(self, thinking: Any, sent: Any) -> None:
        model = canned_anthropic(thinking=thinking)
        assert model.thinking == sent
        body = posted(model, request())["body"]
        assert body.get("thinking") == sent
        assert ("thinking" in body) is (sent is not None)
        assert (
            json.loads(providers.anthropic_request_body(request(), "m", thinking=thinking)).get(
                "thinking"
            )
            == sent
        )

    @pytest.mark.parametrize(
        ("arguments", "error", "words"),
        [
            pytest.param({"max_tokens": True}, TypeError, "max_tokens must be an int", id="bool"),
            pytest.param({"max_tokens": 1.5}, TypeError, "max_tokens must be an int", id="float"),
            pytest.param({"max_tokens": 0}, ValueError, "an int >= 1, got 0", id="tokens-zero"),
            *[
                pytest.param({"thinking": thinking}, error, words, id=name)
                for name, thinking, error, words in [
                    ("str", "enabled", ValueError, "thinking must be None, 'adaptive' or"),
                    ("int", 2048, TypeError, "thinking must be None, 'adaptive' or a"),
                    ("thinking-bool", True, TypeError, "got bool"),
                    ("type", {"budget_tokens": 2048}, ValueError, "must say its 'type'"),
                    ("type-int", {"type": 1}, ValueError, "must say its 'type'"),
                    ("json", {"type": "enabled", "x": {1}}, TypeError, "plain JSON"),
                ]
            ],
            pytest.param(
                {"options": {"thinking": {}}}, ValueError, "may not set thinking", id="thinking"
            ),
            pytest.param(
                {"options": {"max_tokens": 1, "system": "x"}},
                ValueError,
                "options may not set max_tokens, system",
                id="owned",
            ),
        ],
    )
    def test_bad_anthropic_arguments(
        self, arguments: Dict[str, Any], error: type, words: str
    ) -> None:
        with pytest.raises(error, match=words):
            providers.AnthropicMessagesModel("m", **arguments)

    def test_what_a_function_returns_may_not_set_thinking(self) -> None:
        model = canned_anthropic([], options=lambda model_request: {"thinking": {}})
        with pytest.raises(ValueError, match="what options returns may not set thinking"):
            stream(model)
        assert cast(CannedTransport, model.transport).opened == 0  # nothing was sent

    def test_options_may_set_what_the_provider_does_not_own(self) -> None:
        openai_model = providers.OpenAIChatModel("m", options={"max_tokens": 100})
        assert openai_model.options == {"max_tokens": 100}

    def test_the_settings_are_copied(self) -> None:
        setting: Dict[str, Any] = {"type": "enabled", "budget_tokens": 2048}
        options: Dict[str, Any] = {"temperature": 0.5, "stop": ["x"]}
        model = providers.AnthropicMessagesModel("m", thinking=setting, options=options)
        setting["budget_tokens"] = 1
        options["stop"].append("y")
        assert model.thinking == {"type": "enabled", "budget_tokens": 2048}
        assert model.options == {"temperature": 0.5, "stop": ["x"]}

    def test_retries_0_and_a_context_are_kept(self) -> None:
        context = ssl.create_default_context()
        model = providers.OpenAIChatModel("m", retries=0, ssl_context=context)
        assert (model.retries, model.ssl_context) == (0, context)

    @pytest.mark.parametrize("limit", [1, 64])
    @PROVIDERS
    def test_a_positive_max_concurrency_is_kept(self, provider: str, limit: int) -> None:
        assert MODEL_CLASSES[provider]("m", max_concurrency=limit).max_concurrency == limit

    @pytest.mark.parametrize("value", [1, "yes", None])
    def test_require_finish_reason_is_a_bool(self, value: Any) -> None:
        with pytest.raises(TypeError, match="require_finish_reason must be a bool, got "):
            providers.OpenAIChatModel("m", require_finish_reason=value)
        assert not providers.OpenAIChatModel(
            "m", require_finish_reason=False
        ).require_finish_reason

    def test_provider_error_carries_status_retry_after_error_type_and_usage(self) -> None:
        usage = al.Usage(input_tokens=10, output_tokens=3)
        error = providers.ProviderError(
            "busy", status=429, retry_after=1.5, error_type="rate_limit_error", usage=usage
        )
        assert (str(error), error.status, error.retry_after) == ("busy", 429, 1.5)
        assert (error.error_type, error.usage) == ("rate_limit_error", usage)
        plain = providers.ProviderError("broken")
        assert (plain.status, plain.retry_after, plain.error_type, plain.usage) == (None,) * 4

    def test_the_subclasses_say_what_failed(self) -> None:
        broken = providers.ProviderConnectionError("the connection to u broke")
        cut = providers.ProviderProtocolError("the stream ended", incomplete=True)
        bad = providers.ProviderProtocolError("malformed event: x", usage=al.Usage(1))
        assert isinstance(broken, providers.ProviderError)
        assert (broken.status, broken.retry_after, broken.usage) == (None, None, None)
        assert isinstance(cut, providers.ProviderError)
        assert (cut.incomplete, bad.incomplete, bad.usage) == (True, False, al.Usage(1))
        assert (cut.status, cut.retry_after, cut.error_type) == (None, None, None)

    def test_all_names_the_public_api(self) -> None:
        assert providers.__all__ == [
            "OpenAIChatModel",
            "AnthropicMessagesModel",
            "ProviderError",
            "ProviderConnectionError",
            "ProviderProtocolError",
            "Transport",
            "Exchange",
            "openai_request_body",
            "anthropic_request_body",
            "ANTHROPIC_VERSION",
            "check_response_head",
            "ServerSentEvent",
            "ServerSentEvents",
            "MAX_EVENT_SIZE",
            "OpenAIAnswer",
            "AnthropicAnswer",
        ]
        assert all(hasattr(providers, name) for name in providers.__all__)

    def test_the_readme_documents_each_public_name(self) -> None:
        readme = documentation()
        for name in providers.__all__:
            assert re.search(rf"`{name}\b", readme), name


class TestRequests:
    """The transcript and the tools are converted exactly; keys are sent as configured."""

    def test_openai_body(self) -> None:
        model = canned_openai(
            base_url="http://h/v1", system="Be brief.", options={"temperature": 0}
        )
        sent = posted(model, request(REQUEST_HISTORY, SPECS))
        assert sent["url"] == "http://h/v1/chat/completions"
        assert sent["headers"]["content-type"] == "application/json"
        assert sent["headers"]["accept"] == "text/event-stream"
        assert sent["headers"]["user-agent"] == f"agent_loop_providers/{providers.__version__}"
        assert providers.__version__ == "1.3.0"
        assert sent["body"] == {
            "model": "test-model",
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is (2 + 3) and the weather in Oslo?"},
                {
                    "role": "assistant",
                    "content": "Let me check.",
                    "tool_calls": [
                        openai_sent_call("c1", "add", '{"left": 2, "right": 3}'),
                        openai_sent_call("c2", "weather", '{"city": "Oslo"}'),
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": '{"sum":5}'},
                {"role": "tool", "tool_call_id": "c2", "content": "no station"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [openai_sent_call("c3", "add", "{}")],
                },
                {"role": "tool", "tool_call_id": "c3", "content": "missing left"},
                {"role": "assistant", "content": "Done."},
                {"role": "user", "content": "Thanks."},
                {"role": "assistant", "content": ""},
                {"role": "user", "content": "Bye."},
            ],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": spec.name,
                        "description": spec.description,
                        "parameters": spec.to_dict()["parameters"],
                    },
                }
                for spec in SPECS
            ],
        }

    def test_anthropic_body_merges_consecutive_results_and_carries_is_error(self) -> None:
        model = canned_anthropic(
            base_url="http://h",
            system="Be brief.",
            max_tokens=100,
            options={"top_k": 5},
            thinking={"type": "enabled", "budget_tokens": 2048},
        )
        sent = posted(model, request(REQUEST_HISTORY, SPECS))
        assert sent["url"] == "http://h/v1/messages"
        assert sent["headers"]["anthropic-version"] == "2023-06-01"
        assert sent["body"] == {
            "model": "test-model",
            "max_tokens": 100,
            "stream": True,
            "system": "Be brief.",
            "thinking": {"type": "enabled", "budget_tokens": 2048},
            "top_k": 5,
            "messages": [
                {"role": "user", "content": "What is (2 + 3) and the weather in Oslo?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Let me "},
                        {"type": "text", "text": "check."},
                        anthropic_sent_use("c1", "add", {"left": 2, "right": 3}),
                        anthropic_sent_use("c2", "weather", {"city": "Oslo"}),
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        anthropic_sent_result("c1", '{"sum":5}', False),
                        anthropic_sent_result("c2", "no station", True),
                    ],
                },
                {"role": "assistant", "content": [anthropic_sent_use("c3", "add", {})]},
                {"role": "user", "content": [anthropic_sent_result("c3", "missing left", True)]},
                {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
                {"role": "user", "content": "Thanks."},
                # message-r4 is empty: the API refuses an empty turn, so none is sent
                {"role": "user", "content": "Bye."},
            ],
            "tools": [
                {
                    "name": spec.name,
                    "description": spec.description,
                    "input_schema": spec.to_dict()["parameters"],
                }
                for spec in SPECS
            ],
        }

    @pytest.mark.parametrize(
        ("options", "sent"),
        [
            pytest.param({}, {"include_usage": True}, id="default"),
            pytest.param(
                {"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
                {"include_usage": True, "continuous_usage_stats": True},
                id="replaced",
            ),
            pytest.param({"stream_options": None}, None, id="none-for-mistral"),
        ],
    )
    def test_openai_asks_for_usage_unless_options_say_otherwise(
        self, options: Dict[str, Any], sent: Any
    ) -> None:
        body = posted(canned_openai(options=options), request())["body"]
        assert body.get("stream_options") == sent
        assert ("stream_options" in body) is (sent is not None)

    def test_an_anthropic_thinking_block_is_sent_back_verbatim_before_tool_use(self) -> None:
        """An Anthropic thinking block is sent back verbatim before tool_use: every block
        of the turn in its place, thinking with its signature (also when the thinking is
        empty), a redacted block with its data, each text block on its own, the tool uses."""
        turn = al.AssistantMessage(
            "message-r1",
            [
                al.ThinkingBlock("Let me add.", signature="sig-1"),
                al.ThinkingBlock("", signature="EmwKAhgB", redacted=True),
                al.TextBlock("Adding "),
                al.TextBlock("both."),
                al.ThinkingBlock("", signature="sig-2"),
                al.ToolCall("c1", "add", {"left": 2, "right": 3}),
            ],
            usage=al.Usage(input_tokens=10, output_tokens=20),
        )
        history = (
            al.UserMessage("user-001", "2 + 3?"),
            turn,
            al.ToolResultMessage("tool-result-c1", "c1", "add", '{"sum":5}', False),
        )
        body = posted(canned_anthropic(), request(history))["body"]
        assert body["messages"][1] == {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Let me add.", "signature": "sig-1"},
                {"type": "redacted_thinking", "data": "EmwKAhgB"},
                {"type": "text", "text": "Adding "},
                {"type": "text", "text": "both."},
                {"type": "thinking", "thinking": "", "signature": "sig-2"},
                anthropic_sent_use("c1", "add", {"left": 2, "right": 3}),
            ],
        }  # and no usage: it is not part of what is sent back
        assert len(body["messages"]) == 3

    def test_thinking_without_a_signature_is_not_sent_to_anthropic(self) -> None:
        # Thinking from another provider has no signature: Anthropic refuses such a
        # block, and the thinking is not Claude's. An empty signature is none. A turn
        # left empty is not sent either.
        history = (
            al.UserMessage("user-001", "Hi."),
            al.AssistantMessage(
                "message-r1",
                [
                    al.ThinkingBlock("hmm"),
                    al.TextBlock("Hello."),
                    al.ThinkingBlock(""),
                    al.ThinkingBlock("signed with nothing", signature=""),
                ],
            ),
            al.UserMessage("user-002", "And?"),
            al.AssistantMessage("message-r2", [al.ThinkingBlock("only thinking")]),
            al.UserMessage("user-003", "Well?"),
        )
        body = posted(canned_anthropic(), request(history))["body"]
        assert body["messages"] == [
            {"role": "user", "content": "Hi."},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
            {"role": "user", "content": "And?"},
            {"role": "user", "content": "Well?"},
        ]

    def test_openai_does_not_send_thinking_back(self) -> None:
        # DeepSeek refuses reasoning_content in input; the other servers do not need it.
        history = (
            al.UserMessage("user-001", "2 + 3?"),
            al.AssistantMessage(
                "message-r1",
                [
                    al.ThinkingBlock("Add them.", signature="sig"),
                    al.TextBlock("Adding."),
                    al.ThinkingBlock("Now the call."),
                    al.ToolCall("c1", "add", {"left": 2, "right": 3}),
                ],
                usage=al.Usage(output_tokens=5),
            ),
            al.ToolResultMessage("tool-result-c1", "c1", "add", '{"sum":5}', False),
        )
        body = posted(canned_openai(), request(history))["body"]
        assert body["messages"][1] == {
            "role": "assistant",
            "content": "Adding.",
            "tool_calls": [openai_sent_call("c1", "add", '{"left": 2, "right": 3}')],
        }

    def test_no_tools_no_system(self) -> None:
        first = posted(canned_openai(), request())["body"]
        second = posted(canned_anthropic(), request())["body"]
        assert ("tools" in first, "tools" in second, "system" in second) == (False, False, False)
        assert first["messages"] == [{"role": "user", "content": "Hi."}]

    @pytest.mark.parametrize(
        ("provider", "environment", "api_key", "header"),
        [
            pytest.param("openai", None, None, None, id="openai-none"),
            pytest.param("anthropic", None, None, None, id="anthropic-none"),
            pytest.param("openai", "sk-env", None, "Bearer sk-env", id="openai-environment"),
            pytest.param("anthropic", "ant-env", None, "ant-env", id="anthropic-environment"),
            pytest.param("openai", "sk-env", "sk-given", "Bearer sk-given", id="explicit-wins"),
            pytest.param("openai", "sk-env", "", None, id="an-empty-one-sends-none"),
        ],
    )
    def test_the_key_is_read_from_the_environment_at_request_time(
        self,
        monkeypatch: pytest.MonkeyPatch,
        provider: str,
        environment: Optional[str],
        api_key: Optional[str],
        header: Optional[str],
    ) -> None:
        variable, name = ("OPENAI_API_KEY", "authorization")
        if provider == "anthropic":
            variable, name = ("ANTHROPIC_API_KEY", "x-api-key")
        monkeypatch.delenv(variable, raising=False)
        model = canned_model(provider, api_key=api_key)
        if environment is not None:  # set once the model is built: read at request time
            monkeypatch.setenv(variable, environment)
        assert posted(model, request())["headers"].get(name) == header


class TestOptions:
    """options: a mapping for every request, or a function of each request."""

    def test_a_function_forces_a_tool_until_the_model_answers_the_user(self) -> None:
        # The README's rule: force the tool when the request's last message is the user's,
        # which holds on the first request of a run and of a resumed run alike.
        seen: List[str] = []
        force = {"tool_choice": {"type": "function", "function": {"name": "add"}}}

        def options(model_request: al.ModelRequest) -> Optional[Dict[str, Any]]:
            seen.append(model_request.id)
            return force if isinstance(model_request.messages[-1], al.UserMessage) else None

        model = canned_openai(
            answer_parts("openai", [("c1", "add", {"left": 2, "right": 3})]),
            answer_parts("openai", ["5"]),
            answer_parts("openai", [("c2", "add", {"left": 5, "right": 5})]),
            answer_parts("openai", ["10"]),
            options=options,
        )
        _, first = settle_prompt(model)
        assert first.status == "completed", first.error
        _, resumed = al.settle_run(
            al.run_agent_loop(
                messages=[*first.messages, al.UserMessage("user-002", "Now add 5 and 5.")],
                model=model,
                tools=al.ToolRegistry([add_tool()]),
                max_steps=2,
                request_sequence_start=first.next_request_sequence,
            )
        )
        assert resumed.status == "completed", resumed.error
        assert seen == ["request-001", "request-002", "request-003", "request-004"]
        forced = [
            exchange.body.get("tool_choice") == force["tool_choice"]
            for exchange in exchanges(model)
        ]
        assert forced == [True, False, True, False]
        assert model.options is options

    def test_a_function_for_anthropic(self) -> None:
        model = canned_anthropic(
            options=lambda model_request: {"metadata": {"user_id": model_request.id}}
        )
        assert posted(model, request())["body"]["metadata"] == {"user_id": "request-001"}

    @pytest.mark.parametrize(
        ("returned", "error", "words"),
        [
            pytest.param([1], TypeError, "what options returns must be a mapping", id="type"),
            pytest.param({"a": {1}}, TypeError, "what options returns must be plain", id="set"),
            pytest.param(
                {"stream": False}, ValueError, "what options returns may not set stream", id="own"
            ),
        ],
    )
    def test_what_a_function_returns_is_checked_per_request(
        self, returned: Any, error: type, words: str
    ) -> None:
        model = canned_openai([OPENAI_TEXT_STREAM], options=lambda model_request: returned)
        _, result = settle_prompt(model)
        assert result.status == "failed"
        assert result.error is not None
        assert result.error.code == "MODEL_STREAM_ERROR"
        assert f"raised {error.__name__}: {words}" in result.error.message
        assert cast(CannedTransport, model.transport).opened == 0  # nothing was sent


# --- Streaming ----------------------------------------------------------------------


class TestOpenAIStreaming:
    """A TextDelta per delta; a ToolCallChunk per call once complete; [DONE] decides."""

    def test_text(self) -> None:
        chunks, response = stream(canned_openai([OPENAI_TEXT_STREAM]))
        assert chunks == [
            al.TextDelta("request-001", "Hello"),
            al.TextDelta("request-001", ", world"),
        ]
        assert response == al.ModelResponse(
            "response-001", "request-001", [al.TextBlock("Hello, world")], "stop"
        )

    def test_tool_calls_are_assembled_from_fragments(self) -> None:
        chunks, response = stream(canned_openai([OPENAI_TOOL_STREAM]))
        add = al.ToolCall("call_A", "add", {"left": 2, "right": 3})
        weather = al.ToolCall("call_B", "weather", {"city": "Oslo"})
        assert chunks == [
            al.ToolCallChunk("request-001", add),
            al.ToolCallChunk("request-001", weather),
        ]
        assert (response.content, response.stop_reason) == ((add, weather), "toolCall")

    def test_a_call_is_yielded_as_soon_as_the_next_one_begins(self) -> None:
        model = canned_openai(
            [openai_call(0, "a", "add", json.dumps(ADD)), openai_call(1, "b", "add", "{")]
        )
        (exchange,) = exchanges(model)
        generator = model.stream(request(), threading.Event())
        assert next(generator) == al.ToolCallChunk("request-001", al.ToolCall("a", "add", ADD))
        assert exchange.reads == 2  # as the second call began, before any more bytes
        generator.close()
        assert exchange.closed

    def test_text_tools_and_text_keep_their_order(self) -> None:
        items: List[AnswerItem] = ["First ", "the sum.", ("a", "add", ADD), "Then more."]
        chunks, response = stream(canned_openai(answer_parts("openai", items)))
        kinds = [al.TextDelta, al.TextDelta, al.ToolCallChunk, al.TextDelta]
        assert [type(chunk) for chunk in chunks] == kinds
        call = al.ToolCall("a", "add", ADD)
        assert response.content == (
            al.TextBlock("First the sum."),
            call,
            al.TextBlock("Then more."),
        )
        # "stop" for a response that holds tool calls: still a complete toolCall answer.
        assert response.stop_reason == "toolCall"

    def test_done_without_a_finish_reason_needs_require_finish_reason_false(self) -> None:
        # A server that never sends a finish_reason: its [DONE] alone ends the answer.
        parts = [openai_chunk({"content": "Hi"}), openai_call(0, "call_0", "add", "{}"), DONE]
        chunks, response = stream(canned_openai(parts, require_finish_reason=False))
        assert (len(chunks), response.stop_reason) == (2, "toolCall")

    def test_empty_arguments_are_an_empty_object(self) -> None:
        no_arguments = {"index": 1, "id": "b", "function": {"name": "now"}}
        parts = [
            openai_call(0, "a", "now", ""),
            openai_chunk({"tool_calls": [no_arguments]}),
            openai_chunk({}, "tool_calls"),
            DONE,
        ]
        _, response = stream(canned_openai(parts))
        assert response.content == (al.ToolCall("a", "now", {}), al.ToolCall("b", "now", {}))

    def test_refusal_is_text_and_other_choices_and_fields_are_ignored(self) -> None:
        parts = [
            sse({"choices": [{"index": 1, "delta": {"content": "other"}}]}),
            openai_chunk({"role": "assistant", "content": None}),
            openai_chunk({"refusal": "I cannot help with that."}),
            openai_chunk({"reasoning_details": [], "content": ""}),
            b'data: {"choices":[{"delta":{"content":"!"}}]}\n\n',
            STOP,
            DONE,
        ]
        _, response = stream(canned_openai(parts))
        assert response.content == (al.TextBlock("I cannot help with that.!"),)
        assert response.usage is None  # the server sent none

    def test_nothing_after_done_is_read(self) -> None:
        _, response = stream(canned_openai([OPENAI_TEXT_STREAM + b"data: {not json\n\n"]))
        assert response.content == (al.TextBlock("Hello, world"),)


class TestAnthropicStreaming:
    """Text deltas as they come; a tool_use at its content_block_stop; message_stop decides."""

    def test_text_and_tool_use(self) -> None:
        chunks, response = stream(canned_anthropic([ANTHROPIC_STREAM]))
        call = al.ToolCall("toolu_01", "add", {"left": 2, "right": 3})
        assert chunks == [
            al.TextDelta("request-001", "Adding."),
            al.ToolCallChunk("request-001", call),
        ]
        usage = al.Usage(input_tokens=9, output_tokens=20)
        assert response == al.ModelResponse(
            "response-001", "request-001", [al.TextBlock("Adding."), call], "toolCall", usage
        )

    def test_unknown_blocks_and_events_are_ignored(self) -> None:
        search = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search"}
        parts = [
            MESSAGE_START,
            anthropic_start(0, search),
            anthropic_delta(0, type="input_json_delta", partial_json="{}"),
            anthropic_delta(0, type="some_future_delta", data="s"),
            anthropic_stop(0),
            anthropic_event("some_future_event", detail=1),
            anthropic_start(1, {"type": "text", "text": "Hi"}),
            anthropic_delta(1, type="citations_delta", citation={}),
            anthropic_stop(1),
            *anthropic_end("stop_sequence"),
        ]
        chunks, response = stream(canned_anthropic(parts))
        assert chunks == [al.TextDelta("request-001", "Hi")]
        assert (response.content, response.stop_reason) == ((al.TextBlock("Hi"),), "stop")

    def test_a_tool_use_without_deltas_keeps_its_start_input(self) -> None:
        block = {"type": "tool_use", "id": "t", "name": "add", "input": ADD}
        parts = [MESSAGE_START, anthropic_start(0, block), anthropic_stop(0), *anthropic_end(None)]
        _, response = stream(canned_anthropic(parts))
        assert response.content == (al.ToolCall("t", "add", ADD),)

    def test_a_tool_call_is_yielded_at_its_block_stop(self) -> None:
        model = canned_anthropic([MESSAGE_START, *anthropic_tool(0, "t", "add", json.dumps(ADD))])
        (exchange,) = exchanges(model)
        generator = model.stream(request(), threading.Event())
        assert next(generator) == al.ToolCallChunk("request-001", al.ToolCall("t", "add", ADD))
        assert exchange.reads == 4  # at the block's stop, before any more bytes
        generator.close()
        assert exchange.closed


THINKING_STEPS = (
    "Let me solve this step by step:\n\n1. First break down 27 * 453",
    "\n2. 453 = 400 + 50 + 3",
    "\n3. 27 * 400 = 10,800",
    "\n4. 27 * 50 = 1,350",
    "\n5. 27 * 3 = 81",
    "\n6. 10,800 + 1,350 + 81 = 12,231",
)
SIGNATURE = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds..."


def thinking_then_add(usage_start: Dict[str, Any], usage_end: Dict[str, Any]) -> List[bytes]:
    """An Anthropic tool-use turn with thinking: thinking and its signature, then tool_use."""
    start = {"id": "msg_1", "type": "message", "role": "assistant", "usage": usage_start}
    return [
        anthropic_event("message_start", message=start),
        *anthropic_thinking(0, "I should add ", "2 and 3.", signature="sig-add"),
        *anthropic_tool(1, "toolu_01", "add", '{"left": 2, ', '"right": 3}'),
        *anthropic_end("tool_use", usage_end),
    ]


class TestThinking:
    """Thinking streams as ThinkingDelta chunks, is kept in its place, and goes back."""

    def test_anthropics_documented_extended_thinking_stream_split_anywhere(self) -> None:
        parts = in_pieces(ANTHROPIC_THINKING_STREAM)
        assert parsed(new_answer("anthropic"), *parts)[1].stop_reason == "stop"
        events, result = settle_prompt(canned_anthropic(parts), "What is 27 * 453?")
        assert result.status == "completed", result.error
        assert result.final_text == "27 * 453 = 12,231"  # thinking is not the answer
        assert [event.payload["chunk"] for event in events if event.type == "model.chunk"] == [
            *[al.ThinkingDelta("request-001", step) for step in THINKING_STEPS],
            al.TextDelta("request-001", "27 * 453 = 12,231"),
        ]
        assert result.messages[1] == al.AssistantMessage(
            "message-response-001",
            [
                al.ThinkingBlock("".join(THINKING_STEPS), signature=SIGNATURE),
                al.TextBlock("27 * 453 = 12,231"),
            ],
            usage=None,  # the example reports no usage: unknown, not 0
        )
        assert result.usage == al.Usage()  # a sum with an unknown part is unknown

    def test_a_redacted_block_is_kept_and_sent_back_with_its_data(self) -> None:
        parts = [
            MESSAGE_START,
            *anthropic_redacted(0, "EmwKAhgBEgy3va3pzix"),
            *anthropic_thinking(1, signature="sig-empty"),  # thinking with no text
            *anthropic_text(2, "Hello."),
            *anthropic_end(),
        ]
        model = canned_anthropic(parts, answer_parts("anthropic", ["Bye."]))
        chunks, response = stream(model)
        assert chunks == [al.TextDelta("request-001", "Hello.")]  # neither carries text
        assert response.content == (
            al.ThinkingBlock("", signature="EmwKAhgBEgy3va3pzix", redacted=True),
            al.ThinkingBlock("", signature="sig-empty"),
            al.TextBlock("Hello."),
        )
        turn = al.AssistantMessage("message-response-001", response.content)
        history = (al.UserMessage("user-001", "Hi."), turn, al.UserMessage("user-002", "Bye?"))
        stream(model, request(history, id="request-002"))
        assert exchanges(model)[1].body["messages"][1] == {
            "role": "assistant",
            "content": [
                {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"},
                {"type": "thinking", "thinking": "", "signature": "sig-empty"},
                {"type": "text", "text": "Hello."},
            ],
        }

    def test_the_response_keeps_the_providers_block_order(self) -> None:
        # Interleaved thinking: thinking, call, thinking, text; each text block on its own.
        parts = [
            MESSAGE_START,
            *anthropic_thinking(0, "first", signature="s0"),
            *anthropic_tool(1, "t1", "add", "{}"),
            *anthropic_thinking(2, "second", signature="s2"),
            *anthropic_text(3, "A"),
            *anthropic_text(4, "B"),
            *anthropic_end("tool_use"),
        ]
        chunks, response = parsed(new_answer("anthropic"), *parts)
        assert response.content == (
            al.ThinkingBlock("first", "s0"),
            al.ToolCall("t1", "add", {}),
            al.ThinkingBlock("second", "s2"),
            al.TextBlock("A"),
            al.TextBlock("B"),
        )
        kinds = [al.ThinkingDelta, al.ToolCallChunk, al.ThinkingDelta, al.TextDelta, al.TextDelta]
        assert [type(chunk) for chunk in chunks] == kinds

    def test_a_thinking_blocks_start_text_and_signatures(self) -> None:
        # Text in the start counts as a delta; the last signature_delta wins; a block
        # without any signature, or with "", has none.
        start = {"type": "thinking", "thinking": "Hm, ", "signature": ""}
        parts = [
            MESSAGE_START,
            anthropic_start(0, start),
            anthropic_delta(0, type="signature_delta", signature="a"),
            anthropic_delta(0, type="signature_delta", signature="b"),
            anthropic_stop(0),
            *anthropic_thinking(1, "no signature", signature=None),
            *anthropic_thinking(2, "empty signature", signature=""),
            *anthropic_thinking(3, "last", signature="s3"),
            anthropic_event("message_stop"),
        ]
        chunks, response = parsed(new_answer("anthropic"), *parts)
        assert chunks[0] == al.ThinkingDelta("request-001", "Hm, ")
        assert response.content == (
            al.ThinkingBlock("Hm, ", "b"),
            al.ThinkingBlock("no signature"),
            al.ThinkingBlock("empty signature"),
            al.ThinkingBlock("last", "s3"),
        )

    def test_openai_reasoning_content_then_content_then_usage(self) -> None:
        chunks, response = parsed(new_answer("openai"), OPENAI_REASONING_STREAM)
        assert chunks == [
            al.ThinkingDelta("request-001", "27 * 453: "),
            al.ThinkingDelta("request-001", "10,800 + 1,431."),
            al.TextDelta("request-001", "12,231"),
        ]
        content = (al.ThinkingBlock("27 * 453: 10,800 + 1,431."), al.TextBlock("12,231"))
        assert response == al.ModelResponse(
            "response-001", "request-001", content, "stop", REASONING_USAGE
        )

    @pytest.mark.parametrize(
        ("delta", "thinking"),
        [
            pytest.param({"reasoning": "OpenRouter's"}, "OpenRouter's", id="reasoning"),
            pytest.param({"reasoning_content": "vLLM's"}, "vLLM's", id="reasoning-content"),
            pytest.param(
                {"reasoning_content": "once", "reasoning": "once"}, "once", id="both-the-same"
            ),
            pytest.param({"reasoning_content": None, "reasoning": "r"}, "r", id="null-first"),
            pytest.param({"reasoning_content": "", "reasoning": "r"}, "r", id="empty-first"),
        ],
    )
    def test_openai_reasoning_fields(self, delta: Dict[str, Any], thinking: str) -> None:
        _, response = parsed(new_answer("openai"), openai_chunk(delta), STOP, DONE)
        assert response.content == (al.ThinkingBlock(thinking),)

    def test_openai_thinking_text_and_calls_are_each_others_boundaries(self) -> None:
        parts = [
            openai_chunk({"reasoning_content": "a"}),
            openai_chunk({"reasoning_content": "b"}),
            openai_call(0, "c1", "add", "{}"),
            openai_chunk({"reasoning_content": "c"}),  # the call is complete: thinking began
            openai_chunk({"content": "d"}),
            openai_chunk({"reasoning_content": "e", "content": "f"}),  # thinking first
            openai_chunk({}, "stop"),
            DONE,
        ]
        chunks, response = parsed(new_answer("openai"), *parts)
        call = al.ToolCall("c1", "add", {})
        assert chunks[2:4] == [
            al.ToolCallChunk("request-001", call),
            al.ThinkingDelta("request-001", "c"),
        ]
        assert response.content == (
            al.ThinkingBlock("ab"),
            call,
            al.ThinkingBlock("c"),
            al.TextBlock("d"),
            al.ThinkingBlock("e"),
            al.TextBlock("f"),
        )


NO_CACHE = {"cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


class TestUsage:
    """The provider's counts, mapped to Usage's meaning; None for what it did not say."""

    @pytest.mark.parametrize(
        ("start", "end", "usage"),
        [
            pytest.param(  # the documentation's tool-use example
                {"input_tokens": 472, "output_tokens": 2},
                {"output_tokens": 89},
                al.Usage(input_tokens=472, output_tokens=89),
                id="tool-use-example",
            ),
            pytest.param(  # the web-search example: message_delta repeats every count
                {"input_tokens": 2679, **NO_CACHE, "output_tokens": 3},
                {"input_tokens": 10682, **NO_CACHE, "output_tokens": 510, "server_tool_use": {}},
                al.Usage(10682, 510, cache_read_tokens=0, cache_write_tokens=0),
                id="web-search-example",
            ),
            pytest.param(
                {"input_tokens": 5, "cache_read_input_tokens": 1200, "output_tokens": 1},
                {"output_tokens": 7, "cache_creation_input_tokens": None},
                al.Usage(input_tokens=5, output_tokens=7, cache_read_tokens=1200),
                id="cache-read-null-kept-none",
            ),
            pytest.param({}, {}, None, id="nothing-said"),
        ],
    )
    def test_anthropic_message_start_and_the_last_message_delta(
        self, start: Dict[str, Any], end: Dict[str, Any], usage: Optional[al.Usage]
    ) -> None:
        _, response = parsed(new_answer("anthropic"), *thinking_then_add(start, end))
        assert response.usage == usage

    def test_anthropic_without_any_usage_object(self) -> None:
        parts = [
            anthropic_event("message_start", message={"id": "m", "content": []}),
            *anthropic_text(0, "Hi"),
            anthropic_event("message_delta", delta={"stop_reason": "end_turn"}),
            anthropic_event("message_stop"),
        ]
        assert parsed(new_answer("anthropic"), *parts)[1].usage is None

    @pytest.mark.parametrize(
        ("usage", "expected"),
        [
            pytest.param(
                {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25},
                al.Usage(input_tokens=20, output_tokens=5),
                id="no-details-llmock",
            ),
            pytest.param(
                {
                    "prompt_tokens": 2006,
                    "completion_tokens": 300,
                    "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
                    "completion_tokens_details": {"reasoning_tokens": 0},
                },
                al.Usage(86, 300, cache_read_tokens=1920, reasoning_tokens=0),
                id="openai-cached",
            ),
            pytest.param(
                {"prompt_tokens": 16, "cached_tokens": 9, "prompt_tokens_details": None},
                al.Usage(input_tokens=16),
                id="null-details",
            ),
            pytest.param(
                {"prompt_tokens_details": {"cached_tokens": 3}, "completion_tokens": 1},
                al.Usage(output_tokens=1, cache_read_tokens=3),
                id="no-prompt-tokens",
            ),
            pytest.param(
                {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 3}},
                al.Usage(input_tokens=0, cache_read_tokens=3),
                id="all-cached",
            ),
            pytest.param({}, None, id="empty"),
        ],
    )
    def test_openai_usage_chunk(self, usage: Dict[str, Any], expected: Optional[al.Usage]) -> None:
        parts = [openai_chunk({"content": "Hi"}), openai_chunk({}, "stop"), openai_usage(usage)]
        _, response = parsed(new_answer("openai"), *parts, DONE)
        assert response.usage == expected

    def test_openai_the_last_usage_object_wins_and_null_is_none(self) -> None:
        # vLLM's continuous usage: a usage object on every chunk, the last one the total.
        parts = [
            openai_chunk({"content": "a"})[:-3]
            + b',"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n',
            openai_chunk({"content": "b"})[:-3] + b',"usage":null}\n\n',
            STOP,
            openai_usage({"prompt_tokens": 3, "completion_tokens": 2}),
            DONE,
        ]
        _, response = parsed(new_answer("openai"), *parts)
        assert response.usage == al.Usage(input_tokens=3, output_tokens=2)

    def test_the_usage_chunk_after_the_finish_is_read_before_the_answer_ends(self) -> None:
        # The finish is not the end: the usage chunk comes after it, then [DONE].
        parts = [
            openai_chunk({"content": "Hi"}),
            openai_chunk({}, "stop"),
            openai_usage({"prompt_tokens": 7, "completion_tokens": 1}),
            DONE,
        ]
        model = canned_openai(parts)
        (exchange,) = exchanges(model)
        _, response = stream(model)
        assert response.usage == al.Usage(input_tokens=7, output_tokens=1)
        assert exchange.reads == 4
        assert exchange.body["stream_options"] == {"include_usage": True}


class TestIds:
    """Response and tool-call ids are unique in the transcript and deterministic."""

    def test_a_reused_call_id_is_rewritten_and_sent_back_as_rewritten(self) -> None:
        model = canned_openai(
            answer_parts("openai", [("call_0", "add", ADD)]),
            answer_parts("openai", [("call_0", "add", {"left": 3, "right": 3})]),
            answer_parts("openai", ["9"]),
        )
        _, result = settle_prompt(model)
        assert result.status == "completed", result.error
        calls = [call for message in result.messages for call in al.open_tool_calls([message])]
        assert [call.id for call in calls] == ["call_0", "response-002-call-1"]
        assert [
            message.id for message in result.messages if isinstance(message, al.AssistantMessage)
        ] == ["message-response-001", "message-response-002", "message-response-003"]
        sent = exchanges(model)[2].body["messages"]
        results = [turn["tool_call_id"] for turn in sent if turn["role"] == "tool"]
        assert results == ["call_0", "response-002-call-1"]
        assert sent[3]["tool_calls"][0]["id"] == "response-002-call-1"

    def test_taken_ids_get_the_first_free_suffix(self) -> None:
        history = (
            al.UserMessage("user-001", "Go."),
            al.AssistantMessage(
                "message-response-001", [al.ToolCall("response-001-2-call-1", "add", {})]
            ),
            al.ToolResultMessage(
                "tool-result-response-001-2-call-1", "response-001-2-call-1", "add", "x", True
            ),
            al.AssistantMessage("message-response-001-2", [al.ToolCall("x", "add", {})]),
            al.ToolResultMessage("tool-result-x", "x", "add", "x", True),
            al.UserMessage("tool-result-free", "a user message whose id blocks a result id"),
        )
        _, response = stream(
            canned_openai(
                [
                    openai_call(0, "x", "add", ""),
                    openai_call(1, None, "add", ""),
                    openai_call(2, "free", "add", ""),
                    openai_call(3, "", "add", ""),
                    openai_chunk({}, "tool_calls"),
                    DONE,
                ]
            ),
            request(history),
        )
        assert response.id == "response-001-3"
        _, second = stream(canned_openai([OPENAI_TEXT_STREAM]), request(history[:3]))
        assert second.id == "response-001-2"  # the first free suffix: 2 when only 001 is taken
        ids = [block.id for block in response.content if isinstance(block, al.ToolCall)]
        assert ids == [f"response-001-3-call-{number}" for number in range(1, 5)]

    @pytest.mark.parametrize("request_id", ["job-7", "request-7", "request-065"])
    def test_a_request_id_the_loop_does_not_make(self, request_id: str) -> None:
        """Only the loop's own request-NNN (al.request_number) becomes response-NNN."""
        _, response = stream(canned_openai([OPENAI_TEXT_STREAM]), request(id=request_id))
        assert (response.id, response.request_id) == (f"response-{request_id}", request_id)

    def test_a_recorded_run_replays_exactly(self) -> None:
        model = canned_openai(
            answer_parts("openai", [("call_0", "add", ADD)]), answer_parts("openai", ["5"])
        )
        _, recorded = settle_prompt(model)
        added = [turn for turn in recorded.messages if isinstance(turn, al.AssistantMessage)]
        _, replayed = settle_prompt(al.ScriptedModel.from_transcript(added))
        assert replayed.messages == recorded.messages


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
# What an OpenAI answer without a finish_reason says: the likely cause (requests at once
# that the server does not serve) first, then, at [DONE], the opt-out.
CONCURRENCY_HINT = (
    "more requests at once than the server serves (it ends an answer it interrupts so): "
    "share one model object, built with max_concurrency=N (N: what the server serves at "
    "once), among every run"
)
DONE_HINT = (
    f"(likely cause: {CONCURRENCY_HINT}; for a server that never sends a finish_reason: "
    "require_finish_reason=False)"
)
END_HINT = (
    "(the server stopped sending: the server failed on this request: its log says why; "
    f"or {CONCURRENCY_HINT})"
)
# Each broken answer, and the words of its refusal that no other row's refusal has (rows
# that one check refuses share them): a refusal swapped for another one fails its row.
OPENAI_BROKEN: List[Tuple[str, List[bytes], str]] = [
    (
        "no-done",
        [HI, openai_chunk({}, "stop")],
        "the stream ended before data: [DONE]: the answer is incomplete",
    ),
    (
        "done-without-finish",
        [HI, DONE],
        f"the stream ended with data: [DONE] but no finish_reason: the answer is incomplete "
        f"{DONE_HINT}",
    ),
    (
        "empty-finish",
        [HI, openai_chunk({}, ""), DONE],
        "the stream ended with data: [DONE] but no finish_reason: the answer is incomplete",
    ),
    (
        "end-without-finish",
        [HI],
        "the stream ended before data: [DONE] and without a finish_reason: the answer is "
        f"incomplete {END_HINT}",
    ),
    (
        "finish-not-str",
        [sse({"choices": [{"delta": {}, "finish_reason": ["stop"]}]})],
        "malformed event: a finish_reason that is not a string",
    ),
    (
        "length-then-the-end",
        [HI, openai_chunk({}, "length")],
        "the answer was cut: finish_reason 'length' (the token limit)",
    ),
    (
        "length",
        [HI, openai_chunk({}, "length"), DONE],
        "the answer was cut: finish_reason 'length' (the token limit)",
    ),
    (
        "filter",
        [openai_chunk({}, "content_filter"), DONE],
        "the answer was cut: finish_reason 'content_filter' (the provider's content filter)",
    ),
    (
        "error",
        [HI, sse({"error": {"message": "Crash", "type": "s_e"}})],
        "the stream reported an error: s_e: Crash",
    ),
    ("error-event", [sse({"error": "busy"}, "error")], "the stream reported an error: busy"),
    ("error-text", [b"event: error\ndata: gone\n\n"], "the stream reported an error: gone"),
    (
        "not-json",
        [b'data: {"choices": [\n\n'],
        'malformed event: its data is not JSON: {"choices": [',
    ),
    (
        "not-object",
        [b"data: [1, 2]\n\n"],
        "malformed event: its data is not a JSON object: [1, 2]",
    ),
    ("no-choices", [sse({"id": "x"})], "malformed event: a chunk without a choices list"),
    (
        "choice",
        [sse({"choices": [1]})],
        "malformed event: a choice that is not an object with a delta object",
    ),
    (
        "delta",
        [sse({"choices": [{"delta": []}]})],
        "malformed event: a choice that is not an object with a delta object",
    ),
    ("content", [openai_chunk({"content": 5})], "malformed event: delta.content is not a string"),
    (
        "calls",
        [openai_chunk({"tool_calls": {}})],
        "malformed event: delta.tool_calls is not a list",
    ),
    (
        "fragment",
        [openai_chunk({"tool_calls": [1]})],
        "malformed event: a tool-call fragment that is not an object",
    ),
    (
        "index",
        [openai_chunk({"tool_calls": [{"index": "0"}]})],
        "malformed event: a tool-call fragment without an int index or a function",
    ),
    (
        "function",
        [openai_chunk({"tool_calls": [{"function": []}]})],
        "malformed event: a tool-call fragment without an int index or a function",
    ),
    (
        "arguments",
        [openai_chunk({"tool_calls": [{"function": OBJECT}]})],
        "malformed event: tool-call arguments that are not a string",
    ),
    (
        "continued",
        [*[openai_call(n, str(n), "add", "{}") for n in (0, 1)], openai_call(0, None, None, "1")],
        "malformed event: tool call 0 continues after it was complete",
    ),
    (
        "no-name",
        [openai_call(0, "a", None, "{}"), STOP, DONE],
        "malformed event stream: a tool call has no name (None)",
    ),
    (
        "bad-json",
        [openai_call(0, "a", "add", '{"left": 1,'), STOP, DONE],
        "tool call 'add' has arguments that are not JSON (",
    ),
    (
        "bad-json-quoted",
        [openai_call(0, "a", "add", '{"left": 1,'), STOP, DONE],
        '): {"left": 1,',
    ),
    (
        "array",
        [openai_call(0, "a", "add", "[1]"), STOP, DONE],
        "tool call 'add' has arguments that are not a JSON object: [1]",
    ),
    (
        "utf-8",
        [b"data: \xff\xfe\n\n"],
        "malformed event stream: it is not UTF-8 ('utf-8' codec can't decode byte 0xff",
    ),
    (
        "reasoning",
        [openai_chunk({"reasoning_content": 1})],
        "malformed event: delta.reasoning is not a string",
    ),
    ("deep", [b"data: " + DEEP.encode() + b"\n\n"], NESTED),
    (
        "deep-arguments",
        [openai_call(0, "c1", "add", DEEP), openai_chunk({}, "tool_calls"), DONE],
        NESTED,
    ),
    ("usage-list", [openai_usage([1]), DONE], "malformed event: usage is not an object"),
    *[
        (name, [openai_usage(usage), DONE], words)
        for name, usage, words in [
            (
                "prompt-str",
                {"prompt_tokens": "7"},
                "malformed event: usage prompt_tokens is not an int >= 0",
            ),
            (
                "output-bool",
                {"completion_tokens": True},
                "malformed event: usage completion_tokens is not an int >= 0",
            ),
            (
                "prompt-negative",
                {"prompt_tokens": -1},
                "malformed event: usage prompt_tokens is not an int >= 0",
            ),
            (
                "details-int",
                {"prompt_tokens_details": 3},
                "malformed event: prompt details is not an object",
            ),
            (
                "completion-details",
                {"completion_tokens_details": []},
                "malformed event: completion details is not an object",
            ),
            (
                "reasoning-float",
                {"completion_tokens_details": {"reasoning_tokens": 1.0}},
                "malformed event: usage reasoning_tokens is not an int >= 0",
            ),
            (
                "cached-over-prompt",
                {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}},
                "malformed event: usage with more cached tokens than prompt tokens",
            ),
        ]
    ],
]
ANTHROPIC_BROKEN: List[Tuple[str, List[bytes], str]] = [
    (
        "no-stop",
        [MESSAGE_START, *anthropic_text(0, "Hi"), anthropic_end()[0]],
        "the stream ended before message_stop: the answer is incomplete",
    ),
    *[
        (
            stop,
            [MESSAGE_START, *anthropic_end(stop)],
            f"the answer was cut: stop_reason {stop!r} ({meaning})",
        )
        for stop, meaning in [
            ("max_tokens", "the max_tokens limit"),
            ("refusal", "the provider's safety classifier"),
            ("pause_turn", "a paused turn, which this adapter does not resume"),
            ("model_context_window_exceeded", "the model's context window"),
        ]
    ],
    (
        "error-event",
        [MESSAGE_START, sse({"error": {"type": "o_e", "message": "Busy"}}, "error")],
        "the stream reported an error: o_e: Busy",
    ),
    (
        "error-type",
        [sse({"type": "error", "error": {"type": "api_error", "message": "Boom"}})],
        "the stream reported an error: api_error: Boom",
    ),
    (
        "not-json",
        [b"event: message_start\ndata: {\n\n"],
        "malformed event: its data is not JSON: {",
    ),
    (
        "unstarted-delta",
        [anthropic_text(0, "x")[1]],
        "malformed event: an index that is not a started block's",
    ),
    (
        "unstarted-stop",
        [anthropic_text(3)[1]],
        "malformed event: an index that is not a started block's",
    ),
    ("restarted", [TEXT_START, TEXT_START], "malformed event: an index that is not a new block's"),
    (
        "reused",
        [MESSAGE_START, *anthropic_text(0, "a"), TEXT_START],
        "malformed event: an index that is not a new block's",
    ),
    (
        "index",
        [anthropic_start("0", {"type": "text"})],
        "malformed event: an index that is not a new block's",
    ),
    (
        "block",
        [anthropic_start(0, "text")],
        "malformed event: content_block_start without a content_block object",
    ),
    (
        "start-text",
        [anthropic_start(0, {"type": "text", "text": 1})],
        "malformed event: text that is not a string",
    ),
    (
        "delta",
        [TEXT_START, anthropic_event("content_block_delta", index=0, delta="x")],
        "malformed event: content_block_delta without a delta object",
    ),
    (
        "delta-text",
        [TEXT_START, anthropic_delta(0, type="text_delta", text=None)],
        "malformed event: text that is not a string",
    ),
    (
        "no-partial-json",
        [TOOL_START, anthropic_delta(0, type="input_json_delta")],
        "malformed event: input_json_delta without a tool_use block or partial_json",
    ),
    (
        "message-delta",
        [anthropic_event("message_delta", delta=None)],
        "malformed event: message_delta without a delta object",
    ),
    (
        "stop-reason-not-str",
        [anthropic_event("message_delta", delta={"stop_reason": ["refusal"]})],
        "malformed event: a stop_reason that is not a string",
    ),
    *[
        (
            f"open-{name}",
            [MESSAGE_START, *block, *end],
            f"malformed event: message_stop before block {i} stopped",
        )
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
    (
        "no-name",
        [MESSAGE_START, *anthropic_tool(0, "t", "", "{}"), *anthropic_end("tool_use")],
        "malformed event stream: a tool call has no name ('')",
    ),
    ("deep", [b"event: message_start\ndata: " + DEEP.encode() + b"\n\n"], NESTED),
    (
        "deep-arguments",
        [MESSAGE_START, *anthropic_tool(0, "t1", "add", DEEP), *anthropic_end()],
        NESTED,
    ),
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
            (
                "text-for-tool",
                TOOL_START,
                anthropic_delta(0, type="text_delta", text="x"),
                "malformed event: text_delta for a block that is not text",
            ),
            (
                "json-for-text",
                TEXT_START,
                anthropic_delta(0, type="input_json_delta", partial_json="{}"),
                "malformed event: input_json_delta without a tool_use block or partial_json",
            ),
            (
                "text-for-thinking",
                THINKING_START,
                anthropic_delta(0, type="text_delta", text="x"),
                "malformed event: text_delta for a block that is not text",
            ),
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
            (
                "usage-negative",
                {"output_tokens": -1},
                "malformed event: usage output_tokens is not an int >= 0",
            ),
            (
                "usage-bool",
                {"input_tokens": True},
                "malformed event: usage input_tokens is not an int >= 0",
            ),
            (
                "usage-str",
                {"cache_read_input_tokens": "5"},
                "malformed event: usage cache_read_input_tokens is not an int >= 0",
            ),
        ]
    ],
    (
        "redacted-empty",
        [MESSAGE_START, *anthropic_redacted(0, "")],
        "malformed event: a redacted_thinking block without its data",
    ),
    (
        "redacted-no-data",
        [MESSAGE_START, anthropic_start(0, {"type": "redacted_thinking"}), anthropic_text(0)[-1]],
        "malformed event: a redacted_thinking block without its data",
    ),
    (
        "message-not-object",
        [anthropic_event("message_start", message="msg_1")],
        "malformed event: message_start's message is not an object",
    ),
]
BROKEN_ANSWERS = [
    pytest.param(provider, parts, words, id=f"{provider}-{name}")
    for provider, rows in [("openai", OPENAI_BROKEN), ("anthropic", ANTHROPIC_BROKEN)]
    for name, parts, words in rows
]


def failure_kind(words: str) -> Tuple[type, Optional[bool]]:
    """What a refusal is, by its words: what the provider said (a cut, an error event) is
    a ProviderError; the rest is about the bytes, a ProviderProtocolError, incomplete or
    malformed."""
    if words.startswith(("the answer was cut", "the stream reported an error")):
        return providers.ProviderError, None
    return providers.ProviderProtocolError, "the answer is incomplete" in words


class TestIncompleteAnswers:
    """Never accept a broken answer: the parser refuses each case and says what happened."""

    @pytest.mark.parametrize(("provider", "parts", "words"), BROKEN_ANSWERS)
    def test_a_broken_answer_is_refused_saying_why(
        self, provider: str, parts: List[bytes], words: str
    ) -> None:
        with pytest.raises(providers.ProviderError) as caught:
            parsed(new_answer(provider), *parts)
        assert words in str(caught.value)
        assert (caught.value.status, caught.value.retry_after) == (None, None)
        kind, incomplete = failure_kind(words)
        assert type(caught.value) is kind
        assert getattr(caught.value, "incomplete", None) is incomplete

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

    def test_an_error_event_nested_too_deeply_is_quoted(self) -> None:
        with pytest.raises(providers.ProviderError) as caught:
            parsed(new_answer("anthropic"), b"event: error\ndata: " + DEEP.encode() + b"\n\n")
        assert str(caught.value) == "the stream reported an error: " + "[" * 200 + "..."

    @pytest.mark.parametrize(
        ("provider", "event", "error_type"),
        [
            pytest.param(
                "anthropic",
                sse({"type": "error", "error": {"type": "overloaded_error", "message": "O"}}),
                "overloaded_error",
                id="anthropic",
            ),
            pytest.param(
                "openai",
                sse({"error": {"message": "Crash", "type": "server_error"}}),
                "server_error",
                id="openai",
            ),
            pytest.param("openai", sse({"error": "busy"}, "error"), None, id="none-named"),
        ],
    )
    def test_an_error_event_carries_the_providers_error_type(
        self, provider: str, event: bytes, error_type: Optional[str]
    ) -> None:
        with pytest.raises(providers.ProviderError) as caught:
            parsed(new_answer(provider), event)
        assert caught.value.error_type == error_type

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


# --- Long answers -------------------------------------------------------------------


def in_reads(parts: List[bytes], per_read: int = 256) -> List[bytes]:
    """Parts joined into reads of per_read events, as a fast server would send them."""
    return [b"".join(parts[start : start + per_read]) for start in range(0, len(parts), per_read)]


def one_character_events(count: int) -> List[str]:
    """count deltas of one code point each, non-BMP ones included."""
    alphabet = "ab\U0001f600\u00e9 "
    return [alphabet[number % len(alphabet)] for number in range(count)]


def chunk_sizes(events: Sequence[al.Event], request_id: str = "request-001") -> List[str]:
    """What a step streamed, chunk by chunk: "text:<size>", "thinking:<size>" or "call"."""
    sizes = []
    for event in events:
        if event.type != "model.chunk" or event.payload["request_id"] != request_id:
            continue
        chunk = event.payload["chunk"]
        if isinstance(chunk, al.TextDelta):
            sizes.append(f"text:{len(chunk.text)}")
        elif isinstance(chunk, al.ThinkingDelta):
            sizes.append(f"thinking:{len(chunk.thinking)}")
        else:
            sizes.append("call")
    return sizes


def thinking_events(count: int) -> List[AnswerItem]:
    """count thinking deltas of one code point each."""
    return [al.ThinkingBlock(character) for character in one_character_events(count)]


def doubling(*levels: int) -> List[int]:
    """The sizes of full chunks at the given levels: 32 chunks of 2**level code points."""
    return [2**level for level in levels for _ in range(32)]


class TestLongAnswers:
    """Any answer the loop's limits allow completes: the pacing that _Pacer states.

    Each goes through run_agent_loop, so the loop's own limit checks judge it:
    MAX_STEP_CHUNKS (1,024 chunks) and MAX_STEP_TEXT (65,536 code points) per step.
    """

    def settle_items(
        self, provider: str, items: Sequence[AnswerItem], *more: Attempt
    ) -> Tuple[List[al.Event], al.RunResult]:
        model = canned_model(provider, in_reads(answer_parts(provider, items)), *more)
        return settle_prompt(model, max_steps=2)

    @PROVIDERS
    @pytest.mark.parametrize("count", [512, 1024])
    def test_one_token_deltas_stream_delta_by_delta_while_half_the_budget_is_left(
        self, provider: str, count: int
    ) -> None:
        tokens = [f" w{number}" for number in range(count)]
        events, result = self.settle_items(provider, tokens)
        assert (result.status, result.final_text) == ("completed", "".join(tokens))
        texts = cast(List[str], chunk_texts(events))
        if count == 512:  # the limit: every one of them on its own
            assert texts == tokens
        else:  # 512 on their own, then chunks of at least the minimum
            assert texts[:512] == tokens[:512]
            for number, text in enumerate(texts[512:-1], 512):
                assert len(text) >= 2 << ((number - 512) // 32)
            assert len(texts) < 1024

    @PROVIDERS
    @pytest.mark.parametrize(
        ("count", "sizes"),
        [
            pytest.param(
                16_000, [1] * 512 + doubling(1, 2, 3, 4, 5, 6, 7) + [256] * 28 + [192], id="16000"
            ),
            pytest.param(
                al.MAX_STEP_TEXT,
                [1] * 512 + doubling(*range(1, 10)) + [1024] * 31 + [576],
                id="65536-take-832-chunks",
            ),
        ],
    )
    def test_code_points_in_one_character_events(
        self, provider: str, count: int, sizes: List[int]
    ) -> None:
        text = one_character_events(count)
        events, result = self.settle_items(provider, text)
        assert result.status == "completed", result.error
        assert result.final_text == "".join(text)
        assert [len(chunk) for chunk in cast(List[str], chunk_texts(events))] == sizes

    @PROVIDERS
    @pytest.mark.parametrize("kind", ["text", "thinking"])
    def test_one_code_point_more_fails_the_run(self, provider: str, kind: str) -> None:
        count = al.MAX_STEP_TEXT + 1
        items = one_character_events(count) if kind == "text" else thinking_events(count)
        _, result = self.settle_items(provider, items)
        assert_protocol_error(result, f"more than 65536 code points of {kind}")

    @PROVIDERS
    def test_text_then_a_tool_call_then_text(self, provider: str) -> None:
        # 601 characters: 512 chunks of 1, 32 of 2, 6 of 4, and 1 buffered, which the call
        # flushes; then 10 characters: 4, 4, and the 2 that the end flushes.
        before, after = one_character_events(601), one_character_events(10)
        items: List[AnswerItem] = [*before, ("c1", "add", ADD), *after]
        events, result = self.settle_items(provider, items, answer_parts(provider, ["3"]))
        assert result.status == "completed", result.error
        streamed = chunk_texts(events)[:-1]  # the last: the second step's "3"
        call = al.ToolCall("c1", "add", ADD)
        sizes = [len(chunk) if isinstance(chunk, str) else "call" for chunk in streamed]
        assert sizes == [1] * 512 + [2] * 32 + [4] * 6 + [1, "call", 4, 4, 2]
        assert streamed[550:552] == [before[-1], call]
        assert result.messages[1].content == (
            al.TextBlock("".join(before)),
            call,
            al.TextBlock("".join(after)),
        )

    @PROVIDERS
    @pytest.mark.parametrize(
        ("thinking", "calls", "completes"),
        [(False, 96, True), (False, 97, False), (True, 80, True), (True, 81, False)],
    )
    def test_the_guarantee_tool_calls_in_the_worst_order(
        self, provider: str, thinking: bool, calls: int, completes: bool
    ) -> None:
        # Text: 64,960 characters fill 831 chunks exactly. Thinking: 64,960 of thinking
        # fill 831, and 64,512 of text 32 more (863 full chunks, the most that 131,072 code
        # points fill). Then each call comes after one buffered character, so it costs two
        # chunks; one character ends the answer.
        items: List[AnswerItem] = list(one_character_events(64_960))
        buffered: AnswerItem = "z"
        if thinking:
            items = [*thinking_events(64_960), *one_character_events(64_512)]
            buffered = al.ThinkingBlock("z")
        for number in range(calls):
            items.extend([buffered, (f"c{number}", "add", ADD)])
        items.append(buffered)
        events, result = self.settle_items(provider, items, answer_parts(provider, ["3"]))
        if completes:
            assert result.status == "completed", result.error
            assert len(chunk_sizes(events)) == al.MAX_STEP_CHUNKS  # exactly the limit
        else:
            assert_protocol_error(result, "more than 1024 chunks")

    @PROVIDERS
    def test_65536_of_thinking_and_65536_of_text_take_864_chunks(self, provider: str) -> None:
        # Thinking counts as text does; its code points are bounded on their own.
        text = one_character_events(al.MAX_STEP_TEXT)
        events, result = self.settle_items(provider, [*thinking_events(al.MAX_STEP_TEXT), *text])
        assert result.status == "completed", result.error
        assert result.final_text == "".join(text)
        sizes = chunk_sizes(events)
        thought = [f"thinking:{size}" for size in [1] * 512 + doubling(*range(1, 10))]
        # 31 full chunks, then the 576 left, flushed when the text begins; then 32 full
        # chunks of the next minimum.
        assert sizes == [*thought, *["thinking:1024"] * 31, "thinking:576", *["text:2048"] * 32]
        assert len(sizes) == 864
        signature = "sig-0" if provider == "anthropic" else None
        blocks = (al.ThinkingBlock("".join(text), signature), al.TextBlock("".join(text)))
        assert result.messages[1].content == blocks

    @PROVIDERS
    def test_a_change_between_thinking_and_text_flushes_the_buffer(self, provider: str) -> None:
        # 601 thinking: 512 chunks of 1, 32 of 2, 6 of 4, and 1 buffered, which the text
        # flushes; then 10 of text: 4, 4, and the 2 that the end flushes.
        items = [*thinking_events(601), *one_character_events(10)]
        events, result = self.settle_items(provider, items)
        assert result.status == "completed", result.error
        thought = [*["thinking:1"] * 512, *["thinking:2"] * 32, *["thinking:4"] * 6, "thinking:1"]
        assert chunk_sizes(events) == [*thought, "text:4", "text:4", "text:2"]

    @PROVIDERS
    def test_the_first_delta_is_yielded_before_the_next_bytes_are_read(
        self, provider: str
    ) -> None:
        parts = answer_parts(provider, ["Hel", "lo"])
        first = 1 if provider == "openai" else 3  # Anthropic: message and block starts
        model = canned_model(provider, parts)
        (exchange,) = exchanges(model)
        generator = model.stream(request(), threading.Event())
        assert next(generator) == al.TextDelta("request-001", "Hel")
        assert exchange.reads == first
        generator.close()
        assert exchange.closed


# --- Answers cut by the token limit -----------------------------------------------------


class TestAcceptTruncated:
    """accept_truncated=True accepts a text answer cut by the token limit, and logs it."""

    @PROVIDERS
    def test_a_cut_text_answer_is_accepted_with_its_thinking_and_logged(
        self, provider: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        items: List[AnswerItem] = [al.ThinkingBlock("Plan."), "Once upon", " a time"]
        parts = answer_parts(provider, items, end=TOKEN_LIMIT[provider])
        with caplog.at_level(logging.WARNING, "agent_loop.providers"):
            _, result = settle_prompt(canned_model(provider, parts, accept_truncated=True))
        assert result.status == "completed", result.error
        assert result.final_text == "Once upon a time"
        signature = "sig-0" if provider == "anthropic" else None
        thinking = al.ThinkingBlock("Plan.", signature)
        assert result.messages[1].content == (thinking, al.TextBlock("Once upon a time"))
        said = "token limit (finish" if provider == "openai" else "max_tokens limit (stop"
        assert [record.getMessage() for record in caplog.records] == [
            f"request-001: the answer was cut by the {said}_reason {TOKEN_LIMIT[provider]!r}); "
            "accepted as the model's answer (accept_truncated=True)"
        ]

    @PROVIDERS
    def test_the_parser_says_what_it_accepted_and_logs_nothing(
        self, provider: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        parts = answer_parts(provider, ["Once"], end=TOKEN_LIMIT[provider])
        answer = new_answer(provider, accept_truncated=True)
        with caplog.at_level(logging.DEBUG):
            _, response = parsed(answer, *parts)
        assert response.content == (al.TextBlock("Once"),)
        said = "token limit (finish" if provider == "openai" else "max_tokens limit (stop"
        assert answer.truncated == f"the {said}_reason {TOKEN_LIMIT[provider]!r})"
        assert caplog.records == []  # stream() logs it, once the answer is done
        assert new_answer(provider, accept_truncated=True).truncated is None

    @PROVIDERS
    @pytest.mark.parametrize(
        "items",
        [
            pytest.param([], id="empty"),
            pytest.param(["Adding.", ("c1", "add", ADD)], id="call-last"),
            pytest.param([al.ThinkingBlock("Let me think")], id="thinking-only"),
            pytest.param(["Hm.", al.ThinkingBlock("More thought")], id="thinking-last"),
        ],
    )
    def test_an_answer_that_does_not_end_in_text_still_fails(
        self, provider: str, items: List[AnswerItem]
    ) -> None:
        answer = new_answer(provider, accept_truncated=True)
        with pytest.raises(providers.ProviderError, match="the answer was cut"):
            parsed(answer, *answer_parts(provider, items, end=TOKEN_LIMIT[provider]))

    def test_an_openai_call_being_streamed_when_cut_fails(self) -> None:
        parts = [openai_call(0, "c1", "add", '{"left": 1, "ri'), openai_chunk({}, "length"), DONE]
        with pytest.raises(providers.ProviderError, match="while a tool call was streamed"):
            parsed(new_answer("openai", accept_truncated=True), *parts)

    @PROVIDERS
    def test_a_complete_call_in_an_accepted_cut_answer_is_run(self, provider: str) -> None:
        items: List[AnswerItem] = [("c1", "add", ADD), "And then"]
        model = canned_model(
            provider,
            answer_parts(provider, items, end=TOKEN_LIMIT[provider]),
            answer_parts(provider, ["Done."]),
            accept_truncated=True,
        )
        events, result = settle_prompt(model)
        assert result.status == "completed", result.error
        assert result.steps == 2
        assert result.messages[1].content == (
            al.ToolCall("c1", "add", ADD),
            al.TextBlock("And then"),
        )
        finished = [
            event.payload["tool_result"] for event in events if event.type == "tool.finished"
        ]
        assert [(done.tool_call_id, done.is_error) for done in finished] == [("c1", False)]

    @pytest.mark.parametrize(
        ("provider", "cut"),
        [
            ("openai", "content_filter"),
            ("anthropic", "refusal"),
            ("anthropic", "pause_turn"),
            ("anthropic", "model_context_window_exceeded"),
        ],
    )
    def test_other_cuts_still_fail(self, provider: str, cut: str) -> None:
        answer = new_answer(provider, accept_truncated=True)
        with pytest.raises(providers.ProviderError, match=f"the answer was cut: .*{cut!r}"):
            parsed(answer, *answer_parts(provider, ["Text"], end=cut))


# --- Heads: the status and headers that decide an error -----------------------------


def unread() -> bytes:
    raise AssertionError("this body is not read")


class TestHead:
    """The status and headers that decide an error, read by check_response_head()."""

    def error(
        self, status: int, headers: Dict[str, str], body: str = "", now: float = 0.0
    ) -> providers.ProviderError:
        with pytest.raises(providers.ProviderError) as caught:
            providers.check_response_head(
                "http://h/x", status, "Reason", headers, body.encode, now
            )
        return caught.value

    @pytest.mark.parametrize("status", [200, 201, 299])
    @pytest.mark.parametrize(
        "content_type", ["text/event-stream", "text/event-stream; charset=x", ""]
    )
    def test_a_2xx_stream_is_no_error_and_its_body_is_not_read(
        self, status: int, content_type: str
    ) -> None:
        headers = {"content-type": content_type}
        providers.check_response_head("u", status, "OK", headers, unread)  # no error

    @pytest.mark.parametrize(
        ("status", "headers", "said"),
        [
            pytest.param(
                301,
                {"location": "https://h/y", "content-type": "text/event-stream"},
                " (Location: https://h/y; redirects are not followed)",
                id="redirect",
            ),
            pytest.param(
                307,
                {"location": "/x2"},
                " (Location: /x2; redirects are not followed)",
                id="temporary",
            ),
            pytest.param(304, {}, "", id="no-location"),
            pytest.param(199, {}, "", id="below-200"),
            pytest.param(399, {}, "", id="399"),
        ],
    )
    def test_a_status_outside_2xx_is_an_error_naming_it(
        self, status: int, headers: Dict[str, str], said: str
    ) -> None:
        with pytest.raises(providers.ProviderError) as caught:
            providers.check_response_head("http://h/x", status, "Reason", headers, unread, 0.0)
        error = caught.value
        assert str(error) == f"http://h/x answered HTTP {status} Reason, not an event stream{said}"
        assert type(error) is providers.ProviderError
        assert (error.status, error.retry_after, error.error_type) == (status, None, None)

    def test_json_instead_of_a_stream_is_a_protocol_error(self) -> None:
        error = self.error(200, {"content-type": "application/json"}, '{"choices": []}')
        assert str(error) == 'http://h/x answered with JSON, not an event stream: {"choices": []}'
        assert isinstance(error, providers.ProviderProtocolError)
        assert (error.status, error.retry_after, error.incomplete) == (None, None, False)

    @pytest.mark.parametrize(
        ("body", "text", "error_type"),
        [
            pytest.param(
                '{"type": "error", "error": {"type": "authentication_error", '
                '"message": "invalid x-api-key"}}',
                "authentication_error: invalid x-api-key",
                "authentication_error",
                id="anthropic",
            ),
            pytest.param(
                '{"error": {"message": "model not found"}}', "model not found", None, id="no-type"
            ),
            pytest.param(
                '{"error": {"type": "server_error"}}',
                '{"error": {"type": "server_error"}}',
                "server_error",
                id="type-without-message",
            ),
            pytest.param(
                '{"error": "model \'x\' not found"}', "model 'x' not found", None, id="ollama"
            ),
            pytest.param('{"message": "Unauthorized"}', "Unauthorized", None, id="message"),
            pytest.param('{"detail": "nope"}', '{"detail": "nope"}', None, id="other-json"),
            pytest.param("[1]", "[1]", None, id="array"),
            pytest.param("", "(no body)", None, id="empty"),
            pytest.param("x" * 300, "x" * 200 + "...", None, id="long"),
            pytest.param("[" * 40_000, "[" * 200 + "...", None, id="nested-too-deeply"),
            pytest.param("caf\udce9", "caf\ufffd", None, id="not-utf-8"),
        ],
    )
    def test_the_provider_error_text_and_type(
        self, body: str, text: str, error_type: Optional[str]
    ) -> None:
        raw = body.encode("utf-8", "surrogateescape")  # not-utf-8: a lone byte 0xe9
        with pytest.raises(providers.ProviderError) as caught:
            providers.check_response_head("http://h/x", 401, "Reason", {}, lambda: raw, 0.0)
        assert str(caught.value) == f"http://h/x answered HTTP 401 Reason: {text}"
        assert (caught.value.status, caught.value.error_type) == (401, error_type)

    @pytest.mark.parametrize(
        ("headers", "retry_after"),
        [
            pytest.param({"retry-after-ms": "1500", "retry-after": "2"}, 1.5, id="ms-first"),
            pytest.param({"retry-after": "0.25"}, 0.25, id="seconds"),
            pytest.param({"retry-after": "0"}, 0.0, id="zero"),
            pytest.param({"retry-after-ms": "x", "retry-after": "3"}, 3.0, id="bad-ms"),
            pytest.param({"retry-after": "Wed, 21 Oct 2015 07:28:30 GMT"}, 30.0, id="date"),
            pytest.param({"retry-after": "Wed, 21 Oct 2015 07:28:30 -0000"}, 30.0, id="utc"),
            pytest.param({"retry-after": "Wed, 21 Oct 2015 07:27:00 GMT"}, 0.0, id="past"),
            pytest.param({"retry-after": "soon"}, None, id="text"),
            pytest.param(
                {"retry-after": "Wed, 21 Oct 99999999999 07:28:30 GMT"}, None, id="huge-year"
            ),
            pytest.param(
                {"retry-after": "Wed, 21 Oct 2015 99999999999:28:30 GMT"}, None, id="huge-hour"
            ),
            pytest.param({"retry-after": ""}, None, id="empty"),
            pytest.param({"retry-after": "-1", "retry-after-ms": "nan"}, None, id="negative"),
            pytest.param({"retry-after": "inf"}, None, id="infinite"),
            pytest.param({}, None, id="none"),
        ],
    )
    def test_retry_after_forms(
        self, headers: Dict[str, str], retry_after: Optional[float]
    ) -> None:
        now = email.utils.parsedate_to_datetime("Wed, 21 Oct 2015 07:28:00 GMT").timestamp()
        error = self.error(503, headers, "busy", now)
        assert (error.status, error.retry_after) == (503, retry_after)
        said = "" if retry_after is None else f" (Retry-After: {retry_after:g} s)"
        assert str(error) == f"http://h/x answered HTTP 503 Reason: busy{said}"

    def test_now_is_the_clock_when_not_given(self) -> None:
        # A date a day ahead: about 86,400 s from now, whatever the clock says.
        ahead = email.utils.formatdate(time.time() + 86_400, usegmt=True)
        with pytest.raises(providers.ProviderError) as caught:
            providers.check_response_head("u", 429, "", {"retry-after": ahead}, lambda: b"busy")
        assert caught.value.retry_after is not None
        assert 86_300 < caught.value.retry_after <= 86_400


# --- The transport seam, and the one rule of retries ------------------------------------


OVERLOADED_EVENT = sse(
    {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, "error"
)


def retried_once(first: Canned, provider: str = "openai") -> Tuple[al.RunResult, AnyModel]:
    """A run whose first attempt meets first and whose second would answer "Done.", with
    one retry allowed: its result, and its model (whose exchanges say what was opened)."""
    model = canned_model(provider, first, answer_parts(provider, ["Done."]), retries=1)
    return settle_prompt(model, signal=Hurried())[1], model


class TestTheTransportSeam:
    """transport=: what sends the requests; None is the default, over a socket."""

    @PROVIDERS
    def test_the_default_is_none_and_a_transport_is_kept(self, provider: str) -> None:
        assert MODEL_CLASSES[provider]("m").transport is None
        transport = CannedTransport()
        assert MODEL_CLASSES[provider]("m", transport=transport).transport is transport

    @pytest.mark.parametrize("transport", [1, "http", object()])
    def test_a_transport_that_is_not_callable(self, transport: Any) -> None:
        with pytest.raises(TypeError, match="transport must be None or a callable"):
            providers.OpenAIChatModel("m", transport=transport)

    @PROVIDERS
    def test_each_attempt_opens_one_exchange_and_closes_it(self, provider: str) -> None:
        result, model = retried_once(Canned([b"busy"], status=503), provider)
        assert (result.status, result.final_text) == ("completed", "Done."), result.error
        assert [exchange.closes for exchange in exchanges(model)] == [1, 1]
        first, second = exchanges(model)
        assert first.url == second.url == CANNED_URL[provider]
        assert first.body == second.body  # the same request, sent again

    def test_a_failed_open_closes_nothing_of_the_models(self) -> None:
        refused = Canned(failure=providers.ProviderConnectionError("cannot connect to u: no"))
        result, model = retried_once(refused)
        assert result.status == "completed", result.error
        assert [exchange.closes for exchange in exchanges(model)] == [0, 1]

    def test_the_consumers_close_closes_the_exchange(self) -> None:
        model = canned_openai([openai_chunk({"content": "Hi"}), openai_chunk({"content": "!"})])
        generator = model.stream(request(), threading.Event())
        assert next(generator) == al.TextDelta("request-001", "Hi")
        generator.close()
        assert exchanges(model)[0].closes == 1

    def test_the_transport_gets_the_request_and_the_runs_signal(self) -> None:
        got: List[Tuple[str, Dict[str, str], bytes, Any]] = []

        def transport(
            url: str, headers: Mapping[str, str], body: bytes, signal: al.Signal
        ) -> Canned:
            got.append((url, dict(headers), body, signal))
            return Canned([OPENAI_TEXT_STREAM])

        model = providers.OpenAIChatModel("m", base_url="http://h/v1", transport=transport)
        signal = threading.Event()
        _, response = stream(model, request(), signal)
        assert response.content == (al.TextBlock("Hello, world"),)
        ((url, headers, body, given),) = got
        assert (url, given) == ("http://h/v1/chat/completions", signal)
        assert headers["Accept"] == "text/event-stream"
        assert body == providers.openai_request_body(request(), "m")

    def test_an_error_body_is_read_up_to_64_kib(self) -> None:
        big = Canned([b"x" * 65_536, b"more"], status=500)
        result, _ = retried_once(big)
        assert result.status == "completed", result.error
        assert big.reads == 1  # the limit was reached: the rest is not read

    def test_an_error_body_that_cannot_be_read_is_no_body(self) -> None:
        class Broken(Canned):
            def read(self) -> bytes:
                raise providers.ProviderConnectionError("the connection to u broke")

        _, result = settle_prompt(canned_openai(Broken(status=401)))
        assert_stream_error(result, "answered HTTP 401 Unauthorized: (no body)")


# Answers that the server did not finish: the parts before the text (none: no chunk), the
# unfinished end, and what the error says after the URL.
UNFINISHED = [
    pytest.param(
        "openai",
        [ROLE],
        [DONE],
        f"ended with data: [DONE] but no finish_reason: the answer is incomplete {DONE_HINT}",
        id="openai-end-marker-without-finish",
    ),
    pytest.param(
        "openai",
        [ROLE],
        [],
        f"ended before data: [DONE] and without a finish_reason: the answer is incomplete "
        f"{END_HINT}",
        id="openai-end-of-input-without-finish",
    ),
    pytest.param(
        "openai",
        [ROLE],
        [STOP],
        "ended before data: [DONE]: the answer is incomplete",
        id="openai-end-of-input-after-the-finish",
    ),
    pytest.param(
        "anthropic",
        [MESSAGE_START, anthropic_text(0)[0]],
        [],
        "ended before message_stop: the answer is incomplete",
        id="anthropic-end-of-input",
    ),
]
TEXT = {
    "openai": openai_chunk({"content": "Hal"}),
    "anthropic": anthropic_delta(0, type="text_delta", text="Hal"),
}


class TestWhatIsRetried:
    """The one rule, decided by the socket loop from the error's type and the status:
    retried before the first chunk, as many times as retries says."""

    @pytest.mark.parametrize(
        ("status", "retried"),
        [
            *[(400, False), (401, False), (404, False), (407, False), (408, True), (409, True)],
            *[(410, False), (422, False), (429, True), (499, False), (500, True), (503, True)],
            *[(529, True), (599, True), (301, False), (304, False)],
        ],
    )
    def test_which_statuses_are_retried(self, status: int, retried: bool) -> None:
        result, model = retried_once(Canned([b"no"], status=status))
        assert (result.status == "completed") is retried, result.error
        assert cast(CannedTransport, model.transport).opened == 1 + retried
        if not retried:
            assert assert_stream_error(result, f"HTTP {status}").status == status

    @pytest.mark.parametrize(
        ("provider", "first", "retried", "kind"),
        [
            pytest.param(
                "openai",
                Canned(failure=providers.ProviderConnectionError("cannot connect to u: refused")),
                True,
                providers.ProviderConnectionError,
                id="a-connection-that-cannot-be-made",
            ),
            pytest.param(
                "openai",
                Canned([providers.ProviderConnectionError("the connection to u broke")]),
                True,
                providers.ProviderConnectionError,
                id="a-connection-that-breaks-after-the-head",
            ),
            pytest.param(
                "anthropic",
                Canned([MESSAGE_START]),
                True,
                providers.ProviderProtocolError,
                id="an-incomplete-answer",
            ),
            pytest.param(
                "anthropic",
                Canned([MESSAGE_START, OVERLOADED_EVENT]),
                True,
                providers.ProviderError,
                id="an-overloaded-error-event",
            ),
            pytest.param(
                "anthropic",
                Canned(
                    [MESSAGE_START, sse({"type": "error", "error": {"type": "overloaded_error"}})]
                ),
                True,
                providers.ProviderError,
                id="an-overloaded-error-event-without-a-message",
            ),
            pytest.param(
                "anthropic",
                Canned([MESSAGE_START, sse({"type": "error", "error": {"type": "api_error"}})]),
                False,
                providers.ProviderError,
                id="another-error-event",
            ),
            pytest.param(
                "openai",
                Canned([b"data: {oops\n\n"]),
                False,
                providers.ProviderProtocolError,
                id="a-malformed-event",
            ),
            pytest.param(
                "openai",
                Canned([b"{}"], headers={"Content-Type": "application/json"}),
                False,
                providers.ProviderProtocolError,
                id="an-answer-in-json",
            ),
            pytest.param(
                "anthropic",
                Canned([MESSAGE_START, *anthropic_end("refusal")]),
                False,
                providers.ProviderError,
                id="a-cut-answer",
            ),
            pytest.param(
                "openai",
                Canned(failure=providers.ProviderError("cannot connect to u: the certificate")),
                False,
                providers.ProviderError,
                id="what-the-transport-says-would-come-again",
            ),
        ],
    )
    def test_which_failures_are_retried(
        self, provider: str, first: Canned, retried: bool, kind: type
    ) -> None:
        first = copy.deepcopy(first)  # a parameter is made once: each run reads its own
        result, model = retried_once(first, provider)
        assert (result.status == "completed") is retried, result.error
        assert cast(CannedTransport, model.transport).opened == 1 + retried
        if not retried:
            assert type(assert_stream_error(result)) is kind

    def test_the_backoff_doubles_from_half_a_second_to_at_most_8_with_jitter(self) -> None:
        busy = [Canned([b"busy"], status=503) for _ in range(7)]
        signal = Hurried()
        _, result = settle_prompt(canned_openai(*busy, retries=6), signal=signal)
        assert_stream_error(result, "HTTP 503", "(after 6 retries)")
        assert len(signal.waits) == 6
        for retried, waited in enumerate(signal.waits):
            low, high = backoff_bounds(retried)
            assert waited is not None
            assert low < waited <= high, (retried, waited)

    @pytest.mark.parametrize(
        ("retry_after", "waited"),
        [
            pytest.param("0.25", 0.25, id="seconds"),
            pytest.param("60", 60.0, id="60-s-the-limit-is-waited-for"),
            pytest.param("61", None, id="61-s-is-not-waited-for"),
        ],
    )
    def test_the_wait_is_the_servers_retry_after_up_to_60_s(
        self, retry_after: str, waited: Optional[float]
    ) -> None:
        busy = Canned([b"busy"], status=429, headers={"Retry-After": retry_after})
        signal = Hurried()
        _, result = settle_prompt(
            canned_openai(busy, [OPENAI_TEXT_STREAM], retries=1), signal=signal
        )
        assert signal.waits == ([] if waited is None else [waited])
        assert (result.status == "completed") is (waited is not None), result.error

    def test_nothing_is_retried_after_the_first_chunk(self) -> None:
        first = Canned([MESSAGE_START, *anthropic_text(0, "Hi")[:2], OVERLOADED_EVENT])
        result, model = retried_once(first, "anthropic")
        assert_stream_error(result, "overloaded_error: Overloaded")
        assert cast(CannedTransport, model.transport).opened == 1

    def test_a_transport_may_raise_one_error_twice(self) -> None:
        # The error of the last attempt is said with its retries, on a copy of it.
        shared = providers.ProviderConnectionError("cannot connect to u: refused")
        model = canned_openai(Canned(failure=shared), Canned(failure=shared), retries=1)
        _, result = settle_prompt(model, signal=Hurried())
        error = assert_stream_error(
            result, "refused (after 1 retry)", kind=providers.ProviderConnectionError
        )
        assert error is not shared
        assert str(shared) == "cannot connect to u: refused"

    @pytest.mark.parametrize(("provider", "head", "end", "words"), UNFINISHED)
    def test_an_unfinished_answer_before_any_chunk_is_retried(
        self,
        provider: str,
        head: List[bytes],
        end: List[bytes],
        words: str,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        # Nothing was yielded: as after a broken connection, the answer is asked for again.
        model = canned_model(provider, [*head, *end], answer_parts(provider, ["Done."]), retries=1)
        with caplog.at_level(logging.WARNING):
            _, result = settle_prompt(model, signal=Hurried())
        assert (result.status, result.final_text) == ("completed", "Done."), result.error
        (logged,) = retry_logs(caplog)
        assert f"attempt 1 of 2 failed (the stream from {CANNED_URL[provider]} {words})" in logged
        assert [bool(exchange.reads) for exchange in exchanges(model)] == [True, True]

    @pytest.mark.parametrize(("provider", "head", "end", "words"), UNFINISHED)
    def test_an_unfinished_answer_fails_the_run_once_the_retries_are_spent(
        self, provider: str, head: List[bytes], end: List[bytes], words: str
    ) -> None:
        attempts = [Canned([*head, *end]) for _ in range(3)]
        model = canned_model(provider, *attempts, retries=2)
        _, result = settle_prompt(model, signal=Hurried())
        url = CANNED_URL[provider]
        assert_stream_error(
            result,
            f"the stream from {url} {words} (after 2 retries)",
            kind=providers.ProviderProtocolError,
        )
        assert [bool(attempt.reads) for attempt in attempts] == [True, True, True]
        assert len(result.messages) == 1

    @pytest.mark.parametrize(("provider", "head", "end", "words"), UNFINISHED)
    def test_an_unfinished_answer_after_a_chunk_fails_the_run_at_once(
        self, provider: str, head: List[bytes], end: List[bytes], words: str
    ) -> None:
        # Once a chunk was yielded, the loop has reported it: no retry.
        unused = Canned(answer_parts(provider, ["Done."]))
        model = canned_model(provider, [*head, TEXT[provider], *end], unused, retries=2)
        events, result = settle_prompt(model, signal=Hurried())
        error = assert_stream_error(result, f"the stream from {CANNED_URL[provider]} {words}")
        assert "(after" not in str(error)
        assert chunk_texts(events) == ["Hal"]
        assert unused.reads == 0

    def test_without_require_finish_reason_the_end_of_input_is_still_incomplete(self) -> None:
        model = canned_openai([openai_chunk({"content": "Hal"})], require_finish_reason=False)
        _, result = settle_prompt(model)
        assert_stream_error(result, "ended before data: [DONE] and without a finish_reason")


# --- Wire formats -------------------------------------------------------------------


class TestRequestBodies:
    """openai_request_body() and anthropic_request_body(): what the models send, alone."""

    def test_they_are_what_the_models_send(self) -> None:
        history = request(REQUEST_HISTORY, SPECS)
        options: Dict[str, Any] = {"temperature": 0}
        openai_model = canned_openai(system="Be brief.", options=options)
        assert posted(openai_model, history)["body"] == json.loads(
            providers.openai_request_body(
                history, "test-model", system="Be brief.", options=options
            )
        )
        anthropic_model = canned_anthropic(max_tokens=100, thinking="adaptive", options=options)
        assert posted(anthropic_model, history)["body"] == json.loads(
            providers.anthropic_request_body(
                history, "test-model", max_tokens=100, thinking="adaptive", options=options
            )
        )

    def test_the_defaults(self) -> None:
        user = {"role": "user", "content": "Hi."}
        assert json.loads(providers.openai_request_body(request(), "m")) == {
            "model": "m",
            "messages": [user],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        assert json.loads(providers.anthropic_request_body(request(), "m")) == {
            "model": "m",
            "max_tokens": 4096,
            "messages": [user],
            "stream": True,
        }

    @PROVIDERS
    def test_the_body_is_utf_8_json_as_written(self, provider: str) -> None:
        history = request([al.UserMessage("user-001", "Caf\u00e9 \U0001f600")])
        build = {
            "openai": providers.openai_request_body,
            "anthropic": providers.anthropic_request_body,
        }[provider]
        assert "Caf\u00e9 \U0001f600".encode() in build(history, "m")

    @pytest.mark.parametrize(
        ("arguments", "error", "words"),
        [
            pytest.param(
                {"request": "Hi."}, TypeError, "request must be a ModelRequest", id="req"
            ),
            pytest.param({"model": 1}, TypeError, "model must be a str", id="model-type"),
            pytest.param({"model": ""}, ValueError, "model must name", id="model-empty"),
            pytest.param({"system": 1}, TypeError, "system must be a str or None", id="system"),
            pytest.param(
                {"options": [1]}, TypeError, r"options must be a mapping or None;", id="opt-type"
            ),
            pytest.param({"options": {"a": {1}}}, TypeError, "must be plain JSON", id="set"),
            pytest.param(
                {"options": {"tools": []}}, ValueError, "options may not set tools", id="owned"
            ),
        ],
    )
    @PROVIDERS
    def test_bad_arguments(
        self, provider: str, arguments: Dict[str, Any], error: type, words: str
    ) -> None:
        given: Dict[str, Any] = {"request": request(), "model": "m", **arguments}
        build: Any = {
            "openai": providers.openai_request_body,
            "anthropic": providers.anthropic_request_body,
        }[provider]
        with pytest.raises(error, match=words):
            build(given.pop("request"), given.pop("model"), **given)

    @pytest.mark.parametrize(
        ("arguments", "error", "words"),
        [
            pytest.param({"max_tokens": 0}, ValueError, "an int >= 1, got 0", id="tokens"),
            pytest.param({"max_tokens": "1"}, TypeError, "max_tokens must be an int", id="str"),
            pytest.param({"thinking": "on"}, ValueError, "thinking must be None, 'ad", id="think"),
            pytest.param(
                {"options": {"system": "x"}}, ValueError, "may not set system", id="owned"
            ),
        ],
    )
    def test_bad_anthropic_arguments(
        self, arguments: Dict[str, Any], error: type, words: str
    ) -> None:
        with pytest.raises(error, match=words):
            providers.anthropic_request_body(request(), "m", **arguments)

    def test_a_models_options_error_says_a_function_is_allowed(self) -> None:
        with pytest.raises(TypeError, match="or None, or a function of the request; got list"):
            providers.OpenAIChatModel("m", options=[1])  # type: ignore[arg-type]


class TestAnswers:
    """The answers' public constructors check their arguments."""

    @pytest.mark.parametrize(
        ("arguments", "words"),
        [
            pytest.param({"request": "Hi."}, "request must be a ModelRequest, got str", id="req"),
            pytest.param({"accept_truncated": 1}, "accept_truncated must be a bool", id="cut"),
            pytest.param({"url": None}, "url must be a str, got NoneType", id="url"),
        ],
    )
    @pytest.mark.parametrize("answer", [providers.OpenAIAnswer, providers.AnthropicAnswer])
    def test_bad_arguments(self, answer: Any, arguments: Dict[str, Any], words: str) -> None:
        given: Dict[str, Any] = {"request": request(), **arguments}
        with pytest.raises(TypeError, match=words):
            answer(given.pop("request"), **given)

    def test_require_finish_reason_is_a_bool(self) -> None:
        with pytest.raises(TypeError, match="require_finish_reason must be a bool, got str"):
            providers.OpenAIAnswer(request(), require_finish_reason="no")  # type: ignore[arg-type]

    @PROVIDERS
    def test_the_url_names_the_stream_in_the_incomplete_answer_error(self, provider: str) -> None:
        answer_class: Any = {
            "openai": providers.OpenAIAnswer,
            "anthropic": providers.AnthropicAnswer,
        }
        answer = answer_class[provider](request(), url="http://h/x")
        with pytest.raises(providers.ProviderProtocolError, match="the stream from http://h/x "):
            parsed(answer, *answer_parts(provider, ["Hi"])[:-1])


class TestServerEvents:
    """The event-stream parser, from byte strings alone."""

    def parse(self, *reads: bytes) -> List[Tuple[str, str]]:
        parser = providers.ServerSentEvents()
        return [(event.event, event.data) for data in reads for event in parser.feed(data)]

    @pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
    def test_line_endings(self, ending: bytes) -> None:
        stream = b"event: a" + ending + b"data: 1" + ending + b"data:2" + ending + ending
        assert self.parse(stream) == [("a", "1\n2")]

    def test_any_split_gives_the_same_events(self) -> None:
        whole = (
            b': comment\r\nevent: x\r\ndata: {"a": "\xc3\xa9"}\r\nid: 7\r\nretry: 9\r\n\r\n'
            b"data\r\n\r\n"
        )
        expected = [("x", '{"a": "\u00e9"}'), ("", "")]
        assert self.parse(whole) == expected
        assert self.parse(*[whole[i : i + 1] for i in range(len(whole))]) == expected
        for cut in range(len(whole)):
            assert self.parse(whole[:cut], whole[cut:]) == expected

    def test_a_cr_at_the_end_of_a_read_then_another_line(self) -> None:
        assert self.parse(b"data: a\r", b"\r", b"data: b\r\r") == [("", "a"), ("", "b")]

    def test_a_blank_line_without_data_dispatches_nothing_and_resets_the_type(self) -> None:
        assert self.parse(b"event: a\n\ndata: b\n\n") == [("", "b")]

    def test_an_event_open_at_the_end_is_not_dispatched(self) -> None:
        assert self.parse(b"data: a\n\ndata: b\n") == [("", "a")]

    def test_the_end_of_the_input_drops_what_is_open(self) -> None:
        parser = providers.ServerSentEvents()
        assert parser.feed(b"event: x\ndata: a\ndata: b") == []
        assert parser.feed(b"") == []
        assert parser.feed(b"data: c\n\n") == [providers.ServerSentEvent("", "c")]  # none before

    def test_a_character_cut_by_the_end_of_the_input_is_malformed(self) -> None:
        parser = providers.ServerSentEvents()
        assert parser.feed("data: \u00e9".encode()[:-1]) == []
        with pytest.raises(providers.ProviderProtocolError, match="not UTF-8"):
            parser.feed(b"")

    def test_invalid_utf_8_is_malformed(self) -> None:
        with pytest.raises(providers.ProviderProtocolError, match="not UTF-8") as caught:
            self.parse(b"data: \xff\n\n")
        assert not caught.value.incomplete

    def test_a_leading_byte_order_mark_is_dropped(self) -> None:
        bom = "\ufeff".encode()
        assert self.parse(bom[:1], bom[1:] + b"data: a\n\n") == [("", "a")]
        assert self.parse(b"data: \xef\xbb\xbfa\n\n") == [("", "\ufeffa")]  # only the first

    def test_a_line_at_the_limit_passes_and_one_longer_is_malformed(self) -> None:
        limit = providers.MAX_EVENT_SIZE
        line = b"data:" + b"x" * (limit - len("data:"))
        assert self.parse(line, b"\n\n") == [("", "x" * (limit - 5))]
        with pytest.raises(providers.ProviderProtocolError, match="a line longer than 1,048,576"):
            self.parse(line + b"x")

    def test_an_event_at_the_limit_passes_and_one_longer_is_malformed(self) -> None:
        # The LF that joins the two lines counts: the data is exactly the limit.
        first = b"data: " + b"y" * (providers.MAX_EVENT_SIZE // 2) + b"\n"
        second = b"data: " + b"y" * (providers.MAX_EVENT_SIZE // 2 - 1) + b"\n"
        assert len(self.parse(first, second, b"\n")[0][1]) == providers.MAX_EVENT_SIZE
        with pytest.raises(
            providers.ProviderProtocolError, match="an event longer than 1,048,576"
        ):
            self.parse(first, second.replace(b" ", b" z"))

    def test_a_long_run_of_empty_data_lines_is_an_oversized_event(self) -> None:
        # A server that sends "data:" lines forever: the limit ends it, a read at a time.
        lines = b"data:\n" * (providers.MAX_EVENT_SIZE + 2)
        reads = [lines[start : start + 65_536] for start in range(0, len(lines), 65_536)]
        assert self.parse(*reads[:-1], reads[-1][: -len(b"data:\n")], b"\n") == [
            ("", "\n" * providers.MAX_EVENT_SIZE)
        ]
        with pytest.raises(
            providers.ProviderError, match="malformed event stream: an event longer than 1,048,576"
        ):
            self.parse(*reads)

    def test_the_size_starts_again_after_each_event_and_at_the_end_of_the_input(self) -> None:
        # An event of the limit's size, twice: the first one's size is not counted in the
        # second's, dispatched or dropped at the end of the input.
        full = b"data: " + b"z" * providers.MAX_EVENT_SIZE + b"\n"
        parser = providers.ServerSentEvents()
        assert [len(event.data) for event in parser.feed(full + b"\n" + full + b"\n")] == [
            providers.MAX_EVENT_SIZE,
            providers.MAX_EVENT_SIZE,
        ]
        assert parser.feed(full) == []
        assert parser.feed(b"") == []  # dropped
        assert len(parser.feed(full + b"\n")[0].data) == providers.MAX_EVENT_SIZE

    def test_events_are_frozen_values(self) -> None:
        event = providers.ServerSentEvent("message_stop", "{}")
        assert event == providers.ServerSentEvent("message_stop", "{}")
        with pytest.raises(AttributeError):
            event.data = "x"  # type: ignore[misc]
