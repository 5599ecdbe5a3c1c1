"""Tests for agent_loop_functions.py, the companion that makes Tool.from_function's tools:
the schema from the type hints, the description from the docstring, the name from the
function, and what it refuses. The core's own tests (test_agent_loop_tools_and_ir.py) check
that Tool.from_function needs this file. This file uses ``from __future__ import
annotations`` on purpose: Tool.from_function must read the string annotations that PEP 563
gives a user's module.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from typing import Any, Callable, Dict, List, Literal, Optional, TypedDict, Union

import pytest

import agent_loop as al
import agent_loop_functions

NUMBERS = {
    "type": "object",
    "properties": {"left": {"type": "number"}, "right": {"type": "number"}},
    "required": ["left", "right"],
    "additionalProperties": False,
}


def add(left: float, right: float) -> float:
    """Adds two numbers.

    Both may be integers."""
    return left + right


async def fetch(url: str) -> str:
    return url


def undocumented(text: str) -> str:
    return text


class Stations:
    def weather(self, city: str) -> str:
        """Reports the weather in a city."""
        raise al.ToolError(f"No station in {city}.")


class Executor:
    def __call__(self, arguments: Dict[str, Any], signal: al.Signal) -> object:
        return "callable object"


def search(
    query: str,
    limit: int = 10,
    exact: bool = False,
    tags: Optional[List[str]] = None,
    *,
    order: Literal["asc", "desc"] = "asc",
    signal: al.Signal,
) -> Dict[str, Any]:
    """Searches the notes."""
    return {"query": query, "limit": limit, "tags": tags, "order": order, "set": signal.is_set()}


@dataclasses.dataclass
class Place:
    name: str
    population: int = 0


@dataclasses.dataclass
class Trip:
    places: List[Place]
    note: Optional[str] = None  # a default of None admits null, as a parameter's does
    tags: List[str] = dataclasses.field(default_factory=list)
    seen: int = dataclasses.field(default=0, init=False)  # not the constructor's: not a field


class Stop(TypedDict):
    place: Place
    nights: int


class Wish(TypedDict, total=False):
    city: str


@dataclasses.dataclass
class Node:
    children: List[Node]


@dataclasses.dataclass
class Broken:
    where: Undefined  # type: ignore[name-defined]  # noqa: F821


PLACE = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["name"],
    "additionalProperties": False,
}


class Unreadable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("a message that cannot be read")


def from_source(source: str, future_annotations: bool = False) -> Callable[..., object]:
    """The function ``f`` of a module made of this source, compiled with or without
    PEP 563 (``from __future__ import annotations``), as a user's module would be."""
    header = "from __future__ import annotations\n" if future_annotations else ""
    namespace: Dict[str, Any] = {}
    source = header + "from typing import *\nimport agent_loop as al\n" + source
    exec(compile(source, "<user module>", "exec", dont_inherit=True), namespace)  # no PEP 563 here
    function: Callable[..., object] = namespace["f"]
    return function


def from_function(source: str, future_annotations: bool = False) -> Callable[[], object]:
    """Builds a Tool from the function ``f`` of this source (see from_source)."""
    return lambda: al.Tool.from_function(from_source(source, future_annotations))


SINCE_3_9 = pytest.mark.skipif(sys.version_info < (3, 9), reason="list[int] needs Python 3.9")
SINCE_3_10 = pytest.mark.skipif(sys.version_info < (3, 10), reason="X | Y needs Python 3.10")


