"""Tests of agent_loop_view.py: a run's times, and the page that draws it.

The runs are real runs of the loop (``ScriptedModel``, tools at once, a refusal) given
times by the test, so that every figure is known. The page is tested twice: its embedded
data and its escaping here, and what it shows after its script ran in a real browser
(``TestInABrowser``: headless Debian chromium, which ``tox -e browser`` installs with
tests/install_chromium.sh; elsewhere these tests skip, and ``AGENT_LOOP_REQUIRE_BROWSER=1``,
set by that env, turns the skip into a failure). ``AGENT_LOOP_RUN_PICTURE=PATH`` keeps
the screenshot of the sample run at PATH too (docs/run.png is made so).
"""

from __future__ import annotations

import base64
import hashlib
import html.parser
import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Generator, List, Optional, Tuple

import pytest

import agent_loop as al
import agent_loop_replay as alr
import agent_loop_view as view
from loop_testing import RequestKeyedModel, run

TimedEvent = Tuple[al.Event, Optional[float]]

R = "request-001"

HOSTILE = (
    "<script>document.body.remove()</script></div>"
    '<img src=x onerror="document.body.remove()"><!-- & -->'
)
"""A tool's argument and result that must be shown as text, never read as HTML (read
as HTML, it would empty the page)."""

REFUSAL = "the user refused to run this tool call"

SAMPLE_TIMES = [
    0.0,  # 0 message.accepted
    0.61,  # 1 request-001 thinking
    0.64,  # 2 text
    0.83,  # 3 weather Lisbon
    0.84,  # 4 weather Atlantis
    0.85,  # 5 tool.started call-1
    0.86,  # 6 tool.started call-2
    1.12,  # 7 tool.finished call-1
    1.35,  # 8 tool.finished call-2, an error
    1.72,  # 9 request-002 add
    1.74,  # 10 send_report
    1.75,  # 11 tool.started call-3
    1.75,  # 12 tool.started call-4
    1.76,  # 13 tool.finished call-3
    1.77,  # 14 tool.finished call-4, refused
    2.31,  # 15 request-003 text
    2.52,  # 16 text
    2.53,  # 17 run.finished
]


def weather(city: str) -> str:
    """Reports the weather in a city."""
    if city == "Atlantis":
        raise al.ToolError("no weather station in Atlantis")
    return "sunny, 19 C"


def add(left: float, right: float) -> float:
    """Adds two numbers."""
    return left + right


def send_report(to: str, text: str) -> str:
    """Sends a report by e-mail."""
    return HOSTILE


def consent(call: al.ToolCall, signal: al.Signal) -> Optional[str]:
    """Refuses to send anything."""
    return REFUSAL if call.name == "send_report" else None


def refused(event: al.Event) -> al.Event:
    """The event with the refusal mark that the loop sets on a refused call's tool.finished."""
    return al.Event(event.sequence, event.type, dict(event.payload, refused=True))


def sample_events() -> List[al.Event]:
    """A run of three steps: two calls at once (one fails), then a call and a refused
    one at once, then the answer; 18 events."""
    tools = [al.Tool.from_function(f) for f in (weather, add, send_report)]
    lisbon, atlantis = ({"city": "Lisbon"}, {"city": "Atlantis"})
    model = al.ScriptedModel(
        [
            al.scripted_response(
                "r1",
                [
                    al.ThinkingBlock("Two cities: ask both at once."),
                    al.TextBlock("Checking both cities."),
                    al.ToolCall("call-1", "weather", lisbon),
                    al.ToolCall("call-2", "weather", atlantis),
                ],
                "toolCall",
                usage=al.Usage(input_tokens=402, output_tokens=58),
            ),
            al.scripted_response(
                "r2",
                [
                    al.ToolCall("call-3", "add", {"left": 20, "right": 22}),
                    al.ToolCall("call-4", "send_report", {"to": "boss", "text": HOSTILE}),
                ],
                "toolCall",
                usage=al.Usage(input_tokens=566, output_tokens=49),
            ),
            al.scripted_response(
                "r3",
                [al.TextBlock("Lisbon: sunny, 19 C; "), al.TextBlock("Atlantis: none. 42.")],
                "stop",
                usage=al.Usage(input_tokens=812, output_tokens=64),
            ),
        ]
    )
    events, _, _ = run(
        model,
        tools,
        messages=[al.UserMessage("user-001", "Weather in Lisbon and Atlantis? 20 + 22?")],
        tool_concurrency=2,
        before_tool_call=consent,
    )
    return [refused(e) if e.sequence == 14 else e for e in events]


