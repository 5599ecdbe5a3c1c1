# agent_loop_cli.py 1.2.0: the command line of agent_loop.py, an agent against a real model.
# One file, standard library only; copy it next to agent_loop.py and its companions
# agent_loop_providers.py, agent_loop_mcp.py, agent_loop_view.py and agent_loop_workspace.py.
# Home: the agent_loop repository.
"""An agent on the command line: the Agent Loop, a real model and a few small tools.

``python agent_loop_cli.py --provider openai --base-url URL --model NAME PROMPT`` runs
``run_agent_loop()`` on one user message against ``OpenAIChatModel`` (or, with
``--provider anthropic``, ``AnthropicMessagesModel``) with the tools of ``TOOLS`` and
those of the MCP servers that ``--mcp "COMMAND ARGS"`` starts, and prints each event on
one line as ``agent_loop.print_event`` does (``--json``: JSON lines, each event's
``to_dict()`` and the time it came, as ``agent_loop_replay`` reads them), then the run's
times (``agent_loop_view.format_times``) on stderr. ``--tool-concurrency N`` runs the
calls of one response on up to N threads; ``--confirm`` asks on the terminal before each
call. ``python agent_loop_cli.py --help`` lists every option.

``python agent_loop_cli.py view LOG -o PAGE.html`` writes the page of
``agent_loop_view.render_page`` for a recorded run: a ``--json`` log, a log of
``agent_loop_replay.dump_events`` or a durable run's journal.

``python agent_loop_cli.py code --workspace DIR PROMPT`` (and the model's options) is a
coding agent: the tools of ``agent_loop_workspace.Workspace(DIR)`` (files and commands kept
inside DIR), asking on the terminal before each call that changes something (``--yes``:
never; ``--confirm``: before every call).

``python agent_loop_cli.py --demo`` (which ``python agent_loop.py`` runs) is the
demonstration: a scripted model, no network.

It uses only the public names of ``agent_loop``, ``agent_loop_providers``,
``agent_loop_replay``, ``agent_loop_mcp``, ``agent_loop_view`` and ``agent_loop_workspace``.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import logging
import os
import shlex
import signal as os_signal
import socket
import sys
import threading
import time
from typing import (
    Any,
    Callable,
    Dict,
    Final,
    Iterator,
    List,
    Optional,
    Sequence,
    TextIO,
    Tuple,
)

import agent_loop as al
import agent_loop_mcp as mcp
import agent_loop_providers as providers
import agent_loop_replay as replay
import agent_loop_view as view
import agent_loop_workspace as workspace

__version__ = "1.2.0"

__all__ = ["TOOLS", "main"]


# --- The tools ----------------------------------------------------------------------


def add(left: float, right: float) -> Dict[str, float]:
    """Adds two numbers."""
    return {"sum": left + right}


def multiply(left: float, right: float) -> Dict[str, float]:
    """Multiplies two numbers."""
    return {"product": left * right}


def weather(city: str) -> str:
    """Reports the weather in a city."""
    stations = {"Lisbon": "sunny, 19 C", "Oslo": "snow, -3 C"}
    if city not in stations:
        raise al.ToolError(f"no weather station in {city}")  # the model reads this
    return stations[city]


TOOLS: Final = tuple(al.Tool.from_function(function) for function in (add, multiply, weather))
"""The command line's tools, add, multiply and weather: small, so that any model that
calls tools can use them, and with a weather station missing (Atlantis) on purpose."""


# --- The command line ---------------------------------------------------------------

_ANTHROPIC_MAX_TOKENS: Final[int] = (
    inspect.signature(providers.AnthropicMessagesModel).parameters["max_tokens"].default
)
"""The adapter's own default token limit, which --thinking must stay below."""


def _integer(low: int, high: Optional[int] = None) -> Callable[[str], int]:
    """An option's type: an int in low..high (no upper bound when high is None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if high is not None and not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not in {low}..{high}")
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is not >= {low}")
        return value

    return parse


def _option(text: str) -> Tuple[str, Any]:
    """An option's type: KEY=JSON, a field of the request body."""
    key, equals, value = text.partition("=")
    if not key or not equals:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=JSON")
    try:
        return key, json.loads(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"the value of {key} is not JSON: {value!r}") from None


