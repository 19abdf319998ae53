"""What every benchmark shares: the record of a run (what, command, commit, date), writing
a result, repetitions in interleaved order, seeds, and bootstrap intervals.

A benchmark script imports it as a sibling (``from _harness import write_result``), as it
does another benchmark: ``python benchmarks/NAME.py`` and ``python -m benchmarks SUITE``
both put this folder on ``sys.path``.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = ROOT / "results"

T = TypeVar("T")

__all__ = [
    "RESULTS",
    "ROOT",
    "add_run_args",
    "commit",
    "interleaved",
    "interval",
    "run_record",
    "seeds",
    "write_result",
]


def commit() -> dict[str, Any]:
    """The checkout's short commit, and whether ``agentrt/`` differs from it (what was
    measured); empty outside a git checkout."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "agentrt"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return {}
    return {"commit": head, "agentrt_modified": bool(dirty)} if head else {}


def run_record(what: str, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """What a result file carries about its run: ``what`` it measures (one line), the
    command that made it, the commit and the date (UTC)."""
    script = Path(sys.argv[0]).name if argv is None else ""
    args = list(sys.argv[1:] if argv is None else argv)
    return {
        "what": what,
        "command": " ".join([f"python benchmarks/{script}" if script else "", *args]).strip(),
        **commit(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def write_result(out: Path, result: Any, what: str | None, *, indent: int | None = 1) -> None:
    """Write ``result`` as JSON to ``out`` (its folder made), a dict with its run record
    under ``"run"`` (see :func:`run_record`; ``what``: the first line of the script's
    docstring is enough); a list is written as it is."""
    if isinstance(result, dict):
        line = (what or "").strip().splitlines()[0] if what else ""
        result = {"run": run_record(line), **{k: v for k, v in result.items() if k != "run"}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=indent) + "\n")
    print(f"wrote {out}", flush=True)


def add_run_args(
    parser: argparse.ArgumentParser, *, out: str | None, seeds: int | None = None
) -> None:
    """The options every benchmark spells the same way: ``--out`` (default
    ``results/OUT``) and, where the benchmark draws its workload, ``--seeds N``
    (seeds 0..N-1)."""
    if out is not None:
        parser.add_argument("--out", type=Path, default=RESULTS / out, help="default: %(default)s")
    if seeds is not None:
        parser.add_argument(
            "--seeds", type=int, default=seeds, help="seeds 0..N-1 (default %(default)s)"
        )


def seeds(n: int) -> range:
    """The seeds of ``--seeds n``: 0..n-1, the same in every benchmark."""
    return range(n)


def interleaved(rounds: int, variants: Sequence[T], *, seed: int = 0) -> Iterator[tuple[int, T]]:
    """(round, variant) for ``rounds`` repetitions, the variants in a fresh shuffled
    order each round, so that a machine's drifting load falls on all of them alike."""
    rng = random.Random(seed)
    for r in range(rounds):
        order = list(variants)
        rng.shuffle(order)
        for v in order:
            yield r, v


def interval(
    values: Sequence[float],
    stat: Callable[[Sequence[float]], float],
    *,
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """The percentile bootstrap interval of ``stat`` over ``values`` (``level`` of the
    resampled statistics between its ends). A percentile of a few dozen jobs moves with
    one job: report this beside it."""
    if not values:
        raise ValueError("an interval needs at least one value")
    rng = random.Random(seed)
    n = len(values)
    draws = sorted(stat([values[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    lo = draws[int((1 - level) / 2 * (resamples - 1))]
    hi = draws[int((1 + level) / 2 * (resamples - 1))]
    return lo, hi
