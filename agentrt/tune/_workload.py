"""Journals into a bench workload: one :class:`~agentrt.bench._plan.JobPlan` per job.

Each job keeps its arrival (``arrival_s``, else its ``started_at`` relative to the first
job), its session tree (``session_reports``; without it every session but the first is a
sub-agent of the first), and per call its wait before it, its token counts and its prefix
sharing mapped onto prompt blocks of :data:`~agentrt.bench._plan.BLOCK_TOKENS` tokens:

- the leading ``prefix_common_tokens`` are blocks of the global ``shared`` namespace named
  by ``prefix_common_id`` (calls with the same id share them, across sessions and jobs);
- then the blocks the call shares with its session's previous call
  (``prefix_prev_tokens``; without fingerprints, the previous prompt and reply: an agent's
  conversation grows by appending);
- then new blocks, unique to the call.

A sub-agent's calls start after their parent's call that precedes them (a
:class:`~agentrt.bench._plan.Fanout`: the parent resumes when all of them are done).

Journals written by several runtimes (a service's K worker processes, one journal each
or all in one) are one workload: each job keeps the runtime that ran it (its
``runtime.runtime_id``; without one, one runtime per journal file), their arrivals are
put on one clock, and the fleet is as many processes as ran jobs at once
(:func:`fleet_members`).
"""

from __future__ import annotations

import os
import statistics
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from ..bench._plan import BLOCK_TOKENS, Call, Fanout, JobPlan, SessionPlan, Step
from ..telemetry._journal import scan_journal
from ..telemetry._report import CallReport, JobReport, SessionReport

__all__: list[str] = []

TUNED: tuple[str, ...] = ("routing", "policy", "concurrency", "send_priority", "learn_waits")
"""The ``Runtime`` keyword arguments tune varies."""


def runtime_defaults() -> dict[str, Any]:
    """``Runtime``'s defaults for :data:`TUNED`: what a journal without its runtime's
    settings is taken to have been recorded with."""
    import inspect

    from .._runtime import Runtime

    params = inspect.signature(Runtime.__init__).parameters
    return {name: params[name].default for name in TUNED}


class JournalError(ValueError):
    """A journal tune cannot use (one line: what is wrong and where)."""


@dataclass(frozen=True, slots=True)
class Observed:
    """What the journals say: the jobs, the settings they ran with, the cluster."""

    reports: list[JobReport]
    recorded: dict[str, Any]
    """The settings the jobs were recorded with (``Runtime`` keyword arguments)."""
    recorded_known: bool
    """False when the journals do not carry them (Runtime's defaults are assumed)."""
    replicas: int
    skipped_lines: int
    """Lines that were not valid job reports."""
    runtimes: tuple[str, ...] = ()
    """Per report, the runtime that ran it (:func:`runtime_key`)."""
    fleet: int = 1
    """The most runtimes that ran jobs at once (:func:`fleet_members`)."""


def load(paths: Sequence[str | os.PathLike[str]]) -> Observed:
    """Read and check the journals; :class:`JournalError` or FileNotFoundError when they
    cannot be used."""
    reports: list[JobReport] = []
    runtimes: list[str] = []
    skipped = 0
    for file, path in enumerate(paths):
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"journal {p} does not exist")
        if p.is_dir():
            raise JournalError(f"journal {p} is a directory; give the .jsonl file")
        scan = scan_journal(p)
        skipped += len(scan.invalid)
        problem = scan.no_report()
        if problem is not None:
            raise JournalError(problem)
        found = scan.reports
        reports.extend(found)
        runtimes.extend(runtime_key(r, file) for r in found)
    keep = [any(_usable(c) for c in r.call_reports) for r in reports]
    usable = [r for r, k in zip(reports, keep, strict=True) if k]
    runtimes = [key for key, k in zip(runtimes, keep, strict=True) if k]
    if not usable:
        raise JournalError(
            "the journals have no call with token counts to replay (were the calls' "
            "usages reported?)"
        )
    recorded, known = _recorded(usable)
    endpoints = {c.endpoint for r in usable for c in r.call_reports if c.endpoint}
    runtime_eps = [r.runtime.get("endpoints") for r in usable if r.runtime]
    replicas = max([len(endpoints), *[n for n in runtime_eps if isinstance(n, int)], 1])
    if not isinstance(recorded.get("endpoints"), int):
        # Not recorded (Runtime's defaults assumed, an older journal): as many as the
        # calls went to, which says whether poll_metrics_s="auto" polled.
        recorded["endpoints"] = replicas
    fleet = max(fleet_members(usable, runtimes)) + 1
    return Observed(usable, recorded, known, replicas, skipped, tuple(runtimes), fleet)


