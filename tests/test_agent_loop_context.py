"""Tests of agent_loop_context.py: fit(model, window), whose every request fits the window."""

from __future__ import annotations

import random
import threading
from typing import Any, Dict, Generator, List, Sequence, Tuple

import pytest

import agent_loop as al
import agent_loop_context as ctx
from loop_testing import echo_tool, run, text, user

# --- One fake model: it answers as the providers' adapters do, from the view it sees ----


class Refusal(Exception):
    """A provider's refusal of a request longer than its context."""

    context_exceeded = True


class ViewModel:
    """Answers each request by ``plan(request, number)``: a list of blocks, or an exception
    to raise before the first chunk. Like the adapters, it picks a response id
    ("response-NNN" by request number) and call ids ("call-N") that are free in the
    request it sees, the view, and nothing else. Records every request (``views``) and
    the summary requests apart (``summaries``); reports input tokens when ``reports``."""

    def __init__(self, plan: Any, reports: bool = False, summary: str = "S") -> None:
        self.plan = plan
        self.reports = reports
        self.summary = summary
        self.views: List[al.ModelRequest] = []
        self.summaries: List[al.ModelRequest] = []

    def stream(
        self, request: al.ModelRequest, signal: Any
    ) -> Generator[al.ModelChunk, None, al.ModelResponse]:
        asks_summary = request.messages[-1].content == ctx.SUMMARY_PROMPT
        (self.summaries if asks_summary else self.views).append(request)
        planned = [text(self.summary)] if asks_summary else self.plan(request, len(self.views))
        if isinstance(planned, BaseException):
            raise planned
        ids = {message.id for message in request.messages}
        calls = {
            block.id
            for message in request.messages
            if isinstance(message, al.AssistantMessage)
            for block in message.content
            if isinstance(block, al.ToolCall)
        }
        number = al.request_number(request.id) or 0
        response_id = _free(f"response-{number:03d}", lambda c: "message-" + c in ids)
        content: List[Any] = []
        for block in planned:
            if isinstance(block, al.ToolCall):
                block = al.ToolCall(
                    _free("call-1", calls.__contains__), block.name, block.arguments
                )
                calls.add(block.id)
            content.append(block)
            yield (
                al.ToolCallChunk(request.id, block)
                if isinstance(block, al.ToolCall)
                else al.TextDelta(request.id, block.text)
            )
        usage = al.Usage(ctx.estimate_tokens(request), 1) if self.reports else None
        stop = "toolCall" if any(isinstance(b, al.ToolCall) for b in content) else "stop"
        return al.ModelResponse(response_id, request.id, content, stop, usage)  # type: ignore[arg-type]


def _free(base: str, taken: Any) -> str:
    candidate, suffix = base, 1
    while taken(candidate):
        suffix += 1
        candidate = f"{base}-{suffix}"
    return candidate


def echo(value: str) -> al.ToolCall:
    return al.ToolCall("planned", "echo", {"text": value})


def chat(
    model: Any, window: ctx.ContextWindow, turns: Sequence[str], **options: Any
) -> Tuple[List[al.RunResult], ctx.FittedModel]:
    """A conversation of one run per turn through one fitted model, each run's request ids
    from request-001 (so the adapter's ids collide with older turns' when folded)."""
    fitted = ctx.fit(model, window)
    results: List[al.RunResult] = []
    messages: Tuple[al.Message, ...] = ()
    for number, words in enumerate(turns, 1):
        start = [*al.resolve_open_tool_calls(messages, "interrupted"), user(words, f"u{number}")]
        _, result, _ = run(fitted, [echo_tool(), failing_tool()], messages=start, **options)
        results.append(result)
        messages = result.messages
    return results, fitted


def failing_tool() -> al.Tool:
    def fail(arguments: Dict[str, Any], signal: Any) -> object:
        raise al.ToolError("no")

    return al.Tool("fail", "Fails.", {"type": "object"}, fail)


def answer(request: al.ModelRequest, number: int) -> Any:
    """One tool call, then a text answer, per turn."""
    last = request.messages[-1]
    return [text("done")] if isinstance(last, al.ToolResultMessage) else [echo("x" * 40)]


