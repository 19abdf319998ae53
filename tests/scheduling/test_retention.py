"""Cache-retention estimates (RetentionEstimator) and retention-aware session routing."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrt.scheduling import (
    DEFAULT_RETENTION_MARGIN,
    MIN_CACHEABLE_TOKENS,
    EndpointLoad,
    RetentionEstimator,
    RouteKey,
    SessionAffinity,
)

# ---------------------------------------------------------------- the estimator


def test_no_estimate_without_evidence() -> None:
    est = RetentionEstimator()
    assert est.estimate() is None
    for i in range(50):  # every resume hit: no limit seen
        est.observe(float(i), True)
    assert est.estimate() is None
    est = RetentionEstimator()
    for i in range(50):  # every resume missed: no threshold either
        est.observe(float(i), False)
    assert est.estimate() is None
    est = RetentionEstimator(min_samples=8)
    for idle, hit in [(1.0, True), (2.0, True), (30.0, False), (40.0, False)]:
        est.observe(idle, hit)
    assert est.estimate() is None  # fewer than min_samples


def test_a_clean_step_gives_the_midpoint() -> None:
    est = RetentionEstimator()
    for idle in (1.0, 2.0, 5.0, 9.0):
        est.observe(idle, True)
    for idle in (11.0, 20.0, 30.0, 60.0):
        est.observe(idle, False)
    assert est.estimate() == 10.0


def test_the_estimate_is_recomputed_only_after_an_observation() -> None:
    est = RetentionEstimator(min_samples=4, min_each=2)
    for idle, hit in [(1.0, True), (2.0, True), (8.0, False), (9.0, False)]:
        est.observe(idle, hit)
    assert est.dirty
    assert est.estimate() == 5.0
    assert not est.dirty
    est.observe(4.0, True)
    assert est.dirty
    assert est.estimate() == 6.0


def test_a_full_window_recomputes_every_eighth_observation() -> None:
    est = RetentionEstimator()
    for i in range(64):
        est.observe(float(i), i < 20)
    assert est.estimate() == 19.5
    for _ in range(7):
        est.observe(1000.0, True)
        assert not est.dirty
    assert est.estimate() == 19.5  # stale by at most len // 8 observations
    est.observe(1000.0, True)
    assert est.dirty


def test_noise_picks_the_split_with_fewest_errors_and_ties_keep_the_cache_longer() -> None:
    est = RetentionEstimator(min_samples=4, min_each=1)
    # hits at 1, 2, 4; misses at 3, 10: splits after 2 (1 error) or after 4 (1 error).
    for idle, hit in [(1.0, True), (2.0, True), (3.0, False), (4.0, True), (10.0, False)]:
        est.observe(idle, hit)
    assert est.estimate() == 7.0


def test_equal_idles_are_never_split() -> None:
    est = RetentionEstimator(min_samples=4, min_each=1)
    for idle, hit in [(5.0, True), (5.0, True), (5.0, False), (9.0, False)]:
        est.observe(idle, hit)
    assert est.estimate() == 7.0


def test_validation() -> None:
    with pytest.raises(ValueError, match="samples"):
        RetentionEstimator(samples=0)
    with pytest.raises(ValueError, match="min_each"):
        RetentionEstimator(min_samples=3, min_each=2)
    with pytest.raises(ValueError, match="min_samples"):
        RetentionEstimator(samples=4, min_samples=8)


def test_hit_definition() -> None:
    assert RetentionEstimator.hit(MIN_CACHEABLE_TOKENS - 1, 10**6) is None  # too small
    assert RetentionEstimator.hit(1000, 500) is True
    assert RetentionEstimator.hit(1000, 499) is False
    assert RetentionEstimator.hit(1000, 0) is False


@settings(deadline=None, max_examples=100)
@given(
    samples=st.integers(min_value=4, max_value=64),
    obs=st.lists(st.tuples(st.floats(min_value=0, max_value=1e4), st.booleans()), max_size=300),
)
def test_memory_is_bounded(samples: int, obs: list[tuple[float, bool]]) -> None:
    est = RetentionEstimator(samples=samples, min_samples=4, min_each=1)
    for idle, hit in obs:
        est.observe(idle, hit)
        assert len(est) <= samples
        assert est._hits == sum(h for _, h in est._obs)  # kept incrementally
    value = est.estimate()
    if value is not None:
        assert 0.0 <= value <= max(i for i, _ in obs)


@settings(deadline=None, max_examples=50)
@given(
    threshold=st.floats(min_value=0.5, max_value=500.0),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_converges_to_a_step_threshold(threshold: float, seed: int) -> None:
    """A replica that keeps a prefix exactly ``threshold`` seconds: with idles drawn
    uniformly on [0, 4 x threshold], the estimate lands within a few percent of it."""
    rng = random.Random(seed)
    est = RetentionEstimator()
    for _ in range(400):
        idle = rng.uniform(0.0, 4.0 * threshold)
        est.observe(idle, idle <= threshold)
    value = est.estimate()
    assert value is not None
    assert abs(value - threshold) <= 0.25 * threshold  # 64 samples over 4x the range


# ---------------------------------------------------------------- the router


def two(retention: float | None) -> list[EndpointLoad]:
    """Home (0) carries a call; endpoint 1 is idle."""
    return [EndpointLoad(in_flight=1, retention_s=retention), EndpointLoad()]


def resumed(idle_s: float | None) -> RouteKey:
    return RouteKey("s", 0, first_turn=False, idle_s=idle_s)


def test_a_session_back_within_the_retention_stays_home() -> None:
    router = SessionAffinity()
    assert router.choose(two(10.0), resumed(5.0), ()) == 0
    assert router.choose(two(10.0), resumed(10.0 * DEFAULT_RETENTION_MARGIN), ()) == 0
    assert router.choose(two(None), resumed(10_000.0), ()) == 0  # no estimate: affinity
    assert router.choose(two(10.0), resumed(None), ()) == 0  # no idle known
    assert router.moves == {}


def test_a_session_back_after_the_retention_goes_by_load() -> None:
    router = SessionAffinity()
    assert router.choose(two(10.0), resumed(16.0), ()) == 1
    assert router.moves == {"retention": 1}
    # Home is the least loaded: it stays, and no move is counted.
    loads = [EndpointLoad(retention_s=10.0), EndpointLoad(in_flight=3)]
    assert router.choose(loads, resumed(60.0), ()) == 0
    assert router.moves == {"retention": 1}


def test_the_margin_is_configurable_and_validated() -> None:
    router = SessionAffinity(retention_margin=3.0)
    assert router.choose(two(10.0), resumed(25.0), ()) == 0
    assert router.choose(two(10.0), resumed(31.0), ()) == 1
    with pytest.raises(ValueError, match="retention_margin"):
        SessionAffinity(retention_margin=0.5)


def test_moves_are_counted_by_reason() -> None:
    router = SessionAffinity()
    overloaded = [EndpointLoad(in_flight=10), EndpointLoad(), EndpointLoad(in_flight=1)]
    assert router.choose(overloaded, resumed(1.0), ()) == 1
    down = [EndpointLoad(healthy=False), EndpointLoad()]
    assert router.choose(down, resumed(1.0), ()) == 1
    assert router.choose(two(None), resumed(1.0), {0}) == 1
    assert router.moves == {"overload": 1, "unavailable": 2}


@settings(deadline=None, max_examples=200)
@given(
    retention=st.one_of(st.none(), st.floats(min_value=0.0, max_value=1e3)),
    idle_s=st.one_of(st.none(), st.floats(min_value=0.0, max_value=1e4)),
    home_calls=st.integers(min_value=0, max_value=3),
    other_calls=st.integers(min_value=0, max_value=3),
)
def test_affinity_holds_unless_a_guard_fires(
    retention: float | None, idle_s: float | None, home_calls: int, other_calls: int
) -> None:
    router = SessionAffinity()
    loads = [EndpointLoad(in_flight=home_calls, retention_s=retention)]
    loads.append(EndpointLoad(in_flight=other_calls))
    expired = retention is not None and idle_s is not None and idle_s > 1.5 * retention
    chosen = router.choose(loads, resumed(idle_s), ())
    if chosen != 0:
        assert expired or router.overloaded(loads, 0)
    if expired:  # by load: the least loaded one, home winning ties
        assert chosen == (1 if other_calls < home_calls else 0)
