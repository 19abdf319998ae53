"""The embedded engine's KV-cache events match its cache: what was stored minus what was
removed is what its accelerator holds, and a ledger of them knows each session's
residency as the engine does."""

from __future__ import annotations

import random

import pytest

from agentrt.scheduling._kvevents import BlockStored, KvEvent, KvLedger
from agentrt.sim._kv import GPU, KVCache, Node
from tests.sim._kv_steps import cache_sequence, seq, try_request


def gpu_ids(kv: KVCache) -> dict[int, int | None]:
    """Every accelerator block of the tree and the block before it (None at the root)."""
    out: dict[int, int | None] = {}
    stack: list[tuple[Node, int | None]] = [(c, None) for c in kv.root.children.values()]
    while stack:
        node, before = stack.pop()
        ids = [i for _, first, count in node.ids for i in range(first, first + count)]
        assert len(ids) == node.length
        if node.tier == GPU:
            for i in ids:
                out[i] = before
                before = i
        else:
            before = ids[-1]
        stack.extend((c, before) for c in node.children.values())
    return out


def path_blocks(kv: KVCache, node: Node | None) -> int:
    blocks = 0
    while node is not None and node is not kv.root:
        if node.alive and node.tier == GPU:
            blocks += node.length
        node = node.parent
    return blocks


@pytest.mark.parametrize("host_blocks", [0, 24])
def test_events_replay_to_the_cache(host_blocks: int) -> None:
    kv = KVCache(64, host_blocks, track_sessions=True)
    kv.block_size = 16
    batches: list[list[KvEvent]] = []
    ledger = KvLedger()

    def sink(events: list[KvEvent]) -> None:
        batches.append(events)
        ledger.apply(events)

    kv.on_events = sink
    rng = random.Random(7)
    live: dict[str, Node] = {}
    now = 0.0
    for step in range(600):
        now += 1.0
        who = rng.randrange(8)
        grown = 2 + step // 40 + rng.randrange(6)
        got = try_request(kv, who, grown, now)
        if got is None:
            continue
        node, private = got
        kv.release(node, private, now + 0.5)
        live[f"s{who}"] = node
        kv.check()
        assert dict(ledger.stored) == gpu_ids(kv), step
    assert kv.evicted_blocks > 0  # the cache was under pressure
    stored = sum(len(e.block_hashes) for b in batches for e in b if isinstance(e, BlockStored))
    assert stored - ledger.removed == kv.gpu_tree == len(ledger.stored)
    assert ledger.cached_tokens() == kv.gpu_tree * 16
    for session, node in live.items():
        assert ledger.resident(session) == path_blocks(kv, node) * 16, session


def test_events_carry_the_storing_session_and_chain() -> None:
    kv = KVCache(32, 0, track_sessions=True)
    kv.block_size = 16
    events: list[KvEvent] = []
    kv.on_events = events.extend
    a = seq("sys", 0, 2) + seq("a", 0, 3)
    cache_sequence(kv, a, "a", 1.0)
    kv.release(cache_sequence(kv, seq("sys", 0, 2) + seq("b", 0, 1), "b", 2.0), 0, 2.0)
    first, second = events
    assert isinstance(first, BlockStored) and isinstance(second, BlockStored)
    assert first.session_id == "a" and first.parent_block_hash is None
    assert len(first.block_hashes) == 5 and first.block_size == 16
    # b's block hangs below the shared prompt's second block (a split of a's node).
    assert second.session_id == "b" and second.parent_block_hash == first.block_hashes[1]
    # Without a sink, nothing is built and the ids are still kept.
    quiet = KVCache(32, 0, track_sessions=False)
    node = cache_sequence(quiet, a, "a", 1.0)
    assert node.ids and quiet.on_events is None
