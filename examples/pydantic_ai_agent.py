"""A PydanticAI agent with two tools and a helper agent, run through agentrt.

    agentrt sim serve --replies agent &          # the embedded engine, scripted replies
    python examples/pydantic_ai_agent.py

    python examples/pydantic_ai_agent.py --base-url http://127.0.0.1:8000/v1 \
        --model my-model "What is 17 * 23, and how many words are in README.md?"

Needs ``pip install "agentjct[pydantic-ai]"``. Two lines wire PydanticAI to agentrt: each
agent's model is an ``OpenAIChatModel`` on ``agents.openai(<agent>)`` (its calls are that
agent's session's turns), and the run is ``async with agents.job(...)``; the tools,
wrapped by ``agents.tool(<agent>, fn)``, are tool waits, and the researcher, run from the
assistant's tool, gets a session whose parent is the assistant's. The default question
carries the embedded engine's ``CALL``/``ANSWER`` directives (docs/sim.md), so the run
is the same every time; a real model reads them as instructions.
"""

from __future__ import annotations

import sys

import anyio
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import agentrt
from agentrt.integrations.agents import Agents

# The tools' logic, the command line and the report, shared by the examples
from _shared import arg_parser, calculate, count_words, print_report, scripted_question

QUESTION = scripted_question(helper_arg="task")


async def run_agent(
    rt: agentrt.Runtime, model_name: str, question: str
) -> tuple[str, agentrt.JobReport]:
    """Run the assistant once; its answer and the job's report."""
    agents = Agents(rt)

    def model(agent: str) -> OpenAIChatModel:
        return OpenAIChatModel(
            model_name, provider=OpenAIProvider(openai_client=agents.openai(agent))
        )

    researcher = Agent(
        model("researcher"),
        name="researcher",
        instructions="You answer questions about local files with the word_count tool.",
        tools=[agents.tool("researcher", count_words, name="word_count")],
    )

    async def ask_researcher(task: str) -> str:
        """Ask the researcher about local files."""
        return (await researcher.run(task)).output

    assistant = Agent(
        model("assistant"),
        name="assistant",
        instructions="Answer with the calculator, and ask the researcher about files.",
        tools=[
            agents.tool("assistant", calculate, name="calculator"),
            agents.tool("assistant", ask_researcher),
        ],
    )
    async with agents.job("assistant") as job:
        result = await assistant.run(question)
    return result.output, job.report


async def main() -> int:
    args = arg_parser(__doc__.splitlines()[0], QUESTION).parse_args()
    async with agentrt.Runtime([args.base_url], dialect=args.dialect, api_key=args.api_key) as rt:
        answer, report = await run_agent(rt, args.model, args.question)
    print_report(answer, report)
    return 0 if report.status == "ok" else 1


if __name__ == "__main__":
    sys.exit(anyio.run(main))
