"""A LlamaIndex FunctionAgent with two tools and a helper agent, run through agentrt.

    agentrt sim serve --replies agent &          # the embedded engine, scripted replies
    python examples/llamaindex_agent.py --base-url http://127.0.0.1:8000/replica-0/v1

    python examples/llamaindex_agent.py --base-url http://127.0.0.1:8000/v1 \
        --model my-model "What is 17 * 23, and how many words are in README.md?"

Needs ``pip install "agentrt[llamaindex]"`` (LlamaIndex's OpenAI LLM needs openai<3). Two
lines wire LlamaIndex to agentrt: the agents' LLM is ``llamaindex.llm(rt, model=...)``
(its calls go through agentrt), and ``llamaindex.instrument(rt)`` maps each run onto a
job, each agent onto a session (the helper's under the assistant's) and each tool onto a
tool wait. The default question carries the embedded engine's ``CALL``/``ANSWER``
directives (docs/sim.md), so the run is the same every time; a real model reads them as
instructions.
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import sys
from collections.abc import Callable

import anyio
from llama_index.core.agent.workflow import FunctionAgent

import agentrt
from agentrt.integrations import llamaindex

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
    raise ValueError("only arithmetic is allowed")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (+ - * /), e.g. "17 * 23"."""
    try:
        return str(_evaluate(ast.parse(expression.strip(), mode="eval").body))
    except (ValueError, SyntaxError, ZeroDivisionError) as exc:
        return f"error: {exc}"


async def word_count(path: str) -> str:
    """Count the words of a local text file."""
    try:
        text = await anyio.Path(path.strip()).read_text(errors="replace")
    except OSError as exc:
        return f"error: {exc}"
    return str(len(text.split()))


async def run_agent(
    rt: agentrt.Runtime, model_name: str, question: str
) -> tuple[str, agentrt.JobReport]:
    """Run the assistant once; its answer and the job's report."""
    llm = llamaindex.llm(rt, model=model_name)
    researcher = FunctionAgent(
        name="researcher",
        system_prompt="You answer questions about local files with the word_count tool.",
        llm=llm,
        tools=[word_count],
    )

    async def ask_researcher(question: str) -> str:
        """Ask the researcher a question about local files."""
        return str(await researcher.run(user_msg=question))

    assistant = FunctionAgent(
        name="assistant",
        system_prompt="Answer with the calculator, and ask the researcher about files.",
        llm=llm,
        tools=[calculator, ask_researcher],
    )
    answer = await assistant.run(user_msg=question)
    return str(answer), rt.reports()[-1]  # the run's job, just ended


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question", nargs="?", default=QUESTION)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="agent-model", help="any name for the sim")
    parser.add_argument("--api-key", default=None, help="or set no key for local servers")
    parser.add_argument("--dialect", default="generic", help="vllm, sglang, dynamo, ...")
    args = parser.parse_args()

    async with agentrt.Runtime([args.base_url], dialect=args.dialect, api_key=args.api_key) as rt:
        llamaindex.instrument(rt)
        try:
            answer, report = await run_agent(rt, args.model, args.question)
        finally:
            llamaindex.uninstrument(rt)
    print(f"answer: {answer}")
    print(
        f"job {report.name} ({report.job_id}): status={report.status} "
        f"jct={report.jct_s:.3f}s llm(critical)={report.critical_llm_s:.3f}s "
        f"tools={report.tool_s:.3f}s calls={report.calls} sessions={report.sessions}"
    )
    for call in report.call_reports:
        print(f"  {call.session_name} turn {call.turn}: latency={call.latency_s or 0:.3f}s")
    for tool in report.tool_reports:
        print(f"  tool {tool.name}: {tool.duration_s:.3f}s ({tool.status})")
    return 0 if report.status == "ok" else 1


if __name__ == "__main__":
    sys.exit(anyio.run(main))
