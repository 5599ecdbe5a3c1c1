# agent_loop_schema.py 1.0.0: the JSON Schema 2020-12 engine for agent_loop.py's tool arguments.
# One file, standard library only; copy it next to agent_loop.py. Home: the agent_loop repository.
"""The JSON Schema 2020-12 engine that checks a tool's arguments, for ``agent_loop.Tool``.

``Tool()`` imports this file by name when it is beside agent_loop.py and hands it the whole
schema: ``frozen_schema()`` checks and freezes it when the Tool is built, and ``problems()``
lists what a call's arguments violate before the tool runs. Without this file the core
checks ``type``, ``properties``, ``required``, ``additionalProperties``, ``items`` and
``enum`` by itself, and refuses a schema that holds another keyword this file enforces.
docs/schemas.md says all this for users. It uses only agent_loop's public names.

Rules:

- Enforced, with the meaning 2020-12 gives them: those six, ``const``, ``allOf``,
  ``anyOf``, ``oneOf``, ``not``, ``if``/``then``/``else``, ``$ref`` (to ``#``, ``""``, a
  JSON pointer, an ``$anchor``, the root's ``$id`` or an ``$id`` below it), the numeric
  bounds, and the bounds on lengths (code points), items and properties.
- Core 8.2.1: "The "$id" keyword identifies a schema resource with its canonical URI" and
  sets the base URI that the ``$ref``s under it resolve against; so it does here.
- Annotations refuse nothing: ``format`` among them, as 2020-12 says by default (its
  Validation 7.2.1: "by default, format is an annotation"). A keyword 2020-12 does not
  define is ignored, as Core 4.3.1 says ("SHOULD treat unknown keywords as annotations").
- The keywords of 2020-12 in _UNENFORCED are the tool's to check. A subschema that holds
  one (or reaches one through its parts and $refs) may accept what JSON Schema refuses,
  never the reverse, so a match of such a subschema refuses nothing: it fails no ``not``,
  is no second match of ``oneOf``, and picks no branch of ``if``. The rest of the document
  is enforced in full.
- JSON equality is strict (``1`` is not ``1.0``, ``True`` is not ``1``), so that a tool
  declared with an integer gets a Python int; bounds take integral floats (``2.0``).
- Limits: schemas nest at most ``MAX_ARGUMENT_DEPTH`` deep, as arguments do (containers of
  JSON that no keyword reads as a schema count with them); a ``$ref`` to another document
  is refused when the Tool is built, as is one that names nothing.
"""

from __future__ import annotations

import json
import math
import operator
import re
import reprlib
import urllib.parse
from types import MappingProxyType
from typing import Any, Callable, Dict, Final, List, Mapping, Optional, Sequence, Set, Tuple, cast

import agent_loop as al

__version__ = "1.0.0"

__all__ = ["frozen_schema", "problems"]

_TYPES: Final = ("object", "string", "number", "integer", "boolean", "array", "null")
# The JSON type of each Python type that frozen JSON holds (plain JSON too).
_JSON_TYPES: Final = {
    type(None): "null", bool: "boolean", int: "integer", float: "number", str: "string",
    list: "array", tuple: "array", dict: "object", MappingProxyType: "object",
}  # fmt: skip
# Core 8.2.2: an anchor is "a plain name fragment", XML's NCName here as in the meta-schema.
_ANCHOR: Final = re.compile(r"[A-Za-z_][-A-Za-z0-9._]*\Z")
_QUOTE: Final = reprlib.Repr()  # a rejected value, recognisable in an error, never a megabyte
_QUOTE.maxstring = _QUOTE.maxother = 160


def _is_array(value: object) -> bool:
    return isinstance(value, (list, tuple))


def _is_number(value: object) -> bool:
    return type(value) is int or (type(value) is float and math.isfinite(value))


def _is_count(value: object) -> bool:
    # Validation 6.2 and 6.3: "a non-negative integer", which 2.0 is in JSON Schema.
    integral = type(value) is int or (type(value) is float and value.is_integer())
    return integral and cast(float, value) >= 0


def _type_names(value: object) -> bool:
    """Whether a type keyword gives distinct names of JSON types."""
    names = cast(Sequence[object], value) if _is_array(value) and value else [value]
    return len(names) == sum(name in names for name in _TYPES)


