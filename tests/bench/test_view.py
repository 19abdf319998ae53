"""The client's view of the replicas' KV against the engines' (agentrt/bench/_view.py),
sampled during a replay: on tiny deterministic replays whose real figures are known."""

from __future__ import annotations

from typing import Any

import pytest

from agentrt.bench._output import view_lines
from agentrt.bench._plan import BLOCK_TOKENS, Call, JobPlan, SessionPlan
from agentrt.bench._runner import BenchConfig, BenchResult, ClientRun, replay_part, sim_clients
from agentrt.bench._view import ViewSampler, _correlation, format_view
from agentrt.sim import PRESETS

BLOCK = PRESETS["h100-8b"].block_size


def _session(name: str, turns: int, wait_s: float, per_turn: int = 64) -> SessionPlan:
    """A session whose every turn extends its prompt by ``per_turn`` blocks after a tool
    wait of ``wait_s``."""
    steps = tuple(
        Call(
            wait_s if t else 0.0,
            "tool" if t else None,
            tuple(range(per_turn * (t + 1))),
            name,
            0,
            7,
            40,
        )
        for t in range(turns)
    )
    return SessionPlan(name, steps)


def _replay(plans: list[JobPlan], **changes: object) -> ClientRun:
    fields: dict[str, object] = {
        "replicas": 2,
        # Load control off: these replays evict on purpose, to compare the views then.
        "clients": ("agentrt:defaults,load_control=off",),
        "stretch": False,
        "kv_sample_s": 1.0,
        "api": "http",
    }
    cfg = BenchConfig(**(fields | changes))  # type: ignore[arg-type]
    run = replay_part(cfg, plans, 0)
    assert isinstance(run, ClientRun)
    assert all(r.status == "ok" for r in run.results)
    return run


def test_one_session_on_one_replica_is_seen_within_a_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    samples: list[tuple[int, float | None, float]] = []
    result = ViewSampler.result

    def keep(self: ViewSampler) -> dict[str, Any] | None:
        out = result(self)
        samples.extend((r[0], r[2], r[3]) for r in self._rows)
        return out

    monkeypatch.setattr(ViewSampler, "result", keep)
    run = _replay([JobPlan("j", "react", 0.0, _session("s", 6, 20.0))])
    # Between calls the client's estimate is the engine's, to the partial last block the
    # engine does not cache; while a call runs the engine holds its new prompt and the
    # client still counts the previous context (short by the turn's growth).
    between = [
        (n, est, real) for n, est, real in samples if est is not None and est <= real + BLOCK
    ]
    assert all(0 <= est - real < BLOCK for _, est, real in between if est >= real)
    running = [(est, real) for _, est, real in samples if est is not None and real > est + BLOCK]
    assert all(real - est <= 64 * BLOCK_TOKENS + BLOCK for est, real in running)
    assert sum(n for n, _, _ in between) > 0.9 * sum(n for n, _, _ in samples)
    view = run.view
    assert view is not None
    resident, over, capacity = view["resident"], view["over"], view["capacity"]
    # The client's estimate of its one session's cached context is the engine's, to the
    # partial last block the engine does not cache (and a block per request in flight).
    assert resident["samples"] > 100  # about one a second over the job's ~2 minutes
    assert resident["real_mean"] > 2 * 64 * BLOCK_TOKENS  # several turns' worth of tokens
    assert resident["rel_error"] < 0.02 and resident["correlation"] > 0.99
    # The capacity is the engine's figure (vllm:cache_config_info), and nothing is over.
    real = PRESETS["h100-8b"].num_gpu_blocks * BLOCK
    assert capacity["real"] == real and capacity["assumed_mean"] == real
    assert capacity["sources"] == {"engine": 1.0}
    assert over == {"client": 0.0, "engine": 0.0, "false_over": 0.0, "missed_over": 0.0}


