"""Exact KV residency from an engine's KV-cache events: one replica's ledger.

vLLM (``--kv-events-config``) and SGLang publish every change of their prefix cache on a
ZMQ PUB socket as msgpack batches: ``BlockStored`` (blocks newly cached, each identified
by a hash chained to its parent's, with the hash of the block before the first),
``BlockRemoved`` (blocks evicted) and ``AllBlocksCleared`` (the cache was reset). The
schema is vLLM's ``vllm/distributed/kv_events.py`` (``KVEventBatch``: ``ts``, ``events``,
``data_parallel_rank``; read at vllm-project/vllm commits b4e69e0a and 0181ea31, where
batches and events are arrays, then maps tagged ``type``); vLLM 0.32 adds the request's
``session_id`` (its body ``session_id`` or ``X-Session-ID`` header, which agentrt's vLLM
dialect sends) to ``BlockStored``. The embedded engine (``agentrt.sim``) publishes the same.

:class:`KvLedger` applies decoded events (:func:`events_from_wire` turns a decoded batch
into them) and answers, exactly:

* :meth:`KvLedger.cached_tokens`: the tokens the replica's accelerator caches now (its
  stored blocks times their size);
* :meth:`KvLedger.resident`: how many tokens of a session's context are still cached
  there: the blocks of its chain (the path from the root to the last block it stored,
  shared prefix included) that are still stored.

Which session stored a block: the event's ``session_id`` where the engine sends it
(exact). Without one (SGLang, an older vLLM), a batch is the session's that a call is in
flight for (:meth:`KvLedger.started`) when it extends that session's own chain, or when
only one session has a call in flight there; otherwise (concurrent first turns below a
shared prefix, or several calls resuming below one shared block) it is left unassigned:
the blocks count in :meth:`cached_tokens`, and the sessions concerned have no exact figure
(None) until one of their later turns extends a chain the ledger can follow back.

Pure bookkeeping: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "KvEvent",
    "KvLedger",
    "event_to_wire",
    "events_from_wire",
]

GPU: Final = "GPU"
"""vLLM's medium of the accelerator's cache (a block cached elsewhere, an offload tier,
carries another)."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks newly cached, in chain order: the first one's parent is
    ``parent_block_hash`` (None: at the root), each next one's the block before it."""

    block_hashes: Sequence[Hashable]
    parent_block_hash: Hashable | None
    block_size: int
    session_id: str | None = None
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks evicted from the cache."""

    block_hashes: Sequence[Hashable]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The whole cache was reset."""


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared

# Array-encoded events (vLLM's ``array_like`` structs): the tag, then the fields in order.
_STORED_FIELDS: Final = ("block_hashes", "parent_block_hash", "token_ids", "block_size")


def _hash(value: Any) -> Hashable:
    return bytes(value) if isinstance(value, bytearray | list) else value


def _event(raw: Any) -> KvEvent | None:
    """One wire event (a map tagged ``type`` or an array led by its tag), or None for an
    event of another kind."""
    if isinstance(raw, dict):
        kind = raw.get("type")
        fields = raw
    elif isinstance(raw, list | tuple) and raw and isinstance(raw[0], str):
        kind = raw[0]
        names: tuple[str, ...] = ()
        if kind == "BlockStored":
            names = (*_STORED_FIELDS, "lora_id", "medium")
        elif kind == "BlockRemoved":
            names = ("block_hashes", "medium")
        fields = dict(zip(names, raw[1:], strict=False))
    else:
        return None
    if kind == "BlockStored":
        hashes = [_hash(h) for h in fields.get("block_hashes") or ()]
        parent = fields.get("parent_block_hash")
        size = fields.get("block_size")
        tokens = fields.get("token_ids")
        if not isinstance(size, int) or size <= 0:
            size = len(tokens) // len(hashes) if tokens and hashes else 0
        session = fields.get("session_id")
        medium = fields.get("medium")
        return BlockStored(
            hashes,
            None if parent is None else _hash(parent),
            size,
            session if isinstance(session, str) and session else None,
            medium if isinstance(medium, str) else None,
        )
    if kind == "BlockRemoved":
        medium = fields.get("medium")
        return BlockRemoved(
            [_hash(h) for h in fields.get("block_hashes") or ()],
            medium if isinstance(medium, str) else None,
        )
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def events_from_wire(batch: Any) -> list[KvEvent]:
    """The events of one decoded msgpack batch (``[ts, events, ...]`` or ``{"ts": ...,
    "events": [...]}``), in order; events of other kinds are skipped. A batch of
    another shape raises :class:`ValueError`."""
    if isinstance(batch, dict):
        raw = batch.get("events")
    elif isinstance(batch, list | tuple) and len(batch) >= 2:
        raw = batch[1]
    else:
        raise ValueError(f"not a KV event batch: {type(batch).__name__}")
    if not isinstance(raw, list | tuple):
        raise ValueError("not a KV event batch: no event list")
    return [e for e in map(_event, raw) if e is not None]