# What the value of a keyword must be: the words an error says, and the test.
_VALUE_KINDS: Final[Dict[str, Tuple[str, Callable[[Any], bool]]]] = {
    "schema": ("a JSON Schema object", lambda value: isinstance(value, (bool, Mapping))),
    "schemas": ("a non-empty array of schemas", lambda value: _is_array(value) and len(value) > 0),
    "schema map": ("an object of schemas", lambda value: isinstance(value, Mapping)),
    "number": ("a number", _is_number),
    "count": ("a non-negative integer", _is_count),
    "names": ("an array of property names",
              lambda value: _is_array(value) and all(type(name) is str for name in value)),
    "array": ("an array", _is_array),
    "type": (f"one of {', '.join(_TYPES)}, or a non-empty array of distinct ones", _type_names),
    "$ref": ("a URI reference", lambda value: type(value) is str),
    "$id": ("a URI reference without a fragment",
            lambda value: type(value) is str and "#" not in value.rstrip("#")),
    "anchor": ("a plain name (a letter or _, then letters, digits, '-', '_' or '.')",
               lambda value: type(value) is str and _ANCHOR.match(value) is not None),
}  # fmt: skip
# The keywords of 2020-12 whose values have a kind: those that hold schemas (Core 10, the
# applicators, enforced or not, so that their $ids and $refs are read), and those this file
# enforces. Any other keyword holds any JSON.
_KEYWORDS: Final = {
    "type": "type", "required": "names", "enum": "array", "$ref": "$ref", "$id": "$id",
    "$anchor": "anchor", "$dynamicAnchor": "anchor",
    **dict.fromkeys(("items", "additionalProperties", "not", "if", "then", "else", "contains",
                     "propertyNames", "unevaluatedItems", "unevaluatedProperties",
                     "contentSchema"), "schema"),
    **dict.fromkeys(("allOf", "anyOf", "oneOf", "prefixItems"), "schemas"),
    **dict.fromkeys(("properties", "$defs", "definitions", "patternProperties",
                     "dependentSchemas"), "schema map"),
    **dict.fromkeys(("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"), "number"),
    **dict.fromkeys(("minLength", "maxLength", "minItems", "maxItems", "minProperties",
                     "maxProperties", "minContains", "maxContains"), "count"),
}  # fmt: skip
# The keywords of 2020-12 that this file does not enforce: where one is, JSON Schema may
# refuse what is accepted here (regular expressions are ECMA 262's, not Python's; the
# others are left to the tool as they were in 1.4).
_UNENFORCED: Final = frozenset(
    ("pattern", "patternProperties", "multipleOf", "uniqueItems", "prefixItems", "contains",
     "minContains", "maxContains", "propertyNames", "dependentRequired", "dependentSchemas",
     "unevaluatedItems", "unevaluatedProperties", "$dynamicRef")
)  # fmt: skip
# The keywords that apply to a value itself (besides type), which few schemas hold.
_IN_PLACE: Final = frozenset(
    ("enum", "const", "$ref", "allOf", "anyOf", "oneOf", "not", "if", "minimum", "maximum",
     "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "minItems", "maxItems",
     "minProperties", "maxProperties")
)  # fmt: skip
# The bounds of each JSON type (on a number, or on a length: code points, items, properties).
_BOUNDS: Final = {
    **dict.fromkeys(("integer", "number"), (
        ("minimum", "be at least {}", operator.lt), ("maximum", "be at most {}", operator.gt),
        ("exclusiveMinimum", "be more than {}", operator.le),
        ("exclusiveMaximum", "be less than {}", operator.ge))),
    "string": (("minLength", "have at least {} characters", operator.lt),
               ("maxLength", "have at most {} characters", operator.gt)),
    "array": (("minItems", "have at least {} items", operator.lt),
              ("maxItems", "have at most {} items", operator.gt)),
    "object": (("minProperties", "have at least {} properties", operator.lt),
               ("maxProperties", "have at most {} properties", operator.gt)),
}  # fmt: skip

_Located = Tuple[Any, str]  # a schema, and the base URI around it (its own $id not applied)


# --- Checked and frozen when the Tool is built ---------------------------------------------


def frozen_schema(parameters: object, where: str) -> Any:
    """Checks a tool's parameter schema and returns a frozen copy (read-only mappings,
    tuples); ``where`` names it in errors (``"Tool 'add' parameters"``).

    Raises TypeError for a part that is not JSON or a schema where a schema must be, and
    ValueError, naming the path, for a malformed value of a keyword, a schema nested
    deeper than MAX_ARGUMENT_DEPTH, or a $ref that names nothing in this document."""
    found = _Found()
    schema = _frozen(parameters, where, 0, "schema", "", found)
    checked: Set[Tuple[str, str]] = set()
    for ref, base, at in found.refs:  # it grows as the JSON the $refs lead into is checked
        if (ref, base) not in checked:
            checked.add((ref, base))
            located = _resolved(ref, base, found)
            if located is None:
                raise ValueError(
                    f"{at} {ref!r} names nothing in this schema (a $ref to another document "
                    "is not followed)"
                )
            target, around, is_schema = located
            if not is_schema:  # a pointer may name any part of the document: it must be a schema
                _frozen(target, f"{at} {ref!r}", 1, "schema", around, found)
    return schema