# --- The window ---------------------------------------------------------------------------


class TestContextWindow:
    @pytest.mark.parametrize(
        ("arguments", "error"),
        [
            ({"max_tokens": 0}, ValueError),
            ({"max_tokens": True}, ValueError),
            ({"max_tokens": 10, "keep_recent_tokens": 11}, ValueError),
            ({"max_tokens": 10, "keep_recent_tokens": -1}, ValueError),
            ({"max_tokens": 10, "summarize": "no"}, TypeError),
            ({"max_tokens": 10, "count_tokens": 3}, TypeError),
        ],
        ids=["zero", "bool", "keep-over-max", "keep-negative", "summarize", "count_tokens"],
    )
    def test_a_bad_field_raises_naming_it(self, arguments: Dict[str, Any], error: type) -> None:
        with pytest.raises(error, match=list(arguments)[-1]):
            ctx.ContextWindow(**arguments)

    def test_the_limits_are_accepted(self) -> None:
        assert ctx.ContextWindow(1).keep_recent_tokens == 0
        assert ctx.ContextWindow(10, keep_recent_tokens=10).keep_recent_tokens == 10
        assert ctx.ContextWindow(10).keep_recent_tokens == 5

    @pytest.mark.parametrize(
        ("model", "window"), [(object(), ctx.ContextWindow(10)), (al.ScriptedModel([]), 10)]
    )
    def test_fit_refuses_what_is_not_a_model_or_a_window(self, model: Any, window: Any) -> None:
        with pytest.raises(TypeError):
            ctx.fit(model, window)

    def test_the_estimate_is_a_quarter_of_the_json_characters_rounded_up(self) -> None:
        message = al.UserMessage("u", "abcd")  # {"id":"u","role":"user","content":"abcd"}: 41
        request = al.ModelRequest("request-001", (message,), ())
        assert ctx.estimate_tokens(request) == 11


# --- Folding --------------------------------------------------------------------------------


