"""When to poll each endpoint's metrics: a pure schedule, driven by the runtime.

A fleet of K processes, each polling N engines, sends K x N requests per interval to
the engines' ``/metrics``. The default schedule (``poll_metrics_s="auto"``) keeps that
small without losing what routing needs:

- each endpoint is polled about every :data:`AUTO_POLL_S` seconds, at a random phase and
  with a random jitter of +-20% per poll, so that processes started together do not poll
  in step;
- while an endpoint's reading does not change, or while the process has no call in
  flight and started none since the previous poll (nothing to route), its interval
  doubles, up to :data:`AUTO_MAX_BACKOFF` times the base; a changed reading resets it;
- an endpoint that serves no engine metrics (a 404, or a page without vLLM's gauges)
  :data:`NO_METRICS_POLLS` times in a row is asked again only every :data:`NO_METRICS_S`
  seconds; its load is then this process's own calls only
  (:attr:`~agentrt.scheduling.EndpointLoad.view` ``"local"``);
- an endpoint whose metrics do not answer (no reply within 3 s, or a 5xx: a blip, an
  engine restarting) is not one without metrics: its view is ``"local"`` until it
  answers again, and it is asked again at the base interval :data:`NO_METRICS_POLLS`
  times, then at doubling intervals up to :data:`AUTO_MAX_BACKOFF` times the base, so
  that a blip of a few seconds blinds routing for about a second after it ends, never
  for a minute.

A first turn is not placed on a stale view: where the process's readings of some
endpoints are older than the base interval (it backed off while idle, or has not polled
yet), a session's first turn has those endpoints polled at once, all together, and
waits for the readings up to :data:`FIRST_TURN_WAIT_S` (:meth:`PollSchedule.stale` says
which; endpoints that serve no metrics, or whose metrics do not answer, are not waited
for). A poll in progress (the schedule's, or another first turn's) is joined, never
started again, and runs to its end whoever stops waiting for it; an endpoint known slow
(its last poll took longer than :data:`FIRST_TURN_WAIT_S`, or a first turn's wait for it
ran out: :meth:`PollSchedule.slow`) is polled but not waited for, until a poll of it
answers in time again.

A fixed interval (``poll_metrics_s=1.0``) polls every endpoint at exactly that interval,
all together, as it always did.
"""

from __future__ import annotations

import math
import random
from typing import Final

__all__ = [
    "AUTO_MAX_BACKOFF",
    "AUTO_POLL_S",
    "FIRST_TURN_WAIT_S",
    "NO_METRICS_POLLS",
    "NO_METRICS_S",
    "PollSchedule",
    "Reading",
]

AUTO_POLL_S: Final = 1.0
"""The default schedule's base interval per endpoint, seconds."""

AUTO_MAX_BACKOFF: Final = 8
"""The default schedule's longest interval, in base intervals (unchanged readings)."""

NO_METRICS_POLLS: Final = 3
"""Polls in a row without engine metrics after which an endpoint is asked rarely."""

NO_METRICS_S: Final = 60.0
"""How often an endpoint that serves no engine metrics is asked again, seconds."""

FIRST_TURN_WAIT_S: Final = 0.5
"""The longest a first turn waits for fresh readings of stale endpoints, seconds."""

Reading = tuple[int | None, int | None, float | None]
"""What one poll read: the engine's running and waiting requests and its KV usage."""


