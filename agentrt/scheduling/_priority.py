"""Priorities from attained service (Autellix's program-level least-attained-service)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

__all__ = ["DEFAULT_LEVELS_S", "plas_priority"]

DEFAULT_LEVELS_S: Final = (1.0, 4.0, 16.0, 64.0, 256.0)
"""Upper bounds (LLM seconds of attained service) of the discretized queues."""


def plas_priority(service_s: float, levels: Sequence[float] = DEFAULT_LEVELS_S) -> int:
    """The queue index of a program that has received ``service_s`` LLM seconds.

    0 runs first. A program that has received little service (a short or new job) is
    served before one that has received much (Autellix, PLAS with discretized queues).
    """
    for i, bound in enumerate(levels):
        if service_s < bound:
            return i
    return len(levels)
