"""A ReAct agent with two tools, run through agentrt: the model reasons, calls tools
(OpenAI ``tools=`` / ``tool_calls``), reads their results, and answers.

    agentrt sim serve --replies agent        # in another terminal
    python examples/react_agent.py           # the defaults match that server
    python examples/react_agent.py --base-url URL --model NAME "your question"
    python examples/react_agent.py --report react_report.json   # also save the report

It works against any OpenAI-compatible server whose model calls tools. Each step is one
LLM call in the agent's session; each tool the reply asks for runs inside a tool wait
(``session.tool``), and its result goes back as a ``tool`` message, until a reply asks
for no tool. The default question carries the embedded engine's ``CALL``/``ANSWER``
directives (docs/sim.md), so that on ``agentrt sim serve --replies agent`` the model
calls the calculator, then counts words, then both at once (parallel tool calls), then
answers. At the end the job's report shows its completion time beside each call's
latency. Nothing is written to disk unless ``--report PATH`` is given.
"""

from __future__ import annotations

import json
import sys

import anyio
from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionMessageParam,
    ChatCompletionToolParam,
)

import agentrt

# The tools' logic and the command line, shared by the examples
from _shared import arg_parser, calculate, count_words, one_line_errors

SYSTEM = (
    "You are a careful assistant. Think step by step and use the tools: calculator for "
    "arithmetic, word_count for the number of words in a local text file. When you know "
    "the answer, reply with it and call no tool."
)

TOOLS: list[ChatCompletionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression (+ - * / **), e.g. 17 * 23.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "word_count",
            "description": "Count the words in a local text file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
]

QUESTION = (
    "What is 17 * 23, and how many words are in README.md?\n"
    'CALL calculator {"expression": "17 * 23"}\n'
    'CALL word_count {"path": "README.md"}\n'
    'CALL calculator {"expression": "391 * 2"} && CALL word_count {"path": "pyproject.toml"}\n'
    "ANSWER 17 * 23 = 391; the word counts are in the tool results above."
)
"""The default question. The CALL/ANSWER lines script the embedded engine's replies
(``agentrt sim serve --replies agent``); a real model reads them as part of the
question."""


def calculator(expression: str) -> str:
    """Evaluate + - * / ** on numbers, nothing else."""
    return calculate(expression)


async def word_count(path: str) -> str:
    """Count the words of a file, read without blocking the event loop."""
    return await count_words(path)


async def run_tool(name: str, arguments: str) -> str:
    """Run one tool call; a bad call comes back to the model as an error text."""
    try:
        args = json.loads(arguments or "{}")
    except ValueError:
        return f"error: arguments are not JSON: {arguments!r}"
    if not isinstance(args, dict):
        return "error: arguments must be a JSON object"
    if name == "calculator":
        return calculator(str(args.get("expression", "")))
    if name == "word_count":
        return await word_count(str(args.get("path", "")))
    return f"error: no tool {name!r}"


async def run_agent(
    rt: agentrt.Runtime, model: str, question: str, max_steps: int = 8
) -> tuple[str, agentrt.JobReport]:
    """The ReAct loop; returns the answer and the job's report."""
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": question},
    ]
    answer = "(no answer: out of steps)"
    async with rt.job("react", metadata={"question": question[:200]}) as job:
        async with job.session("agent") as session:
            for step in range(max_steps):
                reply = await session.chat(
                    model=model, messages=messages, tools=TOOLS, max_tokens=256
                )
                message = reply.choices[0].message
                said: ChatCompletionAssistantMessageParam = {
                    "role": "assistant",
                    "content": message.content,
                }
                # Function tool calls (the only kind offered), as (id, name, arguments).
                asked = [
                    (c.id, c.function.name, c.function.arguments)
                    for c in message.tool_calls or []
                    if c.type == "function"
                ]
                if asked:
                    said["tool_calls"] = [
                        {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                        for i, n, a in asked
                    ]
                messages.append(said)
                if not asked:
                    answer = (message.content or "").strip()
                    print(f"[step {step}] answer")
                    break
                for call_id, tool, arguments in asked:
                    # The session is idle while the tool runs: a tool wait.
                    async with session.tool(tool, expected_s=0.01):
                        result = await run_tool(tool, arguments)
                    print(f"[step {step}] {tool}({arguments}) -> {result}")
                    messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
    return answer, job.report


async def main() -> int:
    parser = arg_parser(__doc__ or "", QUESTION)
    parser.add_argument("--max-steps", type=int, default=8, help="default: %(default)s")
    parser.add_argument("--report", metavar="PATH", help="also write the job's report here")
    args = parser.parse_args()

    async with agentrt.Runtime([args.base_url], dialect=args.dialect, api_key=args.api_key) as rt:
        answer, report = await run_agent(rt, args.model, args.question, args.max_steps)
    print(f"answer: {answer}")
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
    if args.report:
        path = anyio.Path(args.report)
        await path.parent.mkdir(parents=True, exist_ok=True)
        await path.write_text(report.model_dump_json(indent=2))
        print(f"report: {args.report}")
    return 0 if report.status == "ok" else 1


if __name__ == "__main__":
    with one_line_errors():
        sys.exit(anyio.run(main))
