"""A smolagents tool-calling agent with two tools and a helper agent, run through agentrt.

    agentrt sim serve --replies agent &          # the embedded engine, scripted replies
    python examples/smolagents_agent.py

    python examples/smolagents_agent.py --base-url http://127.0.0.1:8000/v1 \
        --model my-model "What is 17 * 23, and how many words are in README.md?"

Needs ``pip install "agentjct[smolagents]"``. smolagents is synchronous, so this runs on
``agentrt.SyncRuntime``: the agents' model is ``OpenAIModel(client_kwargs={"http_client":
srt.http_client(), ...})`` (its calls go through agentrt), the run is ``with
srt.job(...)`` and each agent runs in its own ``job.session(...)`` block (the researcher's
under the assistant's, from the assistant's tool); each tool's body is a ``session.tool``
block. The default question carries the embedded engine's ``CALL``/``ANSWER`` directives
(docs/sim.md): smolagents ends a run with its ``final_answer`` tool, so the directives
call it. A real model reads them as instructions.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from smolagents import OpenAIModel, ToolCallingAgent, tool

import agentrt

# The tools' logic, the command line and the report, shared by the examples
from _shared import arg_parser, calculate, one_line_errors, print_report

HELPER_TASK = (
    'Count the words of README.md.\nCALL word_count {"path": "README.md"}\n'
    'CALL final_answer {"answer": "counted"}'
)
QUESTION = (
    "What is 17 * 23, and how many words are in README.md? Ask the researcher for the "
    "count.\n"
    'CALL calculator {"expression": "17 * 23"}\n'
    f"CALL ask_researcher {json.dumps({'task': HELPER_TASK})}\n"
    'CALL final_answer {"answer": "391; the researcher counted the words."}'
)


def run_agent(
    srt: agentrt.SyncRuntime, model_name: str, question: str, api_key: str | None = None
) -> tuple[str, agentrt.JobReport]:
    """Run the assistant once; its answer and the job's report."""
    rt = srt.runtime
    model = OpenAIModel(
        model_id=model_name,
        api_base=rt.endpoints[0].url,
        api_key=api_key or "none",  # a placeholder a local server ignores
        client_kwargs={"http_client": srt.http_client(), "max_retries": 0},  # agentrt retries
    )
    with srt.job("assistant") as job, job.session("assistant") as session:

        @tool
        def calculator(expression: str) -> str:
            """Evaluate an arithmetic expression (+ - * /), e.g. "17 * 23".

            Args:
                expression: the expression to evaluate.
            """
            with session.tool("calculator"):
                return calculate(expression)

        @tool
        def ask_researcher(task: str) -> str:
            """Ask the researcher about local files.

            Args:
                task: what to find out.
            """
            with session.tool("ask_researcher"), job.session("researcher", parent=session) as rs:

                @tool
                def word_count(path: str) -> str:
                    """Count the words of a local text file.

                    Args:
                        path: the file's path.
                    """
                    with rs.tool("word_count"):
                        try:
                            return str(len(Path(path).read_text(encoding="utf-8").split()))
                        except OSError as exc:
                            return f"error: {exc}"

                researcher = ToolCallingAgent(
                    tools=[word_count], model=model, name="researcher", verbosity_level=0
                )
                return str(researcher.run(task))

        assistant = ToolCallingAgent(
            tools=[calculator, ask_researcher], model=model, name="assistant", verbosity_level=0
        )
        answer = str(assistant.run(question))
    return answer, job.report


def main() -> int:
    args = arg_parser(__doc__.splitlines()[0], QUESTION).parse_args()
    with agentrt.SyncRuntime([args.base_url], dialect=args.dialect, api_key=args.api_key) as srt:
        answer, report = run_agent(srt, args.model, args.question, args.api_key)
    print_report(answer, report)
    return 0 if report.status == "ok" else 1


if __name__ == "__main__":
    with one_line_errors():
        sys.exit(main())
