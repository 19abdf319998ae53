"""The engine's behaviour, observed over HTTP in virtual time (trio MockClock).

Timing, prefix caching, eviction, preemption, priority order, metrics and the tool-wait KV
policies.
"""

from __future__ import annotations

import json
import re
from typing import Any

import anyio
import httpx
import pytest

from agentrt._protocol import CallMetadata, agentrt_headers
from agentrt.sim import Cluster, CostModel, EngineConfig, prompt_for_blocks
from tests.sim._helpers import cached, chat, small_config, virtual_backend

COST = CostModel(
    step_s=5e-3,
    prefill_token_s=30e-6,
    decode_seq_s=100e-6,
    decode_context_token_s=50e-9,
    prefill_pair_s=1e-9,
)


def agentrt_hdr(
    session: str = "s", *, priority: int | None = None, idle_expected: float | None = None
) -> dict[str, str]:
    """The x-agentrt header of a call in ``session``, as agentrt writes it."""
    meta = CallMetadata(
        call_id="c",
        job_id="j",
        session_id=session,
        program_id="j",
        turn=0,
        first_turn=True,
        service_s=0.0,
        service_tokens=0,
        idle_expected_s=idle_expected,
        idle_expected_source=None if idle_expected is None else "declared",
        priority=priority,
    )
    return agentrt_headers(meta)


@pytest.fixture
def anyio_backend() -> Any:
    return virtual_backend()


def blocks(ids: Any, tail: int = 0, ns: str = "") -> str:
    return prompt_for_blocks(list(ids), 64, tail, namespace=ns)


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


def expected_latency(cost: CostModel, prompt: int, out: int, cached_tokens: int = 0) -> float:
    n = prompt - cached_tokens
    t = cost.step_seconds(prefill_tokens=n, prefill_pairs=n * cached_tokens + n * (n + 1) / 2)
    for s in range(1, out):
        t += cost.step_seconds(decode_seqs=1, decode_context_tokens=prompt + s)
    return t


@pytest.mark.anyio
async def test_latency_follows_the_cost_model() -> None:
    cfg = small_config(cost=COST)
    async with Cluster(1, cfg) as cluster, httpx.AsyncClient(transport=cluster.transport()) as http:
        url = cluster.base_urls[0]
        t0 = anyio.current_time()
        doc = await chat(http, url, blocks(range(20), 10), max_tokens=50)
        took = anyio.current_time() - t0
        assert doc["usage"]["prompt_tokens"] == 20 * 64 + 10
        assert took == pytest.approx(expected_latency(COST, 1290, 50), rel=1e-9)
        stats = cluster.replicas[0].stats()
        assert stats.steps == 50 and stats.busy_s == pytest.approx(took)


@pytest.mark.anyio
async def test_multi_step_decode_matches_step_by_step() -> None:
    """Long decodes leap many steps at once; an arrival mid-leap gives the same times as
    stepping one by one (streaming at interval 1 forces single steps)."""

    iterations: list[int] = []

    async def scenario(stream_first: bool) -> tuple[float, float]:
        async with Cluster(1, small_config(cost=COST)) as cluster:
            http = httpx.AsyncClient(transport=cluster.transport())
            url = cluster.base_urls[0]
            times: dict[str, float] = {}
            t0 = anyio.current_time()

            async def first() -> None:
                if stream_first:
                    async with http.stream(
                        "POST",
                        url + "/chat/completions",
                        json={
                            "model": "m",
                            "messages": [{"role": "user", "content": blocks(range(8), ns="a")}],
                            "max_tokens": 300,
                            "stream": True,
                        },
                    ) as r:
                        async for _ in r.aiter_raw():
                            pass
                else:
                    await chat(http, url, blocks(range(8), ns="a"), max_tokens=300)
                times["a"] = anyio.current_time() - t0

            async def second() -> None:
                await anyio.sleep(0.4037)
                await chat(http, url, blocks(range(30), ns="b"), max_tokens=100)
                times["b"] = anyio.current_time() - t0

            async with anyio.create_task_group() as tg:
                tg.start_soon(first)
                tg.start_soon(second)
            await http.aclose()
            engine = cluster.replicas[0].engine
            iterations.append(engine.iterations)
            assert engine.steps == 300  # b runs inside the steps of a
            return times["a"], times["b"]

    leap = await scenario(stream_first=False)
    step = await scenario(stream_first=True)
    assert leap == pytest.approx(step, rel=1e-9)
    assert iterations[0] < 20 and iterations[1] == 300


