# agent_loop_functions.py 1.1.0: Tool.from_function's schemas from type hints, for agent_loop.py.
# One file, standard library only; copy it next to agent_loop.py. Home: the agent_loop repository.
"""A tool's fields from a plain function, for ``agent_loop.Tool.from_function``.

``Tool.from_function(fn)`` imports this file when it is called and builds its Tool from
``tool_fields(fn)``: the schema of the function's parameters, made from their type hints,
and an ``execute`` that calls ``fn(**arguments)``. docs/tools.md, "Tools from functions",
lists each hint and its schema. ``hint_schema(hint)`` is that mapping for one hint, and
``hint_value(hint, value)`` the Python value a hint's JSON stands for (dataclasses built),
which agent_loop_output.py uses for typed answers. It uses only agent_loop's public names.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from typing import (
    TYPE_CHECKING,
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

if TYPE_CHECKING:  # annotations only
    from typing_extensions import TypeGuard

__version__ = "1.1.0"

__all__ = ["tool_fields", "hint_schema", "hint_value"]

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
    unless given; ``execute`` calls ``fn(**arguments)``, each argument as ``hint_value()``
    makes it (a dataclass built), with ``signal=`` the run's signal if ``fn`` has a
    parameter named ``signal``. Raises TypeError as ``Tool.from_function`` says.
    """
    parameters, wants_signal, built = _function_parameters(fn)
    if name is None and fn.__name__ == "<lambda>":
        raise TypeError("Tool.from_function: a lambda has no name of its own; give it name=")

    def execute(arguments: Dict[str, Any], signal: al.Signal) -> object:
        for key in built.keys() & arguments.keys():  # only the hints that hold a dataclass
            arguments[key] = hint_value(built[key], arguments[key])
        if wants_signal:
            return fn(**arguments, signal=signal)
        return fn(**arguments)

    if description is None:
        description = inspect.getdoc(fn) or ""
    return fn.__name__ if name is None else name, description, parameters, execute


def hint_schema(hint: Any, where: str = "hint_schema()") -> Dict[str, Any]:
    """Returns the JSON Schema of a type hint's values, as ``Tool.from_function`` makes each
    parameter's (docs/tools.md lists them): a dataclass or a TypedDict is an object of its
    fields. Raises TypeError, beginning with ``where``, for a hint it cannot describe."""
    return _hint_schema(hint, where, False, ())


def hint_value(hint: Any, value: Any) -> Any:
    """Returns the Python value that JSON valid against ``hint_schema(hint)`` stands for:
    each dataclass in it built from its object (recursively), the rest as JSON has it.
    Raises what a dataclass's constructor raises."""
    if value is None:
        return None
    if _is_class(hint):
        hints = get_type_hints(hint)
        fields = {key: hint_value(hints[key], item) for key, item in value.items()}
        return hint(**fields) if dataclasses.is_dataclass(hint) else fields
    origin = get_origin(hint)
    arguments = [argument for argument in get_args(hint) if argument is not type(None)]
    if origin is list and arguments:
        return [hint_value(arguments[0], item) for item in value]
    if origin is dict and arguments:
        return {key: hint_value(arguments[1], item) for key, item in value.items()}
    if _is_union(origin) and len(arguments) == 1:  # Optional[X]; hint_schema refused the rest
        return hint_value(arguments[0], value)
    return value


def _function_parameters(fn: object) -> Tuple[Dict[str, Any], bool, Dict[str, Any]]:
    """The schema of fn's parameters, whether it takes the signal, and the hints of the
    parameters whose values hold a dataclass (hint_value builds them)."""
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
        properties[parameter.name] = _hint_schema(hints[parameter.name], where, nullable, ())
        if parameter.default is parameter.empty:
            required.append(parameter.name)
    built = {name: hints[name] for name in properties if _builds(hints[name])}
    return _object_schema(properties, required), wants_signal, built


