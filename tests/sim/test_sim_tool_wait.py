"""The tool-wait KV policies in virtual time: pin (TTL), offload with a timed prefetch,
drop, adaptive (by memory pressure), and the host-tier-full fallback.

Each scenario drives one replica's engine directly: a session's turn finishes with an
expected tool wait, other sessions put pressure on the KV cache (or not), and the session
resumes early, on time or late. The KV invariants (:meth:`KVCache.check`) hold after each.
"""

from __future__ import annotations

import itertools
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from agentrt.sim import Cluster, CostModel, EngineConfig, prompt_for_blocks
from agentrt.sim._engine import Engine, SimRequest
from tests.sim._helpers import small_config, virtual_backend

pytestmark = pytest.mark.anyio

_ids = itertools.count()

BT = 16 * 131_072 / 1e9
"""Seconds per block at ``host_bandwidth=1e9`` (2.1 ms): a session's 60 blocks take 126 ms."""


@pytest.fixture
def anyio_backend() -> Any:
    return virtual_backend()


def config(**changes: Any) -> EngineConfig:
    """200 accelerator blocks (the session needs 60, each other session 60 too), a 400-block
    host tier at 1 GB/s (break-even of 60 blocks: 2 x 126 ms + 1 s)."""
    base = small_config(num_gpu_blocks=200, num_host_blocks=400, host_bandwidth=1e9)
    return base.replace(**changes)


async def turn(
    engine: Engine, session: str, blocks: int, idle: float | None = None, max_tokens: int = 8
) -> SimRequest:
    """One call of ``session`` with ``blocks`` 64-token blocks of its own; waits for it."""
    text = prompt_for_blocks(range(blocks), 64, namespace=session)
    prompt = engine.tokenizer.chat([{"role": "user", "content": text}])
    req = engine.submit(
        prompt,
        max_tokens,
        request_id=f"{session}-{next(_ids)}",
        session=session,
        idle_expected=idle,
    )
    while not req.done:
        await req.wait_output(req.num_output)
    return req


async def pressure(engine: Engine, tag: str, n: int = 4) -> None:
    """``n`` other sessions of 60 blocks each, one after the other (LRU must evict)."""
    for i in range(n):
        await turn(engine, f"{tag}{i}", 15)


def latency(req: SimRequest) -> float:
    assert req.finish_time is not None
    return req.finish_time - req.arrival


async def resume_at(
    cfg: EngineConfig, wait: float, *, idle: float = 30.0, before: bool = True
) -> tuple[SimRequest, Engine]:
    """The session's turn declares ``idle``; other sessions run right after it (``before``)
    or just before the resume; the session resumes ``wait`` seconds after its turn ended."""
    async with Cluster(1, cfg) as cluster:
        engine = cluster.replicas[0].engine
        first = await turn(engine, "s", 15, idle=idle)
        assert first.finish_time is not None
        if before:
            await pressure(engine, "o")
        if not before:
            await anyio.sleep_until(first.finish_time + wait - 1.0)
            await pressure(engine, "o")
        await anyio.sleep_until(first.finish_time + wait)
        req = await turn(engine, "s", 18)
        engine.kv.check()
        return req, engine


async def test_pin_keeps_a_hit_within_its_ttl_and_lru_evicts_after() -> None:
    cfg = config(tool_wait_policy="pin", pin_margin_s=2.0, num_host_blocks=0)
    within, engine = await resume_at(cfg, 30.0)  # pressure at once, resume on time
    assert within.cached_tokens == 960 and engine.stats().tool_waits_pinned == 1
    after, _ = await resume_at(cfg, 40.0, before=False)  # pressure once the pin expired
    assert after.cached_tokens < 960
    lru, _ = await resume_at(cfg.replace(tool_wait_policy="lru"), 30.0)
    assert lru.cached_tokens < 960


