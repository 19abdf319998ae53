"""What every benchmark shares: the record of a run (what, command, commit, date), writing
a result, the run options (``--out``, ``--seeds``/``--seed``, ``--rounds``, ``--workers``),
repetitions in interleaved order, the entry's own command (for the worker processes a
benchmark starts), and the one percentile and bootstrap interval.

A benchmark module imports it relatively (``from ._harness import write_result``); the
package runs as ``python -m benchmarks SUITE [PART] [OPTIONS]`` (``_suites.py``).

Every percentile a benchmark reports is :func:`quantile` (nearest rank) and every interval
:func:`intervals`: the ones ``agentrt report``, the bench, the steady-state study and the
tuner read with, which the package exports as ``agentrt.bench.quantile`` and
``agentrt.bench.bootstrap_interval``. This module is the benchmarks' one door to them.
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

ENTRY: list[str] = []
"""The suite (and part) this run is, as ``python -m benchmarks`` picked it."""

__all__ = [
    "RESULTS",
    "ROOT",
    "add_run_args",
    "again",
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
    args = list(sys.argv[1:] if argv is None else argv)
    head = "python -m benchmarks" if argv is None and ENTRY else ""
    if head:  # the part named even where the suite's default picked it
        rest = args[1:]
        args = [*ENTRY, *(rest[1:] if rest[:1] == ENTRY[1:2] else rest)]
    return {
        "what": what,
        "command": " ".join([head, *args]).strip(),
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
    workers: str | None = None,
) -> None:
    """The options every benchmark spells the same way, in one ``run`` group: ``--out``
    (default ``results/OUT``; ``out=""``: no default, the script picks one), and where
    the benchmark has them, ``--seeds N`` (seeds 0..N-1), ``--seed S`` (one seed),
    ``--rounds N`` (repetitions, interleaved: :func:`interleaved`) and ``--workers``
    (processes for the replays: ``auto``, ``N`` or ``ray``, as ``agentrt bench``)."""
    group = parser.add_argument_group("run")
    if out is not None:
        default = RESULTS / out if out else None
        shown = f"results/{out}" if out else "the benchmark's, by its options"
        group.add_argument("--out", type=Path, default=default, help=f"default: {shown}")
    if seeds is not None:
        group.add_argument(
            "--seeds", type=int, default=seeds, help="seeds 0..N-1 (default %(default)s)"
        )
    if seed is not None:
        group.add_argument("--seed", type=int, default=seed, help="default: %(default)s")
    if rounds is not None:
        group.add_argument("--rounds", type=int, default=rounds, help=rounds_help)
    if workers is not None:
        from agentrt.bench import parse_workers

        group.add_argument(
            "--workers",
            type=parse_workers,
            default=workers,
            help="processes for the replays: auto (a core each), N or ray (default %(default)s)",
        )


def again(*args: str) -> list[str]:
    """The command that runs this entry again with ``args`` (in a worker process, from
    :data:`ROOT`): ``python -m benchmarks SUITE [PART] ARGS``."""
    return [sys.executable, "-m", "benchmarks", *ENTRY, *args]


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


def quantile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile (``q`` in 0..1) of ``values``, in any order, by nearest rank:
    the ``ceil(q n)``-th smallest, NaN when empty (``agentrt.bench.quantile``)."""
    # on first use: a cost benchmark times its imports
    from agentrt.bench import quantile as nearest_rank

    return nearest_rank(sorted(values), q)


def intervals(
    values: Sequence[float], qs: Sequence[float], *, resamples: int = 1000, seed: int = 0
) -> dict[str, list[float]]:
    """Each quantile ``q`` of ``values`` as ``{"pQ": [point, lo, hi]}``: the point by
    :func:`quantile` and its 90% percentile-bootstrap interval over ``resamples``
    resamples (``agentrt.bench.bootstrap_interval``, the steady-state study's). A
    percentile of a few dozen jobs moves with one job: report this beside it."""
    if not values:
        raise ValueError("an interval needs at least one value")
    from agentrt.bench import bootstrap_interval

    return bootstrap_interval(values, qs, resamples, random.Random(seed))


def plain_clients(urls: Sequence[str], http: Any) -> list[Any]:
    """The plain baseline: one bare ``openai.AsyncOpenAI`` per replica URL, on the caller's
    (legacy httpx) client, no retries: what agent code without agentrt uses."""
    import openai

    return [
        openai.AsyncOpenAI(
            base_url=u,
            api_key="x",
            # legacy httpx: openai 3.x types http_client as httpx2's, and accepts it
            http_client=http,  # type: ignore[arg-type,unused-ignore]
            max_retries=0,
        )
        for u in urls
    ]
