"""The learned per-tool wait estimate (agentrt._waits)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrt._waits import WaitEstimator


def test_unknown_tool_has_no_estimate() -> None:
    est = WaitEstimator()
    assert est.estimate("search") is None
    assert est.estimate_many(["search", "fetch"]) is None
    assert est.observed("search") == 0


def test_median_of_recent_window() -> None:
    est = WaitEstimator(window=3)
    for d in (1.0, 100.0, 2.0):
        est.observe("t", d)
    assert est.estimate("t") == 2.0  # one outlier does not move it
    est.observe("t", 4.0)  # 1.0 leaves the window: {100, 2, 4}
    assert est.estimate("t") == 4.0
    est.observe("t", 6.0)
    est.observe("t", 8.0)  # {4, 6, 8}: the outlier is gone
    assert est.estimate("t") == 6.0
    assert est.observed("t") == 6


def test_even_window_takes_the_middle_pair() -> None:
    est = WaitEstimator(window=4)
    for d in (1.0, 2.0, 3.0, 10.0):
        est.observe("t", d)
    assert est.estimate("t") == 2.5


def test_bad_durations_are_ignored() -> None:
    est = WaitEstimator()
    for d in (float("nan"), float("inf"), -1.0):
        est.observe("t", d)
    assert est.estimate("t") is None


def test_estimate_many_sums_known_tools() -> None:
    est = WaitEstimator()
    est.observe("a", 1.0)
    est.observe("b", 2.5)
    assert est.estimate_many(["a", "b", "unknown"]) == 3.5
    assert est.estimate_many(["a", "a"]) == 2.0


def test_least_recently_used_tool_is_forgotten() -> None:
    est = WaitEstimator(max_tools=2)
    est.observe("a", 1.0)
    est.observe("b", 1.0)
    est.observe("a", 1.0)  # a is now the most recently used
    est.observe("c", 1.0)
    assert est.estimate("b") is None
    assert est.estimate("a") == 1.0
    assert est.estimate("c") == 1.0
    assert len(est) == 2


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        WaitEstimator(window=0)
    with pytest.raises(ValueError):
        WaitEstimator(max_tools=0)


_waits = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", "d", "e"]),
        st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
    ),
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(
    window=st.integers(min_value=1, max_value=8),
    max_tools=st.integers(min_value=1, max_value=4),
    waits=_waits,
)
def test_memory_bound_and_estimate_in_observed_range(
    window: int, max_tools: int, waits: list[tuple[str, float]]
) -> None:
    est = WaitEstimator(window=window, max_tools=max_tools)
    seen: dict[str, list[float]] = {}
    for tool, d in waits:
        est.observe(tool, d)
        seen.setdefault(tool, []).append(d)
        assert len(est) <= max_tools
        assert est.memory() <= window * max_tools
        value = est.estimate(tool)
        assert value is not None
        recent = seen[tool][-window:]
        assert min(recent) <= value <= max(recent)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_converges_on_a_stationary_distribution(seed: int) -> None:
    # Lognormal waits (median e^mu = 2 s): after a warm-up the estimate stays between
    # the distribution's 10th and 90th percentiles (a median of 32 leaves them with
    # p ~ 1e-8 per look).
    rng = random.Random(seed)
    est = WaitEstimator()
    mu, sigma = 0.6931471805599453, 1.0
    q1, q3 = 2.0 * 0.2776, 2.0 * 3.6022  # e^(mu -+ 1.2816 sigma)
    for i in range(500):
        est.observe("t", rng.lognormvariate(mu, sigma))
        if i >= 100:
            value = est.estimate("t")
            assert value is not None
            assert q1 <= value <= q3
