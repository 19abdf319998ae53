"""Memory of open, idle sessions: a Runtime with 10,000 sessions open, each after one
call and waiting (as in a tool wait), against the same Runtime with none.

Two replicas of a fake engine (httpx2 MockTransport), ``routing="session_affinity"``,
``policy="atlas"`` (the policy with the most per-session state), a concurrency limit (so
the admission gates are live). Measured with tracemalloc: the Python heap held by the
sessions, jobs, routing and scheduling state, and the per-call accounting of that first
call.

    python -m benchmarks load idle                  # 10,000 sessions
    python -m benchmarks load idle --sessions 2000
"""

from __future__ import annotations

import argparse
import tracemalloc
from contextlib import AsyncExitStack
from typing import Any

import anyio

try:  # the HTTP library agentrt runs on: httpx2 under openai 3.x, httpx under 2.x
    import httpx2
except ImportError:
    import httpx as httpx2  # type: ignore[no-redef]
from openai.types.chat import ChatCompletionMessageParam

import agentrt

from ._harness import add_run_args, write_result

REPLY = {
    "id": "x",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
}
MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You are a coding agent. " * 20},
    {"role": "user", "content": "Fix the failing test."},
]


async def measure(sessions: int) -> dict[str, Any]:
    transport = httpx2.MockTransport(lambda request: httpx2.Response(200, json=REPLY))
    endpoints = ["http://a.test/v1", "http://b.test/v1"]
    async with agentrt.Runtime(
        endpoints, transport=transport, policy="atlas", concurrency=64, keep_reports=0
    ) as rt:
        # Warm everything that is created once (clients, imports, caches).
        async with rt.job("warm") as job, job.session() as s:
            await s.chat(model="m", messages=MESSAGES)
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        async with AsyncExitStack() as stack:
            for i in range(sessions):
                job = await stack.enter_async_context(rt.job(f"job-{i % 50}"))
                s = await stack.enter_async_context(job.session("main"))
                await s.chat(model="m", messages=MESSAGES)
                s.expect_idle(30.0)
            held = tracemalloc.get_traced_memory()[0] - before
            loads = rt.endpoint_loads()
        tracemalloc.stop()
    return {
        "sessions": sessions,
        "held_mb": held / 1e6,
        "per_session_kb": held / max(sessions, 1) / 1e3,
        "sessions_per_endpoint": [load.sessions for load in loads],
    }


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sessions", type=int, default=10_000)
    add_run_args(parser, out="idle_sessions.json")


def main(args: argparse.Namespace) -> int:
    result = anyio.run(measure, args.sessions)
    print(
        f"{result['sessions']} idle sessions hold {result['held_mb']:.1f} MB "
        f"({result['per_session_kb']:.1f} kB each; goal: < 100 MB for 10,000); "
        f"sessions per endpoint {result['sessions_per_endpoint']}"
    )
    write_result(args.out, result, __doc__, indent=2)
    return 0
