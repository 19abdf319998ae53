"""The embedded cluster's replays give the same results as before its speed-ups (issue 18).

``replay_golden.json`` holds every client's full summary (JCTs per job, latencies, cache
hits, KV occupancy samples, engine counters) of four small fixed-seed replays, recorded
before the replay was made faster. Each test replays one again and compares every figure
exactly: a speed-up must not move a single float. The one-client slices (``claude-code``,
``longtail``) are commit c39da34's figures; in the two-client ones, the second client's
replay starts at virtual time 0 (each client's replay runs in its own event loop since the
parallel replays of issue 18), where c39da34 started it at the first client's end, which
moves its figures in the last digits only.

The figures were recorded with the embedded engine streaming 16 tokens a chunk; the bench
now streams 256 (fewer events per call, the same engine steps), which moves streamed
figures in their last one or two digits (summed in another order). The exact comparison
runs at the recorded 16, and :func:`test_the_default_chunking_moves_only_the_last_digits`
checks the default against the same file to a relative 1e-9 (but the figures sampled at
engine events, which fewer chunks sample less often).

Regenerate the file only for a change that is meant to change results
(``python tests/bench/test_replay_golden.py > tests/bench/replay_golden.json``), and say
why in the commit.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Final

import pytest

from agentrt.bench import BenchConfig, BenchResult, TraceOptions, run_bench
from agentrt.bench._traces import sample_dir
from agentrt.bench._workloads import default_trace_dir

GOLDEN = Path(__file__).with_name("replay_golden.json")

CONFIGS: dict[str, dict[str, Any]] = {
    # The demo's workload and clients, smaller: the openai client's path.
    "coding": {
        "workload": "coding",
        "jobs": 8,
        "rate": 0.2,
        "seed": 0,
        "replicas": 4,
        "gpu_blocks": 16384,
        "clients": ("plain", "agentrt:session"),
        "stretch": False,
    },
    # Stretch (every job alone), a scheduling policy, engine priorities.
    "mixed": {
        "workload": "mixed",
        "jobs": 10,
        "rate": 0.5,
        "seed": 3,
        "replicas": 2,
        "clients": ("plain", "agentrt:round-robin", "agentrt:plas+session,priority=on"),
        "stretch": True,
    },
    # Tool waits offloaded to a host tier, a cache that overflows.
    "longtail": {
        "workload": "react-longtail",
        "jobs": 8,
        "rate": 0.5,
        "seed": 1,
        "replicas": 2,
        "tool_wait_policy": "offload",
        "host_blocks": 4096,
        "gpu_blocks": 2048,
        "clients": ("agentrt:session",),
        "stretch": False,
    },
    # The scale replay's path (Claude Code traces, --api http), hours of think time.
    "claude-code": {
        "workload": "claude-code",
        "jobs": 6,
        "rate": 0.05,
        "seed": 0,
        "replicas": 4,
        "api": "http",
        "clients": ("agentrt:session",),
        "stretch": False,
        "traces": TraceOptions(token_scale=0.25),
    },
}


RECORDED_STREAM_INTERVAL = 16
"""Tokens per streamed chunk when the file was recorded (the bench's default then)."""


def config(name: str, stream_interval: int = RECORDED_STREAM_INTERVAL) -> BenchConfig:
    fields = dict(CONFIGS[name])
    if "traces" in fields:
        fields["traces"] = TraceOptions(directory=default_trace_dir(), token_scale=0.25)
    return BenchConfig(**fields, stream_interval=stream_interval)


def canonical(result: BenchResult) -> dict[str, Any]:
    """What must not change: the call count and every client's summary (its journal's
    path aside, and the router's view of the KV sampled beside it: bench/_view.py, a
    measurement of the replay added since, which moves nothing in it, as are load
    control's counters; so is each job
    row's ``error``, the failed job's reason, and the call latency's p90, added since
    too)."""
    clients = []
    for c in result.clients:
        row = asdict(c)
        row.pop("journal", None)
        row.pop("kv_view", None)
        row.pop("load_control", None)
        row["call_latency"].pop("p90", None)
        for job in row["job_rows"]:
            job.pop("error", None)
        clients.append(row)
    return {"calls": result.calls, "clients": clients}


def _same(a: Any, b: Any, where: str, rel: float = 0.0) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where}: keys {sorted(a)} != {sorted(b)}"]
        return [d for k in a for d in _same(a[k], b[k], f"{where}.{k}", rel)]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items != {len(b)}"]
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in _same(x, y, f"{where}[{i}]", rel)
        ]
    if isinstance(a, float) and isinstance(b, float):
        if (math.isnan(a) and math.isnan(b)) or (rel and math.isclose(a, b, rel_tol=rel)):
            return []
    return [] if a == b and type(a) is type(b) else [f"{where}: {a!r} != {b!r}"]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_replay_matches_the_recorded_results(name: str) -> None:
    if name == "claude-code" and default_trace_dir().resolve() == sample_dir():
        pytest.skip("the full Claude Code traces are not here (only the package's sample)")
    golden = json.loads(GOLDEN.read_text())[name]
    # Through JSON, as recorded: tuples become lists, floats round-trip exactly.
    now = json.loads(json.dumps(canonical(run_bench(config(name)))))
    diffs = _same(now, golden, name)
    assert not diffs, f"{len(diffs)} figures moved, first: " + "; ".join(diffs[:5])


SAMPLED: Final = ("kv", "utilization")
"""Figures sampled at engine events (KV occupancy, busy share): fewer chunks, fewer samples."""


def test_the_default_chunking_moves_only_the_last_digits() -> None:
    interval = BenchConfig().stream_interval
    assert interval != RECORDED_STREAM_INTERVAL  # else this test is moot
    golden = json.loads(GOLDEN.read_text())["coding"]
    now = json.loads(json.dumps(canonical(run_bench(config("coding", interval)))))
    for a, b in zip(now["clients"], golden["clients"], strict=True):
        for key in SAMPLED:
            a.pop(key), b.pop(key)
    diffs = _same(now, golden, "coding", rel=1e-9)
    assert not diffs, f"{len(diffs)} figures moved, first: " + "; ".join(diffs[:5])


def test_the_comparison_sees_a_moved_float() -> None:
    golden = json.loads(GOLDEN.read_text())["longtail"]
    moved = json.loads(json.dumps(golden))
    moved["clients"][0]["jct"]["mean"] = math.nextafter(golden["clients"][0]["jct"]["mean"], 0)
    assert _same(golden, golden, "g") == []
    assert len(_same(moved, golden, "g")) == 1
    assert _same(moved, golden, "g", rel=1e-9) == []
    moved["clients"][0]["jct"]["mean"] *= 1 + 1e-6
    assert len(_same(moved, golden, "g", rel=1e-9)) == 1


if __name__ == "__main__":
    out = {name: canonical(run_bench(config(name))) for name in sorted(CONFIGS)}
    sys.stdout.write(json.dumps(out, indent=1, sort_keys=True) + "\n")
