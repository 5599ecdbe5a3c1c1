"""Tests for agent_loop_output.py: typed answers on an ends_run tool (output_tool) and the
runs that ask for one (run_for_output), in tool mode and in native mode.

Every run goes through one driver, ``answer()``: al.ScriptedModel plays the model, and each
run of the stream (from its sequence 0 to its run.finished) is checked with the core's
invariants (check_run). The cases are rows of tables: the answers and how they end
(ANSWERS), the options refused at call time (REFUSED), the request bodies of native mode
(NATIVE_BODIES). The llmock test is marked ``llmock`` (``tox -e llmock``); the real model's
is in test_agent_loop_realmodel.py.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, TypedDict

import pytest

import agent_loop as al
import agent_loop_output as output
from loop_invariants import check_run
from loop_testing import add_tool, echo_tool, user
from loop_testing_providers import answer_parts, canned_anthropic, canned_openai, exchanges
from test_agent_loop_providers_connection import LLMock, llmock_process  # noqa: F401


@dataclass
class Place:
    name: str
    population: int


@dataclass
class Trip:
    """A trip: where to, and the places on the way."""

    city: str
    places: List[Place]
    note: Optional[str] = None
    tags: List[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.city == "Atlantis":
            raise ValueError("Atlantis is not a city")


class Weather(TypedDict):
    city: str
    celsius: float


VERDICT = {
    "type": "object",
    "properties": {"verdict": {"type": "string", "enum": ["yes", "no"]}},
    "required": ["verdict"],
    "additionalProperties": False,
}
TRIP = {"city": "Lyon", "places": [{"name": "Vienne", "population": 30000}], "note": None}
TRIP_VALUE = Trip("Lyon", [Place("Vienne", 30000)])
ASK_FOR_THE_TOOL = "Answer by calling the final_answer tool: its arguments are your answer."


def called(arguments: Any, id: str = "1") -> al.ScriptedResponse:
    """A response that calls the output tool with these arguments."""
    call = al.ToolCall(f"call-{id}", "final_answer", arguments)
    return al.scripted_response(f"response-call-{id}", [call], "toolCall")


def said(text: str, id: str = "1") -> al.ScriptedResponse:
    """A response that answers in text."""
    return al.scripted_response(f"response-text-{id}", [al.TextBlock(text)], "stop")


def answer(
    script: List[al.ScriptedResponse], spec: Any = Trip, **options: Any
) -> Tuple[List[List[al.Event]], al.RunResult, al.ScriptedModel]:
    """The driver: run_for_output() over a scripted model; each of the stream's runs is
    checked as a run. Returns the runs' events, the result and the model."""
    model = al.ScriptedModel(script)
    options.setdefault("max_steps", 8)
    tools = al.ToolRegistry(options.pop("tools", ()))
    stream = output.run_for_output(
        messages=[user("Plan a trip.")], model=model, tools=tools, output=spec, **options
    )
    events, result = al.settle_run(stream)
    runs: List[List[al.Event]] = []
    for event in events:
        if event.sequence == 0:
            runs.append([])
        runs[-1].append(event)
    for run in runs:
        check_run(run, run[-1].payload["result"])
    return runs, result, model


