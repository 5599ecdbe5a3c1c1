"""Tests for tool schemas: agent_loop_schema.py, the JSON Schema 2020-12 engine a Tool's
parameters are checked with (the keywords it enforces, their values checked when the Tool
is built, $ref resolution as 2020-12 resolves it, every violation listed), the differential
test against jsonschema's Draft202012Validator on random schemas over every enforced
keyword, and the core without the engine (its six keywords, the others refused).
test_agent_loop_tools_and_ir.py's docstring says how the suite is built.

Contents
    TestToolSchemas: arguments against schemas; a bad schema refused when the Tool is built
    TestRefsAsJsonSchemaResolvesThem: $id below the root, anchors, pointers, "", the root's $id
    TestSchemasAgreeWithJsonSchema: random schemas and arguments, the loop against jsonschema
    TestTheCoreWithoutTheEngine: agent_loop.py alone: six keywords, the others refused
"""

from __future__ import annotations

import copy
import importlib
import random
import sys
import threading
from types import MappingProxyType
from typing import (
    Any,
    Callable,
    Dict,
    Mapping,
)

import pytest

import agent_loop as al
from loop_testing import (
    AT_LIMIT,
    NUMBERS,
    OVER_LIMIT,
    add_tool,
    call,
    nested,
    one_call,
    only_tool_result,
    plain_copy,
    probe_tool,
    run,
    same_json,
    untyped,
)

# The differential tests' reference: installed in every tox env (a test dependency).
jsonschema = pytest.importorskip("jsonschema")


# --- Tool schemas ------------------------------------------------------------------------


EXAMPLE_OF_TYPE: dict[str, Any] = {"object": {"k": 1}, "string": "s", "number": 1.5, "integer": 3,
    "boolean": True, "array": [1], "null": None}  # fmt: skip
ENUM_VALUES = [1, "a", None, [1, 2], {"k": True}]
OBJECT = {"type": "object"}
INTEGER_N = {"type": "object", "properties": {"n": {"type": "integer"}}}
INTEGER_XS = {"type": "object",
    "properties": {"xs": {"type": "array", "items": {"type": "integer"}}}}  # fmt: skip
ITEM_N = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
OBJECT_XS = {"type": "object", "properties": {"xs": {"type": "array", "items": ITEM_N}}}
INNER = {"type": "object", "properties": {"inner": {**ITEM_N, "additionalProperties": False}},
    "required": ["inner"]}  # fmt: skip
ANNOTATED = {"type": "object", "title": "Probe", "description": "The probe's arguments.",
    "properties": {"n": {"type": "integer", "description": "A number.", "title": "N"}},
}  # fmt: skip
MANY_CODES = [f"c{n:03d}" for n in range(al.MAX_ARGUMENT_VALUES + 100)]  # fmt: skip
DEFINED = {"type": "object",
    "properties": {"v": {"$ref": "#/$defs/Positive", "maximum": 4},
                   "w": {"$ref": "#/definitions/a~1b~0c"}, "x": {"$ref": "#/properties/w"},
                   "y": {"$ref": "#/$defs/Choice/anyOf/1"}},
    "$defs": {"Positive": {"type": "integer", "minimum": 1},
              "Choice": {"anyOf": [{"type": "null"}, {"type": "boolean"}]}},
    "definitions": {"a/b~c": {"type": "string"}},
}  # fmt: skip
TREE = {"type": "object", "title": "Node",
    "properties": {"name": {"type": "string"},
                   "children": {"type": "array", "items": {"$ref": "#"}}},
    "required": ["name"], "additionalProperties": False}  # fmt: skip