def sample_run() -> List[TimedEvent]:
    """The sample run with SAMPLE_TIMES."""
    return list(zip(sample_events(), SAMPLE_TIMES))


def sequential_events() -> List[al.Event]:
    """Three steps of one call each, one after the other: 11 events."""
    tools = [al.Tool.from_function(add)]
    steps = [
        al.scripted_response(
            f"r{n}", [al.ToolCall(f"c{n}", "add", {"left": n, "right": 1})], "toolCall"
        )
        for n in (1, 2)
    ]
    model = al.ScriptedModel([*steps, al.scripted_response("r3", [al.TextBlock("3")], "stop")])
    return run(model, tools, messages=[al.UserMessage("u", "Count")], max_steps=3)[0]


def chunk(sequence: int, request_id: str, text: str = "t") -> al.Event:
    return al.Event(
        sequence,
        "model.chunk",
        {"request_id": request_id, "chunk": al.TextDelta(request_id, text)},
    )


def started(sequence: int, request_id: str, call_id: str) -> al.Event:
    call = al.ToolCall(call_id, "add", {"left": 1, "right": 2})
    return al.Event(sequence, "tool.started", {"request_id": request_id, "tool_call": call})


def finished(sequence: int, request_id: str, call_id: str, is_error: bool = False) -> al.Event:
    call = al.ToolCall(call_id, "add", {"left": 1, "right": 2})
    result = al.ToolResultMessage("result-" + call_id, call_id, "add", "3", is_error)
    payload = {"request_id": request_id, "tool_call": call, "tool_result": result}
    return al.Event(sequence, "tool.finished", payload)


def go_on_durably(path: Path, answer: object) -> Path:
    """One process of a durable run whose call a reports progress and whose call b gets
    ``answer`` from before_tool_call (agent_loop_durable.LATER: it awaits a decision)."""
    import agent_loop_durable as ald

    def work(arguments: Dict[str, Any], signal: al.Signal) -> Generator[object, None, object]:
        yield {"done": 0.5}
        return "worked"

    model = RequestKeyedModel(
        {
            R: al.scripted_response("r1", [al.ToolCall(n, "work", {}) for n in "ab"], "toolCall"),
            "request-002": al.scripted_response("r2", [al.TextBlock("Done.")], "stop"),
        }
    )
    run_ = ald.durable_run(
        path,
        messages=[al.UserMessage("u", "Work.")],
        model=model,
        tools=al.ToolRegistry([al.Tool("work", "Works.", {"type": "object"}, work)]),
        max_steps=2,
        before_tool_call=lambda call, signal: None if call.id == "a" else answer,
    )
    al.settle_run(run_)
    return path


def page_data(page: str) -> Dict[str, Any]:
    """The run's data as the page embeds it."""
    match = re.search(r'<script type="application/json" id="run-data">(.*?)</script>', page)
    assert match is not None
    return json.loads(match.group(1))  # type: ignore[no-any-return]


# --- The times ----------------------------------------------------------------------


