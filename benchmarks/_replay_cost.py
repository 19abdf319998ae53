"""What an embedded-cluster replay costs per simulated call: CPU time and, where valgrind
is installed, instructions (the guard against the next regression).

A benchmark script, not a test. It replays fixed slices in virtual time through agentrt
(``agentrt:session``, ``--api http``, no stretch runs), each in this process after the
imports, and records per slice:

- ``cpu_per_call_ms``: the replay's CPU time (user + system, ``process_time``: building
  the jobs, the clusters, every call through agentrt's transport and the engines, the
  summary) over its simulated calls, the median of ``--repeat`` runs;
- ``reference_cpu_s``: a fixed pure-Python computation (JSON, dicts, lists, sorting: the
  kind of work a replay does) timed in the same process before and after each run, the
  least of those times (the one least disturbed by other work on the machine);
- ``ratio``: the replay's CPU per call over the reference's CPU. It moves with the code,
  not with the machine: a faster or a busier machine speeds or slows both;
- ``instructions_per_call`` (with valgrind): ``valgrind --tool=callgrind`` counts the
  instructions of a child process that runs the slice, less those of one that stops
  before the replay (imports and the workload), over the calls. Deterministic to a few
  parts in a thousand; slow (50-100x), so only on the ``guard`` slice.

Slices: ``guard``, 8 ``coding`` jobs (no traces needed: the slice the test suite's check,
``tests/bench/test_replay_cost.py``, runs and compares with the ratio recorded here), and
``claude-code``, the first 40 Claude Code traces as in docs/benchmarks.md's scale replay
(where the traces are next to the checkout).

    python -m benchmarks twin replay-cost            # results/replay_cost.json
    python -m benchmarks twin replay-cost --no-instructions --repeat 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import time
from datetime import UTC, datetime
from typing import Any

from agentrt.bench import BenchConfig, TraceOptions, run_bench

from ._harness import ROOT, add_run_args, again, commit, write_result


def slices() -> dict[str, BenchConfig]:
    """The fixed slices, by name (``claude-code`` only where the traces are)."""
    out = {
        "guard": BenchConfig(
            workload="coding",
            jobs=8,
            rate=0.2,
            seed=0,
            replicas=8,
            gpu_blocks=16_384,
            clients=("agentrt:session",),
            stretch=False,
            api="http",
        )
    }
    if TraceOptions().folder().is_dir():
        out["claude-code"] = BenchConfig(
            workload="claude-code",
            jobs=40,
            rate=0.05,
            seed=0,
            replicas=8,
            clients=("agentrt:session",),
            stretch=False,
            api="http",
            traces=TraceOptions(directory=TraceOptions().folder(), token_scale=0.25),
        )
    return out


def reference() -> float:
    """CPU seconds of a fixed pure-Python computation (about 0.1-0.3 s here)."""
    start = time.process_time()
    rng = random.Random(0)
    total = 0
    for i in range(6_000):
        call = {
            "id": f"call-{i}",
            "blocks": [rng.randrange(10_000) for _ in range(24)],
            "meta": {"job": i // 40, "turn": i % 40, "stream": i % 3 == 0},
        }
        back = json.loads(json.dumps(call))
        blocks = sorted(back["blocks"])
        seen: dict[int, int] = {}
        for b in blocks:
            seen[b] = seen.get(b, 0) + 1
        total += len(seen) + blocks[0] + len(back["id"])
    assert total > 0
    return time.process_time() - start


def measure(cfg: BenchConfig, repeat: int = 1) -> dict[str, Any]:
    """The slice's CPU per call (the median of ``repeat`` runs) and its ratio to
    :func:`reference` (the least of its times, taken before and after each run)."""
    costs: list[float] = []
    refs: list[float] = []
    calls = 0
    for _ in range(repeat):
        refs.append(reference())
        start = time.process_time()
        result = run_bench(cfg)
        costs.append(time.process_time() - start)
        refs.append(reference())
        calls = result.calls
        assert all(c.failed == 0 for c in result.clients), "a replay failed jobs"
    cpu = statistics.median(costs)
    ref = min(refs)
    return {
        "calls": calls,
        "cpu_s": cpu,
        "cpu_s_runs": costs,
        "cpu_per_call_ms": 1000 * cpu / calls,
        "reference_cpu_s": ref,
        "reference_cpu_s_runs": refs,
        "ratio": (cpu / calls) / ref,
    }


def _child(name: str, replay: bool) -> None:
    cfg = slices()[name]
    if replay:
        run_bench(cfg)
    else:  # everything but the replay: imports, the workload
        from agentrt.bench import Arrivals, make_workload

        make_workload(cfg.workload, cfg.jobs, Arrivals(cfg.rate, cfg.seed), seed=cfg.seed)


def instructions(name: str, calls: int) -> float:
    """Instructions per call of slice ``name`` under callgrind (replay minus no replay)."""
    counts = []
    for replay in (True, False):
        cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
        cmd += again("--child", name, *([] if replay else ["--no-replay"]))
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
        found = re.search(r"Collected : (\d+)", out.stderr)
        if out.returncode != 0 or found is None:
            raise RuntimeError(f"valgrind failed:\n{out.stderr[-2000:]}")
        counts.append(int(found.group(1)))
    return (counts[0] - counts[1]) / calls


def _commit() -> str | None:
    return commit().get("commit") or None


def add_args(ap: argparse.ArgumentParser) -> None:
    add_run_args(ap, out="replay_cost.json")
    ap.add_argument("--repeat", type=int, default=3, help="runs per slice (median)")
    ap.add_argument("--only", nargs="*", help="slices to run (default: all)")
    ap.add_argument("--no-instructions", action="store_true", help="skip valgrind")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--no-replay", action="store_true", help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> None:
    if args.child:
        _child(args.child, not args.no_replay)
        return
    rows: dict[str, Any] = {}
    for name, cfg in slices().items():
        if args.only and name not in args.only:
            continue
        row = measure(cfg, args.repeat)
        if name == "guard" and not args.no_instructions and shutil.which("valgrind"):
            row["instructions_per_call"] = instructions(name, row["calls"])
        rows[name] = row
        extra = (
            f", {row['instructions_per_call'] / 1e6:.2f} M instructions"
            if "instructions_per_call" in row
            else ""
        )
        print(
            f"{name}: {row['calls']} calls, {row['cpu_per_call_ms']:.3f} ms CPU per call "
            f"(ratio to the reference {row['ratio']:.4f}){extra}"
        )
    record = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": _commit(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
        "slices": rows,
    }
    write_result(args.out, record, __doc__)
    print(f"results: {args.out}")