@pytest.mark.anyio
async def test_prefix_cache_hits_exactly_where_block_ids_agree() -> None:
    async with (
        Cluster(1, small_config()) as cluster,
        httpx.AsyncClient(transport=cluster.transport()) as http,
    ):
        url = cluster.base_urls[0]
        assert cached(await chat(http, url, blocks(range(10)))) == 0
        # 5 shared 64-token blocks, then different ids: 5 * 64 tokens hit
        assert cached(await chat(http, url, blocks([0, 1, 2, 3, 4, 50, 51]))) == 320
        # same ids in another namespace: no hit
        assert cached(await chat(http, url, blocks(range(10), ns="other"))) == 0
        # a longer prompt that extends the first: all of the first one hits
        assert cached(await chat(http, url, blocks(range(12), 7))) == 640
        # the very same prompt again: everything but the last block (vLLM recomputes it)
        assert cached(await chat(http, url, blocks(range(10)))) == 640 - 16
        # a partial block of the next id, then that block in full: its 16-token blocks hit
        await chat(http, url, blocks(range(20), 40, ns="t"))
        assert cached(await chat(http, url, blocks(range(21), ns="t"))) == 20 * 64 + 32


@pytest.mark.anyio
async def test_lru_eviction_keeps_recently_used_prefixes() -> None:
    cfg = small_config(num_gpu_blocks=150)  # 2400 tokens
    async with Cluster(1, cfg) as cluster, httpx.AsyncClient(transport=cluster.transport()) as http:
        url = cluster.base_urls[0]
        for ns in ("a", "b", "c"):  # 15 blocks of 64 = 60 engine blocks each: 180 > 150
            await chat(http, url, blocks(range(15), ns=ns), max_tokens=1)
            await anyio.sleep(1)
        st = cluster.replicas[0].stats()
        assert st.evicted_blocks > 0
        assert cached(await chat(http, url, blocks(range(16), ns="c"), max_tokens=1)) == 960
        assert cached(await chat(http, url, blocks(range(16), ns="b"), max_tokens=1)) == 960
        # "a" was the least recently used: it lost its tail
        assert cached(await chat(http, url, blocks(range(16), ns="a"), max_tokens=1)) < 960


@pytest.mark.anyio
async def test_preemption_when_kv_runs_out() -> None:
    cfg = small_config(num_gpu_blocks=64, cost=COST)  # 1024 tokens
    async with Cluster(1, cfg) as cluster, httpx.AsyncClient(transport=cluster.transport()) as http:
        url = cluster.base_urls[0]
        results: list[dict[str, Any]] = []

        async def one(i: int) -> None:
            results.append(await chat(http, url, blocks(range(3), ns=f"p{i}"), max_tokens=300))

        async with anyio.create_task_group() as tg:
            for i in range(4):  # 4 x (192 + 300) tokens > 1024
                tg.start_soon(one, i)
        assert len(results) == 4
        assert all(r["usage"]["completion_tokens"] == 300 for r in results)
        assert all(len(r["choices"][0]["message"]["content"]) == 1200 for r in results)
        st = cluster.replicas[0].stats()
        assert st.preemptions > 0
        text = (await http.get(url.replace("/v1", "") + "/metrics")).text
        assert metric(text, "vllm:num_preemptions_total") == st.preemptions
        # recompute: more prompt tokens were scheduled than prompts sent
        assert st.prefix_cache_queries > 4 * 192


@pytest.mark.anyio
@pytest.mark.parametrize("scheduling", ["fcfs", "priority"])
async def test_scheduling_order(scheduling: str) -> None:
    cfg = small_config(scheduling=scheduling, max_num_seqs=1, cost=COST)
    async with Cluster(1, cfg) as cluster, httpx.AsyncClient(transport=cluster.transport()) as http:
        url = cluster.base_urls[0]
        order: list[str] = []

        async def one(name: str, delay: float, priority: int) -> None:
            await anyio.sleep(delay)
            extra: dict[str, Any] = {"priority": priority} if scheduling == "priority" else {}
            await chat(http, url, blocks(range(2), ns=name), max_tokens=20, **extra)
            order.append(name)

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, "busy", 0.0, 5)
            tg.start_soon(one, "low", 0.01, 10)
            tg.start_soon(one, "high", 0.02, 1)
        if scheduling == "priority":
            assert order == ["busy", "high", "low"]
        else:
            assert order == ["busy", "low", "high"]


