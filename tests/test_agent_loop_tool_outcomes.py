"""Beyond the seed, what a call's tool may report: progress while it runs (tool.progress),
an ending (ends_run), and when it returned (Event.time); the order rules of calls at once
(deterministic: gates, never sleeps); the provider's own response id.

Every run goes through loop_testing's driver, which checks the run's invariants
(loop_invariants.check_run) each time. A thread that waits for another waits at most WAIT.
"""

from __future__ import annotations

import io
import json
import threading
import time
from typing import Any, Dict, Generator, List

import pytest

import agent_loop as al
import agent_loop_durable as ald
import agent_loop_replay as alr
from loop_invariants import SEED_EVENT_TYPES
from loop_testing import (
    WAIT,
    assert_failed,
    call,
    calls_of,
    events_of_tools,
    one_batch,
    open_call_ids,
    results_of,
    run,
    start_run,
    stop,
    text,
    tool,
    tool_threads,
    tool_turn,
    types_of,
    user,
)

CONCURRENCY = [pytest.param(1, id="sequential"), pytest.param(3, id="at-once")]


def progress_of(events: List[al.Event]) -> List[Any]:
    """The (call id, progress) of each tool.progress event, in order."""
    return [
        (event.payload["tool_call_id"], event.payload["progress"])
        for event in events
        if event.type == "tool.progress"
    ]


# --- Tool progress ----------------------------------------------------------------------


