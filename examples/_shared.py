"""What the example agents share and is not about agentrt: the two tools' plain logic,
the scripted question, the command line and the printed report.

Each example wraps :func:`calculate` and :func:`count_words` as tools of its framework
and imports this module by name: running ``python examples/<name>.py`` puts this folder
on ``sys.path``.
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import openai

import agentrt

_OPS: dict[type[ast.AST], Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))  # type: ignore[no-any-return]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.operand))  # type: ignore[no-any-return]
    raise ValueError("only arithmetic is allowed")


def calculate(expression: str) -> str:
    """Evaluate + - * / ** on numbers, nothing else; an error comes back as text."""
    try:
        return str(_evaluate(ast.parse(expression.strip(), mode="eval").body))
    except (ValueError, SyntaxError, ZeroDivisionError, OverflowError) as exc:
        return f"error: {exc}"


async def count_words(path: str) -> str:
    """Count the words of a local text file, read without blocking the event loop."""
    try:
        text = await anyio.Path(path.strip()).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return f"error: {exc}"
    return str(len(text.split()))


def scripted_question(helper_arg: str) -> str:
    """The default question of the agents with a researcher helper. It carries the
    embedded engine's ``CALL``/``ANSWER`` directives (docs/sim.md), so a run on
    ``agentrt sim serve --replies agent`` is the same every time: the calculator, then
    the researcher (its tool takes the task as ``helper_arg``), which counts words."""
    helper_task = 'Count the words of README.md.\nCALL word_count {"path": "README.md"}'
    return (
        "What is 17 * 23, and how many words are in README.md? Ask the researcher for the "
        "count.\n"
        'CALL calculator {"expression": "17 * 23"}\n'
        f"CALL ask_researcher {json.dumps({helper_arg: helper_task})}\n"
        "ANSWER 391; the researcher counted the words."
    )


SIM_URL = "http://127.0.0.1:8000/v1"
"""Where ``agentrt sim serve`` serves the OpenAI API by default."""
SIM_MODEL = "sim-llama-3.1-8b"
"""The model ``agentrt sim serve`` serves by default (its ``h100-8b`` preset)."""


def arg_parser(
    description: str, question: str, model: str | None = SIM_MODEL
) -> argparse.ArgumentParser:
    """The examples' command line: a question, the server and the model (required when
    ``model`` is None). The defaults are ``agentrt sim serve``'s. ``description`` may be
    the example's docstring: its first paragraph, whole, describes the command."""
    first = description.strip().split("\n\n")[0]
    parser = argparse.ArgumentParser(description=" ".join(first.split()))
    parser.add_argument("question", nargs="?", default=question)
    parser.add_argument(
        "--base-url", default=SIM_URL, help="the OpenAI base URL (default: %(default)s)"
    )
    if model is None:
        parser.add_argument("--model", required=True)
    else:
        parser.add_argument("--model", default=model, help="default: %(default)s")
    parser.add_argument("--api-key", default=None, help="or set no key for local servers")
    parser.add_argument(
        "--dialect", default="generic", help="vllm, sglang, dynamo, ... (default: %(default)s)"
    )
    return parser


def print_report(answer: str, report: agentrt.JobReport) -> None:
    """The answer, then the job's report: its completion time beside the LLM time on
    its critical path, each call's latency and each tool wait."""
    print(f"answer: {answer}")
    print(
        f"job {report.name} ({report.job_id}): status={report.status} "
        f"jct={report.jct_s:.3f}s llm(critical)={report.critical_llm_s:.3f}s "
        f"tools={report.tool_s:.3f}s calls={report.calls} sessions={report.sessions}"
    )
    names = {s.session_id: s.name for s in report.session_reports}
    for s in report.session_reports:
        under = "" if s.parent_id is None else f" (parent: {names.get(s.parent_id)})"
        print(f"  session {s.name}{under}")
    for call in report.call_reports:
        print(f"  {call.session_name} turn {call.turn}: latency={call.latency_s or 0:.3f}s")
    for tool in report.tool_reports:
        print(
            f"  tool {tool.name} in {names.get(tool.session_id)}: "
            f"{tool.duration_s:.3f}s ({tool.status})"
        )


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then what it wraps: its cause or context, and an exception group's
    members (frameworks run tools and models in task groups), each once."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)


def _own(e: BaseException) -> bool:
    """Whether ``e`` is agentrt's or the server's own error, whose message says what to
    do: agentrt's errors, openai's (a reply's status and text), and the ValueError or
    TypeError agentrt raises for bad input (a URL without its scheme)."""
    if isinstance(e, agentrt.AgentrtError | openai.OpenAIError):
        return True
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = str(tb.tb_frame.f_globals.get("__name__", "")) if tb is not None else ""
    return isinstance(e, ValueError | TypeError) and where.split(".")[0] == "agentrt"


def error_line(exc: BaseException) -> str:
    """What went wrong, in one line: agentrt's or the server's own error (a server not
    there, a wrong model or URL) wherever a framework wrapped it, else ``exc`` itself."""
    for e in _chain(exc):
        if _own(e):
            return f"{type(e).__name__}: {e}"
    return f"{type(exc).__name__}: {exc} (AGENTRT_TRACEBACK=1 shows the traceback)"


@contextmanager
def one_line_errors() -> Iterator[None]:
    """Around an example's run: an error ends it in one line on stderr (exit status 1),
    not a traceback; ``AGENTRT_TRACEBACK=1`` shows the traceback instead."""
    try:
        yield
    except Exception as exc:
        if os.environ.get("AGENTRT_TRACEBACK"):
            raise
        sys.exit(f"{Path(sys.argv[0]).name}: error: {' '.join(error_line(exc).split())}")