async def test_offload_below_the_break_even_pins_instead() -> None:
    # 60 blocks: write-out + read-back = 0.25 s, + 1 s margin; a 1.2 s wait is below it
    req, engine = await resume_at(config(tool_wait_policy="offload"), 1.2, idle=1.2)
    st = engine.stats()
    assert st.tool_waits_pinned == 1 and st.tool_waits_offloaded == 0 and st.prefetches == 0
    assert req.cached_tokens == 960 and req.host_cached_tokens == 0  # never left the GPU
    # just above it: offloaded
    _, engine = await resume_at(config(tool_wait_policy="offload"), 1.4, idle=1.4)
    assert engine.stats().tool_waits_offloaded == 1


async def test_offload_and_an_on_time_resume_hit_without_load_time() -> None:
    pinned, _ = await resume_at(config(tool_wait_policy="pin"), 30.0)
    req, engine = await resume_at(config(tool_wait_policy="offload"), 30.0)
    st = engine.stats()
    assert req.cached_tokens == 960 and req.host_cached_tokens == 0
    assert latency(req) == pytest.approx(latency(pinned), abs=1e-9)  # no load delay
    # offloaded_blocks also counts the other sessions' blocks LRU spilled to the host
    assert st.offloaded_blocks >= 60 and st.prefetched_blocks == 60 and st.loaded_blocks == 0
    assert (st.prefetches, st.prefetches_useful, st.prefetches_wasted) == (1, 1, 0)
    assert st.host_bytes_out == st.offloaded_blocks * 16 * 131_072
    assert st.host_bytes_in == 60 * 16 * 131_072
    assert st.tool_waits_offloaded == 1


async def test_a_late_resume_hits_on_the_host_tier_and_pays_the_load() -> None:
    pinned, _ = await resume_at(config(tool_wait_policy="pin"), 30.0)  # a hit, no load
    # prefetched at ~30 s and pinned until 32 s; the others evict it at 39 s, to the host
    req, engine = await resume_at(config(tool_wait_policy="offload"), 40.0, before=False)
    st = engine.stats()
    assert req.cached_tokens == 960 and req.host_cached_tokens == 960
    assert st.loaded_blocks == 60 and (st.prefetches, st.prefetches_wasted) == (1, 1)
    assert latency(req) == pytest.approx(latency(pinned) + 60 * BT, abs=1e-9)


async def test_an_early_resume_pays_the_load_and_cancels_the_prefetch() -> None:
    pinned, _ = await resume_at(config(tool_wait_policy="pin"), 10.0)
    req, engine = await resume_at(config(tool_wait_policy="offload"), 10.0)
    assert req.host_cached_tokens == 960
    assert latency(req) == pytest.approx(latency(pinned) + 60 * BT, abs=1e-9)
    st = engine.stats()
    assert st.loaded_blocks == 60 and st.prefetches == 0


async def test_a_resume_during_the_prefetch_waits_for_the_rest_of_it() -> None:
    pinned, _ = await resume_at(config(tool_wait_policy="pin"), 30.0)
    # the prefetch starts at 30 - 60 x BT; resume halfway through it
    req, engine = await resume_at(config(tool_wait_policy="offload"), 30.0 - 30 * BT)
    assert req.cached_tokens == 960 and req.host_cached_tokens == 0
    assert latency(req) == pytest.approx(latency(pinned) + 30 * BT, abs=1e-9)
    assert engine.stats().prefetches_useful == 1


async def test_drop_frees_the_session_at_once() -> None:
    req, engine = await resume_at(config(tool_wait_policy="drop"), 30.0)
    assert req.cached_tokens == 0 and engine.stats().tool_waits_dropped == 1


async def test_offload_falls_back_to_lru_when_the_host_tier_is_full() -> None:
    # a 50-block host tier cannot take the session's 60 blocks
    req, engine = await resume_at(config(tool_wait_policy="offload", num_host_blocks=50), 30.0)
    st = engine.stats()
    assert st.tool_wait_fallbacks == 1 and st.tool_waits_lru == 1 and st.tool_waits_offloaded == 0
    assert req.cached_tokens < 960  # left to LRU, which evicted it under pressure
    # a 100-block host tier holding another session's offloaded blocks (pinned there)
    async with Cluster(1, config(tool_wait_policy="offload", num_host_blocks=100)) as cluster:
        engine = cluster.replicas[0].engine
        await turn(engine, "a", 15, idle=30.0)
        await turn(engine, "b", 15, idle=30.0)
        st = engine.stats()
        assert (st.tool_waits_offloaded, st.tool_wait_fallbacks) == (1, 1)
        assert engine.kv.host_pinned == 60
        engine.kv.check()
        await anyio.sleep(30)
        assert (await turn(engine, "a", 18)).cached_tokens == 960  # a was not dropped
        engine.kv.check()


