"""Numbers per job name: JCT beside call latency, where the time went, cache and retries.

Where a job's time went is a partition of its JCT, read off its calls and tool waits:

- **LLM**: at least one call is being served (sent, not queued): the LLM time on the
  job's critical path.
- **queue**: no call is being served, but at least one waits in agentrt's admission queue.
- **held**: none of those, but at least one call is held by load control at its session's
  tool boundary (its replica's KV full of other live sessions' contexts).
- **tool**: none of those, and at least one tool wait is open.
- **other**: the rest: the job's own code, think time, anything not marked as a tool.

The five add up to the JCT (held is 0 for jobs that load control never held). A name's
shares are of its jobs' summed JCT (the shares of the mean JCT).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .._stats import quantile
from ..telemetry import JobReport
from ..telemetry._report import union_length
from ._timeline import activities

__all__ = [
    "Breakdown",
    "ComparisonRow",
    "NameSummary",
    "breakdown",
    "compare",
    "summarize",
]


@dataclass(frozen=True)
class Breakdown:
    """A job's JCT split into LLM, queue, held, tool and other seconds (they add up to
    it)."""

    llm_s: float
    queue_s: float
    tool_s: float
    other_s: float
    held_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.llm_s + self.queue_s + self.held_s + self.tool_s + self.other_s


def breakdown(report: JobReport) -> Breakdown:
    """Where one job's time went (see the module's doc)."""
    jct = max(report.jct_s, 0.0)

    def clip(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
        out = []
        for a, b in spans:
            a, b = max(a, 0.0), min(b, jct)
            if b > a:
                out.append((a, b))
        return out

    acts = activities(report)
    made = [a for a in acts if a.kind == "call"]
    # a call is held first (load control), then queued (admission), then served
    routed = [a.start_s + a.held_s for a in made]
    served = clip((t + a.queue_s, a.end_s) for t, a in zip(routed, made, strict=True))
    queued = clip((t, t + a.queue_s) for t, a in zip(routed, made, strict=True))
    held = clip((a.start_s, t) for t, a in zip(routed, made, strict=True))
    tools = clip((a.start_s, a.end_s) for a in acts if a.kind == "tool")
    llm = union_length(served)
    admitted = union_length(served + queued)
    calls = union_length(served + queued + held) if held else admitted
    busy = union_length(served + queued + held + tools)
    return Breakdown(
        llm_s=llm,
        queue_s=admitted - llm,
        tool_s=busy - calls,
        other_s=max(jct - busy, 0.0),
        held_s=calls - admitted,
    )


@dataclass(frozen=True)
class NameSummary:
    """The jobs of one name in one run. Times are seconds; shares are 0..1 (NaN or None
    when there is nothing to divide by)."""

    name: str
    jobs: int
    errors: int
    """Jobs that did not end ``ok`` (error, cancelled or past their deadline)."""
    jct_mean: float
    jct_p50: float
    jct_p90: float
    jct_p99: float
    calls: int
    call_p50: float
    call_p99: float
    """Per-call latency (queue time and retries included), over all the name's calls."""
    queue_share: float
    llm_share: float
    tool_share: float
    other_share: float
    cache_share: float | None
    """Cached prompt tokens over prompt tokens (None when no call reported usage)."""
    retries: int
    session_moves: int
    ttft_p50: float = math.nan
    ttft_p90: float = math.nan
    ttft_p99: float = math.nan
    """Time to first token of the name's streamed calls (NaN when none streamed)."""
    cache_write_share: float | None = None
    """Prompt tokens written to the servers' prompt caches over prompt tokens (None when
    no call's server reported any: ``usage.prompt_tokens_details.cache_write_tokens``)."""
    reasoning_share: float | None = None
    """Reasoning tokens over completion tokens (None when no call's server reported any:
    ``usage.completion_tokens_details.reasoning_tokens``)."""
    held_share: float = 0.0
    """Share of JCT with calls only held by load control (beside ``queue_share`` and the
    others; 0.0 when no job of the name was held)."""
    hold_max: float = 0.0
    """The longest time one call was held by load control (seconds; 0.0: none was)."""


