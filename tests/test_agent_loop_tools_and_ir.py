"""Tests for agent_loop, the core, part two: what the loop uses after the model boundary,
in the module's order. Tools (Tool.from_function's companion, the registry,
execute_tool_call), the bounded plain JSON of a call's arguments, the message IR (frozen
calls, copying and hashing, thinking and usage), its JSON codec (to_dict shapes, round
trips, malformed dicts), and resumption (ScriptedModel.from_transcript, a run resumed after
cancellation). Part one, test_agent_loop.py, tests the loop, the transcript and the model
boundary; its docstring says how the suite is built (one ``al``, the builders and the one
driver from loop_testing.py, one canonical test per rule, the ``hostile`` mark).
Tool.from_function's own tests are with its companion's, in test_agent_loop_functions.py;
the tool schemas' tests are in test_agent_loop_schemas.py.

Contents, in the module's order
    Tools: TestToolFromFunctionNeedsItsCompanion, TestToolRegistry,
        TestExecuteToolCall, TestRecoverableExceptionsAreLogged, TestMisbehavingTools [hostile]
    Bounded plain JSON: TestPlainJsonArguments
    Message IR: TestToolCallIsFrozen, TestCopyingAndHashing, TestThinkingBlocksAndUsage
    Interop and resumption: TestJsonShapes, TestRoundTrips, TestMalformedDicts,
        TestScriptedModelFromTranscript, TestResumeAfterCancellation
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.abc
import json
import logging
import pickle
import re
import sys
import threading
import typing
from types import MappingProxyType
from typing import (
    Any,
    Callable,
    Dict,
    Iterator,
    List,
    Sequence,
    cast,
)

import pytest

import agent_loop as al
from loop_invariants import USAGE_FIELDS
from loop_testing import (
    NOT_PLAIN_JSON,
    NUMBERS,
    Custom,
    FakeModel,
    add_call,
    add_result,
    add_tool,
    assert_failed,
    assert_no_tool_ran,
    assert_tool_received,
    assistant,
    call,
    copy_echo,
    cyclic_array,
    echo_call,
    echo_result,
    echo_tool,
    failure_message,
    nested,
    no_arguments_tool,
    one_call,
    only_tool_result,
    plain_copy,
    probe_tool,
    run,
    run_probe_call,
    settle,
    shared_array,
    start_run,
    stop,
    text,
    thinking_script,
    tool_turn,
    two_parameters,
    types_of,
    untyped,
    user,
)

# --- Tools -------------------------------------------------------------------------------


class NoSignature:
    """A callable that inspect.signature() cannot read: its __signature__ is not a
    Signature, which is a TypeError on every Python."""

    __signature__ = 42

    def __call__(self, *values: Any) -> object:
        return "no signature"


def undocumented(text: str) -> str:
    return text


class TestToolFromFunctionNeedsItsCompanion:
    """Tool.from_function makes its tools with agent_loop_functions.py (whose tests are in
    test_agent_loop_functions.py): without that file, an ImportError that says so; with a
    companion that cannot import what it needs, that error as it is."""

    def test_without_the_companion(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setitem(sys.modules, "agent_loop_functions", None)
        with pytest.raises(ImportError) as raised:
            al.Tool.from_function(undocumented)
        assert str(raised.value) == (
            "Tool.from_function needs agent_loop_functions.py beside agent_loop.py"
        )

    def test_a_companion_that_cannot_import_what_it_needs(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        class Broken(importlib.abc.MetaPathFinder):  # finds a companion that fails to import
            def find_spec(self, name: str, *_: object) -> None:
                if name == "agent_loop_functions":
                    raise ModuleNotFoundError("No module named 'elsewhere'", name="elsewhere")

        monkeypatch.setattr(sys, "meta_path", [Broken(), *sys.meta_path])
        monkeypatch.delitem(sys.modules, "agent_loop_functions", raising=False)
        with pytest.raises(ModuleNotFoundError) as raised:
            al.Tool.from_function(undocumented)
        assert raised.value.name == "elsewhere"

    def test_with_the_companion(self) -> None:
        tool = al.Tool.from_function(undocumented, sequential=True)
        assert (tool.name, tool.description, tool.sequential) == ("undocumented", "", True)
        assert tool.execute({"text": "as is"}, threading.Event()) == "as is"


def named_tool(name: str) -> al.Tool:
    return al.Tool(name, f"The {name} tool.", {"type": "object"}, lambda arguments, signal: name)


class TestToolRegistry:
    """The registry's contract: ToolRegistry(tools) with register(tool) (a duplicate name
    raises ValueError), get(name), __contains__, __len__, __iter__ and specs()."""

    def test_it_holds_its_tools_in_registration_order(self) -> None:
        tools = [named_tool(name) for name in ("zeta", "alpha", "mid")]
        registry = al.ToolRegistry(tools[:2])
        registry.register(tools[2])
        assert list(registry) == tools
        assert (len(registry), len(al.ToolRegistry())) == (3, 0)
        assert (registry.get("alpha"), registry.get("two")) == (tools[1], None)
        assert ("zeta" in registry, "two" in registry, 1 in registry) == (True, False, False)
        assert registry.specs() == tuple(tool.spec() for tool in tools)

    @pytest.mark.parametrize(
        ("item", "error", "message"),
        [
            pytest.param(named_tool("one"), ValueError, "a tool named 'one' is already registered",
                         id="duplicate-name"),
            pytest.param("one", TypeError, "register() takes a Tool, got str", id="str"),
            pytest.param(None, TypeError, "register() takes a Tool, got NoneType", id="none"),
            pytest.param(al.ToolSpec("one", "", {"type": "object"}), TypeError,
                         "register() takes a Tool, got ToolSpec", id="spec"),
        ],
    )  # fmt: skip
    def test_a_duplicate_or_a_non_tool_is_refused_and_changes_nothing(
        self, item: Any, error: type[Exception], message: str
    ) -> None:
        registry = al.ToolRegistry([named_tool("one")])
        original = registry.get("one")
        with pytest.raises(error) as raised:
            registry.register(item)
        assert str(raised.value) == message
        assert list(registry) == [original]

    def test_a_duplicate_name_given_to_the_constructor_is_refused(self) -> None:
        with pytest.raises(ValueError, match=r"^a tool named 'one' is already registered$"):
            al.ToolRegistry([named_tool("one"), named_tool("one")])

    def test_iterating_while_registering_is_safe(self) -> None:
        """Registering during iteration neither raises nor changes what that iteration sees."""
        tools = [named_tool("one"), named_tool("two")]
        registry = al.ToolRegistry(tools)
        seen = []
        for tool in registry:
            seen.append(tool)
            registry.register(named_tool(tool.name + "-copy"))
        assert seen == tools
        assert [tool.name for tool in registry] == ["one", "two", "one-copy", "two-copy"]


class StrSubclass(str):
    """Only an exact str is taken verbatim: a subclass is just another JSON value."""


def raises_lookup_error(arguments: Dict[str, Any], signal: al.Signal) -> object:
    raise LookupError("no such station")


def raises_tool_error(arguments: Dict[str, Any], signal: al.Signal) -> object:
    raise al.ToolError("Try another city.")


def not_json(arguments: Dict[str, Any], signal: al.Signal) -> object:
    return {1, 2}


def giving(value: Any) -> list[al.Tool]:
    """A tool named "t" that returns ``value``."""
    return [no_arguments_tool("t", lambda arguments, signal: value)]


def interrupt(arguments: dict[str, Any], signal: Any) -> object:
    raise KeyboardInterrupt


# Tools (and the call "t" runs one of them or none), and the call's result: its exact
# content, or None and the words its content names, and whether it is an error.
class Executor:
    def method(self, arguments: Dict[str, Any], signal: al.Signal) -> object:
        return "method"

    def __call__(self, arguments: Dict[str, Any], signal: al.Signal) -> object:
        return "callable object"


NOT_JSON = "tool 't' returned a value that is not JSON: "
EXECUTED: dict[str, tuple[list[al.Tool], str | None, tuple[str, ...], bool]] = {
    "str-verbatim": (giving('He said "hi"\n'), 'He said "hi"\n', (), False),
    "dict": (giving({"sum": 42}), '{"sum":42}', (), False),  # Seed: content: '{"sum":42}'
    "non-ascii": (giving({"word": "café 😀"}), '{"word":"café 😀"}', (), False),
    "none": (giving(None), "null", (), False),
    "list": (giving([1, "a", None, True, 1.5]), '[1,"a",null,true,1.5]', (), False),
    "nested": (giving({"a": [{"b": []}]}), '{"a":[{"b":[]}]}', (), False),
    "int": (giving(7), "7", (), False),
    "bool": (giving(False), "false", (), False),
    "str-subclass": (giving(StrSubclass("hi")), '"hi"', (), False),
    # A value that is not JSON is a recoverable error that names the tool and says why, in
    # the json module's words (Python 3.13 adds the value to the out-of-range one).
    "set": (giving({1, 2}), None, (NOT_JSON + "Object of type set is not JSON",), True),
    "object": (giving(Custom()), None, (NOT_JSON + "Object of type Custom is not JSON",), True),
    "nan": (giving(float("nan")), None,
            (NOT_JSON + "Out of range float values are not JSON compliant",), True),
    "inf": (giving({"x": float("inf")}), None,
            (NOT_JSON + "Out of range float values are not JSON compliant",), True),
    "cyclic-list": (giving(cyclic_array()), None, (NOT_JSON + "Circular reference",), True),
    "bytes": (giving(b"bytes"), None, (NOT_JSON + "Object of type bytes is not JSON",), True),
    "raising-tool": ([no_arguments_tool("t", raises_lookup_error)],
                     "tool 't' raised LookupError: no such station", (), True),
    # ToolError's docstring: "The call's result is is_error=True with content exactly message".
    "tool-error": ([no_arguments_tool("t", raises_tool_error)], "Try another city.", (), True),
    "unknown-tool": ([], "unknown tool 't' (available: none)", (), True),
    "unknown-tool-among-others": ([add_tool(), echo_tool()],
                                  "unknown tool 't' (available: add, echo)", (), True),
    # Any callable that can take (arguments, signal) runs; one whose signature cannot be
    # read is trusted.
    "execute-function": ([no_arguments_tool("t", two_parameters)], "two", (), False),
    "execute-*args": ([no_arguments_tool("t", lambda *values: "variadic")], "variadic", (),
                      False),
    "execute-lambda": ([no_arguments_tool("t", lambda a, s: "lambda")], "lambda", (), False),
    "execute-bound-method": ([no_arguments_tool("t", Executor().method)], "method", (), False),
    "execute-callable-object": ([no_arguments_tool("t", Executor())], "callable object", (),
                                False),
    "execute-without-signature": ([no_arguments_tool("t", NoSignature())], "no signature", (),
                                  False),
}  # fmt: skip


class TestExecuteToolCall:
    """execute_tool_call: one result linked to the call; an unknown tool, bad arguments or
    an exception become a recoverable result, never an exception."""

    @pytest.mark.parametrize(
        ("tools", "content", "words", "is_error"), EXECUTED.values(), ids=list(EXECUTED)
    )
    def test_each_call_gets_one_linked_result(
        self, tools: list[al.Tool], content: str | None, words: tuple[str, ...], is_error: bool
    ) -> None:
        result = al.execute_tool_call(
            al.ToolRegistry(tools), call("t", "c1", {}), threading.Event()
        )
        assert (result.id, result.tool_call_id, result.tool_name, result.is_error) == (
            "tool-result-c1", "c1", "t", is_error,
        )  # fmt: skip
        if content is not None:
            assert result.content == content
        for word in words:
            assert word in result.content

    @pytest.mark.parametrize(("id", "name"), [(1, "echo"), ("c1", ["echo"]), ("", "echo")])
    def test_a_call_no_result_can_be_linked_to_is_a_type_error(self, id: Any, name: Any) -> None:
        registry = al.ToolRegistry([echo_tool()])
        with pytest.raises(TypeError, match="id and name must be non-empty str"):
            al.execute_tool_call(registry, untyped.ToolCall(id, name, {}), threading.Event())

    def test_a_tool_error_message_must_be_a_str(self) -> None:
        assert (al.ToolError("x").message, str(al.ToolError("x"))) == ("x", "x")
        for message in (1, None, b"x"):
            with pytest.raises(TypeError, match="ToolError message must be a str, got "):
                untyped.ToolError(message)

    def test_keyboard_interrupt_is_not_turned_into_a_result(self) -> None:
        """Only Exceptions become results: a KeyboardInterrupt propagates."""
        registry = al.ToolRegistry([no_arguments_tool("stop", interrupt)])
        with pytest.raises(KeyboardInterrupt):
            al.execute_tool_call(registry, call("stop", "c1", {}), threading.Event())

    def test_execute_receives_the_signal_given(self) -> None:
        seen: list[Any] = []
        tool = no_arguments_tool("probe", lambda arguments, signal: seen.append(signal))
        signal = threading.Event()
        al.execute_tool_call(al.ToolRegistry([tool]), call("probe", "c", {}), signal)
        assert len(seen) == 1
        assert seen[0] is signal


class TestRecoverableExceptionsAreLogged:
    """An exception that becomes a recoverable result is logged with its traceback through
    logging.getLogger("agent_loop"), which has only a NullHandler."""

    @pytest.mark.parametrize(
        ("execute", "exception"),
        [(raises_lookup_error, LookupError), (not_json, TypeError), (raises_tool_error, None)],
        ids=["raises", "not-json", "tool-error-is-not-logged"],
    )
    def test_the_record_has_the_traceback(
        self,
        caplog: pytest.LogCaptureFixture,
        execute: Callable[..., object],
        exception: type | None,
    ) -> None:
        caplog.set_level(logging.DEBUG, logger="agent_loop")
        _, result, _ = run(one_call("t"), tools=[no_arguments_tool("t", execute)])
        assert only_tool_result(result).is_error
        records = [r for r in caplog.records if r.name == "agent_loop"]
        assert len(records) == (0 if exception is None else 1)
        for record in records:
            assert record.levelno == logging.WARNING
            assert "'t'" in record.getMessage()
            assert record.exc_info is not None
            assert isinstance(record.exc_info[1], cast(type, exception))
        handlers = logging.getLogger("agent_loop").handlers
        assert [type(handler) for handler in handlers] == [logging.NullHandler]


@pytest.mark.hostile
class TestMisbehavingTools:
    """Tools that misbehave in ways a row of test_agent_loop.py's TestRecoverableToolErrors
    (the rule's canonical table) cannot write: a huge return value, a tool that drives its
    own run."""

    def test_returning_a_huge_string_is_kept_verbatim(self) -> None:
        huge = "y" * 5_000_000
        _, result, _ = run(one_call("huge"), [no_arguments_tool("huge", lambda a, s: huge)])
        assert only_tool_result(result) == al.ToolResultMessage(
            "tool-result-c1", "c1", "huge", huge, False
        )

    def test_tool_that_drives_the_run_reentrantly_is_recoverable(self) -> None:
        """next() on the run it is part of is a ValueError, an ordinary recoverable error."""
        holder: list[Any] = []
        model = one_call("reenter")
        run_ = start_run(model, [no_arguments_tool("reenter", lambda a, s: next(holder[0]))])
        holder.append(run_)
        _, result = settle(run_, model, max_steps=4, start=[user()])
        assert result.status == "completed"
        assert only_tool_result(result).is_error
        assert "ValueError" in only_tool_result(result).content


# --- Bounded plain JSON ------------------------------------------------------------------


class Grumpy(typing.Mapping[str, Any]):
    """A mapping whose own items() raises, though it can be read key by key."""

    def __getitem__(self, key: str) -> object:
        return {"a": 1}[key]

    def __iter__(self) -> Iterator[str]:
        return iter(["a"])

    def __len__(self) -> int:
        return 1

    def items(self) -> Any:
        raise RuntimeError("no items today")


def made_valid_after_construction() -> al.ToolCall:
    arguments: Dict[str, Any] = {"bad": float("inf")}
    tool_call = al.ToolCall("c1", "t", arguments)
    arguments["bad"] = 1.0  # now plain JSON, but not when the call was built
    return tool_call


class TestPlainJsonArguments:
    """Seed: "Tool arguments must be plain bounded JSON ... These checks occur before a Tool
    effect. Contradiction or excess becomes a failed MODEL_PROTOCOL_ERROR result." Arguments
    that are not are kept as given, and fail where they enter: the run, the start, or
    execute_tool_call (an error result)."""

    @pytest.mark.parametrize("make", NOT_PLAIN_JSON)
    def test_not_plain_arguments_fail_before_any_tool(self, make: Callable[[], Any]) -> None:
        """Anything but plain bounded JSON fails the step before any of its tools runs."""
        received: list[dict[str, Any]] = []
        good = al.ToolCall("call-probe-001", "probe", {"n": 1})
        bad = al.ToolCall("call-probe-002", "probe", make())  # construction never raises
        assert (bad.id, bad.name) == ("call-probe-002", "probe")
        model = FakeModel(
            tool_turn("response-001", good, bad), stop("response-002", "The sum is 42.")
        )
        events, result, _ = run(model, tools=[probe_tool(received)])
        assert_failed(events, result, "MODEL_PROTOCOL_ERROR", "call-probe-002")
        assert_no_tool_ran(events, result, model, received)
        assert types_of(events).count("model.chunk") == 1
        assert model.finalized == ["request-001"]
        # The same where only the terminal response holds the call.
        response = al.scripted_response("response-001", [bad], "toolCall", chunks=[])
        events, result, model = run([response], tools=[probe_tool(received)])
        assert_failed(events, result, "MODEL_PROTOCOL_ERROR", "call-probe-002")
        assert_no_tool_ran(events, result, model, received)

    @pytest.mark.parametrize(
        ("arguments", "received"),
        [
            # Frozen arrays are tuples, so a tuple is an array; the tool receives lists.
            pytest.param({"xs": (1, (2, "three"), [])}, {"xs": [1, [2, "three"], []]},
                         id="tuples-are-arrays"),
            pytest.param(al.ToolCall("c", "t", {"o": {"k": [1, None]}, "s": "x"}).arguments,
                         {"o": {"k": [1, None]}, "s": "x"}, id="frozen-arguments-of-another-call"),
            # CPython shares the empty tuple: an immutable value reached twice is no aliasing.
            pytest.param(al.ToolCall("c", "t", {"a": [], "b": [], "c": {"d": []}}).arguments,
                         {"a": [], "b": [], "c": {"d": []}}, id="shared-empty-frozen-arrays"),
            # Only a container reachable twice is a violation: a scalar may repeat.
            pytest.param({"a": "same", "b": "same", "c": ["same", "same"], "d": 1, "e": 1},
                         {"a": "same", "b": "same", "c": ["same", "same"], "d": 1, "e": 1},
                         id="equal-scalars-repeat"),
        ],
    )  # fmt: skip
    def test_plain_arguments_reach_the_tool_as_plain_json(
        self, arguments: Any, received: Any
    ) -> None:
        events, result, _, given = run_probe_call(arguments)
        assert_tool_received(events, result, given, received)

    def test_invalid_arguments_are_kept_as_given(self) -> None:
        """ToolCall's docstring: arguments that are not plain bounded JSON "are kept as
        given" (read-only, or a mapping of another kind, as a plain dict)."""
        arguments = {"bad": float("inf")}
        assert al.ToolCall("c1", "t", arguments).arguments is arguments
        read_only = MappingProxyType({"bad": {1, 2}})
        kept = untyped.ToolCall("c1", "t", read_only)
        assert (type(kept.arguments), kept.arguments) == (dict, dict(read_only))
        grumpy = untyped.ToolCall("c1", "t", MappingProxyType(Grumpy()))
        assert (type(grumpy.arguments), grumpy.arguments) == (dict, {"a": 1})

    @pytest.mark.parametrize(
        ("make", "problem"),
        [
            pytest.param(lambda: untyped.ToolCall("c1", "t", MappingProxyType({"bad": {1, 2}})),
                         "arguments hold a set, which is not plain JSON", id="read-only-set"),
            pytest.param(lambda: untyped.ToolCall("c1", "t", {"bad": object()}),
                         "arguments hold an object, which is not plain JSON", id="an-object"),
            pytest.param(lambda: untyped.ToolCall("c1", "t", {1: "one"}),
                         "arguments hold an int key, not a string", id="an-int-key"),
            pytest.param(made_valid_after_construction,
                         "arguments were not plain bounded JSON when the call was built",
                         id="made-valid-after-construction"),
            pytest.param(lambda: untyped.ToolCall("c1", "t", MappingProxyType(Grumpy())),
                         "arguments were not plain bounded JSON when the call was built",
                         id="mapping-whose-items-raise"),
            pytest.param(lambda: untyped.ToolCall("c1", "t", {"n": MappingProxyType(Grumpy())}),
                         "arguments cannot be read: RuntimeError: no items today",
                         id="nested-mapping-whose-items-raise"),
            pytest.param(lambda: untyped.ToolCall("c1", "t", {"x": float("nan")}),
                         "arguments hold nan, which is not a JSON number", id="nan"),
            pytest.param(lambda: untyped.ToolCall("c1", "t", shared_array()),
                         "arguments reach the same dict or list twice (shared or cyclic)",
                         id="a-shared-list"),
            pytest.param(lambda: untyped.ToolCall("c1", "t", nested(33)),
                         "arguments nest containers deeper than 32", id="too-deep"),
            pytest.param(lambda: untyped.ToolCall("c1", "t", [1]),
                         "arguments must be a JSON object, got list", id="list"),
            pytest.param(lambda: untyped.ToolCall("c1", "t", "text"),
                         "arguments must be a JSON object, got str", id="str"),
            pytest.param(lambda: untyped.ToolCall("c1", "t", None),
                         "arguments must be a JSON object, got NoneType", id="None"),
        ],
    )  # fmt: skip
    def test_not_plain_arguments_fail_where_they_enter_naming_the_problem(
        self, make: Any, problem: str
    ) -> None:
        """From the model, in the start or given to execute_tool_call: it fails, never
        raises, and no tool runs."""
        ran: List[str] = []
        tool = no_arguments_tool("t", lambda a, s: ran.append("ran"))
        tool_call = make()
        _, result, _ = run([tool_turn("r1", tool_call)], tools=[tool])
        assert failure_message(result, "MODEL_PROTOCOL_ERROR") == f"tool call 'c1': {problem}"
        _, started, _ = run([], messages=[user(), assistant("r0", tool_call)])
        assert problem in failure_message(started, "INVALID_TRANSCRIPT")
        message = al.execute_tool_call(al.ToolRegistry([tool]), tool_call, threading.Event())
        assert (message.content, message.is_error) == (
            f"invalid arguments for tool 't': {problem}",
            True,
        )
        assert ran == []


# --- Message IR --------------------------------------------------------------------------


FIRST = al.ToolCall("c", "t", {"a": [1, {"b": None}], "s": "x"})
INF = float("inf")  # not a JSON number: arguments that hold it are kept as given


# Pairs of IR values and whether they are equal (a pair of blocks is also compared inside
# two assistant messages).
EQUALITY = [
    # Key order and list-or-tuple do not matter, nor frozen or not.
    pytest.param(FIRST, al.ToolCall("c", "t", {"s": "x", "a": [1, {"b": None}]}), True,
                 id="key-order"),
    pytest.param(FIRST, al.ToolCall("c", "t", {"a": (1, {"b": None}), "s": "x"}), True,
                 id="tuple-list"),
    pytest.param(FIRST, al.ToolCall("c", "t", FIRST.arguments), True, id="frozen-arguments"),
    pytest.param(FIRST, dataclasses.replace(FIRST), True, id="replaced"),
    pytest.param(add_result(), add_result(), True, id="tool-result"),
    # Every field counts.
    pytest.param(al.TextBlock("a"), al.TextBlock("b"), False, id="text"),
    pytest.param(user("a"), user("a", "user-002"), False, id="user-id"),
    pytest.param(add_result(), dataclasses.replace(add_result(), is_error=True), False,
                 id="is-error"),
    pytest.param(al.ToolCall("c", "t", {}), al.ToolCall("d", "t", {}), False, id="call-id"),
    pytest.param(al.ToolCall("c", "t", {}), al.ToolCall("c", "u", {}), False, id="call-name"),
    pytest.param(al.ToolCall("c", "t", {}), al.TextBlock("c"), False, id="call-text"),
    # The documented choice: JSON equality is strict, True is not 1 and 1 is not 1.0.
    *[pytest.param(untyped.ToolCall("c", "t", left), untyped.ToolCall("c", "t", right), False,
                   id=name)
      for name, left, right in [
          ("1-true", {"x": 1}, {"x": True}), ("1-1.0", {"x": 1}, {"x": 1.0}),
          ("true-1.0", {"x": True}, {"x": 1.0}), ("0-false", {"x": 0}, {"x": False}),
          ("nested-array", {"x": [1]}, {"x": [True]}), ("nested-object", {"x": {"y": 0}},
                                                        {"x": {"y": 0.0}}),
          ("1-string", {"x": 1}, {"x": "1"}), ("array-length", {"x": [1]}, {"x": [1, 1]}),
          ("keys", {"x": 1}, {"y": 1})]],
    # The same for arguments that are not plain bounded JSON (kept as given): equal as
    # JSON or not, whatever == says of the dicts.
    *[pytest.param(untyped.ToolCall("c", "t", left), untyped.ToolCall("c", "t", right), equal,
                   id=f"not-plain-{name}")
      for name, left, right, equal in [
          ("equal", {"x": True, "inf": INF}, {"x": True, "inf": INF}, True),
          ("key-order", {"inf": INF, "x": [1]}, {"x": (1,), "inf": INF}, True),
          ("too-deep-equal", nested(33), nested(33), True),
          ("1-true", {"x": 1, "inf": INF}, {"x": True, "inf": INF}, False),
          ("1-1.0", {"x": [1], "inf": INF}, {"x": [1.0], "inf": INF}, False),
          ("nested-object", {"x": {"y": 0}, "inf": INF}, {"x": {"y": False}, "inf": INF}, False),
          ("int-key-true-key", {1: "a"}, {True: "a"}, False),
          ("not-json-values", {"s": {1}}, {"s": {True}}, True),  # == of a set, its type
          ("not-json-types", {"s": {1}}, {"s": frozenset({1})}, False)]],
]  # fmt: skip


# How each value keeps the blocks it was given as a list.
KEPT_AS_TUPLES: dict[str, Callable[[list[Any]], Any]] = {
    "AssistantMessage": lambda blocks: al.AssistantMessage("m", blocks).content,
    "ModelResponse": lambda blocks: al.ModelResponse("r", "q", blocks, "stop").content,
    "ScriptedResponse": lambda blocks: al.ScriptedResponse("r", blocks, "stop").content,
    "scripted_response": lambda blocks: al.scripted_response("r", blocks, "stop").content,
    "ScriptedResponse-chunks": lambda blocks: al.ScriptedResponse("r", [], "stop",
                                                                  chunks=blocks).chunks,
    "scripted_response-chunks": lambda blocks: al.scripted_response("r", [], "stop",
                                                                    chunks=blocks).chunks,
}  # fmt: skip


class TestToolCallIsFrozen:
    """The Message IR is frozen dataclasses compared by value (TestRunOwnsSnapshots proves
    nothing reachable from a run is mutable): the run's transcript never changes under anyone."""

    @pytest.mark.parametrize(("left", "right", "equal"), EQUALITY)
    def test_ir_values_compare_by_value(self, left: Any, right: Any, equal: bool) -> None:
        assert (left == right) is equal
        assert (left != right) is not equal
        if equal:  # equal values hash alike
            assert hash(left) == hash(right)
        if isinstance(left, (al.TextBlock, al.ToolCall)):
            messages = [al.AssistantMessage("m", (block,)) for block in (left, right)]
            assert (messages[0] == messages[1]) is equal

    def test_arguments_are_a_frozen_copy(self) -> None:
        """Mutating the caller's dict changes nothing; the call's own cannot be mutated."""
        arguments: dict[str, Any] = {"xs": [1, 2], "o": {"k": "v"}}
        tool_call = al.ToolCall("call-001", "probe", arguments)
        arguments["xs"].append(3)
        arguments["o"]["k"] = "changed"
        del arguments["o"]
        with pytest.raises(TypeError):
            tool_call.arguments["o"]["k"] = "changed"  # type: ignore[index]
        assert type(tool_call.arguments["xs"]) is tuple
        assert plain_copy(tool_call.arguments) == {"xs": [1, 2], "o": {"k": "v"}}

    @pytest.mark.parametrize(
        "plain",
        [lambda tool_call: tool_call.plain_arguments(),
         lambda tool_call: tool_call.to_dict()["arguments"]],
        ids=["plain_arguments", "to_dict"],
    )  # fmt: skip
    def test_plain_arguments_are_a_fresh_plain_copy_each_time(self, plain: Any) -> None:
        """plain_arguments() and to_dict(): a fresh plain copy of the arguments, for json."""
        arguments: dict[str, Any] = {"a": [1, {"b": [True, None, 1.5]}], "c": {"d": "e"}}
        tool_call = al.ToolCall("c1", "t", arguments)
        first, second = plain(tool_call), plain(tool_call)
        assert json.loads(json.dumps(first)) == first == arguments
        types = [type(first), type(first["a"]), type(first["a"][1]), type(first["a"][1]["b"])]
        assert types == [dict, list, dict, list]
        assert first["a"] is not second["a"]
        first["a"][1]["b"].append("changed")
        assert plain(tool_call) == arguments
        assert tool_call == al.ToolCall("c1", "t", arguments)

    def test_each_execution_gets_a_fresh_plain_dict_it_may_mutate(self) -> None:
        """execute gets a fresh plain dict it may mutate with no effect on the transcript."""
        original: dict[str, Any] = {"xs": [1, 2], "o": {"k": "v"}, "s": "text"}
        received: list[dict[str, Any]] = []
        kinds = (dict, list, dict)

        def execute(arguments: dict[str, Any], signal: Any) -> object:
            received.append(copy.deepcopy(arguments))
            assert (type(arguments), type(arguments["xs"]), type(arguments["o"])) == kinds
            arguments["xs"].append(99)
            arguments["o"]["k"] = "mutated"
            del arguments["s"]
            return "ok"

        calls = [call("probe", "call-001", original), call("probe", "call-002", original)]
        tools = [no_arguments_tool("probe", execute)]
        events, _, model = run([tool_turn("r1", *calls), stop("r2", "The sum is 42.")], tools)
        assert received == [original, original]
        assert model.requests[1].messages[1] == assistant("r1", *calls)
        chunks = [e.payload["chunk"] for e in events if e.type == "model.chunk"]
        carried = [chunk.tool_call for chunk in chunks if isinstance(chunk, al.ToolCallChunk)]
        carried += [e.payload["tool_call"] for e in events if "tool_call" in e.payload]
        carried += model.requests[1].messages[1].content
        assert len(carried) == 8  # two calls, each streamed, started, finished and kept
        assert all(plain_copy(tool_call.arguments) == original for tool_call in carried)

    @pytest.mark.parametrize("make", KEPT_AS_TUPLES.values(), ids=list(KEPT_AS_TUPLES))
    def test_content_given_as_a_list_is_stored_as_a_tuple(self, make: Any) -> None:
        """What the caller does to its list afterwards changes nothing (a script's too)."""
        blocks: list[Any] = [al.TextBlock("a"), FIRST]
        content = make(blocks)
        blocks.append(al.TextBlock("later"))
        assert content == (al.TextBlock("a"), FIRST)

    def test_discriminators_have_the_protocol_values(self) -> None:
        """Protocol values are spelled as in the seed ("toolResult", "toolCall")."""
        values: list[Any] = [
            al.TextBlock("a"),
            FIRST,
            al.ThinkingBlock("a"),
            al.TextDelta("r", ""),
        ]
        values += [al.ToolCallChunk("r", FIRST), al.ThinkingDelta("r", "a")]
        assert [value.type for value in values] == ["text", "toolCall", "thinking"] * 2
        messages = (user(), assistant("r"), add_result())
        assert [message.role for message in messages] == ["user", "assistant", "toolResult"]


class TestCopyingAndHashing:
    """Values survive pickle and copy equal, read-only mappings frozen again; a value that
    holds a mapping says __hash__ = None; messages and blocks hash."""

    def test_an_event_keeps_a_read_only_payload_and_copies_any_other(self) -> None:
        read_only = MappingProxyType({"message": user()})
        assert al.Event(0, "message.accepted", read_only).payload is read_only
        plain = {"message": user()}
        event = al.Event(0, "message.accepted", plain)
        plain["message"] = user("changed", "user-002")
        assert event.payload == {"message": user()}
        assert type(event.payload) is MappingProxyType

    @pytest.mark.parametrize(
        "duplicate",
        [
            pytest.param(lambda value: pickle.loads(pickle.dumps(value)), id="pickle"),
            pytest.param(copy.deepcopy, id="deepcopy"),
            pytest.param(copy.copy, id="copy"),
        ],
    )
    def test_results_events_requests_and_tools_copy_equal(self, duplicate: Any) -> None:
        script = [tool_turn("r1", text("Adding."), add_call()), stop("r2", "The sum is 42.")]
        tool = al.Tool("add", "Adds two numbers.", NUMBERS, copy_echo)
        events, result, model = run(script, tools=[add_tool()])
        assert duplicate(result) == result
        assert [duplicate(event) for event in events] == events
        assert [duplicate(request) for request in model.requests] == model.requests
        assert isinstance(duplicate(result.messages[1].content[1]).arguments, MappingProxyType)
        for value in (tool, tool.spec()):
            assert duplicate(value) == value
            assert isinstance(duplicate(value).parameters, MappingProxyType)
        # A loop-built request's snapshot is lazy: its pickle holds only its own messages.
        pickled = pickle.dumps(model.requests[0])
        assert b"The sum is 42." not in pickled
        assert pickle.loads(pickled).messages == result.messages[:1]

    def test_a_spec_built_from_a_plain_dict_is_frozen(self) -> None:
        parameters: dict[str, Any] = {"type": "object", "properties": {}}
        spec = al.ToolSpec("echo", "Echoes.", parameters)
        parameters["type"] = "string"
        parameters["properties"]["text"] = {"type": "string"}
        assert type(spec.parameters) is MappingProxyType
        assert spec.parameters == {"type": "object", "properties": {}}

    def test_messages_and_blocks_hash_by_value(self) -> None:
        first = call("add", "call-1", {"left": 1, "right": [2]})
        same = call("add", "call-1", {"left": 1, "right": [2]})
        assert len({first, same}) == 1
        message = al.AssistantMessage("message-1", (text("Adding."), first))
        assert message in {al.AssistantMessage("message-1", [text("Adding."), same])}
        values = [al.TextBlock("x"), user(), add_result(), thinking_assistant()]
        assert [hash(value) for value in values] == [hash(copy.deepcopy(v)) for v in values]

    def test_values_holding_mappings_are_unhashable(self) -> None:
        spec = al.ToolSpec("x", "d", {"type": "object"})
        values: List[object] = [
            al.Event(0, "run.finished", {"result": None}),
            no_arguments_tool("t", two_parameters),
            spec,
            al.ModelRequest("request-001", (), (spec,)),
        ]
        for value in values:
            with pytest.raises(TypeError):
                hash(value)


SIGNED = al.ThinkingBlock("Add first, then answer.", signature="sig-001")
REDACTED = al.ThinkingBlock("", signature="opaque-data", redacted=True)
FULL_USAGE = al.Usage(100, 20, 3000, 40, 5)


def thinking_assistant(usage: al.Usage | None = FULL_USAGE) -> al.AssistantMessage:
    """An assistant message with every kind of thinking block, in a mixed order, and usage."""
    blocks = (SIGNED, text("Adding."), REDACTED, al.ThinkingBlock(""), add_call())
    return al.AssistantMessage("message-response-001", blocks, usage)


class TestThinkingBlocksAndUsage:
    """ThinkingBlock and Usage (their JSON is in TestJsonShapes): a count is None or an int
    >= 0; "a field that is None on either side is None in the sum"."""

    @pytest.mark.parametrize(
        ("value", "error", "words"),
        [
            pytest.param(0, None, "", id="0"),
            pytest.param(10**12, None, "", id="large"),
            pytest.param(None, None, "", id="None"),
            pytest.param(-1, ValueError, "must be None or an int >= 0, got -1", id="negative"),
            pytest.param(True, TypeError, "must be None or an int, got bool", id="bool"),
            pytest.param(1.0, TypeError, "must be None or an int, got float", id="float"),
            pytest.param("3", TypeError, "must be None or an int, got str", id="str"),
        ],
    )
    def test_a_usage_count_is_none_or_an_int_at_least_zero(
        self, value: Any, error: type[Exception] | None, words: str
    ) -> None:
        for name in USAGE_FIELDS:
            if error is None:
                assert getattr(al.Usage(**{name: value}), name) == value
                continue
            with pytest.raises(error, match=re.escape(f"Usage {name} {words}")):
                al.Usage(**{name: value})

    @pytest.mark.parametrize(
        ("left", "right", "total"),
        [
            (FULL_USAGE, al.Usage(1, 2, 3, 4, 5), al.Usage(101, 22, 3003, 44, 10)),
            (FULL_USAGE, al.Usage(1, 2, None, 4, None), al.Usage(101, 22, None, 44, None)),
            (al.Usage(None, 2), al.Usage(1, 2), al.Usage(None, 4)),
            (FULL_USAGE, al.Usage(), al.Usage()),
        ],
        ids=["known", "unknown-right", "unknown-left", "all-unknown"],
    )
    def test_usages_add_field_by_field(self, left: al.Usage, right: Any, total: al.Usage) -> None:
        assert left + right == total
        for other in (object(), {"input": 1}):
            with pytest.raises(TypeError):
                left + other

    def test_thinking_is_kept_in_order_and_left_out_of_the_text(self) -> None:
        """An assistant message equals another only with the same blocks and usage."""
        assert al.text_from_assistant(thinking_assistant()) == "Adding."
        assert thinking_assistant() == thinking_assistant(al.Usage(100, 20, 3000, 40, 5))
        assert thinking_assistant() != thinking_assistant(None)
        assert thinking_assistant().content[:3] == (SIGNED, text("Adding."), REDACTED)


# --- Interop and resumption -------------------------------------------------------------


# Each value beside its JSON, both written out here.
ADD_CALL = al.ToolCall("call-add-001", "add", {"left": 20, "right": 22})
ADD_JSON = {"type": "toolCall", "id": "call-add-001", "name": "add",
    "arguments": {"left": 20, "right": 22}}  # fmt: skip
USER = al.UserMessage("user-001", "Add 20 and 22.")
USER_JSON = {"id": "user-001", "role": "user", "content": "Add 20 and 22."}
DELTA_JSON = {"type": "text", "requestId": "request-001", "text": "Hi"}
USAGE_JSON = {"input": 1, "output": 2}
ADD_SPEC_JSON = {"name": "add", "description": "Adds two numbers.", "parameters": NUMBERS}
ON_REQUEST = {"request_id": "request-001", "tool_call": ADD_CALL}
ADD_RESULT = al.ToolResultMessage(
    "tool-result-call-add-001", "call-add-001", "add", '{"sum":42}', False
)
# Seed: {id: "tool-result-call-add-001", role: "toolResult", toolCallId: "call-add-001",
# toolName: "add", content: '{"sum":42}', isError: false}
RESULT_JSON = {"id": "tool-result-call-add-001", "role": "toolResult",
    "toolCallId": "call-add-001", "toolName": "add", "content": '{"sum":42}', "isError": False,
}  # fmt: skip


# Each value of the IR, events and results, and its to_dict() written out literally: the
# seed's keys (Pi's for thinking and usage), optional keys absent when None or False.
JSON_SHAPES: dict[str, tuple[Any, Dict[str, Any]]] = {
    "text-block": (al.TextBlock("hi"), {"type": "text", "text": "hi"}),
    "tool-call": (ADD_CALL, ADD_JSON),
    "user": (USER, USER_JSON),
    "assistant": (assistant("r", text("Adding."), ADD_CALL),
                  {"id": "message-r", "role": "assistant", "content": [{"type": "text",
                                                                        "text": "Adding."},
                                                                       ADD_JSON]}),
    "tool-result": (ADD_RESULT, RESULT_JSON),
    "thinking": (al.ThinkingBlock("hmm"), {"type": "thinking", "thinking": "hmm"}),
    "thinking-signed": (SIGNED,
                        {"type": "thinking", "thinking": SIGNED.thinking,
                         "thinkingSignature": "sig-001"}),
    "thinking-redacted": (REDACTED, {"type": "thinking", "thinking": "",
                                     "thinkingSignature": "opaque-data",
                                     "redacted": True}),
    "usage": (FULL_USAGE,
              {"input": 100, "output": 20, "cacheRead": 3000, "cacheWrite": 40, "reasoning": 5}),
    "usage-partly-known": (al.Usage(output_tokens=0), {"output": 0}),
    "usage-unknown": (al.Usage(), {}),
    "assistant-with-usage": (al.AssistantMessage("m", (), al.Usage(1, 2)),
                             {"id": "m", "role": "assistant", "content": [], "usage": USAGE_JSON}),
    "text-delta": (al.TextDelta("request-001", "Hi"), DELTA_JSON),
    "thinking-delta": (al.ThinkingDelta("request-001", "Hm"),
                       {"type": "thinking", "requestId": "request-001", "thinking": "Hm"}),
    "tool-call-chunk": (al.ToolCallChunk("request-001", ADD_CALL),
                        {"type": "toolCall", "requestId": "request-001", "toolCall": ADD_JSON}),
    "response": (al.ModelResponse("r", "request-001", (ADD_CALL,), "toolCall"),
                 {"id": "r", "requestId": "request-001", "content": [ADD_JSON],
                  "stopReason": "toolCall"}),
    "response-with-usage": (al.ModelResponse("r", "request-001", (), "stop", al.Usage(1, 2)),
                            {"id": "r", "requestId": "request-001", "content": [],
                             "stopReason": "stop",
                             "usage": USAGE_JSON}),
    "request": (al.ModelRequest("request-001", (USER,), (add_tool().spec(),)),
                {"id": "request-001", "messages": [USER_JSON], "tools": [ADD_SPEC_JSON]}),
    "run-error": (al.RunError("MODEL_STREAM_ERROR", "boom"),
                  {"code": "MODEL_STREAM_ERROR", "message": "boom"}),
    "completed": (al.RunResult("completed", (USER,), 1, final_text="Done."),
                  {"status": "completed", "messages": [USER_JSON], "steps": 1,
                   "finalText": "Done."}),
    "completed-empty-text-and-usage": (al.RunResult("completed", (), 1, final_text="",
                                                    usage=al.Usage()),
                                       {"status": "completed", "messages": [], "steps": 1,
                                        "finalText": "",
                                        "usage": {}}),
    "maxSteps": (al.RunResult("maxSteps", (), 3, max_steps=3),
                 {"status": "maxSteps", "messages": [], "steps": 3, "maxSteps": 3}),
    "failed": (al.RunResult("failed", (), 0, error=al.RunError("INVALID_TRANSCRIPT", "bad")),
               {"status": "failed", "messages": [], "steps": 0,
                "error": {"code": "INVALID_TRANSCRIPT", "message": "bad"}}),
    "cancelled-offset-3": (al.RunResult("cancelled", (), 2, request_sequence_start=3),
                           {"status": "cancelled", "messages": [], "steps": 2,
                            "requestSequenceStart": 3}),
    "message.accepted": (al.Event(0, "message.accepted", {"message": USER}),
                         {"sequence": 0, "type": "message.accepted",
                          "payload": {"message": USER_JSON}}),
    "model.chunk": (al.Event(1, "model.chunk", {"request_id": "request-001",
                                                "chunk": al.TextDelta("request-001", "Hi")}),
                    {"sequence": 1, "type": "model.chunk",
                     "payload": {"requestId": "request-001", "chunk": DELTA_JSON}}),
    "tool.started": (al.Event(2, "tool.started", ON_REQUEST),
                     {"sequence": 2, "type": "tool.started",
                      "payload": {"requestId": "request-001", "toolCall": ADD_JSON}}),
    "tool.finished": (al.Event(3, "tool.finished", {**ON_REQUEST, "tool_result": ADD_RESULT}),
                      {"sequence": 3, "type": "tool.finished",
                       "payload": {"requestId": "request-001", "toolCall": ADD_JSON,
                                   "toolResult": RESULT_JSON}}),
    "run.finished": (al.Event(4, "run.finished", {"result": al.RunResult("cancelled", (), 0)}),
                     {"sequence": 4, "type": "run.finished",
                      "payload": {"result": {"status": "cancelled", "messages": [], "steps": 0}}}),
}  # fmt: skip


class TestJsonShapes:
    """The JSON keys are the seed's (toolCallId, toolName, isError, stopReason, requestId,
    finalText, maxSteps, ...) and Pi's for thinking and usage; each is written out here."""

    @pytest.mark.parametrize(("value", "expected"), JSON_SHAPES.values(), ids=list(JSON_SHAPES))
    def test_to_dict_writes_the_seeds_keys(self, value: Any, expected: Dict[str, Any]) -> None:
        """Plain dicts and lists (a list is never equal to a tuple), optional keys absent."""
        assert value.to_dict() == expected


def through_json(value: Any) -> Any:
    """A value after a trip through JSON text, as a log file would carry it."""
    return json.loads(json.dumps(value))


EXTRA_ARGUMENTS: dict[str, Any] = {"text": 'héllo, wörld 🙂 \u2028 "quoted" \\ back', "meta": {
    "numbers": [0, -7, 2.5, 1.0, 1e-300, 12345678901234567890], "flags": [True, False],
    "nothing": None, "nested": {"deeper": [{"ключ": "значение"}, []], "empty": {}}}}  # fmt: skip
"""Echo arguments with every JSON kind: nested, unicode, floats, bools, null."""


def recorded_run() -> tuple[list[al.Event], al.RunResult, FakeModel]:
    """Three steps: text and a tool call; three calls of which two fail recoverably (bad
    arguments, unknown tool); then the answer."""
    script = [
        tool_turn("response-001", text("Let me add."), add_call()),
        tool_turn(
            "response-002",
            call("echo", "call-echo-001", EXTRA_ARGUMENTS),
            call("add", "call-add-002", {"left": "twenty", "right": 22}),
            call("missing", "call-missing-001", {}),
            text("Three calls; two will fail."),
        ),
        stop("response-003", "The sum is 42. Ünïcödé 🙂"),
    ]
    return run(script, tools=[add_tool(), echo_tool()], max_steps=4)


def cancelling(arguments: dict[str, Any], signal: Any) -> object:
    """A tool that sets the run's signal while it runs (so its result is discarded)."""
    signal.set()
    return "too late"


# One real run of each RunResult status (and one with thinking and usage, one whose request
# ids start at an offset).
RUNS_OF_EVERY_STATUS: dict[str, Callable[[], tuple[list[al.Event], al.RunResult, Any]]] = {
    "completed": recorded_run,
    "thinking": lambda: run(thinking_script(), [add_tool()]),
    "cancelled": lambda: run([tool_turn("r1", text("Slowly."), call("slow", "c1",
                                                                    {"why": ["x"]}))],
                             [no_arguments_tool("slow", cancelling)], signal=threading.Event()),
    "failed": lambda: run([al.scripted_response("r1", [text("Hi")], "stop",
                                                request_id="request-9")]),
    "maxSteps": lambda: run([tool_turn("r1", add_call())], [add_tool()], max_steps=1),
    "request-ids-offset-3": lambda: run([stop("r1", "The sum is 42.")], request_sequence_start=3),
}  # fmt: skip


class TestRoundTrips:
    """message_from_dict(m.to_dict()) == m and event_from_dict(e.to_dict()) == e, through
    JSON text too; equality is strict JSON (TestToolCallIsFrozen), so every JSON kind of
    EXTRA_ARGUMENTS (1.0 and 1, true, null, [] and {}) survives the trip."""

    @pytest.mark.parametrize(
        "message",
        [
            pytest.param(user(), id="user"),
            pytest.param(user("Ünïcödé 🙂 \u0000 \n", "user-ü"), id="user-unicode"),
            pytest.param(user("", "user-empty"), id="user-empty-content"),
            pytest.param(assistant("r"), id="assistant-empty"),
            pytest.param(assistant("r", text("")), id="assistant-empty-text"),
            pytest.param(assistant("r", text("a"), call("echo", "c1", EXTRA_ARGUMENTS), text("b"),
                                   call("add", "c2", {})), id="assistant-mixed-nested"),
            pytest.param(thinking_assistant(FULL_USAGE), id="thinking-full-usage"),
            pytest.param(thinking_assistant(al.Usage(output_tokens=7)), id="thinking-some-usage"),
            pytest.param(thinking_assistant(al.Usage()), id="thinking-usage-unknown"),
            pytest.param(thinking_assistant(None), id="thinking-no-usage"),
            pytest.param(add_result(), id="ok"),
            pytest.param(al.ToolResultMessage("tool-result-c", "c", "add", "no such tool", True),
                         id="error"),
        ],
    )  # fmt: skip
    def test_message(self, message: al.Message) -> None:
        for data in (message.to_dict(), through_json(message.to_dict())):
            again = al.message_from_dict(data)
            assert (again, type(again)) == (message, type(message))
            assert again.content == message.content  # the blocks in the model's order

    @pytest.mark.parametrize("make", RUNS_OF_EVERY_STATUS.values(), ids=list(RUNS_OF_EVERY_STATUS))
    def test_every_event_of_a_run_survives_json_text_exactly(
        self, make: Callable[[], tuple[list[al.Event], al.RunResult, Any]]
    ) -> None:
        """Read back, each event equals its original and writes the same JSON text."""
        events, result, _ = make()
        log = [json.dumps(event.to_dict()) for event in events]
        rebuilt = [al.event_from_dict(json.loads(line)) for line in log]
        assert rebuilt == [al.event_from_dict(event.to_dict()) for event in events] == events
        assert [json.dumps(event.to_dict()) for event in rebuilt] == log
        assert rebuilt[-1].payload["result"] == result


def event_dict(type: str, payload: Any, sequence: Any = 0) -> dict[str, Any]:
    return {"sequence": sequence, "type": type, "payload": payload}


def without(data: dict[str, Any], key: str) -> dict[str, Any]:
    return {name: value for name, value in data.items() if name != key}


def assistant_dict(content: Any, usage: Any = None) -> dict[str, Any]:
    data = {"id": "m", "role": "assistant", "content": content}
    return data if usage is None else {**data, "usage": usage}


def assistant_dict_with(arguments: Any) -> dict[str, Any]:
    """An assistant message dict whose one block is a call with these arguments."""
    return assistant_dict([{"type": "toolCall", "id": "c", "name": "n", "arguments": arguments}])


def thinking_dict(**fields: Any) -> dict[str, Any]:
    """An assistant message dict whose one block is a thinking block with these fields."""
    return assistant_dict([{"type": "thinking", **fields}])


def chunk_dict(chunk: Any) -> dict[str, Any]:
    return event_dict("model.chunk", {"requestId": "r", "chunk": chunk})


def result_dict(**changes: Any) -> dict[str, Any]:
    """A run.finished event dict whose result has these keys changed."""
    return event_dict("run.finished", {"result": {**RUN_RESULT_DICT, **changes}})


def finished_dict(**payload: Any) -> dict[str, Any]:
    return event_dict("tool.finished", {"requestId": "r", "toolCall": CALL_DICT, **payload})


USER_DICT = {"id": "u", "role": "user", "content": "hi"}
TEXT_BLOCK = {"type": "text", "text": "x"}
CALL_DICT = {"type": "toolCall", "id": "call-1", "name": "add", "arguments": {}}
THINKING_DICT = {"type": "thinking", "thinking": "t", "thinkingSignature": "s", "redacted": False}
USAGE_DICT = {"input": 1, "output": 1, "cacheRead": 1, "cacheWrite": 1, "reasoning": 1}
TOOL_RESULT_DICT = {"id": "tool-result-call-1", "role": "toolResult", "toolCallId": "call-1",
    "toolName": "add", "content": "3", "isError": False}  # fmt: skip
CALL_ARRAY = {**CALL_DICT, "arguments": []}
ERROR_DICT = {"code": "MODEL_STREAM_ERROR", "message": "m"}
RUN_RESULT_DICT = {"status": "completed", "messages": [], "steps": 1, "finalText": "ok"}
FULL_RESULT_DICT = {**RUN_RESULT_DICT, "maxSteps": 1, "error": ERROR_DICT,
                    "requestSequenceStart": 0,
                    "usage": USAGE_DICT}  # fmt: skip
OPTIONAL_KEYS = {"thinkingSignature", "redacted", "usage", *USAGE_DICT, "finalText", "maxSteps",
                 "error", "requestSequenceStart"}  # fmt: skip
OF_ANOTHER_TYPE = {str: 5, bool: "x", int: "x", list: {}, dict: []}


# Every object a reader reads: (the reader, its path, a valid one, how to embed it).
READ_OBJECTS: list[tuple[Callable[[Any], object], str, dict[str, Any], Callable[[Any], Any]]] = [
    (al.message_from_dict, "message", USER_DICT, lambda data: data),
    (al.message_from_dict, "message", TOOL_RESULT_DICT, lambda data: data),
    (al.message_from_dict, "message", assistant_dict([], USAGE_DICT), lambda data: data),
    (al.message_from_dict, "message.content[0]", TEXT_BLOCK,
     lambda block: assistant_dict([block])),
    (al.message_from_dict, "message.content[0]", CALL_DICT, lambda block: assistant_dict([block])),
    (al.message_from_dict, "message.content[0]", THINKING_DICT,
     lambda block: assistant_dict([block])),
    (al.message_from_dict, "message.usage", USAGE_DICT, lambda usage: assistant_dict([], usage)),
    (al.event_from_dict, "event", event_dict("message.accepted", {"message": USER_DICT}),
     lambda data: data),
    (al.event_from_dict, "event.payload", {"message": USER_DICT},
     lambda payload: event_dict("message.accepted", payload)),
    (al.event_from_dict, "event.payload", {"requestId": "r", "chunk": {**TEXT_BLOCK,
                                                                       "requestId": "r"}},
     lambda payload: event_dict("model.chunk", payload)),
    (al.event_from_dict, "event.payload.chunk", {**TEXT_BLOCK, "requestId": "r"}, chunk_dict),
    (al.event_from_dict, "event.payload.chunk", {"type": "thinking", "requestId": "r",
                                                 "thinking": "t"},
     chunk_dict),
    (al.event_from_dict, "event.payload.chunk", {"type": "toolCall", "requestId": "r",
                                                 "toolCall": CALL_DICT},
     chunk_dict),
    (al.event_from_dict, "event.payload", {"requestId": "r", "toolCall": CALL_DICT},
     lambda payload: event_dict("tool.started", payload)),
    (al.event_from_dict, "event.payload", {"requestId": "r", "toolCall": CALL_DICT,
                                           "toolResult": TOOL_RESULT_DICT},
     lambda payload: event_dict("tool.finished", payload)),
    (al.event_from_dict, "event.payload", {"result": FULL_RESULT_DICT},
     lambda payload: event_dict("run.finished", payload)),
    (al.event_from_dict, "event.payload.result", FULL_RESULT_DICT,
     lambda result: event_dict("run.finished", {"result": result})),
    (al.event_from_dict, "event.payload.result.error", ERROR_DICT,
     lambda error: event_dict("run.finished", {"result": {**RUN_RESULT_DICT, "error": error}})),
]  # fmt: skip


# Each required key of each object left out, and each key given a value of another JSON
# type: the reader, the dict, and the start of the message.
BROKEN_FIELDS = [
    *[pytest.param(read, embed(without(valid, key)), f"{path}.{key} is missing",
                   id=f"{path}.{key}-missing")
      for read, path, valid, embed in READ_OBJECTS for key in valid if key not in OPTIONAL_KEYS],
    *[pytest.param(read, embed({**valid, key: OF_ANOTHER_TYPE[type(value)]}),
                   f"{path}.{key} must be ",
                   id=f"{path}.{key}-of-another-type")
      for read, path, valid, embed in READ_OBJECTS for key, value in valid.items()],
]  # fmt: skip


# What a missing key or a wrong type does not cover: unknown values, index paths, bounds,
# and the rules that tie fields together.
MALFORMED_MESSAGES: dict[str, tuple[Any, str]] = {
    "not-an-object": ([], "message must be an object"),
    "unknown-role": ({**USER_DICT, "role": "system"}, "message.role: unknown value 'system'"),
    "toolCallId-null": ({**TOOL_RESULT_DICT, "toolCallId": None}, "message.toolCallId"),
    "isError-int": ({**TOOL_RESULT_DICT, "isError": 1}, "message.isError must be a boolean"),
    "block-not-object": (assistant_dict(["hi"]), "message.content[0] must be an object"),
    "unknown-block-type": (assistant_dict([{"type": "image"}]),
                           ".content[0].type: unknown value 'image'"),
    "text-without-text": (assistant_dict([TEXT_BLOCK, {"type": "text"}]),
                          ".content[1].text is missing"),
    "arguments-null": (assistant_dict_with(None), "message.content[0].arguments"),
    "arguments-too-deep": (assistant_dict_with(nested(al.MAX_ARGUMENT_DEPTH + 1)),
                           "content[0].arguments: arguments nest containers deeper than 32"),
    "arguments-too-many-values": (assistant_dict_with({"a": [0] * al.MAX_ARGUMENT_SLOTS}),
                                  "content[0].arguments: arguments hold more than 257 values"),
    "arguments-too-much-text": (assistant_dict_with({"a": "x" * al.MAX_ARGUMENT_TEXT}),
                                "content[0].arguments: arguments hold more than 4096 code points"),
    "arguments-nan": (assistant_dict_with({"a": float("nan")}),
                      "content[0].arguments: arguments hold nan, which is not a JSON number"),
    "redacted-with-thinking": (thinking_dict(thinking="secret", thinkingSignature="s",
                                             redacted=True),
                               "message.content[0]: a redacted thinking block holds its data"),
    "redacted-without-signature": (thinking_dict(thinking="", redacted=True),
                                   "got thinking '', signature None"),
    "usage-float": (assistant_dict([], {"output": 2.0}),
                    "message.usage.output must be an integer"),
    "usage-bool": (assistant_dict([], {"cacheRead": True}),
                   ".cacheRead must be an integer, got bool"),
    "usage-negative": (assistant_dict([], {"cacheWrite": -1}), ".cacheWrite must be >= 0, got -1"),
}  # fmt: skip
MALFORMED_EVENTS: dict[str, tuple[Any, str]] = {
    "not-an-object": ("event", "event must be an object"),
    "sequence-true": (event_dict("message.accepted", {"message": USER_DICT}, True), "got bool"),
    "sequence-float": (event_dict("message.accepted", {"message": USER_DICT}, 1.0), "got float"),
    "unknown-type": (event_dict("agent_start", {}), "event.type: unknown value 'agent_start'"),
    "message-malformed": (event_dict("message.accepted", {"message": without(USER_DICT, "id")}),
                          "event.payload.message.id is missing"),
    "unknown-chunk-type": (chunk_dict({"type": "image", "requestId": "r"}),
                           ".chunk.type: unknown value 'image'"),
    "chunk-toolCall-is-text": (chunk_dict({"type": "toolCall", "requestId": "r",
                                           "toolCall": TEXT_BLOCK}),
                               "event.payload.chunk.toolCall must be a toolCall block"),
    "started-toolCall-is-text": (event_dict("tool.started", {"requestId": "r",
                                                             "toolCall": TEXT_BLOCK}),
                                 "event.payload.toolCall must be a toolCall block"),
    "started-arguments-list": (event_dict("tool.started", {"requestId": "r",
                                                           "toolCall": CALL_ARRAY}),
                               "event.payload.toolCall.arguments must be an object"),
    "finished-toolResult-is-user": (finished_dict(toolResult=USER_DICT),
                                    "event.payload.toolResult must be a toolResult message"),
    "finished-isError-string": (finished_dict(toolResult={**TOOL_RESULT_DICT, "isError": "no"}),
                                "event.payload.toolResult.isError must be a boolean"),
    "steps-float": (result_dict(steps=1.5),
                    "event.payload.result.steps must be an integer, got float"),
    "unknown-status": (result_dict(status="done"),
                       "event.payload.result.status: unknown value 'done'"),
    "result-message-malformed": (result_dict(messages=[USER_DICT, {"id": "x"}]),
                                 "event.payload.result.messages[1].role is missing"),
    "unknown-error-code": (result_dict(error={"code": "OOPS", "message": "m"}),
                           ".code: unknown value 'OOPS'"),
    "run-usage-negative": (result_dict(usage={"input": -5}),
                           "event.payload.result.usage.input must be >= 0"),
}  # fmt: skip


class TestMalformedDicts:
    """A malformed message or event dict raises ValueError naming the field."""

    def test_the_objects_read_are_valid_as_given(self) -> None:
        """The valid objects whose fields test_a_broken_field_is_named breaks."""
        for read, _, valid, embed in READ_OBJECTS:
            read(embed(valid))

    @pytest.mark.parametrize(("read", "data", "field"), BROKEN_FIELDS)
    def test_a_broken_field_is_named(self, read: Any, data: Any, field: str) -> None:
        with pytest.raises(ValueError, match=re.escape(field)):
            read(data)

    @pytest.mark.parametrize(
        ("data", "field"), MALFORMED_MESSAGES.values(), ids=list(MALFORMED_MESSAGES)
    )
    def test_a_malformed_message(self, data: Any, field: str) -> None:
        with pytest.raises(ValueError, match=re.escape(field)):
            al.message_from_dict(data)

    @pytest.mark.parametrize(
        ("data", "field"), MALFORMED_EVENTS.values(), ids=list(MALFORMED_EVENTS)
    )
    def test_a_malformed_event(self, data: Any, field: str) -> None:
        with pytest.raises(ValueError, match=re.escape(field)):
            al.event_from_dict(data)

    @pytest.mark.parametrize(
        "arguments",
        [
            pytest.param(nested(al.MAX_ARGUMENT_DEPTH), id="depth-at-limit"),
            pytest.param({"a": [0] * (al.MAX_ARGUMENT_SLOTS - 1)}, id="values-at-limit"),
            pytest.param({"a": "x" * (al.MAX_ARGUMENT_TEXT - 1)}, id="text-at-limit"),
        ],
    )
    def test_arguments_at_the_bounds_are_read(self, arguments: dict[str, Any]) -> None:
        """The over-limit twins of these are rows of MALFORMED_MESSAGES, which
        test_a_malformed_message runs."""
        message = al.message_from_dict(assistant_dict_with(arguments))
        assert message == al.AssistantMessage("m", (al.ToolCall("c", "n", arguments),))

    def test_nan_from_json_text_is_rejected(self) -> None:
        """json.loads accepts NaN, which is not JSON: the reader must not."""
        line = json.dumps(assistant_dict_with({"x": 0})).replace('"x": 0', '"x": NaN')
        with pytest.raises(ValueError, match=r"arguments: .*not a JSON number"):
            al.message_from_dict(json.loads(line))

    def test_a_rejected_dict_is_left_unchanged(self) -> None:
        data = finished_dict(toolResult=USER_DICT)
        before = json.dumps(data, sort_keys=True)
        with pytest.raises(ValueError, match="toolResult"):
            al.event_from_dict(data)
        assert json.dumps(data, sort_keys=True) == before

    @pytest.mark.parametrize(
        ("read", "data", "expected"),
        [
            pytest.param(al.message_from_dict,
                         {**thinking_dict(thinking="", thinkingSignature=None, redacted=None),
                          "usage": None},
                         al.AssistantMessage("m", (al.ThinkingBlock(""),)),
                         id="thinking-and-usage"),
            pytest.param(al.message_from_dict, assistant_dict([], {"input": None, "output": 3}),
                         al.AssistantMessage("m", (), al.Usage(output_tokens=3)),
                         id="usage-count"),
            pytest.param(al.event_from_dict,
                         result_dict(status="cancelled", steps=0, finalText=None, maxSteps=None,
                                     error=None,
                                     requestSequenceStart=None),
                         al.Event(0, "run.finished", {"result": al.RunResult("cancelled", (), 0)}),
                         id="result"),
        ],
    )  # fmt: skip
    def test_null_keys_are_absent_keys(self, read: Any, data: Any, expected: object) -> None:
        """An optional key may be absent or null: both mean unset."""
        assert read(data) == expected


def replay_added(
    recorded: al.RunResult, start: Sequence[al.Message], tools: Sequence[al.Tool]
) -> tuple[list[al.Event], al.RunResult, al.ScriptedModel]:
    """Replays the part of a recorded transcript that the run added, from the same start."""
    model = al.ScriptedModel.from_transcript(recorded.messages[len(start) :])
    events, result, _ = run(model, tools, messages=start, max_steps=4)
    return events, result, model


class TestScriptedModelFromTranscript:
    """ScriptedModel.from_transcript: running the loop again from the same starting
    messages, with tools that behave the same, reproduces the recorded transcript exactly."""

    def test_each_assistant_message_becomes_a_response_in_order(self) -> None:
        """Response id = message id without "message-" (or the whole id); toolCall when it
        holds a call, else stop; one chunk per block; from any iterable."""
        transcript: list[al.Message] = [
            user(),
            assistant("response-001", text("A."), add_call()),
            add_result(),
        ]
        model = al.ScriptedModel.from_transcript(
            iter([*transcript, al.AssistantMessage("a2", ())])
        )
        events, result, _ = run(model, [add_tool()])
        assert result.messages == (*transcript, assistant("a2"))
        assert (result.status, types_of(events).count("model.chunk")) == ("completed", 2)
        with pytest.raises(RuntimeError):  # a request after the last response has none left
            model.stream(al.ModelRequest("request-003", (), ()), threading.Event())

    def test_replay_reproduces_the_transcript_and_the_events(self) -> None:
        events, result, recorder = recorded_run()
        replayed_events, replayed, model = replay_added(
            result, [user()], [add_tool(), echo_tool()]
        )
        assert (replayed, replayed_events, model.requests) == (result, events, recorder.requests)

    def test_it_replays_thinking_and_usage_one_chunk_per_block(self) -> None:
        """One chunk per block, though the recording streamed its thinking in pieces."""
        events, recorded, _ = run(thinking_script(), [add_tool()])
        replayed_events, replayed, _ = replay_added(recorded, [user()], [add_tool()])
        assert replayed == recorded
        assert replayed.usage == al.Usage(942, 114, 4096, 0, None)
        chunks = [e.payload["chunk"] for e in replayed_events if e.type == "model.chunk"]
        assert chunks[:2] == [
            al.ThinkingDelta("request-001", "The user wants a sum; the add tool gives it."),
            al.ThinkingDelta("request-001", ""),
        ]
        assert events[1].payload["chunk"] == al.ThinkingDelta(
            "request-001", "The user wants a sum; "
        )

    def test_history_must_be_left_out_of_the_replayed_part(self) -> None:
        """Every assistant message given is replayed: pass only the part the run added."""
        history: list[al.Message] = [user("Hi.", "user-000"), assistant("response-000"), user()]
        script = [tool_turn("response-001", add_call()), stop("response-002", "42.")]
        _, recorded, _ = run(script, messages=history, tools=[add_tool()])
        _, replayed, _ = replay_added(recorded, history, [add_tool()])
        assert (recorded.status, replayed) == ("completed", recorded)
        # Passed whole, the old turn is replayed first: its message id is taken already.
        whole = al.ScriptedModel.from_transcript(recorded.messages)
        _, wrong, _ = run(whole, [add_tool()], messages=history, max_steps=8)
        assert "message-response-000" in failure_message(wrong, "MODEL_PROTOCOL_ERROR")


# A transcript cancelled during its second tool batch: two calls of it have no result.
CANCELLED: tuple[al.Message, ...] = (
    user(),
    assistant("response-001", text("Echo first."), echo_call("call-echo-001")),
    echo_result("call-echo-001"),
    assistant("response-002", call("slow", "call-slow-001", {}), echo_call("call-echo-002")),
)


class TestResumeAfterCancellation:
    """open_tool_calls and resolve_open_tool_calls let a cancelled run's transcript start a
    new run (the resumed runs themselves: test_docs_and_demo.py resumes one from the demo's
    log, test_agent_loop_replay.py a chain of them, with thinking too; the result's
    request_sequence_start and next_request_sequence: test_agent_loop.py's request-id
    test)."""

    def test_open_calls_are_in_transcript_order_across_messages(self) -> None:
        first, second, third = (echo_call(id) for id in ("call-b", "call-a", "call-c"))
        transcript: list[al.Message] = [
            user(),
            assistant("1", first, second),
            echo_result("call-b"),
        ]
        transcript.append(assistant("2", third))
        assert al.open_tool_calls(transcript) == (second, third)
        assert al.open_tool_calls(iter(transcript)) == (second, third)
        assert al.open_tool_calls([*transcript[:3], echo_result("call-a")]) == ()
        assert al.open_tool_calls([]) == ()

    def test_resolve_appends_one_error_result_per_open_call(self) -> None:
        given = list(CANCELLED)
        resolved = al.resolve_open_tool_calls(iter(given), "interrupted")
        assert given == list(CANCELLED)
        assert resolved == (
            *CANCELLED,
            al.ToolResultMessage("tool-result-call-slow-001", "call-slow-001", "slow",
                                 "interrupted", True),
            al.ToolResultMessage("tool-result-call-echo-002", "call-echo-002", "echo",
                                 "interrupted", True),
        )  # fmt: skip
        assert al.open_tool_calls(resolved) == ()
        assert al.resolve_open_tool_calls(resolved, "again") == resolved
        for content in (None, b"interrupted", 1, ["interrupted"]):
            with pytest.raises(TypeError, match="content"):
                untyped.resolve_open_tool_calls([user()], content)

    def test_an_unresolved_transcript_cannot_start_a_new_run(self) -> None:
        """A cancelled run's transcript, its call still open, is an invalid start until
        resolve_open_tool_calls() answers the call (the rule's canonical test is
        test_agent_loop_transcript_and_model.py's TestInvalidStartingTranscript)."""
        events, result, model = run([stop("response-003", "No.")], messages=CANCELLED)
        assert_failed(events, result, "INVALID_TRANSCRIPT", "call-slow-001")
        assert model.call_count == 0
