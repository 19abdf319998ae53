"""A Runtime's first burst of calls in virtual time: reproducible, all sent at once.

An ``AsyncOpenAI`` client probes its platform tag in a worker thread on its first request,
and again for every request sent before that probe returns. Under trio's
``MockClock(autojump_threshold=0)`` the clock jumps while those threads run, so a burst of
first calls used to reach agentrt's transport spread over virtual seconds, in an order
the threads decided: a workload limited to 2 calls per replica sometimes never queued
(tests/telemetry/test_report.py saw it in CI). The runtime now finds the tag once, when
it is built, and hands it to its clients.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import trio
from trio.testing import MockClock

import agentrt
import agentrt._platform
from agentrt.sim import PRESETS, Cluster
from agentrt.telemetry import JobReport, read_journal


async def _burst(path: Path) -> None:
    async with (
        Cluster(1, PRESETS["h100-8b"]) as cluster,
        agentrt.Runtime(
            cluster.base_urls[0],
            transport=cluster.transport(),
            journal=path,
            otel=False,
            concurrency=2,
        ) as rt,
    ):

        async def one(i: int) -> None:
            async with rt.job("burst") as job, job.session("main") as s:
                content = f"question {i} " * 20
                await s.chat(model="m", messages=[{"role": "user", "content": content}])

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(one, i)


def _run(path: Path) -> list[JobReport]:
    trio.run(_burst, path, clock=MockClock(autojump_threshold=0))
    return sorted(read_journal(path), key=lambda r: r.jct_s)


def test_a_burst_of_first_calls_is_sent_at_once_and_replays_alike(tmp_path: Path) -> None:
    # As in a fresh process: the runtime must find the platform tag itself.
    agentrt._platform.openai_platform.cache_clear()
    first = _run(tmp_path / "a.jsonl")
    assert len(first) == 8
    calls = [c for r in first for c in r.call_reports]
    # Every job's call reached the transport when the job began (t=0 of the job), and
    # 6 of the 8 waited in agentrt's queue for one of the 2 slots.
    assert [c.start_s for c in calls] == [0.0] * 8
    assert sum(c.queue_s > 0 for c in calls) == 6
    again = _run(tmp_path / "b.jsonl")
    assert [(r.jct_s, r.queue_s) for r in again] == [(r.jct_s, r.queue_s) for r in first]
