"""Endpoint(kv_events="auto") against a real vLLM CPU replica started with
``--kv-events-config`` (the ``vllm_engine`` fixture): agentrt finds the publisher at
``GET /kv_event_sources``, reads its BlockStored events over ZMQ, and its ledger's
figures are the engine's own prefix cache."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

import agentrt
from agentrt.testing.vllm_cpu import ReplicaServer
from tests.engine.test_agentrt_vllm import anyio_backend, text

__all__ = ["anyio_backend"]  # the fixture: one event loop (asyncio) against the engine

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

BLOCK = 128  # vLLM's CPU block size, in tokens


async def _until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Poll ``condition`` (the runtime's state: nothing to wait on) until it holds."""
    with anyio.fail_after(timeout_s):
        while not condition():  # noqa: ASYNC110
            await anyio.sleep(0.05)


async def test_ledger_tracks_the_engines_prefix_cache(vllm_engine: ReplicaServer) -> None:
    pytest.importorskip("zmq")
    pytest.importorskip("msgspec")
    ep = agentrt.Endpoint(vllm_engine.base_url, kv_events="auto")
    async with agentrt.Runtime([ep], dialect="vllm") as rt:
        shadow = rt._core.endpoints[0].working_set
        (feed,) = rt._upkeep.feeds
        await _until(lambda: feed.subscribed)
        await anyio.sleep(1.0)  # ZMQ joins the subscription a moment later
        prompts = []
        async with rt.job("kv-events") as job:
            for i in range(3):
                # One output token (its KV is never computed) and a prompt off a block
                # boundary: the engine caches exactly the prompt's full blocks.
                content = text(300 + 90 * i)
                async with job.session(f"s{i}") as s:
                    reply = await s.chat(
                        model=vllm_engine.model,
                        messages=[{"role": "user", "content": content}],
                        max_tokens=1,
                    )
                    prompts.append((s.id, content, reply.usage.prompt_tokens))  # type: ignore[union-attr]
        await _until(lambda: shadow.exact is not None and shadow.exact.events > 0)
        ledger = shadow.exact
        assert ledger is not None
        expected = sum(n // BLOCK * BLOCK for _, _, n in prompts)
        await _until(lambda: ledger.cached_tokens() >= expected)
        assert ledger.block_size == BLOCK
        assert ledger.unassigned == 0  # every BlockStored named its session
        # The engine's own figure: the same prompts again find what the ledger says.
        again = 0
        async with rt.job("again") as job:
            for sid, content, n in prompts:
                async with job.session() as s:
                    reply = await s.chat(
                        model=vllm_engine.model,
                        messages=[{"role": "user", "content": content}],
                        max_tokens=1,
                    )
                cached = reply.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
                assert ledger.resident(sid) == cached == n // BLOCK * BLOCK, (sid, n)
                again += cached
        assert again == expected
        assert ledger.cached_tokens() == expected  # nothing new stored, nothing evicted