class _Found:
    """What a walk over a schema found: its resources by URI, its anchors, its $refs."""

    def __init__(self) -> None:
        self.resources: Dict[str, _Located] = {}
        self.anchors: Dict[Tuple[str, str], _Located] = {}
        self.refs: List[
            Tuple[str, str, str]
        ] = []  # the $ref, the base it is resolved against, where


def _frozen(
    value: object, where: str, depth: int, kind: Optional[str], base: str, found: _Found
) -> Any:
    """A schema, a keyword's value of a _VALUE_KINDS kind, or any JSON (None), checked and
    frozen; ``base`` is the base URI around it, and what it holds goes to ``found``."""
    if kind is not None and not _VALUE_KINDS[kind][1](value):
        words = _VALUE_KINDS[kind][0]
        if kind == "schema":
            raise TypeError(f"{where} must be {words}, got {type(value).__name__}")
        raise ValueError(f"{where} must be {words}, got {_QUOTE.repr(value)}")
    if kind == "$ref":
        found.refs.append((cast(str, value), base, where))
    if (
        value is None
        or type(value) in (str, bool, int)
        or (type(value) is float and math.isfinite(value))
    ):
        return value
    # Deeper than arguments may be, it would describe no call: schemas and containers count.
    if depth > al.MAX_ARGUMENT_DEPTH:
        raise ValueError(f"{where} nests deeper than {al.MAX_ARGUMENT_DEPTH} levels")
    if isinstance(value, Mapping):
        inner = base
        if kind == "schema" and type(value.get("$id")) is str:
            inner = _joined(base, value["$id"])
        frozen = {}
        for key, item in value.items():
            if type(key) is not str:
                raise TypeError(f"{where} has {_a(type(key).__name__)} key {_QUOTE.repr(key)}")
            part = "schema" if kind == "schema map" else None
            if kind == "schema" and not (key == "items" and _is_array(item)):
                part = _KEYWORDS.get(key)  # the array form of old items is not enforced
            deeper = depth + (part in (None, "schema"))
            frozen[key] = _frozen(item, f"{where}.{key}", deeper, part, inner, found)
        schema = MappingProxyType(frozen)
        if kind == "schema":
            if depth == 0 or "$id" in frozen:
                found.resources.setdefault(inner, (schema, base))
            for key in ("$anchor", "$dynamicAnchor"):
                if key in frozen:
                    found.anchors.setdefault((inner, frozen[key]), (schema, base))
        return schema
    if _is_array(value):
        part = "schema" if kind == "schemas" else None
        return tuple(
            _frozen(item, f"{where}[{index}]", depth + 1, part, base, found)
            for index, item in enumerate(cast(Sequence[Any], value))
        )
    raise TypeError(f"{where} holds {_QUOTE.repr(value)}, which is not JSON")


def _a(noun: str) -> str:
    return ("an " if noun[:1] in "aeiou" else "a ") + noun


def _joined(base: str, identifier: str) -> str:
    """The base URI an $id gives, against the base around it (Core 8.2.1, RFC 3986 5.2)."""
    return urllib.parse.urljoin(base, identifier.rstrip("#"))


def _resolved(ref: str, base: str, found: _Found) -> Optional[Tuple[Any, str, bool]]:
    """What a $ref names (Core 8.2.3): the schema or JSON, the base URI around it, and
    whether it stands where a schema does; None if it names nothing in this document."""
    if ref.startswith("#"):
        uri, fragment = base, ref[1:]
    else:
        uri, fragment = urllib.parse.urldefrag(urllib.parse.urljoin(base, ref))
    if uri not in found.resources:
        return None  # another document, which is not followed
    if fragment[:1] == "/":
        return _pointed(found.resources[uri], uri, fragment)
    located = found.anchors.get((uri, fragment)) if fragment else found.resources[uri]
    return None if located is None else (*located, True)