def _command(text: str) -> List[str]:
    """An option's type: a command line, split as a POSIX shell would (no shell runs it)."""
    try:
        argv = shlex.split(text)
    except ValueError as error:  # an unclosed quote
        raise argparse.ArgumentTypeError(f"{text!r} is not a command line: {error}") from None
    if not argv:
        raise argparse.ArgumentTypeError("the command is empty")
    return argv


def _parser() -> argparse.ArgumentParser:
    """The options, in three groups: the model, the run, the output."""
    parser = argparse.ArgumentParser(
        prog="python agent_loop_cli.py",
        description=(
            "Runs the Agent Loop against a streaming model API, with a few tools (add, "
            "multiply, weather), and prints each event on one line as it comes: the "
            "model's text and thinking, each tool call and result, then the result with "
            "its token usage. The API key comes from OPENAI_API_KEY or ANTHROPIC_API_KEY, "
            "if set. Ctrl-C cancels the run."
        ),
    )
    parser.add_argument("prompt", metavar="PROMPT", help="the user's message")
    model = parser.add_argument_group("the model")
    model.add_argument("--provider", required=True, choices=("openai", "anthropic"))
    model.add_argument(
        "--base-url",
        required=True,
        metavar="URL",
        help="e.g. http://localhost:11434/v1 (Ollama) or https://api.anthropic.com",
    )
    model.add_argument("--model", required=True, metavar="NAME", help="the provider's model")
    model.add_argument("--system", metavar="TEXT", help="the system prompt")
    model.add_argument(
        "--max-tokens",
        type=_integer(1),
        metavar="N",
        help="the answer's token limit (OpenAI: max_tokens in the body; Anthropic: "
        f"{_ANTHROPIC_MAX_TOKENS} unless given)",
    )
    model.add_argument(
        "--thinking",
        type=_integer(1024),  # the API's least thinking budget
        metavar="BUDGET",
        help="Anthropic: extended thinking with this token budget, 1024 or more and below "
        f"the answer's token limit (--max-tokens, default {_ANTHROPIC_MAX_TOKENS})",
    )
    model.add_argument(
        "--option",
        type=_option,
        action="append",
        default=[],
        metavar="KEY=JSON",
        help='a field of the request body, e.g. temperature=0 or stop=["\\n"] (repeatable)',
    )
    model.add_argument(
        "--retries",
        type=_integer(0),
        default=2,
        metavar="N",
        help="more attempts after a transient failure before the answer starts (default 2)",
    )
    model.add_argument(
        "--accept-truncated",
        action="store_true",
        help="accept a text answer cut by the token limit (logged) instead of failing",
    )
    run = parser.add_argument_group("the run")
    run.add_argument(
        "--max-steps",
        type=_integer(1, al.MAX_AGENT_STEPS),
        default=8,
        metavar="N",
        help=f"the step budget, 1..{al.MAX_AGENT_STEPS} (default 8)",
    )
    run.add_argument(
        "--tool-concurrency",
        type=_integer(1),
        default=1,
        metavar="N",
        help="run the tool calls of one response on up to N threads, events and results "
        "still in the model's order (default 1: one after the other)",
    )
    run.add_argument(
        "--confirm",
        action="store_true",
        help="ask y/n on the terminal (stderr, then a line of stdin) before each tool call: "
        "y runs it; anything else, or the end of input, refuses it",
    )
    run.add_argument(
        "--mcp",
        type=_command,
        action="append",
        default=[],
        metavar='"COMMAND ARGS"',
        help="start an MCP server on stdio and give the model its tools too (repeatable); "
        "the servers end with the run",
    )
    output = parser.add_argument_group("the output")
    output.add_argument(
        "--json",
        action="store_true",
        help="print each event as one JSON line (its to_dict form and its time, as "
        "agent_loop_replay.dump_events(..., times=True) writes), nothing else; the run's "
        "times still go to stderr",
    )
    return parser


