"""Reading a replica's KV-cache events into its ledger (``Endpoint(kv_events=...)``).

One :class:`KvFeed` per endpoint that names an events address, run in the runtime's
background upkeep (``_upkeep.py``) while its block lasts. It subscribes to the engine's
ZMQ PUB socket (vLLM's ``--kv-events-config``; the address given, or those the server's
``GET /kv_event_sources`` lists), decodes each message's msgpack batch and applies it to
the endpoint's :class:`~agentrt.scheduling._kvevents.KvLedger`, which the endpoint's
working set (``WorkingSet.exact``) reads from its first batch on. The socket is read
without blocking (``NOBLOCK``, a short sleep while nothing comes), so the event loop never
waits on it, under asyncio and trio alike.

A replica served in-process by the embedded engine (``agentrt.sim``'s transport) hands
its events straight to the ledger instead (:func:`attach_inprocess`): no socket, the same
events, in virtual time.

pyzmq and msgspec are the ``kv-events`` extra, imported only here and only when an
endpoint asks for ZMQ.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

import anyio
import anyio.lowlevel
import httpx

from ._state import metrics_candidates
from .scheduling._kvevents import KvEvent, KvLedger, decode_batch

if TYPE_CHECKING:
    from ._state import _EndpointState

__all__ = ["MISSING_EXTRA", "KvFeed", "attach_inprocess", "check_extra", "source_addresses"]

log: Final = logging.getLogger("agentrt.kv_events")

MISSING_EXTRA: Final = (
    "Endpoint(kv_events=...) needs pyzmq and msgspec: pip install 'agentjct[kv-events]'"
)

_IDLE_S: Final = (0.02, 0.05, 0.1, 0.2)
"""Sleeps between reads while nothing comes (the longest once idle a while)."""
_MAX_PER_READ: Final = 256
"""Messages applied per read before the loop yields to other tasks."""
_DISCOVER_RETRY_S: Final = 5.0


def check_extra() -> None:
    """Raise :class:`RuntimeError` (one line, naming the extra) without pyzmq or msgspec."""
    try:
        import msgspec  # noqa: F401
        import zmq  # noqa: F401
    except ImportError:
        raise RuntimeError(MISSING_EXTRA) from None


def source_addresses(body: str, base_url: str) -> list[str]:
    """The ZMQ addresses a ``GET /kv_event_sources`` reply lists, a wildcard host
    (``tcp://*:5557``, as the publisher binds) replaced by the server's own host. vLLM
    0.32 answers an object by data-parallel rank of each publisher's resolved
    ``KVEventsConfig`` (``{"0": {"endpoint": ..., "topic": ..., ...}}``:
    ``vllm/entrypoints/serve/instrumentator/basic.py``); later vLLM a JSON array of
    ``{"data_parallel_rank", "endpoint", "replay_endpoint", "topic"}``."""
    try:
        data = json.loads(body)
    except ValueError:
        return []
    items: Any = data
    if isinstance(data, dict):
        items = data.get("sources") if "sources" in data else list(data.values())
    host = httpx.URL(base_url).host
    out: list[str] = []
    for item in items if isinstance(items, list) else []:
        addr = item.get("endpoint") if isinstance(item, dict) else None
        if not isinstance(addr, str) or not addr:
            continue
        if addr.startswith("tcp://"):
            where, _, port = addr[len("tcp://") :].rpartition(":")
            if where in ("*", "0.0.0.0", "::", "[::]", ""):
                addr = f"tcp://{host}:{port}"
        out.append(addr)
    return out


def _attach(ep: _EndpointState, ledger: KvLedger) -> None:
    if ep.working_set.exact is not ledger:
        ep.working_set.exact = ledger
        log.info("endpoint %s: reading its KV-cache events", ep.endpoint.url)


def attach_inprocess(
    ep: _EndpointState, subscribe: Callable[[Callable[[list[KvEvent]], None]], Callable[[], None]]
) -> Callable[[], None]:
    """Feed the endpoint's ledger from an in-process engine's events; returns the
    unsubscribe function."""
    ledger = KvLedger()

    def apply(events: list[KvEvent]) -> None:
        _attach(ep, ledger)
        ledger.apply(events)

    return subscribe(apply)


class KvFeed:
    """One endpoint's events read from ZMQ (module docstring). :meth:`run` until
    cancelled."""

    def __init__(
        self,
        ep: _EndpointState,
        fetch: Callable[[str], Awaitable[tuple[int, str] | None]],
    ) -> None:
        self._ep = ep
        self._fetch = fetch
        """GETs a URL with the endpoint's credentials: (status, body), or None."""
        self.ledger = KvLedger()
        self.gaps = 0
        """Messages the sequence numbers say were missed (the ledger may be off since)."""
        self.bad = 0
        """Messages that did not decode."""
        self.subscribed = False
        """Its socket is connected and subscribed (ZMQ joins a moment later: a PUB
        socket drops what it sends before a subscriber has joined)."""

    async def _addresses(self) -> list[str]:
        address = self._ep.endpoint.kv_events
        if address != "auto":
            return [] if address is None else [address]
        base = self._ep.endpoint.url
        # Beside its API (a path-prefixed replica's), then at its origin (vLLM's), as
        # its /metrics page is found.
        urls = [m.removesuffix("/metrics") + "/kv_event_sources" for m in metrics_candidates(base)]
        status = 0
        while True:
            for url in urls:
                reply = await self._fetch(url)
                if reply is None or reply[0] >= 500:
                    break  # not answering now: asked again later
                status, body = reply
                found = source_addresses(body, base) if status == 200 else []
                if found:
                    return found
            else:
                log.warning(
                    "endpoint %s: GET /kv_event_sources gave %s, no KV-events source; "
                    "give Endpoint(kv_events='tcp://HOST:PORT')",
                    base,
                    status,
                )
                return []
            await anyio.sleep(_DISCOVER_RETRY_S)

    async def run(self) -> None:
        addresses = await self._addresses()
        if not addresses:
            return
        import zmq

        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        sock = ctx.socket(zmq.SUB)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
            for address in addresses:
                sock.connect(address)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            self.subscribed = True
            await self._read(sock, zmq.NOBLOCK, zmq.Again)
        finally:
            sock.close(linger=0)

    async def _read(self, sock: Any, noblock: int, again: type[Exception]) -> None:
        ledger = self.ledger
        last: int | None = None
        idle = 0
        while True:
            got = 0
            while got < _MAX_PER_READ:
                try:
                    frames = sock.recv_multipart(noblock)
                except again:
                    break
                got += 1
                if len(frames) >= 3:
                    seq = int.from_bytes(frames[1], "big", signed=True)
                    if last is not None and seq > last + 1:
                        self.gaps += seq - last - 1
                    last = seq
                try:
                    events = decode_batch(frames[-1])
                except ValueError:
                    self.bad += 1
                    continue
                _attach(self._ep, ledger)
                ledger.apply(events)
            if got:
                idle = 0
                await anyio.lowlevel.checkpoint()
            else:
                await anyio.sleep(_IDLE_S[min(idle, len(_IDLE_S) - 1)])
                idle += 1
