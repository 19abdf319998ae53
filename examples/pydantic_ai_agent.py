"""A PydanticAI agent with two tools and a helper agent, run through agentrt.

    agentrt sim serve --replies agent &          # the embedded engine, scripted replies
    python examples/pydantic_ai_agent.py

    python examples/pydantic_ai_agent.py --base-url http://127.0.0.1:8000/v1 \
        --model my-model "What is 17 * 23, and how many words are in README.md?"

Needs ``pip install "agentjct[pydantic-ai]"``. Two lines wire PydanticAI to agentrt: the
agents' model is ``agentrt_pydantic_ai.model(rt, name)`` (its calls go through agentrt),
and ``capabilities=[agentrt_pydantic_ai.instrument(rt)]`` maps each run onto a job, each
agent onto a session (the researcher's, run from the assistant's tool, under the
assistant's) and each tool call onto a tool wait. The default question carries the
embedded engine's ``CALL``/``ANSWER`` directives (docs/sim.md), so the run is the same
every time; a real model reads them as instructions.
"""

from __future__ import annotations

import sys

import anyio
from pydantic_ai import Agent

import agentrt
from agentrt.integrations import pydantic_ai as agentrt_pydantic_ai

# The tools' logic, the command line and the report, shared by the examples
from _shared import (
    arg_parser,
    calculate,
    count_words,
    one_line_errors,
    print_report,
    scripted_question,
)

QUESTION = scripted_question(helper_arg="task")


async def run_agent(
    rt: agentrt.Runtime, model_name: str, question: str
) -> tuple[str, agentrt.JobReport]:
    """Run the assistant once; its answer and the job's report."""
    model = agentrt_pydantic_ai.model(rt, model_name)
    capability = agentrt_pydantic_ai.instrument(rt)

    async def word_count(path: str) -> str:
        """Count the words of a local text file."""
        return await count_words(path)

    researcher = Agent(
        model,
        name="researcher",
        instructions="You answer questions about local files with the word_count tool.",
        tools=[word_count],
        capabilities=[capability],
    )

    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression (+ - * /), e.g. "17 * 23"."""
        return calculate(expression)

    async def ask_researcher(task: str) -> str:
        """Ask the researcher about local files."""
        return str((await researcher.run(task)).output)

    assistant = Agent(
        model,
        name="assistant",
        instructions="Answer with the calculator, and ask the researcher about files.",
        tools=[calculator, ask_researcher],
        capabilities=[capability],
    )
    result = await assistant.run(question)
    return str(result.output), rt.reports()[-1]  # the run's job, just ended


async def main() -> int:
    args = arg_parser(__doc__.splitlines()[0], QUESTION).parse_args()
    async with agentrt.Runtime([args.base_url], dialect=args.dialect, api_key=args.api_key) as rt:
        answer, report = await run_agent(rt, args.model, args.question)
    print_report(answer, report)
    return 0 if report.status == "ok" else 1


if __name__ == "__main__":
    with one_line_errors():
        sys.exit(anyio.run(main))
