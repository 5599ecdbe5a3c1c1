# agent_loop_functions.py 1.0.0: Tool.from_function's schemas from type hints, for agent_loop.py.
# One file, standard library only; copy it next to agent_loop.py. Home: the agent_loop repository.
"""A tool's fields from a plain function, for ``agent_loop.Tool.from_function``.

``Tool.from_function(fn)`` imports this file when it is called and builds its Tool from
``tool_fields(fn)``: the schema of the function's parameters, made from their type hints,
and an ``execute`` that calls ``fn(**arguments)``. docs/tools.md, "Tools from functions",
lists each hint and its schema. It uses only agent_loop's public names.
"""

from __future__ import annotations

import inspect
import types
from typing import (
    Any,
    Callable,
    Dict,
    Final,
    List,
    Literal,
    Optional,
    Tuple,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

import agent_loop as al

__version__ = "1.0.0"

__all__ = ["tool_fields"]

_HINT_TYPES: Final = (
    (str, "string"),
    (bool, "boolean"),
    (int, "integer"),
    (float, "number"),
    (type(None), "null"),
)
"""Hints that are a JSON type, as pairs: a hint may be unhashable, so is compared by identity."""


def tool_fields(
    fn: Callable[..., object], name: Optional[str] = None, description: Optional[str] = None
) -> Tuple[str, str, Dict[str, Any], Callable[[Dict[str, Any], al.Signal], object]]:
    """Returns the name, description, parameters and execute of the Tool ``fn`` makes.

    The name is the function's and the description its docstring (``""`` without one),
    unless given; ``execute`` calls ``fn(**arguments)``, with ``signal=`` the run's signal
    if ``fn`` has a parameter named ``signal``. Raises TypeError as
    ``Tool.from_function`` says.
    """
    parameters, wants_signal = _function_parameters(fn)
    if name is None and fn.__name__ == "<lambda>":
        raise TypeError("Tool.from_function: a lambda has no name of its own; give it name=")

    def execute(arguments: Dict[str, Any], signal: al.Signal) -> object:
        if wants_signal:
            return fn(**arguments, signal=signal)
        return fn(**arguments)

    if description is None:
        description = inspect.getdoc(fn) or ""
    return fn.__name__ if name is None else name, description, parameters, execute


def _function_parameters(fn: object) -> Tuple[Dict[str, Any], bool]:
    """The schema of fn's parameters, and whether it takes the signal."""
    if not (inspect.isfunction(fn) or inspect.ismethod(fn)):
        raise TypeError(
            f"Tool.from_function takes a function or a method, got {type(fn).__name__}"
        )
    if inspect.iscoroutinefunction(fn):  # its result would be a coroutine, never awaited
        raise TypeError(
            f"Tool.from_function: {fn.__qualname__} is an async function, and the loop "
            "calls tools synchronously; give it a plain def"
        )
    try:
        hints = get_type_hints(fn)
    except Exception as error:  # a name the annotation string uses is not defined, say
        raise TypeError(
            f"Tool.from_function: cannot resolve the type hints of {fn.__qualname__}: "
            f"{_describe(error)}"
        ) from None
    properties: Dict[str, Any] = {}
    required: List[str] = []
    wants_signal = False
    for parameter in inspect.signature(fn).parameters.values():
        where = f"Tool.from_function({fn.__qualname__}): parameter {parameter.name!r}"
        if parameter.kind not in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            raise TypeError(
                f"{where} is {parameter.kind.description}: the tool calls fn(**arguments), "
                "so each parameter must be one that can be passed by name"
            )
        if parameter.name == "signal":
            wants_signal = True
            continue
        if parameter.name not in hints:
            raise TypeError(f"{where} has no type hint: the schema is made from the hints")
        nullable = parameter.default is None
        properties[parameter.name] = _hint_schema(hints[parameter.name], where, nullable)
        if parameter.default is parameter.empty:
            required.append(parameter.name)
    schema = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    return schema, wants_signal


def _hint_schema(hint: Any, where: str, nullable: bool) -> Dict[str, Any]:
    """The schema of a hint's JSON values, and of null too if nullable."""
    origin = get_origin(hint)
    arguments = get_args(hint)
    # Union[X, None] has the origin typing.Union, and X | None (3.10+) types.UnionType.
    if origin is Union or origin is getattr(types, "UnionType", Union):
        others = [argument for argument in arguments if argument is not type(None)]
        if len(others) == 1:  # Optional[X]
            return _hint_schema(others[0], where, True)
        members = [_hint_schema(other, where, False) for other in others]
        nullable = nullable or len(others) < len(arguments)
        return {"anyOf": [*members, {"type": "null"}] if nullable else members}
    if origin is Literal:
        if nullable and not any(value is None for value in arguments):
            arguments = (*arguments, None)
        return _literal_schema(arguments, where)
    json_type = next((name for kind, name in _HINT_TYPES if hint is kind), None)
    if json_type is not None:
        schema: Dict[str, Any] = {"type": json_type}
    elif hint is list or origin is list:
        schema = {"type": "array"}
        if arguments:
            schema["items"] = _hint_schema(arguments[0], where, False)
    elif hint is dict or origin is dict:
        schema = {"type": "object"}
        if arguments and arguments[0] is not str:
            raise TypeError(f"{where}: {hint} has keys that are not str, as no JSON object has")
        if arguments and arguments[1] is not Any:
            schema["additionalProperties"] = _hint_schema(arguments[1], where, False)
    else:
        raise TypeError(
            f"{where}: {hint!r} has no schema here; use str, int, float, bool, None, list, "
            "dict, Literal, or a Union or Optional of them"
        )
    if nullable and json_type != "null":
        schema["type"] = [schema["type"], "null"]
    return schema


def _literal_schema(values: Tuple[object, ...], where: str) -> Dict[str, Any]:
    """The enum of a Literal, typed when its values share a JSON type."""
    kinds = set()
    for value in values:
        kind = next(
            (name for python_type, name in _HINT_TYPES if type(value) is python_type), None
        )
        if kind is None:
            raise TypeError(
                f"{where}: Literal value {value!r} is a {type(value).__name__}, "
                "not a JSON scalar (str, int, float, bool or None)"
            )
        kinds.add(kind)
    if len(kinds) == 1:
        return {"type": kinds.pop(), "enum": list(values)}
    return {"enum": list(values)}


def _describe(error: BaseException) -> str:
    """Names an exception and its message, as agent_loop's errors do."""
    try:
        message = str(error)
    except Exception:  # an exception whose message cannot be read is still named
        message = ""
    return f"{type(error).__name__}: {message}" if message else type(error).__name__