def _model(parser: argparse.ArgumentParser, options: argparse.Namespace) -> al.Model:
    """The model the options describe; a bad combination is a usage error (exit status 2)."""
    body = dict(options.option)
    arguments: Dict[str, Any] = {
        "base_url": options.base_url,
        "system": options.system,
        "retries": options.retries,
        "accept_truncated": options.accept_truncated,
    }
    model_class: Any = providers.OpenAIChatModel
    if options.provider == "anthropic":
        model_class = providers.AnthropicMessagesModel
        if options.max_tokens is not None:
            arguments["max_tokens"] = options.max_tokens
        if options.thinking is not None:
            limit = options.max_tokens or _ANTHROPIC_MAX_TOKENS
            if options.thinking >= limit:
                parser.error(
                    f"--thinking {options.thinking} must be below the token limit, {limit} "
                    f"(raise it with --max-tokens)"
                )
            arguments["thinking"] = {"type": "enabled", "budget_tokens": options.thinking}
    elif options.thinking is not None:
        parser.error(
            "--thinking is for --provider anthropic (OpenAI-compatible servers "
            "take their own fields: --option KEY=JSON)"
        )
    elif options.max_tokens is not None:
        if "max_tokens" in body:
            parser.error("give max_tokens once: --max-tokens or --option max_tokens=...")
        body["max_tokens"] = options.max_tokens
    try:
        model: al.Model = model_class(options.model, options=body, **arguments)
    except (TypeError, ValueError) as error:
        parser.error(str(error))
    return model


def _tools(
    parser: argparse.ArgumentParser,
    options: argparse.Namespace,
    servers: contextlib.ExitStack,
    own: Sequence[al.Tool] = TOOLS,
) -> al.ToolRegistry:
    """``own`` (TOOLS) and the tools of each --mcp server, whose session ``servers`` ends; a
    server that cannot be used, or a tool name given twice, is a usage error (exit status 2)."""
    registry = al.ToolRegistry(own)
    whose = {tool.name: "the command line's own tools" for tool in own}
    for argv in options.mcp:
        where = f"--mcp {shlex.join(argv)!r}"
        try:
            tools = servers.enter_context(mcp.StdioServer(argv)).tools()
        except mcp.McpError as error:
            parser.error(f"{where}: {error}")
        for tool in tools:
            if tool.name in whose:
                # The model calls a tool by its name: two tools of one name cannot both be
                # given to it, and the command line does not rename a server's tools.
                parser.error(
                    f"two tools are named {tool.name!r}: one of {whose[tool.name]} and one "
                    f"of {where}"
                )
            whose[tool.name] = where
            registry.register(tool)
    return registry


_REFUSAL: Final = "the user refused to run this tool call"
"""The error result of a call whose --confirm question was not answered y."""

_ANSWER_POLL_SECONDS: Final = 0.05
"""How often a --confirm question looks at the run's signal: Ctrl-C ends it this soon."""


def _confirm(stdin: TextIO, stderr: TextIO) -> Callable[[al.ToolCall, al.Signal], Optional[str]]:
    """--confirm's before_tool_call: the question on stderr, the answer a line of stdin."""

    def before_tool_call(call: al.ToolCall, signal: al.Signal) -> Optional[str]:
        arguments = json.dumps(call.plain_arguments(), ensure_ascii=False, separators=(",", ":"))
        print(f"run {call.name}({arguments}) [{call.id}]? [y/N] ", end="", file=stderr, flush=True)
        answers: List[str] = []
        answered = threading.Event()

        def read() -> None:
            try:
                answers.append(stdin.readline())
            except Exception:  # a closed or missing stdin: no answer, as at its end (a
                # reader that died with its exception would leave the question unanswered)
                answers.append("")
            answered.set()

        # The line is read in a thread of its own, so that Ctrl-C (the signal) ends the
        # wait; the run then ends cancelled, and the reader is left to the process's exit.
        threading.Thread(target=read, daemon=True).start()
        while not answered.wait(_ANSWER_POLL_SECONDS):
            if signal.is_set():
                print(file=stderr)  # ends the question's line
                return _REFUSAL  # not used: the loop sees the signal and leaves the call open
        answer = answers[0]
        if not answer.endswith("\n"):
            print(file=stderr)  # the end of input: the question's line ends here
        return None if answer.strip().lower() in ("y", "yes") else _REFUSAL

    return before_tool_call


