"""``agentrt sim serve --kv-events-port PORT``: each replica publishes its KV cache's
events on a ZMQ PUB socket, as vLLM does with ``--kv-events-config``: replica ``i`` binds
``tcp://HOST:PORT+i`` and lists it at ``GET /replica-i/kv_event_sources``. Messages are
vLLM's: three frames, the topic (empty), an 8-byte big-endian sequence number and a
msgpack batch ``[ts, [event, ...], data_parallel_rank]`` whose events are maps tagged
``type`` (``scheduling/_kvevents.py``). Needs the ``kv-events`` extra (pyzmq, msgspec)."""

from __future__ import annotations

import time
from typing import Any

from ..scheduling._kvevents import KvEvent, event_to_wire

__all__ = ["ZmqPublisher", "sources_reply"]


def sources_reply(address: str) -> list[dict[str, Any]]:
    """What ``GET /kv_event_sources`` answers for a replica publishing on ``address``
    (the shape of later vLLM: a bare array, one entry per data-parallel rank)."""
    return [{"data_parallel_rank": 0, "endpoint": address, "replay_endpoint": None, "topic": ""}]


class ZmqPublisher:
    """One replica's events on a bound PUB socket; call it with each batch (the
    engine's ``subscribe_kv`` sink). A message that would block (no room at a slow
    subscriber) is dropped, as PUB sockets do: the sequence numbers show the gap."""

    def __init__(self, address: str) -> None:
        try:
            import msgspec
            import zmq
        except ImportError:
            raise RuntimeError(
                "--kv-events-port needs pyzmq and msgspec: pip install 'agentjct[kv-events]'"
            ) from None
        self.address = address
        self._zmq = zmq
        self._sock: Any = zmq.Context.instance().socket(zmq.PUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            self._sock.bind(address)
        except zmq.ZMQError as exc:
            self._sock.close(linger=0)
            raise RuntimeError(f"cannot publish KV events on {address}: {exc}") from None
        self._encode = msgspec.msgpack.Encoder().encode
        self._seq = 0

    def __call__(self, events: list[KvEvent]) -> None:
        payload = self._encode([time.time(), [event_to_wire(e) for e in events], 0])
        seq = self._seq
        self._seq = seq + 1
        try:
            self._sock.send_multipart([b"", seq.to_bytes(8, "big"), payload], self._zmq.NOBLOCK)
        except self._zmq.Again:
            pass

    def close(self) -> None:
        self._sock.close(linger=0)