# Scripts, options, and how run_for_output ends: status, output, runs, steps.
ANSWERS = [
    pytest.param([called(TRIP)], {}, "completed", TRIP_VALUE, 1, 1, id="a-dataclass"),
    pytest.param([called({"city": "Oslo", "celsius": 3.5})], {"spec": Weather}, "completed",
                 {"city": "Oslo", "celsius": 3.5}, 1, 1, id="a-typed-dict"),
    pytest.param([called({"verdict": "no"})], {"spec": VERDICT}, "completed", {"verdict": "no"},
                 1, 1, id="a-json-schema"),
    # An invalid answer is an error result the model reads; it tries again in the same run.
    pytest.param([called({"city": "Lyon"}), called(TRIP, "2")], {}, "completed", TRIP_VALUE,
                 1, 2, id="invalid-then-valid"),
    pytest.param([called(dict(TRIP, city="Atlantis")), called(TRIP, "2")], {}, "completed",
                 TRIP_VALUE, 1, 2, id="refused-by-post-init-then-valid"),
    # A text answer is asked again, in a run of its own, up to `retries` times.
    pytest.param([said("Lyon."), called(TRIP)], {}, "completed", TRIP_VALUE, 2, 2,
                 id="text-then-the-tool"),
    pytest.param([said("Lyon."), said("Lyon!", "2"), called(TRIP)], {}, "completed",
                 TRIP_VALUE, 3, 3, id="text-retries-times-at-limit"),
    pytest.param([said("Lyon."), said("Lyon!", "2"), said("Lyon?", "3")], {}, "failed", None,
                 3, 3, id="text-retries-times-over-limit"),
    pytest.param([said("Lyon.")], {"retries": 0}, "failed", None, 1, 1, id="no-retries"),
    # max_steps is the budget over every run: a text answer with none left ends maxSteps.
    pytest.param([called({}), said("Lyon."), called(TRIP, "2")], {"max_steps": 3},
                 "completed", TRIP_VALUE, 2, 3, id="budget-over-the-runs-at-limit"),
    pytest.param([called({}), said("Lyon."), called(TRIP, "2")], {"max_steps": 2},
                 "maxSteps", None, 1, 2, id="budget-over-the-runs-over-limit"),
    pytest.param([called({}), called({}, "2")], {"max_steps": 2}, "maxSteps", None, 1, 2,
                 id="budget-spent-in-one-run"),
    # Any other ending ends it all: the scripted model has no response left, and fails.
    pytest.param([said("Lyon.")], {}, "failed", None, 2, 2, id="a-run-that-fails"),
    # Native mode: the final text is the answer, checked by the same schema.
    pytest.param([said(json.dumps(TRIP))], {"native": True}, "completed", TRIP_VALUE, 1, 1,
                 id="native-a-dataclass"),
    pytest.param([said('{"verdict": "yes"}')], {"spec": VERDICT, "native": "json_object"},
                 "completed", {"verdict": "yes"}, 1, 1, id="native-a-json-schema"),
    pytest.param([said("yes"), said('{"verdict": "maybe"}', "2"), said("[1]", "3"),
                  said('{"verdict": "yes"}', "4")], {"spec": VERDICT, "native": True,
                  "retries": 3}, "completed", {"verdict": "yes"}, 4, 4,
                 id="native-not-json-invalid-not-an-object-then-valid"),
    pytest.param([said(json.dumps(dict(TRIP, city="Atlantis"))), said("{}", "2")],
                 {"native": True, "retries": 1}, "failed", None, 2, 2,
                 id="native-invalid-over-limit"),
]  # fmt: skip


