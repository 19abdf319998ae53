"""The ``coding`` workload: draws that follow the fit to the Claude Code traces, scaling,
determinism, and (where the traces are here) the shipped fit against a fresh one."""

from __future__ import annotations

import itertools
import random
import statistics
from dataclasses import replace

import pytest

from agentrt.bench import Arrivals, Call, Fanout, SessionPlan, TraceOptions, make_workload
from agentrt.bench._coding import (
    DEMO_SCALE,
    FIT,
    QS,
    CodingScale,
    Quantiles,
    coding_job,
)
from agentrt.bench._plan import BLOCK_TOKENS
from agentrt.bench._workloads import coding_scale


def _calls(plan: SessionPlan) -> list[Call]:
    out: list[Call] = []
    for step in plan.steps:
        if isinstance(step, Call):
            out.append(step)
        else:
            for sub in step.sessions:
                out.extend(_calls(sub))
    return out


def _main_calls(plan: SessionPlan) -> list[Call]:
    return [s for s in plan.steps if isinstance(s, Call)]


def test_quantile_draws_follow_the_table() -> None:
    q = Quantiles((1, 2, 4, 8, 16, 32, 64, 128, 256))
    rng = random.Random(3)
    draws = sorted(q.sample(rng) for _ in range(20_000))
    assert draws[0] >= 1 and draws[-1] <= 256  # clamped to the 1st and 99th percentiles
    for p, value in zip(QS[1:-1], q.values[1:-1], strict=True):
        empirical = draws[int(p * len(draws))]
        assert empirical == pytest.approx(value, rel=0.08), p
    with pytest.raises(ValueError, match="non-decreasing"):
        Quantiles((3, 2, 1, 4, 5, 6, 7, 8, 9))
    with pytest.raises(ValueError, match="9 non-decreasing"):
        Quantiles((1, 2))


@pytest.fixture(scope="module")
def sessions() -> list[SessionPlan]:
    """Many sessions at the traces' counts and times, with tiny prompts (cheap to build)."""
    rng = random.Random(11)
    return [coding_job(rng, f"j{i}", scale=CodingScale(token_scale=0.001)) for i in range(2000)]


def test_sessions_follow_the_fitted_counts_waits_and_rewrites(
    sessions: list[SessionPlan],
) -> None:
    main = [_main_calls(s) for s in sessions]
    assert statistics.median(len(c) for c in main) == pytest.approx(FIT.calls.median, rel=0.1)
    # a rewrite (compaction) starts the session's own blocks afresh
    pairs = [(a, b) for cs in main for a, b in itertools.pairwise(cs)]
    rewrites = sum(b.blocks[: len(a.blocks)] != a.blocks for a, b in pairs) / len(pairs)
    assert rewrites == pytest.approx(FIT.rewrite_share, rel=0.2)
    calls = [c for cs in main for c in cs]
    assert sum(c.stream for c in calls) / len(calls) == pytest.approx(FIT.stream_share, abs=0.02)
    later = [c for cs in main for c in cs[1:]]
    tools = [c for c in later if c.tool]
    assert len(tools) / len(later) == pytest.approx(FIT.tool_share, abs=0.03)
    tool_wait = statistics.median(c.wait_s for c in tools)
    assert tool_wait == pytest.approx(FIT.tool_wait_s.median, rel=0.15)
    think = statistics.median(c.wait_s for c in later if not c.tool)
    assert think == pytest.approx(FIT.think_s.median, rel=0.2)
    assert all(cs[0].wait_s == 0 and cs[0].tool is None for cs in main)


