"""A Google ADK agent (on LiteLLM) with two tools and a helper agent, run through agentrt.

    agentrt sim serve --replies agent &          # the embedded engine, scripted replies
    python examples/google_adk_agent.py

    python examples/google_adk_agent.py --base-url http://127.0.0.1:8000/v1 \
        --model my-model "What is 17 * 23, and how many words are in README.md?"

Needs ``pip install "agentjct[google-adk]"``. Two lines wire ADK to agentrt: each agent's
model is ``LiteLlm(model="openai/<name>", client=agents.openai(<agent>))`` (LiteLLM sends
through that client, so its calls are that agent's session's turns), and the run is
``async with agents.job(...)``; the tools, wrapped by ``agents.tool(<agent>, fn)``, are
tool waits, and the researcher, run from the assistant's tool, gets a session whose
parent is the assistant's. The default question carries the embedded engine's
``CALL``/``ANSWER`` directives (docs/sim.md), so the run is the same every time; a real
model reads them as instructions.
"""

from __future__ import annotations

import os
import sys

# LiteLLM fetches its model price list from the internet at import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import anyio
from google.adk.agents import LlmAgent
from google.adk.models.lite_llm import LiteLlm
from google.adk.runners import InMemoryRunner
from google.genai import types

import agentrt
from agentrt.integrations.agents import Agents

# The tools' logic, the command line and the report, shared by the examples
from _shared import arg_parser, calculate, count_words, print_report, scripted_question

QUESTION = scripted_question(helper_arg="task")


async def ask(agent: LlmAgent, text: str) -> str:
    """Run ``agent`` on one message in a fresh ADK session; its final text."""
    runner = InMemoryRunner(agent=agent, app_name=agent.name)
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
    agents = Agents(rt)

    def model(agent: str) -> LiteLlm:
        return LiteLlm(model=f"openai/{model_name}", client=agents.openai(agent))

    researcher = LlmAgent(
        name="researcher",
        model=model("researcher"),
        instruction="You answer questions about local files with the word_count tool.",
        tools=[agents.tool("researcher", count_words, name="word_count")],
    )

    async def ask_researcher(task: str) -> str:
        """Ask the researcher about local files."""
        return await ask(researcher, task)

    assistant = LlmAgent(
        name="assistant",
        model=model("assistant"),
        instruction="Answer with the calculator, and ask the researcher about files.",
        tools=[
            agents.tool("assistant", calculate, name="calculator"),
            agents.tool("assistant", ask_researcher),
        ],
    )
    async with agents.job("assistant") as job:
        answer = await ask(assistant, question)
    return answer, job.report


async def main() -> int:
    args = arg_parser(__doc__.splitlines()[0], QUESTION).parse_args()
    async with agentrt.Runtime([args.base_url], dialect=args.dialect, api_key=args.api_key) as rt:
        answer, report = await run_agent(rt, args.model, args.question)
    print_report(answer, report)
    return 0 if report.status == "ok" else 1


if __name__ == "__main__":
    sys.exit(anyio.run(main))