class TestSummarizeTimes:
    """Each step's time to first chunk and stream time, each call's duration, the run's."""

    def test_each_step_and_each_call(self) -> None:
        times = view.summarize_times(sample_run())
        assert times.total == 2.53
        assert [step.request_id for step in times.steps] == [
            "request-001",
            "request-002",
            "request-003",
        ]
        # A step begins at the time of the event just before its first event.
        assert [step.time_to_first_chunk for step in times.steps] == pytest.approx(
            [0.61, 1.72 - 1.35, 2.31 - 1.77]
        )
        assert [step.stream_time for step in times.steps] == pytest.approx(
            [0.84 - 0.61, 1.74 - 1.72, 2.52 - 2.31]
        )
        tools = [tool for step in times.steps for tool in step.tools]
        assert [(t.request_id, t.call_id, t.name) for t in tools] == [
            ("request-001", "call-1", "weather"),
            ("request-001", "call-2", "weather"),
            ("request-002", "call-3", "add"),
            ("request-002", "call-4", "send_report"),
        ]
        assert [t.duration for t in tools] == pytest.approx(
            [1.12 - 0.85, 1.35 - 0.86, 1.76 - 1.75, 1.77 - 1.75]
        )

    @pytest.mark.parametrize(
        ("events", "expected"),
        [
            pytest.param([chunk(0, R, "a"), chunk(1, R, "b")], 0.5, id="first-event-of-the-run"),
            pytest.param(
                [
                    al.Event(0, "message.accepted", {"message": al.UserMessage("u", "Hi")}),
                    chunk(1, R),
                ],
                0.5 - 0.25,
                id="after-the-event-before-it",
            ),
        ],
    )
    def test_a_step_begins_at_the_run_start_or_after_the_event_before_it(
        self, events: List[al.Event], expected: float
    ) -> None:
        timed = list(zip(events, [0.25, 0.5]))
        if events[0].type == "model.chunk":
            timed = list(zip(events, [0.5, 0.75]))
        step = view.summarize_times(timed).steps[0]
        assert step.time_to_first_chunk == pytest.approx(expected)

    def test_without_times_every_figure_is_none(self) -> None:
        times = view.summarize_times((event, None) for event in sample_events())
        assert times.total is None
        assert {step.time_to_first_chunk for step in times.steps} == {None}
        assert {step.stream_time for step in times.steps} == {None}
        assert {tool.duration for step in times.steps for tool in step.tools} == {None}
        assert len(times.steps) == 3

    def test_a_step_without_chunks_and_a_call_without_its_end(self) -> None:
        # A log can hold a call's tool.started and not its tool.finished (the run ended).
        step = view.summarize_times([(started(0, R, "open"), 1.0)]).steps[0]
        assert (step.time_to_first_chunk, step.stream_time) == (None, None)
        assert [(t.call_id, t.duration) for t in step.tools] == [("open", None)]

    def test_each_call_at_once_has_its_own_duration(self) -> None:
        """A call's end is the time of its tool.finished, which for calls at once is when
        its tool returned (Event.time), not when the loop emitted the event: calls of
        400, 200 and 100 ms, finished in assistant order."""
        events = [started(0, R, "a"), started(1, R, "b"), started(2, R, "c")]
        events += [finished(3, R, "a"), finished(4, R, "b"), finished(5, R, "c")]
        timed = list(zip(events, [0.0, 0.0, 0.0, 0.4, 0.2, 0.1]))
        durations = [tool.duration for tool in view.summarize_times(timed).steps[0].tools]
        assert durations == [0.4, 0.2, 0.1]
        calls = page_data(view.render_page(timed))["steps"][0]["calls"]
        assert [(c["lane"], c["end"], c["duration"]) for c in calls] == [
            (0, 0.4, "400 ms"),
            (1, 0.2, "200 ms"),
            (2, 0.1, "100 ms"),
        ]

    def test_a_time_missing_on_one_side_leaves_that_figure_unknown(self) -> None:
        events = [chunk(0, R), chunk(1, R), started(2, R, "c"), finished(3, R, "c")]
        times = view.summarize_times(zip(events, [0.5, None, 0.75, 1.0]))
        assert (times.steps[0].time_to_first_chunk, times.steps[0].stream_time) == (0.5, None)
        assert times.steps[0].tools[0].duration == 0.25
        assert times.total == 1.0

    def test_an_empty_run(self) -> None:
        assert view.summarize_times([]) == view.RunTimes((), None)

    @pytest.mark.parametrize(
        "item",
        [
            pytest.param("event", id="not-a-pair"),
            pytest.param((chunk(0, R),), id="one-item"),
            pytest.param((chunk(0, R), 1.0, 2.0), id="three-items"),
            pytest.param(({"sequence": 0}, 1.0), id="not-an-event"),
            pytest.param((chunk(0, R), "1.0"), id="time-a-str"),
            pytest.param((chunk(0, R), True), id="time-a-bool"),
        ],
    )
    def test_an_item_that_is_no_timed_event_is_a_type_error(self, item: object) -> None:
        with pytest.raises(
            TypeError, match=r"\(Event, float or None\) pairs, got .* at position 1"
        ):
            view.summarize_times([(chunk(0, R), 0), item])  # type: ignore[list-item]


