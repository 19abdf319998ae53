"""An OpenAI Agents SDK agent with two tools and a helper agent, run through agentrt.

    agentrt sim serve --replies agent &          # the embedded engine, scripted replies
    python examples/openai_agents_agent.py --base-url http://127.0.0.1:8000/replica-0/v1

    python examples/openai_agents_agent.py --base-url http://127.0.0.1:8000/v1 \
        --model my-model "What is 17 * 23, and how many words are in README.md?"

Needs ``pip install "agentjct[openai-agents]"``. Two lines wire the SDK to agentrt: the
agents' model is ``openai_agents.model(rt, name)`` (its calls go through agentrt), and
``openai_agents.instrument(rt)`` maps each run onto a job, each agent onto a session (the
helper's under the assistant's) and each tool onto a tool wait. The default question
carries the embedded engine's ``CALL``/``ANSWER`` directives (docs/sim.md), so the run
is the same every time; a real model reads them as instructions.
"""

from __future__ import annotations

import sys

import anyio
from agents import Agent, RunConfig, Runner, function_tool

import agentrt
from agentrt.integrations import openai_agents

# The tools' logic, the command line and the report, shared by the examples
from _shared import (
    arg_parser,
    calculate,
    count_words,
    one_line_errors,
    print_report,
    scripted_question,
)

QUESTION = scripted_question(helper_arg="input")


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (+ - * /), e.g. "17 * 23"."""
    return calculate(expression)


@function_tool
async def word_count(path: str) -> str:
    """Count the words of a local text file."""
    return await count_words(path)


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
    args = arg_parser(__doc__.splitlines()[0], QUESTION).parse_args()

    async with agentrt.Runtime([args.base_url], dialect=args.dialect, api_key=args.api_key) as rt:
        # exclusive: this processor only; the SDK's default one would export to OpenAI
        openai_agents.instrument(rt, exclusive=True)
        answer, report = await run_agent(rt, args.model, args.question)
    print_report(answer, report)
    return 0 if report.status == "ok" else 1


if __name__ == "__main__":
    with one_line_errors():
        sys.exit(anyio.run(main))
