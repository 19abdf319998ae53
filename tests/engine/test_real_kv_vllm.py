"""Placement by KV working set on two real vLLM CPU replicas whose KV evicts (issue 34).

The engine tests' pair (64 blocks of 128 tokens, 8,192 tokens of KV each) serves ten
concurrent agent sessions whose contexts grow to ~1,800 tokens: about 17k tokens in
all, twice what one replica holds, about one replica's worth each when every session
stays on one. The same workload (benchmarks/real_kv.py's, scaled down) goes through a
plain round-robin client and through ``agentrt.Runtime`` with its defaults. Checked:
agentrt read each replica's capacity from the engine's ``vllm:cache_config_info``; the
plain client's sessions came back to evicted contexts and the engines served fewer of
its prompt tokens from their prefix caches; agentrt's uncached prefill is not worse
than plain's. Measured here: plain 29.5k uncached tokens, 4 evicted comebacks, engine
hit rate 53%; agentrt 18.6k, none, 70% (about 90 s with the replicas' start).
"""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest

from agentrt.testing.vllm_cpu import Replica
from tests._benchmarks import load_benchmark

pytestmark = pytest.mark.engine

real_kv = load_benchmark("real_kv")

PAIR_KV_TOKENS = 64 * 128  # conftest.PAIR_BLOCKS blocks of vLLM CPU's 128 tokens
SHAPE = real_kv.Shape(
    sessions=10,
    turns=5,
    system_words=150,
    task_words=200,
    step_words=150,
    max_tokens=8,
    tool_s=(0.1, 0.5),
    stagger_s=0.2,
)


def test_agentrt_reads_the_engines_kv_and_prefills_no_more_than_round_robin(
    vllm_pair: list[Replica],
) -> None:
    # The pair's prefix caches cannot be emptied (no dev mode): each client gets prompts
    # of its own, the same sizes, that no earlier test left cached.
    plain = real_kv.run_one("plain", vllm_pair, replace(SHAPE, salt=uuid.uuid4().hex), reset=False)
    ours = real_kv.run_one("agentrt", vllm_pair, replace(SHAPE, salt=uuid.uuid4().hex), reset=False)
    assert plain["jobs"] == ours["jobs"] == SHAPE.sessions
    assert plain["calls"] == ours["calls"] == SHAPE.sessions * SHAPE.turns

    # agentrt's view of each replica: first the engine's capacity, read from its
    # /metrics; later at most that (evictions seen may teach it a smaller share).
    for seen, load in zip(ours["kv_capacity_seen"], ours["endpoint_loads"], strict=True):
        assert seen[0] == [PAIR_KV_TOKENS, "engine"], seen
        assert load["kv_capacity"] <= PAIR_KV_TOKENS
        assert load["kv_capacity_source"] in ("engine", "learned")

    # The set-up evicts under round robin: the engines served fewer of plain's prompt
    # tokens from their prefix caches, and plain prefilled again context it had sent.
    def hit_rate(run: dict[str, object]) -> float:
        engine = run["engine"]
        assert isinstance(engine, dict)
        return sum(engine["prefix_cache_hits"]) / sum(engine["prefix_cache_queries"])

    figures = {
        name: (run["tokens"], run["evicted"], hit_rate(run), run.get("moves"))
        for name, run in (("plain", plain), ("agentrt", ours))
    }
    assert plain["evicted"]["calls"] >= 1, figures
    assert hit_rate(plain) < hit_rate(ours), figures
    assert plain["tokens"]["reprefilled"] > 2 * ours["tokens"]["reprefilled"], figures

    # Placement by working set: no more uncached prefill than round robin (a 10% margin
    # for the prompts' slightly different token counts).
    assert ours["tokens"]["uncached"] <= 1.1 * plain["tokens"]["uncached"], figures