def event_to_wire(event: KvEvent) -> dict[str, Any]:
    """One event as vLLM 0.32 encodes it in a batch: a map tagged ``type``, the
    required fields always, the optional ones only when set (``omit_defaults``). No
    token ids (an empty list): the embedded engine has none to give."""
    if isinstance(event, BlockStored):
        out: dict[str, Any] = {
            "type": "BlockStored",
            "block_hashes": list(event.block_hashes),
            "parent_block_hash": event.parent_block_hash,
            "token_ids": [],
            "block_size": event.block_size,
            "lora_id": None,
            "medium": event.medium or GPU,
            "lora_name": None,
        }
        if event.session_id is not None:
            out["session_id"] = event.session_id
        return out
    if isinstance(event, BlockRemoved):
        return {
            "type": "BlockRemoved",
            "block_hashes": list(event.block_hashes),
            "medium": event.medium or GPU,
        }
    return {"type": "AllBlocksCleared"}


def decode_batch(payload: bytes) -> list[KvEvent]:
    """The events of one msgpack payload (the last frame of a ZMQ message). Needs msgspec
    (the ``kv-events`` extra)."""
    import msgspec

    try:
        batch = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not a KV event batch: {exc}") from None
    return events_from_wire(batch)


class _Chain:
    __slots__ = ("blocks", "resident")

    def __init__(self) -> None:
        self.blocks: list[Hashable] = []
        """Its path from the root (or from the first block the ledger could follow back
        to) to the last block it stored."""
        self.resident = 0
        """How many of ``blocks`` are stored now."""