def one_property(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Parameters whose one required property ``v`` has this schema."""
    return {"type": "object", "properties": {"v": schema}, "required": ["v"]}


SCHEMA_CASES = [
    # Each type accepts its own kind and rejects the others; a number also accepts an integer.
    *[pytest.param(one_property({"type": schema_type}), {"v": value},
                   None if kind == schema_type or (schema_type, kind) == ("number", "integer")
                   else ("$.v", schema_type, kind),
                   id=f"type-{schema_type}-given-{kind}")
      for schema_type in EXAMPLE_OF_TYPE for kind, value in EXAMPLE_OF_TYPE.items()],
    # bool is never a number or an integer.
    *[pytest.param(one_property({"type": schema_type}), {"v": value},
                   ("$.v", schema_type, "boolean"), id=f"{value}-is-no-{schema_type}")
      for schema_type in ("number", "integer") for value in (True, False)],
    *[pytest.param(one_property({"type": "number"}), {"v": value}, None,
                   id=f"int-{value}-is-a-number")
      for value in (0, 42, -7, 2**70)],
    # The documented choice: a schema integer is an int, never a float (even 1.0).
    *[pytest.param(one_property({"type": "integer"}), {"v": value}, ("$.v", "integer", "number"),
                   id=f"float-{value}-is-no-integer")
      for value in (1.0, 0.0, -3.0, 1.5)],
    pytest.param(NUMBERS, {"left": 20, "right": "22"}, ("$.right", "number", "string"),
                 id="properties-are-checked"),
    pytest.param(NUMBERS, {"left": 20}, ("required", "'right'"), id="a-missing-required-property"),
    pytest.param(NUMBERS, {"left": 20, "right": 22.5}, None, id="required-properties-present"),
    pytest.param(NUMBERS, {"left": 1, "right": 2, "extra": 3}, ("unexpected", "'extra'"),
                 id="additionalProperties-false-rejects-an-extra"),
    pytest.param(INTEGER_N, {"n": 1, "extra": [None]}, None, id="additionalProperties-default"),
    pytest.param({**INTEGER_N, "additionalProperties": True}, {"n": 1, "extra": [None]}, None,
                 id="additionalProperties-true"),
    pytest.param({**INTEGER_N, "additionalProperties": True}, {"n": "one", "extra": 1},
                 ("$.n", "integer"), id="additionalProperties-true-checks-declared-properties"),
    pytest.param(INTEGER_XS, {"xs": [1, 2, 3]}, None, id="items-pass"),
    pytest.param(INTEGER_XS, {"xs": [1, "two", 3]}, ("$.xs[1]", "integer", "string"),
                 id="items-names-the-index"),
    pytest.param(OBJECT_XS, {"xs": [{"n": 1}, {"n": 2}]}, None, id="items-of-objects-pass"),
    pytest.param(OBJECT_XS, {"xs": [{"n": 1}, {"n": "x"}]}, ("$.xs[1].n",),
                 id="items-path-reaches-into-objects"),
    pytest.param(OBJECT_XS, {"xs": [{"n": 1}, {}, {"n": 3}]}, ("$.xs[1]", "'n'"),
                 id="items-path-names-a-missing-property"),
    *[pytest.param(one_property({"enum": ENUM_VALUES}), {"v": value}, None,
                   id=f"enum-accepts-{value}")
      for value in (1, "a", None, [1, 2], {"k": True})],
    # The documented choice: enum compares as strict JSON, so True is not 1.
    *[pytest.param(one_property({"enum": ENUM_VALUES}), {"v": value}, ("$.v", "one of"),
                   id=f"enum-is-strict-{value}")
      for value in (True, 1.0, "b", [1, 2.0], [2, 1], {"k": 1}, 0)],
    pytest.param(one_property({"enum": [True]}), {"v": 1}, ("$.v", "one of"),
                 id="enum-true-rejects-1"),
    pytest.param(one_property({"enum": [True]}), {"v": True}, None, id="enum-true-accepts-true"),
    # An enum may list more members than one argument may hold values.
    pytest.param(one_property({"enum": MANY_CODES}), {"v": "c300"}, None,
                 id="enum-over-the-bounds"),
    # Nested objects are checked at every level.
    pytest.param(INNER, {"inner": {"n": 1}}, None, id="nested-pass"),
    pytest.param(INNER, {"inner": {}}, ("$.inner", "required", "'n'"), id="nested-required"),
    pytest.param(INNER, {"inner": {"n": 1, "x": 2}}, ("$.inner", "unexpected", "'x'"),
                 id="nested-additionalProperties"),
    pytest.param(INNER, {"inner": {"n": "one"}}, ("$.inner.n", "integer"), id="nested-type"),
    pytest.param(INNER, {"inner": [1]}, ("$.inner", "object", "array"), id="nested-not-an-object"),
    pytest.param(ANNOTATED, {"n": 1}, None, id="annotations-are-accepted"),
    # A type list admits each of its types; the error names them all.
    *[pytest.param(one_property({"type": ["integer", "null"]}), {"v": value}, None,
                   id=f"type-list-accepts-{value}") for value in (3, None)],
    pytest.param(one_property({"type": ["integer", "null"]}), {"v": "3"},
                 ("$.v must be integer or null, got string",), id="type-list-refuses-a-string"),
    pytest.param(one_property({"type": ["number", "string"]}), {"v": 3}, None,
                 id="type-list-number-accepts-an-int"),
    pytest.param(one_property({"const": 3}), {"v": 3}, None, id="const-accepts-itself"),
    pytest.param(one_property({"enum": []}), {"v": None}, ("$.v must be one of []",),
                 id="an-empty-enum-admits-nothing"),
    pytest.param(one_property({"const": 3}), {"v": 4}, ("$.v must be 3",),
                 id="const-refuses-another"),
    pytest.param(one_property({"const": [1, {"k": None}]}), {"v": [1, {"k": None}]}, None,
                 id="const-compares-containers"),
    pytest.param(one_property({"const": 1}), {"v": True}, ("$.v must be 1",),
                 id="const-1-is-not-true"),
    # Numeric bounds, inclusive and exclusive, on each side of the limit; ints and floats.
    *[pytest.param(one_property({keyword: 5}), {"v": value},
                   None if passes else (f"$.v must be {words} 5, got {value}",),
                   id=f"{keyword}-5-given-{value}")
      for keyword, words, cases in (
          ("minimum", "at least", ((5, True), (4, False), (4.5, False), (5.5, True))),
          ("exclusiveMinimum", "more than", ((5, False), (6, True), (5.5, True))),
          ("maximum", "at most", ((5, True), (6, False), (5.5, False), (4.5, True))),
          ("exclusiveMaximum", "less than", ((5, False), (4, True), (4.5, True))))
      for value, passes in cases],
    pytest.param(one_property({"minimum": 1.5}), {"v": 1}, ("$.v must be at least 1.5, got 1",),
                 id="a-float-bound-on-an-int"),
    # Lengths count code points (a character outside the BMP is one), items and properties.
    *[pytest.param(one_property({keyword: 2}), {"v": value},
                   None if passes else (f"$.v must have {words} 2 {unit}, got {len(value)}",),
                   id=f"{keyword}-2-given-{len(value)}")
      for keyword, words, unit, at_limit, over in (
          ("minLength", "at least", "characters", "\U0001f600\U0001f600", "\U0001f600"),
          ("maxLength", "at most", "characters", "\U0001f600\U0001f600", "abc"),
          ("minItems", "at least", "items", [1, 2], [1]),
          ("maxItems", "at most", "items", [1, 2], [1, 2, 3]),
          ("minProperties", "at least", "properties", {"a": 1, "b": 2}, {"a": 1}),
          ("maxProperties", "at most", "properties", {"a": 1, "b": 2}, {"a": 1, "b": 2, "c": 3}))
      for value, passes in ((at_limit, True), (over, False))],
    # A bound applies to its own JSON type only, as in JSON Schema.
    *[pytest.param(one_property({keyword: 3}), {"v": value}, None, id=f"{keyword}-ignores-{kind}")
      for keyword, own in (("minimum", ("number", "integer")), ("minLength", ("string",)),
                           ("minItems", ("array",)), ("minProperties", ("object",)))
      for kind, value in EXAMPLE_OF_TYPE.items() if kind not in own],
    # additionalProperties as a schema checks each other property; beside patternProperties
    # (whose patterns the loop does not match) it is not enforced.
    pytest.param({**INTEGER_N, "additionalProperties": {"type": "string"}}, {"n": 1, "x": "y"},
                 None, id="additionalProperties-schema-accepts"),
    pytest.param({**INTEGER_N, "additionalProperties": {"type": "string"}}, {"n": 1, "x": 2},
                 ("$.x must be string, got integer",), id="additionalProperties-schema-refuses"),
    pytest.param({**INTEGER_N, "additionalProperties": False, "patternProperties": {"^x": {}}},
                 {"n": 1, "y": 2}, None, id="additionalProperties-beside-patternProperties"),
    # items applies after prefixItems, whose schemas the loop does not enforce; the array
    # form of items (before 2020-12) is not enforced.
    pytest.param(one_property({"prefixItems": [{"type": "string"}], "items": {"type": "integer"}}),
                 {"v": [1.5, 2]}, None, id="items-after-prefixItems"),
    pytest.param(one_property({"prefixItems": [{"type": "string"}], "items": {"type": "integer"}}),
                 {"v": ["a", "b"]}, ("$.v[1] must be integer",),
                 id="items-after-prefixItems-refuses"),
    pytest.param(one_property({"items": [{"type": "integer"}]}), {"v": ["a"]}, None,
                 id="items-array-form-not-enforced"),
    # Boolean schemas: true admits anything, false nothing.
    pytest.param({**OBJECT, "properties": {"v": True}}, {"v": [None]}, None, id="true-schema"),
    pytest.param({**OBJECT, "properties": {"v": False}}, {"v": 1},
                 ("$.v is not allowed (its schema is false)",), id="false-schema"),
    pytest.param({**OBJECT, "properties": {"v": False}}, {}, None, id="false-schema-absent"),
    # allOf, anyOf, oneOf and not, with what each says when it refuses.
    pytest.param(one_property({"allOf": [{"minimum": 1}, {"maximum": 3}]}), {"v": 3}, None,
                 id="allOf-accepts"),
    pytest.param(one_property({"allOf": [{"minimum": 1}, {"maximum": 3}]}), {"v": 4},
                 ("$.v must be at most 3, got 4",), id="allOf-refuses"),
    *[pytest.param(one_property({"anyOf": [{"type": "integer"}, {"type": "null"}]}), {"v": value},
                   None, id=f"anyOf-accepts-{value}") for value in (1, None)],
    pytest.param(one_property({"anyOf": [{"type": "integer"}, {"type": "null"}]}), {"v": "x"},
                 ("$.v matches no schema of anyOf: $.v must be integer, got string; "
                  "$.v must be null, got string",), id="anyOf-refuses-naming-each-problem"),
    *[pytest.param(one_property({"oneOf": [{"type": "integer"}, {"minimum": 0}]}), {"v": value},
                   None, id=f"oneOf-one-match-{value}") for value in (-1, 0.5, "x")],
    pytest.param(one_property({"oneOf": [{"type": "integer"}, {"minimum": 0}]}), {"v": 1},
                 ("$.v matches 2 schemas of oneOf, not exactly one",), id="oneOf-two-matches"),
    pytest.param(one_property({"oneOf": [{"type": "integer"}, {"type": "string"}]}), {"v": None},
                 ("$.v matches no schema of oneOf",), id="oneOf-no-match"),
    pytest.param(one_property({"not": {"type": "null"}}), {"v": 1}, None, id="not-accepts"),
    pytest.param(one_property({"not": {"type": "null"}}), {"v": None},
                 ("$.v must not match the schema of not",), id="not-refuses"),
    # Where a schema holds a keyword the loop does not enforce, a value may match a schema
    # here that JSON Schema would not match: so that the loop never refuses what JSON Schema
    # accepts, such a match fails neither not nor oneOf.
    pytest.param(one_property({"not": {"type": "string", "pattern": "^a"}}), {"v": "xyz"}, None,
                 id="not-beside-an-unenforced-keyword"),
    pytest.param(one_property({"oneOf": [{"type": "string"}, {"pattern": "^a"}]}), {"v": "xyz"},
                 None, id="oneOf-beside-an-unenforced-keyword"),
    pytest.param({**one_property({"not": {"$ref": "#/default"}}),
                  "default": {"type": "string", "pattern": "^a"}}, {"v": "xyz"}, None,
                 id="not-through-a-ref-into-an-annotation"),
    # if/then/else: then applies where if matches, else where it does not; an if whose
    # subschema the engine does not enforce in full picks no branch alone.
    *[pytest.param(one_property({"if": {"type": "integer"}, "then": {"minimum": 0},
                                 "else": {"type": "string"}}), {"v": value},
                   None if words is None else (words,), id=f"if-then-else-{value!r}")
      for value, words in ((1, None), (-1, "$.v must be at least 0, got -1"), ("x", None),
                           (None, "$.v must be string, got null"))],
    pytest.param(one_property({"then": False}), {"v": 1}, None, id="then-without-if"),
    pytest.param(one_property({"if": {"pattern": "^a"}, "then": False}), {"v": "b"}, None,
                 id="if-beside-an-unenforced-keyword-picks-no-branch"),
    pytest.param(one_property({"if": {"pattern": "^a"}, "then": False, "else": False}),
                 {"v": "b"}, ("$.v is not allowed",), id="if-both-branches-refuse"),
    # Bounds take an integral float, as 2020-12 does.
    *[pytest.param(one_property({keyword: 2.0}), {"v": value},
                   None if passes else ("$.v must have at least 2.0",),
                   id=f"{keyword}-2.0-{passes}")
      for keyword, at_limit, under in (("minLength", "ab", "a"), ("minItems", [1, 2], [1]),
                                       ("minProperties", {"a": 1, "b": 2}, {"a": 1}))
      for value, passes in ((at_limit, True), (under, False))],
    # Keywords the loop does not enforce are the tool's own business.
    *[pytest.param(one_property(schema), {"v": value}, None,
                   id=f"{next(iter(schema))}-not-enforced")
      for schema, value in (({"pattern": "^a"}, "b"), ({"format": "email"}, "x"),
                            ({"multipleOf": 2}, 3), ({"uniqueItems": True}, [1, 1]),
                            ({"contains": {"type": "string"}}, [1]),
                            ({"x-vendor": {"type": "null"}}, 1))],
    # $ref within the schema: to $defs and definitions (names escaped as a JSON pointer), to
    # the root (recursion), to any schema of the document, beside other keywords.
    pytest.param(DEFINED, {"v": 1, "w": "a"}, None, id="ref-accepts"),
    pytest.param(DEFINED, {"v": 0, "w": "a"}, ("$.v must be at least 1, got 0",),
                 id="ref-to-defs-refuses"),
    pytest.param(DEFINED, {"v": 1, "w": 2}, ("$.w must be string, got integer",),
                 id="ref-to-definitions-with-escapes-refuses"),
    pytest.param(DEFINED, {"v": 5, "w": "a"}, ("$.v must be at most 4, got 5",),
                 id="ref-beside-another-keyword"),
    pytest.param(DEFINED, {"v": 1, "w": "a", "x": "b"}, None, id="ref-to-a-property-accepts"),
    pytest.param(DEFINED, {"v": 1, "w": "a", "x": 2}, ("$.x must be string, got integer",),
                 id="ref-to-a-property-refuses"),
    pytest.param(DEFINED, {"v": 1, "w": "a", "y": True}, None, id="ref-through-an-array"),
    pytest.param(DEFINED, {"v": 1, "w": "a", "y": None}, ("$.y must be boolean, got null",),
                 id="ref-through-an-array-refuses"),
    pytest.param(TREE, {"name": "a", "children": [{"name": "b", "children": [{"name": "c"}]}]},
                 None, id="ref-to-the-root-accepts"),
    pytest.param(TREE, {"name": "a", "children": [{"name": "b", "children": [{"name": 3}]}]},
                 ("$.children[0].children[0].name must be string, got integer",),
                 id="ref-to-the-root-refuses-deep-down"),
    # A $ref that leads back to itself without descending into the value never ends in JSON
    # Schema: the call is refused, and the tool does not run.
    pytest.param({**OBJECT, "$ref": "#"}, {}, ("$ cannot be checked: its schema nests too deep, "
                                               "or its $refs loop",), id="ref-loop"),
    # anyOf stops at its first match, as JSON Schema's validators do: the loop after it is
    # never reached.
    pytest.param(one_property({"anyOf": [{"type": "integer"}, {"$ref": "#/properties/v"}]}),
                 {"v": 1}, None, id="anyOf-stops-at-its-first-match"),
    pytest.param(one_property({"anyOf": [{"type": "integer"}, {"$ref": "#/properties/v"}]}),
                 {"v": "x"}, ("$ cannot be checked",), id="anyOf-goes-on-to-the-loop"),
]  # fmt: skip
"""(parameters, arguments, None if accepted, else the words the error result names)."""


def ok(arguments: Dict[str, Any], signal: al.Signal) -> object:
    return "ok"


def probe_with(parameters: Any) -> Callable[[], object]:
    """Builds a probe Tool with these parameters."""
    return lambda: al.Tool("probe", "A tool.", parameters, ok)


NO_ARRAYS_OF_SCHEMAS: tuple[Any, ...] = ([], {}, "x")
CANNOT_CALL = "cannot be called as execute(arguments, signal); give it two positional parameters"
ROOT_NOT_AN_OBJECT = (
    'Tool \'probe\' parameters must have "type": "object": a tool\'s arguments are always a '
    "JSON object"
)


# What Tool and ToolSpec refuse when they are built, and the words of the
# error that tell the row from the others.
REFUSED_TOOLS: dict[str, tuple[Callable[[], object], type[Exception], str]] = {
    # The three shapes of a root that is no object schema get one message.
    "root-string": (probe_with({"type": "string"}), ValueError, ROOT_NOT_AN_OBJECT),
    "root-without-type": (probe_with({}), ValueError, ROOT_NOT_AN_OBJECT),
    "root-properties-only": (probe_with({"properties": {}}), ValueError, ROOT_NOT_AN_OBJECT),
    "root-type-list": (probe_with({"type": ["object", "null"]}), ValueError, ROOT_NOT_AN_OBJECT),
    "root-true": (probe_with(True), ValueError, ROOT_NOT_AN_OBJECT),
    "parameters-list": (probe_with([]), TypeError,
                        "Tool 'probe' parameters must be a JSON Schema object, got list"),
    "parameters-str": (probe_with("object"), TypeError,
                       "Tool 'probe' parameters must be a JSON Schema object, got str"),
    "parameters-None": (probe_with(None), TypeError,
                        "Tool 'probe' parameters must be a JSON Schema object, got NoneType"),
    # A malformed value of a keyword the loop enforces, named by its path.
    **{f"type-{value}": (probe_with(one_property({"type": value})), ValueError,
                         "parameters.properties.v.type must be one of object, string, number, "
                         "integer, boolean, array, null, or a non-empty array of distinct ones, "
                         f"got {value!r}")
       for value in ("float", "Integer", 5, None, [], ["string", "string"], ["float"],
                     ["integer", None])},
    "required-str": (probe_with({**OBJECT, "required": "left"}), ValueError,
                     "parameters.required must be an array of property names, got 'left'"),
    "required-int": (probe_with({**OBJECT, "required": [1]}), ValueError,
                     "parameters.required must be an array of property names, got [1]"),
    "additional-str": (probe_with({**OBJECT, "additionalProperties": "no"}), TypeError,
                       "parameters.additionalProperties must be a JSON Schema object, got str"),
    "enum-str": (probe_with({**OBJECT, "enum": "a"}), ValueError,
                 "parameters.enum must be an array, got 'a'"),
    "enum-nan": (probe_with({**OBJECT, "enum": [float("nan")]}), TypeError,
                 "parameters.enum[0] holds nan, which is not JSON"),
    "const-set": (probe_with(one_property({"const": {1}})), TypeError,
                  "parameters.properties.v.const holds {1}, which is not JSON"),
    "properties-list": (probe_with({**OBJECT, "properties": []}), ValueError,
                        "parameters.properties must be an object of schemas, got []"),
    "defs-list": (probe_with({**OBJECT, "$defs": []}), ValueError,
                  "parameters.$defs must be an object of schemas, got []"),
    "property-not-a-schema": (probe_with({**OBJECT, "properties": {"n": "int"}}), TypeError,
                              "parameters.properties.n must be a JSON Schema object, got str"),
    "items-str": (probe_with(one_property({"type": "array", "items": "int"})), TypeError,
                  "parameters.properties.v.items must be a JSON Schema object, got str"),
    "not-None": (probe_with(one_property({"not": None})), TypeError,
                 "parameters.properties.v.not must be a JSON Schema object, got NoneType"),
    **{f"{keyword}-{value!r}": (probe_with(one_property({keyword: value})), ValueError,
                                f"parameters.properties.v.{keyword} must be a non-empty array "
                                f"of schemas, got {value!r}")
       for keyword in ("anyOf", "oneOf", "allOf") for value in NO_ARRAYS_OF_SCHEMAS},
    "anyOf-member-str": (probe_with(one_property({"anyOf": [{}, "x"]})), TypeError,
                         "parameters.properties.v.anyOf[1] must be a JSON Schema object, got str"),
    **{f"{keyword}-{value!r}": (probe_with(one_property({keyword: value})), ValueError,
                                f"parameters.properties.v.{keyword} must be a number, "
                                f"got {value!r}")
       for keyword in ("minimum", "exclusiveMaximum")
       for value in ("5", True, None, float("nan"), float("inf"), [1])},
    **{f"{keyword}-{value!r}": (probe_with(one_property({keyword: value})), ValueError,
                                f"parameters.properties.v.{keyword} must be a non-negative "
                                f"integer, got {value!r}")
       for keyword in ("minLength", "maxItems", "minProperties")
       for value in (-1, -1.0, 1.5, True, "2")},
    # A $ref names a schema within the same document, once it is all read.
    **{f"ref-{ref!r}": (probe_with(one_property({"$ref": ref})), ValueError,
                        f"parameters.properties.v.$ref must be a URI reference, got {ref!r}")
       for ref in (5, None)},
    **{f"ref-{ref}-to-another-document": (
           probe_with(one_property({"$ref": ref})), ValueError,
           f"parameters.properties.v.$ref {ref!r} names nothing in this schema (a $ref to "
           "another document is not followed)")
       for ref in ("other.json#/$defs/a", "$defs/a", "urn:example:other#/properties/v",
                   "#b", "n.json#a")},
    **{f"{keyword}-{value!r}": (probe_with(one_property({keyword: value})), ValueError,
                                f"parameters.properties.v.{keyword} must be {words}, "
                                f"got {value!r}")
       for keyword, words, values in (
           ("$id", "a URI reference without a fragment", (5, "n.json#a")),
           ("$anchor", "a plain name (a letter or _, then letters, digits, '-', '_' or '.')",
            ("1a", "a b", "")))
       for value in values},
    **{f"ref-{ref}-unresolved": (probe_with(one_property({"$ref": ref})), ValueError,
                                 f"parameters.properties.v.$ref {ref!r} names nothing in this "
                                 "schema")
       for ref in ("#/$defs/Missing", "#/properties/w", "#/properties/v/x", "#/required/1",
                   "#/required/01x")},
    "ref-escaped-unresolved": (probe_with({**DEFINED, "properties": {"w": {"$ref": "#/$defs/a/b"}},
                                           "$defs": {"a/b": {}}}), ValueError,
                               "parameters.properties.w.$ref '#/$defs/a/b' names nothing"),
    **{f"ref-to-no-schema-{ref}": (probe_with({**one_property({"$ref": ref, "items": [{}]}),
                                               "x-list": [1]}), TypeError,
                                   f"parameters.properties.v.$ref {ref!r} must be a JSON Schema "
                                   "object, got tuple")
       for ref in ("#/required", "#/properties/v/items", "#/x-list")},
    # A $ref into JSON that no other keyword reads as a schema: what it names is checked.
    "ref-to-a-malformed-schema": (probe_with({**one_property({"$ref": "#/x-defs/a"}),
                                              "x-defs": {"a": {"minimum": "1"}}}), ValueError,
                                  "parameters.properties.v.$ref '#/x-defs/a'.minimum must be a "
                                  "number, got '1'"),
    # Every part of a schema is JSON, keys included, whether the loop enforces it or not.
    "key-int": (probe_with({**OBJECT, 1: "x"}), TypeError,
                "Tool 'probe' parameters has an int key 1"),
    "property-key-int": (probe_with({**OBJECT, "properties": {1: {}}}), TypeError,
                         "Tool 'probe' parameters.properties has an int key 1"),
    "annotation-set": (probe_with({**OBJECT, "default": {1, 2}}), TypeError,
                       "Tool 'probe' parameters.default holds {1, 2}, which is not JSON"),
    "annotation-nan": (probe_with(one_property({"examples": [float("nan")]})), TypeError,
                       "parameters.properties.v.examples[0] holds nan, which is not JSON"),
    "annotation-key-int": (probe_with({**OBJECT, "x-vendor": {"a": {2: 3}}}), TypeError,
                           "parameters.x-vendor.a has an int key 2"),
    "name-empty": (lambda: al.Tool("", "A tool.", OBJECT, ok), TypeError,
                   "Tool name must be a non-empty str, got ''"),
    "name-int": (lambda: untyped.Tool(1, "A tool.", OBJECT, ok), TypeError,
                 "Tool name must be a non-empty str, got 1"),
    "name-None": (lambda: untyped.Tool(None, "A tool.", OBJECT, ok), TypeError,
                  "Tool name must be a non-empty str, got None"),
    "description-None": (lambda: untyped.Tool("t", None, OBJECT, ok), TypeError,
                         "Tool 't': description must be a str, got NoneType"),
    "execute-str": (lambda: untyped.Tool("t", "A tool.", OBJECT, "ok"), TypeError,
                    "Tool 't': execute must be callable, got str"),
    # An execute that cannot be called as execute(arguments, signal) is refused, not a
    # recoverable "raised TypeError" that hides the bug.
    "execute-of-one": (lambda: untyped.Tool("t", "d", OBJECT, lambda arguments: "one"), TypeError,
                       CANNOT_CALL),
    "execute-of-three": (lambda: untyped.Tool("t", "d", OBJECT, lambda arguments, signal,
                                              extra: "three"), TypeError,
                         CANNOT_CALL),
    "execute-keyword-only": (lambda: untyped.Tool("t", "d", OBJECT, lambda *, arguments,
                                                  signal: "keyword"), TypeError,
                             CANNOT_CALL),
    # ToolSpec's docstring: "Checked as a Tool is (TypeError or ValueError naming the field)".
    "spec-bogus-type-read-only": (lambda: al.ToolSpec("x", "d", MappingProxyType({"type": "b"})),
                                  ValueError, "ToolSpec 'x' parameters.type must be one of"),
    "spec-ref-unresolved": (lambda: al.ToolSpec("x", "d", {**OBJECT, "$ref": "#/a"}),
                            ValueError, "ToolSpec 'x' parameters.$ref '#/a' names nothing"),
    "spec-root-string": (lambda: al.ToolSpec("x", "d", {"type": "string"}), ValueError,
                         "ToolSpec 'x' parameters must have \"type\""),
    "spec-name-empty": (lambda: al.ToolSpec("", "d", OBJECT), TypeError,
                        "ToolSpec name must be a non-empty str, got ''"),
    "spec-name-int": (lambda: untyped.ToolSpec(1, "d", OBJECT), TypeError,
                      "ToolSpec name must be a non-empty str, got 1"),
    "spec-description-None": (lambda: untyped.ToolSpec("x", None, OBJECT), TypeError,
                              "ToolSpec 'x': description must be a str, got NoneType"),
}  # fmt: skip


class TestToolSchemas:
    """A tool's parameters are a JSON Schema, enforced with JSON Schema 2020-12's meaning of
    the keywords the loop knows; bool is no number, an integer no float. Failures are
    recoverable results; a malformed schema is refused when the tool is built."""

    @pytest.mark.parametrize(("parameters", "arguments", "rejected"), SCHEMA_CASES)
    def test_arguments_are_checked_against_the_schema(
        self, parameters: Any, arguments: Any, rejected: tuple[str, ...] | None
    ) -> None:
        """Accepted arguments reach the tool exactly; a rejection names the path and problem."""
        received: list[dict[str, Any]] = []
        registry = al.ToolRegistry([probe_tool(received, parameters)])
        result = al.execute_tool_call(registry, call("probe", "c1", arguments), threading.Event())
        assert (result.id, result.tool_call_id) == ("tool-result-c1", "c1")
        if rejected is None:
            assert (result.content, result.is_error) == ("ok", False)
            assert len(received) == 1
            assert same_json(received[0], arguments)
            return
        assert result.is_error is True
        assert received == []
        for word in ("probe", *rejected):
            assert word in result.content

    @pytest.mark.parametrize(
        ("build", "error", "words"), REFUSED_TOOLS.values(), ids=list(REFUSED_TOOLS)
    )
    def test_a_bad_tool_is_refused_when_it_is_built(
        self, build: Callable[[], object], error: type[Exception], words: str
    ) -> None:
        """A keyword the loop would ignore, or a malformed field, fails the build, named."""
        with pytest.raises(error) as raised:
            build()
        assert words in str(raised.value)

    @pytest.mark.parametrize("through", ["object", "array"])
    @pytest.mark.parametrize("passes", [AT_LIMIT, OVER_LIMIT])
    def test_schema_depth(self, engine: str, passes: bool, through: str) -> None:
        """A schema nests as deep as arguments can (32 containers); one more is a ValueError."""
        schema: dict[str, Any] = {"type": "integer"}
        for _ in range(31 if passes else 32):
            if through == "object":
                schema = {"type": "object", "properties": {"k": schema}, "required": ["k"]}
            else:
                schema = {"type": "array", "items": schema}
        schema = {"type": "object", "properties": {"k": schema}, "required": ["k"]}
        if not passes:
            with pytest.raises(ValueError, match=r" nests deeper than 32 levels$"):
                al.Tool("probe", "A tool.", schema, ok)
            return
        arguments = {"k": nested(31, through)}
        received: list[dict[str, Any]] = []
        registry = al.ToolRegistry([probe_tool(received, schema)])
        result = al.execute_tool_call(registry, call("probe", "c1", arguments), threading.Event())
        assert (result.content, received) == ("ok", [arguments])

    @pytest.mark.parametrize("keyword", ["default", "enum"])
    @pytest.mark.parametrize("passes", [AT_LIMIT, OVER_LIMIT])
    def test_an_annotation_nests_as_deep_as_arguments_may(
        self, engine: str, passes: bool, keyword: str
    ) -> None:
        """The JSON a keyword holds (an annotation, an enum member; a const too) counts with
        the schema that holds it: at the root, 32 nested containers pass, 33 are a ValueError."""
        member = nested(32 if passes else 33)
        schema = {"type": "object", keyword: [member] if keyword == "enum" else member}
        if not passes:
            with pytest.raises(
                ValueError,
                match=rf"parameters\.{keyword}(\[0\])?(\.k\[0\])+ nests deeper than 32 levels$",
            ):
                al.Tool("probe", "A tool.", schema, ok)
            return
        assert plain_copy(al.Tool("probe", "A tool.", schema, ok).parameters) == schema

    def test_a_tool_s_spec_is_its_name_description_and_parameters(self) -> None:
        assert add_tool().spec() == al.ToolSpec("add", "Adds two numbers.", NUMBERS)

    def test_parameters_are_frozen(self) -> None:
        """Mutating the original dict after construction changes nothing of the tool."""
        parameters: dict[str, Any] = copy.deepcopy(NUMBERS)
        tool = al.Tool("add", "Adds.", parameters, ok)
        parameters["required"].append("third")
        parameters["properties"]["left"]["type"] = "string"
        parameters["additionalProperties"] = True
        assert plain_copy(tool.parameters) == plain_copy(tool.spec().parameters) == NUMBERS
        with pytest.raises(TypeError):
            tool.parameters["type"] = "string"  # type: ignore[index]
        with pytest.raises(TypeError):
            tool.parameters["properties"]["left"] = {}
        _, result, _ = run(one_call("add", {"left": 1, "right": 2, "third": 3}), [tool])
        assert "unexpected property 'third'" in only_tool_result(result).content


# --- The schema keywords against jsonschema ----------------------------------------------

TYPE_NAMES = ("object", "string", "number", "integer", "boolean", "array", "null")
NAMES = ("a", "b", "c")
# The keywords docs/schemas.md says the core enforces alone, and those it says need
# agent_loop_schema.py ($defs and definitions are where the cases keep their schemas).
CORE = ("type", "properties", "required", "additionalProperties", "items", "enum")
ENGINE = ("const", "anyOf", "oneOf", "allOf", "not", "if", "then", "else", "$ref", "minimum",
    "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "minItems",
    "maxItems", "minProperties", "maxProperties")  # fmt: skip
# Annotations, and a keyword 2020-12 does not define: they switch nothing off.
ANNOTATIONS = ("format", "title", "default", "examples", "x-vendor")
UNENFORCED = ("pattern", "multipleOf", "uniqueItems", "prefixItems", "contains",
    "patternProperties", "propertyNames", "dependentRequired", "dependentSchemas",
    "unevaluatedProperties", "unevaluatedItems")  # fmt: skip


def random_value(rng: random.Random, depth: int = 0) -> Any:
    """A small JSON value. Floats are never integral: JSON Schema calls 1.0 an integer and
    equal to 1, and the loop deliberately does not (tested apart, on both sides)."""
    roll = rng.random()
    if depth >= 3 or roll < 0.5:
        scalars = [None, True, False, rng.randint(-3, 3), rng.randint(-3, 2) + 0.5,
                   rng.choice(["", "x", "xy", "\U0001f600", "abc"])]  # fmt: skip
        return rng.choice(scalars)
    if roll < 0.75:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {name: random_value(rng, depth + 1) for name in rng.sample(NAMES, rng.randint(0, 3))}


def random_schema(
    rng: random.Random,
    depth: int,
    refs: list[str],
    keywords: tuple[str, ...],
    extra: tuple[str, ...] = (),
) -> Any:
    """A schema of a few random keywords (and often one of ``extra``), nested a few levels.
    refs are the $refs it may use: each leads to a schema that descends into the value
    before it refers back (no ref loops in place)."""
    if depth >= 3 or rng.random() < 0.15:
        return rng.choice([True, False, {}, {"type": rng.choice(TYPE_NAMES)}])
    chosen = rng.sample([*keywords, "type"], rng.randint(1, 3))
    if extra and rng.random() < 0.5:  # often, so that not, oneOf and if meet them
        chosen.append(rng.choice(extra))
    if refs and rng.random() < 0.3:  # often, so that each form of $ref is met
        chosen.append("$ref")
    schema: dict[str, Any] = {}
    for keyword in chosen:

        def inner(refs: list[str] = refs) -> Any:
            return random_schema(rng, depth + 1, refs, keywords, extra)

        # Within a property or an item, the schema's resource may come back ("" is "#").
        deeper = [*refs, rng.choice(["#", ""])] if "$ref" in keywords else refs
        if keyword == "type":
            schema[keyword] = (rng.choice(TYPE_NAMES) if rng.random() < 0.5
                               else rng.sample(TYPE_NAMES, rng.randint(1, 3)))  # fmt: skip
        elif keyword in ("properties", "patternProperties", "dependentSchemas"):
            schema[keyword] = {
                name: inner(deeper) for name in rng.sample(NAMES, rng.randint(0, 3))
            }
        elif keyword in ("required", "dependentRequired"):
            names = rng.sample(NAMES, rng.randint(0, 2))
            schema[keyword] = names if keyword == "required" else {"a": names}
        elif keyword in ("items", "additionalProperties", "contains", "unevaluatedItems",
                         "unevaluatedProperties", "propertyNames"):  # fmt: skip
            schema[keyword] = rng.choice([True, False, inner(deeper)])
        elif keyword in ("allOf", "anyOf", "oneOf", "prefixItems"):
            schema[keyword] = [inner() for _ in range(rng.randint(1, 3))]
        elif keyword in ("not", "if", "then", "else"):
            schema[keyword] = inner()
        elif keyword in ("enum", "examples"):
            schema[keyword] = [random_value(rng, 2) for _ in range(rng.randint(1, 3))]
        elif keyword in ("const", "default", "x-vendor"):
            schema[keyword] = random_value(rng, 2)
        elif keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            schema[keyword] = rng.choice([rng.randint(-3, 3), rng.randint(-3, 2) + 0.5])
        elif keyword.startswith(("min", "max")):  # 2020-12 takes an integral float as a count
            schema[keyword] = rng.choice([int, float])(rng.randint(0, 3))
        elif keyword == "$ref" and refs:
            schema[keyword] = rng.choice(refs)
        elif keyword in ("pattern", "format", "title"):
            schema[keyword] = {"pattern": "^x", "format": "date", "title": "T"}[keyword]
        elif keyword in ("multipleOf", "uniqueItems"):
            schema[keyword] = 2 if keyword == "multipleOf" else True
    return schema


# Names of $defs that a JSON pointer escapes (~1, ~0) and a URI fragment percent-encodes.
DEF_NAMES = ("D0", "a/b", "t~x", "s p", "p%41")
ROOT_ID = "https://example.com/schemas/probe.json"


def random_refs(
    rng: random.Random,
    index: int,
    name: str,
    place: dict[str, Any],
    root_id: str | None,
    in_root: bool,
) -> list[str]:
    """The $refs that name ``$defs/name`` from a schema in the root's resource (in_root) or
    in a $def with an $id of its own, in each way JSON Schema reads alike: a pointer alone
    or after the root's $id (absolute or relative), its characters but the first "/"
    percent-encoded or not (a "%" always); the $def's own $id; its $anchor."""
    pointer = "$defs/" + name.replace("~", "~0").replace("/", "~1")
    fragment = "/" + "".join(
        f"%{ord(char):02X}" if char == "%" or rng.random() < 0.2 else char for char in pointer
    )
    prefixes = [*([""] if in_root else []), *([root_id, "probe.json"] if root_id else [])]
    refs = [rng.choice(prefixes) + "#" + fragment] if prefixes else []
    uri = place.get("$id")
    if uri is not None:
        refs.append(rng.choice([uri, uri + "#"]))
    if "$anchor" in place:
        refs.extend(
            f"{prefix}#{place['$anchor']}"
            for prefix in (
                [uri] if uri else [*([""] if in_root else []), *([root_id] if root_id else [])]
            )
        )
    return refs


def random_case(
    seed: int,
    keywords: tuple[str, ...] = (*CORE, *ENGINE, *ANNOTATIONS),
    extra: tuple[str, ...] = (),
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Parameters whose property v has a random schema, with a few $defs (each may refer to
    the later ones; some with an $id of their own, whose "#" is their own, and an $anchor)
    and an $id or not, and arguments to check against them."""
    rng = random.Random(seed)
    root_id = rng.choice([None, ROOT_ID])
    names = rng.sample(DEF_NAMES, rng.randint(0, 3) if "$ref" in keywords else 0)
    places: dict[str, dict[str, Any]] = {}
    for index, name in enumerate(names):
        place: dict[str, Any] = {}
        if rng.random() < 0.4:  # relative to the root's base, or absolute
            place["$id"] = rng.choice(
                [f"n{index}.json", *([f"{ROOT_ID[:-10]}n{index}.json"] if root_id else [])]
            )
        if rng.random() < 0.3:
            place["$anchor"] = f"a{index}"
        places[name] = place
    defs = {}
    for index, name in enumerate(names):
        place = places[name]
        own = place.get("$id") is not None
        refs = [
            ref
            for later in names[index + 1 :]
            for ref in random_refs(rng, index, later, places[later], root_id, not own)
        ]
        if own and rng.random() < 0.5:  # a $defs of its own, which its "#/$defs/D0" names
            place["$defs"] = {"D0": random_schema(rng, 2, [], keywords, extra)}
            refs.append("#/$defs/D0")
        body = random_schema(rng, 1, refs, keywords, extra)
        defs[name] = {**(body if isinstance(body, dict) else {"allOf": [body]}), **place}
    refs = [
        ref
        for index, name in enumerate(names)
        for ref in random_refs(rng, index, name, places[name], root_id, True)
    ]
    v = random_schema(rng, 1, refs, keywords, extra)
    parameters = {"type": "object", "properties": {"v": v}, "required": ["v"], "$defs": defs}
    if root_id is not None:
        parameters["$id"] = root_id
    return parameters, [{"v": random_value(rng)} for _ in range(6)]


def judges(parameters: Mapping[str, Any]) -> tuple[Callable[[Any], bool], Callable[[Any], bool]]:
    """Whether JSON Schema accepts arguments for these parameters, and whether the loop runs
    a tool with these parameters for them."""
    received: list[dict[str, Any]] = []
    registry = al.ToolRegistry([probe_tool(received, parameters)])

    def loop_accepts(arguments: Any) -> bool:
        received.clear()
        result = al.execute_tool_call(registry, call("probe", "c", arguments), threading.Event())
        assert result.is_error is (received == [])  # a refusal never runs the tool
        return not result.is_error

    return jsonschema.Draft202012Validator(parameters).is_valid, loop_accepts


def agreement(
    seeds: range,
    keywords: tuple[str, ...] = (*CORE, *ENGINE, *ANNOTATIONS),
    extra: tuple[str, ...] = (),
) -> set[tuple[bool, bool]]:
    """The pairs (JSON Schema accepts, the loop accepts) met on the random cases of these
    seeds; a case that disagrees (or a valid schema refused) fails, named by its seed."""
    verdicts = set()
    for seed in seeds:
        parameters, arguments = random_case(seed, keywords, extra)
        json_schema_accepts, loop_accepts = judges(parameters)
        for each in arguments:
            verdict = json_schema_accepts(each), loop_accepts(each)
            assert verdict in (
                (True, True),
                (False, False),
                *([(False, True)] if extra else []),
            ), (seed, parameters, each)
            verdicts.add(verdict)
    return verdicts


def loop_accepts(parameters: Mapping[str, Any], arguments: dict[str, Any]) -> bool:
    return judges(parameters)[1](arguments)


def json_schema_accepts(parameters: Mapping[str, Any], arguments: dict[str, Any]) -> bool:
    return judges(parameters)[0](arguments)


# Schemas as pydantic 2 writes them for a function's parameters (the official MCP SDK's
# FastMCP does so): titles everywhere, defaults, optionals as anyOf with null, nested models
# in $defs, bounds, enums, arrays of objects; and arguments on each side of each rule.
ADDRESS = {"properties": {"street": {"title": "Street", "type": "string", "minLength": 1},
    "zip": {"maxLength": 5, "minLength": 5, "title": "Zip", "type": "string"}},
    "required": ["street", "zip"], "title": "Address", "type": "object"}  # fmt: skip
LINE = {"properties": {"sku": {"title": "Sku", "type": "string"},
    "quantity": {"default": 1, "exclusiveMinimum": 0, "maximum": 100, "title": "Quantity",
                 "type": "integer"}},
    "required": ["sku"], "title": "Line", "type": "object"}  # fmt: skip
ORDER = {"$defs": {"Address": ADDRESS, "Line": LINE},
    "properties": {
        "customer": {"title": "Customer", "type": "string", "description": "Who orders."},
        "note": {"anyOf": [{"type": "string", "maxLength": 20}, {"type": "null"}],
                 "default": None, "title": "Note"},
        "priority": {"default": "low", "enum": ["low", "high"], "title": "Priority",
                     "type": "string"},
        "ship_to": {"$ref": "#/$defs/Address"},
        "bill_to": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}], "default": None},
        "lines": {"items": {"$ref": "#/$defs/Line"}, "minItems": 1, "title": "Lines",
                  "type": "array"},
        "discount": {"anyOf": [{"type": "number", "minimum": 0, "maximum": 0.5},
                               {"type": "null"}], "default": None, "title": "Discount"},
        "tags": {"default": [], "items": {"type": "string"}, "title": "Tags", "type": "array"},
        "gift": {"default": False, "title": "Gift", "type": "boolean"},
    },
    "required": ["customer", "ship_to", "lines"], "title": "place_orderArguments",
    "type": "object"}  # fmt: skip
NODE = {"$defs": {"Node": {"properties": {"name": {"title": "Name", "type": "string"},
    "children": {"default": [], "items": {"$ref": "#/$defs/Node"}, "title": "Children",
                 "type": "array"}}, "required": ["name"], "title": "Node", "type": "object"}},
    "properties": {"tree": {"$ref": "#/$defs/Node"}}, "required": ["tree"],
    "title": "walkArguments", "type": "object"}  # fmt: skip
HOME = {"street": "1 Main St", "zip": "12345"}
ONE_LINE = [{"sku": "a"}]
PYDANTIC_CASES = [
    # (parameters, arguments, whether both accept them), on each side of each rule.
    pytest.param(ORDER, {"customer": "Ann", "ship_to": HOME, "lines": ONE_LINE}, True,
                 id="required-only"),
    pytest.param(ORDER, {"customer": "Ann", "ship_to": HOME,
                         "lines": [{"sku": "a", "quantity": 100}], "note": None, "bill_to": None,
                         "discount": None, "tags": [], "gift": True}, True,
                 id="optionals-null-and-at-the-limits"),
    pytest.param(ORDER, {"customer": "Ann", "ship_to": HOME, "lines": ONE_LINE, "note": "x" * 20,
                         "bill_to": {**HOME}, "discount": 0.5, "priority": "high"}, True,
                 id="optionals-given-at-the-limits"),
    pytest.param(ORDER, {"customer": "Ann", "ship_to": HOME, "lines": ONE_LINE, "note": "x" * 21},
                 False, id="optional-over-maxLength"),
    pytest.param(ORDER, {"customer": "Ann", "ship_to": HOME, "lines": ONE_LINE, "discount": 0.51},
                 False, id="optional-over-maximum"),
    pytest.param(ORDER, {"customer": "Ann", "ship_to": HOME, "lines": ONE_LINE, "discount": -1},
                 False, id="optional-under-minimum"),
    pytest.param(ORDER, {"customer": "Ann", "ship_to": HOME,
                         "lines": [{"sku": "a", "quantity": 0}]}, False,
                 id="nested-exclusiveMinimum"),
    pytest.param(ORDER, {"customer": "Ann", "ship_to": HOME,
                         "lines": [{"sku": "a", "quantity": 101}]}, False, id="nested-maximum"),
    pytest.param(ORDER, {"customer": "Ann", "ship_to": HOME, "lines": []}, False,
                 id="minItems"),
    pytest.param(ORDER, {"customer": "Ann", "ship_to": {"street": "x", "zip": "1234"},
                         "lines": ONE_LINE}, False, id="ref-minLength"),
    pytest.param(ORDER, {"customer": "Ann", "ship_to": HOME, "bill_to": {"street": ""},
                         "lines": ONE_LINE}, False, id="optional-ref-required"),
    pytest.param(ORDER, {"customer": "Ann", "ship_to": HOME, "lines": ONE_LINE,
                         "priority": "urgent"}, False, id="enum"),
    pytest.param(ORDER, {"customer": None, "ship_to": HOME, "lines": ONE_LINE}, False,
                 id="null-for-a-required-str"),
    pytest.param(ORDER, {"ship_to": HOME, "lines": ONE_LINE}, False, id="required-missing"),
    pytest.param(ORDER, {"customer": "Ann", "ship_to": HOME, "lines": ONE_LINE, "tags": ["x", 1]},
                 False, id="array-items"),
    pytest.param(NODE, {"tree": {"name": "a", "children": [{"name": "b",
                                                             "children": [{"name": "c"}]}]}},
                 True, id="recursive-model"),
    pytest.param(NODE, {"tree": {"name": "a", "children": [{"name": "b",
                                                             "children": [{"name": 1}]}]}},
                 False, id="recursive-model-deep-down"),
    pytest.param(NODE, {"tree": {"children": []}}, False, id="recursive-model-required"),
]  # fmt: skip


# The issue's four cases of $ref resolution (JSON Schema 2020-12, Core 8.2 and 9.2; RFC 6901,
# section 6), as parameters and arguments on each side.
PERCENT_DEFS = {"$defs": {"A": {"type": "string"}, "xA": {"type": "integer"},
                          "x%41": {"type": "boolean"}, "a b": {"type": "null"}}}  # fmt: skip
FOLLOWED_REFS = [
    # A pointer in a $ref is percent-decoded before its ~1 and ~0 are.
    pytest.param({**one_property({"$ref": "#/$defs/%41"}), **PERCENT_DEFS},
                 [{"v": "a"}, {"v": 1}], id="percent-encoded-A-names-A"),
    pytest.param({**one_property({"$ref": "#/$defs/x%41"}), **PERCENT_DEFS},
                 [{"v": 1}, {"v": True}], id="x%41-names-xA-not-x%41"),
    pytest.param({**one_property({"$ref": "#/$defs/a%20b"}), **PERCENT_DEFS},
                 [{"v": None}, {"v": "a"}], id="a-space"),
    # "" is the current document, as "#" is.
    pytest.param({"type": "object", "properties": {"v": {"type": "integer"},
                  "w": {"type": "object", "$ref": ""}}},
                 [{"v": 1, "w": {"v": 2}}, {"v": 1, "w": {"v": "2"}}], id="empty-ref-is-the-root"),
    # The root's own $id, with a pointer or without, and a relative reference to it.
    *[pytest.param({"$id": ROOT_ID, "$defs": {"A": {"type": "string"}},
                    "type": "object", "properties": {"v": {"$ref": ref}}},
                   [{"v": "a"}, {"v": 1}], id=f"the-roots-own-id-{name}")
      for name, ref in [("absolute", ROOT_ID + "#/$defs/A"), ("relative", "probe.json#/$defs/A")]],
    pytest.param({"$id": ROOT_ID, "type": "object",
                  "properties": {"v": {"type": "integer"}, "w": {"$ref": ROOT_ID}}},
                 [{"w": {"v": 1}}, {"w": {"v": "1"}}], id="the-roots-own-id-alone"),
    # Core 8.2.1: an $id below the root is a new base for the $refs under it (the issue's
    # case: its "#/$defs/A" is its own A, not the root's).
    pytest.param({"type": "object", "$defs": {"A": {"type": "object"}},
                  "properties": {"a": {"$id": "urn:example:n1", "$defs": {"A": {"type": "string"}},
                                       "$ref": "#/$defs/A"}}},
                 [{"a": ""}, {"a": {}}], id="an-id-below-the-root-is-a-base"),
    # A relative $id below the root, named by a pointer through it, is joined once.
    pytest.param({"$id": ROOT_ID, "type": "object",
                  "$defs": {"T": {"$id": "tree/t.json", "$defs": {"L": {"type": "integer"}},
                                  "properties": {"l": {"$ref": "#/$defs/L"}}}},
                  "properties": {"v": {"$ref": "#/$defs/T"}, "w": {"$ref": "tree/t.json"},
                                 "x": {"$ref": "#/$defs/T/properties/l"}}},
                 [{"v": {"l": 1}, "w": {"l": 2}, "x": 3}, {"x": "3"}], id="a-relative-id-below"),
    # An $anchor (or a $dynamicAnchor) names its schema, in its resource.
    *[pytest.param({**one_property({"$ref": ref}), "$defs": {
                        "A": {anchor: "a", "type": "string"},
                        "N": {"$id": "urn:example:n",
                              "$defs": {"B": {"$anchor": "b", "type": "null"}}}}},
                   [{"v": value}, {"v": 1}], id=f"anchor-{ref}")
      for ref, anchor, value in (("#a", "$anchor", "x"), ("#a", "$dynamicAnchor", "x"),
                                 ("urn:example:n#b", "$anchor", None))],
]  # fmt: skip


class TestRefsAsJsonSchemaResolvesThem:
    """A $ref is resolved as JSON Schema 2020-12 resolves it, or the Tool is refused when it
    is built, saying why (docs/schemas.md lists the refused forms)."""

    @pytest.mark.parametrize(("parameters", "arguments"), FOLLOWED_REFS)
    def test_a_ref_is_followed_as_json_schema_follows_it(
        self, parameters: dict[str, Any], arguments: list[dict[str, Any]]
    ) -> None:
        accepted, refused = arguments
        assert json_schema_accepts(parameters, accepted) is True
        assert loop_accepts(parameters, accepted) is True
        assert json_schema_accepts(parameters, refused) is False
        assert loop_accepts(parameters, refused) is False

    @pytest.mark.parametrize(
        "parameters",
        [
            pytest.param({"$id": "urn:example:root", **one_property({"type": "string"})},
                         id="the-roots-own-id"),
            pytest.param(one_property({"$id": "urn:example:v", "type": "string"}),
                         id="no-ref-anywhere"),
        ],
    )  # fmt: skip
    def test_an_id_is_kept_where_no_ref_depends_on_it(self, parameters: dict[str, Any]) -> None:
        assert loop_accepts(parameters, {"v": "a"}) is True
        assert loop_accepts(parameters, {"v": 1}) is False


SCOPED = [
    pytest.param({**OBJECT, "properties": {"a": {"not": {"type": "string"}},
                                           "b": {"type": "string", "format": "date"}}},
                 {"a": "x"}, (False, False), id="the-issue-s-case"),
    pytest.param({**OBJECT, "properties": {"a": {"not": {"type": "string"}}},
                  "format": "date"}, {"a": "x"}, (False, False), id="a-format-at-the-root"),
    pytest.param({**OBJECT, "properties": {"a": {"oneOf": [{"type": "string"}, {}]},
                                           "b": {"pattern": "^x"}}},
                 {"a": "x"}, (False, False), id="oneOf-beside-a-pattern"),
    pytest.param({**OBJECT, "properties": {"a": {"if": {"type": "string"}, "then": False}},
                  "patternProperties": {"^b": {}}}, {"a": "x"}, (False, False),
                 id="if-beside-patternProperties"),
    # Where the subschema holds it, a match of not's schema refuses nothing (documented).
    pytest.param({**OBJECT, "properties": {"a": {"not": {"type": "string", "pattern": "^x"}}}},
                 {"a": "xyz"}, (False, True), id="a-pattern-under-not"),
    pytest.param({**OBJECT, "properties": {"a": {"not": {"$ref": "#/$defs/P"}}},
                  "$defs": {"P": {"pattern": "^x"}}}, {"a": "xyz"}, (False, True),
                 id="a-pattern-a-ref-away"),
]  # fmt: skip


class TestSchemasAgreeWithJsonSchema:
    """The loop against jsonschema's Draft202012Validator: on a schema of the keywords it
    enforces (and annotations), it accepts exactly what JSON Schema accepts; on any schema,
    it never refuses what JSON Schema accepts. Random cases come from a fixed seed."""

    def test_on_the_keywords_it_enforces_it_accepts_exactly_what_json_schema_accepts(
        self,
    ) -> None:
        """3,000 random schemas over every enforced keyword (annotations beside them), none
        refused when the Tool is built, and the same verdict as JSON Schema on each value."""
        verdicts = agreement(range(3000))
        assert verdicts == {verdict for verdict in verdicts if verdict[0] == verdict[1]}
        assert verdicts == {(True, True), (False, False)}  # both answers occur

    def test_on_any_schema_it_never_refuses_what_json_schema_accepts(self) -> None:
        verdicts = agreement(range(1000), extra=UNENFORCED)
        assert (True, False) not in verdicts
        # Each answer occurs, and the loop is stricter than nothing: it refuses too.
        assert verdicts == {(True, True), (False, False), (False, True)}

    @pytest.mark.parametrize("extra", [(), UNENFORCED], ids=["enforced", "unenforced"])
    def test_the_random_schemas_are_json_schemas(self, extra: tuple[str, ...]) -> None:
        """The generator writes schemas that JSON Schema's meta-schema accepts."""
        for seed in range(0, 3000, 25):
            parameters = random_case(seed, extra=extra)[0]
            jsonschema.Draft202012Validator.check_schema(parameters)

    @pytest.mark.parametrize(("parameters", "arguments", "verdicts"), SCOPED)
    def test_an_unenforced_keyword_weakens_only_the_subschema_that_holds_it(
        self, parameters: dict[str, Any], arguments: dict[str, Any], verdicts: tuple[bool, bool]
    ) -> None:
        """(JSON Schema accepts, the loop accepts): a format (an annotation) or a pattern
        elsewhere in the schema leaves not, oneOf and if whole."""
        assert (
            json_schema_accepts(parameters, arguments),
            loop_accepts(parameters, arguments),
        ) == verdicts

    @pytest.mark.parametrize(("parameters", "arguments", "accepted"), PYDANTIC_CASES)
    def test_schemas_as_pydantic_writes_them(
        self, parameters: dict[str, Any], arguments: dict[str, Any], accepted: bool
    ) -> None:
        """The loop agrees with JSON Schema, and the model gets the schema as it was given."""
        assert json_schema_accepts(parameters, arguments) is accepted
        assert loop_accepts(parameters, arguments) is accepted
        assert probe_tool([], parameters).spec().to_dict()["parameters"] == parameters

    @pytest.mark.parametrize(
        ("schema", "value"),
        [
            pytest.param({"type": "integer"}, 1.0, id="integer-1.0"),
            pytest.param({"type": "integer"}, -3.0, id="integer--3.0"),
            pytest.param({"enum": [1, "a"]}, 1.0, id="enum-1.0"),
            pytest.param({"const": [1]}, [1.0], id="const-1.0-in-an-array"),
            pytest.param({"const": 1.0}, 1, id="const-1-for-1.0"),
        ],
    )
    def test_the_deliberate_difference_an_integer_is_an_int(self, schema: Any, value: Any) -> None:
        """The one case left out of the random comparison: JSON Schema takes 1.0 as the
        integer 1 and equal to it; the loop, as its JSON equality says, does not."""
        parameters = one_property(schema)
        assert json_schema_accepts(parameters, {"v": value}) is True
        assert loop_accepts(parameters, {"v": value}) is False

    @pytest.mark.parametrize(
        ("schema", "value"),
        [({"const": 1}, True), ({"enum": [0]}, False), ({"const": [True]}, [1])],
        ids=["const-1-true", "enum-0-false", "const-in-an-array"],
    )
    def test_true_is_not_1_on_both_sides(self, schema: Any, value: Any) -> None:
        parameters = one_property(schema)
        assert json_schema_accepts(parameters, {"v": value}) is False
        assert loop_accepts(parameters, {"v": value}) is False


# --- Every violation, up to the cap -------------------------------------------------------

LISTED = 10  # docs/schemas.md: "lists every violation, up to 10"
MANY = {"type": "object", "properties": {f"p{n:02d}": {"type": "integer"} for n in range(12)}}


@pytest.fixture(params=["engine", "core-alone"])
def engine(request: pytest.FixtureRequest) -> str:
    """Each test that takes it runs with agent_loop_schema.py and with the core alone."""
    if request.param == "core-alone":
        request.getfixturevalue("without_engine")
    return str(request.param)


@pytest.fixture
def without_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """agent_loop.py as a copy alone: agent_loop_schema cannot be imported."""
    real = importlib.import_module

    def import_module(name: str, package: str | None = None) -> Any:
        if name == "agent_loop_schema":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", import_module)
    monkeypatch.delitem(sys.modules, "agent_loop_schema", raising=False)


def refusal(parameters: Mapping[str, Any], arguments: dict[str, Any]) -> str:
    """What a probe tool with these parameters says of these arguments ("" if it runs)."""
    received: list[dict[str, Any]] = []
    registry = al.ToolRegistry([probe_tool(received, parameters)])
    result = al.execute_tool_call(registry, call("probe", "c", arguments), threading.Event())
    assert result.is_error is (received == [])
    return result.content if result.is_error else ""


def uses_engine(schema: object) -> bool:
    """Whether a schema holds, at any depth, a keyword only the engine enforces."""
    if isinstance(schema, dict):
        return any(key in ENGINE or uses_engine(value) for key, value in schema.items())
    return isinstance(schema, list) and any(map(uses_engine, schema))


class TestEveryViolationIsListed:
    """The argument error lists every violation in the schema's order, the first 10 named
    and the others counted, with the engine and without it."""

    @pytest.mark.parametrize(("wrong", "more"), [(LISTED, ""), (LISTED + 1, "; and 1 more"),
                                                  (12, "; and 2 more")],
                             ids=["at-limit", "over-limit", "two-over"])  # fmt: skip
    def test_the_argument_error_lists_every_violation_up_to_the_cap(
        self, engine: str, wrong: int, more: str
    ) -> None:
        arguments = {f"p{n:02d}": "x" if n < wrong else 1 for n in range(12)}
        listed = "; ".join(f"$.p{n:02d} must be integer, got string" for n in range(LISTED))
        assert refusal(MANY, arguments) == f"invalid arguments for tool 'probe': {listed}{more}"

    def test_violations_of_each_keyword_are_listed_together(self, engine: str) -> None:
        xs = {"type": "array", "items": {"enum": [1]}}
        parameters = {**NUMBERS, "properties": {"left": {"type": "number"}, "xs": xs}}
        assert refusal(parameters, {"left": "1", "xs": [1, 2, 3], "extra": None}) == (
            "invalid arguments for tool 'probe': $ is missing the required property 'right'; "
            "$.left must be number, got string; $.xs[1] must be one of [1]; "
            "$.xs[2] must be one of [1]; $ has the unexpected property 'extra'"
        )


# The rows of REFUSED_TOOLS about the core's keywords and JSON, which it refuses alone too.
CORE_REFUSED = ("root-", "parameters-", "type-", "required-", "additional-", "enum-",
    "properties-", "property-", "items-", "key-", "annotation-")  # fmt: skip


class TestTheCoreWithoutTheEngine:
    """agent_loop.py alone checks type, properties, required, additionalProperties, items
    and enum, and refuses at Tool() a schema with a keyword only the engine enforces, naming
    the file to copy: never a check looser than the schema says."""

    @pytest.mark.parametrize("keyword", ENGINE)
    def test_a_keyword_only_the_engine_enforces_is_refused_naming_the_file(
        self, without_engine: None, keyword: str
    ) -> None:
        with pytest.raises(ValueError, match=r"needs agent_loop_schema\.py") as raised:
            al.Tool("probe", "A tool.", one_property({keyword: {}}), ok)
        assert str(raised.value) == (
            f"Tool 'probe' parameters.properties.v.{keyword} needs agent_loop_schema.py: copy "
            "it beside agent_loop.py (alone, the core checks type, properties, required, "
            "additionalProperties, items and enum)"
        )

    @pytest.mark.parametrize(
        "schema",
        [{"title": "T"}, {"description": "d"}, {"default": 1}, {"examples": [1]},
         {"format": "date"}, {"$comment": "c"}, {"deprecated": True}, {"readOnly": True},
         {"writeOnly": False}, {"x-vendor": {"not": {}}}, {"$defs": {"A": {}}},
         {"$id": "urn:example:v"}, {"pattern": "^a"}],
        ids=lambda schema: next(iter(schema)),
    )  # fmt: skip
    def test_an_annotation_needs_no_engine(self, without_engine: None, schema: Any) -> None:
        assert refusal(one_property(schema), {"v": "b"}) == ""

    @pytest.mark.parametrize(
        ("parameters", "arguments", "rejected"),
        [case for case in SCHEMA_CASES if not uses_engine(case.values[0])],
    )
    def test_the_core_enforces_its_six_keywords_alone(
        self, without_engine: None, parameters: Any, arguments: Any, rejected: Any
    ) -> None:
        content = refusal(parameters, arguments)
        assert (content == "") is (rejected is None)
        assert all(word in content for word in rejected or ())

    @pytest.mark.parametrize(
        ("build", "error", "words"),
        [value for key, value in REFUSED_TOOLS.items() if key.startswith(CORE_REFUSED)],
        ids=[key for key in REFUSED_TOOLS if key.startswith(CORE_REFUSED)],
    )
    def test_a_bad_tool_is_refused_when_it_is_built_alone(
        self, without_engine: None, build: Callable[[], object], error: type[Exception], words: str
    ) -> None:
        with pytest.raises(error) as raised:
            build()
        assert words in str(raised.value)

    def test_on_its_six_keywords_it_accepts_exactly_what_json_schema_accepts(
        self, without_engine: None
    ) -> None:
        assert agreement(range(500), (*CORE, *ANNOTATIONS)) == {(True, True), (False, False)}

    def test_a_tool_keeps_the_engine_that_checked_its_schema(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        tool = probe_tool([], one_property({"minimum": 1}))
        monkeypatch.delitem(sys.modules, "agent_loop_schema")
        registry = al.ToolRegistry([tool])
        passed = al.execute_tool_call(registry, call("probe", "c", {"v": 1}), threading.Event())
        refused = al.execute_tool_call(registry, call("probe", "c", {"v": 0}), threading.Event())
        assert not passed.is_error
        assert refused.is_error
        assert "$.v must be at least 1, got 0" in refused.content

    def test_an_import_that_fails_inside_the_engine_is_not_its_absence(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        def import_module(name: str, package: str | None = None) -> Any:
            raise ModuleNotFoundError("No module named 'needed'", name="needed")

        monkeypatch.setattr(importlib, "import_module", import_module)
        with pytest.raises(ModuleNotFoundError, match="needed"):
            al.Tool("probe", "A tool.", OBJECT, ok)