STRING = {"type": "string"}
INTEGER_OR_NULL = {"type": ["integer", "null"]}
# Parameters, as source, and the schema each gets; both with and without PEP 563. A
# parameter with a default is not required; Optional[X], and any parameter whose default is
# None, admits null (the function then gets None).
HINT_SCHEMAS: dict[str, Any] = {
    "x: str": {"type": "string"},
    "x: int": {"type": "integer"},
    "x: float": {"type": "number"},
    "x: bool": {"type": "boolean"},
    "x: None": {"type": "null"},
    "x: list": {"type": "array"},
    "x: List": {"type": "array"},
    "x: List[int]": {"type": "array", "items": {"type": "integer"}},
    "x: List[List[str]]": {"type": "array", "items": {"type": "array", "items": STRING}},
    "x: dict": {"type": "object"},
    "x: Dict": {"type": "object"},
    "x: Dict[str, Any]": {"type": "object"},
    "x: Dict[str, int]": {"type": "object", "additionalProperties": {"type": "integer"}},
    'x: Literal["a", "b"]': {"type": "string", "enum": ["a", "b"]},
    "x: Literal[1, 2]": {"type": "integer", "enum": [1, 2]},
    'x: Literal[1, "a"]': {"enum": [1, "a"]},
    'x: Optional[Literal["a"]]': {"enum": ["a", None]},
    'x: Optional[Literal["a"]] = None': {"enum": ["a", None]},
    'x: Literal["a", None] = None': {"enum": ["a", None]},
    "x: List[Literal[True]]": {"type": "array", "items": {"type": "boolean", "enum": [True]}},
    "x: int = 3": {"type": "integer"},
    "x: Optional[int]": INTEGER_OR_NULL,
    "x: Optional[int] = None": INTEGER_OR_NULL,
    "x: Union[None, int] = None": INTEGER_OR_NULL,
    "x: int = None": INTEGER_OR_NULL,
    "x: None = None": {"type": "null"},
    "x: Optional[List[int]] = None": {"type": ["array", "null"], "items": {"type": "integer"}},
    "x: List[Optional[int]]": {"type": "array", "items": INTEGER_OR_NULL},
    "x: Optional[Dict[str, bool]] = None": {"type": ["object", "null"],
                                            "additionalProperties": {"type": "boolean"}},
    "x: Union[int, str]": {"anyOf": [{"type": "integer"}, STRING]},
    "x: Union[int, str, None]": {"anyOf": [{"type": "integer"}, STRING, {"type": "null"}]},
    "x: Union[int, str] = None": {"anyOf": [{"type": "integer"}, STRING, {"type": "null"}]},
    "x: Union[List[str], Literal['a']]": {"anyOf": [{"type": "array", "items": STRING},
        {"type": "string", "enum": ["a"]}]},
}  # fmt: skip
DEFAULT_OF = {"x: int = 3": 3, "x: Optional[int] = None": None, "x: Union[None, int] = None": None,
              "x: int | None = None": None, "x: int = None": None, "x: None = None": None,
              'x: Optional[Literal["a"]] = None': None, 'x: Literal["a", None] = None': None,
              "x: Optional[List[int]] = None": None, "x: Union[int, str] = None": None,
              "x: Optional[Dict[str, bool]] = None": None}  # fmt: skip
NEWER_HINT_SCHEMAS = [
    pytest.param("x: list[int]", {"type": "array", "items": {"type": "integer"}}, marks=SINCE_3_9),
    pytest.param("x: dict[str, Any]", {"type": "object"}, marks=SINCE_3_9),
    pytest.param("x: int | None = None", INTEGER_OR_NULL, marks=SINCE_3_10),
    pytest.param("x: str | int", {"anyOf": [STRING, {"type": "integer"}]}, marks=SINCE_3_10),
]


# Hints with no JSON Schema here, and what the error says.
UNEXPRESSIBLE_HINTS = [
    ("Dict[int, str]", "Dict[int, str] has keys that are not str, as no JSON object has"),
    ("Tuple[int, int]", "has no schema here; use str, int, float, bool, None, list, dict, "
                        "Literal, a dataclass, a TypedDict, or a Union or Optional of them"),
    ("Any", "has no schema here"),
    ("set", "has no schema here"),
    ("Optional[set]", "has no schema here"),
    ("al.Tool", "has no schema here"),
    ('Literal[b"x"]', "Literal value b'x' is a bytes, not a JSON scalar"),
]  # fmt: skip


