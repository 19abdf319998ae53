"""``agentrt.bench.replay``: jobs of the caller's own, replayed through one client against
real servers in wall-clock time (``agentrt sim serve``'s app on loopback; nothing is
mocked), summarized as ``run_bench`` summarizes a client; bad input is refused before any
request."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import anyio
import pytest

from agentrt.bench import Arrivals, Prompts, make_workload, replay
from agentrt.sim import serve_async
from agentrt.telemetry import read_journal
from tests.sim._helpers import small_config


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # uvicorn runs on asyncio
async def test_replay_runs_the_given_jobs_and_summarizes_them(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn")
    jobs = make_workload("react", 2, Arrivals(4.0, 1), seed=1, tool_wait_s=0.01)
    jobs[1] = dataclasses.replace(jobs[1], name="mine")  # the caller's own jobs
    journal = tmp_path / "journal.jsonl"
    async with anyio.create_task_group() as tg:
        urls = await tg.start(serve_async, 2, "127.0.0.1", 0, small_config(num_gpu_blocks=8000))
        result = await anyio.to_thread.run_sync(
            lambda: replay(
                jobs, list(urls), "agentrt:session", prompts=Prompts("sim"), journal=journal
            )
        )
        tg.cancel_scope.cancel()
    assert (result.client, result.jobs, result.failed) == ("agentrt:session", 2, 0)
    assert sorted(row["name"] for row in result.job_rows) == sorted(j.name for j in jobs)
    assert all(row["status"] == "ok" for row in result.job_rows)
    lat = result.call_latency
    assert set(lat) == {"p50", "p90", "p99"} and 0 < lat["p50"] <= lat["p90"] <= lat["p99"]
    assert 0 < result.jct["p50"] <= result.jct["p90"] and result.makespan_s > 0
    # the served replicas' own counters: every call's prompt was looked up in a cache
    assert result.prefix_cache_hit_rate is not None
    assert result.journal == str(journal) and len(read_journal(journal)) == 2


def test_replay_refuses_bad_input_before_any_request() -> None:
    jobs = make_workload("react", 1, Arrivals(None, 0), seed=0)
    with pytest.raises(ValueError, match="at least one endpoint"):
        replay(jobs, [])
    with pytest.raises(ValueError, match="scheme"):
        replay(jobs, ["127.0.0.1:8000/v1"])
    with pytest.raises(ValueError, match="nonsense"):
        replay(jobs, ["http://127.0.0.1:9/v1"], "nonsense")