async def test_adaptive_pins_at_low_pressure_and_offloads_at_high_pressure() -> None:
    cfg = config(tool_wait_policy="adaptive", num_gpu_blocks=400, adaptive_pressure=0.6)
    async with Cluster(1, cfg) as cluster:
        engine = cluster.replicas[0].engine
        # each pinned session holds 60 of 400 blocks: pressure 0, 0.15, 0.3, 0.45 -> pin
        for i in range(4):
            await turn(engine, f"p{i}", 15, idle=8.0)
        assert engine.stats().tool_waits_pinned == 4 and engine.kv.used == 240
        # pressure 0.6: the same wait goes to the host; one below the break-even is pinned
        long = await turn(engine, "long", 15, idle=8.0)
        await turn(engine, "short", 1, idle=1.0)
        # a wait longer than adaptive_max_wait_s is dropped under pressure
        await turn(engine, "forever", 15, idle=1000.0)
        # an unknown wait is left to LRU
        await turn(engine, "unknown", 15)
        st = engine.stats()
        assert st.tool_waits_offloaded == 1 and st.tool_waits_pinned == 5
        assert st.tool_waits_dropped == 1 and st.offloaded_blocks == 60
        engine.kv.check()
        assert long.finish_time is not None
        await anyio.sleep_until(long.finish_time + 8.0)
        assert (await turn(engine, "long", 18)).cached_tokens == 960
        assert engine.stats().prefetches_useful == 1
        engine.kv.check()


async def test_adaptive_at_low_pressure_offloads_long_waits_and_leaves_very_long_ones() -> None:
    async with Cluster(1, config(tool_wait_policy="adaptive")) as cluster:
        engine = cluster.replicas[0].engine
        await turn(engine, "s", 15, idle=1000.0)  # > adaptive_max_wait_s: lru
        st = engine.stats()
        assert st.tool_waits_lru == 1 and st.tool_waits_pinned == 0 and engine.kv.used == 0
        await turn(engine, "t", 15, idle=60.0)  # > adaptive_pin_max_s: offloaded
        assert engine.stats().tool_waits_offloaded == 1 and engine.kv.used == 0
        engine.kv.check()


async def test_adaptive_counts_queued_demand_as_pressure() -> None:
    cfg = config(tool_wait_policy="adaptive", num_gpu_blocks=400, max_num_seqs=1)
    async with Cluster(1, cfg) as cluster, anyio.create_task_group() as tg:
        engine = cluster.replicas[0].engine
        # s runs first; four 60-block requests queue behind it (max_num_seqs=1): 240 blocks
        tg.start_soon(turn, engine, "s", 15, 5.0)  # 5 s: a pin at low pressure, not at 0.6
        await anyio.lowlevel.checkpoint()
        for i in range(4):
            tg.start_soon(turn, engine, f"q{i}", 15)
        await anyio.sleep(0.001)
        assert engine._waiting_blocks == 4 * 60
    assert engine.stats().tool_waits_offloaded == 1
    assert engine._waiting_blocks == 0
    engine.kv.check()