@pytest.mark.anyio
async def test_priority_header_and_preemption_victim() -> None:
    """Under priority scheduling the lowest-priority running request is preempted."""
    cfg = small_config(scheduling="priority", num_gpu_blocks=40, cost=COST)
    async with Cluster(1, cfg) as cluster, httpx.AsyncClient(transport=cluster.transport()) as http:
        url = cluster.base_urls[0]
        done: list[str] = []

        async def one(name: str, priority: int) -> None:
            await chat(
                http,
                url,
                blocks(range(2), ns=name),
                max_tokens=250,
                headers=agentrt_hdr(name, priority=priority),
            )
            done.append(name)

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, "low", 9)
            await anyio.sleep(0.001)
            tg.start_soon(one, "high", 0)
        assert done == ["high", "low"]
        assert cluster.replicas[0].stats().preemptions > 0


@pytest.mark.anyio
async def test_metric_counters() -> None:
    async with (
        Cluster(1, small_config(cost=COST)) as cluster,
        httpx.AsyncClient(transport=cluster.transport()) as http,
    ):
        url = cluster.base_urls[0]
        base = url.replace("/v1", "")
        docs = [await chat(http, url, blocks(range(n), 5), max_tokens=n + 1) for n in (4, 6, 6)]
        text = (await http.get(base + "/metrics")).text
        prompts = sum(d["usage"]["prompt_tokens"] for d in docs)
        assert metric(text, "vllm:prefix_cache_queries_total") == prompts
        assert metric(text, "vllm:prefix_cache_hits_total") == sum(cached(d) for d in docs) > 0
        assert metric(text, "vllm:prompt_tokens_total") == prompts
        assert metric(text, "vllm:generation_tokens_total") == 5 + 7 + 7
        assert metric(text, "vllm:num_requests_running") == 0
        assert metric(text, "vllm:num_requests_waiting") == 0
        assert metric(text, "vllm:kv_cache_usage_perc") == 0
        assert "# TYPE vllm:prefix_cache_hits_total counter" in text
        decisions = [line for line in text.splitlines() if "tool_wait_decisions_total{" in line]
        actions = {line.split('action="')[1].split('"')[0] for line in decisions}
        assert actions == {"pin", "offload", "drop", "lru", "resume", "fallback"}

        # while requests run, the gauges move
        seen: dict[str, float] = {}

        async def load() -> None:
            async with anyio.create_task_group() as tg:
                for i in range(3):
                    tg.start_soon(chat, http, url, blocks(range(4), ns=f"g{i}"), 200)

        async with anyio.create_task_group() as tg:
            tg.start_soon(load)
            await anyio.sleep(0.2)
            text = (await http.get(base + "/metrics")).text
            seen["running"] = metric(text, "vllm:num_requests_running")
            seen["kv"] = metric(text, "vllm:kv_cache_usage_perc")
        assert seen["running"] == 3 and 0 < seen["kv"] < 1


@pytest.mark.anyio
async def test_max_num_seqs_queues_requests() -> None:
    cfg = small_config(max_num_seqs=1, cost=COST)
    async with Cluster(1, cfg) as cluster, httpx.AsyncClient(transport=cluster.transport()) as http:
        url = cluster.base_urls[0]
        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(chat, http, url, blocks(range(2), ns=f"q{i}"), 100)
            await anyio.sleep(0.05)
            st = cluster.replicas[0].stats()
            assert (st.running, st.waiting) == (1, 2)


# ---------------------------------------------------------------- tool-wait KV policies


async def _resume_after_tool_wait(cfg: EngineConfig, pressure: bool) -> tuple[int, Any]:
    """A session's turn declares a 30 s tool wait; other sessions run meanwhile (or not);
    the session resumes with a longer prompt. Returns the resumed turn's cached tokens."""
    async with Cluster(1, cfg) as cluster, httpx.AsyncClient(transport=cluster.transport()) as http:
        url = cluster.base_urls[0]
        hdr = agentrt_hdr("s", idle_expected=30)
        await chat(http, url, blocks(range(15), ns="s"), max_tokens=8, headers=hdr)
        if pressure:
            for i in range(4):
                await chat(
                    http,
                    url,
                    blocks(range(15), ns=f"o{i}"),
                    max_tokens=8,
                    headers=agentrt_hdr(f"o{i}"),
                )
        await anyio.sleep(30)
        doc = await chat(
            http,
            url,
            blocks(range(18), ns="s"),
            max_tokens=8,
            headers=agentrt_hdr("s"),
        )
        return cached(doc), cluster.replicas[0].stats()


