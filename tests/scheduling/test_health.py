"""Endpoint health: marking down, probing, readmitting; driven with explicit times."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrt.scheduling import EndpointHealth, HealthStatistics


def test_starts_healthy_with_nothing_due() -> None:
    h = EndpointHealth()
    assert h.healthy and not h.probe_due(0.0) and not h.probe_due(1e9)
    assert h.next_probe_at is None
    assert h.statistics() == HealthStatistics(True, 0, 0, 0)
    assert "up" in repr(h)


def test_a_connection_error_marks_down_at_once() -> None:
    h = EndpointHealth(probe_interval_s=2.0)
    h.record_failure(10.0, connect=True)
    assert not h.healthy and h.downs == 1 and "down" in repr(h)
    assert h.next_probe_at == 12.0
    assert not h.probe_due(11.9) and h.probe_due(12.0)


def test_a_burst_of_failures_within_the_window_marks_down() -> None:
    h = EndpointHealth(failures_to_down=3, window_s=10.0)
    h.record_failure(0.0, connect=False)
    h.record_failure(4.0, connect=False)
    assert h.healthy and h.statistics().failures == 2
    h.record_failure(9.5, connect=False)
    assert not h.healthy and h.downs == 1


def test_a_success_or_time_clears_the_count() -> None:
    h = EndpointHealth(failures_to_down=3, window_s=10.0)
    h.record_failure(0.0, connect=False)
    h.record_failure(1.0, connect=False)
    h.record_success(2.0)
    h.record_failure(3.0, connect=False)
    h.record_failure(4.0, connect=False)
    assert h.healthy
    # Spread out: the oldest falls out of the window before the third arrives.
    h = EndpointHealth(failures_to_down=3, window_s=10.0)
    for t in (0.0, 6.0, 12.0, 18.0, 24.0):
        h.record_failure(t, connect=False)
    assert h.healthy and h.statistics().failures == 2


def test_probes_readmit_or_reschedule() -> None:
    h = EndpointHealth(probe_interval_s=2.0)
    h.record_failure(0.0, connect=True)
    assert h.probe_due(2.0)
    h.probed(2.5, ok=False)
    assert not h.healthy and h.next_probe_at == 4.5
    assert not h.probe_due(4.0) and h.probe_due(4.5)
    h.probed(4.6, ok=True)
    assert h.healthy and h.readmissions == 1 and not h.probe_due(100.0)
    assert h.statistics() == HealthStatistics(True, 0, 1, 1)
    # Readmitted with a clean slate: one more 5xx does not mark it down again.
    h.record_failure(5.0, connect=False)
    assert h.healthy
    h.probed(6.0, ok=True)  # a stray probe result while up changes nothing
    assert h.readmissions == 1


def test_calls_finishing_while_down_change_nothing() -> None:
    h = EndpointHealth()
    h.record_failure(0.0, connect=True)
    h.record_success(0.5)
    h.record_failure(1.0, connect=True)
    h.record_failure(1.5, connect=False)
    assert not h.healthy and h.downs == 1 and h.next_probe_at == 2.0


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="failures_to_down"):
        EndpointHealth(failures_to_down=0)
    with pytest.raises(ValueError, match="window_s"):
        EndpointHealth(window_s=0.0)
    with pytest.raises(ValueError, match="probe_interval_s"):
        EndpointHealth(probe_interval_s=-1.0)


events = st.lists(
    st.tuples(
        st.floats(0.0, 5.0),  # time step
        st.sampled_from(["ok", "fail", "connect", "probe_ok", "probe_fail"]),
    ),
    max_size=60,
)


@settings(deadline=None, max_examples=200)
@given(events=events, k=st.integers(1, 4), window=st.sampled_from([1.0, 3.0, 10.0]))
def test_matches_a_reference_model(events: list[tuple[float, str]], k: int, window: float) -> None:
    h = EndpointHealth(failures_to_down=k, window_s=window, probe_interval_s=2.0)
    streak: list[float] = []
    up, downs, readmissions, next_probe = True, 0, 0, 0.0
    now = 0.0
    for dt, event in events:
        now += dt
        assert h.probe_due(now) == (not up and now >= next_probe)
        if event == "ok":
            h.record_success(now)
            if up:
                streak = []
        elif event in ("fail", "connect"):
            h.record_failure(now, connect=event == "connect")
            if up:
                streak = [t for t in [*streak, now] if t >= now - window]
                if event == "connect" or len(streak) >= k:
                    up, streak, downs, next_probe = False, [], downs + 1, now + 2.0
        else:
            h.probed(now, ok=event == "probe_ok")
            if not up and event == "probe_ok":
                up, readmissions = True, readmissions + 1
            elif not up:
                next_probe = now + 2.0
        assert h.statistics() == HealthStatistics(up, len(streak), downs, readmissions)