def test_config_checks_the_policy_fields() -> None:
    for bad in ({"adaptive_pressure": 1.5}, {"offload_margin_s": -1.0}, {"adaptive_pin_max_s": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            small_config(**bad)
    assert small_config(tool_wait_policy="adaptive").tool_wait_policy == "adaptive"


async def test_a_running_request_unpins_blocks_rather_than_being_preempted() -> None:
    cfg = config(tool_wait_policy="pin", num_gpu_blocks=100, num_host_blocks=0)
    async with Cluster(1, cfg) as cluster:
        engine = cluster.replicas[0].engine
        await turn(engine, "s", 15, idle=30.0)  # 60 of 100 blocks pinned
        assert engine.kv.used == 60
        # 40 prompt blocks growing to 78: only by taking the pinned ones
        req = await turn(engine, "r", 10, max_tokens=600)
        st = engine.stats()
        assert req.num_output == 600 and st.preemptions == 0
        assert st.pins_yielded_blocks >= 38
        engine.kv.check()


async def test_a_resumed_turn_is_admitted_ahead_of_the_queue() -> None:
    cfg = config(tool_wait_policy="pin", max_num_seqs=1, num_gpu_blocks=300)
    async with Cluster(1, cfg) as cluster, anyio.create_task_group() as tg:
        engine = cluster.replicas[0].engine
        await turn(engine, "s", 15, idle=2.0)
        done: list[str] = []

        async def one(name: str, delay: float, max_tokens: int) -> None:
            await anyio.sleep(delay)
            await turn(engine, name, 2, max_tokens=max_tokens)
            done.append(name)

        tg.start_soon(one, "long", 0.0, 2500)  # runs ~2.5 s; max_num_seqs=1 queues the rest
        tg.start_soon(one, "new", 1.0, 8)
        tg.start_soon(one, "s", 2.0, 8)  # resumes on time: its KV was kept
    assert done == ["long", "s", "new"]
    assert engine.stats().resumed_first == 1
    engine.kv.check()


async def test_a_prefetch_without_room_is_retried_until_its_deadline() -> None:
    cost = CostModel(5e-3, 30e-6, 100e-6, 50e-9, 0.0)
    cfg = config(tool_wait_policy="offload", num_gpu_blocks=250, cost=cost)
    async with Cluster(1, cfg) as cluster:
        engine = cluster.replicas[0].engine
        first = await turn(engine, "s", 15, idle=30.0)  # offloaded; prefetch due at ~29.9 s
        assert first.finish_time is not None
        await anyio.sleep_until(first.finish_time + 25.0)
        # 203 blocks held from ~25 s to ~30.4 s: no room for the 60 blocks at 29.9 s
        long = await turn(engine, "long", 35, max_tokens=1000)
        assert long.finish_time is not None
        assert first.finish_time + 29.9 < long.finish_time < first.finish_time + 31.0
        await anyio.sleep_until(first.finish_time + 31.0)
        req = await turn(engine, "s", 18)
        st = engine.stats()
        assert req.cached_tokens == 960 and req.host_cached_tokens == 0
        assert (st.prefetches, st.prefetches_useful, st.prefetches_skipped) == (1, 1, 0)
        engine.kv.check()


@pytest.mark.parametrize(("policy", "host"), [("pin", 0), ("adaptive", 0), ("offload", 600)])
@pytest.mark.parametrize("seed", [1, 2])
async def test_leaps_change_nothing_under_the_policies(policy: str, host: int, seed: int) -> None:
    """Sessions with tool waits on a small cache: the engine's leaps give the same times,
    hits and decisions as stepping one step at a time (timers bound the leaps)."""
    import random

    async def run(exact: bool) -> tuple[list[tuple[str, float, int, int]], tuple[int, ...]]:
        rng = random.Random(seed)
        cfg = small_config(
            num_gpu_blocks=450,
            num_host_blocks=host,
            max_num_batched_tokens=2048,
            tool_wait_policy=policy,
            host_bandwidth=2e9,
            cost=CostModel(5e-3, 30e-6, 100e-6, 50e-9, 1e-9),
        )
        log: list[tuple[str, float, int, int]] = []
        async with Cluster(1, cfg) as cluster:
            engine = cluster.replicas[0].engine
            engine.exact_steps = exact
            t0 = anyio.current_time()

            async def session(i: int, srng: random.Random) -> None:
                await anyio.sleep(srng.uniform(0, 1))
                n = srng.randint(2, 20)
                for k in range(srng.randint(1, 5)):
                    n += srng.randint(0, 12)
                    wait = srng.uniform(0, 3)
                    text = prompt_for_blocks(range(n), 64, srng.randint(0, 63), namespace=f"s{i}")
                    prompt = engine.tokenizer.chat([{"role": "user", "content": text}])
                    req = engine.submit(
                        prompt,
                        srng.randint(1, 400),
                        request_id=f"{i}.{k}",
                        session=f"s{i}",
                        idle_expected=wait * srng.uniform(0.5, 1.5),
                    )
                    while not req.done:
                        await req.wait_output(req.num_output)
                    t = round(anyio.current_time() - t0, 9)
                    log.append((req.request_id, t, req.cached_tokens, req.host_cached_tokens))
                    await anyio.sleep(wait)

            async with anyio.create_task_group() as tg:
                for i in range(12):
                    tg.start_soon(session, i, random.Random(rng.random()))
            engine.kv.check()
            st = engine.stats()
        decisions = (st.tool_waits_pinned, st.tool_waits_offloaded, st.prefetches, st.preemptions)
        return sorted(log), decisions

    fast, fast_decisions = await run(False)
    exact, exact_decisions = await run(True)
    assert fast_decisions == exact_decisions
    assert [(r, c, h) for r, _, c, h in fast] == [(r, c, h) for r, _, c, h in exact]
    assert [t for _, t, _, _ in fast] == pytest.approx([t for _, t, _, _ in exact], abs=1e-9)


async def soon_and_far(policy: str, host: int) -> tuple[SimRequest, SimRequest, Engine]:
    """Session "soon" (60 blocks, 5 s wait) finishes first, "far" (60 blocks, 100 s wait)
    next; then 3 other sessions of 60 blocks (50 s waits) fill the 200-block cache and
    "soon" resumes."""
    cfg = config(tool_wait_policy=policy, num_host_blocks=host)
    async with Cluster(1, cfg) as cluster:
        engine = cluster.replicas[0].engine
        first = await turn(engine, "soon", 15, idle=5.0)
        await turn(engine, "far", 15, idle=100.0)
        for i in range(3):
            await turn(engine, f"o{i}", 15, idle=50.0)
        engine.kv.check()
        assert first.finish_time is not None
        await anyio.sleep_until(first.finish_time + 5.0)
        soon = await turn(engine, "soon", 18)
        far = await turn(engine, "far", 18)
        engine.kv.check()
        return soon, far, engine


async def test_resume_evicts_the_session_back_last_and_keeps_the_one_back_soon() -> None:
    soon, far, engine = await soon_and_far("resume", 0)
    assert soon.cached_tokens == 960 and far.cached_tokens < 960
    assert engine.stats().tool_waits_resume == 5
    # LRU evicts "soon", the least recently used (and "far" next, for soon's new turn)
    soon, _, _ = await soon_and_far("lru", 0)
    assert soon.cached_tokens == 0


async def test_resume_spills_the_far_session_to_the_host_first() -> None:
    soon, _, engine = await soon_and_far("resume", 400)
    st = engine.stats()
    assert soon.cached_tokens == 960 and soon.host_cached_tokens == 0
    assert st.offloaded_blocks > 0
    # "far"'s prefetch is due at ~100 s; it resumed earlier (a host hit), so none ran
    assert st.prefetches == 0


async def test_resume_keeps_a_queued_request_s_prefix_until_it_runs() -> None:
    cfg = config(tool_wait_policy="resume", num_host_blocks=0)
    async with Cluster(1, cfg) as cluster:
        engine = cluster.replicas[0].engine
        await turn(engine, "q", 15)  # no declaration: LRU order
        engine.submit(
            engine.tokenizer.chat([{"role": "user", "content": "x"}]),
            8,
            request_id="held",
            session="q",
        )
        # not admitted yet (the loop has not run): its session's tail is evicted last
        assert engine.num_waiting == 1
        node = engine._paths["q"]
        assert node.resume_at == float("inf")
        await pressure(engine, "o", 3)
        engine.kv.check()
        assert node.alive and node.resume_at == 0.0  # cleared at admission