def runtime_key(report: JobReport, file: int) -> str:
    """The runtime that ran ``report``, read from the ``file``-th journal: its
    ``runtime_id``; without one (older journals, a bench's plain client), the file's."""
    rid = report.runtime.get("runtime_id") if report.runtime else None
    return f"id:{rid}" if isinstance(rid, str) and rid else f"file:{file}"


def fleet_members(reports: Sequence[JobReport], runtimes: Sequence[str]) -> list[int]:
    """Per report, the fleet member (from 0) whose process ran it, ``runtimes`` naming
    each report's runtime: runtimes whose spans (their first job's arrival to their last
    job's end) overlap are different members; one that starts after a member's last job
    ended is that member again (a process restarted, journals of two days). So the
    members are as many as the most runtimes that ran jobs at once."""
    arrivals = _arrivals(list(reports), runtimes)
    spans: dict[str, tuple[float, float]] = {}
    for report, t, key in zip(reports, arrivals, runtimes, strict=True):
        start, end = spans.get(key, (t, t))
        spans[key] = (min(start, t), max(end, t + max(0.0, report.jct_s)))
    ends: list[float] = []  # per member: when its latest runtime's last job ended
    member: dict[str, int] = {}
    for key, (start, end) in sorted(spans.items(), key=lambda kv: (kv[1], kv[0])):
        m = next((i for i, e in enumerate(ends) if e <= start), len(ends))
        if m == len(ends):
            ends.append(end)
        else:
            ends[m] = end
        member[key] = m
    return [member[key] for key in runtimes]


def _usable(call: CallReport) -> bool:
    return call.prompt_tokens is not None and call.latency_s is not None


_POLLED: Final = ("poll_metrics_s", "endpoints")
"""The runtime fields besides :data:`TUNED` that say whether the engines were polled."""


def _recorded(reports: list[JobReport]) -> tuple[dict[str, Any], bool]:
    """The settings most jobs ran with (their ``runtime``), else the bench client named
    in their metadata, else Runtime's defaults."""
    counts: dict[tuple[tuple[str, Any], ...], int] = {}
    for r in reports:
        settings = r.runtime or _from_client(r.metadata.get("client"))
        if settings:
            # poll_metrics_s: whether "engine" capped (it caps only when polled); with
            # "auto", the endpoints say whether it polled (several: polled). A plain
            # client has none of them: its marker is its setting.
            keys = ("plain",) if settings.get("plain") else (*TUNED, *_POLLED)
            key = tuple(sorted((k, settings.get(k)) for k in keys))
            counts[key] = counts.get(key, 0) + 1
    if not counts:
        return runtime_defaults(), False
    best = max(counts, key=lambda k: counts[k])
    return {**runtime_defaults(), **dict(best)}, True


def _from_client(client: object) -> dict[str, Any] | None:
    """A bench journal's client (``metadata.client``) as Runtime settings."""
    if not isinstance(client, str):
        return None
    from ..bench._drivers import ENGINE_POLL_S, ClientSpec

    try:
        spec = ClientSpec.parse(client)
    except ValueError:
        return None
    if spec.kind == "plain":
        return {"plain": True}
    return {
        "routing": spec.routing,
        "policy": spec.policy,
        "concurrency": spec.concurrency,
        "send_priority": spec.send_priority,
        "learn_waits": spec.declare == "learned",
        "poll_metrics_s": ENGINE_POLL_S if spec.concurrency == "engine" else None,
    }


def _arrivals(reports: list[JobReport], runtimes: Sequence[str] | None = None) -> list[float]:
    if all(r.arrival_s is not None for r in reports):
        raw = [float(r.arrival_s or 0.0) for r in reports]
        if runtimes is not None:
            raw = _one_clock(reports, raw, runtimes)
    else:
        raw = [r.started_at.timestamp() for r in reports]
    first = min(raw)
    return [t - first for t in raw]


