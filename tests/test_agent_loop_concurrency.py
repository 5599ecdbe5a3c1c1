"""Tests for the tool phase with threads and consent: run_agent_loop(...,
tool_concurrency=N, before_tool_call=f), Tool(..., sequential=True), current_tool_call(),
and the replay of a concurrent run.

The suite imports ``agent_loop`` once, as ``al`` (and ``agent_loop_replay`` as ``alr``),
so that it can be aimed at any copy. Builders and the one driver (run(), which checks the
run's invariants, groups of concurrent calls included) come from loop_testing.py. No
assertion is about time: a thread that waits for another waits at most WAIT seconds, so
that a broken loop fails a test instead of hanging it.

Contents
    TestCurrentToolCall: inside execute, the call; outside, None; each thread its own
    TestOptions: tool_concurrency, before_tool_call and Tool.sequential, checked at once
    TestConcurrentGroups: calls at once, in groups cut by barriers, events in order
    TestCancellationInAConcurrentBatch: no result once the signal is seen, threads that end
    TestConsent: before_tool_call, in order, refusing, blocking, cancelling, failing
    TestConsentThatSurvivesARestart: a cancelled run, a person's decision, the resumed run
    TestReplayOfConcurrentRuns: a concurrent log replays exactly
"""

from __future__ import annotations

import copy
import io
import json
import pickle
import queue
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple

import pytest

import agent_loop as al
import agent_loop_replay as alr
from loop_testing import (
    WAIT,
    Fatal,
    assert_failed,
    call,
    calls_of,
    dicts_of,
    echo_call,
    echo_result,
    echo_tool,
    events_of_tools,
    every_kind_of_tool,
    json_lines,
    one_batch,
    open_call_ids,
    read_json_lines,
    results_of,
    run,
    settle,
    start_run,
    stop,
    tool,
    tool_threads,
    tool_turn,
    types_of,
    until,
    untyped,
    user,
)

# --- Builders ---------------------------------------------------------------------------


def meeting_tool(name: str, parties: int, timeout: float = WAIT) -> al.Tool:
    """A tool whose calls each wait until ``parties`` calls are inside it at once (a
    barrier): they complete only when run at once; else each gets an error result."""
    barrier = threading.Barrier(parties, timeout=timeout)

    def execute(arguments: Dict[str, Any], signal: al.Signal) -> object:
        barrier.wait()
        return "met"

    return tool(name, execute)


def sleepy_tools(seed: int) -> List[al.Tool]:
    """read and write (sequential), each call sleeping a random while (0-3 ms), then
    returning its arguments."""
    rng = random.Random(seed)
    lock = threading.Lock()

    def sleepy(arguments: Dict[str, Any], signal: al.Signal) -> object:
        with lock:
            delay = rng.random() * 0.003
        time.sleep(delay)
        return arguments

    return [tool("read", sleepy), tool("write", sleepy, sequential=True)]