class TestToolProgress:
    """A tool whose function is a generator: each value it yields is a tool.progress event,
    after its call's tool.started and before its tool.finished; what it returns is its
    result. The signal is seen between its yields; the run closes it when it ends."""

    @pytest.mark.parametrize("concurrency", CONCURRENCY)
    def test_each_yield_is_a_tool_progress_between_its_started_and_finished(
        self, concurrency: int
    ) -> None:
        def counting(arguments: Dict[str, Any], signal: Any) -> Generator[object, None, object]:
            for n in range(3):
                yield {"done": n, "of": 3}
            return "counted"

        events, result, _ = run(
            one_batch(*calls_of("count", "c1")),
            [tool("count", counting)],
            tool_concurrency=concurrency,
        )
        assert types_of(events)[2:7] == [
            "tool.started",
            "tool.progress",
            "tool.progress",
            "tool.progress",
            "tool.finished",
        ]
        assert progress_of(events) == [("c1", {"done": n, "of": 3}) for n in range(3)]
        assert results_of(result) == {"c1": ("counted", False)}
        assert events[3].payload["request_id"] == "request-001"

    @pytest.mark.parametrize("concurrency", CONCURRENCY)
    def test_progress_is_delivered_while_the_tool_runs(self, concurrency: int) -> None:
        """The tool goes on only once the consumer has seen its first progress."""
        seen = threading.Event()

        def waiting(arguments: Dict[str, Any], signal: Any) -> Generator[object, None, object]:
            yield "half"
            return "seen" if seen.wait(WAIT) else "never seen"

        calls = calls_of("wait", "c1", "c2")
        run_ = start_run(
            al.ScriptedModel(one_batch(*calls)),
            [tool("wait", waiting)],
            tool_concurrency=concurrency,
        )

        def consumer(event: al.Event) -> None:
            if event.type == "tool.progress":
                seen.set()

        _events, result = al.settle_run(run_, on_event=consumer)
        assert results_of(result) == {"c1": ("seen", False), "c2": ("seen", False)}

    def test_progress_is_a_plain_copy_of_what_the_tool_yielded(self) -> None:
        shown: Dict[str, Any] = {"lines": [1]}

        def mutating(arguments: Dict[str, Any], signal: Any) -> Generator[object, None, object]:
            yield shown
            shown["lines"].append(2)
            return "ok"

        events, _, _ = run(one_batch(*calls_of("mutate", "c1")), [tool("mutate", mutating)])
        assert progress_of(events) == [("c1", {"lines": [1]})]

    @pytest.mark.parametrize(
        "value", [pytest.param(float("nan"), id="nan"), pytest.param(object(), id="object")]
    )
    def test_progress_that_is_not_json_is_the_calls_error_result(self, value: object) -> None:
        closed: List[bool] = []

        def bad(arguments: Dict[str, Any], signal: Any) -> Generator[object, None, object]:
            try:
                yield value
                return "never"
            finally:
                closed.append(True)

        events, result, _ = run(one_batch(*calls_of("bad", "c1")), [tool("bad", bad)])
        content, is_error = results_of(result)["c1"]
        assert is_error
        assert content.startswith("tool 'bad' yielded progress that is not JSON")
        assert "tool.progress" not in types_of(events)
        assert closed == [True]

    @pytest.mark.parametrize(
        ("error", "content"),
        [
            pytest.param(al.ToolError("no such file"), "no such file", id="tool-error"),
            pytest.param(KeyError("x"), "tool 'fail' raised KeyError: 'x'", id="exception"),
        ],
    )
    def test_a_generator_that_raises_is_an_error_result_after_its_progress(
        self, error: Exception, content: str
    ) -> None:
        def failing(arguments: Dict[str, Any], signal: Any) -> Generator[object, None, object]:
            yield "begun"
            raise error

        events, result, _ = run(one_batch(*calls_of("fail", "c1")), [tool("fail", failing)])
        assert progress_of(events) == [("c1", "begun")]
        assert results_of(result) == {"c1": (content, True)}

    @pytest.mark.parametrize("concurrency", CONCURRENCY)
    def test_the_signal_set_at_a_progress_cancels_and_closes_the_tool(
        self, concurrency: int
    ) -> None:
        signal = threading.Event()
        closed = threading.Event()

        def endless(arguments: Dict[str, Any], signal: Any) -> Generator[object, None, object]:
            try:
                n = 0
                while not closed.is_set():
                    yield n
                    n += 1
                    signal.wait(WAIT)  # the consumer sets it at the first progress
                return "never"
            finally:
                closed.set()

        events, result, _ = run(
            one_batch(*calls_of("endless", "c1")),
            [tool("endless", endless)],
            signal=signal,
            cancel_at=("tool.progress", 1),
            tool_concurrency=concurrency,
        )
        assert result.status == "cancelled"
        assert progress_of(events) == [("c1", 0)]
        assert open_call_ids(result.messages) == ["c1"]
        assert closed.is_set()
        assert tool_threads() == []

    def test_closing_the_run_at_a_progress_closes_the_tool(self) -> None:
        closed: List[bool] = []

        def reporting(arguments: Dict[str, Any], signal: Any) -> Generator[object, None, object]:
            try:
                yield "one"
                yield "two"
                return "never"
            finally:
                closed.append(True)

        run_ = start_run(
            al.ScriptedModel(one_batch(*calls_of("report", "c1"))), [tool("report", reporting)]
        )
        assert [next(run_).type for _ in range(4)][-1] == "tool.progress"
        run_.close()
        assert closed == [True]

    def test_a_run_whose_tools_yield_nothing_has_the_seeds_five_event_types(self) -> None:
        events, _, _ = run(one_batch(*calls_of("plain", "c1")), [tool("plain", lambda a, s: 1)])
        assert set(types_of(events)) <= set(SEED_EVENT_TYPES)

    def test_execute_tool_call_drops_the_progress_and_returns_the_result(self) -> None:
        def reporting(arguments: Dict[str, Any], signal: Any) -> Generator[object, None, object]:
            yield "ignored"
            return {"sum": 42}

        registry = al.ToolRegistry([tool("report", reporting)])
        result = al.execute_tool_call(registry, call("report", "c1", {}), threading.Event())
        assert (result.content, result.is_error) == ('{"sum":42}', False)

    def test_print_event_shows_a_progress_and_an_ending(self) -> None:
        out = io.StringIO()
        call_ = call("answer", "a1", {})
        result = al.ToolResultMessage("tool-result-a1", "a1", "answer", "{}", False)
        ended = al.RunResult("completed", (), 1, final_text="", output={"n": 1})
        waits = al.RunResult("cancelled", (), 1, awaiting=(call("rm", "r1", {}),))
        payloads: List[Any] = [
            ("tool.progress", {"request_id": "request-001", "tool_call_id": "c1",
                               "progress": {"n": 1}}),
            ("tool.finished", {"request_id": "request-001", "tool_call": call_,
                               "tool_result": result, "ends_run": True}),
            ("run.finished", {"result": ended}),
            ("run.finished", {"result": waits}),
        ]  # fmt: skip
        for sequence, (kind, payload) in enumerate(payloads, 3):
            al.print_event(al.Event(sequence, kind, payload), out)
        assert out.getvalue().splitlines() == [
            '  3  tool.progress     request-001 [c1] {"n":1}',
            "  4  tool.finished     request-001 answer ok: {} (ends the run)",
            '  5  run.finished      completed after 1 step(s), 0 messages, output: {"n": 1}',
            "  6  run.finished      cancelled after 1 step(s), 0 messages, awaiting a "
            "decision: r1",
        ]


