"""agentrt's own CPU cost per call, without a network: a bare openai client against
agentrt's session.chat, both over the same in-process mock server and the same HTTP
library (``--lib httpx2``, openai 3.x's own stack, or legacy ``httpx``), so the
difference is agentrt's transport, context and accounting.

    .venv/bin/python benchmarks/transport_cpu.py --calls 3000 --rounds 3
    .venv/bin/python benchmarks/transport_cpu.py --lib httpx
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from types import ModuleType
from typing import Any

import anyio
import openai

import agentrt

BODY = {
    "id": "x",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
}
URL = "http://engine.test/v1"


def mock(lib: ModuleType) -> Any:
    def handler(request: Any) -> Any:
        return lib.Response(200, json=BODY)

    return lib.MockTransport(handler)


async def plain(lib: ModuleType, n: int) -> float:
    http = lib.AsyncClient(transport=mock(lib))
    client = openai.AsyncOpenAI(
        base_url=URL,
        api_key="x",
        http_client=http,
        max_retries=0,  # type: ignore[arg-type,unused-ignore]
    )
    t = time.process_time()
    for _ in range(n):
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    return (time.process_time() - t) / n * 1e6


async def with_agentrt(lib: ModuleType, n: int) -> float:
    transport = mock(lib)
    async with agentrt.Runtime([URL], transport=transport, keep_reports=0) as rt:
        async with rt.job("bench") as job, job.session() as s:
            t = time.process_time()
            for _ in range(n):
                await s.chat(model="m", messages=[{"role": "user", "content": "hi"}])
            return (time.process_time() - t) / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lib", choices=("httpx2", "httpx"), default="httpx2")
    args = parser.parse_args()
    lib = importlib.import_module(args.lib)
    added = []
    for i in range(args.rounds):
        p = anyio.run(plain, lib, args.calls)
        a = anyio.run(with_agentrt, lib, args.calls)
        added.append(a - p)
        print(f"round {i}: openai {p:.0f} µs/call, agentrt {a:.0f} µs/call, added {a - p:.0f} µs")
    print(f"median added CPU per call: {statistics.median(added):.0f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
