"""What every benchmark shares: the record of a run (what, command, commit, date), writing
a result, the run options (``--out``, ``--seeds``/``--seed``, ``--rounds``), repetitions in
interleaved order, quantiles and their bootstrap intervals.

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
from collections.abc import Iterable, Iterator, Sequence
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
    "intervals",
    "quantile",
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
    parser: argparse.ArgumentParser,
    *,
    out: str | None,
    seeds: int | None = None,
    seed: int | None = None,
    rounds: int | None = None,
    rounds_help: str = "repetitions (default %(default)s)",
) -> None:
    """The options every benchmark spells the same way, in one ``run`` group: ``--out``
    (default ``results/OUT``; ``out=""``: no default, the script picks one), and where
    the benchmark has them, ``--seeds N`` (seeds 0..N-1), ``--seed S`` (one seed) and
    ``--rounds N`` (repetitions, interleaved: :func:`interleaved`)."""
    group = parser.add_argument_group("run")
    if out is not None:
        default = RESULTS / out if out else None
        group.add_argument("--out", type=Path, default=default, help="default: %(default)s")
    if seeds is not None:
        group.add_argument(
            "--seeds", type=int, default=seeds, help="seeds 0..N-1 (default %(default)s)"
        )
    if seed is not None:
        group.add_argument("--seed", type=int, default=seed, help="default: %(default)s")
    if rounds is not None:
        group.add_argument("--rounds", type=int, default=rounds, help=rounds_help)


def seeds(n: int) -> range:
    """The seeds of ``--seeds n``: 0..n-1, the same in every benchmark."""
    return range(n)


def interleaved(
    rounds: int, variants: Sequence[T], *, abba: bool = False, seed: int = 0
) -> Iterator[tuple[int, T]]:
    """(round, variant) for ``rounds`` repetitions, so that a machine's drifting load
    falls on all the variants alike: each round in a fresh shuffle of the last round's
    order (``random.Random(seed)``), or with ``abba`` forwards on even rounds and
    backwards on odd ones."""
    order = list(variants)
    rng = random.Random(seed)
    for r in range(rounds):
        if abba:
            for v in order if r % 2 == 0 else order[::-1]:
                yield r, v
            continue
        rng.shuffle(order)
        for v in order:
            yield r, v


def quantile(values: Iterable[float], q: float, *, floor: bool = False) -> float:
    """The ``q`` quantile of ``values`` (in any order) by nearest rank: the
    ``ceil(q n)``-th smallest, NaN when empty; ``agentrt._stats.quantile``, the one that
    ``agentrt report``, the bench, the steady-state study and the tuner read with.
    ``floor``: the ``int(q n)``-th from 0 instead (the cost benchmarks' older convention,
    kept so that their figures do not move)."""
    # on first use: a cost benchmark times its imports
    from agentrt._stats import quantile as nearest_rank

    s = sorted(values)
    if floor and s:
        return s[min(len(s) - 1, int(q * len(s)))]
    return nearest_rank(s, q)


def intervals(
    values: Sequence[float], qs: Sequence[float], *, resamples: int = 1000, seed: int = 0
) -> dict[str, list[float]]:
    """Each quantile ``q`` of ``values`` as ``{"pQ": [point, lo, hi]}``: the point by
    :func:`quantile` and its 90% percentile-bootstrap interval over ``resamples``
    resamples (``agentrt._stats.bootstrap_interval``, the steady-state study's). A
    percentile of a few dozen jobs moves with one job: report this beside it."""
    if not values:
        raise ValueError("an interval needs at least one value")
    from agentrt._stats import bootstrap_interval

    return bootstrap_interval(values, qs, resamples, random.Random(seed))