def _object_schema(properties: Dict[str, Any], required: List[str]) -> Dict[str, Any]:
    """The schema of an object of these properties and no other: a function's, a class's."""
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _hint_schema(hint: Any, where: str, nullable: bool, outer: Tuple[type, ...]) -> Dict[str, Any]:
    """The schema of a hint's JSON values, and of null too if nullable; outer: the classes
    whose fields hold this hint."""
    origin = get_origin(hint)
    arguments = get_args(hint)
    if _is_union(origin):
        others = [argument for argument in arguments if argument is not type(None)]
        if len(others) == 1:  # Optional[X]
            return _hint_schema(others[0], where, True, outer)
        members = [_hint_schema(other, where, False, outer) for other in others]
        if any(_builds(other) for other in others):
            raise TypeError(
                f"{where}: {hint} is a Union that holds a dataclass: which member a value is "
                "could not be told; use one dataclass, or Optional of it"
            )
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
            schema["items"] = _hint_schema(arguments[0], where, False, outer)
    elif hint is dict or origin is dict:
        schema = {"type": "object"}
        if arguments and arguments[0] is not str:
            raise TypeError(f"{where}: {hint} has keys that are not str, as no JSON object has")
        if arguments and arguments[1] is not Any:
            schema["additionalProperties"] = _hint_schema(arguments[1], where, False, outer)
    elif _is_class(hint):
        schema = _class_schema(hint, where, outer)
    else:
        raise TypeError(
            f"{where}: {hint!r} has no schema here; use str, int, float, bool, None, list, "
            "dict, Literal, a dataclass, a TypedDict, or a Union or Optional of them"
        )
    if nullable and json_type != "null":
        schema["type"] = [schema["type"], "null"]
    return schema


def _class_schema(hint: type, where: str, outer: Tuple[type, ...]) -> Dict[str, Any]:
    """The object schema of a dataclass's fields (those its constructor takes) or a
    TypedDict's keys: a field whose default is None admits null, as a parameter does."""
    if hint in outer:
        raise TypeError(
            f"{where}: {hint.__qualname__} holds itself, and a schema here cannot: "
            "give the JSON Schema of the answer instead"
        )
    try:
        hints = get_type_hints(hint)
    except Exception as error:  # a name an annotation string uses is not defined, say
        raise TypeError(
            f"{where}: cannot resolve the type hints of {hint.__qualname__}: {_describe(error)}"
        ) from None
    if dataclasses.is_dataclass(hint):
        fields = [item for item in dataclasses.fields(hint) if item.init]
        missing = dataclasses.MISSING
        required = [
            item.name
            for item in fields
            if item.default is missing and item.default_factory is missing
        ]
        nullable = {item.name: item.default is None for item in fields}
    else:  # a TypedDict; Python 3.8's has no __required_keys__: its total says for each key
        total: bool = hint.__total__  # type: ignore[attr-defined]
        keys = getattr(hint, "__required_keys__", hints if total else ())
        required = [key for key in hints if key in keys]
        nullable = dict.fromkeys(hints, False)
    properties = {
        name: _hint_schema(hints[name], f"{where}: field {name!r}", null, (*outer, hint))
        for name, null in nullable.items()
    }
    return _object_schema(properties, required)


def _is_class(hint: object) -> TypeGuard[type]:
    """Whether a hint is a dataclass or a TypedDict: an object of its fields."""
    is_typed_dict = (
        isinstance(hint, type) and issubclass(hint, dict) and hasattr(hint, "__total__")
    )
    return is_typed_dict or (isinstance(hint, type) and dataclasses.is_dataclass(hint))


def _is_union(origin: object) -> bool:
    """Whether a hint's origin is a Union: typing.Union, or X | Y's types.UnionType (3.10+)."""
    return origin is Union or origin is getattr(types, "UnionType", Union)


def _builds(hint: Any) -> bool:
    """Whether a hint's values hold a dataclass, which hint_value() builds."""
    if _is_class(hint):
        members = get_type_hints(hint).values()
        return dataclasses.is_dataclass(hint) or any(_builds(member) for member in members)
    return any(_builds(argument) for argument in get_args(hint))


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
