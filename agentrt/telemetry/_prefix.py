"""Prefix-sharing fingerprints for the journal: how much of a call's prompt it shares with
its session's previous call, and with calls of other sessions (a system prompt).

A request body is cut in :data:`BLOCK_BYTES` blocks and each block's CRC-32 is chained
over the blocks before it (as :func:`agentrt.scheduling.prefix_fingerprints` chains its
cuts; fixed blocks instead of its geometric cuts, so that a growing conversation's shared
prefix is measured to the block, not to the nearest power of four). Two bodies share
their first ``k`` blocks when their chains agree at ``k - 1`` (up to CRC collisions).
Only the CRCs are kept, never the text: the session's last chain, and a bounded table of
the chains' heads of each session's first call. The journal turns bytes into tokens
with the call's own ratio of prompt tokens to body bytes.

Cost: one ``zlib.crc32`` pass over the body (about 1 µs per KiB) and a short binary
search; only for runtimes that keep a journal.
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
MAX_SESSIONS: Final = 16_384
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


def _common(a: array[int], b: array[int]) -> int:
    """Leading blocks two chains share (chained: equal at k means equal before k)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[mid - 1] == b[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PrefixTracker:
    """Per runtime: each session's last chain and the heads of first calls."""

    __slots__ = ("_heads", "_sessions")

    def __init__(self) -> None:
        self._sessions: dict[str, tuple[array[int], int, str | None]] = {}
        """Per session: its last chain, and its common prefix (blocks, id)."""
        self._heads: dict[int, None] = {}

    def observe(self, session_id: str, body: bytes) -> PrefixFacts | None:
        """One call's facts, None for a body shorter than a block (nothing to tell);
        remembers its chain as the session's last."""
        blocks = chain(body)
        if not blocks:
            return None
        last = self._sessions.pop(session_id, None)
        if last is None:
            common = self._lookup(blocks)
            common_id = f"{blocks[common - 1]:08x}" if common else None
            heads = self._heads
            for crc in blocks[:HEAD_BLOCKS]:
                heads[crc] = None
            while len(heads) > MAX_HEADS:
                del heads[next(iter(heads))]
            prev = 0
        else:
            prev = _common(last[0], blocks)
            common, common_id = min(last[1], prev), last[2]
            if not common:
                common_id = None
        self._sessions[session_id] = (blocks, common, common_id)
        if len(self._sessions) > MAX_SESSIONS:
            del self._sessions[next(iter(self._sessions))]
        return (prev * BLOCK_BYTES, common * BLOCK_BYTES, common_id, len(body))

    def _lookup(self, blocks: array[int]) -> int:
        heads = self._heads
        lo, hi = 0, min(len(blocks), HEAD_BLOCKS)
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
