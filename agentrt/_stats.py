"""The one percentile and the one bootstrap interval that every figure agentrt prints is
read with: ``agentrt report``'s JCT and latency percentiles, the bench's summaries, the
steady-state study's intervals, the tuner's ranking, and the benchmark scripts (through
``benchmarks/_harness.py``).

A percentile is by **nearest rank**: the ``q`` quantile (``q`` in 0..1) of ``n`` values
is the ``ceil(q n)``-th smallest of them, the smallest for ``q = 0``, and NaN when there
are none. It is always one of the values, never between two: the p90 of ten jobs' JCTs is
the ninth shortest of them.

It needs the standard library only, so the benchmarks' harness can import it on first
use without bringing in the bench.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

__all__ = ["bootstrap_interval", "quantile", "rank"]


def rank(n: int, q: float) -> int:
    """Where the ``q`` quantile (``q`` in 0..1) of ``n >= 1`` sorted things stands, from 0:
    ``ceil(q n) - 1``, held to ``0..n-1`` (for picking a thing, such as the median job, by
    nearest rank)."""
    return min(n - 1, max(0, math.ceil(q * n) - 1))


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (``q`` in 0..1) of values sorted in ascending order, by nearest
    rank (see the module's doc); NaN when there are none. The caller sorts (once, for
    several quantiles of the same values)."""
    n = len(sorted_values)
    return sorted_values[rank(n, q)] if n else math.nan


def bootstrap_interval(
    values: Sequence[float], qs: Sequence[float], resamples: int, rng: random.Random
) -> dict[str, list[float]]:
    """Each quantile ``q`` of ``values`` (in any order) as ``{"pQ": [point, lo, hi]}``
    (``pQ``: ``q`` in percent, rounded): the point by :func:`quantile`, and its 90%
    percentile-bootstrap interval, the 5th and 95th percentiles of the quantile over
    ``resamples`` resamples of the values drawn with ``rng`` (the same ``rng`` state, the
    same interval). ``[nan, nan, nan]`` for each when there are no values."""
    s = sorted(values)
    if not s:
        return {f"p{round(q * 100)}": [math.nan] * 3 for q in qs}
    draws: list[list[float]] = [[] for _ in qs]
    n = len(s)
    for _ in range(resamples):
        r = sorted(rng.choices(s, k=n))
        for j, q in enumerate(qs):
            draws[j].append(quantile(r, q))
    out = {}
    for j, q in enumerate(qs):
        d = sorted(draws[j])
        out[f"p{round(q * 100)}"] = [quantile(s, q), quantile(d, 0.05), quantile(d, 0.95)]
    return out
