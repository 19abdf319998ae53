"""Against the alternatives (issue 26): agentrt beside the server-side routers a team would
deploy instead, and on top of them, on the embedded cluster in virtual time.

For each workload, KV setting and seed, every configuration below is searched for its
throughput at SLO (the highest Poisson rate at which the p90 JCT stretch stays <= 2,
``benchmarks/slo_rate.py``'s search: the same jobs, only the arrival gaps scaled), then
replayed at two loads (half and all of the best ``plain > peer``'s rate at SLO, the mean
over seeds) for JCT p50 and p90:

- ``plain``: a bare openai client round-robin over the replicas' URLs (the old baseline);
- ``plain>PEER``: the same client at one URL, a modelled peer in front of the replicas
  (``agentrt.sim.peers``: vllm-router's policies, and llm-d, Dynamo and vllm-router's
  program scheduling where registered);
- ``agentrt:defaults>PEER``: agentrt as a user gets it, through the same peer, speaking
  its dialect (session ids, programs, expected idle, last call);
- ``agentrt:session``: agentrt direct, session routing and nothing else (placement only);
- ``agentrt:defaults``: agentrt direct, its defaults (placement + the engine-aware cap);
- ``agentrt:config=FILE`` (``--tuned FILE``): agentrt direct with the settings
  ``agentrt tune`` chose.

Workloads: ``claude-code`` (the first --cc-jobs Claude Code traces whose calls fit a
200k-token context, full token scale, each think or tool wait capped at --max-wait s)
and ``coding`` (the fitted generator at the demo's scale). KV settings: ``ample`` (the
``h100-8b`` preset's 26,624 blocks of 16 tokens per replica) and ``pressure``
(--pressure-blocks). 8 replicas; 2 seeds by default.

    .venv/bin/python benchmarks/alternatives.py                 # results/alternatives.json
    .venv/bin/python benchmarks/alternatives.py --quick         # a small run
    .venv/bin/python benchmarks/alternatives.py --append --peer llm-d   # add configurations
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slo_rate import Setup, at_rate, measure

from agentrt.bench import Arrivals, BenchConfig, TraceOptions, make_workload
from agentrt.bench._drivers import ClientSpec
from agentrt.bench._parallel import parse_workers
from agentrt.bench._runner import ClientRun, PartResult, _resumed_hit_rate, run_parts
from agentrt.sim.peers import PEERS

WORKLOADS: dict[str, dict[str, Any]] = {
    "claude-code": {"jobs": 100, "start": 0.02},
    "coding": {"jobs": 100, "start": 0.3},
}
KV: dict[str, int | None] = {"ample": None, "pressure": 8192}
MAX_CONTEXT = 200_000
"""Claude's context window: the traces with a longer call came from 1M-token sessions."""


def default_peers() -> list[str]:
    """Every registered peer but round_robin (a plain client round-robins already; the
    test suite shows the two replay alike)."""
    return [p for p in PEERS if p != "vllm-router:round_robin"]


def configurations(peers: Sequence[str], tuned: str | None) -> list[str]:
    out = ["plain"]
    out += [f"plain>{p}" for p in peers]
    out += [f"agentrt:defaults>{p}" for p in peers]
    out += ["agentrt:session", "agentrt:defaults"]
    if tuned:
        out.append(f"agentrt:config={tuned}")
    return out


def _jct(run: ClientRun) -> dict[str, float]:
    ok = sorted(r.jct_s for r in run.results if r.status == "ok")
    if not ok:
        return {"p50": math.nan, "p90": math.nan, "failed": len(run.results)}

    def pct(q: float) -> float:
        return ok[min(len(ok) - 1, max(0, math.ceil(q * len(ok)) - 1))]

    return {
        "p50": pct(0.5),
        "p90": pct(0.9),
        "mean": statistics.fmean(ok),
        "failed": sum(r.status != "ok" for r in run.results),
        "cache_hit": run.engine.get("hit_rate") or math.nan,
        "resumed_hit": _resumed_hit_rate(run.results) or math.nan,
        "busy": run.engine.get("utilization") or math.nan,
    }