def _json_line(event: al.Event, seconds: float) -> None:
    """--json's line: the event's to_dict() and "time", the seconds since the run began,
    written by agent_loop_replay's one line writer."""
    sys.stdout.write(replay.json_line(dict(event.to_dict(), time=seconds)) + "\n")
    sys.stdout.flush()  # each event as it comes: the reader may be a pipe


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs an agent with ``TOOLS`` and the ``--mcp`` servers' tools against a provider
    and prints its events.

    Prints each event on one line (``agent_loop.print_event``), the result last;
    ``--json`` writes each event as one JSON line with its time and nothing else. The
    run's times follow on stderr (``agent_loop_view.format_times``). ``--confirm``
    writes its question to stderr and reads the answer from stdin. The ``--mcp`` servers
    start before the run and are closed when it ends, whatever way. Returns 0 when the
    run completed, 1 otherwise. Ctrl-C sets the run's signal at once, even while the run
    waits on the network, so the run ends ``cancelled`` and its result is printed; a
    second Ctrl-C interrupts at once. Retries
    and accepted cut answers are logged on stderr. Bad options, an MCP server that cannot
    be used, and two tools of one name exit with status 2.

    ``view LOG -o PAGE.html`` as the first arguments writes the page of a recorded run
    (``agent_loop_view.render_page``) instead; exit status 0 when written, 2 for a log
    that holds no run, naming the line at fault.

    With ``--demo`` first, it runs the scripted demonstration instead (no model;
    ``python agent_loop.py`` runs it too: ``--json``, ``--max-steps N``, ``--cancel-after K``).
    """
    arguments = sys.argv[1:] if argv is None else list(argv)
    if arguments[:1] == ["view"]:
        return _view(arguments[1:])
    if arguments[:1] == ["chat"]:
        return _chat(arguments[1:])
    if arguments[:1] == ["--demo"]:
        return _demo(arguments[1:])
    if arguments[:1] == ["code"]:
        return _code(arguments[1:])
    parser = _parser()
    options = parser.parse_args(arguments)
    model = _model(parser, options)
    with contextlib.ExitStack() as servers:  # the servers end whatever happens
        return _run(options, model, _tools(parser, options, servers))


def _run(
    options: argparse.Namespace,
    model: al.Model,
    tools: al.ToolRegistry,
    consent: Optional[Callable[[al.ToolCall, al.Signal], Optional[str]]] = None,
) -> int:
    """Runs the agent and prints its events; 0 when the run completed, else 1. ``consent``:
    the before_tool_call, when not --confirm's."""
    signal = threading.Event()
    # Retries and accepted cut answers go to stderr, as warnings; only while main runs.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("warning: %(message)s"))
    logger = logging.getLogger("agent_loop.providers")
    logger.addHandler(handler)
    timed: List[Tuple[al.Event, Optional[float]]] = []

    def on_event(event: al.Event) -> None:
        # When what it reports happened, on the clock started at the run's first next().
        seconds = replay.event_seconds(event, began)
        timed.append((event, seconds))
        if options.json:
            _json_line(event, seconds)
        else:
            al.print_event(event)

    try:
        run = al.run_agent_loop(
            messages=[al.UserMessage("user-001", options.prompt)],
            model=model,
            tools=tools,
            max_steps=options.max_steps,
            signal=signal,
            tool_concurrency=options.tool_concurrency,
            before_tool_call=_confirm(sys.stdin, sys.stderr) if options.confirm else consent,
        )
        with _ctrl_c_cancels(signal):
            began = time.time()  # the clock of Event.time
            _, result = al.settle_run(run, on_event=on_event)
    finally:
        logger.removeHandler(handler)
    # On stderr, so that stdout holds the events only (with --json, one per line).
    print(view.format_times(view.summarize_times(timed)), file=sys.stderr, flush=True)
    return 0 if result.status == "completed" else 1