def test_evictions_show_in_the_engines_figures() -> None:
    # Four sessions on two replicas (two each), growing to about 690 tokens (43 blocks):
    # replicas of 400 blocks keep them all; replicas of 56 hold one such context, not two,
    # and evict the other's tail: the real resident falls below the sessions' contexts.
    plans = [
        JobPlan(name, "react", t, _session(name, 5, 20.0, per_turn=2))
        for name, t in (("a", 0.0), ("b", 0.0), ("c", 10.0), ("d", 10.0))
    ]
    roomy = _replay(plans, gpu_blocks=400).view
    tight = _replay(plans, gpu_blocks=56).view
    assert roomy is not None and tight is not None
    assert roomy["capacity"]["real"] == 400 * BLOCK and tight["capacity"]["real"] == 56 * BLOCK
    assert roomy["over"]["engine"] == 0.0 and roomy["resident"]["rel_error"] < 0.1
    assert tight["resident"]["real_mean"] < 0.95 * roomy["resident"]["real_mean"]
    assert tight["over"]["engine"] > 0.2


def test_figures_reach_the_result_and_the_output() -> None:
    run = _replay([JobPlan("j", "react", 0.0, _session("s", 3, 5.0))])
    cfg = BenchConfig(replicas=2, clients=("agentrt:defaults",), stretch=False)
    (client,) = sim_clients(cfg, {0: run})
    assert client.kv_view == run.view
    result = BenchResult({}, True, 0.0, 3, [client])
    head, *lines = view_lines(result, 80)
    assert "picture" in head and lines[0].startswith("agentrt:defaults: estimated its")
    assert len(lines) > 1 and all(len(x) <= 80 and x.startswith("  ") for x in lines[1:])
    assert view_lines(BenchResult({}, True, 0.0, 0, [])) == []
    assert run.view is not None and "where each holds 426k" in format_view(run.view)


def test_sampling_moves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # The view is read-only: the same replay without the sampler gives the same jobs.
    plans = [
        JobPlan(name, "react", t, _session(name, 4, 3.0 + t, per_turn=8))
        for name, t in (("a", 0.0), ("b", 0.5), ("c", 1.0), ("d", 1.5), ("e", 2.0))
    ]
    seen = _replay(plans, gpu_blocks=200)

    async def nothing(self: ViewSampler) -> None:
        return None

    monkeypatch.setattr(ViewSampler, "run", nothing)
    unseen = _replay(plans, gpu_blocks=200)
    assert seen.view is not None and seen.view["resident"]["samples"] > 20
    assert [(r.name, r.jct_s, [c.endpoint for c in r.calls]) for r in seen.results] == [
        (r.name, r.jct_s, [c.endpoint for c in r.calls]) for r in unseen.results
    ]
    assert seen.engine == unseen.engine


def test_plain_clients_and_one_endpoint_have_no_view() -> None:
    plans = [JobPlan("j", "react", 0.0, _session("s", 2, 1.0))]
    assert _replay(plans, clients=("plain",)).view is None
    assert _replay(plans, replicas=1).view is None


def test_correlation() -> None:
    w = [1.0, 2.0, 1.0]
    assert _correlation(w, [1.0, 2.0, 3.0], [2.0, 4.0, 6.0]) == pytest.approx(1.0)
    assert _correlation(w, [1.0, 2.0, 3.0], [6.0, 4.0, 2.0]) == pytest.approx(-1.0)
    assert _correlation(w, [1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) is None


def test_kv_events_make_the_view_exact() -> None:
    # The tight replay above, with the runtime reading the replicas' KV-cache events
    # (in-process): the resident figure is the engine's, evictions included.
    plans = [
        JobPlan(name, "react", t, _session(name, 5, 20.0, per_turn=2))
        for name, t in (("a", 0.0), ("b", 0.0), ("c", 10.0), ("d", 10.0))
    ]
    guessed = _replay(plans, gpu_blocks=56).view
    exact = _replay(
        plans, gpu_blocks=56, clients=("agentrt:defaults,kv_events=on,load_control=off",)
    ).view
    assert guessed is not None and exact is not None
    assert exact["over"]["engine"] > 0.2  # the same evictions
    assert exact["resident"]["rel_error"] < 0.5 * guessed["resident"]["rel_error"]
    assert exact["resident"]["correlation"] > 0.95
