"""What a bench run shows, in a few lines under its table: each client against the first
(by default the plain client), and, where no client differs, which settings would."""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Final

from ..report._tables import wrap, wrap_title
from ._runner import BenchResult, ClientResult

__all__ = ["SAME_WITHIN", "all_failed", "failures", "takeaway", "why_all_failed"]

SAME_WITHIN: Final = 0.05
"""Clients whose JCT mean and p90 are within this share of the first's count as the same."""


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _line(c: ClientResult, base: ClientResult) -> str:
    parts = [
        f"JCT mean {_x(_ratio(c.jct.get('mean'), base.jct.get('mean')))}",
        f"p90 {_x(_ratio(c.jct.get('p90'), base.jct.get('p90')))}",
    ]
    if c.ttft and base.ttft:
        parts.append(f"TTFT p50 {_x(_ratio(c.ttft.get('p50'), base.ttft.get('p50')))}")
    if c.prefix_cache_hit_rate is not None and base.prefix_cache_hit_rate is not None:
        parts.append(f"cache hit {c.prefix_cache_hit_rate:.0%} vs {base.prefix_cache_hit_rate:.0%}")
    return f"{c.client}: " + ", ".join(parts)


def _same(c: ClientResult, base: ClientResult) -> bool:
    for key in ("mean", "p90"):
        r = _ratio(c.jct.get(key), base.jct.get(key))
        if r is None or abs(r - 1.0) > SAME_WITHIN:
            return False
    return True


REASON_CHARS: Final = 200
"""A failure's reason is cut to this many characters in :func:`failures`."""


def all_failed(result: BenchResult) -> bool:
    """Whether no job of any client completed."""
    return not any(c.jobs > c.failed for c in result.clients)


def _reason(result: BenchResult) -> tuple[str, int]:
    """The most frequent reason jobs failed (reasons that differ only in their numbers
    count as one: the first seen is shown), and how many jobs it ended."""
    counts: Counter[str] = Counter()
    first: dict[str, str] = {}
    for c in result.clients:
        for row in c.job_rows:
            if row.get("status") == "ok":
                continue
            text = " ".join(str(row.get("error") or row.get("status") or "unknown").split())
            key = re.sub(r"\d+", "#", text)
            counts[key] += 1
            first.setdefault(key, text)
    if not counts:
        return "unknown", 0
    key, count = counts.most_common(1)[0]
    text = first[key]
    if len(text) > REASON_CHARS:
        text = text[: REASON_CHARS - 3] + "..."
    return text, count


def failures(result: BenchResult) -> str | None:
    """One line for a run in which jobs failed: how many of each client's, and the most
    frequent reason; None when every job completed."""
    failed = [c for c in result.clients if c.failed]
    if not failed:
        return None
    counts = ", ".join(f"{c.client} {c.failed} of {c.jobs}" for c in failed)
    reason, count = _reason(result)
    total = sum(c.failed for c in failed)
    why = "why" if count == total else f"the most frequent reason ({count} jobs)"
    return f"jobs failed: {counts}; {why}: {reason}"


def why_all_failed(result: BenchResult) -> str:
    """The reason of a run in which every job failed (see :func:`all_failed`)."""
    jobs = sum(c.jobs for c in result.clients)
    reason, count = _reason(result)
    clients = f"{len(result.clients)} client" + ("" if len(result.clients) == 1 else "s")
    why = "" if count == jobs else f"; the most frequent reason ({count} jobs)"
    return f"every job failed ({jobs} jobs of {clients}){why}: {reason}"


def takeaway(result: BenchResult, width: int = 80) -> list[str]:
    """Lines that say what the run shows, for the clients with a job done (empty with
    fewer than two)."""
    done = [c for c in result.clients if c.jobs > c.failed]
    if len(done) < 2 or done[0] is not result.clients[0]:
        return []
    base, others = done[0], done[1:]
    lines = [f"Against {base.client} (below 1.00x: lower, faster):"]
    for c in others:  # wrapped between phrases: "cache hit 84% vs 84%" stays whole
        first, *rest = wrap_title(_line(c, base), width - 4)
        lines += ["  " + first, *("    " + line for line in rest)]
    same = [c.client for c in others if _same(c, base)]
    differ = [c for c in others if not _same(c, base)]
    if differ:
        best = min(differ, key=lambda c: c.jct.get("mean", math.inf))
        text = f"{best.client} changes JCT the most here."
        if same:
            text += (
                f" {', '.join(same)} {'is' if len(same) == 1 else 'are'} within "
                f"{SAME_WITHIN:.0%} of {base.client}, so the difference is in what "
                f"{best.client} does that {'it does' if len(same) == 1 else 'they do'} not."
            )
    else:
        text = (
            f"No client is more than {SAME_WITHIN:.0%} from {base.client} on this workload: "
            "it leaves little for agentrt to change. What shows it: --workload coding (the "
            "default: long shared prompts and growing contexts, where session routing keeps "
            "each session's cache) or claude-code; load (--rate, --users, fewer --replicas) "
            "for the ordering policies (agentrt:plas, agentrt:mlfq)."
        )
    lines += wrap(text, width)
    return lines