class TestFolding:
    def test_a_request_that_fits_is_sent_as_it_is(self) -> None:
        model = ViewModel(answer)
        results, fitted = chat(model, ctx.ContextWindow(10_000), ["hi"])
        assert results[0].status == "completed"
        assert [view.messages for view in model.views] == [
            results[0].messages[:1],
            results[0].messages[:3],
        ]
        assert fitted.folds == []
        assert model.summaries == []

    def test_older_turns_fold_into_one_summary_made_once_and_reused(self) -> None:
        model = ViewModel(answer)
        window = ctx.ContextWindow(300, keep_recent_tokens=150)
        results, fitted = chat(model, window, [f"turn {n}" for n in range(8)])
        assert all(result.status == "completed" for result in results)
        assert len(fitted.folds) == len(model.summaries) >= 2  # one summary per fold
        summarized = [view for view in model.views if view.messages[0].id.startswith("summary")]
        assert len(summarized) > len(fitted.folds)  # a summary serves several requests
        for view in model.views:
            assert ctx.estimate_tokens(view) <= 300
            assert not view.messages[-1].id.startswith("summary")  # the newest verbatim
        # A later fold summarizes the previous summary and what it folds.
        second = model.summaries[1].messages
        assert second[0] == fitted.folds[0].message()
        assert second[-1].content == ctx.SUMMARY_PROMPT
        fold = fitted.folds[0]
        assert fold.tokens_before > 300 >= fold.tokens_after
        assert fold.usage is None

    def test_the_provider_reported_input_tokens_count_for_what_it_saw(self) -> None:
        """Reported tokens plus the estimate after them: a model that reports 100x what it
        saw makes the window fold sooner than the estimate alone would."""
        counted = []

        def plan(request: al.ModelRequest, number: int) -> Any:
            counted.append(request)
            return answer(request, number)

        class Inflating(ViewModel):
            def stream(self, request: al.ModelRequest, signal: Any) -> Any:
                response = yield from super().stream(request, signal)
                return al.ModelResponse(
                    response.id, response.request_id, response.content, response.stop_reason,
                    al.Usage(100 * ctx.estimate_tokens(request)),
                )  # fmt: skip

        for model, folds in ((ViewModel(plan), 0), (Inflating(plan), 1)):
            _, fitted = chat(model, ctx.ContextWindow(2000), ["one"])
            assert len(fitted.folds) == folds

    def test_a_fitted_model_given_another_conversation_starts_without_a_fold(self) -> None:
        model = ViewModel(answer)
        _, fitted = chat(model, ctx.ContextWindow(300, keep_recent_tokens=100), ["a", "b", "c"])
        assert fitted.folds
        _, result, _ = run(fitted, [echo_tool()], messages=[user("again", "other")])
        assert model.views[-1].messages == result.messages[:3]

    def test_count_tokens_and_summarize_replace_the_defaults(self) -> None:
        seen: List[int] = []

        def summarize(messages: Tuple[al.Message, ...]) -> str:
            seen.append(len(messages))
            return "short"

        window = ctx.ContextWindow(
            5,
            keep_recent_tokens=1,
            count_tokens=lambda request: len(request.messages),
            summarize=summarize,
        )
        model = ViewModel(answer)
        _results, fitted = chat(model, window, ["a", "b", "c"])
        assert all(len(view.messages) <= 5 for view in model.views)
        assert model.summaries == []
        assert seen
        assert fitted.folds[0].summary == "short"

    def test_the_default_summary_is_asked_of_the_model_with_no_tools_and_its_usage_kept(
        self,
    ) -> None:
        class Reporting(ViewModel):
            def stream(self, request: al.ModelRequest, signal: Any) -> Any:
                response = yield from super().stream(request, signal)
                return al.ModelResponse(
                    response.id, response.request_id, response.content, response.stop_reason,
                    al.Usage(output_tokens=3),
                )  # fmt: skip

        model = Reporting(answer, summary="the gist")
        folds: List[ctx.Fold] = []
        fitted = ctx.fit(model, ctx.ContextWindow(250), on_fold=folds.append)
        messages: Tuple[al.Message, ...] = ()
        for number in range(4):
            start = [*messages, user("words " * 10, f"u{number}")]
            messages = run(fitted, [echo_tool()], messages=start)[1].messages
        assert folds == fitted.folds
        assert folds
        assert model.summaries[0].tools == ()
        assert folds[0].usage == al.Usage(output_tokens=3)
        assert folds[0].message().content == ctx.SUMMARY_HEADER + "the gist"


# --- Pairing, ids, overflow, refusals --------------------------------------------------------


