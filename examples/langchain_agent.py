"""A LangGraph ReAct agent with two tools and a helper agent, run through agentrt.

    agentrt sim serve --replies agent &          # the embedded engine, scripted replies
    python examples/langchain_agent.py --base-url http://127.0.0.1:8000/replica-0/v1

    python examples/langchain_agent.py --base-url http://127.0.0.1:8000/v1 \
        --model my-model "What is 17 * 23, and how many words are in README.md?"

Needs ``pip install "agentjct[langchain]"``. Two lines wire LangChain to agentrt: the
model is ``langchain.model(rt, ...)`` (its calls go through agentrt), and
``config={"callbacks": [langchain.instrument(rt)]}`` maps the run onto a job, each agent
onto a session (the researcher's under the assistant's) and each tool onto a tool wait.
The default question carries the embedded engine's ``CALL``/``ANSWER`` directives
(docs/sim.md), so the run is the same every time; a real model reads them as
instructions.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool

import agentrt
from agentrt.integrations import langchain

# The tools' logic, the command line and the report, shared by the examples
from _shared import (
    arg_parser,
    calculate,
    count_words,
    one_line_errors,
    print_report,
    scripted_question,
)

QUESTION = scripted_question(helper_arg="question")


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression, e.g. 17 * 23."""
    return calculate(expression)


@tool
async def word_count(path: str) -> str:
    """Count the words in a local text file."""
    return await count_words(path)


def build_agent(rt: agentrt.Runtime, model_name: str) -> Any:
    """The assistant: a calculator, and a researcher agent behind a tool."""
    llm = langchain.model(rt, model_name)
    researcher = create_agent(llm, [word_count], name="researcher")

    @tool
    async def ask_researcher(question: str) -> str:
        """Ask the researcher about local files."""
        out = await researcher.ainvoke({"messages": [HumanMessage(question)]})
        return str(out["messages"][-1].content)

    return create_agent(llm, [calculator, ask_researcher], name="assistant")


async def run_agent(
    rt: agentrt.Runtime, model_name: str, question: str
) -> tuple[str, agentrt.JobReport]:
    """Run the assistant once; its answer and the job's report."""
    agent = build_agent(rt, model_name)
    out = await agent.ainvoke(
        {"messages": [("user", question)]},
        config={"callbacks": [langchain.instrument(rt)]},
    )
    return str(out["messages"][-1].content), rt.reports()[-1]  # the run's job, just ended


async def main() -> int:
    args = arg_parser(__doc__.splitlines()[0], QUESTION).parse_args()

    async with agentrt.Runtime([args.base_url], dialect=args.dialect, api_key=args.api_key) as rt:
        answer, report = await run_agent(rt, args.model, args.question)
    print_report(answer, report)
    return 0 if report.status == "ok" else 1


if __name__ == "__main__":
    with one_line_errors():
        sys.exit(anyio.run(main, backend="asyncio"))
