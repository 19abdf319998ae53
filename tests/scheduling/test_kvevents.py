"""The KV-event ledger (scheduling/_kvevents.py) on hand-made batches in vLLM's wire
format, and WorkingSet reading it."""

from __future__ import annotations

from typing import Any

import pytest

from agentrt.scheduling._kvevents import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvLedger,
    decode_batch,
    events_from_wire,
)
from agentrt.scheduling._workingset import WorkingSet

msgspec = pytest.importorskip("msgspec")

BS = 16


def h(i: int) -> bytes:
    """A block hash as vLLM sends it (bytes)."""
    return i.to_bytes(8, "big")


def stored(
    hashes: list[int], parent: int | None, session: str | None = None, **more: Any
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": "BlockStored",
        "block_hashes": [h(x) for x in hashes],
        "parent_block_hash": None if parent is None else h(parent),
        "token_ids": list(range(BS * len(hashes))),
        "block_size": BS,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    if session is not None:
        event["session_id"] = session
    event.update(more)
    return event


def removed(hashes: list[int], medium: str = "GPU") -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": [h(x) for x in hashes], "medium": medium}


def wire(*events: dict[str, Any]) -> bytes:
    """One batch as vLLM 0.32 publishes it: an array ``[ts, events, dp_rank]`` of
    events encoded as maps tagged ``type`` (omit_defaults)."""
    return bytes(msgspec.msgpack.encode([1.5, list(events), 0]))


def apply(ledger: KvLedger, *events: dict[str, Any]) -> None:
    ledger.apply(decode_batch(wire(*events)))


def test_decodes_map_and_array_batches() -> None:
    as_map = msgspec.msgpack.encode({"ts": 1.0, "events": [stored([1, 2], None, "s")]})
    (event,) = decode_batch(as_map)
    assert event == BlockStored([h(1), h(2)], None, BS, "s", "GPU")
    # Older vLLM: array_like structs, the tag first, then the fields in order.
    arrays = [
        1.0,
        [
            ["BlockStored", [7, 8], 6, list(range(2 * BS)), BS, None, "GPU"],
            ["BlockRemoved", [7], "GPU"],
            ["AllBlocksCleared"],
            ["SomethingNew", 1],
        ],
    ]
    got = events_from_wire(msgspec.msgpack.decode(msgspec.msgpack.encode(arrays)))
    assert got == [
        BlockStored([7, 8], 6, BS, None, "GPU"),
        BlockRemoved([7], "GPU"),
        AllBlocksCleared(),
    ]
    with pytest.raises(ValueError, match="not a KV event batch"):
        decode_batch(b"\xc1")
    with pytest.raises(ValueError, match="not a KV event batch"):
        events_from_wire(3)


def test_cached_tokens_track_stores_and_evictions() -> None:
    ledger = KvLedger()
    apply(ledger, stored([1, 2, 3], None, "a"), stored([4, 5], 3, "a"))
    assert ledger.cached_tokens() == 5 * BS
    apply(ledger, removed([5, 4]))
    assert ledger.cached_tokens() == 3 * BS
    assert ledger.removed == 2
    assert ledger.capacity_seen() == 5 * BS  # it held 5 blocks when it had to evict
    # Another medium (an offload tier) is not the accelerator's cache.
    apply(ledger, stored([9], None, "b", medium="CPU"), removed([1], medium="CPU"))
    assert ledger.cached_tokens() == 3 * BS
    apply(ledger, removed([99]))  # unknown: nothing to remove
    assert ledger.cached_tokens() == 3 * BS and ledger.removed == 2
    ledger.apply([AllBlocksCleared()])
    assert ledger.cached_tokens() == 0
    assert ledger.resident("a") == 0


def test_session_residency_follows_its_chain_and_shared_prefix() -> None:
    ledger = KvLedger()
    # s1's first turn: a shared system prompt (1, 2) then its own blocks.
    apply(ledger, stored([1, 2], None, "s1"), stored([10, 11], 2, "s1"))
    # s2 reuses the prompt (no event for reused blocks) and stores its own below it.
    apply(ledger, stored([20, 21, 22], 2, "s2"))
    assert ledger.resident("s1") == 4 * BS
    assert ledger.resident("s2") == 5 * BS  # the shared prefix counts for it too
    assert ledger.cached_tokens() == 7 * BS
    # s1 resumes: its new blocks extend its own chain.
    apply(ledger, stored([12], 11, "s1"))
    assert ledger.resident("s1") == 5 * BS
    # Evicted tail first: s2 loses two blocks, s1 none.
    apply(ledger, removed([22, 21]))
    assert ledger.resident("s2") == 3 * BS and ledger.resident("s1") == 5 * BS
    # The shared block goes: both lose it.
    apply(ledger, removed([20, 12, 11, 10, 2]))
    assert ledger.resident("s1") == 1 * BS and ledger.resident("s2") == 1 * BS
    # s2 comes back and its blocks are cached again: they count again.
    apply(ledger, stored([2], 1, "s2"), stored([20, 21], 2, "s2"))
    assert ledger.resident("s2") == 4 * BS
    assert ledger.resident("s1") == 2 * BS  # block 2 is s1's too
    assert ledger.resident("nobody") is None
    ledger.forget("s2")
    assert ledger.resident("s2") is None
    assert ledger.cached_tokens() == 4 * BS  # forgetting a session keeps its blocks


def test_a_rewritten_conversation_cuts_the_chain() -> None:
    ledger = KvLedger()
    apply(ledger, stored([1, 2, 3, 4], None, "s"))
    # The next turn diverges after block 2 (a re-rendered reply): 5, 6 below it.
    apply(ledger, stored([5, 6], 2, "s"))
    assert ledger.chain_tokens("s") == 4 * BS
    assert ledger.resident("s") == 4 * BS
    apply(ledger, removed([4, 3]))  # the old branch goes: not the session's any more
    assert ledger.resident("s") == 4 * BS
    apply(ledger, removed([6]))
    assert ledger.resident("s") == 3 * BS
    # A new conversation from the root under the same id.
    apply(ledger, stored([30], None, "s"))
    assert ledger.chain_tokens("s") == 1 * BS == ledger.resident("s")


def test_untagged_events_are_assigned_where_they_can_be() -> None:
    ledger = KvLedger()
    # One call in flight: its stores are its own.
    ledger.started("a")
    apply(ledger, stored([1, 2, 3], None))
    ledger.finished("a")
    assert ledger.resident("a") == 3 * BS
    # Two in flight: a store extending a's chain at its tip is a's.
    ledger.started("a")
    ledger.started("b")
    apply(ledger, stored([4], 3))
    assert ledger.resident("a") == 4 * BS and ledger.resident("b") is None
    # Concurrent first turns below a shared block: ambiguous, left unassigned.
    ledger.started("c")
    apply(ledger, stored([40], 1), stored([50], 1))
    assert ledger.resident("b") is None and ledger.resident("c") is None
    assert ledger.unassigned == 2
    assert ledger.cached_tokens() == 6 * BS
    # b's next turn is tagged (or b runs alone): its chain is followed back through the
    # stored parents, shared prefix included.
    ledger.finished("a")
    ledger.finished("c")
    apply(ledger, stored([41], 40))
    assert ledger.resident("b") == 3 * BS  # blocks 1, 40, 41


def test_shadow_reads_the_ledger() -> None:
    shadow = WorkingSet(capacity=100 * BS, source="engine")
    shadow.start("a", 10 * BS)
    shadow.finish("a", 10 * BS, None)
    shadow.start("b", 95 * BS)
    shadow.finish("b", 95 * BS, None)
    estimate = shadow.resident("a")
    assert estimate == 5 * BS  # LRU: b's 95 blocks ran after a's 10 on a 100-block cache
    ledger = KvLedger()
    shadow.exact = ledger
    assert shadow.cached_tokens() == 0
    # No block assigned to a yet: the estimate stands.
    assert shadow.resident("a") == estimate
    apply(ledger, stored(list(range(1, 11)), None, "a"))
    assert shadow.resident("a") == 10 * BS  # all of it is cached, whatever LRU said
    apply(ledger, removed([10, 9, 8]))
    assert shadow.resident("a") == 7 * BS
    assert shadow.cached_tokens() == 7 * BS
    # The capacity is what the cache held when it evicted, not guessed from replies.
    shadow2 = WorkingSet()
    shadow2.exact = KvLedger()
    shadow2.observe(distance=1000, previous=2000, cached=0)
    assert shadow2.capacity_tokens is None and shadow2.evictions == 0
    apply(shadow2.exact, stored([1, 2, 3], None, "x"), removed([3]))
    assert shadow2.capacity_tokens == 3 * BS and shadow2.source == "learned"
    # A session that leaves is forgotten by the ledger too.
    shadow.leave("a")
    assert ledger.resident("a") is None
    # Calls in flight reach the ledger: an untagged store of a lone call is its own.
    shadow.start("b", 95 * BS)
    apply(ledger, stored([70], None))
    assert ledger.resident("b") == BS
    shadow.finish("b", 96 * BS, None)
