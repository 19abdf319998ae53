"""A LlamaIndex FunctionAgent with two tools and a helper agent, run through agentrt.

    agentrt sim serve --replies agent &          # the embedded engine, scripted replies
    python examples/llamaindex_agent.py --base-url http://127.0.0.1:8000/replica-0/v1

    python examples/llamaindex_agent.py --base-url http://127.0.0.1:8000/v1 \
        --model my-model "What is 17 * 23, and how many words are in README.md?"

Needs ``pip install "agentjct[llamaindex]"`` (LlamaIndex's OpenAI LLM needs openai<3). Two
lines wire LlamaIndex to agentrt: the agents' LLM is ``llamaindex.model(rt, ...)``
(its calls go through agentrt), and ``llamaindex.instrument(rt)`` maps each run onto a
job, each agent onto a session (the helper's under the assistant's) and each tool onto a
tool wait. The default question carries the embedded engine's ``CALL``/``ANSWER``
directives (docs/sim.md), so the run is the same every time; a real model reads them as
instructions.
"""

from __future__ import annotations

import sys

import anyio
from llama_index.core.agent.workflow import FunctionAgent

import agentrt
from agentrt.integrations import llamaindex

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


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (+ - * /), e.g. "17 * 23"."""
    return calculate(expression)


async def word_count(path: str) -> str:
    """Count the words of a local text file."""
    return await count_words(path)


async def run_agent(
    rt: agentrt.Runtime, model_name: str, question: str
) -> tuple[str, agentrt.JobReport]:
    """Run the assistant once; its answer and the job's report."""
    llm = llamaindex.model(rt, model_name)
    researcher = FunctionAgent(
        name="researcher",
        system_prompt="You answer questions about local files with the word_count tool.",
        llm=llm,
        tools=[word_count],
    )

    async def ask_researcher(question: str) -> str:
        """Ask the researcher a question about local files."""
        return str(await researcher.run(user_msg=question))

    assistant = FunctionAgent(
        name="assistant",
        system_prompt="Answer with the calculator, and ask the researcher about files.",
        llm=llm,
        tools=[calculator, ask_researcher],
    )
    answer = await assistant.run(user_msg=question)
    return str(answer), rt.reports()[-1]  # the run's job, just ended


async def main() -> int:
    args = arg_parser(__doc__.splitlines()[0], QUESTION).parse_args()

    async with agentrt.Runtime([args.base_url], dialect=args.dialect, api_key=args.api_key) as rt:
        llamaindex.instrument(rt)
        try:
            answer, report = await run_agent(rt, args.model, args.question)
        finally:
            llamaindex.uninstrument(rt)
    print_report(answer, report)
    return 0 if report.status == "ok" else 1


if __name__ == "__main__":
    with one_line_errors():
        sys.exit(anyio.run(main))
