"""A LangGraph ReAct agent with two tools and a helper agent, run through agentrt.

    agentrt sim serve --replies agent &          # the embedded engine, scripted replies
    python examples/langchain_agent.py --base-url http://127.0.0.1:8000/replica-0/v1

    python examples/langchain_agent.py --base-url http://127.0.0.1:8000/v1 \
        --model my-model "What is 17 * 23, and how many words are in README.md?"

Needs ``pip install "agentrt[langchain]"``. Two lines wire LangChain to agentrt: the
model is ``langchain.chat_model(rt, model=...)`` (its calls go through agentrt), and
``config={"callbacks": [langchain.callbacks(rt)]}`` maps the run onto a job, each agent
onto a session (the researcher's under the assistant's) and each tool onto a tool wait.
The default question carries the embedded engine's ``CALL``/``ANSWER`` directives
(docs/sim.md), so the run is the same every time; a real model reads them as
instructions.
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import sys
import warnings
from collections.abc import Callable
from typing import Any

import anyio
from langchain_core.tools import tool
from langgraph.prebuilt import create_react_agent

import agentrt
from agentrt.integrations import langchain

HELPER_TASK = 'Count the words of README.md.\nCALL word_count {"path": "README.md"}'
QUESTION = (
    "What is 17 * 23, and how many words are in README.md? Ask the researcher for the "
    "count.\n"
    'CALL calculator {"expression": "17 * 23"}\n'
    f"CALL ask_researcher {json.dumps({'question': HELPER_TASK})}\n"
    "ANSWER 391; the researcher counted the words."
)

_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand)
    raise ValueError("only + - * / on numbers")


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression, e.g. 17 * 23."""
    try:
        value = _evaluate(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"error: {exc}"
    return str(int(value)) if value == int(value) else str(value)


@tool
async def word_count(path: str) -> str:
    """Count the words in a local text file."""
    text = await anyio.Path(path).read_text(encoding="utf-8", errors="replace")
    return str(len(text.split()))


def build_agent(rt: agentrt.Runtime, model_name: str) -> Any:
    """The assistant: a calculator, and a researcher agent behind a tool."""
    llm = langchain.chat_model(rt, model=model_name)
    with warnings.catch_warnings():  # create_react_agent moved to the `langchain` package
        warnings.simplefilter("ignore", DeprecationWarning)
        researcher = create_react_agent(llm, [word_count], name="researcher")

        @tool
        async def ask_researcher(question: str) -> str:
            """Ask the researcher about local files."""
            out = await researcher.ainvoke({"messages": [("user", question)]})
            return str(out["messages"][-1].content)

        return create_react_agent(llm, [calculator, ask_researcher], name="assistant")


async def run_agent(
    rt: agentrt.Runtime, model_name: str, question: str
) -> tuple[str, agentrt.JobReport]:
    """Run the assistant once; its answer and the job's report."""
    agent = build_agent(rt, model_name)
    out = await agent.ainvoke(
        {"messages": [("user", question)]},
        config={"callbacks": [langchain.callbacks(rt)]},
    )
    return str(out["messages"][-1].content), rt.reports()[-1]  # the run's job, just ended


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question", nargs="?", default=QUESTION)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="agent-model", help="any name for the sim")
    parser.add_argument("--api-key", default=None, help="or set no key for local servers")
    parser.add_argument("--dialect", default="generic", help="vllm, sglang, dynamo, ...")
    args = parser.parse_args()

    async with agentrt.Runtime([args.base_url], dialect=args.dialect, api_key=args.api_key) as rt:
        answer, report = await run_agent(rt, args.model, args.question)
    print(f"answer: {answer}")
    print(
        f"job {report.name} ({report.job_id}): status={report.status} "
        f"jct={report.jct_s:.3f}s llm(critical)={report.critical_llm_s:.3f}s "
        f"tools={report.tool_s:.3f}s calls={report.calls} sessions={report.sessions}"
    )
    for call in report.call_reports:
        print(f"  {call.session_name} turn {call.turn}: latency={call.latency_s or 0:.3f}s")
    for t in report.tool_reports:
        print(f"  tool {t.name}: {t.duration_s:.3f}s ({t.status})")
    return 0 if report.status == "ok" else 1


if __name__ == "__main__":
    sys.exit(anyio.run(main, backend="asyncio"))
