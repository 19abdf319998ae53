"""A ReAct-style agent with two tools, run through agentrt.

    python examples/react_agent.py --base-url http://127.0.0.1:8000/v1 --model my-model \
        "What is 17 * 23, and how many words are in the file README.md?"

It works against any OpenAI-compatible server. The model is asked to answer with lines
``Action: <tool>: <input>`` or ``Final: <answer>``; each action runs as a tool wait in the
agent's session, and its result goes back as an observation. At the end the job's report
shows the job completion time beside the per-call latencies.
"""

from __future__ import annotations

import argparse
import ast
import operator
import re
import sys

import anyio

import agentrt

SYSTEM = """You are a careful assistant. Think step by step. To use a tool, answer with one
line `Action: <tool>: <input>`. Tools:
- calculator: evaluates an arithmetic expression, e.g. `Action: calculator: 17 * 23`
- word_count: counts the words in a local text file, e.g. `Action: word_count: README.md`
When you know the answer, reply `Final: <answer>`."""

ACTION = re.compile(r"Action:\s*(calculator|word_count)\s*:\s*(.+)", re.IGNORECASE)
FINAL = re.compile(r"Final:\s*(.+)", re.IGNORECASE | re.DOTALL)

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
}


def calculator(expression: str) -> str:
    """Evaluate + - * / ** on numbers, nothing else."""

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))  # type: ignore[no-any-return]
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))  # type: ignore[no-any-return]
        raise ValueError("only arithmetic is allowed")

    try:
        return str(ev(ast.parse(expression.strip(), mode="eval").body))
    except (ValueError, SyntaxError, ZeroDivisionError, OverflowError) as exc:
        return f"error: {exc}"


async def word_count(path: str) -> str:
    """Count the words of a file, read without blocking the event loop."""
    try:
        text = await anyio.Path(path.strip()).read_text(errors="replace")
    except OSError as exc:
        return f"error: {exc}"
    return str(len(text.split()))


async def run_agent(
    rt: agentrt.Runtime, model: str, question: str, max_steps: int
) -> agentrt.JobReport:
    messages: list[dict[str, str]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": question},
    ]
    async with rt.job("react", metadata={"question": question[:200]}) as job:
        async with job.session("agent") as session:
            for step in range(max_steps):
                reply = await session.chat(model=model, messages=messages, max_tokens=256)
                text = reply.choices[0].message.content or ""  # type: ignore[union-attr]
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question", nargs="?", default="What is 17 * 23?")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key", default=None, help="or set no key for local servers")
    parser.add_argument("--dialect", default="generic", help="vllm, sglang, dynamo, ...")
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
