"""A ReAct-style agent with two tools, run through agentrt.

    python examples/react_agent.py --base-url http://127.0.0.1:8000/v1 --model my-model \
        "What is 17 * 23, and how many words are in the file README.md?"

It works against any OpenAI-compatible server. The model is asked to answer with lines
``Action: <tool>: <input>`` or ``Final: <answer>``; each action runs as a tool wait in the
agent's session, and its result goes back as an observation. At the end the job's report
shows the job completion time beside the per-call latencies.
"""

from __future__ import annotations

import re
import sys

import anyio
from openai.types.chat import ChatCompletionMessageParam

import agentrt

# The tools' logic and the command line, shared by the examples
from _shared import arg_parser, calculate, count_words

SYSTEM = """You are a careful assistant. Think step by step. To use a tool, answer with one
line `Action: <tool>: <input>`. Tools:
- calculator: evaluates an arithmetic expression, e.g. `Action: calculator: 17 * 23`
- word_count: counts the words in a local text file, e.g. `Action: word_count: README.md`
When you know the answer, reply `Final: <answer>`."""

ACTION = re.compile(r"Action:\s*(calculator|word_count)\s*:\s*(.+)", re.IGNORECASE)
FINAL = re.compile(r"Final:\s*(.+)", re.IGNORECASE | re.DOTALL)


def calculator(expression: str) -> str:
    """Evaluate + - * / ** on numbers, nothing else."""
    return calculate(expression)


async def word_count(path: str) -> str:
    """Count the words of a file, read without blocking the event loop."""
    return await count_words(path)


async def run_agent(
    rt: agentrt.Runtime, model: str, question: str, max_steps: int
) -> agentrt.JobReport:
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": question},
    ]
    async with rt.job("react", metadata={"question": question[:200]}) as job:
        async with job.session("agent") as session:
            for step in range(max_steps):
                reply = await session.chat(model=model, messages=messages, max_tokens=256)
                text = reply.choices[0].message.content or ""
                messages.append({"role": "assistant", "content": text})
                print(f"[step {step}] {text.strip()[:200]!r}")
                if final := FINAL.search(text):
                    print(f"answer: {final.group(1).strip()}")
                    break
                action = ACTION.search(text)
                if action is None:
                    # No parsable action (small or random-weight models): stop here.
                    print("no action in the reply; stopping")
                    break
                tool, arg = action.group(1).lower(), action.group(2)
                async with session.tool(tool, expected_s=0.01):
                    result = calculator(arg) if tool == "calculator" else await word_count(arg)
                messages.append({"role": "user", "content": f"Observation: {result}"})
    return job.report


async def main() -> int:
    parser = arg_parser(__doc__.splitlines()[0], "What is 17 * 23?", model=None)
    parser.add_argument("--max-steps", type=int, default=6)
    args = parser.parse_args()

    async with agentrt.Runtime([args.base_url], dialect=args.dialect, api_key=args.api_key) as rt:
        report = await run_agent(rt, args.model, args.question, args.max_steps)
    print(
        f"job {report.job_id}: status={report.status} jct={report.jct_s:.3f}s "
        f"llm(critical)={report.critical_llm_s:.3f}s tools={report.tool_s:.3f}s "
        f"calls={report.calls} tool_waits={report.tool_waits}"
    )
    for call in report.call_reports:
        print(
            f"  turn {call.turn}: latency={call.latency_s or 0:.3f}s "
            f"prompt={call.prompt_tokens} cached={call.cached_tokens} "
            f"completion={call.completion_tokens}"
        )
    await anyio.Path("react_report.json").write_text(report.model_dump_json(indent=2))
    return 0 if report.status == "ok" else 1


if __name__ == "__main__":
    sys.exit(anyio.run(main))