def _one_clock(
    reports: list[JobReport], arrivals: list[float], runtimes: Sequence[str]
) -> list[float]:
    """``arrivals`` (each in seconds after its runtime opened) on one clock: each
    runtime's shifted by when it opened (its jobs' ``started_at`` less ``arrival_s``),
    where every runtime's jobs agree on that within 1 s or 1% of their span (runs in
    wall-clock time); else as they are (virtual time, where ``started_at`` is the wall
    clock's: a bench fleet's runtimes all open at 0)."""
    seen: dict[str, list[tuple[float, float]]] = {}
    for report, t, key in zip(reports, arrivals, runtimes, strict=True):
        seen.setdefault(key, []).append((t, report.started_at.timestamp() - t))
    if len(seen) < 2:
        return arrivals
    opened: dict[str, float] = {}
    for key, pairs in seen.items():
        times = [t for t, _ in pairs]
        offsets = [o for _, o in pairs]
        if max(offsets) - min(offsets) > max(1.0, 0.01 * (max(times) - min(times))):
            return arrivals
        opened[key] = statistics.median(offsets)
    return [t + opened[key] for t, key in zip(arrivals, runtimes, strict=True)]


def to_plans(reports: Sequence[JobReport], runtimes: Sequence[str] | None = None) -> list[JobPlan]:
    """One plan per job (with at least one replayable call), by arrival. With
    ``runtimes`` (per report, its runtime: :attr:`Observed.runtimes`), the runtimes'
    arrivals are put on one clock and each plan's ``worker`` is its runtime's fleet
    member (:func:`fleet_members`)."""
    out = []
    arrivals = _arrivals(list(reports), runtimes)
    workers: list[int | None] = [None] * len(reports)
    if runtimes is not None:
        workers = list(fleet_members(reports, runtimes))
    for i, (report, arrival) in enumerate(zip(reports, arrivals, strict=True)):
        root = job_plan_root(report, f"j{i}")
        if root is not None and root.calls():
            out.append(JobPlan(f"{report.name}-{i}", report.name, arrival, root, workers[i]))
    out.sort(key=lambda p: p.arrival_s)
    return out


def _shared_base(common_id: str) -> int:
    """The first block id of a common prefix in the ``shared`` namespace."""
    return (zlib.crc32(common_id.encode()) % 100_000) * 10_000


class _BlockIds:
    """The block ids a job's calls have not used yet: each call's new blocks get fresh ones."""

    def __init__(self) -> None:
        self.next_id = 0

    def fresh(self, n: int) -> tuple[int, ...]:
        start = self.next_id
        self.next_id += n
        return tuple(range(start, start + n))