@contextlib.contextmanager
def _ctrl_c_cancels(signal: threading.Event) -> Iterator[None]:
    """Within the block, Ctrl-C sets ``signal`` (the run ends cancelled), at once (see
    _ctrl_c_sets); a second Ctrl-C interrupts at once, whatever the run is doing."""

    def interrupt(number: int, frame: object) -> None:
        signal.set()
        os_signal.signal(os_signal.SIGINT, previous)

    previous = os_signal.signal(os_signal.SIGINT, interrupt)
    try:
        with _ctrl_c_sets(signal):
            yield
    finally:
        os_signal.signal(os_signal.SIGINT, previous)


@contextlib.contextmanager
def _ctrl_c_sets(signal: threading.Event) -> Iterator[None]:
    """Within the block, a thread sets ``signal`` as soon as SIGINT arrives.

    Python runs a signal's handler in the main thread between two bytecodes: a SIGINT that
    lands while that thread is on its way into a blocking read (the adapters' socket) is
    handled only once the read returns, up to ``--timeout`` later. The C-level handler
    writes the signal's number to the wakeup fd at once, in whatever thread it lands: the
    thread reading it sets the run's signal, the adapter's watcher shuts the socket down,
    and the read returns. Other signals with a Python handler write there too: they do
    not cancel the run.
    """
    receiving, sending = socket.socketpair()
    sending.setblocking(False)  # set_wakeup_fd's rule: the handler must never block

    def wait() -> None:
        for number in iter(lambda: receiving.recv(1), b""):  # b"": the block has ended
            if number[0] == os_signal.SIGINT:
                signal.set()

    waiter = threading.Thread(target=wait, name="agent_loop_cli Ctrl-C", daemon=True)
    waiter.start()
    previous = os_signal.set_wakeup_fd(sending.fileno())
    try:
        yield
    finally:
        os_signal.set_wakeup_fd(previous)
        sending.close()
        waiter.join()  # bounded: the close just above ends its recv() with b""
        receiving.close()


# --- code: a coding agent in a workspace ---------------------------------------------


def _code(argv: Sequence[str]) -> int:
    """``code --workspace DIR PROMPT``: the run of ``main`` with the workspace's tools (and
    the --mcp servers'), asking before each call of a tool that is not read-only."""
    parser = _parser()
    parser.prog = "python agent_loop_cli.py code"
    parser.description = (
        "A coding agent: runs the Agent Loop against a streaming model API with the tools "
        "of agent_loop_workspace (read_file, write_file, edit_file, list_dir, find_files, "
        "grep, run_command), whose files and commands stay inside the workspace, and asks "
        "y/n on the terminal before each call that changes something. Ctrl-C cancels the run."
    )
    parser.add_argument(
        "--workspace",
        required=True,
        metavar="DIR",
        help="the directory the agent works in (commands run under Landlock where the "
        "kernel has it)",
    )
    parser.add_argument(
        "--yes", action="store_true", help="run every call without asking (no question)"
    )
    options = parser.parse_args(argv)
    model = _model(parser, options)
    try:
        space = workspace.Workspace(options.workspace)
    except ValueError as error:
        parser.error(f"--workspace {options.workspace}: {error}")
    with space, contextlib.ExitStack() as servers:
        sandbox = "sandboxed by Landlock" if space.sandboxed else "commands not sandboxed"
        print(f"workspace: {space.root} ({sandbox})", file=sys.stderr, flush=True)
        tools = _tools(parser, options, servers, own=space.tools())
        ask = _confirm(sys.stdin, sys.stderr)

        def before_tool_call(call: al.ToolCall, signal: al.Signal) -> Optional[str]:
            tool = tools.get(call.name)
            if tool is not None and tool.annotations.get("readOnlyHint") is True:
                return None  # it changes nothing: no question
            return ask(call, signal)

        return _run(options, model, tools, None if options.yes else before_tool_call)


# --- view: the page of a recorded run ------------------------------------------------