# --- Tools that end a run -------------------------------------------------------------------


def answer_tool(returns: Any = None) -> al.Tool:
    """An ends_run tool that returns its arguments (or ``returns``)."""

    def execute(arguments: Dict[str, Any], signal: Any) -> object:
        return arguments if returns is None else returns

    return al.Tool("answer", "The answer.", {"type": "object"}, execute, ends_run=True)


def ending(execute: Any, required: Any = ()) -> al.Tool:
    """An ends_run tool named answer, its arguments an object with these required keys."""
    schema = {"type": "object", "required": list(required)}
    return al.Tool("answer", "The answer.", schema, execute, ends_run=True)


def tool_error_raiser(message: str) -> Any:
    def execute(arguments: Dict[str, Any], signal: Any) -> object:
        raise al.ToolError(message)

    return execute


class TestToolsThatEndARun:
    """A call of an ends_run tool that returns ends the run completed, once every call of
    its response has its result; RunResult.output is what the first such call returned."""

    @pytest.mark.parametrize("max_steps", [pytest.param(1, id="at-the-budget"), 2])
    def test_a_call_that_returns_ends_the_run_completed_with_its_output(
        self, max_steps: int
    ) -> None:
        script = [
            tool_turn("response-001", text("Here."), call("answer", "a1", {"n": 42})),
            stop("response-002", "must not run"),
        ]
        events, result, model = run(script, [answer_tool()], max_steps=max_steps)
        assert result.status == "completed"
        assert (result.output, result.final_text, result.steps) == ({"n": 42}, "Here.", 1)
        assert model.call_count == 1
        finished = [e for e in events if e.type == "tool.finished"]
        assert finished[0].payload["ends_run"] is True
        assert finished[0].to_dict()["payload"]["endsRun"] is True

    @pytest.mark.parametrize("concurrency", CONCURRENCY)
    def test_the_other_calls_run_and_the_first_ending_call_is_the_output(
        self, concurrency: int
    ) -> None:
        calls = [
            call("echo", "e1", {}),
            call("answer", "a1", {"n": 1}),
            call("answer", "a2", {"n": 2}),
            call("echo", "e2", {}),
        ]
        tools = [answer_tool(), tool("echo", lambda a, s: "echoed")]
        events, result, _ = run(one_batch(*calls), tools, tool_concurrency=concurrency)
        assert result.output == {"n": 1}
        assert list(results_of(result)) == ["e1", "a1", "a2", "e2"]
        ends = [e.payload["tool_call"].id for e in events if e.payload.get("ends_run")]
        assert ends == ["a1", "a2"]

    @pytest.mark.parametrize(
        ("tools", "consent"),
        [
            pytest.param([ending(tool_error_raiser("try again"))], None, id="tool-error"),
            pytest.param([ending(lambda a, s: 1 / 0)], None, id="exception"),
            pytest.param([answer_tool(object())], None, id="not-json"),
            pytest.param([ending(lambda a, s: a, ["n"])], None, id="invalid-arguments"),
            pytest.param([answer_tool()], lambda call, signal: "no", id="refused"),
        ],
    )
    def test_a_call_that_does_not_return_does_not_end_the_run(
        self, tools: List[al.Tool], consent: Any
    ) -> None:
        script = [tool_turn("response-001", call("answer", "a1", {})), stop("response-002", "No.")]
        events, result, _ = run(script, tools, before_tool_call=consent)
        assert (result.status, result.final_text, result.output) == ("completed", "No.", None)
        assert not any(e.payload.get("ends_run") for e in events)

    def test_a_str_is_the_output_as_it_is(self) -> None:
        _, result, _ = run(one_batch(call("answer", "a1", {})), [answer_tool("done")])
        assert result.output == "done"

    def test_the_output_is_a_copy_that_the_tool_cannot_change(self) -> None:
        value: Dict[str, Any] = {"items": [1]}
        _, result, _ = run(one_batch(call("answer", "a1", {})), [answer_tool(value)])
        value["items"].append(2)
        assert result.output == {"items": [1]}

    @pytest.mark.parametrize("value", [1, "yes", None])
    def test_an_ends_run_that_is_not_a_bool_is_a_type_error(self, value: object) -> None:
        with pytest.raises(TypeError, match="ends_run must be a bool"):
            al.Tool("t", "T.", {"type": "object"}, lambda a, s: 1, ends_run=value)  # type: ignore[arg-type]


