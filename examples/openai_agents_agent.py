"""An OpenAI Agents SDK agent with two tools and a helper agent, run through agentrt.

    agentrt sim serve --replies agent &          # the embedded engine, scripted replies
    python examples/openai_agents_agent.py --base-url http://127.0.0.1:8000/replica-0/v1

    python examples/openai_agents_agent.py --base-url http://127.0.0.1:8000/v1 \
        --model my-model "What is 17 * 23, and how many words are in README.md?"

Needs ``pip install "agentrt[openai-agents]"``. Two lines wire the SDK to agentrt: the
agents' model is ``openai_agents.model(rt, name)`` (its calls go through agentrt), and
``openai_agents.instrument(rt)`` maps each run onto a job, each agent onto a session (the
helper's under the assistant's) and each tool onto a tool wait. The default question
carries the embedded engine's ``CALL``/``ANSWER`` directives (docs/sim.md), so the run
is the same every time; a real model reads them as instructions.
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import sys
from collections.abc import Callable

import anyio
from agents import Agent, RunConfig, Runner, function_tool

import agentrt
from agentrt.integrations import openai_agents

HELPER_TASK = 'Count the words of README.md.\nCALL word_count {"path": "README.md"}'
QUESTION = (
    "What is 17 * 23, and how many words are in README.md? Ask the researcher for the "
    "count.\n"
    'CALL calculator {"expression": "17 * 23"}\n'
    f"CALL ask_researcher {json.dumps({'input': HELPER_TASK})}\n"
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


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (+ - * /), e.g. "17 * 23"."""
    try:
        return str(_evaluate(ast.parse(expression.strip(), mode="eval").body))
    except (ValueError, SyntaxError, ZeroDivisionError) as exc:
        return f"error: {exc}"


@function_tool
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
    model = openai_agents.model(rt, model_name)
    researcher = Agent(
        name="researcher",
        instructions="You answer questions about local files with the word_count tool.",
        model=model,
        tools=[word_count],
    )
    assistant = Agent(
        name="assistant",
        instructions="Answer with the calculator, and ask the researcher about files.",
        model=model,
        tools=[
            calculator,
            researcher.as_tool(
                tool_name="ask_researcher", tool_description="Ask about local files."
            ),
        ],
    )
    result = await Runner.run(assistant, question, run_config=RunConfig(workflow_name="assistant"))
    return str(result.final_output), rt.reports()[-1]  # the run's job, just ended


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question", nargs="?", default=QUESTION)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="agent-model", help="any name for the sim")
    parser.add_argument("--api-key", default=None, help="or set no key for local servers")
    parser.add_argument("--dialect", default="generic", help="vllm, sglang, dynamo, ...")
    args = parser.parse_args()

    async with agentrt.Runtime([args.base_url], dialect=args.dialect, api_key=args.api_key) as rt:
        # exclusive: this processor only; the SDK's default one would export to OpenAI
        openai_agents.instrument(rt, exclusive=True)
        answer, report = await run_agent(rt, args.model, args.question)
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