class KvLedger:
    """One replica's cache, as its events tell it (module docstring).

    ``stored`` maps each block cached on the accelerator to its parent; the sessions'
    chains list the blocks of their contexts, stored or not, so that a block evicted and
    cached again counts for them again.
    """

    __slots__ = (
        "_chains",
        "_in_flight",
        "_owners",
        "block_size",
        "cleared",
        "events",
        "peak_at_eviction",
        "removed",
        "stored",
        "unassigned",
    )

    def __init__(self) -> None:
        self.stored: dict[Hashable, Hashable | None] = {}
        self.block_size = 0
        """Tokens per block (from the events; 0 until a block is stored)."""
        self._chains: dict[str, _Chain] = {}
        self._owners: dict[Hashable, set[str]] = {}
        """The sessions whose chain holds each block."""
        self._in_flight: dict[str, int] = {}
        """Sessions with calls in flight here, and how many (untagged events are theirs)."""
        self.events = 0
        """Events applied."""
        self.removed = 0
        """Blocks removed (evictions), over the ledger's life."""
        self.cleared = 0
        """``AllBlocksCleared`` events applied."""
        self.unassigned = 0
        """Stored blocks whose session could not be told (untagged, ambiguous)."""
        self.peak_at_eviction = 0
        """The most blocks stored when an eviction came: the cache was full then, so its
        capacity is at least this (and, with its running requests' blocks, about it)."""

    # ------------------------------------------------------------ what it answers

    def cached_tokens(self) -> int:
        """Tokens cached on the accelerator now."""
        return len(self.stored) * self.block_size

    def capacity_seen(self) -> int | None:
        """Tokens the cache held when it last had to evict at its fullest (a lower bound
        on its capacity), or None before any eviction."""
        return self.peak_at_eviction * self.block_size or None

    def resident(self, session_id: str) -> int | None:
        """Tokens of the session's context still cached here, or None when the ledger
        cannot tell (no block of it was assigned to it)."""
        chain = self._chains.get(session_id)
        if chain is None:
            return None
        return chain.resident * self.block_size

    def chain_tokens(self, session_id: str) -> int | None:
        """Tokens of the session's context the ledger knows (stored or not), or None."""
        chain = self._chains.get(session_id)
        return None if chain is None else len(chain.blocks) * self.block_size

    def sessions(self) -> list[str]:
        """The sessions with a chain here."""
        return list(self._chains)

    # ------------------------------------------------------------ what the client says

    def started(self, session_id: str) -> None:
        """A call of the session was sent here (its untagged stores may be assigned)."""
        self._in_flight[session_id] = self._in_flight.get(session_id, 0) + 1

    def finished(self, session_id: str) -> None:
        """A call of the session here ended."""
        n = self._in_flight.get(session_id, 0) - 1
        if n > 0:
            self._in_flight[session_id] = n
        else:
            self._in_flight.pop(session_id, None)

    def forget(self, session_id: str) -> None:
        """The session ended or moved away: its chain is dropped (its blocks stay
        counted in :meth:`cached_tokens` while they are stored)."""
        self._in_flight.pop(session_id, None)
        chain = self._chains.pop(session_id, None)
        if chain is not None:
            self._disown(session_id, chain.blocks)

    # ------------------------------------------------------------ what the engine says

    def apply(self, events: Iterable[KvEvent]) -> None:
        """Apply events, in the order the engine published them."""
        for event in events:
            self.events += 1
            if isinstance(event, BlockStored):
                if event.medium is None or event.medium == GPU:
                    self._stored(event)
            elif isinstance(event, BlockRemoved):
                if event.medium is None or event.medium == GPU:
                    self._removed(event.block_hashes)
            else:
                self._clear()

    def _stored(self, event: BlockStored) -> None:
        hashes = event.block_hashes
        if not hashes:
            return
        if event.block_size:
            self.block_size = event.block_size
        stored = self.stored
        owners = self._owners
        chains = self._chains
        parent = event.parent_block_hash
        for h in hashes:
            if h not in stored:
                for owner in owners.get(h, ()):
                    chains[owner].resident += 1
            stored[h] = parent
            parent = h
        sid = event.session_id or self._guess(event.parent_block_hash)
        if sid is None:
            self.unassigned += len(hashes)
            return
        self._extend(sid, event.parent_block_hash, hashes)

    def _guess(self, parent: Hashable | None) -> str | None:
        """The session an untagged store belongs to (module docstring), or None."""
        flying = self._in_flight
        if parent is not None:
            tips = [
                sid
                for sid in self._owners.get(parent, ())
                if sid in flying and self._chains[sid].blocks[-1] == parent
            ]
            if len(tips) == 1:
                return tips[0]
        return next(iter(flying)) if len(flying) == 1 else None

    def _extend(self, sid: str, parent: Hashable | None, hashes: Sequence[Hashable]) -> None:
        chain = self._chains.get(sid)
        if chain is None:
            chain = self._chains[sid] = _Chain()
        blocks = chain.blocks
        if parent is None:
            self._disown(sid, blocks)
            blocks.clear()
            chain.resident = 0
        elif not blocks or blocks[-1] != parent:
            if sid in self._owners.get(parent, ()):
                # Its own earlier block: the conversation was rewritten after it.
                cut = len(blocks) - 1 - blocks[::-1].index(parent)
                tail = blocks[cut + 1 :]
                del blocks[cut + 1 :]
                self._disown(sid, tail)
                chain.resident -= sum(1 for h in tail if h in self.stored)
            else:
                # Below another session's blocks (a shared prefix): follow the parents
                # back while they are stored.
                self._disown(sid, blocks)
                blocks.clear()
                path: list[Hashable] = []
                h: Hashable | None = parent
                seen: set[Hashable] = set()
                while h is not None and h in self.stored and h not in seen:
                    seen.add(h)
                    path.append(h)
                    h = self.stored[h]
                path.reverse()
                self._own(sid, path)
                blocks.extend(path)
                chain.resident = len(path)
        self._own(sid, hashes)
        blocks.extend(hashes)
        chain.resident += sum(1 for h in hashes if h in self.stored)

    def _own(self, sid: str, hashes: Iterable[Hashable]) -> None:
        owners = self._owners
        for h in hashes:
            held = owners.get(h)
            if held is None:
                owners[h] = {sid}
            else:
                held.add(sid)

    def _disown(self, sid: str, hashes: Iterable[Hashable]) -> None:
        owners = self._owners
        for h in hashes:
            held = owners.get(h)
            if held is not None:
                held.discard(sid)
                if not held:
                    del owners[h]

    def _removed(self, hashes: Sequence[Hashable]) -> None:
        stored = self.stored
        if len(stored) > self.peak_at_eviction:
            self.peak_at_eviction = len(stored)
        owners = self._owners
        chains = self._chains
        for h in hashes:
            if stored.pop(h, _MISSING) is _MISSING:
                continue
            self.removed += 1
            for sid in owners.get(h, ()):
                chains[sid].resident -= 1

    def _clear(self) -> None:
        self.cleared += 1
        self.stored.clear()
        for chain in self._chains.values():
            chain.resident = 0


_MISSING: Final = object()
