"""An AutoGen (AgentChat) agent with two tools and a helper agent, run through agentrt.

    agentrt sim serve --replies agent &          # the embedded engine, scripted replies
    python examples/autogen_agent.py

    python examples/autogen_agent.py --base-url http://127.0.0.1:8000/v1 \
        --model my-model "What is 17 * 23, and how many words are in README.md?"

Needs ``pip install "agentjct[autogen]"``. Two lines wire AutoGen to agentrt: each agent's
model client is ``OpenAIChatCompletionClient(model=..., **agents.client_kwargs(<agent>))``
(its calls are that agent's session's turns), and the run is ``async with
agents.job(...)``; the tools, wrapped by ``agents.tool(<agent>, fn)``, are tool waits,
and the researcher, run from the assistant's tool, gets a session whose parent is the
assistant's. The default question carries the embedded engine's ``CALL``/``ANSWER``
directives (docs/sim.md), so the run is the same every time; a real model reads them as
instructions.
"""

from __future__ import annotations

import sys

import anyio
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.messages import TextMessage
from autogen_ext.models.openai import OpenAIChatCompletionClient

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
MODEL_INFO = {
    "vision": False,
    "function_calling": True,
    "json_output": False,
    "family": "unknown",
    "structured_output": False,
}
"""What AutoGen must be told of a model it does not know by name."""


async def run_agent(
    rt: agentrt.Runtime, model_name: str, question: str
) -> tuple[str, agentrt.JobReport]:
    """Run the assistant once; its answer and the job's report."""
    agents = Agents(rt)

    def client(agent: str) -> OpenAIChatCompletionClient:
        kwargs = agents.client_kwargs(agent)
        return OpenAIChatCompletionClient(model=model_name, model_info=MODEL_INFO, **kwargs)

    researcher = AssistantAgent(
        "researcher",
        model_client=client("researcher"),
        system_message="You answer questions about local files with the word_count tool.",
        tools=[agents.tool("researcher", count_words, name="word_count")],
        max_tool_iterations=8,  # call the model again after each tool, until it answers
    )

    async def ask_researcher(task: str) -> str:
        """Ask the researcher about local files."""
        result = await researcher.run(task=task)
        last = result.messages[-1]
        return last.content if isinstance(last, TextMessage) else str(last)

    assistant = AssistantAgent(
        "assistant",
        model_client=client("assistant"),
        system_message="Answer with the calculator, and ask the researcher about files.",
        tools=[
            agents.tool("assistant", calculate, name="calculator"),
            agents.tool("assistant", ask_researcher),
        ],
        max_tool_iterations=8,
    )
    async with agents.job("assistant") as job:
        result = await assistant.run(task=question)
    last = result.messages[-1]
    return (last.content if isinstance(last, TextMessage) else str(last)), job.report


async def main() -> int:
    args = arg_parser(__doc__.splitlines()[0], QUESTION).parse_args()
    async with agentrt.Runtime([args.base_url], dialect=args.dialect, api_key=args.api_key) as rt:
        answer, report = await run_agent(rt, args.model, args.question)
    print_report(answer, report)
    return 0 if report.status == "ok" else 1


if __name__ == "__main__":
    with one_line_errors():
        sys.exit(anyio.run(main))