def loads(
    setup: Setup,
    rates: dict[str, float],
    clients: Sequence[str],
    workers: Any,
) -> dict[str, Any]:
    """Every client replayed at each workload's ``rates`` (jobs/s), per seed."""
    items: list[tuple[BenchConfig, list[Any], int]] = []
    keys: list[tuple[str, int, str, str]] = []
    for wl, opts in setup.workloads.items():
        for seed in setup.seeds:
            plans = make_workload(
                wl,
                int(opts["jobs"]),
                Arrivals(1.0, seed),
                seed=seed,
                traces=setup.traces,
                tool_wait_s=setup.tool_wait_s,
            )
            for label, factor in (("half", 0.5), ("full", 1.0)):
                rate = rates[wl] * factor
                for client in clients:
                    cfg = BenchConfig(
                        workload=wl,
                        jobs=int(opts["jobs"]),
                        rate=rate,
                        seed=seed,
                        clients=(client,),
                        replicas=setup.replicas,
                        preset=setup.preset,
                        traces=setup.traces,
                        stretch=False,
                        api="http",
                        tool_wait_s=setup.tool_wait_s,
                        gpu_blocks=setup.gpu_blocks,
                        fleet=setup.fleet,
                    )
                    items.append((cfg, at_rate(plans, rate), 0))
                    keys.append((wl, seed, label, client))
    out: dict[int, PartResult] = {}

    def done(index: int, result: PartResult | BaseException) -> None:
        if isinstance(result, BaseException):
            raise result
        out[index] = result

    run_parts(items, done, workers=workers)
    result: dict[str, Any] = {}
    for i, (wl, seed, label, client) in enumerate(keys):
        run = out[i]
        assert isinstance(run, ClientRun)
        at = result.setdefault(wl, {}).setdefault(
            label, {"rate": rates[wl] * (0.5 if label == "half" else 1.0)}
        )
        at.setdefault(client, {})[str(seed)] = _jct(run)
    return result


def best_plain_peer(slo: dict[str, Any], wl: str) -> tuple[str, float]:
    """The ``plain>PEER`` with the highest mean rate at SLO over the seeds."""
    seeds = slo[wl]
    best, best_rate = "plain", -1.0
    for client in next(iter(seeds.values())):
        if not client.startswith("plain"):
            continue
        rates = [s[client]["rate"] for s in seeds.values() if client in s]
        rate = statistics.fmean(rates) if rates else -1.0
        if rate > best_rate:
            best, best_rate = client, rate
    return best, best_rate


