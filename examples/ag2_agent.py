"""An AG2 agent with two tools and a helper agent, run through agentrt.

    agentrt sim serve --replies agent &          # the embedded engine, scripted replies
    python examples/ag2_agent.py

    python examples/ag2_agent.py --base-url http://127.0.0.1:8000/v1 \
        --model my-model "What is 17 * 23, and how many words are in README.md?"

Needs ``pip install "agentjct[ag2]"``. Two lines wire AG2 to agentrt: the agents' config is
``agentrt_ag2.model(rt, name)`` (its calls go through agentrt), and
``middleware=[agentrt_ag2.instrument(rt, <agent>)]`` maps each turn onto a job, each
agent onto a session (the researcher's, asked from the assistant's tool, under the
assistant's) and each tool call onto a tool wait. The default question carries the
embedded engine's ``CALL``/``ANSWER`` directives (docs/sim.md), so the run is the same
every time; a real model reads them as instructions.
"""

from __future__ import annotations

import sys

import anyio
from ag2 import Agent

import agentrt
from agentrt.integrations import ag2 as agentrt_ag2

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
    config = agentrt_ag2.model(rt, model_name)

    async def word_count(path: str) -> str:
        """Count the words of a local text file."""
        return await count_words(path)

    researcher = Agent(
        "researcher",
        prompt="You answer questions about local files with the word_count tool.",
        config=config,
        tools=[word_count],
        middleware=[agentrt_ag2.instrument(rt, "researcher")],
    )

    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression (+ - * /), e.g. "17 * 23"."""
        return calculate(expression)

    async def ask_researcher(task: str) -> str:
        """Ask the researcher about local files."""
        return (await researcher.ask(task)).body or ""

    assistant = Agent(
        "assistant",
        prompt="Answer with the calculator, and ask the researcher about files.",
        config=config,
        tools=[calculator, ask_researcher],
        middleware=[agentrt_ag2.instrument(rt, "assistant")],
    )
    reply = await assistant.ask(question)
    return reply.body or "", rt.reports()[-1]  # the run's job, just ended


async def main() -> int:
    args = arg_parser(__doc__.splitlines()[0], QUESTION).parse_args()
    async with agentrt.Runtime([args.base_url], dialect=args.dialect, api_key=args.api_key) as rt:
        answer, report = await run_agent(rt, args.model, args.question)
    print_report(answer, report)
    return 0 if report.status == "ok" else 1


if __name__ == "__main__":
    with one_line_errors():
        sys.exit(anyio.run(main))
