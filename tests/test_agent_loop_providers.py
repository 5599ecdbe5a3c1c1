"""Tests of agent_loop_providers.py: the adapters and their wire formats, from bytes alone.

The layer tested here is sans-IO, through its public names: request bodies from
``openai_request_body()`` / ``anthropic_request_body()`` (and the requests a model sends),
answers by feeding byte-exact event streams to ``OpenAIAnswer`` / ``AnthropicAnswer``,
heads to ``check_response_head()``. Streams through ``stream()`` and ``run_agent_loop``
read canned bytes through the models' public seam, ``transport=`` (``CannedTransport``,
below), so the loop's own limit checks judge them. What fails and what it says (the
broken-answer tables, heads) is in test_agent_loop_providers_failures.py, the retries and
the pauses a model's attempts share in test_agent_loop_providers_retries.py. No test in
these three files opens a socket or starts a process: what needs one (connecting,
timeouts, TLS, the default transport's failures, cancellation, closing, llmock) is in
test_agent_loop_providers_connection.py, and the command line in test_agent_loop_cli.py.
The builders that the files share (event streams, the transport seam's ``Canned``
exchanges, ``settle_prompt``...) are in loop_testing_providers.py.
"""

from __future__ import annotations

import json
import logging
import re
import ssl
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, cast

import pytest

import agent_loop as al
import agent_loop_providers as providers
from loop_testing import add_tool, documentation
from loop_testing_providers import (
    ADD,
    DONE,
    MESSAGE_START,
    MODEL_CLASSES,
    OPENAI_REASONING_STREAM,
    OPENAI_TEXT_STREAM,
    OPENAI_TOOL_STREAM,
    PROVIDERS,
    REASONING_USAGE,
    REQUEST_HISTORY,
    SPECS,
    STOP,
    AnswerItem,
    Attempt,
    CannedTransport,
    answer_parts,
    anthropic_delta,
    anthropic_end,
    anthropic_event,
    anthropic_redacted,
    anthropic_sent_result,
    anthropic_start,
    anthropic_stop,
    anthropic_text,
    anthropic_thinking,
    anthropic_tool,
    canned_anthropic,
    canned_model,
    canned_openai,
    chunk_texts,
    exchanges,
    in_pieces,
    new_answer,
    openai_call,
    openai_chunk,
    openai_sent_call,
    openai_usage,
    parsed,
    posted,
    request,
    settle_prompt,
    sse,
    stream,
)

# --- Builders -----------------------------------------------------------------------


def anthropic_sent_use(id: str, name: str, arguments: Dict[str, Any]) -> Dict[str, Any]:
    """A tool call as the Anthropic adapter sends it back."""
    return {"type": "tool_use", "id": id, "name": name, "input": arguments}


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


def assert_protocol_error(result: al.RunResult, words: str) -> None:
    """The run failed MODEL_PROTOCOL_ERROR saying words, and added nothing."""
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.code == "MODEL_PROTOCOL_ERROR"
    assert words in result.error.message
    assert len(result.messages) == 1


HI_CHUNK = openai_chunk({"content": "Hi"})


# Each public constructor and body builder, by name, and its positional parameters.
BUILDERS: List[Tuple[Callable[..., object], Tuple[str, ...]]] = [
    (providers.OpenAIChatModel, ("model",)),
    (providers.AnthropicMessagesModel, ("model",)),
    (providers.openai_request_body, ("request", "model")),
    (providers.anthropic_request_body, ("request", "model")),
    (providers.OpenAIAnswer, ("request",)),
    (providers.AnthropicAnswer, ("request",)),
]
BUILT = {build.__name__: (build, positional) for build, positional in BUILDERS}


