"""Retention directives: what a call says about keeping its session's KV cache, in the
forms engines and routers read (docs/protocol.md, "Retention directives").

Every form is made of the same two facts of :class:`~agentrt._protocol.CallMetadata`:
the idle the session expects after this reply (``idle_expected_s``: a declared
``expect_idle`` or a learned tool wait) and whether this is the session's last call
(``final``). From them:

- the retention window: ``min(idle_expected_s + margin, max)`` seconds, on a call that is
  not its session's last and whose idle is known (else none: the engine's default, LRU);
- the priority of vLLM's retention API (PR vllm-project/vllm#38514; 0 is evicted first,
  100 last, blocks without a directive follow plain LRU): higher for a session that
  wakes sooner (:func:`wake_priority`), so an engine that orders by priority evicts the
  session that wakes latest first; 0 on a session's last call (its blocks go first).
"""

from __future__ import annotations

import math
from typing import Any, Final

from .._protocol import CallMetadata, validate_nonneg

__all__ = [
    "DEFAULT_RETENTION_MARGIN_S",
    "DEFAULT_RETENTION_MAX_S",
    "ENDED_PRIORITY",
    "retention_directives",
    "retention_window",
    "wake_priority",
]

DEFAULT_RETENTION_MARGIN_S: Final = 2.0
"""Seconds added to the expected idle: a tool wait that runs a little long still finds
its cache."""
DEFAULT_RETENTION_MAX_S: Final = 600.0
"""Upper bound on a retention window (llm-d's ``kv-cache-hint`` clamps its own guess to
``maxTTL``, 10 min by default): a wrong declaration cannot hold KV for hours."""
ENDED_PRIORITY: Final = 0
"""The retention priority of a session's last call: evicted first."""

# (window up to, priority): a session waking within 10 s is kept hardest.
_PRIORITY_STEPS: Final = ((10.0, 80), (60.0, 70), (300.0, 60))
_PRIORITY_LONG: Final = 50


def wake_priority(window_s: float) -> int:
    """The retention priority (0-100, higher is kept longer) of a window: 80 up to
    10 s, 70 up to 1 min, 60 up to 5 min, 50 beyond."""
    for bound, priority in _PRIORITY_STEPS:
        if window_s <= bound:
            return priority
    return _PRIORITY_LONG


def check_window(margin_s: float, max_s: float) -> tuple[float, float]:
    """Validate a dialect's retention ``margin_s`` and ``max_s`` (seconds >= 0)."""
    margin = validate_nonneg(margin_s, "retention margin_s")
    cap = validate_nonneg(max_s, "retention max_s")
    if margin is None or cap is None:
        raise TypeError("retention margin_s and max_s must be numbers of seconds, not None")
    return margin, cap


def retention_window(meta: CallMetadata, margin_s: float, max_s: float) -> float | None:
    """Seconds the session's KV is worth keeping after this reply, rounded to ms; None
    on its last call or when its idle is unknown."""
    idle = meta.idle_expected_s
    if meta.final or idle is None or not math.isfinite(idle) or idle < 0:
        return None
    return round(min(idle + margin_s, max_s), 3)


def retention_directives(
    meta: CallMetadata, margin_s: float, max_s: float
) -> dict[str, Any] | None:
    """The body fields of vLLM's retention API (PR #38514) for one call, or None:
    ``retention_directives`` (one whole-prompt range: ``start`` 0, ``end`` null) and
    ``retention_scope`` (the session). On a session's last call, priority
    :data:`ENDED_PRIORITY` and no duration; with a known idle, :func:`wake_priority` of
    the window and ``duration`` = the window in seconds."""
    if meta.final:
        directive: dict[str, Any] = {"start": 0, "end": None, "priority": ENDED_PRIORITY}
    else:
        window = retention_window(meta, margin_s, max_s)
        if window is None:
            return None
        directive = {
            "start": 0,
            "end": None,
            "priority": wake_priority(window),
            "duration": window,
        }
    return {"retention_directives": [directive], "retention_scope": meta.session_id}
