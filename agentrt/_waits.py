"""Expected tool waits, learned online from the waits a runtime observes.

One :class:`WaitEstimator` per runtime keeps, for each tool name, the durations of its
most recent waits in a fixed-size ring (``window`` of them) and estimates the next wait
as their **median**. The median, not the mean: tool waits are heavy-tailed (one timeout
or one slow page would drag a mean far from the typical wait), and the decisions the
estimate feeds (keep, offload or drop a session's KV; deprioritise an idle session) are
threshold decisions, for which "the wait exceeds X as often as not" is the right point.
A recent window, not all history, so that the estimate follows a tool whose latency
drifts. Memory is bounded: ``window`` floats per tool, and at most ``max_tools`` tools,
the least recently used one forgotten first. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable
from typing import Final

__all__ = ["DEFAULT_MAX_TOOLS", "DEFAULT_WINDOW", "WaitEstimator"]

DEFAULT_WINDOW: Final = 32
"""Recent waits kept per tool."""
DEFAULT_MAX_TOOLS: Final = 256
"""Tool names tracked at once (least recently used forgotten first)."""


class _Ring:
    """The last ``size`` waits of one tool, and their median (cached until the next)."""

    __slots__ = ("median", "n", "next", "values")

    def __init__(self) -> None:
        self.values: list[float] = []
        self.next = 0
        self.n = 0
        self.median: float | None = None

    def add(self, value: float, size: int) -> None:
        if len(self.values) < size:
            self.values.append(value)
        else:
            self.values[self.next] = value
            self.next = (self.next + 1) % size
        self.n += 1
        self.median = None

    def estimate(self) -> float:
        if self.median is None:
            ordered = sorted(self.values)
            mid = len(ordered) // 2
            if len(ordered) % 2:
                self.median = ordered[mid]
            else:
                self.median = (ordered[mid - 1] + ordered[mid]) / 2
        return self.median


class WaitEstimator:
    """Per-tool expected wait: the median of the tool's last ``window`` observed waits."""

    __slots__ = ("_rings", "max_tools", "window")

    def __init__(self, window: int = DEFAULT_WINDOW, max_tools: int = DEFAULT_MAX_TOOLS) -> None:
        if window < 1 or max_tools < 1:
            raise ValueError("window and max_tools must be >= 1")
        self.window = window
        self.max_tools = max_tools
        self._rings: OrderedDict[str, _Ring] = OrderedDict()

    def __len__(self) -> int:
        """Tool names tracked now (never more than ``max_tools``)."""
        return len(self._rings)

    def observe(self, tool: str, duration_s: float) -> None:
        """Record one finished wait of ``tool`` (negative or non-finite ones are ignored)."""
        if not (math.isfinite(duration_s) and duration_s >= 0.0):
            return
        rings = self._rings
        ring = rings.get(tool)
        if ring is None:
            ring = rings[tool] = _Ring()
            if len(rings) > self.max_tools:
                rings.popitem(last=False)
        else:
            rings.move_to_end(tool)
        ring.add(duration_s, self.window)

    def estimate(self, tool: str) -> float | None:
        """The expected wait of ``tool``, or None when none of its waits was observed."""
        ring = self._rings.get(tool)
        return None if ring is None else ring.estimate()

    def estimate_many(self, tools: Iterable[str]) -> float | None:
        """The expected idle of a turn that runs ``tools``: the sum of the known tools'
        estimates (like ``idle_declared_s``, the sum of a period's expectations), or None
        when none of them is known. Tools never seen add nothing, so the sum is a lower
        bound when some are unknown, and an upper one when the tools run concurrently."""
        total: float | None = None
        for tool in tools:
            value = self.estimate(tool)
            if value is not None:
                total = value if total is None else total + value
        return total

    def observed(self, tool: str) -> int:
        """How many waits of ``tool`` were observed (0 once it was forgotten)."""
        ring = self._rings.get(tool)
        return 0 if ring is None else ring.n

    def memory(self) -> int:
        """Stored durations in all (bounded by ``window * max_tools``)."""
        return sum(len(r.values) for r in self._rings.values())
