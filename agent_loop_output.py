# agent_loop_output.py 1.0.0: typed answers on ends_run tools, for agent_loop.py.
# One file, standard library only; copy it next to agent_loop.py, agent_loop_functions.py and
# agent_loop_providers.py. Home: the agent_loop repository.
"""A run whose answer is a typed value: ``output_tool()`` and ``run_for_output()``.

``output_tool(spec)`` is a ``Tool(..., ends_run=True)`` whose parameters are the answer's
JSON Schema: ``spec`` is that schema (an object at the root), a dataclass or a TypedDict
(its schema made by ``agent_loop_functions.hint_schema``, as ``Tool.from_function`` makes
a parameter's). The loop checks a call's arguments against the schema before the tool
runs, so an invalid answer is an error result that the model reads, and it tries again
within the run's steps. A valid call returns the answer as JSON (a dict), and ends the run
``completed`` with ``RunResult.output`` that dict.

``run_for_output(..., output=spec)`` is a run whose ``completed`` result always has
``output``: an instance of ``spec`` when it is a dataclass (built by
``agent_loop_functions.hint_value``, nested dataclasses too), the dict otherwise.

Rules:

- The output tool joins a copy of ``tools``; a tool of the same name, or any tool that
  ends the run, is a ValueError at call time, as a bad option of ``run_agent_loop()`` is.
- A run that completes with no output (the model answered in text) is followed by
  another from the transcript it ended with plus one user message,
  ``Answer by calling the final_answer tool: its arguments are your answer.`` (the output
  tool's name), up to ``retries`` times; then the result is ``failed`` with the code
  ``MODEL_PROTOCOL_ERROR`` (the model did not keep to the protocol it was given).
- ``max_steps`` is the budget of requests over all the runs: each later run has what is
  left, and its request ids go on from the last (``request_sequence_start``), so that
  they are unique over the whole stream. A text answer with no request left ends
  ``maxSteps``.
- The events are each run's own, as it numbered them: a run begins at sequence 0 with a
  ``message.accepted`` for every message it starts from, and ends with its
  ``run.finished``. The generator returns the result over all the runs: ``steps`` and
  ``usage`` summed, ``messages`` the last run's, ``output`` the typed answer.
- ``native=True`` (or ``"json_schema"``) asks the server for JSON by the schema instead of
  adding the tool, with OpenAI's ``response_format`` ``{"type": "json_schema",
  "json_schema": {"name": ..., "schema": ..., "strict": true}}``; ``native="json_object"``
  sends llama-cpp-python's ``{"type": "json_object", "schema": ...}`` (its server has no
  ``json_schema``). An ``OpenAIChatModel`` is asked through a copy of it whose
  ``options`` add ``response_format``; an ``AnthropicMessagesModel`` is a TypeError; any
  other model is used as it is, and must answer JSON by itself. The final text is parsed
  as JSON and checked by the output tool, through ``execute_tool_call()``; what is wrong
  is said in one user message, ``Answer again with one JSON object that follows the
  schema, and nothing else: <what is wrong>.``, within the same ``retries``.

This file uses only the public names of ``agent_loop``, ``agent_loop_functions`` and
``agent_loop_providers``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import threading
from typing import Any, Callable, Dict, Final, Generator, List, Mapping, Optional, Tuple, Union

import agent_loop as al
import agent_loop_functions as functions
import agent_loop_providers as providers

__version__ = "1.0.0"

__all__ = ["output_tool", "run_for_output"]

_DESCRIPTION: Final = (
    "Gives your final answer: its arguments are the answer. Call it once, when you have it."
)
"""The output tool's description unless one is given."""
_ASK_FOR_THE_TOOL: Final = "Answer by calling the {name} tool: its arguments are your answer."
"""The user message after a text answer, in tool mode."""
_ASK_FOR_JSON: Final = (
    "Answer again with one JSON object that follows the schema, and nothing else: {problem}."
)
"""The user message after a final text that is not a valid answer, in native mode."""
_NATIVE: Final = {True: "json_schema", "json_schema": "json_schema", "json_object": "json_object"}
"""What ``native`` may be (besides False), and the ``response_format`` type each asks for."""


