"""Per-job reports: completion time beside per-call latency."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .._config import redact_userinfo
from .._protocol import trusted_model
from ._prefix import tokens as prefix_tokens

__all__ = [
    "CallReport",
    "CallStatus",
    "IdleCause",
    "JobReport",
    "JobStatus",
    "SessionReport",
    "ToolReport",
]

JobStatus = Literal["ok", "error", "cancelled", "deadline"]
"""How a job ended: ``ok``, ``error`` (its block raised), ``cancelled``, or ``deadline``
(its deadline passed first)."""
CallStatus = Literal["ok", "error", "cancelled"]
"""How a call (or a tool wait) ended: ``ok``, ``error`` or ``cancelled``."""
IdleCause = Literal["tool", "subagents", "think"]
"""Why a session was idle before a call: a ``tool`` wait ran in the session, its
sub-agents (sessions whose parent it is) made calls (``subagents``), or neither
(``think``: the agent's own code, a person)."""


class CallReport(BaseModel):
    """One LLM call (all its attempts), as the job saw it. Times are seconds."""

    model_config = ConfigDict(extra="forbid")

    call_id: str
    session_id: str
    session_name: str | None = None
    turn: int
    endpoint: str | None = None
    """Base URL of the endpoint that served the last attempt."""
    path: str
    model: str | None = None
    stream: bool = False
    start_s: float
    """When the call entered agentrt, relative to the job's start."""
    held_s: float = 0.0
    """Time load control held the call at its session's tool boundary (the replica's
    KV was full of other live sessions' contexts), before it was routed and queued."""
    queue_s: float = 0.0
    """Time spent in agentrt's admission queue before the first attempt was sent."""
    ttft_s: float | None = None
    """Time to the first streamed chunk (streaming calls only)."""
    latency_s: float | None = None
    """From entering agentrt to the end of the reply, time held, queue time and retries
    included."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    """Prompt tokens served from the server's prefix cache, when it reports them."""
    cache_write_tokens: int | None = None
    """Prompt tokens the server wrote to its prompt cache for this call, when it reports
    them (``usage.prompt_tokens_details.cache_write_tokens``)."""
    reasoning_tokens: int | None = None
    """Output tokens spent reasoning (part of ``completion_tokens``), when the server
    reports them (``usage.completion_tokens_details.reasoning_tokens``)."""
    attempts: int = 0
    http_status: int | None = None
    status: CallStatus = "ok"
    error: str | None = None
    priority: int | None = None
    """The queue level sent to the engine (only when priorities are sent)."""
    moved: bool = False
    """The session's previous turn was served by another replica: its KV cache there was
    not reused (a move by the router's overload guard or a health failover)."""
    idle_s: float | None = None
    """Seconds the session was idle before this call: from its previous call's reply to
    this call (None for a session's first call)."""
    idle_cause: IdleCause | None = None
    """Why it was idle (None with no idle): ``tool`` is known when the call starts;
    ``subagents`` and ``think`` are told apart when the job's report is built."""
    prefix_prev_tokens: int | None = None
    """Leading prompt tokens this call shares with the session's previous call, estimated
    from the request bodies' hashed 1 KiB blocks (docs/telemetry.md, "Journal fields for
    a replay"); None without a journal or usage."""
    prefix_common_tokens: int | None = None
    """Leading prompt tokens shared with a call of another session seen earlier by the
    runtime (a system prompt, tool definitions), estimated as ``prefix_prev_tokens``."""
    prefix_common_id: str | None = None
    """A fingerprint of that common prefix (8 hex digits): calls with the same id start
    with the same bytes. Never the text."""


class ToolReport(BaseModel):
    """One tool wait: an idle gap in a session."""

    model_config = ConfigDict(extra="forbid")

    session_id: str
    name: str
    start_s: float
    duration_s: float
    expected_s: float | None = None
    """The wait's expected duration: the caller's ``expected_s``, else the runtime's
    learned estimate for the tool (see ``expected_source``)."""
    expected_source: Literal["declared", "learned"] | None = None
    """Where ``expected_s`` came from; None when there was no expectation."""
    error_s: float | None = None
    """Prediction error, ``duration_s - expected_s`` (positive: the wait ran longer than
    expected); None without an expectation."""
    status: Literal["ok", "error", "cancelled"] = "ok"


class SessionReport(BaseModel):
    """One session of a job: the session tree a replay needs."""

    model_config = ConfigDict(extra="forbid")

    session_id: str
    name: str | None = None
    parent_id: str | None = None
    """The session that spawned this one (a sub-agent's parent), if any."""
    start_s: float
    """When it opened, relative to the job's start."""


class JobReport(BaseModel):
    """What one job did and how long it took. ``jct_s`` is what the user waited."""

    model_config = ConfigDict(extra="forbid")

    job_id: str
    name: str
    program_id: str
    status: JobStatus
    error: str | None = None
    started_at: datetime
    jct_s: float
    """Job completion time: from entering ``rt.job(...)`` to leaving it."""
    llm_s: float
    """Sum of the calls' latencies (concurrent calls each count)."""
    critical_llm_s: float
    """Time during which at least one of the job's calls was being served (sent, not
    waiting in agentrt's admission queue): the LLM time on the job's critical path, as
    ``agentrt report``'s LLM share counts it. Never more than ``jct_s``."""
    queue_s: float
    tool_s: float
    """Sum of the tool waits' durations."""
    held_s: float = 0.0
    """Sum of the calls' time held by load control at their sessions' tool boundaries
    (``CallReport.held_s``)."""
    calls: int
    tool_waits: int
    sessions: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    retries: int
    """Attempts beyond the first, over all calls."""
    session_moves: int = 0
    """Calls whose session moved to another replica (its cached prefix lost there)."""
    cache_write_tokens: int = 0
    """Prompt tokens written to the servers' prompt caches, over the calls that said."""
    reasoning_tokens: int = 0
    """Output tokens spent reasoning, over the calls whose servers said."""
    deadline_s: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    call_reports: list[CallReport] = Field(default_factory=list)
    tool_reports: list[ToolReport] = Field(default_factory=list)
    arrival_s: float | None = None
    """When the job started, in seconds after its runtime opened (``started_at`` is the
    wall-clock time); None in reports not made by a runtime."""
    session_reports: list[SessionReport] = Field(default_factory=list)
    """The job's sessions in the order they opened, with their parents."""
    runtime: dict[str, Any] | None = None
    """The settings of the runtime that ran the job, as ``Runtime`` keyword arguments
    (``routing``, ``policy``, ``concurrency``, ``token_budget``, ``send_priority``,
    ``learn_waits``) plus ``endpoints`` (how many): what ``agentrt tune`` compares
    against; with several endpoints under session routing, also what placement assumed
    of each one's KV when the job ended (``kv_capacity`` in tokens, None unknown, and
    ``kv_capacity_source``: ``engine``, ``setting`` or ``learned``)."""

    @property
    def cache_hit_rate(self) -> float | None:
        """Share of prompt tokens served from cache, over calls that reported usage."""
        if not self.prompt_tokens:
            return None
        return self.cached_tokens / self.prompt_tokens

    def __str__(self) -> str:
        """A short summary, a few lines of at most 80 columns (``print(job.report)``);
        ``repr`` and ``model_dump()`` give every field."""
        head = f"job {self.name} ({self.job_id}): {self.status}"
        if self.deadline_s is not None:
            head += f", deadline {self.deadline_s:g} s"
        jct, llm, tools, queued, held = _durations(
            self.jct_s, self.critical_llm_s, self.tool_s, self.queue_s, self.held_s
        )
        split = f"LLM {llm}, tools {tools}, queued {queued}"
        if self.held_s:
            split += f", held {held}"
        calls = f"{self.calls} in {_count(self.sessions, 'session')}"
        extra = [
            _count(n, what)
            for n, what in ((self.retries, "retry"), (self.session_moves, "session move"))
            if n
        ]
        if extra:
            calls += f" ({', '.join(extra)})"
        calls += f", {_count(self.tool_waits, 'tool wait')}"
        hit = self.cache_hit_rate
        cached = (
            f"cache hit {hit:.0%} ({self.cached_tokens:,} cached)"
            if hit is not None
            else "cache hit n/a"
        )
        lines = [
            head,
            f"  JCT     {jct}: {split}",
            f"  calls   {calls}",
            f"  tokens  {self.prompt_tokens:,} prompt, {self.completion_tokens:,} completion; "
            + cached,
        ]
        said = [
            f"{n:,} {what}"
            for n, what in (
                (self.reasoning_tokens, "reasoning"),
                (self.cache_write_tokens, "written to cache"),
            )
            if n
        ]
        if said:
            lines.append(f"          of which {', '.join(said)}")
        if self.error:
            error = " ".join(redact_userinfo(self.error).split())
            lines.append(f"  error   {error if len(error) <= 70 else error[:69] + '…'}")
        return "\n".join(lines)


def _durations(*seconds: float) -> list[str]:
    """Durations shown together, in one unit, the largest's: ``363 ms, 0 ms`` below a
    second, else ``12.35 s, 0.25 s, 0 s`` (``1234 s`` from 1000 s on)."""
    top = max((abs(x) for x in seconds), default=0.0)
    if top < 0.9995:
        return [f"{x * 1000:.0f} ms" for x in seconds]
    return ["0 s" if x == 0 else f"{x:.2f} s" if abs(x) < 1000 else f"{x:.0f} s" for x in seconds]


def _count(n: int, what: str) -> str:
    if n == 1:
        return f"1 {what}"
    return f"{n} {what[:-1] + 'ies' if what.endswith('y') else what + 's'}"


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by a set of intervals."""
    total = 0.0
    cur_start = cur_end = None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None and cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        elif end > cur_end:
            cur_end = end
    if cur_end is not None and cur_start is not None:
        total += cur_end - cur_start
    return total


def settle_idle(calls: list[CallReport], sessions: list[SessionReport]) -> None:
    """Give each call idle before it without a known cause ``subagents`` (a call of one of
    its session's sub-agents started during the idle) or ``think`` (none did). In place;
    once per job, when its report is built."""
    children: dict[str, set[str]] = {}
    for s in sessions:
        if s.parent_id is not None:
            children.setdefault(s.parent_id, set()).add(s.session_id)
    for call in calls:
        if call.idle_s is None or call.idle_cause is not None:
            continue
        kids = children.get(call.session_id)
        begin = call.start_s - call.idle_s
        if kids and any(c.session_id in kids and begin <= c.start_s <= call.start_s for c in calls):
            call.idle_cause = "subagents"
        else:
            call.idle_cause = "think"


@dataclass(slots=True, eq=False)
class _CallState:
    """One call's accounting while it is in flight: a plain slots object on the hot path,
    turned into a :class:`CallReport` (pydantic) when the job's report is built."""

    call_id: str
    session_id: str
    session_name: str | None
    turn: int
    path: str
    model: str | None
    stream: bool
    start_s: float
    started: float
    """Clock time (``anyio.current_time()``) at which the call entered agentrt."""
    priority: int | None = None
    endpoint: str | None = None
    held_s: float = 0.0
    queue_s: float = 0.0
    ttft_s: float | None = None
    latency_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None
    attempts: int = 0
    http_status: int | None = None
    status: CallStatus = "ok"
    error: str | None = None
    moved: bool = False
    idle_s: float | None = None
    idle_cause: IdleCause | None = None
    prefix: tuple[int, int, str | None, int] | None = None
    """Prefix sharing, journals only: (bytes shared with the session's previous call,
    bytes shared across sessions, that common prefix's id, the body's bytes)."""
    done: bool = False
    final: CallReport | None = field(default=None, repr=False)
    """The report, once built for a finished call (nothing changes it after that)."""

    def to_report(self) -> CallReport:
        if self.final is not None:
            return self.final
        report = self._build()
        if self.done:
            self.final = report
        return report

    def _build(self) -> CallReport:
        prefix = self.prefix
        prev = common = None
        if prefix is not None:
            prev = prefix_tokens(prefix[0], prefix[3], self.prompt_tokens)
            common = prefix_tokens(prefix[1], prefix[3], self.prompt_tokens)
        # Not validated again: every value is agentrt's own, of the field's type.
        return trusted_model(
            CallReport,
            {
                "call_id": self.call_id,
                "session_id": self.session_id,
                "session_name": self.session_name,
                "turn": self.turn,
                "endpoint": self.endpoint,
                "path": self.path,
                "model": self.model,
                "stream": self.stream,
                "start_s": self.start_s,
                "held_s": self.held_s,
                "queue_s": self.queue_s,
                "ttft_s": self.ttft_s,
                "latency_s": self.latency_s,
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "cached_tokens": self.cached_tokens,
                "cache_write_tokens": self.cache_write_tokens,
                "reasoning_tokens": self.reasoning_tokens,
                "attempts": self.attempts,
                "http_status": self.http_status,
                "status": self.status,
                "error": self.error,
                "priority": self.priority,
                "moved": self.moved,
                "idle_s": self.idle_s,
                "idle_cause": self.idle_cause,
                "prefix_prev_tokens": prev,
                "prefix_common_tokens": common,
                "prefix_common_id": None if prefix is None or not common else prefix[2],
            },
        )


def settle_calls(calls: list[_CallState], end: float, status: JobStatus) -> None:
    """Count the calls whose reply was never read to its end as ended at ``end`` (their
    job ended with ``status`` first): ``cancelled`` with a cancelled job, else ``error``."""
    for call in calls:
        if not call.done:
            call.done = True
            call.latency_s = end - call.started
            if call.status == "ok":
                call.status = "cancelled" if status == "cancelled" else "error"
                call.error = call.error or "the job ended before the reply was read"


def job_report(
    states: list[_CallState],
    tools: list[ToolReport],
    sessions: list[SessionReport],
    *,
    t0: float,
    end: float,
    **fields: Any,
) -> JobReport:
    """The report of a job that started at ``t0`` (clock time), as of ``end``: its calls'
    reports and the totals over its calls and tool waits, beside the job's own ``fields``
    (id, name, status, ...)."""
    calls = [c.to_report() for c in states]
    settle_idle(calls, sessions)
    intervals = []  # while a call is served: its queueing in agentrt (first) left out
    for c in states:
        waited = c.held_s + c.queue_s
        served = c.started + waited
        if c.latency_s is not None:
            if c.latency_s > waited:
                intervals.append((served, c.started + c.latency_s))
        elif not c.done and end > served:
            intervals.append((served, end))
    return JobReport(
        jct_s=end - t0,
        llm_s=sum(c.latency_s or 0.0 for c in calls),
        critical_llm_s=union_length(intervals),
        queue_s=sum(c.queue_s for c in calls),
        tool_s=sum(t.duration_s for t in tools),
        held_s=sum(c.held_s for c in calls),
        calls=len(calls),
        tool_waits=len(tools),
        sessions=len(sessions),
        prompt_tokens=sum(c.prompt_tokens or 0 for c in calls),
        completion_tokens=sum(c.completion_tokens or 0 for c in calls),
        cached_tokens=sum(c.cached_tokens or 0 for c in calls),
        retries=sum(max(0, c.attempts - 1) for c in calls),
        session_moves=sum(c.moved for c in calls),
        cache_write_tokens=sum(c.cache_write_tokens or 0 for c in calls),
        reasoning_tokens=sum(c.reasoning_tokens or 0 for c in calls),
        call_reports=calls,
        tool_reports=list(tools),
        session_reports=list(sessions),
        **fields,
    )