@pytest.mark.anyio
async def test_tool_wait_drop_misses_and_keep_hits() -> None:
    base = small_config(num_gpu_blocks=200)  # the session needs 60 blocks, each other 60 too
    # no memory pressure: lru keeps the session's blocks, drop frees them at once
    hit, _ = await _resume_after_tool_wait(base.replace(tool_wait_policy="lru"), pressure=False)
    assert hit == 960
    hit, _ = await _resume_after_tool_wait(base.replace(tool_wait_policy="drop"), pressure=False)
    assert hit == 0
    # memory pressure during the wait: lru loses them, keep (pin) holds them
    hit, _ = await _resume_after_tool_wait(base.replace(tool_wait_policy="lru"), pressure=True)
    assert hit < 960
    for policy in ("keep", "pin"):
        hit, _ = await _resume_after_tool_wait(base.replace(tool_wait_policy=policy), pressure=True)
        assert hit == 960


@pytest.mark.anyio
async def test_tool_wait_offload_prefetches_from_the_host_tier() -> None:
    cfg = small_config(num_gpu_blocks=200, num_host_blocks=400, tool_wait_policy="offload")
    hit, st = await _resume_after_tool_wait(cfg, pressure=True)
    assert hit == 960  # offloaded at the reply, prefetched back for the resume: no load
    assert st.offloaded_blocks >= 60 and st.prefetched_blocks >= 60 and st.loaded_blocks == 0
    assert st.host_cache_hits == 0 and (st.prefetches, st.prefetches_useful) == (1, 1)


@pytest.mark.anyio
async def test_keep_pins_expire() -> None:
    cfg = small_config(num_gpu_blocks=200, tool_wait_policy="keep", pin_margin_s=1.0)
    async with Cluster(1, cfg) as cluster, httpx.AsyncClient(transport=cluster.transport()) as http:
        url = cluster.base_urls[0]
        hdr = agentrt_hdr("s", idle_expected=5)
        await chat(http, url, blocks(range(15), ns="s"), max_tokens=8, headers=hdr)
        assert cluster.replicas[0].stats().kv_usage > 0  # pinned blocks count as used
        await anyio.sleep(6.5)
        # the next step (any request) unpins
        await chat(http, url, "x", max_tokens=1)
        assert cluster.replicas[0].stats().kv_usage == 0


def test_config_rejects_offload_without_host_tier() -> None:
    with pytest.raises(ValueError, match="host tier"):
        small_config(tool_wait_policy="offload")
    with pytest.raises(ValueError, match="tool_wait_policy"):
        small_config(tool_wait_policy="forever")


@pytest.mark.anyio
async def test_chunked_prefills_computed_ahead_match_step_by_step() -> None:
    """Long prompts are prefilled in chunks; the engine computes those steps ahead and
    sleeps through them at once unless something arrives. Times must equal stepping one
    by one (a concurrent stream at interval 1 makes every step visible)."""

    async def scenario(stream: bool) -> tuple[dict[str, float], int]:
        async with Cluster(1, small_config(cost=COST, num_gpu_blocks=20_000)) as cluster:
            http = httpx.AsyncClient(transport=cluster.transport())
            url = cluster.base_urls[0]
            times: dict[str, float] = {}
            t0 = anyio.current_time()

            async def decoder() -> None:
                body = {
                    "model": "m",
                    "messages": [{"role": "user", "content": blocks(range(2), ns="d")}],
                    "max_tokens": 3000,
                    "stream": stream,
                }
                async with http.stream("POST", url + "/chat/completions", json=body) as r:
                    async for _ in r.aiter_raw():
                        pass
                times["d"] = anyio.current_time() - t0

            async def prompt(name: str, delay: float, n: int) -> None:
                await anyio.sleep(delay)
                await chat(http, url, blocks(range(n), 17, ns=name), max_tokens=3)
                times[name] = anyio.current_time() - t0

            async with anyio.create_task_group() as tg:
                tg.start_soon(decoder)
                tg.start_soon(prompt, "p", 0.05, 600)  # 38 417 tokens: 5 chunks of 8192
                tg.start_soon(prompt, "q", 0.3, 300)  # arrives while p is prefilled
            await http.aclose()
            return times, cluster.replicas[0].engine.iterations

    ahead, few = await scenario(stream=False)
    stepped, many = await scenario(stream=True)
    assert ahead == pytest.approx(stepped, rel=1e-9)
    assert few < 30 and many > 2000