class TestRules:
    def test_a_cut_never_falls_between_a_tool_call_and_its_result(self) -> None:
        """Three calls at once whose results fill the window: the cut moves before the
        assistant message, so each kept result follows its call."""

        def plan(request: al.ModelRequest, number: int) -> Any:
            if isinstance(request.messages[-1], al.ToolResultMessage):
                return [text("done")]
            return [echo("y" * 60), echo("z" * 60), echo("w" * 60)]

        model = ViewModel(plan)
        results, fitted = chat(
            model, ctx.ContextWindow(600, keep_recent_tokens=300), ["a", "b", "c"]
        )
        assert fitted.folds
        assert all(r.status == "completed" for r in results)
        for view in model.views:
            _check_view(view)

    def test_ids_stay_unique_against_the_whole_transcript(self) -> None:
        """The issue's collision: folded, the adapter's view no longer holds
        'message-response-002', so it picks that id again; the loop receives it renamed,
        and so are the call ids the view let it reuse."""
        model = ViewModel(answer)
        results, _ = chat(model, ctx.ContextWindow(300, keep_recent_tokens=100), ["a", "b", "c"])
        assert all(result.status == "completed" for result in results)
        ids = [message.id for message in results[-1].messages]
        assert ids.count("message-response-002") == 1
        assert "message-response-002-2" in ids
        assert len(set(ids)) == len(ids)

    def test_taken_ids_are_never_used(self) -> None:
        model = ViewModel(answer)
        taken = {"message-response-001", "call-1", "summary"}
        fitted = ctx.fit(model, ctx.ContextWindow(10_000), taken=taken)
        _, result, _ = run(fitted, [echo_tool()])
        ids = [message.id for message in result.messages]
        assert ids == ["user-001", "message-response-001-2", "tool-result-call-1-2",
                       "message-response-002"]  # fmt: skip

    @pytest.mark.parametrize(
        ("room", "status"), [(0, "completed"), (-1, "failed")], ids=["at-limit", "over-limit"]
    )
    def test_a_request_that_cannot_fit_fails_the_run_naming_the_window(
        self, room: int, status: str
    ) -> None:
        message = user("q" * 100)
        needed = ctx.estimate_tokens(al.ModelRequest("request-001", (message,), ()))
        fitted = ctx.fit(
            ViewModel(lambda request, n: [text("ok")]), ctx.ContextWindow(needed + room)
        )
        _, result, _ = run(fitted, messages=[message])
        assert result.status == status
        if status == "failed":
            assert result.error is not None
            assert result.error.code == "MODEL_STREAM_ERROR"
            assert (
                f"does not fit the context window of {needed - 1} tokens" in result.error.message
            )
            assert isinstance(result.error.exception, ctx.ContextOverflow)

    @pytest.mark.parametrize(
        ("refusals", "turns", "status"),
        [(1, 3, "completed"), (2, 3, "failed"), (1, 1, "failed"), (0, 1, "completed")],
        ids=["folds-and-asks-again", "refused-twice", "nothing-to-fold", "no-refusal"],
    )
    def test_a_context_refusal_is_answered_by_folding_and_asking_once_more(
        self, refusals: int, turns: int, status: str
    ) -> None:
        left = [refusals]

        def plan(request: al.ModelRequest, number: int) -> Any:
            if request.messages[-1].id == f"u{turns}" and left[0] > 0:
                left[0] -= 1
                return Refusal("maximum context length")
            return answer(request, number)

        model = ViewModel(plan)
        results, fitted = chat(model, ctx.ContextWindow(10_000), [f"t{n}" for n in range(turns)])
        assert results[-1].status == status
        if status == "failed":
            assert isinstance(results[-1].error.exception, Refusal)  # type: ignore[union-attr]
        assert len(fitted.folds) == (1 if turns > 1 and refusals else 0)

    @pytest.mark.parametrize(
        ("window", "plan", "what"),
        [
            (ctx.ContextWindow(1, count_tokens=lambda r: "1"), answer, "count_tokens"),  # type: ignore[arg-type,return-value]
            (ctx.ContextWindow(200, summarize=lambda m: 1), answer, "summarize"),  # type: ignore[arg-type,return-value]
            (ctx.ContextWindow(10_000), lambda r, n: ValueError("down"), "down"),
        ],
        ids=["count-not-int", "summary-not-str", "other-error"],
    )
    def test_what_the_callbacks_or_the_model_get_wrong_fails_the_run(
        self, window: ctx.ContextWindow, plan: Any, what: str
    ) -> None:
        results, _ = chat(ViewModel(plan), window, ["a" * 200, "b" * 200])
        failed = [r for r in results if r.status == "failed"]
        assert failed
        assert failed[0].error is not None
        assert what in failed[0].error.message

    def test_a_summary_stream_that_returns_no_response_fails_the_run(self) -> None:
        def nothing() -> Generator[al.ModelChunk, None, None]:
            return None
            yield  # a generator

        class NoSummary(ViewModel):
            def stream(self, request: al.ModelRequest, signal: Any) -> Any:
                if request.messages[-1].content == ctx.SUMMARY_PROMPT:
                    return nothing()
                return super().stream(request, signal)

        results, _ = chat(NoSummary(answer), ctx.ContextWindow(200), ["a" * 300, "b"])
        assert "the summary request's stream returned" in str(results)

    @pytest.mark.parametrize(
        ("response", "kept"),
        [
            (lambda request: al.ModelResponse("response-001", request.id, [], "stop"), False),
            (lambda request: "not a response", True),
            (
                lambda r: al.ModelResponse(
                    "r",
                    r.id,
                    [al.ToolCall(5, "echo", {})],  # type: ignore[arg-type]
                    "toolCall",
                ),
                True,
            ),
        ],
        ids=["no-chunk", "not-a-response", "call-id-not-a-str"],
    )
    def test_an_answer_without_chunks_or_not_a_response_reaches_the_loop(
        self, response: Any, kept: bool
    ) -> None:
        class Bare:
            def stream(self, request: al.ModelRequest, signal: Any) -> Any:
                yield from ()  # a generator
                return response(request)

        fitted = ctx.fit(Bare(), ctx.ContextWindow(10_000), taken={"message-response-001"})
        _, result, _ = run(fitted, max_steps=1)
        if kept:
            assert result.error is not None
            assert result.error.code == "MODEL_PROTOCOL_ERROR"
        else:
            assert [m.id for m in result.messages][-1] == "message-response-001-2"


