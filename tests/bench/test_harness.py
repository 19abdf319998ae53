"""The benchmark harness: workloads, trace replay, determinism, the CLI."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from agentrt.bench import (
    Arrivals,
    BenchConfig,
    Call,
    Fanout,
    Prompts,
    TraceOptions,
    make_workload,
    run_bench,
)
from agentrt.bench._workloads import default_trace_dir
from agentrt.cli import main
from agentrt.sim import count_tokens

HAVE_TRACES = default_trace_dir().is_dir()


def test_synthetic_workloads_are_seeded_and_shaped() -> None:
    a = make_workload("mixed", 30, Arrivals(rate=2.0, seed=1), seed=1)
    b = make_workload("mixed", 30, Arrivals(rate=2.0, seed=1), seed=1)
    c = make_workload("mixed", 30, Arrivals(rate=2.0, seed=2), seed=2)
    assert a == b and a != c
    assert {p.kind for p in a} == {"react", "fanout", "chat"}
    times = [p.arrival_s for p in a]
    assert times == sorted(times) and times[0] == 0.0 and times[-1] > 0
    fan = next(p for p in a if p.kind == "fanout")
    assert any(isinstance(s, Fanout) for s in fan.root.steps)
    react = next(p for p in a if p.kind == "react")
    calls = [s for s in react.root.steps if isinstance(s, Call)]
    # A growing conversation: each prompt extends the previous one.
    for prev, nxt in itertools.pairwise(calls):
        assert nxt.blocks[: len(prev.blocks)] == prev.blocks
        assert nxt.tool is not None and nxt.wait_s > 0


def test_sim_prompts_have_exact_token_counts() -> None:
    call = Call(0.0, None, (1, 2, 3, 9), "ns", 2, 17, 5)
    text = Prompts("sim").render(call)
    assert count_tokens(text) == call.prompt_tokens == 4 * 64 + 17


@pytest.mark.skipif(not HAVE_TRACES, reason="the Claude Code traces are not next to the checkout")
def test_claude_code_traces_replay_as_jobs() -> None:
    jobs = make_workload("claude-code", 5, Arrivals(), traces=TraceOptions(limit=5))
    assert len(jobs) == 5
    first = jobs[0].root
    calls = [s for s in first.steps if isinstance(s, Call)]
    assert calls and calls[0].prompt_tokens > 10_000
    scaled = make_workload(
        "claude-code", 1, Arrivals(), traces=TraceOptions(token_scale=0.1, time_scale=0.5)
    )[0]
    s_calls = [s for s in scaled.root.steps if isinstance(s, Call)]
    assert s_calls[0].prompt_tokens == pytest.approx(calls[0].prompt_tokens * 0.1, rel=0.05)
    assert s_calls[1].wait_s == pytest.approx(calls[1].wait_s * 0.5)


def test_small_replay_is_deterministic_in_virtual_time() -> None:
    cfg = BenchConfig(workload="mixed", jobs=8, rate=0.5, seed=3, replicas=2)
    one, two = run_bench(cfg), run_bench(cfg)
    assert one.virtual_time
    # The same to float rounding (openai's one worker-thread call per client can reorder
    # callbacks that fall on the same virtual instant).
    for a, b in zip(one.clients, two.clients, strict=True):
        assert a.jct == pytest.approx(b.jct, rel=1e-9)
        assert a.call_latency == pytest.approx(b.call_latency, rel=1e-9)
        assert a.prefix_cache_hit_rate == b.prefix_cache_hit_rate
    by = {c.client: c for c in one.clients}
    assert all(c.failed == 0 and c.jobs == 8 for c in one.clients)
    # agentrt with round-robin sends the same calls to the same replicas as the plain
    # client: in virtual time its results are identical.
    assert by["plain"].jct == pytest.approx(by["agentrt:round-robin"].jct, rel=1e-9)
    # Session routing keeps each session's KV on one replica: more prefix-cache hits.
    assert by["agentrt:session"].prefix_cache_hit_rate > by["plain"].prefix_cache_hit_rate  # type: ignore[operator]
    # A job is never faster than alone on an idle cluster (up to float noise).
    for c in one.clients:
        assert c.stretch is not None and c.stretch["p50"] >= 0.999


def test_bad_bench_config_is_rejected() -> None:
    with pytest.raises(ValueError, match="workload"):
        run_bench(BenchConfig(workload="nope"))
    with pytest.raises(ValueError, match="client"):
        run_bench(BenchConfig(clients=("fast",)))
    with pytest.raises(ValueError, match="preset"):
        run_bench(BenchConfig(preset="tpu"))


def test_cli_bench_writes_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "bench",
            "--workload",
            "react",
            "--jobs",
            "4",
            "--replicas",
            "2",
            "--out",
            str(tmp_path),
            "--no-plots",
        ]
    )
    assert rc == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert [c["client"] for c in data["clients"]] == [
        "plain",
        "agentrt:round-robin",
        "agentrt:session",
    ]
    out = capsys.readouterr().out
    assert "agentrt:session" in out and "JCT" in out


def test_cli_reports_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--client", "bogus", "--jobs", "1"]) == 2
    assert "unknown client" in capsys.readouterr().err


def test_closed_loop_users_bound_concurrency() -> None:
    cfg = BenchConfig(
        workload="react",
        jobs=6,
        users=2,
        replicas=1,
        clients=("agentrt:session",),
        stretch=False,
    )
    (c,) = run_bench(cfg).clients
    rows = sorted(c.job_rows, key=lambda r: r["name"])
    assert c.jobs == 6 and c.failed == 0
    # Two users: at most two jobs in flight at any time.
    starts = sorted((r["start_s"], r["start_s"] + r["jct_s"]) for r in c.job_rows)
    for t, _ in starts:
        assert sum(1 for a, b in starts if a <= t < b) <= 2
    assert rows
    with pytest.raises(ValueError, match="users"):
        run_bench(BenchConfig(users=0))
