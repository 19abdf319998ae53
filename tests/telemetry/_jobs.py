"""Job reports built by hand for the report tests: the calls and tool waits given, the
totals summed as a runtime sums them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from agentrt.telemetry import CallReport, JobReport, ToolReport


def job_report(
    name: str,
    jct: float,
    calls: Sequence[tuple[str, float, float, float, float]] = (),
    tools: Sequence[tuple[str, float, float]] = (),
    *,
    prompt: int = 100,
    cached: int = 0,
    status: str = "ok",
    job_id: str | None = None,
    retries: int = 0,
) -> JobReport:
    """Calls as (session, start, held, queue, latency), tools as (session, start, s)."""
    call_reports = [
        CallReport(
            call_id=f"c{i}",
            session_id=s,
            session_name=s,
            turn=i,
            path="/chat/completions",
            start_s=start,
            held_s=held,
            queue_s=queue,
            latency_s=latency,
        )
        for i, (s, start, held, queue, latency) in enumerate(calls)
    ]
    tool_reports = [
        ToolReport(session_id=s, name="t", start_s=start, duration_s=d) for s, start, d in tools
    ]
    return JobReport(
        job_id=job_id or f"{name}-{jct}",
        name=name,
        program_id="p",
        status=status,  # type: ignore[arg-type]
        started_at=datetime(2026, 1, 1, tzinfo=UTC),
        jct_s=jct,
        llm_s=sum(c.latency_s or 0.0 for c in call_reports),
        critical_llm_s=0.0,
        queue_s=sum(c.queue_s for c in call_reports),
        held_s=sum(c.held_s for c in call_reports),
        tool_s=sum(t.duration_s for t in tool_reports),
        calls=len(call_reports),
        tool_waits=len(tool_reports),
        sessions=len({c.session_id for c in call_reports}),
        prompt_tokens=prompt,
        completion_tokens=10,
        cached_tokens=cached,
        retries=retries,
        call_reports=call_reports,
        tool_reports=tool_reports,
    )
