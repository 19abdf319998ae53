"""A Google ADK agent (on LiteLLM) with two tools and a helper agent, run through agentrt.

    agentrt sim serve --replies agent &          # the embedded engine, scripted replies
    python examples/google_adk_agent.py

    python examples/google_adk_agent.py --base-url http://127.0.0.1:8000/v1 \
        --model my-model "What is 17 * 23, and how many words are in README.md?"

Needs ``pip install "agentjct[google-adk]"``. Two lines wire ADK to agentrt: the agents'
model is ``google_adk.model(rt, name)`` (a ``LiteLlm`` that sends through agentrt), and
the apps' ``plugins=[google_adk.instrument(rt)]`` maps each run onto a job, each agent onto
a session (the researcher's, run from the assistant's tool, under the assistant's) and
each tool call onto a tool wait. The default question carries the embedded engine's
``CALL``/``ANSWER`` directives (docs/sim.md), so the run is the same every time; a real
model reads them as instructions.
"""

from __future__ import annotations

import os
import sys

# LiteLLM fetches its model price list from the internet at import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import anyio
import litellm  # noqa: F401  # ADK imports it at the first call (seconds), inside the job
from google.adk.agents import LlmAgent
from google.adk.apps import App
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.runners import InMemoryRunner
from google.genai import types

import agentrt
from agentrt.integrations import google_adk

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


async def ask(agent: LlmAgent, plugin: BasePlugin, text: str) -> str:
    """Run ``agent`` on one message in a fresh ADK session; its final text."""
    runner = InMemoryRunner(app=App(name=agent.name, root_agent=agent, plugins=[plugin]))
    session = await runner.session_service.create_session(app_name=agent.name, user_id="user")
    message = types.Content(role="user", parts=[types.Part(text=text)])
    answer = ""
    async for event in runner.run_async(user_id="user", session_id=session.id, new_message=message):
        if event.is_final_response() and event.content and event.content.parts:
            answer = "".join(part.text or "" for part in event.content.parts)
    return answer


async def run_agent(
    rt: agentrt.Runtime, model_name: str, question: str
) -> tuple[str, agentrt.JobReport]:
    """Run the assistant once; its answer and the job's report."""
    model = google_adk.model(rt, model_name)
    plugin = google_adk.instrument(rt)

    async def word_count(path: str) -> str:
        """Count the words of a local text file."""
        return await count_words(path)

    researcher = LlmAgent(
        name="researcher",
        model=model,
        instruction="You answer questions about local files with the word_count tool.",
        tools=[word_count],
    )

    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression (+ - * /), e.g. "17 * 23"."""
        return calculate(expression)

    async def ask_researcher(task: str) -> str:
        """Ask the researcher about local files."""
        return await ask(researcher, plugin, task)

    assistant = LlmAgent(
        name="assistant",
        model=model,
        instruction="Answer with the calculator, and ask the researcher about files.",
        tools=[calculator, ask_researcher],
    )
    answer = await ask(assistant, plugin, question)
    return answer, rt.reports()[-1]  # the run's job, just ended


async def main() -> int:
    args = arg_parser(__doc__.splitlines()[0], QUESTION).parse_args()
    async with agentrt.Runtime([args.base_url], dialect=args.dialect, api_key=args.api_key) as rt:
        answer, report = await run_agent(rt, args.model, args.question)
    print_report(answer, report)
    return 0 if report.status == "ok" else 1


if __name__ == "__main__":
    with one_line_errors():
        sys.exit(anyio.run(main))