class TestRunForOutput:
    """run_for_output(): every completed result has the typed answer; a text answer is
    asked again up to `retries` times, within the budget of max_steps over the runs."""

    @pytest.mark.parametrize(("script", "options", "status", "value", "runs", "steps"), ANSWERS)
    def test_each_answer_and_how_the_run_ends(
        self,
        script: List[al.ScriptedResponse],
        options: Dict[str, Any],
        status: str,
        value: Any,
        runs: int,
        steps: int,
    ) -> None:
        ran, result, model = answer(script, **options)
        assert (result.status, len(ran), result.steps) == (status, runs, steps), result.error
        assert result.output == value
        assert type(result.output) is type(value)
        assert result.messages == ran[-1][-1].payload["result"].messages
        # Request ids go on from run to run: one numbering over the whole stream.
        ids = [request.id for request in model.requests]
        assert ids == [al.request_id(number) for number in range(1, len(ids) + 1)]
        for before, after in zip(ran, ran[1:]):
            previous = before[-1].payload["result"]
            asked = after[-1].payload["result"].messages[len(previous.messages)]
            assert isinstance(asked, al.UserMessage)
            assert asked.content.startswith(
                ASK_FOR_THE_TOOL if "native" not in options else "Answer again with one JSON"
            )
        if status == "failed" and result.error is not None and runs == len(script):
            assert result.error.code == "MODEL_PROTOCOL_ERROR"
            assert result.error.message.startswith(f"no valid answer after {runs} runs")
        if status == "maxSteps":
            assert result.max_steps == options["max_steps"]

    @pytest.mark.parametrize(
        ("text", "says"),
        [
            ("yes", "the answer is not JSON (Expecting value: line 1 column 1 (char 0))"),
            ('{"verdict": "maybe"}', "$.verdict must be one of"),
            ("[1]", "arguments must be a JSON object, got list"),
        ],
    )
    def test_native_mode_says_what_is_wrong_with_the_text(self, text: str, says: str) -> None:
        _, result, _ = answer([said(text)], VERDICT, native=True, retries=0)
        assert result.error is not None
        assert says in result.error.message
        assert "invalid arguments for tool" not in result.error.message

    def test_the_output_tool_joins_a_copy_of_the_tools(self) -> None:
        """The model is offered the caller's tools and the output tool, last; the caller's
        registry is unchanged; in native mode it is offered the caller's tools only."""
        tools = [add_tool()]
        _, _, model = answer([called(TRIP)], tools=tools)
        assert [spec.name for spec in model.requests[0].tools] == ["add", "final_answer"]
        (offered,) = [spec for spec in model.requests[0].tools if spec.name == "final_answer"]
        assert offered.parameters["required"] == ("city", "places")
        _, _, model = answer([said(json.dumps(TRIP))], tools=tools, native=True)
        assert [spec.name for spec in model.requests[0].tools] == ["add"]

    def test_an_asking_message_takes_an_id_no_message_has(self) -> None:
        taken = al.UserMessage("user-output-001", "Plan a trip.")
        stream = output.run_for_output(
            messages=[taken],
            model=al.ScriptedModel([said("Lyon."), called(TRIP)]),
            tools=al.ToolRegistry(),
            output=Trip,
            max_steps=4,
        )
        _, result = al.settle_run(stream)
        assert [message.id for message in result.messages][:3] == [
            "user-output-001", "message-response-text-1", "user-output-001-again"
        ]  # fmt: skip

    def test_the_signal_and_the_other_options_reach_every_run(self) -> None:
        signal = threading.Event()
        seen: List[str] = []

        def consent(call: al.ToolCall, signal: Any) -> Optional[str]:
            seen.append(call.name)
            return None

        _, result, _ = answer(
            [said("Lyon."), called(TRIP)], signal=signal, before_tool_call=consent,
            request_sequence_start=2, max_steps=3,
        )  # fmt: skip
        assert (result.status, result.request_sequence_start, seen) == (
            "completed", 2, ["final_answer"]
        )  # fmt: skip
        assert result.next_request_sequence == 4
        signal.set()
        _, result, model = answer([said("Lyon.")], signal=signal)
        assert (result.status, model.call_count) == ("cancelled", 0)


# What run_for_output refuses when called, and the words of the error.
REFUSED = [
    pytest.param({"retries": -1}, ValueError, "retries must be an int >= 0",
                 id="retries-negative"),
    pytest.param({"retries": True}, TypeError, "retries must be an int, got bool",
                 id="retries-bool"),
    pytest.param({"native": "json"}, ValueError, "native must be False, True, 'json_schema' or",
                 id="native-unknown"),
    pytest.param({"native": 1}, ValueError, "got 1", id="native-int"),
    pytest.param({"native": None}, ValueError, "got None", id="native-none"),
    pytest.param({"output": int}, TypeError, "got int, whose values are not objects",
                 id="output-not-an-object"),
    pytest.param({"output": [Trip]}, TypeError, "spec must be a JSON Schema (a mapping), a "
                 "dataclass or a TypedDict, got list", id="output-not-a-type"),
    pytest.param({"output": {"type": "string"}}, ValueError, "", id="output-schema-not-object"),
    pytest.param({"tools": [add_tool()]}, TypeError, "tools must be a ToolRegistry, got list",
                 id="tools-not-a-registry"),
    pytest.param({"tools": al.ToolRegistry([al.Tool("final_answer", "", VERDICT, print)])},
                 ValueError, "tools has a tool named 'final_answer', the output tool's name",
                 id="name-clash"),
    pytest.param({"tools": al.ToolRegistry([al.Tool("handoff", "", VERDICT, print,
                                                    ends_run=True)])},
                 ValueError, "tools may not hold a tool that ends the run (handoff)",
                 id="an-ends-run-tool"),
    pytest.param({"max_steps": 65}, ValueError, "max_steps must be an int in 1..64",
                 id="max-steps-over-limit"),
    pytest.param({"request_sequence_start": 60}, ValueError, "request_sequence_start + max_steps",
                 id="start-over-limit"),
    pytest.param({"verbose": True}, TypeError, "verbose", id="unknown-option"),
    pytest.param({"native": True, "model": canned_anthropic()}, TypeError,
                 "native needs an OpenAI-compatible server", id="native-anthropic"),
]  # fmt: skip


