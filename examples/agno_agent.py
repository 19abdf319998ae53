"""An Agno agent with two tools and a helper agent, run through agentrt.

    agentrt sim serve --replies agent &          # the embedded engine, scripted replies
    python examples/agno_agent.py

    python examples/agno_agent.py --base-url http://127.0.0.1:8000/v1 \
        --model my-model "What is 17 * 23, and how many words are in README.md?"

Needs ``pip install "agentjct[agno]"``. Two lines wire Agno to agentrt: each agent's
model is ``OpenAIChat(async_client=agents.openai(<agent>))`` (its calls are that agent's
session's turns), and the run is ``async with agents.job(...)``; the tools, wrapped by
``agents.tool(<agent>, fn)``, are tool waits, and the researcher, run from the
assistant's tool, gets a session whose parent is the assistant's. The default question
carries the embedded engine's ``CALL``/``ANSWER`` directives (docs/sim.md), so the run
is the same every time; a real model reads them as instructions.
"""

from __future__ import annotations

import sys

import anyio
from agno.agent import Agent
from agno.models.openai import OpenAIChat

import agentrt
from agentrt.integrations import Agents

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
    agents = Agents(rt)
    researcher = Agent(
        name="researcher",
        model=OpenAIChat(id=model_name, async_client=agents.openai("researcher")),
        instructions="You answer questions about local files with the word_count tool.",
        tools=[agents.tool("researcher", count_words, name="word_count")],
        telemetry=False,  # Agno's own usage analytics, sent to its servers
    )

    async def ask_researcher(task: str) -> str:
        """Ask the researcher about local files."""
        return str((await researcher.arun(task)).content)

    assistant = Agent(
        name="assistant",
        model=OpenAIChat(id=model_name, async_client=agents.openai("assistant")),
        instructions="Answer with the calculator, and ask the researcher about files.",
        tools=[
            agents.tool("assistant", calculate, name="calculator"),
            agents.tool("assistant", ask_researcher),
        ],
        telemetry=False,
    )
    async with agents.job("assistant") as job:
        result = await assistant.arun(question)
    return str(result.content), job.report


async def main() -> int:
    args = arg_parser(__doc__.splitlines()[0], QUESTION).parse_args()
    async with agentrt.Runtime([args.base_url], dialect=args.dialect, api_key=args.api_key) as rt:
        answer, report = await run_agent(rt, args.model, args.question)
    print_report(answer, report)
    return 0 if report.status == "ok" else 1


if __name__ == "__main__":
    with one_line_errors():
        sys.exit(anyio.run(main))