def _view(argv: Sequence[str]) -> int:
    """``view LOG -o PAGE.html``: writes the page of the run that LOG records; 0 when
    written. A log that cannot be read, or holds no run, exits with status 2 naming the
    line."""
    parser = argparse.ArgumentParser(
        prog="python agent_loop_cli.py view",
        description=(
            "Writes one self-contained HTML page that draws a recorded run: its steps on a "
            "timeline, each call's arguments and result, errors and refusals, the result, "
            "its usage and times. LOG is a --json log, a log of "
            "agent_loop_replay.dump_events, or a durable run's journal."
        ),
    )
    parser.add_argument("log", metavar="LOG", help="the recorded run (JSON lines)")
    parser.add_argument(
        "-o", "--output", required=True, metavar="PAGE.html", help="the page to write"
    )
    options = parser.parse_args(argv)
    try:
        timed, journal = view.read_run(options.log)  # a journal or a log, by its first line
    except (OSError, ValueError) as error:  # unreadable, not UTF-8, or no event on a line
        parser.error(f"{options.log}: {error}")
    if not timed:
        parser.error(f"{options.log}: no event in the file")
    title = f"Agent run: {os.path.basename(options.log)}"
    page = view.render_page(timed, title=title, journal=journal)
    try:
        with open(options.output, "w", encoding="utf-8") as file:
            file.write(page)
    except OSError as error:
        parser.error(f"{options.output}: {error}")
    return 0


# --- chat: a conversation kept in a session file ---------------------------------------


def _chat(argv: Sequence[str]) -> int:
    """``chat --session FILE [options] PROMPT``: one turn of the conversation FILE keeps
    (``agent_loop_session.Session``); PROMPT ``-`` makes each line of stdin a turn.
    Prints as the run does; 0 when every turn completed, 1 otherwise (another process in
    a turn of the session too), 2 for bad options."""
    import agent_loop_context as context
    import agent_loop_session as sessions

    parser = _parser()
    parser.prog = "python agent_loop_cli.py chat"
    parser.description = (
        "One turn of a conversation kept in a SQLite file (PROMPT - : each line of stdin a "
        "turn): the model sees every earlier turn, and a turn goes on past 64 requests. "
        "The options of a run, and these."
    )
    parser.set_defaults(max_steps=None)  # a turn's budget is --max-requests
    group = parser.add_argument_group("the session")
    group.add_argument("--session", required=True, metavar="FILE", help="the SQLite file")
    group.add_argument("--session-id", default="default", metavar="ID", help="of many in FILE")
    group.add_argument(
        "--max-requests",
        type=_integer(1),
        default=al.MAX_AGENT_STEPS,
        metavar="N",
        help=f"a turn's request budget, more than {al.MAX_AGENT_STEPS} too (default: that)",
    )
    group.add_argument(
        "--context-window",
        type=_integer(1),
        metavar="TOKENS",
        help="fold older turns into a summary so that every request fits TOKENS",
    )
    options = parser.parse_args(argv)
    if options.max_steps is not None:
        parser.error("chat takes a turn's budget as --max-requests N, not --max-steps")
    model = _model(parser, options)
    window = (
        None if options.context_window is None else context.ContextWindow(options.context_window)
    )
    prompts = (
        [line.rstrip("\n") for line in sys.stdin if line.strip()]
        if options.prompt == "-"
        else [options.prompt]
    )
    began = 0.0  # when the run of the turn being printed began (a turn may take several)

    def print_line(event: al.Event) -> None:
        nonlocal began
        if not options.json:
            al.print_event(event)
            return
        if event.sequence == 0:  # each run of a turn is timed from its first event, as logs
            began = time.time()
        _json_line(event, replay.event_seconds(event, began))

    completed = True
    with contextlib.ExitStack() as servers:  # the servers end whatever happens
        tools = _tools(parser, options, servers)
        session = servers.enter_context(sessions.Session(options.session, options.session_id))
        for prompt in prompts:
            signal = threading.Event()
            try:
                turn = session.run(
                    prompt,
                    model=model,
                    tools=tools,
                    max_requests=options.max_requests,
                    signal=signal,
                    tool_concurrency=options.tool_concurrency,
                    before_tool_call=_confirm(sys.stdin, sys.stderr) if options.confirm else None,
                    context=window,
                )
            except sessions.SessionBusy as busy:
                print(f"chat: {busy}", file=sys.stderr)
                return 1
            with _ctrl_c_cancels(signal):
                _, result = al.settle_run(turn, on_event=print_line)
            completed = completed and result.status == "completed"
    return 0 if completed else 1