class TestOptions:
    @pytest.mark.parametrize(("options", "error", "words"), REFUSED)
    def test_a_bad_option_raises_at_call_time(
        self, options: Dict[str, Any], error: type, words: str
    ) -> None:
        model = al.ScriptedModel([called(TRIP)])
        arguments: Dict[str, Any] = {
            "messages": [user()], "model": model, "tools": al.ToolRegistry([echo_tool()]),
            "output": Trip, "max_steps": 8,
        }  # fmt: skip
        arguments.update(options)
        with pytest.raises(error) as raised:
            output.run_for_output(**arguments)
        assert words in str(raised.value)
        assert model.call_count == 0

    def test_output_tool_names_and_describes_its_tool(self) -> None:
        tool = output.output_tool(Trip)
        assert (tool.name, tool.ends_run) == ("final_answer", True)
        assert tool.description.startswith("Gives your final answer")
        named = output.output_tool(VERDICT, name="verdict", description="Says yes or no.")
        assert (named.name, named.description) == ("verdict", "Says yes or no.")
        assert named.spec().to_dict()["parameters"] == VERDICT


# Native mode through OpenAIChatModel: the response_format each kind sends, with the
# model's options a mapping or a function of the request.
NATIVE_BODIES = [
    pytest.param(True, {"temperature": 0}, {"type": "json_schema", "json_schema": {
        "name": "final_answer", "schema": VERDICT, "strict": True}}, id="json-schema"),
    pytest.param("json_schema", lambda request: None, {"type": "json_schema", "json_schema": {
        "name": "final_answer", "schema": VERDICT, "strict": True}}, id="json-schema-function"),
    pytest.param("json_object", lambda request: {"temperature": 0},
                 {"type": "json_object", "schema": VERDICT}, id="json-object-function"),
]  # fmt: skip


class TestNativeOpenAI:
    @pytest.mark.parametrize(("native", "options", "sent"), NATIVE_BODIES)
    def test_the_request_asks_for_json_by_the_schema(
        self, native: Any, options: Any, sent: Dict[str, Any]
    ) -> None:
        """A copy of the model sends response_format (the caller's options kept beside it);
        the caller's model is unchanged."""
        model = canned_openai(answer_parts("openai", ['{"verdict": ', '"yes"}']), options=options)
        stream = output.run_for_output(
            messages=[user()], model=model, tools=al.ToolRegistry(), output=VERDICT,
            max_steps=2, native=native,
        )  # fmt: skip
        _, result = al.settle_run(stream)
        assert (result.status, result.output) == ("completed", {"verdict": "yes"})
        (exchange,) = exchanges(model)
        assert exchange.body["response_format"] == sent
        assert "tools" not in exchange.body
        assert exchange.body.get("temperature", 0) == 0
        assert model.options is options or model.options == options


@pytest.mark.llmock
class TestLLMock:
    @pytest.mark.parametrize("native", [True, "json_object"])
    def test_native_mode_against_llmock(self, llmock_process: LLMock, native: Any) -> None:  # noqa: F811
        """llmock answers text first (its scenario), then an example of the schema it was
        sent: the text is asked again, and the example is the answer."""
        llmock_process.admin("POST", "/_llmock/reset", {})
        llmock_process.scenario({"type": "reply", "text": "Not JSON."})
        stream = output.run_for_output(
            messages=[user("Plan a trip.")], model=llmock_process.openai(),
            tools=al.ToolRegistry(), output=Trip, max_steps=4, native=native,
        )  # fmt: skip
        _, result = al.settle_run(stream)
        trip: Any = result.output  # RunResult.output is typed JSON: an instance is not
        assert (result.status, result.steps, type(trip)) == ("completed", 2, Trip), result.error
        bodies = [record["body"] for record in llmock_process.requests()]
        assert [body["response_format"]["type"] for body in bodies] == [
            "json_schema" if native is True else "json_object"
        ] * 2
