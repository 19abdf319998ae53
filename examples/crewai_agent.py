"""A CrewAI crew with two tools and a helper crew, run through agentrt.

    agentrt sim serve --replies agent &          # the embedded engine, scripted replies
    python examples/crewai_agent.py

    python examples/crewai_agent.py --base-url http://127.0.0.1:8000/v1 \
        --model my-model "What is 17 * 23, and how many words are in README.md?"

Needs ``pip install "agentjct[crewai]"`` (openai<3: an environment of its own). CrewAI
runs synchronously, so this runs on ``agentrt.SyncRuntime``. CrewAI's OpenAI provider
builds its own clients and takes no client from outside, so the LLM's client is replaced
by ``srt.openai()`` after it is made (``llm._client``: see docs/integrations.md). The run
is ``with srt.job(...)``; each crew runs in its own ``job.session(...)`` block (the
researcher's under the assistant's, from the assistant's tool); each tool's body is a
``session.tool`` block. The default question carries the embedded engine's
``CALL``/``ANSWER`` directives (docs/sim.md), so the run is the same every time; a real
model reads them as instructions.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

# CrewAI's own telemetry and trace upload, and its prompt to view traces, switched off.
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

from crewai import LLM, Agent, Crew, Task
from crewai.tools import tool

import agentrt

# The tools' logic, the command line and the report, shared by the examples
from _shared import arg_parser, calculate, one_line_errors, print_report, scripted_question

QUESTION = scripted_question(helper_arg="task")

# A warning per call that the sim's model has no known tokenizer.
logging.getLogger("crewai.llms.base_llm").setLevel(logging.ERROR)


def crew_llm(srt: agentrt.SyncRuntime, model_name: str) -> LLM:
    """A CrewAI LLM whose calls go through agentrt."""
    url = srt.runtime.endpoints[0].url
    llm = LLM(model=f"openai/{model_name}", base_url=url, api_key="none", max_retries=0)
    llm._client = srt.openai()  # type: ignore[attr-defined,unused-ignore]
    return llm


def run_crew(agent: Agent, text: str) -> str:
    task = Task(description=text, expected_output="A short answer.", agent=agent)
    return str(Crew(agents=[agent], tasks=[task], verbose=False).kickoff())


def run_agent(
    srt: agentrt.SyncRuntime, model_name: str, question: str
) -> tuple[str, agentrt.JobReport]:
    """Run the assistant once; its answer and the job's report."""
    llm = crew_llm(srt, model_name)
    with srt.job("assistant") as job, job.session("assistant") as session:

        @tool("calculator")
        def calculator(expression: str) -> str:
            """Evaluate an arithmetic expression (+ - * /), e.g. "17 * 23"."""
            with session.tool("calculator"):
                return calculate(expression)

        @tool("ask_researcher")
        def ask_researcher(task: str) -> str:
            """Ask the researcher about local files."""
            with session.tool("ask_researcher"), job.session("researcher", parent=session) as rs:

                @tool("word_count")
                def word_count(path: str) -> str:
                    """Count the words of a local text file."""
                    with rs.tool("word_count"):
                        try:
                            return str(len(Path(path).read_text(encoding="utf-8").split()))
                        except OSError as exc:
                            return f"error: {exc}"

                researcher = Agent(
                    role="researcher",
                    goal="Answer questions about local files with the word_count tool.",
                    backstory="You count words.",
                    tools=[word_count],
                    llm=llm,
                )
                return run_crew(researcher, task)

        assistant = Agent(
            role="assistant",
            goal="Answer with the calculator, and ask the researcher about files.",
            backstory="You answer questions.",
            tools=[calculator, ask_researcher],
            llm=llm,
        )
        answer = run_crew(assistant, question)
    return answer, job.report


def main() -> int:
    args = arg_parser(__doc__.splitlines()[0], QUESTION).parse_args()
    with agentrt.SyncRuntime([args.base_url], dialect=args.dialect, api_key=args.api_key) as srt:
        answer, report = run_agent(srt, args.model, args.question)
    print_report(answer, report)
    return 0 if report.status == "ok" else 1


if __name__ == "__main__":
    with one_line_errors():
        sys.exit(main())
