"""Runtimes in a fleet: each process's own Runtime, the same replicas.

Runs in virtual time on the embedded cluster (agentrt.bench's VirtualTimeLoop), where
the replicas serve vLLM's /metrics, so minutes of polling take a moment.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx

from agentrt import Endpoint, Runtime
from agentrt.bench._clock import VirtualTimeLoop
from agentrt.sim import PRESETS, Cluster

MSG: Any = [{"role": "user", "content": "hello " * 40}]


def virtual(main: Callable[[], Awaitable[None]]) -> None:
    anyio.run(main, backend_options={"loop_factory": VirtualTimeLoop})


class Counting:
    """A transport that counts the GETs of /metrics per host, then passes them on."""

    def __init__(self, inner: Any, metrics: bool = True) -> None:
        self.inner = inner
        self.metrics = metrics
        self.gets: dict[str, int] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path == "/metrics":
            host = request.url.host
            self.gets[host] = self.gets.get(host, 0) + 1
            if not self.metrics:
                return httpx.Response(404, text="Not Found")
        return await self.inner.handle_async_request(request)  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        pass


async def _work(rt: Runtime, seconds: float, session_id: str | None = None) -> None:
    async with rt.job("work") as job, job.session(session_id=session_id) as s:
        end = anyio.current_time() + seconds
        while anyio.current_time() < end:
            await s.chat(model="sim-llama-3.1-8b", messages=MSG, max_tokens=32)
            await anyio.sleep(0.5)


def test_runtimes_poll_engine_load_by_default_and_report_the_view(tmp_path: Path) -> None:
    journal = tmp_path / "j.jsonl"

    async def main() -> None:
        async with Cluster(4, PRESETS["h100-8b"]) as cluster:
            counting = Counting(cluster.transport())
            async with Runtime(cluster.base_urls, transport=counting, journal=journal) as rt:
                assert {load.view for load in rt.endpoint_loads()} == {"local"}
                await anyio.sleep(3.0)
                await _work(rt, 20.0)
                assert {load.view for load in rt.endpoint_loads()} == {"engine"}
                loads = rt.endpoint_loads()
                assert all(load.running is not None for load in loads)
            # Each endpoint polled, the busy one more often (at the base interval while
            # its readings change: as often as a poll finds this short session's call
            # in flight; the first turn's fresh polls shift the phases), the idle ones
            # (unchanged readings) less and less often.
            assert set(counting.gets) == {httpx.URL(u).host for u in cluster.base_urls}
            assert max(counting.gets.values()) >= 8, counting.gets
            assert all(3 <= n <= 30 for n in counting.gets.values()), counting.gets

    virtual(main)
    runtime = json.loads(journal.read_text().splitlines()[-1])["runtime"]
    assert runtime["poll_metrics_s"] == "auto"
    assert runtime["load_view"] == "engine"
    assert len(runtime["runtime_id"]) == 12


def test_an_idle_runtime_polls_less_and_one_endpoint_is_not_polled() -> None:
    async def main() -> None:
        async with Cluster(2, PRESETS["h100-8b"]) as cluster:
            busy, idle = Counting(cluster.transport()), Counting(cluster.transport())
            async with Runtime(cluster.base_urls, transport=busy) as rt:
                await _work(rt, 60.0)
            async with Runtime(cluster.base_urls, transport=idle):
                await anyio.sleep(60.0)  # nothing to route: it backs off to every 8 s
            # 1 + 2 + 4 + 8 + 8 + ... s: about 10 polls a minute each, not 60.
            assert all(n <= 12 for n in idle.gets.values()), idle.gets
            assert max(busy.gets.values()) >= 25, busy.gets
            one = Counting(cluster.transport())
            async with Runtime(cluster.base_urls[:1], transport=one) as rt:
                await _work(rt, 10.0)
            assert one.gets == {}  # nothing to choose between: no polls

    virtual(main)


def test_an_endpoint_without_metrics_is_routed_by_local_load_and_asked_rarely() -> None:
    async def main() -> None:
        async with Cluster(2, PRESETS["h100-8b"]) as cluster:
            counting = Counting(cluster.transport(), metrics=False)
            async with Runtime(cluster.base_urls, transport=counting) as rt:
                await _work(rt, 120.0)
                assert {load.view for load in rt.endpoint_loads()} == {"local"}
                assert all(r.status == "ok" for r in rt.reports())
            # Three tries each, then once a minute.
            assert all(n <= 6 for n in counting.gets.values()), counting.gets

    virtual(main)


class Prefixed:
    """One origin, replicas under path prefixes (as ``agentrt sim serve --replicas N``
    serves them): ``/r<i>/v1/...`` and ``/r<i>/metrics`` go to replica i, the origin's
    ``/metrics`` is a 404. Counts the GETs per path."""

    def __init__(self, inner: Any, count: int) -> None:
        self.inner = inner
        self.count = count
        self.gets: dict[str, int] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "GET" and path.endswith("/metrics"):
            self.gets[path] = self.gets.get(path, 0) + 1
        first, _, rest = path.lstrip("/").partition("/")
        if not first.startswith("r") or not first[1:].isdigit():
            return httpx.Response(404, text="metrics are per replica")
        url = request.url.copy_with(host=f"replica-{first[1:]}.sim", path="/" + rest)
        inner = httpx.Request(request.method, url, headers=request.headers, content=request.content)
        inner.extensions = request.extensions
        return await self.inner.handle_async_request(inner)  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        pass


def test_replicas_under_path_prefixes_have_their_metrics_found_beside_their_api() -> None:
    """An endpoint ``http://gw/r0/v1`` has its /metrics at ``/r0/metrics``: found there
    first, and the origin's /metrics (a 404 here) is never asked."""

    async def main() -> None:
        async with Cluster(2, PRESETS["h100-8b"]) as cluster:
            prefixed = Prefixed(cluster.transport(), 2)
            urls = ["http://gw.test/r0/v1", "http://gw.test/r1/v1"]
            async with Runtime(urls, transport=prefixed) as rt:
                await _work(rt, 20.0)
                assert {load.view for load in rt.endpoint_loads()} == {"engine"}
            assert "/metrics" not in prefixed.gets, prefixed.gets
            assert set(prefixed.gets) == {"/r0/metrics", "/r1/metrics"}

    virtual(main)


