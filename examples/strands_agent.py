"""A Strands agent with two tools and a helper agent, run through agentrt.

    agentrt sim serve --replies agent &          # the embedded engine, scripted replies
    python examples/strands_agent.py

    python examples/strands_agent.py --base-url http://127.0.0.1:8000/v1 \
        --model my-model "What is 17 * 23, and how many words are in README.md?"

Needs ``pip install "agentjct[strands]"`` (openai<3: an environment of its own). Two lines
wire Strands to agentrt: the agents' model is ``agentrt_strands.model(rt, name)`` (its
calls go through agentrt), and ``hooks=[agentrt_strands.instrument(rt)]`` maps each invocation
onto a job, each agent onto a session (the researcher's, run as the assistant's tool,
under the assistant's) and each tool call onto a tool wait. The default question carries
the embedded engine's ``CALL``/``ANSWER`` directives (docs/sim.md), so the run is the
same every time; a real model reads them as instructions.
"""

from __future__ import annotations

import sys

import anyio
from strands import Agent, tool

import agentrt
from agentrt.integrations import strands as agentrt_strands

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


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (+ - * /), e.g. "17 * 23"."""
    return calculate(expression)


@tool
async def word_count(path: str) -> str:
    """Count the words of a local text file."""
    return await count_words(path)


async def run_agent(
    rt: agentrt.Runtime, model_name: str, question: str
) -> tuple[str, agentrt.JobReport]:
    """Run the assistant once; its answer and the job's report."""
    model = agentrt_strands.model(rt, model_name)
    hooks = agentrt_strands.instrument(rt)
    researcher = Agent(
        name="researcher",
        model=model,
        system_prompt="You answer questions about local files with the word_count tool.",
        tools=[word_count],
        hooks=[hooks],
        callback_handler=None,  # Strands prints the streamed reply by default
    )
    assistant = Agent(
        name="assistant",
        model=model,
        system_prompt="Answer with the calculator, and ask the researcher about files.",
        tools=[
            calculator,
            researcher.as_tool(name="ask_researcher", description="Ask about local files."),
        ],
        hooks=[hooks],
        callback_handler=None,
    )
    result = await assistant.invoke_async(question)
    return str(result).strip(), rt.reports()[-1]  # the run's job, just ended


async def main() -> int:
    args = arg_parser(__doc__.splitlines()[0], QUESTION).parse_args()
    async with agentrt.Runtime([args.base_url], dialect=args.dialect, api_key=args.api_key) as rt:
        answer, report = await run_agent(rt, args.model, args.question)
    print_report(answer, report)
    return 0 if report.status == "ok" else 1


if __name__ == "__main__":
    with one_line_errors():
        sys.exit(anyio.run(main))