# --- Events, results and responses as JSON ------------------------------------------------


class TestNewFieldsAsJson:
    """tool.progress, endsRun, output, awaiting and providerResponseId round-trip, and are
    absent from the JSON when not set."""

    @pytest.mark.parametrize(
        "event",
        [
            al.Event(
                4,
                "tool.progress",
                {
                    "request_id": "request-001",
                    "tool_call_id": "c1",
                    "progress": {"n": [1, "two", None]},
                },
            ),
            al.Event(
                5,
                "tool.finished",
                {
                    "request_id": "request-001",
                    "tool_call": call("answer", "a1", {}),
                    "ends_run": True,
                    "tool_result": al.ToolResultMessage(
                        "tool-result-a1", "a1", "answer", "{}", False
                    ),
                },
            ),
            al.Event(
                6,
                "run.finished",
                {
                    "result": al.RunResult(
                        "cancelled",
                        (),
                        1,
                        output=None,
                        awaiting=(call("rm", "r1", {"path": "x"}),),
                    )
                },
            ),
            al.Event(
                6,
                "run.finished",
                {"result": al.RunResult("completed", (), 1, final_text="", output={"n": 1})},
            ),
        ],
        ids=["progress", "ends-run", "awaiting", "output"],
    )
    def test_events_round_trip(self, event: al.Event) -> None:
        data = json.loads(json.dumps(event.to_dict()))
        assert al.event_from_dict(data) == event

    def test_absent_when_not_set(self) -> None:
        result = al.RunResult("completed", (), 1, final_text="")
        assert set(result.to_dict()) == {"status", "messages", "steps", "finalText"}
        message = al.AssistantMessage("message-r", [text("Hi.")])
        assert "providerResponseId" not in message.to_dict()

    def test_a_progress_that_is_not_json_is_refused_naming_the_field(self) -> None:
        payload = {"requestId": "request-001", "toolCallId": "c1", "progress": [1e999]}
        data = {"sequence": 0, "type": "tool.progress", "payload": payload}
        with pytest.raises(ValueError, match=r"event.payload.progress must be JSON"):
            al.event_from_dict(data)

    def test_the_time_of_an_event_is_not_part_of_equality_or_json(self) -> None:
        one = al.Event(0, "run.finished", {"result": al.RunResult("cancelled", (), 0)}, 1.0)
        two = al.Event(0, "run.finished", {"result": al.RunResult("cancelled", (), 0)}, 2.0)
        assert one == two
        assert "time" not in one.to_dict()
        assert al.event_from_dict(one.to_dict()).time is None


# --- Times, and the order of calls at once --------------------------------------------------


