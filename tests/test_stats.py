"""The one percentile and bootstrap interval (agentrt/_stats.py): nearest rank at its
edges, the steady-state study's intervals to the last digit, and no second percentile
anywhere in the package or the benchmarks."""

from __future__ import annotations

import ast
import math
import random
import re
from pathlib import Path

import pytest

from agentrt._stats import bootstrap_interval, quantile, rank

ROOT = Path(__file__).resolve().parents[1]


def test_quantile_is_the_nearest_rank() -> None:
    ten = [float(i) for i in range(1, 11)]
    # the ceil(q n)-th smallest: p50 of 1..10 is 5, p90 is 9, p91 and p99 are 10
    assert [quantile(ten, q) for q in (0.5, 0.9, 0.91, 0.99)] == [5.0, 9.0, 10.0, 10.0]
    assert quantile([1.0, 2.0, 3.0, 4.0, 100.0], 0.5) == 3.0  # never between two values
    assert quantile([1.0, 2.0], 0.5) == 1.0  # not the interpolated 1.5
    assert rank(10, 0.9) == 8 and rank(1, 0.5) == 0


def test_quantile_at_its_edges() -> None:
    assert math.isnan(quantile([], 0.5))
    assert math.isnan(quantile([], 0.0)) and math.isnan(quantile([], 1.0))
    for q in (0.0, 0.01, 0.5, 0.99, 1.0):
        assert quantile([7.0], q) == 7.0
    values = [1.0, 2.0, 3.0]
    assert quantile(values, 0.0) == 1.0  # the smallest, not the index -1
    assert quantile(values, 1.0) == 3.0
    assert rank(3, 0.0) == 0 and rank(3, 1.0) == 2


def test_the_bootstrap_repeats_for_a_seed() -> None:
    values = [(i * i) % 17 + i / 10 for i in range(23)]
    # The steady-state study's figures before the one module (its former ``_bootstrap``,
    # one rng across calls), to the last digit.
    rng = random.Random(0)
    assert bootstrap_interval(values, (0.5, 0.9), 200, rng) == {
        "p50": [9.2, 5.5, 11.0],
        "p90": [16.4, 13.9, 18.1],
    }
    assert bootstrap_interval(values, (0.99,), 50, rng) == {"p99": [18.1, 16.4, 18.1]}
    # The same seed, the same interval; the values' order does not matter.
    again = bootstrap_interval(values[::-1], (0.5, 0.9), 200, random.Random(0))
    assert again == bootstrap_interval(values, (0.5, 0.9), 200, random.Random(0))
    other = bootstrap_interval(values, (0.5, 0.9), 200, random.Random(1))
    assert other != again
    for point, lo, hi in other.values():
        assert lo <= point <= hi
    assert other["p50"][0] == quantile(sorted(values), 0.5)


def test_the_bootstrap_of_nothing_is_nan() -> None:
    out = bootstrap_interval([], (0.5, 0.9), 100, random.Random(0))
    assert set(out) == {"p50", "p90"}
    assert all(math.isnan(x) for v in out.values() for x in v)


FORMER = {
    "agentrt/report/_stats.py": "percentile",
    "agentrt/bench/_runner.py": "_pct",
    "agentrt/bench/_steady.py": ("_q", "_bootstrap"),
    "agentrt/tune/_search.py": "_pct",
    "benchmarks/_real_kv.py": "_pct",
    "benchmarks/_fleet_real.py": "_quantile",
}
"""The copies the one module replaced (a percentile written five times, and one
interpolated under the same name)."""

SECOND = re.compile(
    r"ceil\(\s*(q|\d*\.\d+)\s*\*"  # a nearest rank written again: ceil(q * n), ceil(0.5 * n)
    r"|statistics\.quantiles\(|\bpercentile\("  # or another statistic under the same name
)


def _sources() -> list[Path]:
    files = [*(ROOT / "agentrt").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py")]
    return [p for p in files if p != ROOT / "agentrt" / "_stats.py"]


@pytest.mark.parametrize("path", sorted(FORMER))
def test_the_former_copies_are_gone(path: str) -> None:
    names = FORMER[path]
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert not defined & ({names} if isinstance(names, str) else set(names))


def test_no_second_percentile_in_the_package_or_the_benchmarks() -> None:
    # Every percentile is agentrt/_stats.py's (the benchmarks' through _harness.quantile).
    found = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for path in _sources()
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if SECOND.search(line) and not line.lstrip().startswith("#")
    ]
    assert found == []
    # The check sees one when there is one.
    assert SECOND.search("k = min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))")
    assert SECOND.search('statistics.quantiles(values, n=100, method="inclusive")')