# --- The demonstration (python agent_loop.py) ----------------------------------------


def divide(dividend: float, divisor: float) -> Dict[str, float]:
    """Divides a number."""
    return {"quotient": dividend / divisor}  # by 0: an error result, which the model reads


def _demo_model() -> al.ScriptedModel:
    """The script: thinking and one call, two calls (one fails), then the answer."""
    thinking = al.ThinkingBlock(
        "Two operations: the sum first, then the division.", "sig-demo-001"
    )
    add_call = al.ToolCall("call-add-001", "add", {"left": 20, "right": 22})
    half = al.ToolCall("call-divide-001", "divide", {"dividend": 42, "divisor": 2})
    by_zero = al.ToolCall("call-divide-002", "divide", {"dividend": 42, "divisor": 0})
    answer = ["(20 + 22) / 2 = 21. ", "42 / 0 has no value: ", "division by zero."]
    return al.ScriptedModel(
        [
            al.scripted_response(
                "response-001",
                [thinking, al.TextBlock("First the sum."), add_call],
                "toolCall",
                usage=al.Usage(412, 58, 0, 1024, 12),
            ),
            al.scripted_response(
                "response-002", [half, by_zero], "toolCall", usage=al.Usage(96, 41, 1024, 0, 0)
            ),
            al.scripted_response(
                "response-003",
                [al.TextBlock("".join(answer))],
                "stop",
                chunks=[al.TextBlock(piece) for piece in answer],
                usage=al.Usage(188, 19, 1024, 0, 0),
            ),
        ]
    )


def _demo(argv: Sequence[str]) -> int:
    """The demonstration: a scripted run over add and divide, printed one event per line."""
    parser = argparse.ArgumentParser(
        prog="python agent_loop.py",
        description="Runs the Agent Loop on a scripted model with two tools (one call "
        "fails, recoverably) and prints each event on one line, the result last.",
    )
    parser.add_argument("--json", action="store_true", help="print each event as JSON")
    budget = f"the step budget, 1..{al.MAX_AGENT_STEPS} (the demo needs 3)"
    parser.add_argument(
        "--max-steps", type=int, default=al.MAX_AGENT_STEPS, metavar="N", help=budget
    )
    parser.add_argument(
        "--cancel-after", type=int, metavar="K", help="set the signal once event K is printed"
    )
    options = parser.parse_args(argv)
    if not 1 <= options.max_steps <= al.MAX_AGENT_STEPS:
        parser.error(
            f"argument --max-steps: {options.max_steps} is not in 1..{al.MAX_AGENT_STEPS}"
        )
    if options.cancel_after is not None and options.cancel_after < 0:
        parser.error(f"argument --cancel-after: {options.cancel_after} is negative")
    signal = threading.Event()

    def show(event: al.Event) -> None:
        if options.json:
            print(replay.json_line(event.to_dict()))
        else:
            al.print_event(event)
        if event.sequence == options.cancel_after:
            signal.set()

    al.settle_run(
        al.run_agent_loop(
            messages=[al.UserMessage("user-001", "What is (20 + 22) / 2? And 42 / 0?")],
            model=_demo_model(),
            tools=al.ToolRegistry([TOOLS[0], al.Tool.from_function(divide)]),  # add, divide
            max_steps=options.max_steps,
            signal=signal,
        ),
        on_event=show,
    )
    return 0


if __name__ == "__main__":
    try:
        status = main()
        sys.stdout.flush()  # here, where a broken pipe can still be caught
    except BrokenPipeError:
        # The reader left early (`--json | head`): stop quietly, and keep Python from
        # reporting the same broken pipe again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 1
    sys.exit(status)
