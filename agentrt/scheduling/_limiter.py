"""Concurrency limits: how many calls an endpoint may have in flight.

A :class:`Limit` reports the current limit and learns from each finished call. The
adaptive limits normalise latency by the call's tokens: an LLM call's latency is roughly
``TTFT + tokens * time-per-token``, so raw latency mostly measures how long the answer
was. Latency per ``tokens + 1`` instead tracks the time per token, which is what grows
when the engine's batch gets too large (see ``docs/scheduling.md``).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Literal, Protocol

__all__ = ["AIMDLimit", "EngineQueueLimit", "FixedLimit", "GradientLimit", "Limit", "make_limit"]


class Limit(Protocol):
    """The in-flight limit of one endpoint, possibly adapting to observed latency."""

    @property
    def limit(self) -> int | None:
        """The current limit; None means unlimited."""
        ...

    def on_sample(self, latency_s: float, tokens: int, in_flight: int, ok: bool) -> None:
        """A call finished after ``latency_s`` with ``tokens`` tokens while ``in_flight``
        calls were in flight; ``ok`` is False for an overload signal (429, 503, timeout)."""
        ...


class FixedLimit:
    """A constant limit (None: unlimited)."""

    __slots__ = ("_n",)

    def __init__(self, n: int | None) -> None:
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"limit must be a positive int or None, got {n!r}")
        self._n = n

    @property
    def limit(self) -> int | None:
        return self._n

    def on_sample(self, latency_s: float, tokens: int, in_flight: int, ok: bool) -> None:
        pass

    def __repr__(self) -> str:
        return f"FixedLimit({self._n!r})"


def _check_bounds(initial: int, min_limit: int, max_limit: int) -> None:
    if not 1 <= min_limit <= initial <= max_limit:
        raise ValueError(
            "need 1 <= min_limit <= initial <= max_limit, "
            f"got min_limit={min_limit}, initial={initial}, max_limit={max_limit}"
        )


class GradientLimit:
    """An adaptive limit after Netflix concurrency-limits' ``Gradient2Limit``.

    Each sample is ``latency_s / (tokens + 1)``. ``short`` is its exponential average over
    about ``short_window`` samples, ``long`` over about ``long_window`` samples (the
    baseline). Per sample::

        gradient = clamp(tolerance * long / short, 0.5, 1.0)
        target   = limit * gradient + queue_size          # queue_size = sqrt(limit)
        limit    = clamp(limit * (1 - smoothing) + target * smoothing, min, max)

    so the limit grows by about ``smoothing * queue_size`` per sample while the per-token
    latency stays within ``tolerance`` of its long-run level, and shrinks (by at most half
    per step) when it grows past that. The limit does not grow while fewer than half of it
    are in flight (the client, not the endpoint, is the bottleneck). When ``long`` is more
    than twice ``short`` (load has gone), ``long`` decays 5% per sample to catch up. A
    failed sample (``ok=False``: the endpoint signalled overload) multiplies the limit by
    ``backoff``.
    """

    __slots__ = (
        "_backoff",
        "_est",
        "_long",
        "_long_alpha",
        "_max",
        "_min",
        "_n",
        "_short",
        "_short_alpha",
        "_smoothing",
        "_tolerance",
        "_warmup",
    )

    def __init__(
        self,
        initial: int = 16,
        *,
        min_limit: int = 1,
        max_limit: int = 512,
        tolerance: float = 1.5,
        smoothing: float = 0.2,
        short_window: int = 10,
        long_window: int = 600,
        warmup: int = 10,
        backoff: float = 0.9,
    ) -> None:
        _check_bounds(initial, min_limit, max_limit)
        if tolerance < 1.0:
            raise ValueError(f"tolerance must be >= 1, got {tolerance}")
        if not 0.0 < smoothing <= 1.0 or not 0.0 < backoff < 1.0:
            raise ValueError("smoothing must be in (0, 1] and backoff in (0, 1)")
        self._est = float(initial)
        self._min = min_limit
        self._max = max_limit
        self._tolerance = tolerance
        self._smoothing = smoothing
        self._short_alpha = 2.0 / (short_window + 1)
        self._long_alpha = 2.0 / (long_window + 1)
        self._warmup = warmup
        self._backoff = backoff
        self._short = 0.0
        self._long = 0.0
        self._n = 0

    @property
    def limit(self) -> int:
        return int(self._est)

    @property
    def baseline_s(self) -> float:
        """The long-run latency per token (0 before the first sample)."""
        return self._long

    def _clamp(self, x: float) -> float:
        return min(max(x, self._min), self._max)

    def on_sample(self, latency_s: float, tokens: int, in_flight: int, ok: bool) -> None:
        if not ok:
            self._est = self._clamp(self._est * self._backoff)
            return
        if not latency_s > 0.0 or math.isinf(latency_s):
            return
        x = latency_s / (max(tokens, 0) + 1)
        self._n += 1
        if self._n == 1:
            self._short = self._long = x
        else:
            self._short += self._short_alpha * (x - self._short)
            # The long average starts as a plain mean so it is not stuck on sample one.
            a = max(self._long_alpha, 1.0 / self._n)
            self._long += a * (x - self._long)
        if self._long > 2.0 * self._short:
            self._long *= 0.95
        if self._n < self._warmup:
            return
        est = self._est
        gradient = min(1.0, max(0.5, self._tolerance * self._long / self._short))
        target = est * gradient + math.sqrt(est)
        if target > est and in_flight < est / 2:
            return
        self._est = self._clamp(est * (1.0 - self._smoothing) + target * self._smoothing)

    def __repr__(self) -> str:
        return f"GradientLimit(limit={self.limit}, min={self._min}, max={self._max})"


class AIMDLimit:
    """Additive increase, multiplicative decrease (TCP Reno style).

    A failed sample (``ok=False``) or one whose latency per ``tokens + 1`` exceeds
    ``slow_per_token_s`` multiplies the limit by ``backoff``; any other sample adds 1 while
    at least half of the limit is in flight.
    """

    __slots__ = ("_backoff", "_est", "_max", "_min", "_slow")

    def __init__(
        self,
        initial: int = 16,
        *,
        min_limit: int = 1,
        max_limit: int = 512,
        backoff: float = 0.9,
        slow_per_token_s: float | None = None,
    ) -> None:
        _check_bounds(initial, min_limit, max_limit)
        if not 0.0 < backoff < 1.0:
            raise ValueError(f"backoff must be in (0, 1), got {backoff}")
        self._est = float(initial)
        self._min = min_limit
        self._max = max_limit
        self._backoff = backoff
        self._slow = slow_per_token_s

    @property
    def limit(self) -> int:
        return int(self._est)

    def on_sample(self, latency_s: float, tokens: int, in_flight: int, ok: bool) -> None:
        slow = self._slow is not None and latency_s / (max(tokens, 0) + 1) > self._slow
        if not ok or slow:
            self._est = max(self._min, self._est * self._backoff)
        elif in_flight * 2 >= self._est:
            self._est = min(self._max, self._est + 1.0)

    def __repr__(self) -> str:
        return f"AIMDLimit(limit={self.limit}, min={self._min}, max={self._max})"


class EngineQueueLimit:
    """No limit until the endpoint's engine reports a waiting queue; then about what the
    engine runs (``concurrency="engine"``, Runtime's default).

    A call an engine cannot run yet waits in the engine's queue, first come, first served;
    held on the client instead, it waits in agentrt's policy, which knows jobs. Calls are
    never held while the engine has room, so this cannot throttle throughput the way a
    fixed cap below the engine's batch does in overload. It learns from the engine's
    polled metrics (:meth:`on_signals`, fed by ``Runtime(poll_metrics_s=...)``); without
    them it never limits.

    - The engine reports ``waiting > 0``: the limit becomes this process's share of its
      batch (the most it ran over the last ``window`` polls: a poll can land between two
      steps, when arrivals wait and few run; a first poll there can still set a limit
      below the batch, which the next rule raises) plus ``headroom`` of it (at least one
      call), so the engine's batch stays full and a few calls wait there, the rest in
      agentrt's queue. A queue with nothing run yet is not a full batch: no limit from
      it. The share is this process's demand (its calls in flight there and waiting in
      its queue) over the engine's (running, waiting, and this process's queue): alone
      on the engine it is the whole batch; in a fleet of K equal processes about 1/K of
      it each, so that together they do not let K batches into the engine's queue.
    - No waiting at the engine while calls wait in agentrt's queue: the engine has room,
      the limit grows by ``headroom`` of itself (at least one) per poll.
    - No waiting anywhere for ``calm_polls`` polls in a row: no limit again.
    """

    __slots__ = ("_calm", "_calm_polls", "_headroom", "_n", "_recent")

    def __init__(self, *, headroom: float = 0.125, calm_polls: int = 3, window: int = 8) -> None:
        if not (isinstance(headroom, int | float) and 0.0 <= headroom <= 1.0):
            raise ValueError(f"headroom must be a fraction in [0, 1], got {headroom!r}")
        if isinstance(calm_polls, bool) or not isinstance(calm_polls, int) or calm_polls < 1:
            raise ValueError(f"calm_polls must be an int >= 1, got {calm_polls!r}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an int >= 1, got {window!r}")
        self._recent: deque[int] = deque(maxlen=window)
        self._headroom = headroom
        self._calm_polls = calm_polls
        self._n: int | None = None
        self._calm = 0

    @property
    def limit(self) -> int | None:
        return self._n

    def _extra(self, n: int) -> int:
        return max(1, math.ceil(n * self._headroom))

    def on_sample(self, latency_s: float, tokens: int, in_flight: int, ok: bool) -> None:
        pass

    def on_signals(
        self, running: int | None, waiting: int | None, queued: int, in_flight: int | None = None
    ) -> None:
        """The engine's polled load (``None``: not reported), the calls waiting in
        agentrt's queue for this endpoint and this process's calls in flight there
        (None: unknown, the whole engine is taken to be this process's)."""
        if running is None or waiting is None:
            return
        self._recent.append(running)
        batch = max(self._recent)
        if waiting > 0 and batch > 0:
            self._calm = 0
            if in_flight is not None:
                engine = running + waiting + queued
                share = min(1.0, (in_flight + queued) / engine)
                batch = max(1, math.ceil(batch * share))
            self._n = batch + self._extra(batch)
        elif self._n is not None:
            if queued > 0:
                self._calm = 0
                self._n += self._extra(self._n)
            else:
                self._calm += 1
                if self._calm >= self._calm_polls:
                    self._n = None
                    self._calm = 0

    def __repr__(self) -> str:
        return f"EngineQueueLimit(limit={self._n!r})"


def make_limit(spec: Limit | int | Literal["auto", "aimd", "engine"] | None) -> Limit:
    """A limit from a spec: None (unlimited), a positive int (fixed), ``"auto"``
    (:class:`GradientLimit`), ``"aimd"`` (:class:`AIMDLimit`), ``"engine"``
    (:class:`EngineQueueLimit`) or a :class:`Limit`."""
    if spec is None or isinstance(spec, int):
        return FixedLimit(spec)
    if isinstance(spec, str):
        if spec == "auto":
            return GradientLimit()
        if spec == "aimd":
            return AIMDLimit()
        if spec == "engine":
            return EngineQueueLimit()
        raise ValueError(
            f"unknown limit {spec!r}; choose None, a positive int, 'auto', 'aimd' or 'engine'"
        )
    return spec