def test_metrics_beside_a_prefixed_api_that_answer_404_are_looked_for_at_the_origin() -> None:
    """A gateway at ``http://gw/openai/v1`` with the engines' /metrics at its origin:
    one 404 beside the API, then the origin only."""
    gets: list[str] = []

    async def main() -> None:
        async with Cluster(2, PRESETS["h100-8b"]) as cluster:
            inner = cluster.transport()

            class Gateway:
                async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
                    path = request.url.path
                    if request.method == "GET" and path.endswith("/metrics"):
                        gets.append(f"{request.url.host}{path}")
                        if path != "/metrics":
                            return httpx.Response(404, text="Not Found")
                    else:
                        request.url = request.url.copy_with(path=path.removeprefix("/openai"))
                    return await inner.handle_async_request(request)  # type: ignore[no-any-return]

                async def aclose(self) -> None:
                    pass

            urls = [u.replace("/v1", "/openai/v1") for u in cluster.base_urls]
            async with Runtime(urls, transport=Gateway()) as rt:
                await _work(rt, 20.0)
                assert {load.view for load in rt.endpoint_loads()} == {"engine"}

    virtual(main)
    for host in ("replica-0.sim", "replica-1.sim"):
        asked = [g for g in gets if g.startswith(host)]
        assert asked[0] == f"{host}/openai/metrics", asked
        assert asked[1:] and set(asked[1:]) == {f"{host}/metrics"}, asked


def test_a_session_continued_by_another_process_finds_its_replica() -> None:
    """The same caller-given session id in a new Runtime (another worker) goes to the
    replica that served its earlier turns, for any number of such sessions."""

    async def main() -> None:
        async with Cluster(8, PRESETS["h100-8b"]) as cluster:
            placed: dict[str, set[str]] = {}
            for worker in range(3):
                async with Runtime(cluster.base_urls, transport=cluster.transport()) as rt:
                    for n in range(12):
                        sid = f"thread-{n}"
                        async with rt.job("turn") as job, job.session(session_id=sid) as s:
                            await s.chat(model="sim-llama-3.1-8b", messages=MSG, max_tokens=8)
                        call = job.report.call_reports[0]
                        placed.setdefault(sid, set()).add(call.endpoint or "")
                        if worker:  # a later worker: the replica still holds the prefix
                            assert (call.cached_tokens or 0) > 0, (sid, worker)
            assert all(len(urls) == 1 for urls in placed.values()), placed
            assert len({next(iter(u)) for u in placed.values()}) >= 4  # spread over replicas

    virtual(main)