MODELS = ("OpenAIChatModel", "AnthropicMessagesModel")
BODIES = ("openai_request_body", "anthropic_request_body")
ANSWERS = ("OpenAIAnswer", "AnthropicAnswer")
ANTHROPIC, T, V = ("AnthropicMessagesModel",), TypeError, ValueError
# Call-time misuse of each public constructor and body builder: (the names it is given to,
# an id, the arguments, the error, the words that name the parameter, the rule, the value).
BAD: List[Tuple[Sequence[str], str, Dict[str, Any], type, str]] = [
    (MODELS, "model-type", {"model": 1}, T, "model must be a str"),
    (MODELS, "model-empty", {"model": ""}, V, "model must name"),
    (MODELS, "url-type", {"base_url": b"x"}, T, "base_url must be a str"),
    (MODELS, "scheme", {"base_url": "ftp://h"}, V, "base_url must be"),
    (MODELS, "no-host", {"base_url": "http://"}, V, "base_url must be"),
    (MODELS, "query", {"base_url": "http://h/?a=1"}, V, "no query"),
    (MODELS, "fragment", {"base_url": "http://h/#a"}, V, "base_url"),
    (MODELS, "port", {"base_url": "http://h:x/"}, V, "invalid port"),
    (MODELS, "api-key", {"api_key": 1}, T, "api_key must be a str"),
    (MODELS, "system", {"system": 1}, T, "system must be a str"),
    (MODELS, "bool", {"timeout": True}, T, "timeout must be a number"),
    (MODELS, "str", {"timeout": "1"}, T, "timeout must be a number"),
    (MODELS, "zero", {"timeout": 0}, V, "timeout must be a finite"),
    (MODELS, "negative", {"timeout": -1.0}, V, "timeout must be"),
    (MODELS, "inf", {"timeout": float("inf")}, V, "timeout must be"),
    (MODELS, "opt-type", {"options": [1]}, T, "options must be a mapping"),
    (MODELS, "set", {"options": {"a": {1}}}, T, "options must be plain"),
    (MODELS, "nan", {"options": {"a": float("nan")}}, T, "options must be plain"),
    (MODELS, "owned", {"options": {"messages": [], "stream": False}}, V,
     "options may not set messages, stream"),
    (MODELS, "retry-bool", {"retries": True}, T, "retries must be an int"),
    (MODELS, "retry-float", {"retries": 1.0}, T, "retries must be an int"),
    (MODELS, "retry-neg", {"retries": -1}, V, r"retries must be an int >= 0 \(0: no"),
    (MODELS, "ssl", {"ssl_context": "ca.pem"}, T, "ssl_context must be an ssl"),
    (MODELS, "cut", {"accept_truncated": 1}, T, "accept_truncated must be a bool"),
    *[
        (MODELS, f"concurrency-{name}", {"max_concurrency": value}, error, words)
        for name, value, error, words in [
            ("bool", True, T, "max_concurrency must be an int or None, got True"),
            ("float", 2.0, T, "max_concurrency must be an int or None, got 2.0"),
            ("str", "2", T, "max_concurrency must be an int or None, got '2'"),
            ("zero", 0, V, r"max_concurrency must be an int >= 1 \(None: no"),
            ("negative", -1, V, "max_concurrency must be an int >= 1 .*got -1"),
        ]
    ],
    (ANTHROPIC, "bool", {"max_tokens": True}, T, "max_tokens must be an int"),
    (ANTHROPIC, "float", {"max_tokens": 1.5}, T, "max_tokens must be an int"),
    (ANTHROPIC, "tokens-zero", {"max_tokens": 0}, V, "an int >= 1, got 0"),
    (ANTHROPIC, "str", {"thinking": "enabled"}, V, "thinking must be None, 'adaptive' or"),
    (ANTHROPIC, "int", {"thinking": 2048}, T, "thinking must be None, 'adaptive' or a"),
    (ANTHROPIC, "thinking-bool", {"thinking": True}, T, "got bool"),
    (ANTHROPIC, "type", {"thinking": {"budget_tokens": 2048}}, V, "must say its 'type'"),
    (ANTHROPIC, "type-int", {"thinking": {"type": 1}}, V, "must say its 'type'"),
    (ANTHROPIC, "json", {"thinking": {"type": "enabled", "x": {1}}}, T, "plain JSON"),
    (ANTHROPIC, "thinking", {"options": {"thinking": {}}}, V, "may not set thinking"),
    (ANTHROPIC, "owned", {"options": {"max_tokens": 1, "system": "x"}}, V,
     "options may not set max_tokens, system"),
    (BODIES, "req", {"request": "Hi."}, T, "request must be a ModelRequest"),
    (BODIES, "model-type", {"model": 1}, T, "model must be a str"),
    (BODIES, "model-empty", {"model": ""}, V, "model must name"),
    (BODIES, "system", {"system": 1}, T, "system must be a str or None"),
    (BODIES, "opt-type", {"options": [1]}, T, r"options must be a mapping or None;"),
    (BODIES, "set", {"options": {"a": {1}}}, T, "must be plain JSON"),
    (BODIES, "owned", {"options": {"tools": []}}, V, "options may not set tools"),
    (BODIES[1:], "tokens", {"max_tokens": 0}, V, "an int >= 1, got 0"),
    (BODIES[1:], "str", {"max_tokens": "1"}, T, "max_tokens must be an int"),
    (BODIES[1:], "think", {"thinking": "on"}, V, "thinking must be None, 'ad"),
    (BODIES[1:], "owned", {"options": {"system": "x"}}, V, "may not set system"),
    (ANSWERS, "req", {"request": "Hi."}, T, "request must be a ModelRequest, got str"),
    (ANSWERS, "cut", {"accept_truncated": 1}, T, "accept_truncated must be a bool"),
    (ANSWERS, "url", {"url": None}, T, "url must be a str, got NoneType"),
    *[
        (("OpenAIChatModel", "OpenAIAnswer"), f"finish-{value}", {"require_finish_reason": value},
         T, f"require_finish_reason must be a bool, got {type(value).__name__}")
        for value in (1, "yes", None)
    ],
]  # fmt: skip
BAD_ARGUMENTS = [
    pytest.param(name, arguments, error, words, id=f"{name}-{id}")
    for names, id, arguments, error, words in BAD
    for name in names
]


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
        # What the spans read: the provider, the model's name, where it is served.
        assert (openai_model.provider_name, anthropic_model.provider_name) == (
            "openai",
            "anthropic",
        )
        assert (openai_model.model, anthropic_model.model) == ("gpt-4o", "claude")

    def test_a_trailing_slash_is_dropped_and_an_int_timeout_is_seconds(self) -> None:
        model = providers.OpenAIChatModel("m", base_url="http://localhost:11434/v1/", timeout=2)
        assert model.base_url == "http://localhost:11434/v1"
        assert model.timeout == 2.0

    @pytest.mark.parametrize(("name", "arguments", "error", "words"), BAD_ARGUMENTS)
    def test_bad_arguments(
        self, name: str, arguments: Dict[str, Any], error: type, words: str
    ) -> None:
        build, positional = BUILT[name]
        given: Dict[str, Any] = {"request": request(), "model": "m", **arguments}
        first = [given.pop(key) for key in positional]
        rest = {key: value for key, value in given.items() if key not in ("request", "model")}
        with pytest.raises(error, match=words):
            build(*first, **rest)

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

    def test_retries_0_a_context_and_no_finish_reason_are_kept(self) -> None:
        context = ssl.create_default_context()
        model = providers.OpenAIChatModel(
            "m", retries=0, ssl_context=context, require_finish_reason=False
        )
        assert (model.retries, model.ssl_context, model.require_finish_reason) == (
            0,
            context,
            False,
        )

    @pytest.mark.parametrize("limit", [1, 64])
    @PROVIDERS
    def test_a_positive_max_concurrency_is_kept(self, provider: str, limit: int) -> None:
        assert MODEL_CLASSES[provider]("m", max_concurrency=limit).max_concurrency == limit

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
        assert providers.__version__ == "1.5.0"
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
            "response-001",
            "request-001",
            [al.TextBlock("Hello, world")],
            "stop",
            None,
            "chatcmpl-9",
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

    def test_a_fragment_without_a_function_belongs_to_its_call(self) -> None:
        # The id may come alone first; the name and arguments follow under the same index.
        id_only = {"index": 0, "id": "call_1", "type": "function"}
        parts = [
            openai_chunk({"tool_calls": [id_only]}),
            openai_call(0, None, "add", '{"left": 1, "right": 2}'),
            STOP,
            DONE,
        ]
        _, response = stream(canned_openai(parts))
        assert response.content == (al.ToolCall("call_1", "add", {"left": 1, "right": 2}),)

    def test_a_choice_without_a_delta_is_its_finish_alone(self) -> None:
        parts = [HI_CHUNK, sse({"choices": [{"index": 0, "finish_reason": "stop"}]}), DONE]
        chunks, response = stream(canned_openai(parts))
        assert (len(chunks), response.content) == (1, (al.TextBlock("Hi"),))

    def test_a_provider_id_repeated_in_one_response_is_taken_once(self) -> None:
        parts = [openai_call(0, "call_0", "add", ""), openai_call(1, "call_0", "add", "")]
        _, response = stream(canned_openai([*parts, STOP, DONE]))
        ids = [block.id for block in response.content if isinstance(block, al.ToolCall)]
        assert ids == ["call_0", "response-001-call-2"]

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
            "response-001",
            "request-001",
            [al.TextBlock("Adding."), call],
            "toolCall",
            usage,
            "msg_01",
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

    def test_a_start_without_its_text_thinking_or_signature_starts_empty(self) -> None:
        parts = [
            MESSAGE_START,
            anthropic_start(0, {"type": "thinking"}),
            anthropic_delta(0, type="thinking_delta", thinking="Hm."),
            anthropic_delta(0, type="signature_delta", signature="sig"),
            anthropic_stop(0),
            anthropic_start(1, {"type": "text"}),
            anthropic_delta(1, type="text_delta", text="Hi."),
            anthropic_stop(1),
            *anthropic_end(),
        ]
        chunks, response = stream(canned_anthropic(parts))
        assert chunks == [
            al.ThinkingDelta("request-001", "Hm."),
            al.TextDelta("request-001", "Hi."),
        ]
        assert response.content == (al.ThinkingBlock("Hm.", "sig"), al.TextBlock("Hi."))

    @pytest.mark.parametrize(
        ("start", "deltas", "signature"),
        [
            pytest.param({"signature": "s0"}, [], "s0", id="the-starts-signature"),
            pytest.param({"signature": "s0"}, ["s1"], "s1", id="a-later-delta-wins"),
            pytest.param({}, [], None, id="none-at-all"),
            pytest.param({"signature": ""}, [], None, id="empty-is-none"),
        ],
    )
    def test_a_thinking_blocks_signature(
        self, start: Dict[str, Any], deltas: List[str], signature: Optional[str]
    ) -> None:
        parts = [
            MESSAGE_START,
            anthropic_start(0, {"type": "thinking", "thinking": "", **start}),
            anthropic_delta(0, type="thinking_delta", thinking="Hm."),
            *[anthropic_delta(0, type="signature_delta", signature=each) for each in deltas],
            anthropic_stop(0),
            *anthropic_text(1, "Hi."),
            *anthropic_end(),
        ]
        _, response = stream(canned_anthropic(parts))
        (thinking, _) = response.content
        assert isinstance(thinking, al.ThinkingBlock)
        assert (thinking.thinking, thinking.signature) == ("Hm.", signature)

    def test_a_tool_use_without_input_or_deltas_has_no_arguments(self) -> None:
        parts = [
            MESSAGE_START,
            anthropic_start(0, {"type": "tool_use", "id": "toolu_1", "name": "now"}),
            anthropic_stop(0),
            *anthropic_end("tool_use"),
        ]
        _, response = stream(canned_anthropic(parts))
        assert response.content == (al.ToolCall("toolu_1", "now", {}),)

    def test_an_empty_text_block_is_not_kept(self) -> None:
        parts = [
            MESSAGE_START,
            *anthropic_text(0),
            *anthropic_tool(1, "toolu_1", "add", '{"left": 1, "right": 2}'),
            *anthropic_end("tool_use"),
        ]
        _, response = stream(canned_anthropic(parts))
        assert response.content == (al.ToolCall("toolu_1", "add", {"left": 1, "right": 2}),)

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
            provider_response_id="msg_01...",  # the example's own id, as it spells it
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
            "response-001", "request-001", content, "stop", REASONING_USAGE, "d1"
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
        # Thinking, thinking, then text, a read at a time and in one read: the last chunk
        # decides, not the first nor the one before it.
        items: List[AnswerItem] = [al.ThinkingBlock("a"), al.ThinkingBlock("b"), "Once"]
        parts = answer_parts(provider, items, end=TOKEN_LIMIT[provider])
        thinking = al.ThinkingBlock("ab", "sig-0" if provider == "anthropic" else None)
        said = "token limit (finish" if provider == "openai" else "max_tokens limit (stop"
        for reads in (parts, [b"".join(parts)]):
            answer = new_answer(provider, accept_truncated=True)
            with caplog.at_level(logging.DEBUG):
                chunks = [chunk for read in reads for chunk in answer.feed(read)]
            assert [type(chunk) for chunk in chunks] == [
                al.ThinkingDelta,
                al.ThinkingDelta,
                al.TextDelta,
            ]
            assert answer.done
            assert answer.response().content == (thinking, al.TextBlock("Once"))
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

    def test_a_models_options_error_says_a_function_is_allowed(self) -> None:
        with pytest.raises(TypeError, match="or None, or a function of the request; got list"):
            providers.OpenAIChatModel("m", options=[1])  # type: ignore[arg-type]


class TestAnswers:
    """The answers' public constructors check their arguments."""

    @PROVIDERS
    def test_the_url_names_the_stream_in_the_incomplete_answer_error(self, provider: str) -> None:
        answer_class: Any = {
            "openai": providers.OpenAIAnswer,
            "anthropic": providers.AnthropicAnswer,
        }
        answer = answer_class[provider](request(), url="http://h/x")
        with pytest.raises(providers.ProviderProtocolError, match="the stream from http://h/x "):
            parsed(answer, *answer_parts(provider, ["Hi"])[:-1])