def _pointed(resource: _Located, uri: str, pointer: str) -> Optional[Tuple[Any, str, bool]]:
    """What a JSON pointer names in a resource (RFC 6901; percent-decoded first, as a URI
    fragment is), the base around it, and whether it stands where a schema does."""
    target, around = resource
    inner, kind = uri, cast(Optional[str], "schema")
    for token in urllib.parse.unquote(pointer).split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        if type(target) is tuple and token.isdecimal() and int(token) < len(target):
            target = target[int(token)]
        elif type(target) is MappingProxyType and token in target:
            target = target[token]
        else:
            return None
        if kind in ("schemas", "schema map"):
            kind = "schema"
        else:  # what a keyword of a schema holds; inside plain JSON, plain JSON
            kind = _KEYWORDS.get(token) if kind == "schema" else None
        around = inner
        if kind == "schema" and type(target) is MappingProxyType and "$id" in target:
            inner = _joined(inner, target["$id"])  # a pointer may pass into a resource
    return target, around, kind == "schema" and isinstance(target, (bool, MappingProxyType))


# --- Checked at each call ------------------------------------------------------------------


# How deep one check may go, schemas and $refs followed included: far more than a value's
# depth needs (MAX_ARGUMENT_DEPTH), and far less than Python's recursion limit, so that a
# $ref that loops in place is told by this count (a RecursionError would also stop the
# tracing of coverage and debuggers on Pythons before 3.12).
_MAX_CHECK_DEPTH: Final = 200


class _TooDeep(Exception):
    """The check went deeper than _MAX_CHECK_DEPTH."""


def problems(arguments: Any, schema: Mapping[str, Any]) -> List[str]:
    """Returns every way a frozen JSON value (as ``ToolCall.arguments`` holds it) fails a
    schema that ``frozen_schema()`` returned, in the schema's order; ``[]`` when it passes.
    Each names its path from ``$``; $refs that loop in place are one problem that says so."""
    try:
        return _Check(schema).problems(arguments, schema, "$", "")
    except _TooDeep:
        return ["$ cannot be checked: its schema nests too deep, or its $refs loop"]


