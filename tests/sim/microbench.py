"""Microbenchmark of the simulator: replay Claude Code traces through httpx in virtual time.

    python tests/sim/microbench.py [SESSIONS] [REPLICAS] [--stream-interval N] [--openai]
        [--policy P --host-blocks N --notice]

Prints simulated requests per wall second and simulated seconds per wall second. Each trace
(../shared/traces/claude-code) is one session: its calls in order, think times as recorded,
prompts built from the trace's block ids (``prompt_for_blocks``), sub-agents run as
concurrent sessions. Sessions start uniformly over the first ``--spread`` simulated seconds.
``--policy`` sets the tool-wait KV policy; ``--notice`` sends a tool-start notice after each
call whose reply called a tool, with the recorded think time that follows as ``expected_s``
(an oracle). Also prints the mean session completion time (JCT).
Not a test; pytest does not collect it.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import random
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
from trio.testing import MockClock

from agentrt.sim import PRESETS, Cluster, prompt_for_blocks

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces" / "claude-code"


def load(n: int) -> list[dict[str, Any]]:
    files = sorted(TRACES.glob("trace_*.json.gz"))[:n]
    return [json.load(gzip.open(f)) for f in files]


async def main(args: argparse.Namespace) -> None:
    traces = load(args.sessions)
    cfg = PRESETS["h100-8b"].replace(
        stream_interval=args.stream_interval,
        cache_output_blocks=not args.no_output_cache,
        tool_wait_policy=args.policy,
        num_host_blocks=args.host_blocks,
    )
    counts = {"calls": 0, "rejected": 0, "streamed": 0, "notices": 0}
    jct: list[float] = []
    rng = random.Random(0)

    async with Cluster(args.replicas, cfg) as cluster:
        http = httpx.AsyncClient(transport=cluster.transport(), timeout=None)
        oai = None
        if args.openai:
            import openai

            oai = [
                openai.AsyncOpenAI(base_url=u, api_key="x", http_client=http, max_retries=0)  # type: ignore[arg-type,unused-ignore]
                for u in cluster.base_urls
            ]

        async def call(url_i: int, sid: str, r: dict[str, Any], session: str) -> None:
            ids = r["hash_ids"]
            tail = r["in"] - 64 * len(ids)
            prompt = prompt_for_blocks(ids, 64, tail if 0 <= tail < 64 else 0, namespace=sid)
            stream = r.get("type") == "s" and not args.no_stream
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max(1, r["out"]),
                "session_id": session,
            }
            if oai is not None:
                try:
                    if stream:
                        s = await oai[url_i].chat.completions.create(**body, stream=True)
                        async for _ in s:
                            pass
                    else:
                        await oai[url_i].chat.completions.create(**body)
                except Exception:
                    counts["rejected"] += 1
            elif stream:
                body["stream"] = True
                async with http.stream(
                    "POST", cluster.base_urls[url_i] + "/chat/completions", json=body
                ) as resp:
                    async for _ in resp.aiter_raw():
                        pass
                    if resp.status_code != 200:
                        counts["rejected"] += 1
            else:
                resp = await http.post(cluster.base_urls[url_i] + "/chat/completions", json=body)
                if resp.status_code != 200:
                    counts["rejected"] += 1
            counts["calls"] += 1
            counts["streamed"] += stream

        async def notice(url_i: int, session: str, expected: float) -> None:
            url = cluster.base_urls[url_i] + "/agentrt/idle"
            body = {"v": 2, "session_id": session, "job_id": session, "tool": "t"}
            resp = await http.post(url, json={**body, "expected_s": expected, "source": None})
            counts["notices"] += resp.status_code == 204

        async def run_session(
            url_i: int, sid: str, reqs: list[dict[str, Any]], delay: float, session: str = ""
        ) -> None:
            await anyio.sleep(delay)
            start = anyio.current_time()
            session = session or sid
            calls = [r for r in reqs if r.get("type") != "subagent"]
            nxt = {id(a): b.get("think_time") for a, b in itertools.pairwise(calls)}
            async with anyio.create_task_group() as tg:
                for r in reqs:
                    if r.get("type") == "subagent":
                        sub = f"{session}/{r.get('agent_id', len(jct))}"
                        tg.start_soon(run_session, url_i, sid, r["requests"], 0.0, sub)
                        continue
                    await anyio.sleep((r.get("think_time") or 0.0) * args.think_scale)
                    await call(url_i, sid, r, session)
                    wait = nxt.get(id(r))
                    if args.notice and r.get("stop") == "tool_use" and wait:
                        await notice(url_i, session, wait * args.think_scale)
            if session == sid:
                jct.append(anyio.current_time() - start)

        t0 = time.perf_counter()
        c0 = time.process_time()
        v0 = anyio.current_time()
        async with anyio.create_task_group() as tg:
            for i, tr in enumerate(traces):
                tg.start_soon(
                    run_session,
                    i % args.replicas,
                    f"s{i}",
                    tr["requests"],
                    rng.uniform(0, args.spread),
                )
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
        sim = anyio.current_time() - v0
        await http.aclose()
        st = cluster.stats()
    q = sum(s.prefix_cache_queries for s in st)
    h = sum(s.prefix_cache_hits for s in st)
    print(
        f"sessions={len(traces)} replicas={args.replicas} calls={counts['calls']} "
        f"(streamed {counts['streamed']}, rejected {counts['rejected']}) wall={wall:.1f}s "
        f"calls/s={counts['calls'] / wall:.0f} cpu={cpu:.1f}s "
        f"calls/cpu-s={counts['calls'] / cpu:.0f} "
        f"simulated={sim:.0f}s sim/wall={sim / wall:.0f}x "
        f"hit-rate={h / max(q, 1):.3f} preemptions={sum(s.preemptions for s in st)} "
        f"busy={sum(s.busy_s for s in st) / (sim * len(st)):.2f}"
    )
    print(
        f"policy={args.policy} notices={counts['notices']} "
        f"mean-jct={sum(jct) / max(len(jct), 1):.1f}s "
        f"pinned={sum(s.tool_waits_pinned for s in st)} "
        f"offloaded={sum(s.tool_waits_offloaded for s in st)} "
        f"dropped={sum(s.tool_waits_dropped for s in st)} "
        f"lru={sum(s.tool_waits_lru for s in st)} "
        f"prefetches={sum(s.prefetches for s in st)} "
        f"useful={sum(s.prefetches_useful for s in st)} "
        f"wasted={sum(s.prefetches_wasted for s in st)} "
        f"skipped={sum(s.prefetches_skipped for s in st)} "
        f"host-hit-tokens={sum(s.host_cache_hits for s in st)}"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("sessions", type=int, nargs="?", default=100)
    ap.add_argument("replicas", type=int, nargs="?", default=8)
    ap.add_argument("--stream-interval", type=int, default=16)
    ap.add_argument("--spread", type=float, default=3600.0)
    ap.add_argument("--openai", action="store_true")
    ap.add_argument("--no-stream", action="store_true")
    ap.add_argument("--no-output-cache", action="store_true")
    ap.add_argument("--policy", default="lru", help="tool_wait_policy (lru, pin, ...)")
    ap.add_argument("--host-blocks", type=int, default=0, help="num_host_blocks")
    ap.add_argument("--notice", action="store_true", help="send tool-start notices")
    ap.add_argument("--think-scale", type=float, default=1.0, help="scale think times")
    a = ap.parse_args()
    anyio.run(main, a, backend="trio", backend_options={"clock": MockClock(autojump_threshold=0)})
