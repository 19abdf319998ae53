"""Endpoint health: when to stop sending calls to a replica, and when to try it again.

:class:`EndpointHealth` is a pure state machine, one per endpoint. It reads no clock: the
caller passes ``now`` (any monotonic seconds) to every method, so tests drive it with plain
numbers. It does no I/O either: the caller sends the probe when :meth:`probe_due` says so.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DEFAULT_FAILURES_TO_DOWN",
    "DEFAULT_PROBE_INTERVAL_S",
    "DEFAULT_WINDOW_S",
    "EndpointHealth",
    "HealthStatistics",
]

DEFAULT_FAILURES_TO_DOWN: Final = 3
"""Failures in a row (within ``DEFAULT_WINDOW_S``) that mark an endpoint down."""
DEFAULT_WINDOW_S: Final = 10.0
"""Seconds within which those failures must fall."""
DEFAULT_PROBE_INTERVAL_S: Final = 2.0
"""Seconds between probes of an endpoint that is down."""


@dataclass(frozen=True, slots=True)
class HealthStatistics:
    """A snapshot of one endpoint's health."""

    healthy: bool
    failures: int
    """Consecutive failures counted towards marking the endpoint down."""
    downs: int
    """Times the endpoint was marked down."""
    readmissions: int
    """Times a successful probe brought it back."""


class EndpointHealth:
    """Up/down state of one endpoint.

    Up -> down:

    * a connection error (the endpoint accepted no connection: refused, reset during
      connect, connect timeout) marks it down at once, since every other call sent there
      would fail the same way;
    * otherwise ``failures_to_down`` failures (5xx answers, read timeouts) in a row marks
      it down, provided they all fall within ``window_s`` seconds. A success clears the
      count, and failures older than ``window_s`` fall out of it.

    Down -> up: the endpoint is probed every ``probe_interval_s`` seconds (the first probe
    is due ``probe_interval_s`` after it went down); a successful probe readmits it. Calls
    that finish while it is down (sent before it went down) change nothing either way.
    """

    def __init__(
        self,
        *,
        failures_to_down: int = DEFAULT_FAILURES_TO_DOWN,
        window_s: float = DEFAULT_WINDOW_S,
        probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S,
    ) -> None:
        if failures_to_down < 1:
            raise ValueError(f"failures_to_down must be >= 1, got {failures_to_down!r}")
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        if not probe_interval_s > 0:
            raise ValueError(f"probe_interval_s must be > 0, got {probe_interval_s!r}")
        self.failures_to_down = failures_to_down
        self.window_s = window_s
        self.probe_interval_s = probe_interval_s
        self.downs = 0
        """Times the endpoint was marked down."""
        self.readmissions = 0
        """Times a successful probe brought it back."""
        self._healthy = True
        self._failures: deque[float] = deque()
        self._next_probe = 0.0

    def __repr__(self) -> str:
        state = "up" if self._healthy else "down"
        return f"<EndpointHealth {state} failures={len(self._failures)} downs={self.downs}>"

    @property
    def healthy(self) -> bool:
        """Whether calls may be routed to the endpoint."""
        return self._healthy

    @property
    def next_probe_at(self) -> float | None:
        """When the next probe is due; ``None`` while the endpoint is up."""
        return None if self._healthy else self._next_probe

    def record_success(self, now: float) -> None:
        """A call to the endpoint succeeded."""
        if self._healthy and self._failures:
            self._failures.clear()

    def record_failure(self, now: float, *, connect: bool) -> None:
        """A call to the endpoint failed; ``connect`` if no connection was made."""
        if not self._healthy:
            return
        if connect:
            self._mark_down(now)
            return
        failures = self._failures
        failures.append(now)
        while failures and failures[0] < now - self.window_s:
            failures.popleft()
        if len(failures) >= self.failures_to_down:
            self._mark_down(now)

    def probe_due(self, now: float) -> bool:
        """Whether the endpoint is down and the time for a probe has come.

        Asking changes nothing: the caller runs one probe at a time and reports it with
        :meth:`probed`.
        """
        return not self._healthy and now >= self._next_probe

    def probed(self, now: float, ok: bool) -> None:
        """A probe finished: ``ok`` readmits the endpoint, a failure schedules the next."""
        if self._healthy:
            return
        if ok:
            self._healthy = True
            self._failures.clear()
            self.readmissions += 1
        else:
            self._next_probe = now + self.probe_interval_s

    def statistics(self) -> HealthStatistics:
        """A frozen snapshot of the state and counters."""
        return HealthStatistics(self._healthy, len(self._failures), self.downs, self.readmissions)

    def _mark_down(self, now: float) -> None:
        self._healthy = False
        self._failures.clear()
        self._next_probe = now + self.probe_interval_s
        self.downs += 1
