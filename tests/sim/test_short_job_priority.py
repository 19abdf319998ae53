"""The opt-in of issue 34: ``policy="plas"`` on an embedded replica that schedules by
priority (it advertises it, so ``send_priority="auto"`` sends the levels): the jobs'
attained service reaches the engine, and short jobs that arrive beside long ones wait
less where the engine queues. A small deterministic replay in virtual time, the same jobs
under Runtime's defaults (FCFS: level 0 for every call) and under PLAS."""

from __future__ import annotations

import statistics
from typing import Any

import anyio
import pytest

from agentrt import Runtime
from agentrt.sim import Cluster, EngineConfig
from tests.sim._helpers import virtual_backend

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> Any:
    return virtual_backend()


LONG_JOBS = 6
LONG_CALLS = 12
SHORT_JOBS = 4
SHORT_START_S = 30.0


async def _replay(policy: str) -> tuple[list[float], list[float], list[int | None]]:
    """Six long jobs (12 calls of 300 tokens out each) from t = 0 on one replica that runs
    two requests at a time, and four short ones (two calls of 40 tokens) from t = 30 s:
    the JCTs of the short and of the long jobs, and the priorities the short jobs' calls
    carried."""
    cfg = EngineConfig(max_num_seqs=2, scheduling="priority")
    short: list[float] = []
    long: list[float] = []
    sent: list[int | None] = []
    async with (
        Cluster(1, cfg) as cluster,
        Runtime(list(cluster.base_urls), transport=cluster.transport(), policy=policy) as rt,
    ):

        async def job(name: str, calls: int, out: int, delay: float, into: list[float]) -> None:
            await anyio.sleep(delay)
            t0 = anyio.current_time()
            async with rt.job(name) as j, j.session() as s:
                for i in range(calls):
                    content = f"{name} turn {i} " + "context " * 300
                    await s.chat(
                        model=cfg.model_name,
                        messages=[{"role": "user", "content": content}],
                        max_tokens=out,
                    )
            into.append(anyio.current_time() - t0)
            if into is short:
                sent.extend(c.priority for c in j.report.call_reports)

        async with anyio.create_task_group() as tg:
            for k in range(LONG_JOBS):
                tg.start_soon(job, f"long-{k}", LONG_CALLS, 300, 0.1 * k, long)
            for k in range(SHORT_JOBS):
                tg.start_soon(job, f"short-{k}", 2, 40, SHORT_START_S + 3.0 * k, short)
    return short, long, sent


async def test_short_jobs_wait_less_when_plas_levels_reach_the_engine() -> None:
    fcfs_short, fcfs_long, fcfs_sent = await _replay("fcfs")
    plas_short, plas_long, plas_sent = await _replay("plas")
    # FCFS has one level: 0 on every call but the first (sent before the replica's
    # first reply advertised priority scheduling), nothing reordered.
    assert set(fcfs_sent) <= {0, None}
    # A short job's calls go at level 0 or 1 (little service yet), ahead of the long
    # jobs' (level 3 or more by t = 30 s).
    assert plas_sent and all(p is not None and p <= 1 for p in plas_sent)
    ratio = statistics.fmean(plas_short) / statistics.fmean(fcfs_short)
    assert ratio < 0.7, (plas_short, fcfs_short)
    assert max(plas_short) < min(fcfs_short)
    # The long jobs pay for it, by little: the same work, reordered.
    assert statistics.fmean(plas_long) < 1.1 * statistics.fmean(fcfs_long)