def _check_view(view: al.ModelRequest) -> None:
    """Pairing (each result follows its call, each call has its result) and unique ids."""
    ids = [message.id for message in view.messages]
    assert len(set(ids)) == len(ids), ids
    open_calls: Dict[str, str] = {}
    seen_calls: List[str] = []
    for message in view.messages:
        if isinstance(message, al.AssistantMessage):
            for block in message.content:
                if isinstance(block, al.ToolCall):
                    open_calls[block.id] = block.name
                    seen_calls.append(block.id)
        elif isinstance(message, al.ToolResultMessage):
            assert open_calls.pop(message.tool_call_id) == message.tool_name
    assert open_calls == {}
    assert len(set(seen_calls)) == len(seen_calls)


# --- The property: over random conversations --------------------------------------------------


class TestProperty:
    @pytest.mark.parametrize("seed", range(12))
    def test_no_view_breaks_pairing_uniqueness_or_the_window(self, seed: int) -> None:
        """Random conversations (calls at once, errors, refusals by consent and by the
        provider, cancels, many folds in a row): every view sent to the model pairs each
        result with its call, has unique ids, and fits; each run's transcript is valid
        (the driver checks it)."""
        rng = random.Random(seed)
        maximum = rng.randrange(250, 700)
        window = ctx.ContextWindow(
            maximum,
            keep_recent_tokens=rng.randrange(0, maximum // 2),
            count_tokens=None if seed % 2 else ctx.estimate_tokens,
        )

        def plan(request: al.ModelRequest, number: int) -> Any:
            roll = rng.random()
            if roll < 0.08:
                return Refusal("context length")
            if roll < 0.4:
                return [text("t" * rng.randrange(0, 200))]
            calls = rng.randrange(1, 4)
            return [echo("e" * rng.randrange(0, 150)) if rng.random() < 0.7 else
                    al.ToolCall("planned", "fail", {}) for _ in range(calls)]  # fmt: skip

        model = ViewModel(plan, reports=bool(seed % 2), summary="s" * rng.randrange(1, 120))
        fitted = ctx.fit(model, window)
        messages: Tuple[al.Message, ...] = ()
        for number in range(25):
            signal = threading.Event()
            start = [*al.resolve_open_tool_calls(messages, "interrupted"),
                     user("u" * rng.randrange(1, 300), f"u{number}")]  # fmt: skip
            cancel = rng.randrange(3, 40) if rng.random() < 0.2 else None
            refuse = rng.random() < 0.3
            _, result, _ = run(
                fitted,
                [echo_tool(), failing_tool()],
                messages=start,
                max_steps=rng.randrange(1, 6),
                signal=signal,
                cancel_at=cancel,
                tool_concurrency=rng.choice([1, 3]),
                before_tool_call=(lambda call, s: "no" if rng.random() < 0.3 else None)
                if refuse
                else None,
            )
            if result.status == "failed":
                assert result.error is not None
                assert result.error.code == "MODEL_STREAM_ERROR"
            messages = result.messages
        for view in model.views:
            _check_view(view)
            counted = window.count_tokens or ctx.estimate_tokens
            assert counted(view) <= maximum
        assert len(fitted.folds) == len(model.summaries)
        assert any(
            len(view.messages) and view.messages[0].id.startswith("summary")
            for view in model.views
        )
