"""The KV-policy study's pieces: declaration modes, the long-tailed workload, KV stats."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from agentrt.bench import Arrivals, BenchConfig, Call, ClientSpec, make_workload, run_bench
from agentrt.sim._engine import Engine


def _calls(plan: Any) -> list[Call]:
    return [s for s in plan.root.steps if isinstance(s, Call)]


def test_longtail_workload_is_seeded_and_heavy_tailed() -> None:
    a = make_workload("react-longtail", 200, Arrivals(rate=0.5, seed=4), seed=4)
    assert a == make_workload("react-longtail", 200, Arrivals(rate=0.5, seed=4), seed=4)
    assert a != make_workload("react-longtail", 200, Arrivals(rate=0.5, seed=5), seed=5)
    waits = sorted(c.wait_s for p in a for c in _calls(p) if c.tool)
    median = statistics.median(waits)
    p99 = waits[int(0.99 * len(waits))]
    assert median < 5.0  # most waits take seconds ...
    assert p99 > 120.0  # ... a few take minutes
    assert statistics.fmean(waits) > 3 * median
    tools = {c.tool for p in a for c in _calls(p) if c.tool}
    assert len(tools) == 5
    # Each tool has its own scale: learning per tool matters.
    by_tool: dict[str, list[float]] = defaultdict(list)
    for p in a:
        for c in _calls(p):
            if c.tool:
                by_tool[c.tool].append(c.wait_s)
    medians = sorted(statistics.median(v) for v in by_tool.values())
    assert medians[-1] > 50 * medians[0]
    # Large, growing prompts.
    last = [_calls(p)[-1].prompt_tokens for p in a]
    assert statistics.fmean(last) > 10_000


def _record_submits(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, float | None]]:
    seen: list[tuple[Any, float | None]] = []
    submit = Engine.submit

    def recording(self: Engine, *args: Any, **kwargs: Any) -> Any:
        seen.append((kwargs.get("session"), kwargs.get("idle_expected")))
        return submit(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "submit", recording)
    return seen


def _run(declare: str, jobs: int = 1, **kw: Any) -> Any:
    cfg = BenchConfig(
        workload="react-longtail",
        jobs=jobs,
        rate=None,
        seed=7,
        replicas=1,
        clients=[f"agentrt:session,declare={declare}"],
        stretch=False,
        api="http",
        **kw,
    )
    return run_bench(cfg)


@pytest.mark.parametrize("api", ["http", "openai"])
def test_oracle_declares_the_exact_next_wait(monkeypatch: pytest.MonkeyPatch, api: str) -> None:
    seen = _record_submits(monkeypatch)
    cfg = BenchConfig(
        workload="react-longtail",
        jobs=1,
        seed=7,
        replicas=1,
        clients=["agentrt:session,declare=oracle"],
        stretch=False,
        api=api,  # type: ignore[arg-type]
    )
    run_bench(cfg)
    plan = make_workload("react-longtail", 1, Arrivals(), seed=7)[0]
    calls = _calls(plan)
    expected = [nxt.wait_s for nxt in calls[1:]] + [None]
    assert len(seen) == len(calls)
    for (_, got), want in zip(seen, expected, strict=True):
        if want is None:
            assert got is None
        else:
            assert got == pytest.approx(want, rel=1e-3, abs=1e-3)


def test_none_declares_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _record_submits(monkeypatch)
    _run("none", jobs=3)
    assert len(seen) > 10
    assert all(idle is None for _, idle in seen)


def test_learned_declares_after_the_first_observations(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _record_submits(monkeypatch)
    _run("learned", jobs=3)
    by_session: dict[Any, list[float | None]] = defaultdict(list)
    for session, idle in seen:
        by_session[session].append(idle)
    assert len(by_session) == 3
    for idles in by_session.values():
        assert idles[0] is None  # nothing observed before a session's first call
        assert any(i is not None and i > 0 for i in idles[1:])


def test_kv_occupancy_and_resumed_hits_under_load() -> None:
    result = _run("learned", jobs=6, gpu_blocks=4096, host_blocks=8192, tool_wait_policy="offload")
    (c,) = result.clients
    assert c.failed == 0
    kv = c.kv
    assert kv is not None
    assert 0.0 < kv["occupancy_mean"] <= kv["occupancy_peak"] <= 1.0
    assert 0.0 < kv["cached_mean"] <= 1.0
    assert kv["gpu_blocks"] == 4096 and kv["host_blocks"] == 8192
    assert kv["offloaded_blocks"] > 0
    assert c.resumed_hit_rate is not None and 0.0 < c.resumed_hit_rate <= 1.0
    assert c.waits is not None and c.waits["count"] > 0
    assert result.config["tool_wait_policy"] == "offload"


def test_declare_option_and_engine_config() -> None:
    assert ClientSpec.parse("agentrt:session,declare=oracle").declare == "oracle"
    assert ClientSpec.parse("agentrt:session").declare == "learned"
    with pytest.raises(ValueError, match="declare must be one of"):
        ClientSpec.parse("agentrt:session,declare=psychic")
    cfg = BenchConfig(tool_wait_policy="drop", gpu_blocks=1000, host_blocks=10)
    engine = cfg.engine_config()
    assert (engine.tool_wait_policy, engine.num_gpu_blocks, engine.num_host_blocks) == (
        "drop",
        1000,
        10,
    )
    with pytest.raises(ValueError, match="tool_wait_policy"):
        BenchConfig(tool_wait_policy="hoard").engine_config()


def test_cli_passes_the_engine_options(tmp_path: Path) -> None:
    from agentrt.cli import main

    rc = main(
        [
            "bench",
            "--workload",
            "react-longtail",
            "--jobs",
            "2",
            "--replicas",
            "1",
            "--client",
            "agentrt:session,declare=oracle",
            "--tool-wait-policy",
            "offload",
            "--gpu-blocks",
            "4096",
            "--host-blocks",
            "8192",
            "--no-stretch",
            "--no-plots",
            "--no-journal",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["config"]["tool_wait_policy"] == "offload"
    assert data["clients"][0]["kv"]["gpu_blocks"] == 4096
