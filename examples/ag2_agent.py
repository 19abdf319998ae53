"""An AG2 agent with two tools and a helper agent, run through agentrt.

    agentrt sim serve --replies agent &          # the embedded engine, scripted replies
    python examples/ag2_agent.py

    python examples/ag2_agent.py --base-url http://127.0.0.1:8000/v1 \
        --model my-model "What is 17 * 23, and how many words are in README.md?"

Needs ``pip install "agentjct[ag2]"``. Two lines wire AG2 to agentrt: each agent's config
is ``OpenAIConfig(model=..., **agents.client_kwargs(<agent>))`` (its calls are that
agent's session's turns), and the run is ``async with agents.job(...)``; the tools,
wrapped by ``agents.tool(<agent>, fn)``, are tool waits, and the researcher, asked from
the assistant's tool, gets a session whose parent is the assistant's. The default
question carries the embedded engine's ``CALL``/``ANSWER`` directives (docs/sim.md), so
the run is the same every time; a real model reads them as instructions.
"""

from __future__ import annotations

import sys

import anyio
from ag2 import Agent
from ag2.config import OpenAIConfig

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
    researcher = Agent(
        "researcher",
        prompt="You answer questions about local files with the word_count tool.",
        config=OpenAIConfig(model=model_name, **agents.client_kwargs("researcher")),
        tools=[agents.tool("researcher", count_words, name="word_count")],
    )

    async def ask_researcher(task: str) -> str:
        """Ask the researcher about local files."""
        return (await researcher.ask(task)).body or ""

    assistant = Agent(
        "assistant",
        prompt="Answer with the calculator, and ask the researcher about files.",
        config=OpenAIConfig(model=model_name, **agents.client_kwargs("assistant")),
        tools=[
            agents.tool("assistant", calculate, name="calculator"),
            agents.tool("assistant", ask_researcher),
        ],
    )
    async with agents.job("assistant") as job:
        reply = await assistant.ask(question)
    return reply.body or "", job.report


async def main() -> int:
    args = arg_parser(__doc__.splitlines()[0], QUESTION).parse_args()
    async with agentrt.Runtime([args.base_url], dialect=args.dialect, api_key=args.api_key) as rt:
        answer, report = await run_agent(rt, args.model, args.question)
    print_report(answer, report)
    return 0 if report.status == "ok" else 1


if __name__ == "__main__":
    sys.exit(anyio.run(main))
