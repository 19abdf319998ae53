"""Prefix-sharing fingerprints for the journal: how much of a call's prompt it shares with
its session's previous call, and with calls of other sessions (a system prompt).

A request body is cut in :data:`BLOCK_BYTES` blocks and CRC-32 is chained over them (as
:func:`agentrt.scheduling.prefix_fingerprints` chains its cuts): the chain's value after
``k`` blocks is the CRC of the body's first ``k`` blocks, so two bodies share their first
``k`` blocks when their values at ``k`` agree (up to CRC collisions). Per session the
values of its last body are kept at a few *checkpoints*: after 1, 2, 4, 8, ... blocks and
after its last three full blocks. The next call computes its own values at those
checkpoints (and at its own) in one pass over its body; the largest that agrees is what
it shares with the previous call: to the block when the conversation grew by appending
(the previous body ends within its last two blocks of messages), to the nearest power of
two when it was edited. A session's first call is also hashed block by block over its
first :data:`HEAD_BLOCKS` blocks, into a bounded table shared by all sessions: the longest
head already in it is the prefix shared across sessions (a system prompt, tool
definitions). Only CRCs are kept, never the text. The journal turns bytes into tokens
with the call's own ratio of prompt tokens to body bytes.

Cost: one ``zlib.crc32`` pass over the body (about 1 µs per KiB) and a few dozen
operations; a session's first call hashes its head twice. Only runtimes that keep a
journal pay it.
"""

from __future__ import annotations

import zlib
from array import array
from typing import Final

__all__: list[str] = []

BLOCK_BYTES: Final = 1024
"""Bytes per hashed block of a request body."""
HEAD_BLOCKS: Final = 64
"""Blocks of a session's first call remembered for sharing across sessions (64 KiB)."""
MAX_HEADS: Final = 65_536
"""Chain values remembered across sessions (oldest forgotten first)."""
MAX_SESSIONS: Final = 65_536
"""Sessions whose last chain is remembered (oldest forgotten first)."""

PrefixFacts = tuple[int, int, str | None, int]
"""(bytes shared with the session's previous call, bytes shared across sessions, the
common prefix's id, the body's bytes)."""


def chain(body: bytes) -> array[int]:
    """The chained CRC-32 of each full :data:`BLOCK_BYTES` block of ``body`` (4 bytes
    each)."""
    view = memoryview(body)
    out = array("I")
    crc = 0
    for start in range(0, len(view) - BLOCK_BYTES + 1, BLOCK_BYTES):
        crc = zlib.crc32(view[start : start + BLOCK_BYTES], crc)
        out.append(crc)
    return out


def _checkpoints(body: memoryview, ks: list[int]) -> dict[int, int]:
    """The chain's values after each of ``ks`` blocks (sorted), in one pass."""
    out: dict[int, int] = {}
    crc = 0
    done = 0
    for k in ks:
        crc = zlib.crc32(body[done * BLOCK_BYTES : k * BLOCK_BYTES], crc)
        out[k] = crc
        done = k
    return out


def _powers(n: int) -> list[int]:
    out = []
    k = 1
    while k <= n:
        out.append(k)
        k *= 2
    return out


class PrefixTracker:
    """Per runtime: each session's last checkpoints and the heads of first calls."""

    __slots__ = ("_heads", "_sessions")

    def __init__(self) -> None:
        self._sessions: dict[str, tuple[dict[int, int], int, str | None]] = {}
        """Per session: its last body's checkpoints, and its common prefix (blocks, id)."""
        self._heads: dict[int, None] = {}

    def observe(self, session_id: str, body: bytes) -> PrefixFacts | None:
        """One call's facts, None for a body shorter than a block (nothing to tell);
        remembers its checkpoints as the session's last."""
        n = len(body) // BLOCK_BYTES
        if not n:
            return None
        view = memoryview(body)
        last = self._sessions.pop(session_id, None)
        mine = _powers(n)
        if n not in mine:
            mine.append(n)
        tail = [k for k in (n - 1, n - 2) if k > 0 and k not in mine]
        if last is None:
            head = chain(body[: HEAD_BLOCKS * BLOCK_BYTES])
            common = self._lookup(head)
            common_id = f"{head[common - 1]:08x}" if common else None
            heads = self._heads
            for crc in head:
                heads[crc] = None
            while len(heads) > MAX_HEADS:
                del heads[next(iter(heads))]
            points = _checkpoints(view, sorted(mine + tail))
            prev = 0
        else:
            before, common, common_id = last
            points = _checkpoints(view, sorted({*mine, *tail, *(k for k in before if k <= n)}))
            prev = max((k for k, crc in before.items() if points.get(k) == crc), default=0)
            common = min(common, prev)
            if not common:
                common_id = None
        self._sessions[session_id] = (
            {k: points[k] for k in (*mine, *tail)},
            common,
            common_id,
        )
        if len(self._sessions) > MAX_SESSIONS:
            del self._sessions[next(iter(self._sessions))]
        return (prev * BLOCK_BYTES, common * BLOCK_BYTES, common_id, len(body))

    def _lookup(self, blocks: array[int]) -> int:
        heads = self._heads
        lo, hi = 0, len(blocks)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if blocks[mid - 1] in heads:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def forget(self, session_id: str) -> None:
        """The session ended."""
        self._sessions.pop(session_id, None)


def tokens(shared_bytes: int, body_bytes: int, prompt_tokens: int | None) -> int | None:
    """Shared bytes as prompt tokens, at the call's own tokens per byte."""
    if prompt_tokens is None or body_bytes <= 0:
        return None
    return min(prompt_tokens, round(prompt_tokens * shared_bytes / body_bytes))