def _summary(name: str, reports: Sequence[JobReport]) -> NameSummary:
    jcts = sorted(r.jct_s for r in reports)
    latencies = sorted(
        c.latency_s for r in reports for c in r.call_reports if c.latency_s is not None
    )
    ttfts = sorted(c.ttft_s for r in reports for c in r.call_reports if c.ttft_s is not None)
    parts = [breakdown(r) for r in reports]
    total = sum(p.total_s for p in parts)

    def share(seconds: float) -> float:
        return seconds / total if total > 0 else math.nan

    prompt = sum(r.prompt_tokens for r in reports)
    completion = sum(r.completion_tokens for r in reports)
    written = sum(r.cache_write_tokens for r in reports)
    reasoning = sum(r.reasoning_tokens for r in reports)
    return NameSummary(
        name=name,
        jobs=len(reports),
        errors=sum(r.status != "ok" for r in reports),
        jct_mean=statistics.fmean(jcts) if jcts else math.nan,
        jct_p50=quantile(jcts, 0.5),
        jct_p90=quantile(jcts, 0.9),
        jct_p99=quantile(jcts, 0.99),
        calls=sum(r.calls for r in reports),
        call_p50=quantile(latencies, 0.5),
        call_p99=quantile(latencies, 0.99),
        queue_share=share(sum(p.queue_s for p in parts)),
        llm_share=share(sum(p.llm_s for p in parts)),
        tool_share=share(sum(p.tool_s for p in parts)),
        other_share=share(sum(p.other_s for p in parts)),
        cache_share=sum(r.cached_tokens for r in reports) / prompt if prompt else None,
        retries=sum(r.retries for r in reports),
        session_moves=sum(r.session_moves for r in reports),
        ttft_p50=quantile(ttfts, 0.5),
        ttft_p90=quantile(ttfts, 0.9),
        ttft_p99=quantile(ttfts, 0.99),
        cache_write_share=written / prompt if written and prompt else None,
        reasoning_share=reasoning / completion if reasoning and completion else None,
        held_share=share(sum(p.held_s for p in parts)),
        hold_max=max((c.held_s for r in reports for c in r.call_reports), default=0.0),
    )


def summarize(reports: Iterable[JobReport]) -> list[NameSummary]:
    """One summary per job name, in order of first appearance."""
    by_name: dict[str, list[JobReport]] = {}
    for r in reports:
        by_name.setdefault(r.name, []).append(r)
    return [_summary(name, rs) for name, rs in by_name.items()]


@dataclass(frozen=True)
class ComparisonRow:
    """One metric of one job name in two runs, and B over A."""

    name: str
    metric: str
    a: float | None
    b: float | None
    kind: str
    """How to show the values: ``s`` (seconds), ``share``, ``count``."""

    @property
    def ratio(self) -> float | None:
        """B / A, or None when either is missing or A is zero."""
        if self.a is None or self.b is None or math.isnan(self.a) or math.isnan(self.b):
            return None
        if self.a == 0:
            return None
        return self.b / self.a


COMPARED: tuple[tuple[str, str, str], ...] = (
    ("jobs", "jobs", "count"),
    ("JCT p50", "jct_p50", "s"),
    ("JCT p90", "jct_p90", "s"),
    ("JCT p99", "jct_p99", "s"),
    ("TTFT p50", "ttft_p50", "s"),
    ("TTFT p90", "ttft_p90", "s"),
    ("TTFT p99", "ttft_p99", "s"),
    ("call p50", "call_p50", "s"),
    ("call p99", "call_p99", "s"),
    ("held share", "held_share", "share"),
    ("hold max", "hold_max", "s"),
    ("queue share", "queue_share", "share"),
    ("LLM share", "llm_share", "share"),
    ("tool share", "tool_share", "share"),
    ("cache share", "cache_share", "share"),
    ("retries", "retries", "count"),
    ("session moves", "session_moves", "count"),
    ("errors", "errors", "count"),
)
"""The metrics a comparison shows: label, :class:`NameSummary` field, kind. The held
ones (:data:`HELD_METRICS`) only where load control held a job of either run."""

HELD_METRICS = frozenset({"held_share", "hold_max"})
"""The fields of :data:`COMPARED` shown only when some job was held."""


def held_any(reports: Iterable[JobReport]) -> bool:
    """Whether load control held any call of these jobs (a journal written without it,
    or before it, shows no held time anywhere)."""
    return any(r.held_s > 0 for r in reports)


def compare(a: Iterable[JobReport], b: Iterable[JobReport]) -> list[ComparisonRow]:
    """Run B beside run A, per job name (A's names first, then names only B has)."""
    a, b = list(a), list(b)
    sa = {s.name: s for s in summarize(a)}
    sb = {s.name: s for s in summarize(b)}
    held = held_any(a) or held_any(b)
    metrics = [m for m in COMPARED if held or m[1] not in HELD_METRICS]
    rows = []
    for name in [*sa, *(n for n in sb if n not in sa)]:
        for label, field, kind in metrics:
            va = getattr(sa[name], field) if name in sa else None
            vb = getattr(sb[name], field) if name in sb else None
            rows.append(
                ComparisonRow(
                    name=name,
                    metric=label,
                    a=None if va is None else float(va),
                    b=None if vb is None else float(vb),
                    kind=kind,
                )
            )
    return rows
