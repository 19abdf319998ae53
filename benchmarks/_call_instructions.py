"""CPU instructions per call (valgrind's callgrind: deterministic), the openai baseline
against agentrt's clients, on the loopback echo server.

Wall and CPU times on a shared 2-core machine move by several microseconds between runs
(docs/benchmarks.md), more than most single changes to the hot path are worth. An
instruction count moves much less: runs of the same client agree to about 20,000 of its
8.6 million instructions per call (the event loop's iterations depend on when the reply
lands). It is not a time (cache misses and instruction mixes differ), but it tells
whether a change made the client do less work.

Each client runs twice in its own process under ``valgrind --tool=callgrind``, with
``--calls`` and with twice as many calls after the same warm-up; the difference divided by
``--calls`` is the client's instructions per call (start-up and imports cancel out). The
echo server (``benchmarks/_echo_server.py --impl raw``) runs outside valgrind. Clients:

- ``openai``: ``AsyncOpenAI(base_url=..., api_key="x", max_retries=0)``, the baseline;
- ``openai+hdr-v2``: the baseline sending agentrt's ``x-agentrt`` header as a fixed
  default header (what carrying one more header costs openai's stack);
- ``openai+tg``: the baseline inside an anyio task group (what one enclosing cancel scope
  costs the HTTP stack's own scopes and checkpoints);
- ``agentrt.openai``: ``rt.openai()`` inside a session, jobs of 50 calls;
- ``agentrt.chat``: ``session.chat(...)``, jobs of 50 calls;
- ``agentrt.nohdr``: ``rt.openai()`` with a dialect that sends nothing (diagnostic: the
  difference to ``agentrt.openai`` is what the header costs, encoding and wire);
- ``agentrt.retried``: ``rt.openai()`` as ``agentrt.openai``, each call answered 503 once
  and retried at once (``Retry(wait_initial=0, wait_jitter=0)``) on the same connection:
  two attempts per call (the echo server's ``/alternate/`` path).

    python -m benchmarks cost instructions     # ~6 min; results/call_instructions.json
    python -m benchmarks cost instructions --clients openai agentrt.openai

``--endpoints 1 4 8`` runs each agentrt client over that many endpoints (distinct URLs
on the one echo server, ``/e0/v1`` ...; the runtime's defaults: session routing, the
engines' ``/metrics`` polled, a 404 here), named ``CLIENT@K``; ``--before DIR`` runs the
agentrt clients a second time with ``PYTHONPATH=DIR`` (an older tree of agentrt: a
``git worktree`` of the commit to compare with), their figures under ``"before"``:

    git worktree add /tmp/before <commit>
    python -m benchmarks cost instructions --clients openai agentrt.openai \
        --endpoints 1 4 8 --before /tmp/before --out results/call_instructions_endpoints.json

Needs ``valgrind`` (Debian: ``apt-get install valgrind``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ._harness import ROOT, add_run_args, again, run_record, write_result
from ._overhead import HEADER_CLIENTS, REQUEST, echo_server

CLIENTS = (
    "openai",
    "openai+hdr-v2",
    "openai+tg",
    "agentrt.openai",
    "agentrt.chat",
    "agentrt.nohdr",
    "agentrt.retried",
)
WARMUP = 50
PER_JOB = 50


def child(client: str, calls: int, url: str) -> None:
    """The measured process: a warm-up, then ``calls`` sequential calls (``CLIENT@K``:
    over ``K`` endpoints)."""
    client, _, count = client.partition("@")
    endpoints = int(count or 1)
    import anyio
    import openai

    import agentrt
    from agentrt.dialects import Dialect, Encoding

    async def plain(create: Any, n: int) -> None:
        for _ in range(n):
            await create(**REQUEST)

    async def main() -> None:
        if client.startswith("openai"):
            headers = HEADER_CLIENTS["openai+hdr-v2"] if client == "openai+hdr-v2" else None
            oc = openai.AsyncOpenAI(
                base_url=url, api_key="x", max_retries=0, default_headers=headers
            )
            await plain(oc.chat.completions.create, WARMUP)
            if client == "openai+tg":
                async with anyio.create_task_group():
                    await plain(oc.chat.completions.create, calls)
            else:
                await plain(oc.chat.completions.create, calls)
            return
        options: dict[str, Any] = {}
        if client == "agentrt.nohdr":
            options["dialect"] = Dialect(name="none", encode=lambda meta, opts: Encoding())
        if client == "agentrt.retried":
            options["retry"] = agentrt.Retry(attempts=2, wait_initial=0.0, wait_jitter=0.0)
        base = url.replace("/v1", "/alternate/v1") if client == "agentrt.retried" else url
        urls = (
            [base]
            if endpoints == 1
            else [base.replace("/v1", f"/e{i}/v1") for i in range(endpoints)]
        )
        async with agentrt.Runtime(urls, **options) as rt:
            create = rt.openai().chat.completions.create
            for n in (WARMUP, calls):
                done = 0
                while done < n:
                    k = min(PER_JOB, n - done)
                    async with rt.job("bench") as job, job.session() as session:
                        call = session.chat if client == "agentrt.chat" else create
                        for _ in range(k):
                            await call(**REQUEST)
                    done += k

    anyio.run(main)


def instructions(client: str, calls: int, url: str, tree: Path | None = None) -> int:
    """Instructions the whole process ran (callgrind's 'Collected'); ``tree``: agentrt
    imported from there (the process runs in a folder that holds only a link to that
    agentrt, which ``python -m`` finds first; the benchmarks come from this checkout)."""
    env = dict(os.environ, PYTHONHASHSEED="0", PYTHONPATH=str(ROOT))
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    command += again("--child", client, str(calls), url)
    with tempfile.TemporaryDirectory() as folder:
        cwd = ROOT
        if tree is not None:
            cwd = Path(folder)
            (cwd / "agentrt").symlink_to(tree / "agentrt")
        out = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, check=False)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode != 0 or found is None:
        raise RuntimeError(f"{client}: valgrind failed:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calls", type=int, default=200, help="the calls that are counted")
    p.add_argument(
        "--clients",
        nargs="+",
        choices=CLIENTS,
        default=list(CLIENTS),
        metavar="CLIENT",
        help=f"of {', '.join(CLIENTS)} (default: all)",
    )
    p.add_argument(
        "--endpoints", nargs="+", type=int, default=[1], help="agentrt clients over K endpoints"
    )
    p.add_argument("--before", type=Path, default=None, help="agentrt's tree to compare with")
    add_run_args(p, out="call_instructions.json")
    p.add_argument("--child", nargs=3, metavar=("CLIENT", "CALLS", "URL"), help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> None:
    if args.child:
        child(args.child[0], int(args.child[1]), args.child[2])
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    if args.calls < 1:
        raise SystemExit("--calls must be >= 1")
    if any(k < 1 for k in args.endpoints):
        raise SystemExit("--endpoints must be >= 1")
    if args.before is not None and not (args.before / "agentrt" / "__init__.py").is_file():
        raise SystemExit(f"--before {args.before}: no agentrt package there")
    chosen: list[str] = args.clients if "openai" in args.clients else ["openai", *args.clients]
    names = [
        n if n.startswith("openai") or k == 1 else f"{n}@{k}"
        for n in chosen
        for k in (args.endpoints if n.startswith("agentrt") else [1])
    ]
    names = list(dict.fromkeys(names))
    trees: dict[str, Path | None] = {"after": None}
    if args.before is not None:
        trees = {"before": args.before.resolve(), "after": None}
    figures: dict[str, dict[str, float]] = {label: {} for label in trees}
    with echo_server("raw", None) as url, ThreadPoolExecutor(2) as pool:
        print(f"echo server (raw) at {url}; {args.calls} counted calls per client")
        for label, tree in trees.items():
            for name in names:
                if label == "before" and name.startswith("openai"):
                    continue
                short, long = pool.map(
                    lambda n, name=name, tree=tree: instructions(name, n, url, tree),
                    (args.calls, 2 * args.calls),
                )
                figures[label][name] = (long - short) / args.calls
                tag = f" ({label})" if len(trees) > 1 else ""
                print(
                    f"  {name:16s} {figures[label][name]:12,.0f} instructions per call{tag}",
                    flush=True,
                )
    per_call = figures["after"]
    base = per_call["openai"]
    print("\nadded vs openai (instructions per call, and in % of the baseline's):")
    for name in names[1:]:
        added = per_call[name] - base
        print(f"  {name:16s} {added:+12,.0f}  {100 * added / base:+6.2f} %")
    result: dict[str, Any] = {
        "meta": {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": run_record("")["command"],
            "calls": args.calls,
        },
        "instructions_per_call": per_call,
        "added_vs_openai": {n: per_call[n] - base for n in names[1:]},
    }
    if "before" in figures:
        before = figures["before"]
        result["before"] = {"tree": str(args.before), "instructions_per_call": before}
        result["after_vs_before"] = {n: per_call[n] - before[n] for n in before}
        print("\nafter vs before (instructions per call):")
        for n, v in result["after_vs_before"].items():
            print(f"  {n:16s} {before[n]:12,.0f} -> {per_call[n]:12,.0f}  {v:+10,.0f}")
    write_result(args.out, result, __doc__, indent=2)
    print(f"\nwrote {args.out}")
