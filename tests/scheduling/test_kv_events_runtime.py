"""Endpoint(kv_events=...): the runtime reads a replica's KV-cache events into the
endpoint's working set, over ZMQ (a real PUB socket here) or in-process from the
embedded engine."""

from __future__ import annotations

import builtins
import json
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest

import agentrt
from agentrt import Endpoint
from agentrt._kvfeed import MISSING_EXTRA, source_addresses
from agentrt.scheduling._kvevents import KvLedger
from agentrt.sim import Cluster

pytestmark = pytest.mark.anyio


def test_endpoint_checks_its_events_address() -> None:
    assert Endpoint("http://h/v1", kv_events="tcp://h:5557").kv_events == "tcp://h:5557"
    assert Endpoint("http://h/v1", kv_events="auto").kv_events == "auto"
    for bad in ("h:5557", "http://h:5557", "", 5557):
        with pytest.raises(ValueError, match="kv_events must be a ZMQ address"):
            Endpoint("http://h/v1", kv_events=bad)  # type: ignore[arg-type]


def test_sources_listed_by_the_server() -> None:
    base = "http://10.1.2.3:8000/v1"
    # vLLM 0.32: each data-parallel rank's publisher config, by rank.
    v032 = {"0": {"enable_kv_cache_events": True, "endpoint": "tcp://*:5557", "topic": "kv"}}
    assert source_addresses(json.dumps(v032), base) == ["tcp://10.1.2.3:5557"]
    # Later vLLM: a bare array.
    later = [
        {"data_parallel_rank": 0, "endpoint": "tcp://10.0.0.1:5557", "topic": ""},
        {"data_parallel_rank": 1, "endpoint": "ipc:///tmp/ev1", "topic": ""},
    ]
    assert source_addresses(json.dumps(later), base) == ["tcp://10.0.0.1:5557", "ipc:///tmp/ev1"]
    assert source_addresses("{}", base) == []
    assert source_addresses("not json", base) == []


async def test_events_over_zmq_reach_the_working_set(tmp_path: Path) -> None:
    zmq = pytest.importorskip("zmq")
    msgspec = pytest.importorskip("msgspec")
    address = f"ipc://{tmp_path}/ev-{uuid.uuid4().hex[:6]}.sock"
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.bind(address)
    stored = {
        "type": "BlockStored",
        "block_hashes": [b"\x01" * 8, b"\x02" * 8],
        "parent_block_hash": None,
        "token_ids": list(range(32)),
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "session_id": "s1",
    }
    removed = {"type": "BlockRemoved", "block_hashes": [b"\x02" * 8], "medium": "GPU"}
    # Not reachable: no call is made, the events alone are read.
    ep = Endpoint("http://127.0.0.1:9/v1", kv_events=address)
    try:
        async with agentrt.Runtime([ep]) as rt:
            shadow = rt._core.endpoints[0].working_set
            seq = 0
            with anyio.fail_after(20):
                while shadow.exact is None:  # the subscription takes a moment to join
                    payload = msgspec.msgpack.encode([1.0, [stored], 0])
                    pub.send_multipart([b"kv", seq.to_bytes(8, "big"), payload])
                    seq += 1
                    await anyio.sleep(0.05)
                ledger = shadow.exact
                assert isinstance(ledger, KvLedger)
                assert ledger.resident("s1") == 32
                pub.send_multipart(
                    [b"kv", seq.to_bytes(8, "big"), msgspec.msgpack.encode([2.0, [removed]])]
                )
                pub.send_multipart([b"kv", (seq + 1).to_bytes(8, "big"), b"\xc1"])  # garbage
                for _ in range(1000):  # read by polling: no event to wait on
                    if ledger.removed:
                        break
                    await anyio.sleep(0.02)
            assert shadow.cached_tokens() == 16
            assert ledger.resident("s1") == 16
            (feed,) = rt._upkeep.feeds
            assert feed.bad == 1 and feed.gaps == 0
    finally:
        pub.close(linger=0)


async def test_without_the_extra_one_line_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_import = builtins.__import__

    def no_zmq(name: str, *args: Any, **kwargs: Any) -> Any:
        if name in ("zmq", "msgspec"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_zmq)
    rt = agentrt.Runtime([Endpoint("http://127.0.0.1:9/v1", kv_events="tcp://127.0.0.1:5557")])
    with pytest.raises(RuntimeError) as info:
        async with rt:
            pass
    assert str(info.value) == MISSING_EXTRA and "kv-events" in MISSING_EXTRA


async def test_embedded_engine_events_are_read_in_process() -> None:
    # Two replicas: every call of one session goes to one of them; the ledger there
    # knows its context exactly, as the engine holds it. No socket: the simulator's
    # transport hands the engine's events over.
    async with Cluster(2, "h100-8b") as cluster:
        endpoints = [Endpoint(u, kv_events="auto") for u in cluster.base_urls]
        async with agentrt.Runtime(endpoints, transport=cluster.transport()) as rt:
            assert rt._upkeep.feeds == []  # nothing over ZMQ
            client = rt.openai()
            content = "<|b:demo:0:40:16|>"
            async with rt.job("j") as job, job.session("s"):
                for turn in range(3):
                    content += f"<|b:demo-{turn}:0:8:16|>"
                    await client.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": content}], max_tokens=4
                    )
                served = [e for e in rt._core.endpoints if e.working_set.contexts()]
                (ep,) = served
                ledger = ep.working_set.exact
                assert isinstance(ledger, KvLedger)
                engine = cluster.replicas[rt._core.endpoints.index(ep)].engine
                bs = engine.config.block_size
                assert ledger.cached_tokens() == engine.kv.gpu_tree * bs > 0
                (sid,) = ep.working_set.contexts()  # the id the dialect sends
                assert ledger.resident(sid) == (40 + 3 * 8) * bs
                assert ep.working_set.resident(sid) == (40 + 3 * 8) * bs
        # The feed ends with the runtime's block.
        assert all(not r.engine._kv_sinks for r in cluster.replicas)
