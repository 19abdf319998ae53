"""``EngineConfig.final_policy``: what a replica does with a session's KV when the call the
session declared its last (``final`` in ``x-agentrt``) finishes.

A real :class:`agentrt.Runtime` drives a one-replica cluster: session ``a`` makes one call
and goes on, session ``b`` makes its last (``final=True``); both share a system prompt.
Then anonymous probes send the same prompts again and read ``cached_tokens``: with ``drop``
``b``'s own blocks are gone (only the shared system prompt hits) while ``a``'s stay; with
``lru`` (the default, vLLM's) nothing changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import pytest

import agentrt
from agentrt.sim import Cluster, EngineConfig, prompt_for_blocks
from agentrt.sim._engine import ReplicaStats
from tests.sim._helpers import cached, small_config

pytestmark = pytest.mark.anyio

SYSTEM = prompt_for_blocks(range(8), 64, namespace="system")
"""The system prompt every session shares (8 x 64 tokens)."""


def messages(user: str) -> list[dict[str, Any]]:
    text = prompt_for_blocks(range(6), 64, namespace=user)
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]


@dataclass
class Outcome:
    again_b: int
    """Cached tokens of ``b``'s prompt sent again after its final call."""
    again_a: int
    """Cached tokens of ``a``'s prompt sent again (``a`` did not end)."""
    shared: int
    """Cached tokens of a new user's first prompt: the shared system prompt alone."""
    full: int
    """Prompt tokens of ``b``'s prompt."""
    stats: ReplicaStats
    metrics: str


async def scenario(cfg: EngineConfig, *, idle_first: float | None = None) -> Outcome:
    """``a`` calls once; ``b`` calls (declaring ``idle_first`` after it, if given), then
    makes its final call; then the probes."""
    async with (
        Cluster(1, cfg) as cluster,
        agentrt.Runtime(cluster.base_urls[0], transport=cluster.transport(), otel=False) as rt,
    ):
        async with rt.job("j") as job:
            async with job.session("a", session_id="a") as a:
                await a.chat(model="m", messages=messages("a"), max_tokens=4)
            async with job.session("b", session_id="b") as b:
                if idle_first is not None:
                    b.expect_idle(idle_first)
                    await b.chat(model="m", messages=messages("b"), max_tokens=4)
                await b.chat(model="m", messages=messages("b"), max_tokens=4, final=True)
        engine = cluster.replicas[0].engine
        engine.kv.check()
        url = cluster.base_urls[0]
        async with httpx.AsyncClient(transport=cluster.transport()) as http:

            async def probe(user: str) -> dict[str, Any]:
                body = {"model": "m", "messages": messages(user), "max_tokens": 1}
                r = await http.post(url + "/chat/completions", json=body)
                assert r.status_code == 200, r.text
                doc: dict[str, Any] = r.json()
                return doc

            shared = cached(await probe("c"))
            doc_b = await probe("b")
            again_a = cached(await probe("a"))
            metrics = (await http.get(url.removesuffix("/v1") + "/metrics")).text
        engine.kv.check()
        return Outcome(
            again_b=cached(doc_b),
            again_a=again_a,
            shared=shared,
            full=doc_b["usage"]["prompt_tokens"],
            stats=engine.stats(),
            metrics=metrics,
        )


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(f"agentrt_sim:{name}{{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"agentrt_sim:{name} not in /metrics")


async def test_drop_frees_the_ended_sessions_own_blocks_and_keeps_the_shared_prefix() -> None:
    lru = await scenario(small_config())
    drop = await scenario(small_config(final_policy="drop"))
    # lru (the default): b's whole prompt is still cached, as before
    assert lru.again_b > lru.shared > 0
    assert lru.again_b >= lru.full - 16  # all but a partial last block
    # drop: b's own blocks are gone, the system prompt it shared with a stays
    assert drop.again_b == drop.shared == lru.shared > 0
    assert drop.again_b < lru.again_b
    # a did not end: its own blocks stay in both
    assert drop.again_a == lru.again_a > drop.shared
    assert drop.stats.final_calls == lru.stats.final_calls == 1
    assert lru.stats.final_blocks_dropped == 0
    # b's own prompt blocks and the cached reply blocks, at least what the probe missed
    assert drop.stats.final_blocks_dropped * 16 >= lru.again_b - drop.again_b
    assert metric(drop.metrics, "final_calls_total") == 1
    assert metric(drop.metrics, "final_blocks_dropped_total") == drop.stats.final_blocks_dropped
    assert metric(lru.metrics, "final_blocks_dropped_total") == 0


async def test_a_final_call_supersedes_a_pending_tool_wait_pin() -> None:
    cfg = small_config(tool_wait_policy="pin", pin_margin_s=600.0)
    kept = await scenario(cfg, idle_first=600.0)
    dropped = await scenario(cfg.replace(final_policy="drop"), idle_first=600.0)
    assert kept.stats.tool_waits_pinned == dropped.stats.tool_waits_pinned == 1
    assert kept.again_b > kept.shared
    assert dropped.again_b == dropped.shared > 0  # the pinned own tail went too
    assert dropped.stats.final_blocks_dropped > 0


async def test_a_notice_after_the_final_call_is_refused() -> None:
    cfg = small_config(final_policy="drop", tool_wait_policy="pin")
    async with (
        Cluster(1, cfg) as cluster,
        agentrt.Runtime(cluster.base_urls[0], transport=cluster.transport(), otel=False) as rt,
    ):
        async with rt.job("j") as job, job.session("b", session_id="b") as b:
            await b.chat(model="m", messages=messages("b"), max_tokens=4, final=True)
        engine = cluster.replicas[0].engine
        assert not engine.notice_tool_wait("b", 30.0)  # the session ended: forgotten
        assert engine.stats().tool_waits_pinned == 0


async def test_a_final_call_without_final_policy_drop_changes_nothing() -> None:
    # the header's final reaches the engine (counted) but lru leaves the KV to LRU
    out = await scenario(small_config(tool_wait_policy="drop"))
    assert out.stats.final_calls == 1 and out.stats.final_blocks_dropped == 0
    assert out.again_b > out.shared


def test_a_bad_final_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="final_policy"):
        EngineConfig(final_policy="keep")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'lru', 'drop'"):
        small_config(final_policy="free")


def test_sim_serve_passes_final_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    import agentrt.sim
    from agentrt.cli import main
    from agentrt.sim import ServedURLs

    seen: list[EngineConfig] = []

    def fake_serve(replicas: int, host: str, port: int, config: Any, **kw: Any) -> None:
        seen.append(config)
        kw["on_ready"](ServedURLs("http://127.0.0.1:1/v1", ("http://127.0.0.1:1/replica-0/v1",)))

    monkeypatch.setattr(agentrt.sim, "serve", fake_serve)
    assert main(["sim", "serve", "--port", "0", "--final-policy", "drop"]) == 0
    assert main(["sim", "serve", "--port", "0"]) == 0
    assert [c.final_policy for c in seen] == ["drop", "lru"]