class PollSchedule:
    """When each of ``n`` endpoints' metrics is due next.

    ``adaptive=False``: every ``interval`` seconds, all endpoints together, from
    ``start``. ``adaptive=True``: the default schedule described in the module's
    docstring, its randomness drawn from ``rng``.
    """

    __slots__ = (
        "_adaptive",
        "_at",
        "_base",
        "_fails",
        "_interval",
        "_last",
        "_misses",
        "_next",
        "_rng",
        "_slow",
        "_slow_s",
    )

    def __init__(
        self,
        n: int,
        interval: float,
        *,
        adaptive: bool,
        start: float,
        rng: random.Random,
        slow_s: float = FIRST_TURN_WAIT_S,
    ) -> None:
        if not (math.isfinite(interval) and interval > 0):
            raise ValueError(f"interval must be a finite number > 0, got {interval!r}")
        self._adaptive = adaptive
        self._base = interval
        self._rng = rng
        self._interval = [interval] * n
        self._misses = [0] * n
        self._fails = [0] * n
        self._at = [-math.inf] * n  # when each was last polled
        self._last: list[Reading | None] = [None] * n
        self._slow = [False] * n
        self._slow_s = slow_s
        # Adaptive: a random phase each, so that processes started together spread
        # their first polls.
        self._next = [start + (interval * rng.random() if adaptive else interval) for _ in range(n)]

    def next_at(self) -> float:
        """The earliest time a poll is due."""
        return min(self._next, default=math.inf)

    def due(self, now: float) -> list[int]:
        """The endpoints whose poll is due at ``now``."""
        return [i for i, t in enumerate(self._next) if t <= now]

    def stale(self, now: float) -> list[int]:
        """The endpoints whose last reading is older than the base interval (never
        polled included) and that serve metrics that answer: what a first turn has
        polled before it is placed (adaptive schedule only; a fixed one: none)."""
        if not self._adaptive:
            return []
        horizon = now - self._base
        return [
            i
            for i, at in enumerate(self._at)
            if at < horizon
            and self._misses[i] < NO_METRICS_POLLS
            and self._fails[i] < NO_METRICS_POLLS
        ]

    def started(self, index: int) -> None:
        """A poll of endpoint ``index`` is in progress: it is not due again until
        :meth:`polled` says when."""
        self._next[index] = math.inf

    def slow(self, index: int) -> bool:
        """Whether endpoint ``index`` is known slow to poll (its last poll took longer
        than ``slow_s``, by default :data:`FIRST_TURN_WAIT_S`, or :meth:`waited_out`):
        first turns do not wait for its reading."""
        return self._slow[index]

    def waited_out(self, index: int) -> None:
        """A first turn stopped waiting for endpoint ``index``'s poll: it is slow until
        a poll of it takes at most ``slow_s``."""
        self._slow[index] = True

    def interval(self, index: int) -> float:
        """Endpoint ``index``'s current interval, seconds (before jitter)."""
        return self._interval[index]

    def polled(
        self,
        index: int,
        now: float,
        reading: Reading | None,
        busy: bool,
        *,
        answered: bool = True,
        first_turn: bool = False,
        took_s: float = 0.0,
    ) -> None:
        """Endpoint ``index`` was polled at ``now``: it read ``reading`` (None: no engine
        metrics); ``busy``: the process had calls in flight or started some since the
        previous poll; ``answered=False``: the metrics did not answer (no reply, or a
        5xx), which says nothing of whether the endpoint serves metrics; ``first_turn``:
        polled for a first turn about to be placed (the process is busy from now on:
        the interval starts again at the base, whatever the reading); ``took_s``: how
        long the poll took (longer than ``slow_s``: :meth:`slow`)."""
        self._at[index] = now
        self._slow[index] = took_s > self._slow_s
        if not self._adaptive:
            self._next[index] = now + self._base
            return
        base = self._base
        if not answered:
            self._fails[index] += 1
            if self._fails[index] <= NO_METRICS_POLLS:
                interval = base
            else:
                interval = min(self._interval[index] * 2, base * AUTO_MAX_BACKOFF)
        elif reading is None or reading == (None, None, None):
            self._fails[index] = 0
            self._misses[index] += 1
            interval = NO_METRICS_S if self._misses[index] >= NO_METRICS_POLLS else base
        else:
            self._fails[index] = 0
            self._misses[index] = 0
            unchanged = reading == self._last[index]
            if (unchanged or not busy) and not first_turn:
                interval = min(self._interval[index] * 2, base * AUTO_MAX_BACKOFF)
            else:
                interval = base
            self._last[index] = reading
        self._interval[index] = interval
        self._next[index] = now + interval * self._rng.uniform(0.8, 1.2)