def output_tool(
    spec: Any, *, name: str = "final_answer", description: Optional[str] = None
) -> al.Tool:
    """Returns an ``ends_run`` tool whose arguments are the typed answer.

    ``spec`` is a JSON Schema (a mapping, an object at the root), a dataclass or a
    TypedDict. The tool returns its arguments, the answer as JSON (a dict); for a class
    it first builds the value (each dataclass in it), so that what a constructor raises
    (a ``__post_init__`` check, say) is an error result the model reads. Raises TypeError
    for a spec it cannot make a schema of, and what ``Tool`` raises for a bad name,
    description or schema.
    """
    schema, builds = _schema_of(spec, "output_tool")

    def execute(arguments: Dict[str, Any], signal: al.Signal) -> object:
        if builds:
            try:
                functions.hint_value(spec, arguments)
            except (TypeError, ValueError) as error:
                raise al.ToolError(
                    f"the answer is not a valid {spec.__qualname__}: {error}"
                ) from None
        return arguments

    described = _DESCRIPTION if description is None else description
    return al.Tool(name, described, schema, execute, ends_run=True)


def run_for_output(
    *,
    messages: Any,
    model: al.Model,
    tools: al.ToolRegistry,
    output: Any,
    max_steps: int,
    retries: int = 2,
    native: Union[bool, str] = False,
    **run_options: Any,
) -> Generator[al.Event, None, al.RunResult]:
    """Validates the options and returns the generator of a run whose ``completed`` result
    has ``output``: the answer as an instance of ``output`` when it is a dataclass, else
    the dict (the module's docstring has the rules).

    ``run_options`` are ``run_agent_loop()``'s others (``signal``, ``tool_concurrency``,
    ``before_tool_call``, ``request_sequence_start``). Raises TypeError or ValueError,
    now, for a bad option: ``retries`` an int >= 0, ``native`` False, True,
    ``"json_schema"`` or ``"json_object"``, no tool of the output tool's name nor any
    ``ends_run`` tool in ``tools``, and whatever ``run_agent_loop()`` raises.
    """
    if type(retries) is not int:
        raise TypeError(f"retries must be an int, got {type(retries).__name__}")
    if retries < 0:
        raise ValueError(f"retries must be an int >= 0 (0: ask once), got {retries}")
    if native is not False and (type(native) not in (bool, str) or native not in _NATIVE):
        raise ValueError(
            f"native must be False, True, 'json_schema' or 'json_object', got {native!r}"
        )
    answer = output_tool(output)
    if not isinstance(tools, al.ToolRegistry):
        raise TypeError(f"tools must be a ToolRegistry, got {type(tools).__name__}")
    ending = [tool.name for tool in tools if tool.ends_run]
    if ending:
        raise ValueError(
            f"tools may not hold a tool that ends the run ({', '.join(ending)}): the run "
            "ends on its answer"
        )
    if native is False:
        if answer.name in tools:
            raise ValueError(
                f"tools has a tool named {answer.name!r}, the output tool's name: rename yours"
            )
        check = _answer_in_output
        tools = al.ToolRegistry([*tools, answer])
    else:
        model = _asking(model, _NATIVE[native], answer)
        check = _answer_in_text
    run = al.run_agent_loop(
        messages=messages, model=model, tools=tools, max_steps=max_steps, **run_options
    )
    run_options.pop("request_sequence_start", None)  # each later run goes on from the last
    answering = _Answering(model, tools, max_steps, retries, output, answer, check, run_options)
    return answering.drive(run)


@dataclasses.dataclass
class _Answering:
    """The runs of one run_for_output() call, and what makes them one."""

    model: al.Model
    tools: al.ToolRegistry
    max_steps: int
    retries: int
    output: Any
    answer: al.Tool
    check: Callable[[al.RunResult, al.Tool], Tuple[Optional[str], Any]]
    options: Dict[str, Any]

    def drive(
        self, run: Generator[al.Event, None, al.RunResult]
    ) -> Generator[al.Event, None, al.RunResult]:
        """Each run's events, then another run while the answer is missing and asks remain."""
        results: List[al.RunResult] = []
        while True:
            result = yield from run
            results.append(result)
            if result.status != "completed":  # cancelled, failed or maxSteps: as it ended
                return self._over(results, result)
            problem, value = self.check(result, self.answer)
            if problem is None:
                if isinstance(self.output, type):
                    value = functions.hint_value(self.output, value)
                return self._over(results, dataclasses.replace(result, output=value))
            spent = sum(each.steps for each in results)
            if len(results) > self.retries:
                message = (
                    f"no valid answer after {len(results)} runs (retries={self.retries}); "
                    f"the last: {problem}"
                )
                error = al.RunError("MODEL_PROTOCOL_ERROR", message)
                failed = dataclasses.replace(result, status="failed", final_text=None, error=error)
                return self._over(results, failed)
            if spent == self.max_steps:
                ended = dataclasses.replace(result, status="maxSteps", final_text=None)
                return self._over(results, ended)
            ask = al.UserMessage(_free_id(result.messages, len(results)), problem)
            run = al.run_agent_loop(
                messages=(*result.messages, ask),
                model=self.model,
                tools=self.tools,
                max_steps=self.max_steps - spent,
                request_sequence_start=result.next_request_sequence,
                **self.options,
            )

    def _over(self, results: List[al.RunResult], last: al.RunResult) -> al.RunResult:
        """The result over all the runs: the last one's, its steps and usage summed."""
        usage: Optional[al.Usage] = None
        for result in results:
            if result.usage is not None:
                usage = result.usage if usage is None else usage + result.usage
        return dataclasses.replace(
            last,
            steps=sum(result.steps for result in results),
            request_sequence_start=results[0].request_sequence_start,
            usage=usage,
            max_steps=self.max_steps if last.status == "maxSteps" else None,
        )