def test_prompts_follow_the_fitted_sizes() -> None:
    rng = random.Random(12)
    scale = CodingScale(max_calls=6)  # full-size prompts: a few calls of each session
    main = [_main_calls(coding_job(rng, f"j{i}", scale=scale)) for i in range(600)]
    prefix = FIT.prefix_tokens // BLOCK_TOKENS
    # every main-agent prompt starts with the shared prefix (tools + system prompt)
    assert all(c.shared_blocks == prefix for cs in main for c in cs)
    assert all(c.blocks[:prefix] == tuple(range(prefix)) for cs in main for c in cs)
    first = [(len(cs[0].blocks) - prefix) * BLOCK_TOKENS for cs in main]
    assert statistics.median(first) == pytest.approx(FIT.first_tokens.median, rel=0.15)
    growth = [
        (len(b.blocks) - len(a.blocks)) * BLOCK_TOKENS
        for cs in main
        for a, b in itertools.pairwise(cs)
        if b.blocks[: len(a.blocks)] == a.blocks  # not a rewrite
    ]
    assert statistics.median(growth) == pytest.approx(FIT.growth_tokens.median, rel=0.15)
    outs = [c.output_tokens for cs in main for c in cs]
    assert statistics.median(outs) == pytest.approx(FIT.output_tokens.median, rel=0.1)


def test_some_sessions_spawn_concurrent_subagents(sessions: list[SessionPlan]) -> None:
    spawning = [s for s in sessions if any(isinstance(x, Fanout) for x in s.steps)]
    assert len(spawning) / len(sessions) == pytest.approx(FIT.subagent_share, abs=0.012)
    subs = [sub for s in spawning for x in s.steps if isinstance(x, Fanout) for sub in x.sessions]
    names = {c.namespace for sub in subs for c in _calls(sub)}
    assert len(names) == len(subs)
    assert statistics.median(len(_calls(sub)) for sub in subs) == pytest.approx(
        FIT.sub_calls.median, rel=0.25
    )
    # full-size sub-agents: their own shared prefix, no block in common with the main one
    rng = random.Random(4)
    fit = replace(FIT, subagent_share=1.0)
    plan = coding_job(rng, "s", fit=fit, scale=CodingScale(max_calls=3))
    sub_prefix = FIT.sub_prefix_tokens // BLOCK_TOKENS
    fanouts = [x for x in plan.steps if isinstance(x, Fanout)]
    assert fanouts
    for sub in (sub for f in fanouts for sub in f.sessions):
        calls = _calls(sub)
        assert calls and all(c.shared_blocks == sub_prefix for c in calls)
        assert not set(calls[0].blocks) & set(range(FIT.prefix_tokens // BLOCK_TOKENS))


def test_scale_shrinks_tokens_and_times_and_caps() -> None:
    full = coding_job(random.Random(5), "x", scale=CodingScale(max_calls=40))
    small = coding_job(
        random.Random(5),
        "x",
        scale=CodingScale(token_scale=0.25, time_scale=0.1, max_wait_s=3.0, max_calls=10),
    )
    fc, sc = _main_calls(full), _main_calls(small)
    assert len(sc) == min(10, len(fc))
    assert all(c.wait_s <= 3.0 for c in sc)
    assert sum(c.prompt_tokens for c in sc) < 0.3 * sum(c.prompt_tokens for c in fc[: len(sc)])
    with pytest.raises(ValueError):
        CodingScale(token_scale=0)
    with pytest.raises(ValueError):
        CodingScale(max_calls=0)


def test_the_workload_is_seeded_and_its_options_multiply_the_demo_scale() -> None:
    a = make_workload("coding", 12, Arrivals(0.2, 1), seed=1)
    b = make_workload("coding", 12, Arrivals(0.2, 1), seed=1)
    c = make_workload("coding", 12, Arrivals(0.2, 2), seed=2)
    assert a == b and a != c
    assert {p.kind for p in a} == {"coding"}
    cap = DEMO_SCALE.max_calls
    assert cap is not None
    assert all(p.calls() <= cap for p in a if not _has_fanout(p.root))
    half_tokens = TraceOptions(token_scale=0.5)
    half = make_workload("coding", 12, Arrivals(0.2, 1), seed=1, traces=half_tokens)
    tokens = sum(c.prompt_tokens for p in a for c in _calls(p.root))
    tokens_half = sum(c.prompt_tokens for p in half for c in _calls(p.root))
    assert tokens_half == pytest.approx(tokens / 2, rel=0.05)
    scale = coding_scale(TraceOptions(time_scale=2.0, max_wait_s=9.0))
    assert scale == replace(DEMO_SCALE, time_scale=DEMO_SCALE.time_scale * 2, max_wait_s=9.0)


def _has_fanout(plan: SessionPlan) -> bool:
    return any(isinstance(s, Fanout) for s in plan.steps)
