"""Load control on two real vLLM CPU replicas whose KV the agent sessions oversubscribe.

The engine tests' pair (64 blocks of 128 tokens, 8,192 tokens of KV each) gets a burst
of agent sessions (python -m benchmarks engine kv's workload: a shared system prompt, a task,
then a tool result and a short reply per turn, short tool waits) whose final contexts
add up to about four times the pair's KV: wherever a turn is placed, someone else's
context is evicted. The same sessions go through ``agentrt.Runtime`` with load control
(a hold bound of ``BOUND_S``) and without it. Checked: with load control agentrt held
sessions at their tool boundaries, no hold outlasted the bound (one tick of slack), and
the engines prefilled fewer uncached prompt tokens than without it (the contexts of
the sessions it let run stayed cached); and it did not starve the replicas: the capacity
it filled stayed near the engine's figure (this process is alone on the pair), several
calls ran at once on a replica, and its throughput was not below ``FLOOR`` of the run
without it. (A collapse of the learned capacity to a fifth of the engine's once left
one session per replica running, at 0.37x the throughput.)

The premise, oversubscription, is made by the workload and checked twice: from the
shape (the final contexts' sum, at the tokenizer's 1.72 tokens a word) before anything
is sent, and from what the run without load control sent (each session's largest
prompt and reply, summed).
"""

from __future__ import annotations

import importlib
import uuid
from dataclasses import replace

import pytest

from agentrt.testing.vllm_cpu import ReplicaServer

pytestmark = pytest.mark.engine

real_kv = importlib.import_module("benchmarks._real_kv")

PAIR_KV_TOKENS = 2 * 64 * 128
"""Both replicas' KV (conftest.PAIR_BLOCKS blocks of vLLM CPU's 128 tokens each)."""
TOKENS_PER_WORD = 1.72
"""The tiny model's tokenizer on real_kv's words (measured)."""
OVERSUBSCRIBED = 3.0
"""The least the sessions' final contexts must add up to, in the pair's KVs."""
BOUND_S = 30.0
"""Load control's bound on a hold (``LoadControl(max_hold_s=)``)."""
TICK_S = 1.0
"""How often held sessions look for room (``LoadControl``'s default ``tick_s``)."""
REPLICA_KV_TOKENS = 64 * 128
"""One replica's KV, as its engine reports it (``vllm:cache_config_info``)."""
CAPACITY_FLOOR = 0.6
"""The least share of the engine's figure load control may fill (a learned share, where
a poll seemed to show other clients, stays near it; the collapse went to ~0.2-0.5)."""
FLOOR = 0.5
"""The least turns per second with load control, as a share of those without it: it
trades some concurrency for cache hits (~0.8x on this model), not most of it."""

SHAPE = real_kv.Shape(
    sessions=20,
    turns=6,
    system_words=150,
    task_words=400,
    step_words=300,
    max_tokens=4,
    tool_s=(0.05, 0.3),
    stagger_s=0.05,  # every session under way before the first ends
)


def _final_contexts(run: dict[str, object]) -> int:
    """The contexts the run's sessions reached (each one's largest prompt and reply)."""
    most: dict[int, int] = {}
    calls = run["calls_detail"]
    assert isinstance(calls, list)
    for c in calls:
        most[c["session"]] = max(most.get(c["session"], 0), c["prompt"] + c["completion"])
    return sum(most.values())


def test_load_control_holds_sessions_and_prefills_less_when_oversubscribed(
    vllm_pair: list[ReplicaServer],
) -> None:
    _, last = real_kv.context_tokens(SHAPE, TOKENS_PER_WORD)
    assert last < 4096, "a session's last turn must fit the pair's max_model_len"
    assert SHAPE.sessions * last >= OVERSUBSCRIBED * PAIR_KV_TOKENS, SHAPE

    # The pair's prefix caches cannot be emptied (no dev mode): each run gets prompts of
    # its own, the same sizes, that no earlier test left cached.
    off = real_kv.run_one(
        "agentrt:load_control=off", vllm_pair, replace(SHAPE, salt=uuid.uuid4().hex), reset=False
    )
    on = real_kv.run_one(
        f"agentrt:max_hold_s={BOUND_S:g}",
        vllm_pair,
        replace(SHAPE, salt=uuid.uuid4().hex),
        reset=False,
    )
    figures = {
        name: {
            "turns_per_s": run["turns_per_s"],
            "tokens": run["tokens"],
            "hit_rate": run["engine_hit_rate"],
            "load_control": run.get("load_control"),
            "kv_capacity_seen": [seen[-1:] for seen in run["kv_capacity_seen"]],
            "gate_capacity_seen": run["gate_capacity_seen"],
            "peak_in_flight": run["peak_in_flight"],
            "makespan_s": run["makespan_s"],
        }
        for name, run in (("off", off), ("on", on))
    }
    for run in (off, on):
        assert run["jobs"] == SHAPE.sessions and run["calls"] == SHAPE.sessions * SHAPE.turns
    sent = _final_contexts(off)
    assert sent >= OVERSUBSCRIBED * PAIR_KV_TOKENS, (sent, figures)

    # Without load control nothing is held; with it, sessions were held at their tool
    # boundaries, and none past the bound.
    assert off["load_control"] is None
    stats = on["load_control"]
    assert stats is not None, figures
    assert stats["holds"] > 0, figures
    assert stats["held_now"] == 0, figures
    assert stats["longest_s"] <= BOUND_S + TICK_S, figures
    held = [c["held_s"] for c in on["calls_detail"]]
    assert max(held) > 0.0 and max(held) <= BOUND_S + TICK_S, figures
    assert all(c["held_s"] == 0.0 for c in off["calls_detail"]), figures

    # The sessions it let run kept their contexts cached: fewer uncached prompt tokens.
    # Work conservation (a replica with no call in flight takes a held session) gives a
    # little of that back for never idling a replica: on vLLM 0.32 CPU, four runs gave
    # 0.82x, 0.82x and twice under 0.8x of the uncached tokens without load control.
    assert on["tokens"]["uncached"] < 0.9 * off["tokens"]["uncached"], figures

    # It did not starve the replicas: it filled about the engine's figure (never a
    # collapsed learned one), let several calls run at once on a replica, and kept most
    # of the throughput.
    for seen in on["gate_capacity_seen"]:
        assert seen[0] == [REPLICA_KV_TOKENS, "engine"], figures
        assert min(c for c, _ in seen) >= CAPACITY_FLOOR * REPLICA_KV_TOKENS, figures
    assert max(on["peak_in_flight"]) >= 2, figures
    assert on["turns_per_s"] >= FLOOR * off["turns_per_s"], figures
