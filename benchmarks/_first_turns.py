"""First turns of a fleet started one process at a time.

``--fleet`` OS processes (this file with ``--worker``), each ``agentrt.Runtime(urls)``
with the defaults and one session of ``--turns`` turns (a tool wait of ``--tool-s``
between turns), started ``--stagger-s`` apart against ``agentrt sim serve --replicas 4``
(one server for all runs). Each run reports the calls per replica and the busiest
replica's calls over the mean; a session whose turns went to more than one replica is
counted too.

    python -m benchmarks fleet first-turns --runs 10          # results/first_turns.json

The figures before the fix: max/mean 1.25, 1.25, 1.50 and 1.75 over four runs.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from typing import Any

from ._harness import ROOT, add_run_args, again, write_result


def _worker(urls: list[str], model: str, turns: int, tool_s: float, tag: str) -> None:
    import anyio

    import agentrt

    async def main() -> None:
        async with agentrt.Runtime(urls) as rt:
            async with rt.job("agent") as job, job.session() as s:
                messages: list[Any] = [
                    {"role": "system", "content": f"{tag} you are an agent. " + "plan " * 200}
                ]
                for turn in range(turns):
                    if turn:
                        async with s.tool("search", expected_s=tool_s):
                            await anyio.sleep(tool_s)
                    messages.append({"role": "user", "content": f"step {turn} " + "go " * 40})
                    reply = await s.chat(model=model, messages=messages, max_tokens=32)
                    text = reply.choices[0].message.content or ""
                    messages.append({"role": "assistant", "content": text})
            endpoints = [c.endpoint for c in job.report.call_reports]
        print(json.dumps(endpoints))

    anyio.run(main)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(url: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2.0):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"the simulator did not come up at {url}")


def one_run(urls: list[str], model: str, args: argparse.Namespace, run: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = []
    for k in range(args.fleet):
        work = [urls, model, args.turns, args.tool_s, f"run{run}-worker{k}"]
        command = again("--worker", json.dumps(work))
        procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, env=env, cwd=ROOT))
        time.sleep(args.stagger_s)
    per: dict[str, int] = {u: 0 for u in urls}
    split = 0
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        if proc.returncode != 0:
            raise SystemExit(f"a worker exited with {proc.returncode}")
        endpoints = json.loads(out.decode().strip().splitlines()[-1])
        split += len(set(endpoints)) > 1
        for e in endpoints:
            per[e] += 1
    counts = [per[u] for u in urls]
    ratio = max(counts) / statistics.fmean(counts)
    return {"calls": counts, "max_over_mean": round(ratio, 3), "split_sessions": split}


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--fleet", type=int, default=16)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--stagger-s", type=float, default=0.25)
    parser.add_argument("--tool-s", type=float, default=0.2)
    add_run_args(parser, out="first_turns.json")


def main(args: argparse.Namespace) -> None:
    if args.worker is not None:
        _worker(*json.loads(args.worker))
        return
    port = _free_port()
    origin = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentrt",
            "sim",
            "serve",
            f"--replicas={args.replicas}",
            f"--port={port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        _wait_ready(f"{origin}/replica-{args.replicas - 1}/health")
        urls = [f"{origin}/replica-{i}/v1" for i in range(args.replicas)]
        with urllib.request.urlopen(f"{urls[0]}/models", timeout=10) as r:
            model = json.loads(r.read())["data"][0]["id"]
        runs = []
        for run in range(args.runs):
            result = one_run(urls, model, args, run)
            runs.append(result)
            print(
                f"run {run}: calls {result['calls']}, max/mean {result['max_over_mean']}, "
                f"split sessions {result['split_sessions']}",
                flush=True,
            )
    finally:
        server.terminate()
        server.wait(timeout=30)
    ratios = [r["max_over_mean"] for r in runs]
    summary = {
        "fleet": args.fleet,
        "stagger_s": args.stagger_s,
        "turns": args.turns,
        "tool_s": args.tool_s,
        "runs": runs,
        "max_over_mean": {"min": min(ratios), "max": max(ratios), "mean": statistics.fmean(ratios)},
    }
    print(json.dumps(summary["max_over_mean"]))
    write_result(args.out, summary, __doc__, indent=2)