@pytest.mark.anyio
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("scheduling", ["fcfs", "priority"])
async def test_leaps_change_nothing_on_a_random_workload(seed: int, scheduling: str) -> None:
    """A random multi-session workload with a small KV cache (evictions, preemptions,
    chunked prefills, streams) gives the same results with the engine's shortcuts as when
    it runs every step on its own."""
    import random

    async def run(exact: bool) -> tuple[list[tuple[str, float, int]], tuple[int, ...]]:
        rng = random.Random(seed)
        cfg = small_config(
            cost=COST,
            num_gpu_blocks=450,
            max_num_batched_tokens=2048,
            stream_interval=rng.choice([1, 4]),
            scheduling=scheduling,
        )
        log: list[tuple[str, float, int]] = []
        async with Cluster(1, cfg) as cluster:
            cluster.replicas[0].engine.exact_steps = exact
            http = httpx.AsyncClient(transport=cluster.transport())
            url = cluster.base_urls[0]
            t0 = anyio.current_time()

            async def session(i: int, srng: random.Random) -> None:
                await anyio.sleep(srng.uniform(0, 1))
                n = srng.randint(2, 20)
                for turn in range(srng.randint(1, 4)):
                    n += srng.randint(0, 12)
                    body: dict[str, Any] = {
                        "model": "m",
                        "messages": [
                            {
                                "role": "user",
                                "content": blocks(range(n), srng.randint(0, 63), ns=f"s{i}"),
                            }
                        ],
                        "max_tokens": srng.randint(1, 400),
                        "stream": srng.random() < 0.3,
                    }
                    if scheduling == "priority":
                        body["priority"] = srng.randint(0, 3)
                    async with http.stream("POST", url + "/chat/completions", json=body) as r:
                        raw = b"".join([c async for c in r.aiter_raw()])
                    cached_tokens = -1
                    if not body["stream"]:
                        cached_tokens = json.loads(raw)["usage"]["prompt_tokens_details"][
                            "cached_tokens"
                        ]
                    log.append((f"s{i}.{turn}", round(anyio.current_time() - t0, 9), cached_tokens))
                    await anyio.sleep(srng.uniform(0, 1))

            async with anyio.create_task_group() as tg:
                for i in range(16):
                    tg.start_soon(session, i, random.Random(rng.random()))
            await http.aclose()
            st = cluster.replicas[0].stats()
        return sorted(log), (st.steps, st.preemptions, st.prefix_cache_hits, st.evicted_blocks)

    fast, fast_stats = await run(exact=False)
    exact, exact_stats = await run(exact=True)
    assert fast_stats == exact_stats
    assert [(n, c) for n, _, c in fast] == [(n, c) for n, _, c in exact]
    assert [t for _, t, _ in fast] == pytest.approx([t for _, t, _ in exact], rel=1e-9, abs=1e-9)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('v=2, job="j", session="s", call="c", turn=0, svc-s=0, svc-tok=0, prio=1.5', "'prio'"),
        (
            'v=2, job="j", session="s", call="c", turn=0, svc-s=0, svc-tok=0, idle-exp=-1',
            "'idle-exp'",
        ),
        ('v=1, job="j"', "'v' is 1"),
        ("session-id=s", "'v' is missing"),
    ],
)
async def test_a_bad_agentrt_header_is_a_400_naming_the_key(value: str, message: str) -> None:
    async with (
        Cluster(1, small_config()) as cluster,
        httpx.AsyncClient(transport=cluster.transport()) as http,
    ):
        r = await http.post(
            cluster.base_urls[0] + "/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1},
            headers={"x-agentrt": value},
        )
        assert r.status_code == 400
        assert message in r.json()["error"]["message"]