class _Check:
    """One check of one value: the root, its resources (found when a $ref first needs them)
    and which of its subschemas this file enforces in full."""

    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root
        self.base = _joined("", root["$id"]) if "$id" in root else ""
        self._found: Optional[_Found] = None
        self._exact: Dict[int, bool] = {}
        self._depth = 0

    def problems(self, value: Any, schema: Any, path: str, base: str) -> List[str]:
        """Every way ``value`` fails ``schema``, where ``base`` is the base URI around it."""
        if self._depth == _MAX_CHECK_DEPTH:
            raise _TooDeep
        self._depth += 1
        try:
            return self._problems(value, schema, path, base)
        finally:
            self._depth -= 1

    def _problems(self, value: Any, schema: Any, path: str, base: str) -> List[str]:
        """problems() one level down."""
        if schema is True:
            return []
        if schema is False:
            return [f"{path} is not allowed (its schema is false)"]
        if "$id" in schema:
            base = _joined(base, schema["$id"])
        found: List[str] = []
        kind = _JSON_TYPES[type(value)]
        if "type" in schema and schema["type"] != kind:  # a name or a tuple of names
            names = (schema["type"],) if type(schema["type"]) is str else schema["type"]
            # A JSON integer is also a JSON number; bool is neither (it is not an int here).
            if kind not in names and (kind != "integer" or "number" not in names):
                found.append(f"{path} must be {' or '.join(names)}, got {kind}")
        if not _IN_PLACE.isdisjoint(schema):  # most schemas hold none of them
            self.in_place(value, kind, schema, path, base, found)
        if kind == "object":
            properties = schema.get("properties", {})
            for name in schema.get("required", ()):
                if name not in value:
                    found.append(f"{path} is missing the required property {name!r}")
            # Beside patternProperties (not enforced), additionalProperties is not enforced.
            others = True
            if "additionalProperties" in schema and "patternProperties" not in schema:
                others = schema["additionalProperties"]
            for name, item in value.items():
                if name in properties:
                    found += self.problems(item, properties[name], f"{path}.{name}", base)
                elif others is False:
                    found.append(f"{path} has the unexpected property {name!r}")
                else:
                    found += self.problems(item, others, f"{path}.{name}", base)
        elif kind == "array" and "items" in schema and type(schema["items"]) is not tuple:
            prefix = schema.get("prefixItems", ())
            for index in range(len(prefix), len(value)):  # items applies after prefixItems
                found += self.problems(value[index], schema["items"], f"{path}[{index}]", base)
        return found

    def in_place(
        self, value: Any, kind: str, schema: Any, path: str, base: str, found: List[str]
    ) -> None:
        """problems() for the keywords that apply to the value itself, not its parts."""
        if "enum" in schema and not any(_same_json(value, option) for option in schema["enum"]):
            found.append(f"{path} must be one of {json.dumps(schema['enum'], default=dict)}")
        if "const" in schema and not _same_json(value, schema["const"]):
            found.append(f"{path} must be {json.dumps(schema['const'], default=dict)}")
        measure = len(value) if kind in ("string", "array", "object") else value
        for keyword, must, fails in _BOUNDS.get(kind, ()):
            if keyword in schema and fails(measure, schema[keyword]):
                found.append(f"{path} must {must.format(schema[keyword])}, got {measure}")
        if "$ref" in schema:
            target, around = self.target(schema["$ref"], base)
            found += self.problems(value, target, path, around)
        for subschema in schema.get("allOf", ()):
            found += self.problems(value, subschema, path, base)
        if "anyOf" in schema:
            branches = []
            for subschema in schema["anyOf"]:
                branches.append(self.problems(value, subschema, path, base))
                if not branches[-1]:
                    break  # one match is enough, and its siblings may be costly
            else:
                found.append(f"{path} matches no schema of anyOf: {_listed(branches)}")
        if "oneOf" in schema:
            branches = [self.problems(value, each, path, base) for each in schema["oneOf"]]
            matches = [each for each, branch in zip(schema["oneOf"], branches) if not branch]
            exact = sum(self.exact(each, base) for each in matches)
            if not matches:
                found.append(f"{path} matches no schema of oneOf: {_listed(branches)}")
            elif exact > 1:  # a match of a subschema not enforced in full may not be one
                found.append(f"{path} matches {exact} schemas of oneOf, not exactly one")
        passes_not = "not" in schema and not self.problems(value, schema["not"], path, base)
        if passes_not and self.exact(schema["not"], base):
            found.append(f"{path} must not match the schema of not")
        if "if" in schema:
            if self.problems(value, schema["if"], path, base):
                branches_of_if = ["else"]
            elif self.exact(schema["if"], base):
                branches_of_if = ["then"]
            else:  # a match that may not be JSON Schema's: refuse what both branches refuse
                branches_of_if = ["then", "else"]
            failed = [
                self.problems(value, schema[name], path, base) if name in schema else []
                for name in branches_of_if
            ]
            if all(failed):
                found += failed[0]

    def target(self, ref: str, base: str) -> _Located:
        """What a $ref names, and the base around it; Tool() resolved it once already."""
        if base == self.base and ref[:1] == "#" and ref[1:2] in ("", "/"):
            located = _pointed((self.root, ""), base, ref[1:])  # within the root's resource
        else:
            if self._found is None:  # an $id below the root, or an $anchor: read them once
                self._found = _Found()
                _frozen(self.root, "$", 0, "schema", "", self._found)
            located = _resolved(ref, base, self._found)
        return cast(Tuple[Any, str, bool], located)[:2]

    def exact(self, schema: Any, base: str) -> bool:
        """Whether this file enforces a subschema in full: no keyword of _UNENFORCED in it,
        nor in the subschemas and $refs it reaches."""
        if id(schema) not in self._exact:
            self._exact[id(schema)] = self._enforced(schema, base, set())
        return self._exact[id(schema)]

    def _enforced(self, schema: Any, base: str, seen: Set[int]) -> bool:
        if type(schema) is not MappingProxyType or id(schema) in seen:
            return True
        seen.add(id(schema))  # a schema that refers to itself is looked at once
        if not _UNENFORCED.isdisjoint(schema) or type(schema.get("items")) is tuple:
            return False
        if "$id" in schema:
            base = _joined(base, schema["$id"])
        reached = [self.target(schema["$ref"], base)] if "$ref" in schema else []
        for key, value in schema.items():
            kind = _KEYWORDS.get(key)
            if kind == "schema":
                reached.append((value, base))
            elif kind in ("schemas", "schema map"):
                parts = value.values() if kind == "schema map" else value
                reached.extend((part, base) for part in parts)
        return all(self._enforced(part, around, seen) for part, around in reached)


def _listed(branches: List[List[str]]) -> str:
    """The problems of each branch of anyOf or oneOf: '; ' between branches."""
    return "; ".join(" and ".join(branch) for branch in branches)


def _same_json(left: object, right: object) -> bool:
    """JSON equality at any depth: unlike ==, True is not 1 and 1 is not 1.0."""
    if isinstance(left, (dict, MappingProxyType)) and isinstance(right, (dict, MappingProxyType)):
        return left.keys() == right.keys() and all(
            _same_json(left[key], right[key]) for key in left
        )
    if _is_array(left) and _is_array(right):
        pairs = zip(cast(Sequence[Any], left), cast(Sequence[Any], right))
        return len(cast(Sequence[Any], left)) == len(cast(Sequence[Any], right)) and all(
            _same_json(one, other) for one, other in pairs
        )
    return type(left) is type(right) and left == right
