"""How long a replica keeps an idle session's prefix cached, estimated from its replies.

A session that resumes after a tool wait finds its prefix still cached on its replica, or
not (the engine evicted it to make room). Each resumed turn is one observation: the idle
seconds before it and whether it hit. :class:`RetentionEstimator` keeps the last ``N`` and
estimates the replica's retention time as the idle threshold that best separates the hits
(shorter idles) from the misses (longer ones). ``docs/routing.md`` has the exact rule.
"""

from __future__ import annotations

from collections import deque
from typing import Final

__all__ = ["DEFAULT_RETENTION_SAMPLES", "MIN_CACHEABLE_TOKENS", "RetentionEstimator"]

DEFAULT_RETENTION_SAMPLES: Final = 64
"""Resumed turns a :class:`RetentionEstimator` remembers per replica (the most recent)."""

MIN_CACHEABLE_TOKENS: Final = 64
"""Smallest previous turn (prompt + completion tokens) whose resume is an observation:
engines cache whole blocks (16 tokens in vLLM), so a tiny prefix says little."""


def _cache_hit(cacheable_tokens: int, cached_tokens: int) -> bool | None:
    """Whether a resumed turn found its session's prefix cached.

    ``cacheable_tokens`` is the previous turn's prompt + completion tokens (what the
    replica could have kept for this turn), ``cached_tokens`` this turn's
    ``usage.prompt_tokens_details.cached_tokens``. A hit is ``cached_tokens`` at least
    half of ``cacheable_tokens`` (chat templates re-render the previous reply, so not all
    of it matches); None when the previous turn was under :data:`MIN_CACHEABLE_TOKENS`.
    """
    if cacheable_tokens < MIN_CACHEABLE_TOKENS:
        return None
    return 2 * cached_tokens >= cacheable_tokens


class RetentionEstimator:
    """A replica's cache retention time, from its recent resumed turns.

    ``observe(idle_s, hit)`` records one resumed turn; the last ``samples`` are kept.
    ``estimate()`` is None until there are ``min_samples`` observations with at least
    ``min_each`` hits and ``min_each`` misses. Then, with the observations sorted by idle,
    it picks the split "hits below, misses above" with the fewest disagreements (ties: the
    longest retention) and returns the midpoint of the two idles around it; when every
    observation is best called a hit, None (no limit seen). Recomputed when asked, once
    ``max(1, len // 8)`` observations have arrived since the last time: O(samples log
    samples), about 9 µs for 64, so about 1 µs per observation amortised.
    """

    __slots__ = ("_dirty", "_estimate", "_hits", "_min_each", "_min_samples", "_obs", "_pending")

    hit = staticmethod(_cache_hit)

    def __init__(
        self,
        *,
        samples: int = DEFAULT_RETENTION_SAMPLES,
        min_samples: int = 8,
        min_each: int = 2,
    ) -> None:
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples!r}")
        if not (1 <= min_each and 2 * min_each <= min_samples <= samples):
            raise ValueError(
                "need 1 <= min_each, 2 * min_each <= min_samples <= samples; got "
                f"min_each={min_each!r}, min_samples={min_samples!r}, samples={samples!r}"
            )
        self._obs: deque[tuple[float, bool]] = deque(maxlen=samples)
        self._hits = 0
        self._min_samples = min_samples
        self._min_each = min_each
        self._pending = 0
        self._dirty = False
        self._estimate: float | None = None

    def __len__(self) -> int:
        return len(self._obs)

    @property
    def dirty(self) -> bool:
        """The next :meth:`estimate` recomputes (enough observations arrived)."""
        return self._dirty

    def observe(self, idle_s: float, hit: bool) -> None:
        """One resumed turn: ``idle_s`` seconds after its previous reply, hit or missed."""
        obs = self._obs
        if len(obs) == obs.maxlen:
            self._hits -= obs[0][1]
        obs.append((max(0.0, float(idle_s)), bool(hit)))
        self._hits += bool(hit)
        self._pending += 1
        if self._pending >= max(1, len(obs) // 8):
            self._dirty = True

    def estimate(self) -> float | None:
        """The estimated retention time in seconds, or None without enough evidence."""
        if self._dirty:
            self._dirty = False
            self._pending = 0
            self._estimate = self._compute()
        return self._estimate

    def _compute(self) -> float | None:
        n, hits = len(self._obs), self._hits
        if n < self._min_samples or min(hits, n - hits) < self._min_each:
            return None
        obs = sorted(self._obs)
        # Split k: obs[:k] called hits, obs[k:] misses. Errors(k) = misses before k +
        # hits from k on. Only splits between distinct idles count.
        errors = hits  # k = 0
        best, best_k = errors, 0
        for k in range(1, n + 1):
            errors += -1 if obs[k - 1][1] else 1
            if k < n and obs[k][0] == obs[k - 1][0]:
                continue
            if errors <= best:
                best, best_k = errors, k
        if best_k == n:
            return None
        low = obs[best_k - 1][0] if best_k else 0.0
        return (low + obs[best_k][0]) / 2.0