class TestTimesAndOrder:
    """A call's tool.finished has the time its tool returned (the other events are timed as
    they are yielded). Calls at once: results in assistant order, and a call not yet
    begun never begins once the signal is set (both by gates, whatever the timing)."""

    def test_a_tool_finished_has_the_time_its_tool_returned_and_no_other_event_a_time(
        self,
    ) -> None:
        before = time.time()
        events, _, _ = run(
            one_batch(*calls_of("plain", "c1", "c2")), [tool("plain", lambda a, s: 1)]
        )
        after = time.time()
        timed = [(event.type, event.time) for event in events if event.time is not None]
        assert [kind for kind, _ in timed] == ["tool.finished", "tool.finished"]
        assert before <= timed[0][1] <= timed[1][1] <= after

    def test_tool_finished_in_assistant_order_not_completion_order(self) -> None:
        """c3 returns first, then c2, then c1 (each waits for the one after it): the
        tool.finished events are c1, c2, c3, and each carries when its tool returned."""
        returned = {id: threading.Event() for id in ("c1", "c2", "c3")}
        after = {"c1": "c2", "c2": "c3"}

        def chained(arguments: Dict[str, Any], signal: Any) -> object:
            current = al.current_tool_call()
            assert current is not None
            if current.id in after:
                assert returned[after[current.id]].wait(WAIT)
            returned[current.id].set()
            return current.id

        events, _, _ = run(
            one_batch(*calls_of("chain", "c1", "c2", "c3")),
            [tool("chain", chained)],
            tool_concurrency=3,
        )
        finished = [e for e in events if e.type == "tool.finished"]
        assert [e.payload["tool_call"].id for e in finished] == ["c1", "c2", "c3"]
        times = [e.time for e in finished]
        assert times[2] <= times[1] <= times[0]  # type: ignore[operator]
        assert events_of_tools(events)[:3] == [("tool.started", c) for c in ("c1", "c2", "c3")]

    def test_a_call_not_yet_begun_never_begins(self) -> None:
        """Two threads, three calls: c1 is held, c2 sets the signal and returns, and its
        thread takes c3, which must look at the signal and never begin. The loop's own look
        waits until a tool thread has looked twice (c2's after it returned, then c3's) or c3
        began, so that the loop cannot stop c3 first, whatever the timing."""
        looked = threading.Event()
        begun: List[str] = []

        class Watched:
            def __init__(self) -> None:
                self.event = threading.Event()
                self.looks = 0

            def is_set(self) -> bool:
                if self.event.is_set():
                    if threading.current_thread().name.startswith("agent_loop-tool"):
                        self.looks += 1
                        if self.looks == 2:
                            looked.set()
                    else:
                        looked.wait(WAIT)
                return self.event.is_set()

            def wait(self, timeout: Any = None) -> bool:
                return self.event.wait(timeout)

        signal = Watched()

        def tools(arguments: Dict[str, Any], _signal: Any) -> object:
            current = al.current_tool_call()
            assert current is not None
            begun.append(current.id)
            if current.id == "c1":
                looked.wait(WAIT)
            elif current.id == "c2":
                signal.event.set()
            else:
                looked.set()  # c3 began: the rule is broken, and nothing need wait
            return current.id

        _, result, _ = run(
            one_batch(*calls_of("t", "c1", "c2", "c3")),
            [tool("t", tools)],
            signal=signal,
            tool_concurrency=2,
        )
        assert result.status == "cancelled"
        assert sorted(begun) == ["c1", "c2"]
        assert open_call_ids(result.messages) == ["c1", "c2", "c3"]


# --- The provider's own response id ---------------------------------------------------------


class TestProviderResponseId:
    """A response's provider_response_id is copied to its assistant message; it is None or
    a non-empty str, else the run fails MODEL_PROTOCOL_ERROR."""

    def test_it_is_copied_to_the_message_and_replayed_from_a_transcript(self) -> None:
        script = [
            al.scripted_response("r1", [text("Hi.")], "stop", provider_response_id="chatcmpl-9")
        ]
        _, result, _ = run(script)
        message = result.messages[-1]
        assert isinstance(message, al.AssistantMessage)
        assert message.provider_response_id == "chatcmpl-9"
        assert al.message_from_dict(message.to_dict()) == message
        replayed = al.ScriptedModel.from_transcript(result.messages)
        _, again, _ = run(replayed)
        assert again.messages == result.messages

    def test_replay_and_a_durable_run_that_goes_on_keep_it(self, tmp_path: Any) -> None:
        first = al.scripted_response(
            "r1", [call("plain", "c1", {})], "toolCall", provider_response_id="p-1"
        )
        script = [
            first,
            al.scripted_response("r2", [text("Done.")], "stop", provider_response_id="p-2"),
        ]
        tools = [tool("plain", lambda a, s: 1)]
        events, _, _ = run(script, tools)
        again, _ = al.settle_run(alr.replay(events).run())
        assert [e.to_dict() for e in again] == [e.to_dict() for e in events]
        journal = str(tmp_path / "run.jsonl")
        options: Dict[str, Any] = {
            "messages": [user()],
            "tools": al.ToolRegistry(tools),
            "max_steps": 4,
        }

        def killed(event: al.Event) -> None:
            if event.type == "tool.finished":
                raise SystemExit  # stands for kill -9, after the first response's journal entry

        with pytest.raises(SystemExit):
            al.settle_run(
                ald.durable_run(journal, model=al.ScriptedModel(script), **options), killed
            )
        _, result = al.settle_run(
            ald.durable_run(journal, model=al.ScriptedModel(script[1:]), **options)
        )
        ids = [
            m.provider_response_id for m in result.messages if isinstance(m, al.AssistantMessage)
        ]
        assert ids == ["p-1", "p-2"]

    @pytest.mark.parametrize("value", ["", 7])
    def test_one_that_is_not_a_non_empty_str_fails_the_run(self, value: object) -> None:
        script = [al.scripted_response("r1", [text("Hi.")], "stop", provider_response_id=value)]  # type: ignore[arg-type]
        events, result, _ = run(script)
        assert_failed(events, result, "MODEL_PROTOCOL_ERROR", "provider response id")
        assert result.messages == (user(),)
