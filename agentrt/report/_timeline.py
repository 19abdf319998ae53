"""One job on a timeline: its calls and tool waits, and the critical path through them.

The critical path is traced backwards from the job's end: the activity (a call, its time
held by load control and its queue time included, or a tool wait) that ended last, no
later than the current point, is on the path; the point moves to its start, and the walk
repeats until no activity ends before the point. The result is a chain of non-overlapping
activities, in time order, that ends at the job's last activity: shorten any of them and
the job ends sooner (unless a parallel activity of nearly the same length takes its
place). The gaps between them are the job's own code: prompt building, parsing, think
time.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Literal

from ..telemetry import JobReport

__all__ = ["Activity", "Phase", "activities", "critical_path", "phases"]

_EPS = 1e-9


@dataclass(frozen=True)
class Activity:
    """A call or a tool wait of one job. Times are seconds from the job's start."""

    kind: Literal["call", "tool"]
    session_id: str
    session: str
    """The session's name, or its id when it has none."""
    label: str
    """``turn N`` for a call, the tool's name for a tool wait."""
    start_s: float
    end_s: float
    queue_s: float = 0.0
    """A call's time in agentrt's admission queue (after its time held)."""
    status: str = "ok"
    held_s: float = 0.0
    """A call's time held by load control at its session's tool boundary (the first part
    of it, before it was queued)."""


def activities(report: JobReport) -> list[Activity]:
    """The job's calls and tool waits, by start time. A call still in flight when the job
    ended (no latency recorded) lasts to the job's end."""
    names = {c.session_id: c.session_name for c in report.call_reports}
    out = []
    for c in report.call_reports:
        end = c.start_s + c.latency_s if c.latency_s is not None else report.jct_s
        length = max(end - c.start_s, 0.0)
        held = min(c.held_s, length)
        out.append(
            Activity(
                kind="call",
                session_id=c.session_id,
                session=c.session_name or c.session_id,
                label=f"turn {c.turn}",
                start_s=c.start_s,
                end_s=max(end, c.start_s),
                queue_s=min(c.queue_s, length - held),
                status=c.status,
                held_s=held,
            )
        )
    for t in report.tool_reports:
        out.append(
            Activity(
                kind="tool",
                session_id=t.session_id,
                session=names.get(t.session_id) or t.session_id,
                label=t.name,
                start_s=t.start_s,
                end_s=t.start_s + max(t.duration_s, 0.0),
                status=t.status,
            )
        )
    out.sort(key=lambda a: (a.start_s, a.end_s))
    return out


def critical_path(report: JobReport) -> list[Activity]:
    """The chain of activities that ends the job, in time order (see the module's doc)."""
    acts = activities(report)
    point = max([report.jct_s, *(a.end_s for a in acts)])
    path: list[Activity] = []
    while True:
        candidates = [a for a in acts if a.end_s <= point + _EPS and a.start_s < point - _EPS]
        if not candidates:
            break
        last = max(candidates, key=lambda a: (a.end_s, -a.start_s))
        path.append(last)
        point = last.start_s
    path.reverse()
    return path


PhaseKind = Literal["llm", "queued", "held", "tool", "other"]


@dataclass(frozen=True)
class Phase:
    """A stretch of a job's time spent one way. Seconds from the job's start."""

    kind: PhaseKind
    """``llm``: a call of the job was being served; else ``queued``: one waited in
    agentrt's admission queue; else ``held``: one was held by load control at its
    session's tool boundary; else ``tool``: a tool wait ran; else ``other`` (the agent's
    own code, think time)."""
    start_s: float
    end_s: float


_RANK: dict[PhaseKind, int] = {"llm": 0, "queued": 1, "held": 2, "tool": 3, "other": 4}


def phases(report: JobReport) -> list[Phase]:
    """The job's time from 0 to its JCT as consecutive phases (see :class:`Phase`; where
    several overlap, the first kind of that list wins, as in
    :func:`~agentrt.report.breakdown`, so their lengths add up to its figures)."""
    jct = max(report.jct_s, 0.0)
    spans: list[tuple[float, float, PhaseKind]] = []
    for a in activities(report):
        if a.kind == "call":
            held, queued = a.start_s + a.held_s, a.start_s + a.held_s + a.queue_s
            spans.append((a.start_s, held, "held"))
            spans.append((held, queued, "queued"))
            spans.append((queued, a.end_s, "llm"))
        else:
            spans.append((a.start_s, a.end_s, "tool"))
    clipped = [(max(a, 0.0), min(b, jct), k) for a, b, k in spans if min(b, jct) > max(a, 0.0)]
    cuts = sorted({0.0, jct, *(a for a, _, _ in clipped), *(b for _, b, _ in clipped)})
    out: list[Phase] = []
    for lo, hi in itertools.pairwise(cuts):
        if hi - lo <= _EPS:
            continue
        kinds = [k for a, b, k in clipped if a <= lo + _EPS and b >= hi - _EPS]
        kind: PhaseKind = min(kinds, key=_RANK.__getitem__) if kinds else "other"
        if out and out[-1].kind == kind and abs(out[-1].end_s - lo) <= _EPS:
            out[-1] = Phase(kind, out[-1].start_s, hi)
        else:
            out.append(Phase(kind, lo, hi))
    return out