class WatchedSignal:
    """A signal that tells when the loop looked at it after a tool returned. A tool calls
    ``returning()`` just before it returns; the next ``is_set()`` in its thread is the
    loop's look that decides whether the result is kept (the README: the loop looks at
    the signal whenever a tool returns)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.condition = threading.Condition()
        self.looked: List[str] = []  # the call ids whose result was looked at
        self.returning_in: Dict[int, str] = {}

    def returning(self) -> None:
        current = al.current_tool_call()
        assert current is not None
        with self.condition:
            self.returning_in[threading.get_ident()] = current.id

    def is_set(self) -> bool:
        value = self.event.is_set()
        with self.condition:
            call_id = self.returning_in.pop(threading.get_ident(), None)
            if call_id is not None:
                self.looked.append(call_id)
                self.condition.notify_all()
        return value

    def wait(self, timeout: Optional[float] = None) -> bool:
        return self.event.wait(timeout)

    def set(self) -> None:
        self.event.set()

    def wait_looked(self, *call_ids: str) -> None:
        with self.condition:
            assert self.condition.wait_for(lambda: set(call_ids) <= set(self.looked), WAIT)


# --- current_tool_call() ------------------------------------------------------------------


class TestCurrentToolCall:
    """current_tool_call(): the ToolCall whose tool is executing, in the thread that runs
    it; None elsewhere."""

    @staticmethod
    def seeing_tool(seen: List[Optional[al.ToolCall]]) -> al.Tool:
        """An echo tool that records what current_tool_call() returns inside it."""

        def execute(arguments: Dict[str, Any], signal: al.Signal) -> object:
            seen.append(al.current_tool_call())
            return arguments["text"]

        return tool("echo", execute)

    def test_inside_execute_it_is_the_call_and_outside_none(self) -> None:
        seen: List[Optional[al.ToolCall]] = []
        calls = [echo_call("call-echo-001"), echo_call("call-echo-002")]
        outside: List[Optional[al.ToolCall]] = []
        loop = al.run_agent_loop(
            messages=[al.UserMessage("u1", "Echo twice.")],
            model=al.ScriptedModel(one_batch(*calls)),
            tools=al.ToolRegistry([self.seeing_tool(seen)]),
            max_steps=2,
        )
        _, result = al.settle_run(loop, lambda event: outside.append(al.current_tool_call()))
        assert result.status == "completed"
        assert seen == calls
        assert all(value is None for value in outside)  # the consumer runs outside any tool
        assert al.current_tool_call() is None

    def test_execute_tool_call_sets_it_too_and_resets_it_whatever_the_tool_does(self) -> None:
        seen: List[Optional[al.ToolCall]] = []

        def failing(arguments: Dict[str, Any], signal: al.Signal) -> object:
            seen.append(al.current_tool_call())
            raise LookupError("nothing here")

        result = al.execute_tool_call(
            al.ToolRegistry([tool("echo", failing)]), echo_call("call-echo-001"), threading.Event()
        )
        assert seen == [echo_call("call-echo-001")]
        assert result.is_error
        assert "LookupError" in result.content
        assert al.current_tool_call() is None

    def test_a_tool_that_runs_a_nested_tool_sees_its_own_call_again_after_it(self) -> None:
        inner_seen: List[Optional[al.ToolCall]] = []
        inner = al.ToolRegistry([self.seeing_tool(inner_seen)])
        after: List[Optional[al.ToolCall]] = []

        def outer(arguments: Dict[str, Any], signal: al.Signal) -> object:
            al.execute_tool_call(inner, echo_call("call-inner"), signal)
            after.append(al.current_tool_call())
            return "done"

        outer_call = call("outer", "call-outer", {})
        al.execute_tool_call(
            al.ToolRegistry([tool("outer", outer)]), outer_call, threading.Event()
        )
        assert inner_seen == [echo_call("call-inner")]
        assert after == [outer_call]

    def test_runs_in_threads_at_once_each_see_their_own_call(self) -> None:
        """Four runs on four threads, each tool waiting until all four are inside their
        tools: each sees its own call, never another thread's."""
        count = 4
        barrier = threading.Barrier(count, timeout=WAIT)
        seen: Dict[str, Optional[al.ToolCall]] = {}

        def execute(arguments: Dict[str, Any], signal: al.Signal) -> object:
            barrier.wait()  # every thread is inside its tool now
            seen[arguments["text"]] = al.current_tool_call()
            return arguments["text"]

        results: Dict[str, al.RunResult] = {}

        def one_run(call_id: str) -> None:
            _, results[call_id], _ = run(one_batch(echo_call(call_id)), [tool("echo", execute)])

        threads = [threading.Thread(target=one_run, args=(f"call-{n}",)) for n in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        assert {call_id: result.status for call_id, result in results.items()} == {
            f"call-{n}": "completed" for n in range(count)
        }
        assert seen == {f"call-{n}": echo_call(f"call-{n}") for n in range(count)}

    def test_the_calls_of_a_concurrent_group_each_see_their_own(self) -> None:
        """The calls of one group, all inside their tools at once, on the loop's threads."""
        barrier = threading.Barrier(3, timeout=WAIT)
        seen: Dict[str, Optional[al.ToolCall]] = {}

        def execute(arguments: Dict[str, Any], signal: al.Signal) -> object:
            barrier.wait()
            seen[arguments["text"]] = al.current_tool_call()
            return "ok"

        calls = [echo_call(f"call-{n}") for n in range(3)]
        _, result, _ = run(one_batch(*calls), [tool("echo", execute)], tool_concurrency=3)
        assert result.status == "completed"
        assert seen == {c.id: c for c in calls}


# --- Options ----------------------------------------------------------------------------


class TestOptions:
    """tool_concurrency (an int >= 1; no upper bound: a group never has more threads than
    calls), before_tool_call (None or callable) and Tool.sequential (a bool), checked
    when run_agent_loop() or Tool() is called."""

    @pytest.mark.parametrize(
        "value",
        [
            pytest.param(1, id="at-limit-1"),
            pytest.param(2, id="2"),
            pytest.param(10**6, id="no-upper-bound"),
        ],
    )
    def test_an_int_from_1_up_is_a_tool_concurrency(self, value: int) -> None:
        _, result, _ = run(one_batch(echo_call("call-1")), [echo_tool()], tool_concurrency=value)
        assert result.status == "completed"

    @pytest.mark.parametrize(
        ("value", "error", "message"),
        [
            pytest.param(0, ValueError, "tool_concurrency must be an int >= 1, got 0", id="0"),
            pytest.param(-3, ValueError, "tool_concurrency must be an int >= 1, got -3", id="-3"),
            pytest.param(True, TypeError, "tool_concurrency must be an int, got bool", id="bool"),
            pytest.param(2.0, TypeError, "tool_concurrency must be an int, got float", id="2.0"),
            pytest.param("2", TypeError, "tool_concurrency must be an int, got str", id="str"),
            pytest.param(None, TypeError, "tool_concurrency must be an int, got NoneType",
                         id="None"),
        ],
    )  # fmt: skip
    def test_anything_else_is_an_error_at_call_time(
        self, value: object, error: type, message: str
    ) -> None:
        model = al.ScriptedModel(one_batch(echo_call("call-1")))
        with pytest.raises(error, match=f"^{message}$"):
            untyped.run_agent_loop(
                messages=[user()],
                model=model,
                tools=al.ToolRegistry([echo_tool()]),
                max_steps=2,
                tool_concurrency=value,
            )
        assert model.call_count == 0

    @pytest.mark.parametrize("value", [1, "ask", object()])
    def test_a_before_tool_call_that_cannot_be_called_is_a_type_error(self, value: object) -> None:
        with pytest.raises(TypeError, match=r"^before_tool_call must be None or a function"):
            untyped.run_agent_loop(
                messages=[user()],
                model=al.ScriptedModel([]),
                tools=al.ToolRegistry(),
                max_steps=1,
                before_tool_call=value,
            )

    def test_a_tool_is_not_sequential_unless_told(self) -> None:
        assert echo_tool().sequential is False
        assert tool("write", lambda arguments, signal: "ok", sequential=True).sequential is True

        def write(path: str) -> str:
            """Writes."""
            return path

        assert al.Tool.from_function(write).sequential is False
        assert al.Tool.from_function(write, sequential=True).sequential is True

    @pytest.mark.parametrize("value", [1, 0, "yes", None])
    def test_a_sequential_that_is_not_a_bool_is_a_type_error(self, value: object) -> None:
        kind = type(value).__name__
        with pytest.raises(
            TypeError, match=f"Tool 'write': sequential must be a bool, got {kind}"
        ):
            untyped.Tool(
                "write", "Writes.", {"type": "object"}, lambda a, s: "ok", sequential=value
            )

    def test_sequential_survives_copy_and_pickle(self) -> None:
        sequential = al.Tool(
            "echo", "Echoes.", {"type": "object"}, echo_tool().execute, sequential=True
        )
        assert copy.deepcopy(sequential).sequential is True
        picklable = al.Tool("write", "W.", {"type": "object"}, _picklable_tool, sequential=True)
        assert pickle.loads(pickle.dumps(picklable)) == picklable


def _picklable_tool(arguments: Dict[str, Any], signal: al.Signal) -> object:
    return "ok"


class TestToolAnnotations:
    """Tool(..., annotations=None): hints the model is never sent, a read-only mapping with
    str keys, so that a consent hook can tell a destructive tool from a read-only one."""

    def test_annotations_are_a_read_only_copy_never_sent_to_the_model(self) -> None:
        hints: Dict[str, Any] = {"title": "Delete a file", "destructiveHint": True}
        deleting = tool("delete", lambda arguments, signal: "ok")
        deleting = al.Tool(
            deleting.name, deleting.description, {"type": "object"}, deleting.execute,
            annotations=hints,
        )  # fmt: skip
        hints["destructiveHint"] = False  # the caller's dict is copied, not held
        assert dict(deleting.annotations) == {"title": "Delete a file", "destructiveHint": True}
        with pytest.raises(TypeError):
            deleting.annotations["destructiveHint"] = False  # type: ignore[index]
        assert deleting.spec() == al.ToolSpec("delete", deleting.description, {"type": "object"})
        assert "destructiveHint" not in json.dumps(deleting.spec().to_dict())

    def test_no_annotations_is_an_empty_mapping_and_equal_tools_stay_equal(self) -> None:
        plain = al.Tool("write", "W.", {"type": "object"}, _picklable_tool)
        assert dict(plain.annotations) == {}
        assert plain == al.Tool("write", "W.", {"type": "object"}, _picklable_tool, annotations={})
        hinted = al.Tool(
            "write", "W.", {"type": "object"}, _picklable_tool, annotations={"readOnlyHint": True}
        )
        assert hinted != plain
        assert pickle.loads(pickle.dumps(hinted)) == hinted
        assert copy.deepcopy(hinted).annotations == {"readOnlyHint": True}
        with pytest.raises(TypeError, match="unhashable"):
            hash(hinted)

    @pytest.mark.parametrize(
        "annotations",
        [
            pytest.param([("title", "x")], id="not-a-mapping"),
            pytest.param({1: True}, id="int-key"),
        ],
    )
    def test_annotations_that_are_not_a_mapping_with_str_keys_are_a_type_error(
        self, annotations: object
    ) -> None:
        with pytest.raises(
            TypeError, match="Tool 'write': annotations must be a mapping with str keys, or None"
        ):
            untyped.Tool(
                "write", "W.", {"type": "object"}, _picklable_tool, annotations=annotations
            )

    def test_a_consent_hook_asks_only_for_destructive_tools(self) -> None:
        asked: List[str] = []
        tools = al.ToolRegistry(
            [
                al.Tool("read", "R.", {"type": "object"}, _picklable_tool,
                        annotations={"readOnlyHint": True}),
                al.Tool("delete", "D.", {"type": "object"}, _picklable_tool,
                        annotations={"destructiveHint": True}),
            ]
        )  # fmt: skip

        def ask(tool_call: al.ToolCall, signal: al.Signal) -> Optional[str]:
            chosen = tools.get(tool_call.name)
            if chosen is None or not chosen.annotations.get("destructiveHint", False):
                return None
            asked.append(tool_call.id)
            return "The user said no."

        _events, result, _model = run(
            al.ScriptedModel(one_batch(call("read", "r1", {}), call("delete", "d1", {}))),
            list(tools),
            before_tool_call=ask,
        )
        assert asked == ["d1"]
        assert results_of(result) == {"r1": ("ok", False), "d1": ("The user said no.", True)}


# --- Concurrent groups --------------------------------------------------------------------


class TestConcurrentGroups:
    """tool_concurrency > 1: a group (a maximal run of consecutive calls whose tools are
    not sequential) gets its tool.started events in assistant order before any of its
    calls runs, runs on up to N threads, and gets its tool.finished events and results in
    assistant order, each once it and every call before it have finished."""

    def test_the_calls_of_a_group_run_at_once(self) -> None:
        """Four calls that each wait until all four are inside the tool complete."""
        calls = calls_of("meet", "c1", "c2", "c3", "c4")
        events, result, _ = run(one_batch(*calls), [meeting_tool("meet", 4)], tool_concurrency=4)
        assert result.status == "completed"
        assert results_of(result) == {c.id: ("met", False) for c in calls}
        assert events_of_tools(events) == [
            *(("tool.started", c.id) for c in calls),
            *(("tool.finished", c.id) for c in calls),
        ]
        assert tool_threads() == []

    @pytest.mark.parametrize("concurrency", [1, 3])
    def test_with_fewer_threads_than_the_barrier_needs_they_cannot_meet(
        self, concurrency: int
    ) -> None:
        """The other side: with 1 or 3 threads, 4 calls never are inside the tool at once,
        so the barrier breaks (after a short wait) and each call gets an error result."""
        calls = calls_of("meet", "c1", "c2", "c3", "c4")
        tools = [meeting_tool("meet", 4, timeout=0.2)]
        _, result, _ = run(one_batch(*calls), tools, tool_concurrency=concurrency)
        assert result.status == "completed"
        assert all(is_error for _, is_error in results_of(result).values())
        assert "BrokenBarrierError" in results_of(result)["c1"][0]

    def test_no_more_calls_run_at_once_than_tool_concurrency(self) -> None:
        """Six calls on two threads: they meet in pairs, never three at once."""
        active: List[int] = [0]
        most: List[int] = [0]
        lock = threading.Lock()
        barrier = threading.Barrier(2, timeout=WAIT)

        def pair(arguments: Dict[str, Any], signal: al.Signal) -> object:
            with lock:
                active[0] += 1
                most[0] = max(most[0], active[0])
            barrier.wait()  # two calls are inside at once
            with lock:
                active[0] -= 1
            return "ok"

        calls = calls_of("pair", *(f"c{n}" for n in range(6)))
        _, result, _ = run(one_batch(*calls), [tool("pair", pair)], tool_concurrency=2)
        assert result.status == "completed"
        assert most[0] == 2

    def test_a_sequential_tool_is_a_barrier_and_an_unknown_tool_joins_its_group(self) -> None:
        order: List[str] = []
        lock = threading.Lock()

        def recording(arguments: Dict[str, Any], signal: al.Signal) -> object:
            current = al.current_tool_call()
            assert current is not None
            with lock:
                order.append(current.id)
            return current.id

        tools = [tool("read", recording), tool("write", recording, sequential=True)]
        calls = [
            *calls_of("read", "r1", "r2"),
            *calls_of("write", "w1"),
            *calls_of("write", "w2"),
            *calls_of("read", "r3"),
            *calls_of("missing", "m1"),
            *calls_of("read", "r4"),
        ]
        events, result, _ = run(one_batch(*calls), tools, tool_concurrency=8)
        assert events_of_tools(events) == [
            ("tool.started", "r1"),
            ("tool.started", "r2"),
            ("tool.finished", "r1"),
            ("tool.finished", "r2"),
            ("tool.started", "w1"),
            ("tool.finished", "w1"),
            ("tool.started", "w2"),
            ("tool.finished", "w2"),
            ("tool.started", "r3"),
            ("tool.started", "m1"),
            ("tool.started", "r4"),
            ("tool.finished", "r3"),
            ("tool.finished", "m1"),
            ("tool.finished", "r4"),
        ]
        # The barrier runs after the calls before it and before those after it.
        assert set(order[:2]) == {"r1", "r2"}
        assert order[2:4] == ["w1", "w2"]
        assert set(order[4:]) == {"r3", "r4"}
        assert results_of(result)["m1"] == (
            "unknown tool 'missing' (available: read, write)",
            True,
        )

    def test_random_delays_give_one_event_log(self) -> None:
        """Many runs, each tool sleeping a random while: one event log, to_dict for to_dict."""
        script = [
            tool_turn(
                "response-001",
                *(call("read", f"a{n}", {"n": n}) for n in range(5)),
                call("write", "w1", {}),
                *(call("read", f"b{n}", {"n": n}) for n in range(3)),
            ),
            tool_turn("response-002", *(call("read", f"c{n}", {"n": n}) for n in range(4))),
            stop("response-003", "Done."),
        ]
        logs = []
        for seed in range(25):
            events, result, _ = run(script, sleepy_tools(seed), tool_concurrency=3)
            assert result.status == "completed"
            logs.append(dicts_of(events))
        assert all(log == logs[0] for log in logs)

    def test_the_default_is_the_sequential_loop_event_for_event(self) -> None:
        """tool_concurrency=1 is the loop without the option; with N > 1, a batch whose
        tools are all sequential (every call a group alone, an unknown tool's call too,
        between two barriers) gives the same log."""
        calls = [
            echo_call("call-1"),
            call("counter", "call-2", {}),
            call("missing", "call-3", {}),
            call("refuse", "call-4", {}),
            call("boom", "call-5", {}),
        ]
        default, _, _ = run(one_batch(*calls), every_kind_of_tool())
        one, _, _ = run(one_batch(*calls), every_kind_of_tool(), tool_concurrency=1)
        assert dicts_of(one) == dicts_of(default)
        # The seed's order: each call started, executed, appended and finished in turn.
        assert events_of_tools(default) == [
            (kind, f"call-{number}")
            for number in range(1, 6)
            for kind in ("tool.started", "tool.finished")
        ]
        barriers = [
            al.Tool(t.name, t.description, t.parameters, t.execute, sequential=True)
            for t in every_kind_of_tool()
        ]
        alone, _, _ = run(one_batch(*calls), barriers, tool_concurrency=4)
        assert dicts_of(alone) == dicts_of(default)

    def test_errors_are_results_and_siblings_keep_theirs(self) -> None:
        """A tool that raises, returns what is not JSON, refuses with ToolError or gets
        bad arguments gets its error result, as in the sequential loop; the others' stand."""
        tools = [
            *every_kind_of_tool(),
            tool("opaque", lambda arguments, signal: {1, 2}),
        ]
        calls = [
            echo_call("call-1", "one"),
            call("boom", "call-2", {}),
            call("opaque", "call-3", {}),
            call("refuse", "call-4", {}),
            call("echo", "call-5", {"text": 5}),
            echo_call("call-6", "six"),
        ]
        concurrent, result, _ = run(one_batch(*calls), tools, tool_concurrency=6)
        sequential, expected, _ = run(one_batch(*calls), tools)
        assert result.status == "completed"
        assert result.messages == expected.messages
        assert results_of(result)["call-1"] == ("one", False)
        assert results_of(result)["call-6"] == ("six", False)
        assert [error for _, error in results_of(result).values()] == [
            False, True, True, True, True, False,
        ]  # fmt: skip
        assert [e.to_dict()["payload"] for e in concurrent if e.type == "tool.finished"] == [
            e.to_dict()["payload"] for e in sequential if e.type == "tool.finished"
        ]

    def test_a_fatal_tool_fails_the_run_once_the_running_tools_have_returned(self) -> None:
        """A BaseException that is not an Exception: TOOL_PHASE_ERROR naming the call; the
        results before it are kept, and the run ends after its siblings returned."""
        raised = threading.Event()
        returned: List[str] = []

        def fatal(arguments: Dict[str, Any], signal: al.Signal) -> object:
            raised.set()
            raise Fatal("no result can stand for this")

        def slow(arguments: Dict[str, Any], signal: al.Signal) -> object:
            assert raised.wait(WAIT)
            time.sleep(0.05)  # still running when the loop learns of the failure
            returned.append("slow")
            return "slow"

        tools = [echo_tool(), tool("fatal", fatal), tool("slow", slow)]
        calls = [echo_call("call-1"), call("fatal", "call-2", {}), call("slow", "call-3", {})]
        events, result, _ = run(one_batch(*calls), tools, tool_concurrency=3)
        assert_failed(events, result, "TOOL_PHASE_ERROR", "tool call 'call-2'", "Fatal")
        assert returned == ["slow"]
        assert results_of(result) == {"call-1": ("call-1", False)}
        assert open_call_ids(result.messages) == ["call-2", "call-3"]
        assert tool_threads() == []

    def test_a_thread_that_cannot_start_fails_the_run_after_the_others_returned(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        returned: List[str] = []
        submit = ThreadPoolExecutor.submit

        def starting_one(pool: Any, function: Any, *arguments: Any) -> Any:
            if arguments[0].id != "c1":
                raise RuntimeError("can't start new thread")
            return submit(pool, function, *arguments)

        def slow(arguments: Dict[str, Any], signal: al.Signal) -> object:
            time.sleep(0.05)  # still running when the second thread fails to start
            returned.append("slow")
            return "slow"

        monkeypatch.setattr(ThreadPoolExecutor, "submit", starting_one)
        events, result, _ = run(
            one_batch(*calls_of("slow", "c1", "c2")), [tool("slow", slow)], tool_concurrency=2
        )
        assert_failed(
            events, result, "TOOL_PHASE_ERROR", "starting tool call 'c2' raised RuntimeError"
        )
        assert returned == ["slow"]
        assert open_call_ids(result.messages) == ["c1", "c2"]

    def test_keyboard_interrupt_in_a_tool_propagates_after_the_others_returned(self) -> None:
        returned: List[str] = []
        began = threading.Event()

        def interrupt(arguments: Dict[str, Any], signal: al.Signal) -> object:
            assert began.wait(WAIT)
            raise KeyboardInterrupt

        def quick(arguments: Dict[str, Any], signal: al.Signal) -> object:
            began.set()
            time.sleep(0.05)  # still running when the interrupt arrives
            returned.append("quick")
            return "quick"

        tools = [tool("interrupt", interrupt), tool("quick", quick)]
        loop = start_run(
            al.ScriptedModel(one_batch(call("interrupt", "c1", {}), call("quick", "c2", {}))),
            tools,
            tool_concurrency=2,
        )
        with pytest.raises(KeyboardInterrupt):
            al.settle_run(loop)
        assert returned == ["quick"]
        assert tool_threads() == []

    def test_the_budget_and_the_linkage_check_are_unchanged(self) -> None:
        """Seed: "With maxSteps: 1, the current Tool batch completes" (concurrently too);
        a duplicate call id fails the step before any tool runs."""
        executed: List[str] = []
        calls = [echo_call(f"call-echo-00{n}") for n in (1, 2, 3)]
        _, result, model = run(
            one_batch(*calls), [echo_tool(executed)], max_steps=1, tool_concurrency=3
        )
        assert result.status == "maxSteps"
        assert sorted(executed) == [c.id for c in calls]
        assert model.call_count == 1
        assert results_of(result) == {c.id: (c.id, False) for c in calls}
        duplicate = [echo_call("call-1"), echo_call("call-1", "again")]
        events, result, _ = run(one_batch(*duplicate), [echo_tool(executed)], tool_concurrency=2)
        assert_failed(events, result, "MODEL_PROTOCOL_ERROR", "call-1")
        assert "tool.started" not in types_of(events)


# --- Cancellation ---------------------------------------------------------------------------


class TestCancellationInAConcurrentBatch:
    """The signal reaches every running tool; calls not yet begun never begin; once the
    loop sees the signal no more results join (the sequential loop's rule), so that
    interrupted calls, never-run calls and the calls behind them stay open; the run ends
    cancelled once its running tools have returned."""

    def test_the_signal_reaches_every_running_tool_and_their_calls_stay_open(self) -> None:
        signal = threading.Event()
        inside = threading.Barrier(4, timeout=WAIT)  # three tools and the canceller
        saw: List[bool] = []

        def waiting(arguments: Dict[str, Any], signal: al.Signal) -> object:
            inside.wait()
            saw.append(signal.wait(WAIT))
            return "too late"

        def cancel() -> None:
            inside.wait()
            signal.set()  # from another thread: a timeout, a user pressing stop

        canceller = threading.Thread(target=cancel)
        canceller.start()
        calls = calls_of("wait", "c1", "c2", "c3")
        events, result, _ = run(
            one_batch(*calls), [tool("wait", waiting)], signal=signal, tool_concurrency=3
        )
        canceller.join(WAIT)
        assert result.status == "cancelled"
        assert saw == [True, True, True]
        assert types_of(events)[-4:] == ["tool.started"] * 3 + ["run.finished"]
        assert open_call_ids(result.messages) == ["c1", "c2", "c3"]
        assert tool_threads() == []

    def test_once_the_loop_sees_the_signal_no_more_results(self) -> None:
        """The sequential loop's rule, in a group: c2 and c3 complete while c1 still runs;
        then c1 sets the signal and is interrupted. The results behind c1 are dropped:
        every call stays open, whatever the timing, and the log replays exactly."""
        signal = WatchedSignal()

        def quick(arguments: Dict[str, Any], signal: Any) -> object:
            signal.returning()
            return "quick"

        def slow(arguments: Dict[str, Any], signal: Any) -> object:
            signal.wait_looked("c2", "c3")  # both completed, before the signal
            signal.set()
            return "interrupted"

        calls = [call("slow", "c1", {}), *calls_of("quick", "c2", "c3")]
        tools = [tool("slow", slow), tool("quick", quick)]
        events, result, _ = run(one_batch(*calls), tools, signal=signal, tool_concurrency=3)
        assert result.status == "cancelled"
        assert events_of_tools(events) == [
            ("tool.started", "c1"),
            ("tool.started", "c2"),
            ("tool.started", "c3"),
        ]
        assert results_of(result) == {}
        assert open_call_ids(result.messages) == ["c1", "c2", "c3"]
        again, _ = settle(alr.replay(events).run(), tool_concurrency=3)
        assert dicts_of(again) == dicts_of(events)

    def test_a_refusal_behind_an_interrupted_call_is_dropped_too(self) -> None:
        """A refused call's result was decided before the group ran; behind an interrupted
        call, it does not join either: the call stays open."""

        def cancelling(arguments: Dict[str, Any], signal: Any) -> object:
            signal.set()
            return "interrupted"

        def ask(tool_call: al.ToolCall, signal: al.Signal) -> Optional[str]:
            return "No." if tool_call.id == "c2" else None

        events, result, _ = run(
            one_batch(call("cancel", "c1", {}), echo_call("c2")),
            [tool("cancel", cancelling), echo_tool()],
            signal=threading.Event(),
            tool_concurrency=2,
            before_tool_call=ask,
        )
        assert result.status == "cancelled"
        assert events_of_tools(events)[2:] == []
        assert open_call_ids(result.messages) == ["c1", "c2"]

    def test_a_consumer_that_cancels_at_a_tool_finished_gets_no_more_results(self) -> None:
        """Cancelled on c1's tool.finished: c2 had completed (dropped), c3 is interrupted."""
        signal = WatchedSignal()

        def first(arguments: Dict[str, Any], signal: Any) -> object:
            signal.wait_looked("c2")
            return "first"

        def second(arguments: Dict[str, Any], signal: Any) -> object:
            signal.returning()
            return "second"

        def third(arguments: Dict[str, Any], signal: Any) -> object:
            signal.wait(WAIT)
            return "interrupted"

        tools = [tool("first", first), tool("second", second), tool("third", third)]
        calls = [call("first", "c1", {}), call("second", "c2", {}), call("third", "c3", {})]
        events, result, _ = run(
            one_batch(*calls),
            tools,
            signal=signal,
            tool_concurrency=3,
            cancel_at=("tool.finished", 1),
        )
        assert result.status == "cancelled"
        assert events_of_tools(events)[3:] == [("tool.finished", "c1")]
        assert open_call_ids(result.messages) == ["c2", "c3"]

    def test_cancelled_at_a_tool_started_no_tool_of_the_group_runs(self) -> None:
        """tool.started means scheduled: cancelled at the second, the group never runs."""
        executed: List[str] = []
        calls = [echo_call(f"c{n}") for n in (1, 2, 3)]
        events, result, _ = run(
            one_batch(*calls),
            [echo_tool(executed)],
            signal=threading.Event(),
            tool_concurrency=3,
            cancel_at=("tool.started", 2),
        )
        assert result.status == "cancelled"
        assert executed == []
        assert types_of(events)[-3:] == ["tool.started", "tool.started", "run.finished"]
        assert open_call_ids(result.messages) == ["c1", "c2", "c3"]

    def test_the_run_waits_for_a_tool_that_ignores_the_signal(self) -> None:
        returned: List[str] = []

        def stubborn(arguments: Dict[str, Any], signal: al.Signal) -> object:
            signal.wait(WAIT)
            time.sleep(0.1)  # it ignores the signal a while
            returned.append("stubborn")
            return "late"

        def cancel(arguments: Dict[str, Any], signal: Any) -> object:
            signal.set()
            return "cancelled"

        calls = [call("stubborn", "c1", {}), call("cancel", "c2", {})]
        _, result, _ = run(
            one_batch(*calls),
            [tool("stubborn", stubborn), tool("cancel", cancel)],
            signal=threading.Event(),
            tool_concurrency=2,
        )
        assert result.status == "cancelled"
        assert returned == ["stubborn"]  # the run ended only after it returned
        assert open_call_ids(result.messages) == ["c1", "c2"]
        assert tool_threads() == []

    def test_close_while_scheduling_runs_no_tool(self) -> None:
        executed: List[str] = []
        loop = start_run(
            al.ScriptedModel(one_batch(*(echo_call(f"c{n}") for n in (1, 2, 3)))),
            [echo_tool(executed)],
            tool_concurrency=3,
        )
        assert events_of_tools(until(loop, "tool.started", 2)) == [
            ("tool.started", "c1"),
            ("tool.started", "c2"),
        ]
        loop.close()
        assert executed == []

    def test_close_mid_batch_waits_for_the_running_tools_and_begins_no_other(self) -> None:
        """close() at c1's tool.finished: c2 and c3 are running, c4 waits for a thread. It
        returns once c2 and c3 have returned, and c4 never begins."""
        gate = threading.Event()
        began = {"c2": threading.Event(), "c3": threading.Event(), "c4": threading.Event()}
        returned: List[str] = []

        def gated(arguments: Dict[str, Any], signal: al.Signal) -> object:
            current = al.current_tool_call()
            assert current is not None
            if current.id == "c1":
                return "first"
            began[current.id].set()
            assert gate.wait(WAIT)
            returned.append(current.id)
            return "gated"

        loop = start_run(
            al.ScriptedModel(one_batch(*calls_of("gated", "c1", "c2", "c3", "c4"))),
            [tool("gated", gated)],
            tool_concurrency=2,
        )
        assert events_of_tools(until(loop, "tool.finished"))[-1] == ("tool.finished", "c1")
        # Both running (a thread that took c2 off the queue may not have begun it yet
        # when c3 begins: close() would then rightly cancel c2); c4 waits for a thread.
        assert began["c2"].wait(WAIT)
        assert began["c3"].wait(WAIT)
        opener = threading.Timer(0.1, gate.set)
        opener.start()
        loop.close()
        assert sorted(returned) == ["c2", "c3"]  # close() returned after them
        assert not began["c4"].is_set()  # and c4 never began
        assert tool_threads() == []


# --- Consent ----------------------------------------------------------------------------------


class TestConsent:
    """before_tool_call(call, signal) -> Optional[str]: asked for each call in assistant
    order before its tool.started (in a group, for every call of the group before the
    group is scheduled). None runs the call; a str refuses it."""

    @pytest.mark.parametrize(
        ("concurrency", "expected"),
        [
            pytest.param(
                1,
                ["ask c1", "tool.started c1", "tool.finished c1",
                 "ask c2", "tool.started c2", "tool.finished c2",
                 "ask w1", "tool.started w1", "tool.finished w1"],
                id="sequential",
            ),
            pytest.param(
                4,
                ["ask c1", "ask c2", "tool.started c1", "tool.started c2",
                 "tool.finished c1", "tool.finished c2",
                 "ask w1", "tool.started w1", "tool.finished w1"],
                id="concurrent",
            ),
        ],
    )  # fmt: skip
    def test_it_is_asked_in_assistant_order_before_each_tool_started(
        self, concurrency: int, expected: List[str]
    ) -> None:
        log: List[str] = []

        def ask(tool_call: al.ToolCall, signal: al.Signal) -> Optional[str]:
            log.append(f"ask {tool_call.id}")
            return None

        tools = [echo_tool(), tool("write", lambda arguments, signal: "ok", sequential=True)]
        loop = start_run(
            al.ScriptedModel(one_batch(echo_call("c1"), echo_call("c2"), call("write", "w1", {}))),
            tools,
            tool_concurrency=concurrency,
            before_tool_call=ask,
        )
        for event in loop:
            if event.type.startswith("tool."):
                log.append(f"{event.type} {event.payload['tool_call'].id}")
        assert log == expected

    @pytest.mark.parametrize("concurrency", [1, 3])
    def test_a_str_refuses_the_call_as_its_error_result_and_the_tool_never_runs(
        self, concurrency: int
    ) -> None:
        executed: List[str] = []
        refusal = "The user said no: not that file."

        def ask(tool_call: al.ToolCall, signal: al.Signal) -> Optional[str]:
            return refusal if tool_call.id == "c2" else None

        calls = [echo_call("c1"), echo_call("c2"), echo_call("c3")]
        events, result, model = run(
            one_batch(*calls),
            [echo_tool(executed)],
            tool_concurrency=concurrency,
            before_tool_call=ask,
        )
        assert result.status == "completed"
        assert sorted(executed) == ["c1", "c3"]
        refused = al.ToolResultMessage("tool-result-c2", "c2", "echo", refusal, True)
        assert result.messages[1:5] == (
            result.messages[1],
            echo_result("c1"),
            refused,
            echo_result("c3"),
        )
        assert model.requests[1].messages[3] == refused  # the model sees it next
        assert ("tool.started", "c2") in events_of_tools(events)
        assert ("tool.finished", "c2") in events_of_tools(events)

    @pytest.mark.parametrize("concurrency", [1, 3])
    def test_a_refused_calls_tool_finished_carries_refused_true_and_no_other_event_has_the_key(
        self, concurrency: int
    ) -> None:
        """The rule: a refused call's tool.finished says ``refused=True`` (JSON ``"refused":
        true``, read back by event_from_dict, shown by print_event); the key is absent from
        every other event, so that a run without consent logs as the seed's."""

        def ask(tool_call: al.ToolCall, signal: al.Signal) -> Optional[str]:
            return "No." if tool_call.id == "c2" else None

        calls = [echo_call("c1"), echo_call("c2"), echo_call("c3")]
        events, _, _ = run(
            one_batch(*calls), [echo_tool()], tool_concurrency=concurrency, before_tool_call=ask
        )
        finished = {e.payload["tool_call"].id: e for e in events if e.type == "tool.finished"}
        assert [event for event in events if "refused" in event.payload] == [finished["c2"]]
        assert finished["c2"].payload["refused"] is True
        data = json.loads(json.dumps(finished["c2"].to_dict()))
        assert data["payload"]["refused"] is True
        assert al.event_from_dict(data) == finished["c2"]
        assert "refused" not in finished["c1"].to_dict()["payload"]
        shown = io.StringIO()
        al.print_event(finished["c2"], shown)
        line = f"{finished['c2'].sequence:3d}  tool.finished     request-001 echo refused: No."
        assert shown.getvalue() == line + "\n"

    def test_a_refusal_behind_an_interrupted_call_is_dropped_as_any_result(self) -> None:
        """Once the loop sees the signal no more results join: a refusal is a result."""

        def cancelling(arguments: Dict[str, Any], signal: Any) -> object:
            signal.set()
            return "interrupted"

        events, result, _ = run(
            one_batch(call("cancel", "c1", {}), echo_call("c2")),
            [tool("cancel", cancelling), echo_tool()],
            signal=threading.Event(),
            tool_concurrency=2,
            before_tool_call=lambda tool_call, signal: "No." if tool_call.id == "c2" else None,
        )
        assert result.status == "cancelled"
        assert [event for event in events if event.type == "tool.finished"] == []
        assert [call.id for call in al.open_tool_calls(result.messages)] == ["c1", "c2"]

    @pytest.mark.parametrize(
        ("value", "error"),
        [
            pytest.param(False, None, id="false-read-as-given"),
            pytest.param("yes", "event.payload.refused must be a boolean, got str", id="str"),
            pytest.param(None, None, id="null-read-as-absent"),
        ],
    )
    def test_event_from_dict_reads_refused_as_an_optional_bool(
        self, value: object, error: Optional[str]
    ) -> None:
        call_data = echo_call("c1").to_dict()
        result_data = echo_result("c1").to_dict()
        data = {
            "sequence": 3,
            "type": "tool.finished",
            "payload": {
                "requestId": "request-001",
                "toolCall": call_data,
                "toolResult": result_data,
                "refused": value,
            },
        }
        if error is not None:
            with pytest.raises(ValueError, match=error):
                al.event_from_dict(data)
            return
        event = al.event_from_dict(data)
        assert event.payload.get("refused") is value
        if value is None:
            del data["payload"]["refused"]  # type: ignore[attr-defined]
        assert event.to_dict() == data

    def test_it_may_block_until_a_person_answers(self) -> None:
        questions: queue.Queue[al.ToolCall] = queue.Queue()
        answers: queue.Queue[Optional[str]] = queue.Queue()

        def ask(tool_call: al.ToolCall, signal: al.Signal) -> Optional[str]:
            questions.put(tool_call)
            return answers.get(timeout=WAIT)

        def person() -> None:  # another thread: a terminal, a chat, a web page
            for _ in range(2):
                asked = questions.get(timeout=WAIT)
                answers.put(None if asked.id == "c1" else "No.")

        thread = threading.Thread(target=person)
        thread.start()
        _, result, _ = run(
            one_batch(echo_call("c1"), echo_call("c2")), [echo_tool()], before_tool_call=ask
        )
        thread.join(WAIT)
        assert results_of(result) == {"c1": ("c1", False), "c2": ("No.", True)}

    @pytest.mark.parametrize(
        ("concurrency", "kept", "opened"),
        [
            pytest.param(1, ["c1"], ["c2", "c3"], id="sequential"),
            pytest.param(3, [], ["c1", "c2", "c3"], id="concurrent"),
        ],
    )
    def test_it_may_set_the_signal_and_the_call_stays_open(
        self, concurrency: int, kept: List[str], opened: List[str]
    ) -> None:
        """Cancelled while asking about c2: c2 stays open and no tool of its group runs."""
        executed: List[str] = []
        signal = threading.Event()

        def ask(tool_call: al.ToolCall, signal: Any) -> Optional[str]:
            if tool_call.id == "c2":
                signal.set()  # the person closed the window
            return None

        calls = [echo_call("c1"), echo_call("c2"), echo_call("c3")]
        events, result, _ = run(
            one_batch(*calls),
            [echo_tool(executed)],
            signal=signal,
            tool_concurrency=concurrency,
            before_tool_call=ask,
        )
        assert result.status == "cancelled"
        assert executed == kept
        assert open_call_ids(result.messages) == opened
        assert [c for _, c in events_of_tools(events)] == [c for c in kept for _ in "sf"]

    @pytest.mark.parametrize("concurrency", [1, 2])
    def test_an_exception_fails_the_run_naming_the_call(self, concurrency: int) -> None:
        executed: List[str] = []

        def ask(tool_call: al.ToolCall, signal: al.Signal) -> Optional[str]:
            raise ConnectionError("the approval service is down")

        events, result, _ = run(
            one_batch(echo_call("c1"), echo_call("c2")),
            [echo_tool(executed)],
            tool_concurrency=concurrency,
            before_tool_call=ask,
        )
        assert_failed(
            events,
            result,
            "TOOL_PHASE_ERROR",
            "before_tool_call for tool call 'c1' raised ConnectionError: the approval service",
        )
        assert isinstance(result.error and result.error.exception, ConnectionError)
        assert executed == []

    @pytest.mark.parametrize(
        ("answer", "kind"),
        [
            pytest.param(1, "an int", id="int"),
            pytest.param(b"no", "a bytes", id="bytes"),
            pytest.param(False, "a bool", id="bool"),
            pytest.param(type("Refusal", (str,), {})("no"), "a Refusal", id="str-subclass"),
        ],
    )
    def test_an_answer_neither_none_nor_a_str_fails_the_run_naming_its_type(
        self, answer: object, kind: str
    ) -> None:
        executed: List[str] = []
        events, result, _ = run(
            one_batch(echo_call("c1")),
            [echo_tool(executed)],
            before_tool_call=lambda tool_call, signal: answer,
        )
        assert_failed(
            events,
            result,
            "TOOL_PHASE_ERROR",
            f"before_tool_call for tool call 'c1' returned {kind}",
        )
        assert executed == []


# --- Consent that survives a restart -------------------------------------------------------


class TestConsentThatSurvivesARestart:
    """A run cancelled while asking; its transcript saved; a person's decision later; the
    run resumed: no tool of the batch runs twice."""

    def test_from_a_cancelled_run_to_the_resumed_run(self) -> None:
        ran: List[str] = []

        def record(arguments: Dict[str, Any], signal: al.Signal) -> object:
            current = al.current_tool_call()
            assert current is not None
            ran.append(current.id)
            return f"done {current.id}"

        tools = al.ToolRegistry([tool("read", record), tool("delete", record)])
        calls = [call("read", "c1", {}), call("delete", "c2", {}), call("delete", "c3", {})]
        signal = threading.Event()

        def ask(tool_call: al.ToolCall, signal: Any) -> Optional[str]:
            if tool_call.name == "read":
                return None  # no effect: no need to ask
            signal.set()  # nobody is there to answer: stop, and ask later
            return None

        _, first = settle(
            al.run_agent_loop(
                messages=[user("Clean up.")],
                model=al.ScriptedModel(one_batch(*calls)),
                tools=tools,
                max_steps=4,
                signal=signal,
                before_tool_call=ask,
            ),
            consent=True,
        )
        assert first.status == "cancelled"
        assert ran == ["c1"]
        saved = json.dumps([message.to_dict() for message in first.messages])

        # Later, maybe in another process: the person approves c2 and refuses c3.
        transcript = [al.message_from_dict(data) for data in json.loads(saved)]
        decisions = {"c2": None, "c3": "Keep that one."}
        for open_call in al.open_tool_calls(transcript):
            refusal = decisions[open_call.id]
            if refusal is None:
                transcript.append(al.execute_tool_call(tools, open_call, threading.Event()))
            else:
                transcript.append(
                    al.ToolResultMessage(
                        "tool-result-" + open_call.id, open_call.id, open_call.name, refusal, True
                    )
                )
        assert ran == ["c1", "c2"]

        model = al.ScriptedModel([stop("response-002", "Cleaned up, but kept c3.")])
        _, resumed = settle(
            al.run_agent_loop(
                messages=transcript,
                model=model,
                tools=tools,
                max_steps=3,
                request_sequence_start=first.next_request_sequence,
            ),
            model,
        )
        assert resumed.status == "completed"
        assert model.requests[0].id == "request-002"
        assert ran == ["c1", "c2"]  # no tool of the batch ran twice, c3 never
        assert results_of(resumed) == {
            "c1": ("done c1", False),
            "c2": ("done c2", False),
            "c3": ("Keep that one.", True),
        }


# --- Replay ----------------------------------------------------------------------------------


class TestReplayOfConcurrentRuns:
    """agent_loop_replay infers from the log which calls ran together (tool.started
    events in a row): a concurrent run replays to the same log."""

    @staticmethod
    def recorded(
        script: List[al.ScriptedResponse], tools: List[al.Tool], **options: Any
    ) -> Tuple[List[al.Event], al.RunResult]:
        events, result, _ = run(script, tools, tool_concurrency=4, **options)
        return events, result

    def script(self) -> List[al.ScriptedResponse]:
        return [
            tool_turn(
                "response-001",
                echo_call("c1"),
                call("counter", "c2", {}),
                call("write", "w1", {}),
                call("write", "w2", {}),
                call("boom", "c3", {}),
                call("missing", "c4", {}),
                call("refuse", "c5", {}),
            ),
            tool_turn("response-002", call("write", "w3", {})),
            tool_turn("response-003", echo_call("c6"), echo_call("c7")),
            stop("response-004", "Done."),
        ]

    def tools(self, executed: Optional[List[str]] = None) -> List[al.Tool]:
        write = tool("write", lambda arguments, signal: "written", sequential=True)
        return [*every_kind_of_tool(executed), write]

    def test_a_concurrent_run_replays_exactly(self) -> None:
        executed: List[str] = []
        events, result = self.recorded(self.script(), self.tools(executed))
        assert result.status == "completed"
        for log in (events, read_json_lines(json_lines(events))):
            replayed = alr.replay(log)
            assert replayed.tool_concurrency == 3  # the largest group
            sequential = {t.name: t.sequential for t in replayed.tools}
            assert sequential == {
                "echo": False,
                "counter": False,
                "write": True,
                "boom": False,
                "missing": False,
                "refuse": False,
            }
            again, replayed_result = settle(
                replayed.run(), max_steps=replayed.max_steps, tool_concurrency=3
            )
            assert dicts_of(again) == dicts_of(events)
            assert replayed_result == result
        assert sorted(executed) == ["c1", "c6", "c7"]  # the recording, and no tool since

    def test_a_cancelled_concurrent_run_replays_exactly(self) -> None:
        """Cancelled at c1's tool.finished while c2 ran: replayed, c2 waits for the
        replay's cancellation and is interrupted again."""

        def waiting(arguments: Dict[str, Any], signal: al.Signal) -> object:
            signal.wait(WAIT)
            return "interrupted"

        tools = [echo_tool(), tool("wait", waiting)]
        events, result = self.recorded(
            one_batch(echo_call("c1"), call("wait", "c2", {})),
            tools,
            signal=threading.Event(),
            cancel_at=("tool.finished", 1),
        )
        assert result.status == "cancelled"
        assert open_call_ids(result.messages) == ["c2"]
        again, _ = settle(alr.replay(events).run(), tool_concurrency=2)
        assert dicts_of(again) == dicts_of(events)

    def test_a_recorded_open_call_waits_for_the_replays_cancellation(self) -> None:
        """The recorded tool of a call the log left open answers only once the signal is
        set, so that the run discards its answer as the recording did."""

        def waiting(arguments: Dict[str, Any], signal: al.Signal) -> object:
            signal.wait(WAIT)
            return "interrupted"

        tools = [echo_tool(), tool("wait", waiting)]
        batch = one_batch(echo_call("c1"), call("wait", "c2", {}), call("wait", "c3", {}))
        events, result = self.recorded(
            batch, tools, signal=threading.Event(), cancel_at=("tool.finished", 1)
        )
        assert open_call_ids(result.messages) == ["c2", "c3"]
        replayed = alr.replay(events)
        signal = threading.Event()
        replayed.model.stream(al.ModelRequest("request-001", replayed.messages, ()), signal)
        answers: Dict[str, al.ToolResultMessage] = {}

        def execute(open_call: al.ToolCall) -> None:
            answers[open_call.id] = al.execute_tool_call(replayed.tools, open_call, signal)

        threads = [
            threading.Thread(target=execute, args=(call("wait", id, {}),)) for id in ("c2", "c3")
        ]
        for thread in threads:
            thread.start()
            thread.join(0.05)
            assert thread.is_alive()  # waiting for the signal
        signal.set()
        for thread in threads:
            thread.join(WAIT)
        assert {id: answer.content for id, answer in answers.items()} == {
            "c2": "interrupted in the recording",
            "c3": "interrupted in the recording",
        }
        again, _ = settle(replayed.run(), tool_concurrency=3)
        assert dicts_of(again) == dicts_of(events)
