"""The steady-state benchmark (agentrt/bench/_steady.py) on a quick study: its structure
and its sanity (intervals hold their point estimates, warm-up and drain are left out,
closed-loop throughput grows with N at light load, the open loop runs at fractions of the
measured capacity), and the measurement rules on hand-made jobs."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from agentrt.bench._drivers import CallResult, JobResult
from agentrt.bench._steady import SteadyConfig, format_table, measure, run_steady, save, steady_jobs
from agentrt.bench._workloads import TraceOptions, default_trace_dir

ROOT = Path(__file__).resolve().parents[2]


def _job(i: int, start: float, jct: float, endpoint: str = "a") -> JobResult:
    calls = [
        CallResult(
            1.0,
            0.1,
            start_s=0.0,
            session_id="s",
            endpoint=endpoint,
            prompt_tokens=100,
            cached_tokens=60,
        ),
        CallResult(
            1.0,
            0.1,
            start_s=1.0,
            session_id="s",
            endpoint="b",
            prompt_tokens=200,
            cached_tokens=150,
        ),
    ]
    return JobResult(f"j{i}", "coding", 0.0, start, jct, "ok", calls)


def test_measure_leaves_out_warmup_and_drain() -> None:
    jobs = [_job(i, float(i), 10.0 + i % 7) for i in range(40)]
    m = measure(jobs, users=4, warmup_share=0.1, alone={j.name: 10.0 for j in jobs}, bootstrap=200)
    # warm-up: max(ceil(0.1 * 40), 4) = 4 first starts; drain: the last 4 starts
    assert (m["warmup_jobs"], m["drain_jobs"], m["measured_jobs"]) == (4, 4, 32)
    assert m["window_s"] == [4.0, 35.0]
    measured = set(m["measured"])
    assert "j0" not in measured and "j3" not in measured and "j39" not in measured
    assert "j4" in measured and "j35" in measured
    # the jobs ending inside the window over its length
    ends = sum(1 for j in jobs if 4.0 < j.start_s + j.jct_s <= 35.0)
    assert m["throughput"] == pytest.approx(ends / 31.0)
    for key in ("p50", "p90", "p99"):
        point, lo, hi = m["jct"][key]
        assert lo <= point <= hi
    assert m["stretch"]["p90"][0] == pytest.approx(sorted(j.jct_s for j in jobs[4:36])[28] / 10)
    assert (m["prompt_tokens"], m["uncached_tokens"]) == (32 * 300, 32 * 90)
    assert m["moves"] == 32 and m["move_rate"] == 1.0
    open_loop = measure(jobs, users=None, warmup_share=0.1, bootstrap=50)
    assert (open_loop["warmup_jobs"], open_loop["drain_jobs"]) == (4, 0)
    with pytest.raises(ValueError, match="too few jobs"):
        measure(jobs[:8], users=4, warmup_share=0.1)


def test_stretch_by_job_size() -> None:
    """The shortest and the longest third of the measured jobs (by their JCT alone) have
    their own stretch: short jobs beside long ones are the ones hurt most (issue 34)."""
    jobs = [_job(i, float(i), 100.0) for i in range(40)]
    # alone: jobs 4..35 are measured; the short ones (alone 10 s) stretch 10x, the long
    # ones (alone 90-100 s) about 1x
    alone = {j.name: 10.0 if i % 3 == 0 else 90.0 + i % 10 for i, j in enumerate(jobs)}
    m = measure(jobs, users=4, warmup_share=0.1, alone=alone, bootstrap=100)
    measured = [int(n[1:]) for n in m["measured"]]
    third = len(measured) // 3
    assert third == 10
    shortest = sorted(measured, key=lambda i: alone[f"j{i}"])[:third]
    assert all(alone[f"j{i}"] == 10.0 for i in shortest)
    assert m["stretch_short"]["p50"][0] == m["stretch_short"]["p90"][0] == 10.0
    assert m["stretch_long"]["p90"][0] == pytest.approx(100.0 / 90.0, rel=0.12)
    assert m["stretch_long"]["p90"][0] < 1.2 < m["stretch"]["p90"][0]
    few = measure(jobs[:9], users=2, warmup_share=0.1, alone=alone, bootstrap=50)
    assert "stretch" in few and "stretch_short" not in few  # 5 measured: thirds of 1


def test_quick_study(tmp_path: Path) -> None:
    cfg = SteadyConfig(
        workload="coding",
        jobs=24,
        users=(1, 2, 4),
        loads=(0.5, 1.0),
        kv=("ample",),
        replicas=2,
        clients=("agentrt:defaults",),
        bootstrap=100,
    )
    lines: list[str] = []
    result = run_steady(cfg, workers=1, progress=lines.append)
    assert any(line.endswith(")") and "alone" in line for line in lines)
    rows = result["rows"]
    closed = sorted((r for r in rows if r["mode"] == "closed"), key=lambda r: r["users"])
    opened = [r for r in rows if r["mode"] == "open"]
    assert [r["users"] for r in closed] == [1, 2, 4]
    assert [r["load"] for r in opened] == [0.5, 1.0]
    for r in rows:
        assert r["client"] == "agentrt:defaults" and r["failed"] == 0
        assert r["measured_jobs"] + r["warmup_jobs"] + r["drain_jobs"] == 24
        assert r["warmup_jobs"] >= math.ceil(0.1 * 24)
        for triple in (r["jct"]["p50"], r["jct"]["p90"], r["jct"]["p99"], r["stretch"]["p90"]):
            assert triple[1] <= triple[0] <= triple[2]
        assert r["stretch"]["p50"][0] >= 0.99  # no job beats itself alone
        assert 0 < r["cache_hit_rate"] < 1 and r["uncached_tokens"] > 0
        assert r["engine_prefill_tokens"] > 0
    # light load: more agents finish more jobs per second
    x = [r["throughput"] for r in closed]
    assert x[0] < x[1] < x[2]
    cap = result["capacity"]["ample"]
    assert cap["jobs_per_s"] == pytest.approx(cap["clients"]["agentrt:defaults"]["capacity"])
    assert [r["rate"] for r in opened] == pytest.approx(
        [0.5 * cap["jobs_per_s"], cap["jobs_per_s"]]
    )
    assert opened[0]["throughput"] == pytest.approx(opened[0]["rate"], rel=0.5)
    text = format_table(result)
    assert "capacity (ample)" in text and text.count("agentrt:defaults") >= 5
    assert "warning: jobs failed" not in text
    # A point whose jobs failed (contexts larger than the KV, say) is said, not hidden.
    result["rows"][0] = {**result["rows"][0], "failed": 7}
    assert "warning: jobs failed at 1 of" in format_table(result)
    path = save(result, tmp_path / "steady.json")
    assert json.loads(path.read_text())["config"]["jobs"] == 24


def test_config_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="below jobs"):
        SteadyConfig(jobs=10, users=(4, 10)).check()
    with pytest.raises(ValueError, match="kv"):
        SteadyConfig(kv=("tiny",)).check()  # type: ignore[arg-type]
    assert SteadyConfig().gpu_blocks("pressure") == 26_624 // 4
    assert SteadyConfig(pressure_blocks=999).gpu_blocks("pressure") == 999


@pytest.mark.skipif(not default_trace_dir().is_dir(), reason="no Claude Code traces")
def test_claude_code_jobs_are_resampled_copies() -> None:
    cfg = SteadyConfig(jobs=30, traces=TraceOptions(max_context=200_000, limit=12))
    a, b = steady_jobs(cfg), steady_jobs(cfg)
    assert [j.root for j in a] == [j.root for j in b]  # seeded
    spaces = [j.root.steps[0].namespace for j in a]  # type: ignore[union-attr]
    assert len(set(spaces)) == 30  # every copy its own conversation
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+", ns) for ns in spaces)  # the simulator's rule
    assert len({s.split(".copy")[0] for s in spaces}) <= 12  # drawn from the first 12 that fit


def test_script_is_thin_and_has_a_quick_size() -> None:
    from benchmarks._suites import find

    suite = find("alternatives")
    (steady,) = [p for p in suite.parts if p.name == "steady"]
    args = suite.parser(steady).parse_args(
        ["steady", "--quick", "--clients", "plain", "plain>llm-d"]
    )
    cfg = steady.load().config(args)
    assert (cfg.workload, cfg.clients) == ("coding", ("plain", "plain>llm-d"))
    cfg.check()
