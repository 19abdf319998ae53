"""Fleets for real on vLLM: 8 OS processes, each its own ``Runtime`` with the defaults,
on the two vLLM CPU replicas of ``vllm_pair`` (issue 24; the same fleet as
tests/integrations/test_fleet_processes.py runs on ``agentrt sim serve``, fewer and
shorter jobs here: the engine is slow on 2 cores).

vLLM serves ``/metrics`` at each replica's origin, so the processes see the engines'
load (the fleet's), and its prefix cache reports ``cached_tokens`` in whole blocks of
128 tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrt.testing.vllm_cpu import ReplicaServer
from tests.integrations._fleet import run_fleet

pytestmark = pytest.mark.engine

FLEET = 8
BLOCK = 128


def test_a_fleet_of_processes_agrees_on_replicas_and_hits_the_cache(
    vllm_pair: list[ReplicaServer], tmp_path: Path
) -> None:
    urls = [r.base_url for r in vllm_pair]
    run = run_fleet(
        urls,
        vllm_pair[0].model,
        tmp_path,
        fleet=FLEET,
        jobs=2,  # one generated id, one caller-given
        turns=2,
        more_turns=1,
        words=200,  # a few blocks of prompt
        max_tokens=4,
        tool_s=0.1,
    )
    assert set(run.statuses) == {"ok"}
    assert len({r["runtime_id"] for r in run.runtimes}) == FLEET
    # Every process polled vLLM's /metrics: routing counted the fleet's calls.
    per_worker: dict[str, set[str]] = {}
    for r in run.runtimes:
        per_worker.setdefault(r["runtime_id"], set()).add(r["load_view"])
    assert all("engine" in views for views in per_worker.values()), per_worker
    first = run.first_turns()
    assert set(first) == set(urls) and sum(first.values()) == FLEET * 2, first
    sessions = run.sessions()
    continued = 0
    for sid, calls in sessions.items():
        assert len({c.endpoint for c in calls}) == 1, (sid, calls)
        before = [c for c in calls if c.job == "work"]
        later = [c for c in calls if c.job == "continue"]
        if later:
            continued += 1
            assert {c.worker for c in later} == {(before[0].worker - 1) % FLEET}
            assert later[0].cached_tokens >= BLOCK, (sid, calls)
        # Within a process, the second turn finds the first's prefix.
        assert before[1].cached_tokens >= BLOCK, (sid, calls)
    assert continued == FLEET