def summary(
    slo: dict[str, Any], at: dict[str, Any], clients: Sequence[str]
) -> list[dict[str, Any]]:
    rows = []
    for wl, seeds in slo.items():
        best, _ = best_plain_peer(slo, wl)
        for client in clients:
            per = [s[client]["rate"] for s in seeds.values() if client in s]
            ratios = [
                s[client]["rate"] / s[best]["rate"]
                for s in seeds.values()
                if client in s and s[best]["rate"] > 0
            ]
            if not per:
                continue
            row: dict[str, Any] = {
                "workload": wl,
                "client": client,
                "rate": statistics.fmean(per),
                "x_best_plain_peer": math.exp(statistics.fmean(math.log(r) for r in ratios))
                if ratios and all(r > 0 for r in ratios)
                else math.nan,
                "x_min": min(ratios) if ratios else math.nan,
                "x_max": max(ratios) if ratios else math.nan,
                "best_plain_peer": best,
            }
            for label in ("half", "full"):
                cell = at.get(wl, {}).get(label, {}).get(client)
                if cell:
                    for key in ("p50", "p90", "cache_hit", "resumed_hit", "failed"):
                        values = [
                            v[key] for v in cell.values() if not math.isnan(v.get(key, math.nan))
                        ]
                        row[f"{label}_{key}"] = statistics.median(values) if values else math.nan
            rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = []
    for wl in dict.fromkeys(r["workload"] for r in rows):
        sub = [r for r in rows if r["workload"] == wl]
        lines.append(f"{wl} (x: rate over {sub[0]['best_plain_peer']}'s)")
        lines.append(
            f"{'configuration':<34}{'jobs/s':>7}{'x':>6}{'p50':>7}{'p90':>7}{'hit':>5}"
            f"{'p50':>7}{'p90':>7}"
        )
        lines.append(f"{'':<34}{'at SLO':>13}{'half load':^19}{'full load':^14}")
        for r in sub:
            name = r["client"].replace("agentrt:", "a:").replace("vllm-router", "vr")

            def f(key: str, fmt: str = "7.0f", r: dict[str, Any] = r) -> str:
                v = r.get(key, math.nan)
                return (
                    f"{v:{fmt}}"
                    if isinstance(v, float) and math.isfinite(v)
                    else f"{'-':>{fmt[0]}}"
                )

            hit = r.get("half_cache_hit", math.nan)
            hit_s = f"{hit * 100:4.0f}%" if math.isfinite(hit) else f"{'-':>5}"
            lines.append(
                f"{name[:33]:<34}{r['rate']:7.3f}{f('x_best_plain_peer', '6.2f')}"
                f"{f('half_p50')}{f('half_p90')}{hit_s}{f('full_p50')}{f('full_p90')}"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small run")
    ap.add_argument("--peer", action="append", help="a modelled peer (repeatable)")
    ap.add_argument("--tuned", help="a settings file from agentrt tune for agentrt direct")
    ap.add_argument("--client", action="append", help="extra configurations (repeatable)")
    ap.add_argument("--workload", action="append", choices=sorted(WORKLOADS))
    ap.add_argument("--kv", action="append", choices=sorted(KV))
    ap.add_argument("--cc-jobs", type=int, default=WORKLOADS["claude-code"]["jobs"])
    ap.add_argument("--coding-jobs", type=int, default=WORKLOADS["coding"]["jobs"])
    ap.add_argument("--pressure-blocks", type=int, default=KV["pressure"])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--tol", type=float, default=1.25)
    ap.add_argument("--max-tries", type=int, default=6)
    ap.add_argument("--max-wait", type=float, default=30.0)
    ap.add_argument("--fleet", type=int, default=1)
    ap.add_argument("--workers", type=parse_workers, default="auto")
    ap.add_argument("--append", action="store_true", help="add to --out's configurations")
    ap.add_argument("--no-loads", action="store_true", help="skip the fixed-load replays")
    ap.add_argument("--out", type=Path, default=Path("results/alternatives.json"))
    args = ap.parse_args(argv)
    peers = args.peer or default_peers()
    for p in peers:
        if p not in PEERS:
            sys.exit(f"unknown peer {p!r}; known: {', '.join(PEERS)}")
    clients = configurations(peers, args.tuned) + list(args.client or [])
    for c in clients:
        ClientSpec.parse(c)
    wls = {
        "claude-code": {"jobs": args.cc_jobs, "start": WORKLOADS["claude-code"]["start"]},
        "coding": {"jobs": args.coding_jobs, "start": WORKLOADS["coding"]["start"]},
    }
    wls = {k: v for k, v in wls.items() if k in (args.workload or list(WORKLOADS))}
    kvs = {"ample": None, "pressure": args.pressure_blocks}
    kvs = {k: v for k, v in kvs.items() if k in (args.kv or list(KV))}
    seeds = tuple(range(args.seeds))
    traces = TraceOptions(token_scale=1.0, max_wait_s=args.max_wait, max_context=MAX_CONTEXT)
    if args.quick:
        wls = {"coding": {"jobs": 24, "start": 0.3}}
        kvs = {"ample": None}
        seeds = (0,)
    old: dict[str, Any] = (
        json.loads(args.out.read_text()) if args.append and args.out.exists() else {}
    )
    started = time.perf_counter()
    out: dict[str, Any] = old or {
        "setup": {
            "workloads": wls,
            "kv_gpu_blocks": kvs,
            "seeds": list(seeds),
            "replicas": 8,
            "preset": "h100-8b",
            "token_scale": 1.0,
            "max_wait_s": args.max_wait,
            "max_context": MAX_CONTEXT,
            "slo_p90_stretch": 2.0,
            "tol": args.tol,
            "fleet": args.fleet,
        },
        "kv": {},
    }
    out["command"] = "benchmarks/alternatives.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    for kv, blocks in kvs.items():
        entry = out["kv"].setdefault(kv, {"slo": {}, "loads": {}, "clients": []})
        todo = [c for c in clients if c not in entry["clients"]]
        if not todo:
            continue
        setup = Setup(
            workloads=wls,
            clients=tuple(todo),
            seeds=seeds,
            traces=traces,
            gpu_blocks=blocks,
            tol=args.tol,
            max_tries=args.max_tries,
            workers=args.workers,
            fleet=args.fleet,
        )
        print(f"{kv}: throughput at SLO, {len(todo)} configurations", file=sys.stderr, flush=True)
        slo = measure(setup)
        for wl, per_seed in slo.items():
            for seed, per_client in per_seed.items():
                entry["slo"].setdefault(wl, {}).setdefault(seed, {}).update(per_client)
        entry["clients"] = list(dict.fromkeys([*entry["clients"], *todo]))
        if not args.no_loads:
            rates = {}
            for wl in wls:
                _, rate = best_plain_peer(entry["slo"], wl)
                old_rate = entry["loads"].get(wl, {}).get("full", {}).get("rate")
                rates[wl] = old_rate if old_rate else rate
            print(f"{kv}: JCT at two loads {rates}", file=sys.stderr, flush=True)
            at = loads(setup, rates, todo, args.workers)
            for wl, per_label in at.items():
                for label, cells in per_label.items():
                    entry["loads"].setdefault(wl, {}).setdefault(label, {}).update(cells)
        entry["summary"] = summary(entry["slo"], entry["loads"], entry["clients"])
        out["wall_s"] = round(time.perf_counter() - started + old.get("wall_s", 0.0), 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1))
        print(f"== KV {kv} ==")
        print(table(entry["summary"]), flush=True)
    return out


if __name__ == "__main__":
    main()
