"""A Strands agent with two tools and a helper agent, run through agentrt.

    agentrt sim serve --replies agent &          # the embedded engine, scripted replies
    python examples/strands_agent.py

    python examples/strands_agent.py --base-url http://127.0.0.1:8000/v1 \
        --model my-model "What is 17 * 23, and how many words are in README.md?"

Needs ``pip install "agentjct[strands]"``. Two lines wire Strands to agentrt: each agent's
model is ``OpenAIModel(client=agents.openai(<agent>))`` (its calls are that agent's
session's turns), and the run is ``async with agents.job(...)``; the tools, wrapped by
``agents.tool(<agent>, fn)`` under Strands' ``@tool``, are tool waits, and the
researcher, run from the assistant's tool, gets a session whose parent is the
assistant's. The default question carries the embedded engine's ``CALL``/``ANSWER``
directives (docs/sim.md), so the run is the same every time; a real model reads them as
instructions.
"""

from __future__ import annotations

import sys

import anyio
from strands import Agent, tool
from strands.models.openai import OpenAIModel

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
        name="researcher",
        model=OpenAIModel(client=agents.openai("researcher"), model_id=model_name),
        system_prompt="You answer questions about local files with the word_count tool.",
        tools=[tool(agents.tool("researcher", count_words, name="word_count"))],
        callback_handler=None,  # Strands prints the streamed reply by default
    )

    async def ask_researcher(task: str) -> str:
        """Ask the researcher about local files."""
        return str(await researcher.invoke_async(task)).strip()

    assistant = Agent(
        name="assistant",
        model=OpenAIModel(client=agents.openai("assistant"), model_id=model_name),
        system_prompt="Answer with the calculator, and ask the researcher about files.",
        tools=[
            tool(agents.tool("assistant", calculate, name="calculator")),
            tool(agents.tool("assistant", ask_researcher)),
        ],
        callback_handler=None,
    )
    async with agents.job("assistant") as job:
        result = await assistant.invoke_async(question)
    return str(result).strip(), job.report


async def main() -> int:
    args = arg_parser(__doc__.splitlines()[0], QUESTION).parse_args()
    async with agentrt.Runtime([args.base_url], dialect=args.dialect, api_key=args.api_key) as rt:
        answer, report = await run_agent(rt, args.model, args.question)
    print_report(answer, report)
    return 0 if report.status == "ok" else 1


if __name__ == "__main__":
    sys.exit(anyio.run(main))