def test_two_runtimes_have_distinct_ids() -> None:
    a, b = Runtime(["http://a.test/v1"]), Runtime(["http://a.test/v1"])
    assert a._core.settings is not None and b._core.settings is not None
    assert a._core.settings["runtime_id"] != b._core.settings["runtime_id"]


def test_placement_knows_each_replicas_kv_from_the_engine() -> None:
    """The replicas' KV capacity comes from their vllm:cache_config_info gauge; the
    sessions' working sets are tracked where they were placed, until they end."""
    config = PRESETS["h100-8b"].replace(num_gpu_blocks=512)  # 8,192 tokens a replica
    long: Any = [{"role": "user", "content": "word " * 1500}]

    async def main() -> None:
        async with Cluster(2, config) as cluster:
            async with Runtime(cluster.base_urls, transport=cluster.transport()) as rt:
                await anyio.sleep(3.0)  # the first polls read the gauge
                loads = rt.endpoint_loads()
                assert [load.kv_capacity for load in loads] == [8192, 8192]
                assert {load.kv_capacity_source for load in loads} == {"engine"}
                async with rt.job("w") as job:
                    replied, done = anyio.Semaphore(0), anyio.Event()

                    async def agent() -> None:
                        async with job.session() as s:
                            await s.chat(model="sim-llama-3.1-8b", messages=long, max_tokens=8)
                            replied.release()
                            await done.wait()

                    async with anyio.create_task_group() as tg:
                        for _ in range(4):
                            tg.start_soon(agent)
                            await anyio.sleep(0.5)
                        for _ in range(4):
                            await replied.acquire()
                        demand = [load.kv_demand or 0.0 for load in rt.endpoint_loads()]
                        # Four contexts of about 1,500 tokens, two on each replica.
                        assert sum(demand) > 4 * 1000, demand
                        assert max(demand) < 0.6 * sum(demand), demand
                        done.set()
                    # Ended sessions weigh nothing.
                    assert [load.kv_demand for load in rt.endpoint_loads()] == [0.0, 0.0]

    virtual(main)


def test_the_journal_records_what_placement_assumed_of_each_replica(tmp_path: Path) -> None:
    journal = tmp_path / "j.jsonl"

    async def main() -> None:
        async with Cluster(2, PRESETS["h100-8b"]) as cluster:
            urls = cluster.base_urls
            endpoints = [Endpoint(urls[0], kv_capacity=50_000), urls[1]]
            async with Runtime(
                endpoints, transport=cluster.transport(), journal=journal, poll_metrics_s=None
            ) as rt:
                await _work(rt, 2.0)

    virtual(main)
    runtime = json.loads(journal.read_text().splitlines()[-1])["runtime"]
    assert runtime["kv_capacity"] == [50_000, None]  # the setting; nothing polled or learned
    assert runtime["kv_capacity_source"] == ["setting", None]


def test_a_capacity_given_wins_over_the_engines(tmp_path: Path) -> None:
    """``Endpoint(kv_capacity=)`` names the capacity outright (a share of a replica other
    clients use too, an engine whose figure is off): it wins over the engine's
    ``vllm:cache_config_info``, which a replica without the setting uses
    (docs/routing.md, "Placement by working set")."""
    journal = tmp_path / "j.jsonl"
    preset = PRESETS["h100-8b"]
    engine = preset.num_gpu_blocks * preset.block_size
    seen: list[tuple[Any, ...]] = []

    async def main() -> None:
        async with Cluster(2, preset) as cluster:
            urls = cluster.base_urls
            endpoints = [Endpoint(urls[0], kv_capacity=50_000), urls[1]]
            async with Runtime(
                endpoints, transport=cluster.transport(), journal=journal, poll_metrics_s=1.0
            ) as rt:
                await _work(rt, 5.0)
                loads = rt.endpoint_loads()
                seen.extend((load.kv_capacity, load.kv_capacity_source) for load in loads)

    virtual(main)
    assert seen == [(50_000, "setting"), (engine, "engine")]
    runtime = json.loads(journal.read_text().splitlines()[-1])["runtime"]
    assert runtime["kv_capacity"] == [50_000, engine]
    assert runtime["kv_capacity_source"] == ["setting", "engine"]
    # and the docs say so: the setting first, the engine's figure else
    routing = (Path(__file__).parents[2] / "docs" / "routing.md").read_text(encoding="utf-8")
    # (the placement table's row: the KV-events table below has one of its own)
    row = next(line for line in routing.splitlines() if line.startswith("| the capacity ("))
    assert row.index("Endpoint(kv_capacity=") < row.index("vllm:cache_config_info"), row