def _answer_in_output(result: al.RunResult, answer: al.Tool) -> Tuple[Optional[str], Any]:
    """Tool mode: the output tool's answer, or what to ask when the model answered in text."""
    if result.output is None:
        return _ASK_FOR_THE_TOOL.format(name=answer.name), None
    return None, result.output


def _answer_in_text(result: al.RunResult, answer: al.Tool) -> Tuple[Optional[str], Any]:
    """Native mode: the final text as the answer, checked by the output tool, or what to ask."""
    try:
        value = json.loads(result.final_text or "")
    except ValueError as error:
        return _ASK_FOR_JSON.format(problem=f"the answer is not JSON ({error})"), None
    call = al.ToolCall("answer", answer.name, value)
    checked = al.execute_tool_call(al.ToolRegistry([answer]), call, threading.Event())
    if checked.is_error:
        prefix = f"invalid arguments for tool {answer.name!r}: "  # the loop's words, for a tool
        problem = (
            checked.content[len(prefix) :]
            if checked.content.startswith(prefix)
            else (checked.content)
        )
        return _ASK_FOR_JSON.format(problem=problem), None
    return None, json.loads(checked.content)


def _asking(model: al.Model, kind: str, answer: al.Tool) -> al.Model:
    """Native mode: the model that asks the server for JSON by the answer's schema."""
    if isinstance(model, providers.AnthropicMessagesModel):
        raise TypeError(
            "native needs an OpenAI-compatible server: Anthropic's Messages API takes no "
            "response_format; use the output tool (native=False)"
        )
    if not isinstance(model, providers.OpenAIChatModel):
        return model  # it must answer JSON by itself
    schema = answer.spec().to_dict()["parameters"]  # a plain copy
    if kind == "json_schema":
        ask: Dict[str, Any] = {
            "type": "json_schema",
            "json_schema": {"name": answer.name, "schema": schema, "strict": True},
        }
    else:
        ask = {"type": "json_object", "schema": schema}
    asking = copy.copy(model)  # shares its max_concurrency slots; the caller's is untouched
    chosen = model.options
    if callable(chosen):
        asking.options = lambda request: {**(chosen(request) or {}), "response_format": ask}
    else:
        asking.options = {**chosen, "response_format": ask}
    return asking


def _schema_of(spec: Any, where: str) -> Tuple[Mapping[str, Any], bool]:
    """The answer's schema, and whether its value is built (a type: its dataclasses)."""
    if isinstance(spec, Mapping):
        return spec, False
    if not isinstance(spec, type):
        raise TypeError(
            f"{where}: spec must be a JSON Schema (a mapping), a dataclass or a TypedDict, "
            f"got {type(spec).__name__}"
        )
    schema = functions.hint_schema(spec, f"{where}({spec.__qualname__})")
    if schema["type"] != "object":
        raise TypeError(
            f"{where}: spec must be a JSON Schema (a mapping), a dataclass or a TypedDict, "
            f"got {spec.__qualname__}, whose values are not objects"
        )
    return schema, True


def _free_id(messages: Tuple[al.Message, ...], attempt: int) -> str:
    """An id for the attempt's user message that no message of the transcript has."""
    taken = {message.id for message in messages}
    free = f"user-output-{attempt:03d}"
    while free in taken:
        free += "-again"
    return free
