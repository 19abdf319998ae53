"""The twin's engine fitted to a journal's calls: time held by load control, like queue
time, is no service, and is taken out of each call's latency and time to first token."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from agentrt.sim import PRESETS
from agentrt.telemetry import CallReport, JobReport
from agentrt.tune._fit import _features, from_journal


def test_time_held_is_not_service_time() -> None:
    """Calls served by an engine whose prefill is twice the preset's and whose decode is
    half, each held 0 to 12 s and queued a little first: the fit finds 2 and 0.5."""
    base = PRESETS["h100-8b"]
    fixed = base.request_overhead_s + base.cost.step_s
    calls = []
    for i in range(40):
        prompt, out = 1000 + 500 * i, 20 + 10 * (i % 7)
        pre, dec = _features(base, prompt, 0, out)
        waited = 3.0 * (i % 5) + 0.1 * (i % 3)
        calls.append(
            CallReport(
                call_id=f"c{i}",
                session_id=f"s{i}",
                turn=0,
                path="/chat/completions",
                start_s=float(i),
                held_s=3.0 * (i % 5),
                queue_s=0.1 * (i % 3),
                ttft_s=waited + fixed + 2.0 * pre,
                latency_s=waited + fixed + 2.0 * pre + 0.5 * dec,
                prompt_tokens=prompt,
                completion_tokens=out,
                cached_tokens=0,
            )
        )
    report = JobReport(
        job_id="j",
        name="j",
        program_id="p",
        status="ok",
        started_at=datetime(2026, 1, 1, tzinfo=UTC),
        jct_s=100.0,
        llm_s=sum(c.latency_s or 0.0 for c in calls),
        critical_llm_s=0.0,
        queue_s=sum(c.queue_s for c in calls),
        held_s=sum(c.held_s for c in calls),
        tool_s=0.0,
        calls=len(calls),
        tool_waits=0,
        sessions=len(calls),
        prompt_tokens=sum(c.prompt_tokens or 0 for c in calls),
        completion_tokens=sum(c.completion_tokens or 0 for c in calls),
        cached_tokens=0,
        retries=0,
        call_reports=calls,
    )
    _, fit = from_journal([report], base)
    assert fit.source == "journal"
    assert fit.prefill_scale == pytest.approx(2.0, rel=1e-3)
    assert fit.decode_scale == pytest.approx(0.5, rel=1e-3)
