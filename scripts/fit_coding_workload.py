"""Fit the ``coding`` workload's generator to the Claude Code traces: a maintainer's tool,
for when the traces or the generator change (not a benchmark: it measures nothing).

Reads every ``trace_*.json.gz`` in the traces folder (default: ``$AGENTRT_TRACES`` or
``../shared/traces/claude-code``) and prints the statistics that
``agentrt/bench/_coding.py`` draws from, as the Python literal its ``FIT`` holds:

- the shared prefix (tool definitions + system prompt) of the main agent and of sub-agents;
- each session's first prompt beyond that prefix, its growth from one call to the next,
  and how often a call rewrites the context (compaction: under 90% of the previous prompt
  kept as its prefix) with the new size over the old;
- calls per session, output tokens, the share of streamed calls;
- the waits before a call: a tool wait after a reply that called a tool, else think time
  (a person reading and typing), and the share of tool waits;
- sub-agents: the share of sessions that spawn any, spawns per such session, sub-agents
  per spawn (they run concurrently), and their own calls, prompts, growth, outputs, waits.

Each distribution is kept as its quantiles at ``QS``; the generator draws from them by
inverse transform (log-linear between the points, clamped to the 1st and 99th
percentiles).

    python scripts/fit_coding_workload.py            # prints the fit
    python scripts/fit_coding_workload.py --check    # the shipped FIT agrees
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrt.bench import TraceOptions, quantile
from agentrt.bench._coding import FIT, QS, CodingFit, Quantiles


def quantiles(values: Sequence[float]) -> Quantiles:
    """The values' quantiles at ``QS`` (nearest rank), rounded to 3 significant digits."""
    s = sorted(values)
    return Quantiles(tuple(float(f"{float(quantile(s, q)):.3g}") for q in QS))


def _prefix(k: int, a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    while k < n and a[k] == b[k]:
        k += 1
    return k


class _Acc:
    def __init__(self) -> None:
        self.first: list[float] = []
        self.growth: list[float] = []
        self.rewrite_ratio: list[float] = []
        self.turns_total = 0
        self.rewrites = 0
        self.calls: list[float] = []
        self.out: list[float] = []
        self.tool_wait: list[float] = []
        self.think: list[float] = []
        self.streamed = 0
        self.prefix: list[float] = []

    def session(self, calls: Sequence[dict[str, Any]], prefix_tokens: int) -> None:
        if not calls:
            return
        self.calls.append(len(calls))
        self.prefix.append(prefix_tokens)
        self.first.append(max(0, int(calls[0]["in"]) - prefix_tokens))
        prev: dict[str, Any] | None = None
        for call in calls:
            self.out.append(max(1, int(call.get("out") or 1)))
            self.streamed += call.get("type") == "s"
            if prev is not None:
                wait = float(call.get("think_time") or 0.0)
                if prev.get("stop") == "tool_use":
                    self.tool_wait.append(wait)
                else:
                    self.think.append(wait)
                a, b = prev.get("hash_ids") or [], call.get("hash_ids") or []
                kept = _prefix(0, a, b) / len(a) if a else 1.0
                self.turns_total += 1
                if kept < 0.9:
                    self.rewrites += 1
                    self.rewrite_ratio.append(int(call["in"]) / max(1, int(prev["in"])))
                elif int(call["in"]) >= int(prev["in"]):
                    self.growth.append(int(call["in"]) - int(prev["in"]))
            prev = call


def fit(directory: Path) -> CodingFit:
    files = sorted(directory.glob("trace_*.json.gz"))
    if not files:
        raise SystemExit(f"no trace_*.json.gz in {directory}; set AGENTRT_TRACES")
    main, sub = _Acc(), _Acc()
    spawns: list[float] = []
    siblings: list[float] = []
    for path in files:
        with gzip.open(path, "rt") as f:
            data = json.load(f)
        prefix = int(data.get("tool_tokens") or 0) + int(data.get("system_tokens") or 0)
        calls: list[dict[str, Any]] = []
        group = 0
        n_spawns = 0
        for req in data.get("requests") or []:
            if req.get("type") == "subagent":
                group += 1
                sub_calls = [r for r in req.get("requests") or [] if r.get("type") != "subagent"]
                sub_prefix = int(req.get("tool_tokens") or 0) + int(req.get("system_tokens") or 0)
                sub.session(sub_calls, sub_prefix)
                continue
            if group:
                siblings.append(group)
                n_spawns += 1
                group = 0
            calls.append(req)
        if group:
            siblings.append(group)
            n_spawns += 1
        if n_spawns:
            spawns.append(n_spawns)
        main.session(calls, prefix)
    all_waits = len(main.tool_wait) + len(main.think)
    return CodingFit(
        sessions=len(files),
        prefix_tokens=round(quantiles(main.prefix).median),
        first_tokens=quantiles(main.first),
        growth_tokens=quantiles(main.growth),
        rewrite_share=round(main.rewrites / max(1, main.turns_total), 4),
        rewrite_ratio=quantiles(main.rewrite_ratio),
        calls=quantiles(main.calls),
        output_tokens=quantiles(main.out),
        stream_share=round(main.streamed / max(1, len(main.out)), 3),
        tool_share=round(len(main.tool_wait) / max(1, all_waits), 3),
        tool_wait_s=quantiles(main.tool_wait),
        think_s=quantiles(main.think),
        subagent_share=round(len(spawns) / len(files), 4),
        spawns=quantiles(spawns),
        siblings=quantiles(siblings),
        sub_prefix_tokens=round(quantiles(sub.prefix).median),
        sub_first_tokens=quantiles(sub.first),
        sub_growth_tokens=quantiles(sub.growth),
        sub_calls=quantiles(sub.calls),
        sub_output_tokens=quantiles(sub.out),
        sub_wait_s=quantiles(sub.tool_wait + sub.think),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python scripts/fit_coding_workload.py",
        description="Fit the coding workload's generator to the Claude Code traces and "
        "print it as agentrt/bench/_coding.py's FIT.",
    )
    parser.add_argument("--traces", type=Path, default=None, help="the traces folder")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 unless the shipped FIT equals this fit"
    )
    args = parser.parse_args(argv)
    fitted = fit(TraceOptions(directory=args.traces).folder())
    print(f"# {fitted.sessions} sessions; quantiles at {QS}")
    print(fitted.literal())
    if args.check:
        if fitted != FIT:
            print("the shipped FIT differs from this fit", file=sys.stderr)
            return 1
        print("the shipped FIT matches", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