# What Tool.from_function refuses, and the words of the error that tell the row from the
# others.
REFUSED: dict[str, tuple[Callable[[], object], type[Exception], str]] = {
    # A parameter it cannot pass by name, a hint it cannot resolve, anything but a plain
    # function or method.
    "no-hint": (from_function("def f(x): pass"), TypeError, "(f): parameter 'x' has no type hint"),
    "*args": (from_function("def f(ok: int, *x: int): pass"), TypeError,
              "parameter 'x' is variadic positional"),
    "**kwargs": (from_function("def f(ok: int, **x: int): pass"), TypeError,
                 "parameter 'x' is variadic keyword"),
    "positional-only": (from_function("def f(x: int, /): pass"), TypeError,
                        "parameter 'x' is positional-only"),
    "positional-only-signal": (from_function("def f(signal, /): pass"), TypeError,
                               "Tool.from_function(f): parameter 'signal' is positional-only"),
    "unresolvable-hint": (from_function("def f(x: Undefined): pass", future_annotations=True),
                          TypeError, "Tool.from_function: cannot resolve the type hints of f: "
                          "NameError: name 'Undefined' is not defined"),
    "builtin": (lambda: al.Tool.from_function(len), TypeError, "takes a function or a method, "),
    "class": (lambda: al.Tool.from_function(int), TypeError, "takes a function or a method, got "),
    "object": (lambda: al.Tool.from_function(Executor()), TypeError, "takes a function or a "),
    # Its result would be a coroutine that nobody awaits: an error result each time.
    "async": (lambda: al.Tool.from_function(fetch), TypeError,
              "fetch is an async function, and the loop calls tools synchronously; give it a "
              "plain def"),
    "lambda-without-a-name": (lambda: al.Tool.from_function(lambda: "ok"), TypeError,
                              "a lambda has no name of its own; give it name="),
    "empty-name": (lambda: al.Tool.from_function(add, name=""), TypeError,
                   "Tool name must be a non-empty str"),
}  # fmt: skip


