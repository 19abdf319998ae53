"""Placement by KV working set on two real vLLM CPU replicas whose KV evicts (issue 34).

The engine tests' pair (64 blocks of 128 tokens, 8,192 tokens of KV each) serves
concurrent agent sessions whose contexts grow to ~1,500 tokens. The same workload
(python -m benchmarks engine kv's, scaled down) goes through a plain round-robin client and
through ``agentrt.Runtime`` with its defaults. Checked: agentrt read each replica's
capacity from the engine's ``vllm:cache_config_info``; the plain client's sessions came
back to evicted contexts and the engines served fewer of its prompt tokens from their
prefix caches; agentrt's uncached prefill is not worse than plain's.

The premise, round robin overfilling the replicas' KV, is made by the workload, not left
to timing: the number of sessions is computed from the pair's capacity so that the
contexts round robin scatters over both replicas are well over what one holds, and it
is odd, so that sessions running in lockstep (a loaded machine: calls slower than the
tool waits) still change replica every turn (with an even number in lockstep, global
round robin sends each session to the same replica every time, which is session
affinity, and nothing evicts). The run then measures the premise (the contexts each
replica was sent) and skips the comparison with plain, saying why, only if it did not
arise; agentrt's own checks (the capacity read) come first and never skip. Measured
here (10 sessions): plain 29.5k uncached tokens, 4 evicted comebacks, engine hit rate
53%; agentrt 18.6k, none, 70% (about 90 s with the replicas' start).
"""

from __future__ import annotations

import importlib
import uuid
from dataclasses import replace
from typing import Any

import pytest

from agentrt.testing.vllm_cpu import ReplicaServer

pytestmark = pytest.mark.engine

real_kv = importlib.import_module("benchmarks._real_kv")

PAIR_KV_TOKENS = 64 * 128  # conftest.PAIR_BLOCKS blocks of vLLM CPU's 128 tokens
TOKENS_PER_WORD = 1.7
"""The tiny model's tokenizer on real_kv's words (1.72, measured)."""
OVERFILL = 2.0
"""How many replicas' KV the sessions' final contexts add up to: round robin, which
sends every replica nearly every session, overfills each; placement that keeps each
session on one replica asks each for about half of it, which fits (a shared system
prompt counts once per session in the sum, once in a cache)."""
PREMISE = 1.5
"""The least a replica must have been sent, in capacities, for round robin's evictions
to be certain (a shared system prompt counts once per session in the sum)."""

TURN = real_kv.Shape(
    sessions=1,
    turns=5,
    system_words=150,
    task_words=200,
    step_words=120,
    max_tokens=8,
    tool_s=(0.1, 0.5),
    stagger_s=0.05,  # all sessions under way before the first finishes (>= 4 tool waits)
)


def _sessions(shape: Any, capacity: int) -> int:
    """The odd number of sessions whose final contexts add up closest to ``OVERFILL``
    capacities."""
    words = shape.system_words + shape.task_words + (shape.turns - 1) * shape.step_words
    context = words * TOKENS_PER_WORD + shape.turns * shape.max_tokens
    return 2 * round((OVERFILL * capacity / context - 1) / 2) + 1


SHAPE = replace(TURN, sessions=_sessions(TURN, PAIR_KV_TOKENS))


def _sent(run: dict[str, Any], replicas: int) -> list[int]:
    """Per replica, the contexts the client's sessions left there (each session's
    largest prompt plus reply on it), summed: what it was asked to hold."""
    most: dict[tuple[int, int], int] = {}
    for c in run["calls_detail"]:
        key = (c["replica"], c["session"])
        most[key] = max(most.get(key, 0), c["prompt"] + c["completion"])
    return [sum(v for (r, _), v in most.items() if r == i) for i in range(replicas)]


def test_agentrt_reads_the_engines_kv_and_prefills_no_more_than_round_robin(
    vllm_pair: list[ReplicaServer],
) -> None:
    assert SHAPE.sessions % 2 == 1 and SHAPE.sessions >= 9, SHAPE
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

    sent = _sent(plain, len(vllm_pair))
    figures = {
        name: (run["tokens"], run["evicted"], hit_rate(run), run.get("moves"))
        for name, run in (("plain", plain), ("agentrt", ours))
    }
    figures["plain sent per replica"] = sent
    if min(sent) < PREMISE * PAIR_KV_TOKENS:
        pytest.skip(
            f"round robin did not overfill the replicas' KV on this run (contexts sent "
            f"{sent} tokens, {PAIR_KV_TOKENS} held each; the premise wants "
            f"{PREMISE:g}x): nothing for placement to beat; agentrt's capacity reading "
            f"was checked. {figures}"
        )
    assert plain["evicted"]["calls"] >= 1, figures
    assert hit_rate(plain) < hit_rate(ours), figures
    assert plain["tokens"]["reprefilled"] > 2 * ours["tokens"]["reprefilled"], figures

    # Placement by working set: no more uncached prefill than round robin (a 10% margin
    # for the prompts' slightly different token counts).
    assert ours["tokens"]["uncached"] <= 1.1 * plain["tokens"]["uncached"], figures