class TestFormatTimes:
    """The summary as the command line prints it."""

    def test_the_run_then_a_line_per_step_and_per_call(self) -> None:
        assert view.format_times(view.summarize_times(sample_run())) == (
            "times: 2.53 s in all\n"
            "  request-001: first chunk after 610 ms, streamed 230 ms\n"
            "    weather [call-1]: 270 ms\n"
            "    weather [call-2]: 490 ms\n"
            "  request-002: first chunk after 370 ms, streamed 20 ms\n"
            "    add [call-3]: 10 ms\n"
            "    send_report [call-4]: 20 ms\n"
            "  request-003: first chunk after 540 ms, streamed 210 ms"
        )

    @pytest.mark.parametrize(
        ("seconds", "text"),
        [
            pytest.param(None, "unknown", id="unknown"),
            pytest.param(0.0, "0 ms", id="zero"),
            pytest.param(0.9994, "999 ms", id="below-a-second"),
            pytest.param(1.0, "1.00 s", id="a-second"),
            pytest.param(75.5, "75.50 s", id="over-a-minute"),
        ],
    )
    def test_milliseconds_below_a_second_else_seconds(
        self, seconds: Optional[float], text: str
    ) -> None:
        assert view.format_times(view.RunTimes((), seconds)) == f"times: {text} in all"


# --- The page -----------------------------------------------------------------------


class TestLanes:
    """Calls that ran one after the other share a lane; calls at once get one each."""

    def test_calls_at_once_take_a_lane_each_and_free_it_when_finished(self) -> None:
        data = page_data(view.render_page(sample_run()))
        assert [step["lanes"] for step in data["steps"]] == [
            ["weather [call-1]", "weather [call-2]"],
            ["add [call-3]", "send_report [call-4]"],
            [],
        ]
        assert [[call["lane"] for call in step["calls"]] for step in data["steps"]] == [
            [0, 1],
            [0, 1],
            [],
        ]

    def test_calls_one_after_the_other_share_one_lane(self) -> None:
        events = sequential_events()
        data = page_data(view.render_page((event, None) for event in events))
        assert [step["lanes"] for step in data["steps"]] == [["add [c1]"], ["add [c2]"], []]

    def test_a_freed_lane_is_taken_again_before_a_new_one(self) -> None:
        events = [
            started(0, R, "a"),
            started(1, R, "b"),
            finished(2, R, "a"),
            finished(3, R, "b"),
            started(4, R, "c"),  # lanes 0 and 1 are free again
            finished(5, R, "c"),
        ]
        data = page_data(view.render_page((event, None) for event in events))
        assert [call["lane"] for call in data["steps"][0]["calls"]] == [0, 1, 0]
        assert data["steps"][0]["lanes"] == ["add [a], add [c]", "add [b]"]


