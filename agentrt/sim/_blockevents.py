"""A simulated replica's KV-cache events, as vLLM publishes them
(``agentrt.scheduling._kvevents``): built from the prefix tree's changes and handed to
whoever subscribed.

``BlockStored`` when blocks enter the accelerator part of the tree (computed and cached,
or loaded back from the host tier), with the hash of the block before them and the
session that stored them; ``BlockRemoved`` when they leave it (evicted, offloaded or
dropped). A block's hash is the id the tree gave it when it was first cached
(``Node.ids``, run-length encoded as the keys are). The cache calls the builders below
only while it has a sink (``KVCache.on_events``), which :class:`KvSubscribers` sets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..scheduling._kvevents import BlockRemoved, BlockStored, KvEvent
from ._kvtree import Node
from ._tokenize import Run

__all__ = ["KvSubscribers", "removed_event", "stored_event"]

Sink = Callable[[list[KvEvent]], None]


class _HasSink(Protocol):
    """What :class:`KvSubscribers` sets (``KVCache``)."""

    on_events: Sink | None


class KvSubscribers:
    """Who reads one cache's events: none (the cache builds nothing), one (the cache
    calls it directly) or several (a fan-out, in subscription order)."""

    __slots__ = ("_cache", "sinks")

    def __init__(self, cache: _HasSink) -> None:
        self._cache = cache
        self.sinks: list[Sink] = []

    def subscribe(self, sink: Sink) -> Callable[[], None]:
        """Hand the events to ``sink`` as they happen, until the returned function is
        called."""
        sinks = self.sinks
        sinks.append(sink)
        self._route()

        def unsubscribe() -> None:
            if sink in sinks:
                sinks.remove(sink)
                self._route()

        return unsubscribe

    def _route(self) -> None:
        sinks = self.sinks
        if not sinks:
            self._cache.on_events = None
        elif len(sinks) == 1:
            self._cache.on_events = sinks[0]
        else:

            def fan_out(events: list[KvEvent]) -> None:
                for sink in list(sinks):
                    sink(events)

            self._cache.on_events = fan_out


def stored_event(node: Node, ids: list[Run], root: Node, block_size: int) -> BlockStored:
    """``ids`` (blocks of ``node``) entered the accelerator's cache."""
    parent = node.parent
    if ids is not node.ids:  # blocks appended at its end: below its earlier ones
        first = ids[0][1]
        before = _id_before(node.ids, first)
    else:
        before = None
    if before is None and parent is not None and parent is not root:
        before = _last_id(parent.ids)
    session = node.session
    return BlockStored(
        _expand(ids), before, block_size, session if isinstance(session, str) else None
    )


def removed_event(ids: list[Run]) -> BlockRemoved:
    """``ids`` left the accelerator's cache."""
    return BlockRemoved(_expand(ids))


def _expand(ids: list[Run]) -> list[int]:
    if len(ids) == 1:
        _, first, count = ids[0]
        return list(range(first, first + count))
    return [i for _, first, count in ids for i in range(first, first + count)]


def _last_id(ids: list[Run]) -> int | None:
    if not ids:
        return None
    _, first, count = ids[-1]
    return first + count - 1


def _id_before(ids: list[Run], first: int) -> int | None:
    """The id before ``first`` in ``ids`` (None: ``first`` is the node's first block)."""
    prev: int | None = None
    for _, start, count in ids:
        if start <= first < start + count:
            return first - 1 if first > start else prev
        prev = start + count - 1
    return prev
