"""Random bytes for ids and routing salts, from one replaceable source.

Every id agentrt makes (jobs, sessions, calls) and each router's per-process salt draw
their bytes here: ``os.urandom`` in production, so that ids made by independent processes
never collide and ties broken by them never correlate across a fleet. A virtual-time
replay (``agentrt.bench``) replaces the source with a seeded generator for its duration
(:func:`seeded`), so that a replay, its routing included, is the same on every run.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["new_id", "random_bytes", "seeded"]

_source: Callable[[int], bytes] = os.urandom


def random_bytes(n: int) -> bytes:
    """``n`` random bytes from the current source (``os.urandom`` unless seeded)."""
    return _source(n)


def new_id(prefix: str) -> str:
    """An id for a job, session or call: ``prefix``, a dash and 16 hex digits."""
    return f"{prefix}-{random_bytes(8).hex()}"


@contextmanager
def seeded(seed: int | str) -> Iterator[None]:
    """Draw from ``random.Random(seed)`` instead of ``os.urandom`` inside the block (for
    deterministic replays; not for production ids)."""
    global _source
    previous = _source
    _source = random.Random(seed).randbytes
    try:
        yield
    finally:
        _source = previous