class TestRenderPage:
    """One self-contained page: the run's data as JSON, escaped, drawn by its own script."""

    def test_the_data_it_draws(self) -> None:
        data = page_data(view.render_page(sample_run(), title="Run 1"))
        assert (data["title"], data["timed"], data["span"], data["total"]) == (
            "Run 1",
            True,
            2.53,
            "2.53 s",
        )
        assert data["axis"] == "time since the run began, 0 to 2.53 s"
        assert [tick["label"] for tick in data["ticks"]] == [
            "0 ms",
            "632 ms",
            "1.26 s",
            "1.90 s",
            "2.53 s",
        ]
        assert data["messages"] == [
            {"role": "user", "id": "user-001", "text": "Weather in Lisbon and Atlantis? 20 + 22?"}
        ]
        first, second, last = data["steps"]
        assert {
            key: first[key] for key in ("requestId", "start", "firstChunk", "lastChunk", "end")
        } == {
            "requestId": "request-001",
            "start": 0.0,
            "firstChunk": 0.61,
            "lastChunk": 0.84,
            "end": 1.35,
        }
        assert first["label"] == "first chunk after 610 ms, streamed 230 ms"
        assert (first["thinking"], first["text"]) == (
            "Two cities: ask both at once.",
            "Checking both cities.",
        )
        assert last["text"] == "Lisbon: sunny, 19 C; Atlantis: none. 42."
        calls = first["calls"] + second["calls"]
        assert [(c["name"], c["status"], c["duration"]) for c in calls] == [
            ("weather", "ok", "270 ms"),
            ("weather", "error", "490 ms"),
            ("add", "ok", "10 ms"),
            ("send_report", "refused", "20 ms"),
        ]
        assert calls[1]["result"] == "no weather station in Atlantis"
        assert (calls[0]["start"], calls[0]["end"]) == (0.85, 1.12)
        assert json.loads(calls[3]["arguments"]) == {"to": "boss", "text": HOSTILE}
        assert calls[3]["result"] == REFUSAL
        assert data["result"] == {
            "status": "completed",
            "steps": 3,
            "finalText": "Lisbon: sunny, 19 C; Atlantis: none. 42.",
            "error": None,
            "usage": {"input": 1780, "output": 171},
            "awaiting": [],
        }

    def test_text_of_the_log_cannot_end_the_data_or_open_an_element(self) -> None:
        page = view.render_page(sample_run(), title="<b>run</b> & </title>")
        # The page's own two scripts and nothing else: no '<' or '>' of the log is left.
        assert page.count("<script") == 2
        assert page.count("</script>") == 2
        for text in ("<b>", "</div>", "<!--", "<img"):
            assert text not in page
        assert "<title>&lt;b&gt;run&lt;/b&gt; &amp; &lt;/title&gt;</title>" in page
        data = page_data(page)
        assert data["title"] == "<b>run</b> & </title>"
        assert json.loads(data["steps"][1]["calls"][1]["arguments"])["text"] == HOSTILE

    def test_its_policy_allows_only_its_own_style_and_script_and_no_connection(self) -> None:
        page = view.render_page(sample_run())
        policy = re.search(r'Content-Security-Policy" content="([^"]*)"', page)
        assert policy is not None
        style = re.search(r"<style>(.*)</style>", page, re.DOTALL)
        script = re.search(r"<script>(.*)</script>", page, re.DOTALL)
        assert style is not None
        assert script is not None

        def source(text: str) -> str:
            digest = hashlib.sha256(text.encode("utf-8")).digest()
            return "'sha256-" + base64.b64encode(digest).decode() + "'"

        assert policy.group(1) == (
            f"default-src 'none'; style-src {source(style.group(1))}; "
            f"script-src {source(script.group(1))}"
        )
        # Nothing to fetch: no address, and no src attribute outside the run's data.
        markup = re.sub(r'(id="run-data">).*?</script>', r"\1</script>", page)
        for text in ("http:", "https:", "src="):
            assert text not in markup

    def test_without_times_the_timeline_is_one_unit_per_event(self) -> None:
        data = page_data(view.render_page((event, None) for event in sample_events()))
        assert (data["timed"], data["span"], data["total"]) == (False, 17, None)
        assert data["axis"] == "no times in the log: one unit per event, 0 to 17"
        assert [tick["at"] for tick in data["ticks"]] == [0, 4, 8, 13, 17]
        first = data["steps"][0]
        assert (first["start"], first["firstChunk"], first["lastChunk"], first["end"]) == (
            0,
            1,
            4,
            8,
        )
        assert first["label"] == "4 chunk(s)"
        assert [call["duration"] for call in first["calls"]] == [None, None]

    def test_a_time_missing_anywhere_makes_the_timeline_ordinal(self) -> None:
        run = sample_run()
        run[5] = (run[5][0], None)
        data = page_data(view.render_page(run))
        assert (data["timed"], data["span"]) == (False, 17)

    def test_an_empty_run_and_a_run_without_its_end(self) -> None:
        assert page_data(view.render_page([]))["result"] is None
        data = page_data(view.render_page([(started(0, R, "c"), 0.5)]))
        assert data["result"] is None
        (call,) = data["steps"][0]["calls"]
        assert (call["status"], call["result"], call["start"], call["end"]) == (
            "open",
            None,
            0.5,
            0.5,
        )

    def test_events_out_of_a_runs_order_are_a_value_error(self) -> None:
        # RunSteps' rule (tests/test_run_steps.py holds its table).
        with pytest.raises(ValueError, match="finished without starting"):
            view.render_page([(chunk(0, R), 0.25), (finished(1, R, "c", True), 0.5)])

    def test_starting_messages_of_each_role_and_a_failed_run(self) -> None:
        call = al.ToolCall("c1", "add", {"left": 1, "right": 2})
        messages: List[al.Message] = [
            al.UserMessage("u", "Add"),
            al.AssistantMessage("a", [al.TextBlock("Adding."), call]),
            al.ToolResultMessage("t", "c1", "add", "3", False),
        ]
        model = al.ScriptedModel([])  # no response left: the run fails
        events, result, _ = run(model, messages=messages, max_steps=1)
        data = page_data(view.render_page((event, None) for event in events))
        assert data["messages"] == [
            {"role": "user", "id": "u", "text": "Add"},
            {"role": "assistant", "id": "a", "text": "Adding."},
            {"role": "toolResult", "id": "t", "text": "3"},
        ]
        assert result.error is not None
        assert data["result"]["status"] == "failed"
        assert data["result"]["error"] == result.error.to_dict()
        assert data["result"]["usage"] is None

    def test_progress_shows_on_its_call_and_a_journal_its_decisions_and_resumes(
        self, tmp_path: Path
    ) -> None:
        """A real durable run: call a reports its progress, b awaits a decision (LATER);
        answered, a second process goes on and b runs."""
        import agent_loop_durable as ald

        path = go_on_durably(tmp_path / "run.jsonl", ald.LATER)
        timed, journal = view.read_run(str(path))
        data = page_data(view.render_page(timed, journal=journal))
        assert data["journal"] == {
            "awaiting": ["work [b]"],
            "answers": ["a: run it"],
            "resumes": [],
        }
        # b awaits before its tool.started: the result says so, not a lane.
        (call_a,) = data["steps"][0]["calls"]
        assert call_a["status"] == "ok"
        assert [p["text"] for p in call_a["progress"]] == ['{"done": 0.5}']
        assert call_a["start"] <= call_a["progress"][0]["at"] <= call_a["end"]
        assert (data["result"]["status"], data["result"]["awaiting"]) == (
            "cancelled",
            ["work [b]"],
        )
        go_on_durably(path, None)
        timed, journal = view.read_run(str(path))
        data = page_data(view.render_page(timed, journal=journal))
        assert data["journal"]["awaiting"] == []
        assert data["journal"]["answers"] == ["a: run it", "b: run it"]
        (resume,) = data["journal"]["resumes"]
        assert resume.startswith("a process went on from event ")
        assert [call["status"] for call in data["steps"][0]["calls"]] == ["ok", "ok"]
        assert (data["result"]["status"], data["result"]["awaiting"]) == ("completed", [])

    def test_calls_at_once_are_drawn_with_their_own_durations(self, tmp_path: Path) -> None:
        """End to end: calls at once that take 400, 200 and 100 ms (c returns first, then
        b, then a: gates fix the order), logged with times; each call's end is when its
        tool returned (Event.time), not when its tool.finished was emitted (after a's)."""
        returned = {name: threading.Event() for name in "abc"}
        takes = {"a": 0.4, "b": 0.2, "c": 0.1}
        after = {"a": "b", "b": "c"}

        def work(arguments: Dict[str, Any], signal: al.Signal) -> object:
            current = al.current_tool_call()
            assert current is not None
            began = time.monotonic()
            if current.id in after:
                assert returned[after[current.id]].wait(10)
            threading.Event().wait(max(0.0, takes[current.id] - (time.monotonic() - began)))
            returned[current.id].set()
            return current.id

        model = al.ScriptedModel(
            [
                al.scripted_response(
                    "r1", [al.ToolCall(name, "work", {}) for name in "abc"], "toolCall"
                ),
                al.scripted_response("r2", [al.TextBlock("Done.")], "stop"),
            ]
        )
        run_ = al.run_agent_loop(
            messages=[al.UserMessage("u", "Work.")],
            model=model,
            tools=al.ToolRegistry([al.Tool("work", "Works.", {"type": "object"}, work)]),
            max_steps=2,
            tool_concurrency=3,
        )
        log = io.StringIO()
        alr.dump_events(run_, log, times=True)
        timed = alr.load_timed_events(io.StringIO(log.getvalue()))
        a, b, c = (t.duration or 0.0 for t in view.summarize_times(timed).steps[0].tools)
        assert (a >= 0.4, b >= 0.2, c >= 0.1) == (True, True, True)
        assert a > b > c
        calls = page_data(view.render_page(timed))["steps"][0]["calls"]
        ends = [call["end"] for call in calls]
        assert ends == sorted(ends, reverse=True)  # a ends last, c first
        assert [call["lane"] for call in calls] == [0, 1, 2]
        summary = view.format_times(view.summarize_times(timed))
        for call in calls:
            assert f"work [{call['id']}]: {call['duration']}" in summary

    def test_an_empty_log_reads_as_no_events(self, tmp_path: Path) -> None:
        path = tmp_path / "empty.jsonl"
        path.write_text("", encoding="ascii")
        assert view.read_run(str(path)) == ([], None)

    def test_a_journal_is_read_with_agent_loop_durable_only(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        journal = tmp_path / "run.jsonl"
        journal.write_text('{"record":"run"}\n', encoding="ascii")
        monkeypatch.setitem(sys.modules, "agent_loop_durable", None)
        with pytest.raises(ImportError, match=r"needs agent_loop_durable\.py beside"):
            view.read_run(str(journal))

    def test_an_item_that_is_no_timed_event_is_a_type_error(self) -> None:
        with pytest.raises(TypeError, match="at position 0"):
            view.render_page([chunk(0, R)])  # type: ignore[list-item]


# --- In a real browser --------------------------------------------------------------

CHROMIUM = shutil.which("chromium")
BROWSER_REQUIRED = os.environ.get("AGENT_LOOP_REQUIRE_BROWSER") == "1"
BROWSER_BOUND = 120.0
"""Seconds a headless chromium may take to load, run and dump one local page."""


class _Elements(html.parser.HTMLParser):
    """The elements of a document: each one's tag, classes and text (its descendants' too)."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: List[Tuple[str, Dict[str, Optional[str]], List[str]]] = []
        self.open: List[List[str]] = []

    def handle_starttag(self, tag: str, attrs: List[Tuple[str, Optional[str]]]) -> None:
        text: List[str] = []
        self.elements.append((tag, dict(attrs), text))
        if tag not in ("meta", "br", "link", "i"):  # void elements have no end tag
            self.open.append(text)

    def handle_endtag(self, tag: str) -> None:
        if self.open:
            self.open.pop()

    def handle_data(self, data: str) -> None:
        for text in self.open:
            text.append(data)

    def having(self, tag: str, classes: str) -> List[str]:
        """The text of each element of this tag that has all these classes."""
        wanted = set(classes.split())
        return [
            "".join(text)
            for name, attrs, text in self.elements
            if name == tag and wanted <= set((attrs.get("class") or "").split())
        ]


@pytest.fixture
def chromium(tmp_path: Path) -> Any:
    """Runs headless chromium on a page with a new, empty profile; returns its stdout."""
    if CHROMIUM is None:
        if BROWSER_REQUIRED:
            pytest.fail("AGENT_LOOP_REQUIRE_BROWSER=1 but chromium is not on PATH")
        pytest.skip("chromium is not installed (tox -e browser installs it)")

    def run(page: Path, *options: str, fragment: str = "") -> str:
        completed = subprocess.run(
            [
                str(CHROMIUM),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                # Without these, chromium connects out at start; this network refuses it.
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                f"--user-data-dir={tmp_path / 'profile'}",
                *options,
                page.as_uri() + fragment,
            ],
            capture_output=True,
            text=True,
            timeout=BROWSER_BOUND,
            check=True,
        )
        return completed.stdout

    return run


@pytest.mark.browser
class TestInABrowser:
    """What the page shows once its script ran, in headless chromium."""

    def test_the_lanes_the_refusal_the_error_and_the_result(
        self, chromium: Any, tmp_path: Path
    ) -> None:
        page = tmp_path / "run.html"
        page.write_text(view.render_page(sample_run(), title="A run"), encoding="utf-8")
        dom = _Elements()
        dom.feed(chromium(page, "--dump-dom"))
        assert dom.having("h1", "") == ["A run"]
        assert dom.having("span", "status completed") == ["completed"]
        assert dom.having("div", "row step") == [
            "request-001first chunk after 610 ms, streamed 230 ms",
            "request-002first chunk after 370 ms, streamed 20 ms",
            "request-003first chunk after 540 ms, streamed 210 ms",
        ]
        assert [label for label in dom.having("div", "label") if "[call-" in label] == [
            "weather [call-1]",
            "weather [call-2]",
            "add [call-3]",
            "send_report [call-4]",
        ]
        assert dom.having("a", "note call ok") == ["weather 270 ms", "add 10 ms"]
        assert dom.having("a", "note call error") == ["weather error 490 ms"]
        assert dom.having("a", "note call refused") == ["send_report refused 20 ms"]
        assert len(dom.having("a", "bar call")) == 4
        assert dom.having("span", "tag refused") == ["refused"]
        assert dom.having("pre", "result") == [
            "sunny, 19 C",
            "no weather station in Atlantis",
            "42",
            REFUSAL,
        ]
        # Text of the log is shown as text: the hostile argument is one pre's text, and the
        # page holds its own two scripts only.
        assert json.loads(dom.having("pre", "arguments")[3])["text"] == HOSTILE
        assert [name for name, _, _ in dom.elements].count("script") == 2
        assert "input 1780, output 171" in dom.having("span", "fact")[-1]

    def test_a_failed_run_without_times_is_drawn_by_events(
        self, chromium: Any, tmp_path: Path
    ) -> None:
        events = sample_events()[:9]  # cut after the first step's results
        result = al.RunResult(
            "failed", (), 1, error=al.RunError("MODEL_STREAM_ERROR", "the stream broke")
        )
        events.append(al.Event(9, "run.finished", {"result": result}))
        page = tmp_path / "failed.html"
        page.write_text(view.render_page((event, None) for event in events), encoding="utf-8")
        dom = _Elements()
        dom.feed(chromium(page, "--dump-dom"))
        assert dom.having("span", "status failed") == ["failed"]
        assert dom.having("p", "run-error") == ["MODEL_STREAM_ERROR: the stream broke"]
        assert dom.having("p", "axis") == ["no times in the log: one unit per event, 0 to 9"]
        assert dom.having("a", "note call error") == ["weather error"]

    def test_a_durable_run_shows_its_progress_and_its_journal(
        self, chromium: Any, tmp_path: Path
    ) -> None:
        import agent_loop_durable as ald

        timed, journal = view.read_run(str(go_on_durably(tmp_path / "run.jsonl", ald.LATER)))
        page = tmp_path / "durable.html"
        page.write_text(view.render_page(timed, journal=journal), encoding="utf-8")
        dom = _Elements()
        dom.feed(chromium(page, "--dump-dom"))
        assert len(dom.having("span", "progress")) == 1  # call a's mark on its lane
        assert dom.having("pre", "progress") == ['{"done": 0.5}']
        assert dom.having("p", "run-awaiting") == ["awaiting a decision: work [b]"]
        assert dom.having("p", "awaiting") == ["awaiting a decisionwork [b]"]
        assert dom.having("p", "answers") == ["answersa: run it"]
        assert dom.having("p", "resumes") == ["resumesnone"]

    def test_a_link_to_a_call_opens_it(self, chromium: Any, tmp_path: Path) -> None:
        page = tmp_path / "run.html"
        page.write_text(view.render_page(sample_run()), encoding="utf-8")
        dom = _Elements()
        dom.feed(chromium(page, "--dump-dom", fragment="#call-1-1"))
        opened = [attrs["id"] for tag, attrs, _ in dom.elements if "open" in attrs]
        assert opened == ["call-1-1"]

    def test_a_screenshot_of_the_page(self, chromium: Any, tmp_path: Path) -> None:
        page = tmp_path / "run.html"
        page.write_text(view.render_page(sample_run(), title="A run of agent_loop"), "utf-8")
        picture = tmp_path / "run.png"
        # Linked to the refused call, which opens with its arguments and result.
        chromium(page, f"--screenshot={picture}", "--window-size=1000,1300", fragment="#call-1-1")
        assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        print(f"the page's screenshot: {picture}")  # kept with the test's tmp_path
        kept = os.environ.get("AGENT_LOOP_RUN_PICTURE")
        if kept:
            shutil.copyfile(picture, kept)