class TestToolFromFunction:
    """Tool.from_function: the schema from the type hints, the description from the docstring;
    a hint with no JSON Schema is a TypeError naming the parameter."""

    def test_a_function_becomes_a_tool_named_and_described_by_it(self) -> None:
        tool = al.Tool.from_function(add)
        assert tool.description == "Adds two numbers.\n\nBoth may be integers."
        assert tool.spec().to_dict()["parameters"] == NUMBERS
        assert al.Tool.from_function(undocumented).description == ""
        plus = al.Tool.from_function(add, name="plus", description="Sums.")
        assert (plus.name, plus.description) == ("plus", "Sums.")
        assert al.Tool.from_function(lambda: "ok", name="ok").name == "ok"

    @pytest.mark.parametrize(
        ("function", "arguments", "content", "is_error"),
        [
            # float means JSON number (an int argument is accepted); the result is JSON.
            pytest.param(add, {"left": 20, "right": 22.5}, "42.5", False, id="function"),
            pytest.param(undocumented, {"text": "as is"}, "as is", False, id="str-verbatim"),
            pytest.param(Stations().weather, {"city": "Atlantis"}, "No station in Atlantis.", True,
                         id="bound-method-raising-a-tool-error"),
            # Small models send null for an optional argument they leave unset: a parameter
            # whose default is None gets it; any other is refused, and so is a wrong type.
            pytest.param(search, {"query": "q", "tags": None},
                         '{"query":"q","limit":10,"tags":null,"order":"asc","set":false}', False,
                         id="null-for-a-default-none"),
            pytest.param(search, {"query": "q", "tags": ["a"]},
                         '{"query":"q","limit":10,"tags":["a"],"order":"asc","set":false}', False,
                         id="a-value-for-a-default-none"),
            pytest.param(search, {"query": "q", "tags": "a"},
                         "invalid arguments for tool 'search': $.tags must be array or null, got "
                         "string", True, id="a-wrong-type-for-a-default-none"),
            pytest.param(search, {"query": "q", "tags": [None]},
                         "invalid arguments for tool 'search': $.tags[0] must be string, got "
                         "null", True, id="null-in-a-list-of-str"),
            pytest.param(search, {"query": "q", "limit": None},
                         "invalid arguments for tool 'search': $.limit must be integer, got null",
                         True, id="null-for-a-default-10"),
            pytest.param(search, {"query": None},
                         "invalid arguments for tool 'search': $.query must be string, got null",
                         True, id="null-for-a-required-str"),
        ],
    )  # fmt: skip
    def test_it_runs_and_its_return_value_is_the_result(
        self, function: Any, arguments: Any, content: str, is_error: bool
    ) -> None:
        tool = al.Tool.from_function(function)
        tool_result = al.execute_tool_call(
            al.ToolRegistry([tool]), al.ToolCall("call-1", tool.name, arguments), threading.Event()
        )
        assert (tool_result.content, tool_result.is_error) == (content, is_error)

    def test_defaults_keyword_only_and_signal(self) -> None:
        """signal gets the run's signal and is not in the schema; defaults are not required."""
        tool = al.Tool.from_function(search)
        parameters = tool.spec().to_dict()["parameters"]
        assert parameters["properties"] == {
            "query": {"type": "string"},
            "limit": {"type": "integer"},
            "exact": {"type": "boolean"},
            "tags": {"type": ["array", "null"], "items": {"type": "string"}},
            "order": {"type": "string", "enum": ["asc", "desc"]},
        }
        assert (parameters["required"], parameters["additionalProperties"]) == (["query"], False)
        returned = tool.execute({"query": "q", "order": "desc"}, threading.Event())
        assert returned == {"query": "q", "limit": 10, "tags": None, "order": "desc", "set": False}

    @pytest.mark.parametrize("future_annotations", [False, True], ids=["hints", "pep563"])
    @pytest.mark.parametrize(
        ("parameter", "schema"), [*HINT_SCHEMAS.items(), *NEWER_HINT_SCHEMAS], ids=lambda v: str(v)
    )
    def test_each_hint_and_its_schema(
        self, parameter: str, schema: Any, future_annotations: bool
    ) -> None:
        function = from_source(f"def f({parameter}): return x", future_annotations)
        tool = al.Tool.from_function(function)
        assert tool.spec().to_dict()["parameters"]["properties"] == {"x": schema}
        assert list(tool.parameters["required"]) == ([] if parameter in DEFAULT_OF else ["x"])
        if parameter in DEFAULT_OF:
            assert tool.execute({}, threading.Event()) == DEFAULT_OF[parameter]

    @pytest.mark.parametrize("future_annotations", [False, True], ids=["hints", "pep563"])
    @pytest.mark.parametrize(("hint", "says"), UNEXPRESSIBLE_HINTS)
    def test_an_unexpressible_hint_is_a_type_error_naming_the_parameter(
        self, hint: str, says: str, future_annotations: bool
    ) -> None:
        function = from_source(f"def f(ok: str, x: {hint}): pass", future_annotations)
        with pytest.raises(TypeError) as raised:
            al.Tool.from_function(function)
        assert str(raised.value).startswith("Tool.from_function(f): parameter 'x': ")
        assert says in str(raised.value)

    @pytest.mark.parametrize(("build", "error", "words"), REFUSED.values(), ids=list(REFUSED))
    def test_what_it_refuses(
        self, build: Callable[[], object], error: type[Exception], words: str
    ) -> None:
        with pytest.raises(error) as raised:
            build()
        assert words in str(raised.value)

    @pytest.mark.parametrize(
        ("raised", "named"),
        [(NameError("name 'x' is not defined"), "NameError: name 'x' is not defined"),
         (NameError(), "NameError"), (Unreadable(), "Unreadable")],
        ids=["message", "no-message", "unreadable-message"],
    )  # fmt: skip
    def test_a_hint_that_raises_is_named_with_its_exception(
        self, monkeypatch: pytest.MonkeyPatch, raised: Exception, named: str
    ) -> None:
        """Hints that cannot be resolved are a TypeError naming the exception, and its message
        when it has one that can be read, as the loop names a tool's exception."""

        def resolve(fn: object) -> Dict[str, Any]:
            raise raised

        monkeypatch.setattr(agent_loop_functions, "get_type_hints", resolve)
        with pytest.raises(TypeError) as refused:
            al.Tool.from_function(add)
        assert str(refused.value) == (
            f"Tool.from_function: cannot resolve the type hints of add: {named}"
        )

    def test_its_fields_are_the_tools(self) -> None:
        """tool_fields() is what Tool.from_function builds its Tool from."""
        name, description, parameters, execute = agent_loop_functions.tool_fields(add)
        assert (name, description, parameters) == (
            "add",
            al.Tool.from_function(add).description,
            NUMBERS,
        )
        assert execute({"left": 1, "right": 2}, threading.Event()) == 3


