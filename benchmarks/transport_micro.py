"""agentrt's transport alone: the CPU one call spends in ``AgentTransport`` (tag, route,
encode, observe, account), with the openai client and the network taken away.

A prebuilt request goes straight into the transport; underneath, a stub transport
answers at once with a prebuilt reply. Reported: microseconds per call (median over
rounds, the stub's own cost taken off), with the job's report built after each
``--calls-per-job`` calls.

    .venv/bin/python benchmarks/transport_micro.py
    .venv/bin/python benchmarks/transport_micro.py --dialect vllm --profile
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import time
from typing import Any

import anyio
import httpx2

import agentrt
from agentrt._context import _CALL_SESSION

URL = "http://engine.test/v1"
REPLY = json.dumps(
    {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
).encode()
BODY = json.dumps(
    {"messages": [{"role": "user", "content": "hi"}], "model": "m", "max_tokens": 16}
).encode()


class Stub(httpx2.AsyncBaseTransport):
    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers=[(b"content-type", b"application/json")], content=REPLY)


async def run(
    calls: int,
    per_job: int,
    dialect: str,
    prof: cProfile.Profile | None,
    keep: int = 0,
    options: dict[str, Any] | None = None,
) -> float:
    """CPU microseconds per call; ``options``: more Runtime arguments (telemetry_cost.py)."""
    async with agentrt.Runtime(
        [URL], transport=Stub(), dialect=dialect, keep_reports=keep, **(options or {})
    ) as rt:
        transport: Any = rt.http_client()._transport
        headers = [(b"content-type", b"application/json"), (b"authorization", b"Bearer x")]
        headers += [(f"x-stainless-{i}".encode(), b"value") for i in range(8)]
        request = httpx2.Request("POST", URL + "/chat/completions", headers=headers, content=BODY)
        total = 0.0
        done = 0
        while done < calls:
            async with rt.job("micro") as job, job.session() as s:
                token = _CALL_SESSION.set(s)
                if prof:
                    prof.enable()
                t = time.process_time()
                for _ in range(per_job):
                    response = await transport.handle_async_request(request)
                    await response.aread()
                _CALL_SESSION.reset(token)
            total += time.process_time() - t  # includes the job's report
            if prof:
                prof.disable()
            done += per_job
        return total / done * 1e6


async def stub_only(calls: int) -> float:
    """The stub's own cost (building and reading its reply), subtracted from the figure."""
    stub = Stub()
    request = httpx2.Request("POST", URL + "/chat/completions", content=BODY)
    t = time.process_time()
    for _ in range(calls):
        response = await stub.handle_async_request(request)
        await response.aread()
    return (time.process_time() - t) / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--calls-per-job", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dialect", default="generic")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    prof = cProfile.Profile() if args.profile else None
    per_call = [
        anyio.run(run, args.calls, args.calls_per_job, args.dialect, prof)
        for _ in range(args.rounds)
    ]
    stub = statistics.median(anyio.run(stub_only, args.calls) for _ in range(args.rounds))
    own = [x - stub for x in per_call]
    print(
        f"agentrt transport ({args.dialect}): {statistics.median(own):.1f} µs/call of its own "
        f"(rounds: {', '.join(f'{x:.1f}' for x in own)}; the stub's {stub:.1f} µs taken off)"
    )
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
