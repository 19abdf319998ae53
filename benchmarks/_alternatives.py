"""Against the alternatives: agentrt beside the server-side routers a team would
deploy instead, and on top of them, on the embedded cluster in virtual time.

For each workload, KV setting and seed, every configuration below is searched for its
throughput at SLO (the highest Poisson rate at which the p90 JCT stretch stays <= 2,
``_slo.py``'s search: the same jobs, only the arrival gaps scaled), then
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

    python -m benchmarks alternatives slo                 # results/alternatives_kv_ample.json
    python -m benchmarks alternatives slo --quick         # a small run
    python -m benchmarks alternatives slo --append --peer llm-d   # add configurations
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from agentrt.bench import BenchConfig, ClientResult, ClientSpec, TraceOptions, run_study
from agentrt.sim.peers import PEERS

from ._harness import add_run_args, run_record, write_result
from ._slo import Setup, measure

WORKLOADS: dict[str, dict[str, Any]] = {
    "claude-code": {"jobs": 100, "start": 0.02},
    "coding": {"jobs": 100, "start": 0.3},
}
KV: dict[str, int | None] = {"ample": None, "pressure": 8192}
CODING_RATES = (0.2, 0.4)
"""``coding``'s two loads (jobs/s): the demo's rate and twice it. Its jobs call one at a
time with short contexts, so a few hundred of them never load 8 replicas past the SLO:
it has no throughput at SLO here, only JCTs at fixed loads."""
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


def _jct(run: ClientResult) -> dict[str, float]:
    if run.failed == run.jobs:
        return {"p50": math.nan, "p90": math.nan, "failed": run.jobs}
    return {
        "p50": run.jct["p50"],
        "p90": run.jct["p90"],
        "mean": run.jct["mean"],
        "failed": run.failed,
        "cache_hit": run.prefix_cache_hit_rate or math.nan,
        "resumed_hit": run.resumed_hit_rate or math.nan,
        "busy": run.utilization or math.nan,
    }


def loads(
    setup: Setup,
    rates: dict[str, tuple[float, float]],
    clients: Sequence[str],
    workers: Any,
) -> dict[str, Any]:
    """Every client replayed at each workload's two ``rates`` (jobs/s: ``low``,
    ``high``), per seed: the same jobs for every client (the workload's for the seed,
    Poisson arrivals at the rate)."""
    cfgs: list[BenchConfig] = []
    keys: list[tuple[str, int, str, str]] = []
    for wl in setup.workloads:
        for seed in setup.seeds:
            for label, rate in zip(("low", "high"), rates[wl], strict=True):
                for client in clients:
                    cfgs.append(
                        setup.config(wl, seed, rate=rate, clients=(client,), fleet=setup.fleet)
                    )
                    keys.append((wl, seed, label, client))
    runs = run_study(cfgs, workers=workers)
    result: dict[str, Any] = {}
    for (wl, seed, label, client), bench in zip(keys, runs, strict=True):
        run = bench.clients[0]
        at = result.setdefault(wl, {}).setdefault(
            label, {"rate": rates[wl][0 if label == "low" else 1]}
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


def _ratio(values: Sequence[float]) -> float:
    return (
        math.exp(statistics.fmean(math.log(v) for v in values))
        if values and all(v > 0 for v in values)
        else math.nan
    )


def _best_by_jct(at: dict[str, Any]) -> str:
    """Without a rate at SLO: the ``plain>PEER`` (or ``plain``) with the lowest median JCT
    p90 at the high load."""
    cells = at.get("high", {})
    best, value = "plain", math.inf
    for client, per_seed in cells.items():
        if client == "rate" or not client.startswith("plain"):
            continue
        p90 = statistics.median(v["p90"] for v in per_seed.values())
        if p90 < value:
            best, value = client, p90
    return best


def summary(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """Per workload and configuration: the rate at SLO (where searched) over the best
    ``plain>PEER``'s, and the medians over seeds of JCT p50 / p90 and cache hits at the
    two loads, with the JCTs over the best ``plain>PEER``'s (by rate at SLO, else by JCT
    p90 at the high load)."""
    slo, at, clients = entry["slo"], entry["loads"], entry["clients"]
    rows = []
    for wl in dict.fromkeys([*slo, *at]):
        best = best_plain_peer(slo, wl)[0] if wl in slo else _best_by_jct(at.get(wl, {}))
        for client in clients:
            row: dict[str, Any] = {"workload": wl, "client": client, "best_plain_peer": best}
            seeds = slo.get(wl, {})
            per = [s[client]["rate"] for s in seeds.values() if client in s]
            if per:
                row["rate"] = statistics.fmean(per)
                ratios = [
                    s[client]["rate"] / s[best]["rate"]
                    for s in seeds.values()
                    if client in s and s[best]["rate"] > 0
                ]
                row["x_rate"] = _ratio(ratios)
                row["x_rate_min"] = min(ratios) if ratios else math.nan
            for label in ("low", "high"):
                cells = at.get(wl, {}).get(label, {})
                cell, ref = cells.get(client), cells.get(best)
                if not cell:
                    continue
                for key in ("p50", "p90", "cache_hit", "resumed_hit", "failed"):
                    values = [v[key] for v in cell.values() if math.isfinite(v.get(key, math.nan))]
                    row[f"{label}_{key}"] = statistics.median(values) if values else math.nan
                if ref:
                    for key in ("p50", "p90"):
                        row[f"{label}_x_{key}"] = _ratio(
                            [cell[sd][key] / ref[sd][key] for sd in cell if sd in ref]
                        )
            rows.append(row)
    return rows


def _cell(r: dict[str, Any], key: str, fmt: str) -> str:
    v = r.get(key, math.nan)
    width = int(fmt.split(".")[0])
    return f"{v:{fmt}}" if isinstance(v, float) and math.isfinite(v) else f"{'-':>{width}}"


def table(rows: list[dict[str, Any]]) -> str:
    """The table, under 80 columns: jobs/s at SLO and its ratio to the best plain>PEER's,
    then per load JCT p50 and p90 as ratios to the best plain>PEER's, and cache hits."""
    lines = []
    for wl in dict.fromkeys(r["workload"] for r in rows):
        sub = [r for r in rows if r["workload"] == wl]
        lines.append(f"{wl}: x = over {sub[0]['best_plain_peer']}")
        lines.append(f"{'':<31}{'at SLO':^13}{'low load':^18}{'high load':^18}")
        lines.append(
            f"{'configuration':<31}{'jobs/s':>7}{'x':>6}"
            + f"{'x p50':>6}{'x p90':>6}{'hit':>6}" * 2
        )
        for r in sub:
            name = r["client"].replace("agentrt:", "a:").replace("vllm-router", "vr")
            cells = f"{_cell(r, 'rate', '7.3f')}{_cell(r, 'x_rate', '6.2f')}"
            for label in ("low", "high"):
                hit = r.get(f"{label}_cache_hit", math.nan)
                hit_s = f"{hit * 100:5.0f}%" if math.isfinite(hit) else f"{'-':>6}"
                cells += (
                    f"{_cell(r, f'{label}_x_p50', '6.2f')}{_cell(r, f'{label}_x_p90', '6.2f')}"
                    + hit_s
                )
            lines.append(f"{name[:30]:<31}{cells}")
        lines.append("")
    return "\n".join(lines)


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table as Markdown (for docs/benchmarks.md), one per workload."""
    out = []
    for wl in dict.fromkeys(r["workload"] for r in rows):
        sub = [r for r in rows if r["workload"] == wl]
        out.append(f"**{wl}** (x: over `{sub[0]['best_plain_peer']}`)\n")
        out.append(
            "| configuration | jobs/s at SLO | x | low load: JCT p50 x | p90 x | cache hit "
            "| high load: JCT p50 x | p90 x | cache hit |"
        )
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in sub:

            def c(key: str, fmt: str, r: dict[str, Any] = r) -> str:
                v = r.get(key, math.nan)
                return format(v, fmt) if isinstance(v, float) and math.isfinite(v) else "-"

            def pct(key: str, r: dict[str, Any] = r) -> str:
                v = r.get(key, math.nan)
                return f"{v * 100:.0f}%" if isinstance(v, float) and math.isfinite(v) else "-"

            out.append(
                f"| `{r['client']}` | {c('rate', '.3f')} | {c('x_rate', '.2f')} | "
                f"{c('low_x_p50', '.2f')} | {c('low_x_p90', '.2f')} | {pct('low_cache_hit')} | "
                f"{c('high_x_p50', '.2f')} | {c('high_x_p90', '.2f')} | {pct('high_cache_hit')} |"
            )
        out.append("")
    return "\n".join(out)


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true", help="a small run")
    ap.add_argument("--peer", action="append", help="a modelled peer (repeatable)")
    ap.add_argument("--tuned", help="a settings file from agentrt tune for agentrt direct")
    ap.add_argument("--client", action="append", help="extra configurations (repeatable)")
    ap.add_argument(
        "--only", action="append", help="these configurations instead of the grid (repeatable)"
    )
    ap.add_argument("--kv", action="append", choices=sorted(KV))
    ap.add_argument("--cc-jobs", type=int, default=WORKLOADS["claude-code"]["jobs"])
    ap.add_argument(
        "--cc-start",
        type=float,
        default=WORKLOADS["claude-code"]["start"],
        help="the rate (jobs/s) each Claude Code search starts from",
    )
    ap.add_argument("--coding-jobs", type=int, default=WORKLOADS["coding"]["jobs"])
    ap.add_argument(
        "--coding-rates",
        type=float,
        nargs=2,
        default=CODING_RATES,
        metavar=("LOW", "HIGH"),
        help="coding's two loads, jobs/s",
    )
    ap.add_argument(
        "--cc-rates",
        type=float,
        nargs=2,
        metavar=("LOW", "HIGH"),
        help="Claude Code's two loads, jobs/s (default: half and all of the best "
        "plain>PEER's rate at SLO; give them where that search never crossed the SLO)",
    )
    ap.add_argument("--pressure-blocks", type=int, default=KV["pressure"])
    ap.add_argument("--tol", type=float, default=1.3)
    ap.add_argument("--max-tries", type=int, default=5)
    ap.add_argument("--max-wait", type=float, default=30.0)
    ap.add_argument("--fleet", type=int, default=1)
    ap.add_argument(
        "--max-context",
        type=int,
        default=MAX_CONTEXT,
        help="replay only the traces whose calls fit this many tokens (under KV pressure: "
        "below a replica's KV, or its longest calls are refused)",
    )
    ap.add_argument("--append", action="store_true", help="add to --out's configurations")
    add_run_args(ap, out="alternatives_kv_ample.json", seeds=2, workers="auto")
    ap.add_argument(
        "--show", action="store_true", help="print --out's tables (text and Markdown), run nothing"
    )


def main(args: argparse.Namespace) -> dict[str, Any]:
    if args.show:
        shown = json.loads(args.out.read_text())
        for kv, entry in shown["kv"].items():
            entry["summary"] = summary(entry)
            print(f"== KV {kv} ==\n{table(entry['summary'])}\n{markdown(entry['summary'])}")
        return dict(shown)
    peers = args.peer or default_peers()
    for p in peers:
        if p not in PEERS:
            sys.exit(f"unknown peer {p!r}; known: {', '.join(PEERS)}")
    clients = configurations(peers, args.tuned) + list(args.client or [])
    if args.only:
        clients = list(args.only)
    for c in clients:
        ClientSpec.parse(c)
    cc = {"claude-code": {"jobs": args.cc_jobs, "start": args.cc_start}}
    coding = {"coding": {"jobs": args.coding_jobs, "start": 0.0}}
    coding_rates = tuple(args.coding_rates)
    kvs = {"ample": None, "pressure": args.pressure_blocks}
    kvs = {k: v for k, v in kvs.items() if k in (args.kv or list(KV))}
    seeds = tuple(range(args.seeds))
    traces = TraceOptions(token_scale=1.0, max_wait_s=args.max_wait, max_context=args.max_context)
    if args.quick:
        cc = {"claude-code": {"jobs": 8, "start": 0.05}}
        coding = {"coding": {"jobs": 24, "start": 0.0}}
        kvs = {"ample": None}
        seeds = (0,)
    old: dict[str, Any] = (
        json.loads(args.out.read_text()) if args.append and args.out.exists() else {}
    )
    started = time.perf_counter()
    out: dict[str, Any] = old or {
        "setup": {
            "slo_workloads": cc,
            "load_workloads": {**cc, **coding},
            "coding_rates": coding_rates,
            "kv_gpu_blocks": kvs,
            "seeds": list(seeds),
            "replicas": 8,
            "preset": "h100-8b",
            "token_scale": 1.0,
            "max_wait_s": args.max_wait,
            "max_context": args.max_context,
            "slo_p90_stretch": 2.0,
            "tol": args.tol,
            "max_tries": args.max_tries,
            "fleet": args.fleet,
        },
        "kv": {},
    }
    out["command"] = run_record("")["command"]

    if args.cc_rates:
        out["setup"]["cc_rates"] = list(args.cc_rates)

    def save() -> None:
        out["wall_s"] = round(time.perf_counter() - started + old.get("wall_s", 0.0), 1)
        write_result(args.out, out, __doc__)

    for kv, blocks in kvs.items():
        entry = out["kv"].setdefault(
            kv, {"slo": {}, "loads": {}, "clients": [], "best": {}, "rates": {}}
        )
        # A run cut short left its finished searches: they count (a resumed run skips them).
        for wl, per_seed in entry.pop("partial_slo", {}).items():
            for seed, per_client in per_seed.items():
                entry["slo"].setdefault(wl, {}).setdefault(str(seed), {}).update(per_client)
        todo = [c for c in clients if c not in entry["clients"]]
        if not todo:
            continue
        searched = {
            c
            for c in todo
            if all(c in entry["slo"].get(wl, {}).get(str(s), {}) for wl in cc for s in seeds)
        }
        setup = Setup(
            workloads=cc,
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

        def checkpoint(runs: dict[str, Any], entry: dict[str, Any] = entry) -> None:
            entry["partial_slo"] = runs
            save()

        to_search = tuple(c for c in todo if c not in searched)
        slo = measure(replace(setup, clients=to_search), checkpoint=checkpoint) if to_search else {}
        entry.pop("partial_slo", None)
        for wl, per_seed in slo.items():
            for seed, per_client in per_seed.items():
                entry["slo"].setdefault(wl, {}).setdefault(str(seed), {}).update(per_client)
        entry["clients"] = list(dict.fromkeys([*entry["clients"], *todo]))
        # The loads are fixed when first measured, so configurations added later
        # (--append) are replayed at the same ones.
        rates = entry["rates"]
        for wl in cc:
            if wl not in rates:
                best, rate = best_plain_peer(entry["slo"], wl)
                entry["best"][wl] = best
                rates[wl] = tuple(args.cc_rates) if args.cc_rates else (0.5 * rate, rate)
        for wl in coding:
            rates.setdefault(wl, coding_rates)
        print(f"{kv}: JCT at two loads {rates}", file=sys.stderr, flush=True)
        load_setup = replace(setup, workloads={**cc, **coding})
        at = loads(load_setup, {k: tuple(v) for k, v in rates.items()}, todo, args.workers)
        for wl, per_label in at.items():
            for label, cells in per_label.items():
                entry["loads"].setdefault(wl, {}).setdefault(label, {}).update(cells)
        entry["summary"] = summary(entry)
        save()
        print(f"== KV {kv} ==")
        print(table(entry["summary"]), flush=True)
    return out