# A dataclass or a TypedDict is an object of its fields, nested; each hint, its schema, a
# value valid against it and what hint_value makes of it.
CLASS_HINTS = [
    pytest.param(Place, PLACE, {"name": "Oslo"}, Place("Oslo"), id="dataclass"),
    pytest.param(Trip, {"type": "object", "properties": {
        "places": {"type": "array", "items": PLACE}, "note": {"type": ["string", "null"]},
        "tags": {"type": "array", "items": STRING}}, "required": ["places"],
        "additionalProperties": False}, {"places": [{"name": "Oslo"}], "note": None},
        Trip([Place("Oslo")]), id="nested-dataclass"),
    pytest.param(Stop, {"type": "object", "properties": {"place": PLACE,
        "nights": {"type": "integer"}}, "required": ["place", "nights"],
        "additionalProperties": False}, {"place": {"name": "Oslo"}, "nights": 2},
        {"place": Place("Oslo"), "nights": 2}, id="typed-dict"),
    pytest.param(Wish, {"type": "object", "properties": {"city": STRING}, "required": [],
        "additionalProperties": False}, {}, {}, id="typed-dict-not-total"),
    pytest.param(Optional[Place], dict(PLACE, type=["object", "null"]), None, None,
                 id="optional-dataclass-null"),
    pytest.param(Optional[Place], dict(PLACE, type=["object", "null"]), {"name": "Oslo"},
                 Place("Oslo"), id="optional-dataclass"),
    pytest.param(Dict[str, Place], {"type": "object", "additionalProperties": PLACE},
                 {"a": {"name": "Oslo"}}, {"a": Place("Oslo")}, id="dict-of-dataclasses"),
    pytest.param(Union[int, str], {"anyOf": [{"type": "integer"}, STRING]}, 3, 3,
                 id="union-without-a-dataclass"),
    pytest.param(List[int], {"type": "array", "items": {"type": "integer"}}, [1], [1],
                 id="list-without-a-dataclass"),
]  # fmt: skip


class TestHintSchemaAndValue:
    """hint_schema(): the one mapping of hints to schemas, dataclasses and TypedDicts too;
    hint_value(): the value JSON valid against it stands for, each dataclass built."""

    @pytest.mark.parametrize(("hint", "schema", "value", "built"), CLASS_HINTS)
    def test_a_dataclass_or_typed_dict_is_an_object_of_its_fields(
        self, hint: Any, schema: Any, value: Any, built: Any
    ) -> None:
        assert agent_loop_functions.hint_schema(hint) == schema
        assert agent_loop_functions.hint_value(hint, value) == built

    @pytest.mark.parametrize(
        ("hint", "says"),
        [
            (Node, "hint_schema(): field 'children': Node holds itself, and a schema here cannot"),
            (Union[Place, int], "is a Union that holds a dataclass: which member a value is"),
            (Broken, "cannot resolve the type hints of Broken: NameError: "),
        ],
    )
    def test_what_it_cannot_describe_is_a_type_error(self, hint: Any, says: str) -> None:
        with pytest.raises(TypeError) as raised:
            agent_loop_functions.hint_schema(hint)
        assert says in str(raised.value)

    def test_a_dataclass_parameter_is_built_before_the_function_is_called(self) -> None:
        """Only the hints that hold a dataclass: a TypedDict of plain values stays a dict."""

        def visit(place: Place, nights: int, wish: Optional[Wish] = None) -> str:
            return f"{place.name} for {nights}, {wish}"

        tool = al.Tool.from_function(visit)
        assert tool.spec().to_dict()["parameters"]["properties"]["place"] == PLACE
        arguments = {"place": {"name": "Oslo"}, "nights": 2, "wish": {"city": "Oslo"}}
        returned = tool.execute(arguments, threading.Event())
        assert returned == "Oslo for 2, {'city': 'Oslo'}"