def _call_step(
    call: CallReport,
    wait_s: float,
    tool: str | None,
    prev: tuple[CallReport, tuple[int, ...], int] | None,
    ids: _BlockIds,
    namespace: str,
) -> Call:
    prompt = max(1, call.prompt_tokens or 1)
    n = prompt // BLOCK_TOKENS
    common = min(n, (call.prefix_common_tokens or 0) // BLOCK_TOKENS)
    shared: tuple[int, ...] = ()
    if common and call.prefix_common_id:
        base = _shared_base(call.prefix_common_id)
        shared = tuple(range(base, base + common))
    else:
        common = 0
    keep = 0
    if prev is not None:
        prev_call, prev_blocks, _prev_common = prev
        if call.prefix_prev_tokens is not None:
            same = call.prefix_prev_tokens
        else:  # no fingerprints: the conversation grew by the previous prompt and reply
            same = (prev_call.prompt_tokens or 0) + (prev_call.completion_tokens or 0)
        keep = min(n, same // BLOCK_TOKENS, len(prev_blocks))
    if prev is not None and keep > 0:
        blocks = prev[1][:keep] + ids.fresh(n - keep)
        common = min(prev[2], keep)
    else:
        blocks = shared + ids.fresh(n - common)
    return Call(
        wait_s=max(0.0, wait_s),
        tool=tool,
        blocks=blocks,
        namespace=namespace,
        shared_blocks=common,
        tail_tokens=prompt - n * BLOCK_TOKENS,
        output_tokens=max(1, call.completion_tokens or 1),
        stream=call.stream,
    )


def job_plan_root(report: JobReport, namespace: str) -> SessionPlan | None:
    """The job's root session as a plan (None: no replayable call)."""
    calls = [c for c in report.call_reports if _usable(c)]
    if not calls:
        return None
    sessions: dict[str, SessionReport] = {s.session_id: s for s in report.session_reports}
    order: list[str] = []
    for c in sorted(calls, key=lambda c: c.start_s):
        if c.session_id not in order:
            order.append(c.session_id)
        if c.session_id not in sessions:
            sessions[c.session_id] = SessionReport(
                session_id=c.session_id, name=c.session_name, start_s=c.start_s
            )
    by_session: dict[str, list[CallReport]] = {}
    for c in calls:
        by_session.setdefault(c.session_id, []).append(c)
    for lst in by_session.values():
        lst.sort(key=lambda c: (c.turn, c.start_s))
    # The tree: a session's parent if it made calls, else its nearest ancestor that did;
    # without one (or without a tree) the first session's.
    root = order[0]
    parent_of: dict[str, str] = {}
    for sid in order[1:]:
        p = sessions[sid].parent_id
        seen = {sid}
        while p is not None and p not in by_session and p in sessions and p not in seen:
            seen.add(p)
            p = sessions[p].parent_id
        parent_of[sid] = p if p is not None and p in by_session and p != sid else root
    children: dict[str, list[str]] = {}
    for sid in order[1:]:
        children.setdefault(parent_of[sid], []).append(sid)
    tool_spans: dict[str, list[tuple[float, float, str]]] = {}
    for t in report.tool_reports:
        tool_spans.setdefault(t.session_id, []).append(
            (t.start_s, t.start_s + t.duration_s, t.name)
        )
    ids = _BlockIds()

    def end(c: CallReport) -> float:
        return c.start_s + (c.latency_s or 0.0)

    def last_end(sid: str) -> float:
        t = max(end(c) for c in by_session[sid])
        for kid in children.get(sid, []):
            t = max(t, last_end(kid))
        return t

    def build(sid: str, ready: float, guard: int = 0) -> SessionPlan:
        steps: list[Step] = []
        kids = sorted(children.get(sid, []), key=lambda k: by_session[k][0].start_s)
        prev: tuple[CallReport, tuple[int, ...], int] | None = None
        for c in by_session[sid]:
            # Sub-agents that started before this call: a fan-out the call waits for.
            group = [k for k in kids if by_session[k][0].start_s <= c.start_s]
            if group and guard < 64:
                kids = [k for k in kids if k not in group]
                steps.append(Fanout(tuple(build(k, ready, guard + 1) for k in group)))
                ready = max([ready, *(last_end(k) for k in group)])
            wait = c.start_s - ready
            tool = _tool_before(c, tool_spans.get(sid, ()), ready)
            step = _call_step(c, wait, tool, prev, ids, namespace)
            steps.append(step)
            prev = (c, step.blocks, step.shared_blocks)
            ready = end(c)
        if kids and guard < 64:  # sub-agents after the session's last call
            steps.append(Fanout(tuple(build(k, ready, guard + 1) for k in kids)))
        name = sessions[sid].name or ("main" if sid == root else "sub")
        return SessionPlan(name, tuple(steps))

    return build(root, 0.0)


def _tool_before(
    call: CallReport, spans: Sequence[tuple[float, float, str]], ready: float
) -> str | None:
    """The tool the session waited on before ``call``, if it did."""
    if call.idle_cause is not None and call.idle_cause != "tool":
        return None
    for start, stop, name in spans:
        if start >= ready - 1e-6 and stop <= call.start_s + 1e-6:
            return name
    return "tool" if call.idle_cause == "tool" else None


def scale_arrivals(plans: Sequence[JobPlan], load: float) -> list[JobPlan]:
    """The jobs arriving ``load`` times as fast (the same jobs, the gaps divided)."""
    return [replace(p, arrival_s=p.arrival_s / load) for p in plans]


def window(
    plans: Sequence[JobPlan],
    size: int,
    index: int,
    count: int,
    warmup: int = 0,
    cooldown_s: float = 0.0,
) -> tuple[list[JobPlan], set[str]]:
    """``size`` consecutive jobs (by arrival), the ``index``-th of ``count`` windows
    spread evenly over the workload, their arrivals from 0: a sample at the observed
    load and burstiness; after up to ``warmup`` jobs that precede it, replayed to load
    the cluster as the window found it, and before the jobs that arrive within
    ``cooldown_s`` of its last arrival, replayed so that the window's jobs compete with
    them as they did when recorded; neither counted. Returns the jobs to replay and the
    names of those counted."""
    if size >= len(plans):
        return list(plans), {p.name for p in plans}
    span = len(plans) - size
    start = 0 if count <= 1 else round(span * index / (count - 1))
    first = max(0, start - warmup)
    stop = start + size
    last = plans[stop - 1].arrival_s + cooldown_s
    while stop < len(plans) and plans[stop].arrival_s <= last:
        stop += 1
    part = plans[first:stop]
    t0 = part[0].arrival_s
    counted = {p.name for p in plans[start : start + size]}
    return [replace(p, arrival_s=p.arrival_s - t0) for p in part], counted
