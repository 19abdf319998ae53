"""The Runtime's scheduling, end to end over a fake engine: admission, ordering policies,
priority pass-through, routing moves, health failover and probes, metrics polling."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
import pytest

from agentrt import Endpoint, Retry, Runtime
from agentrt._protocol import parse_agentrt_header
from agentrt.scheduling import PLAS, SessionAffinity
from agentrt.telemetry import Event, SessionMoved
from tests._fake import MSG, FakeEngine

pytestmark = pytest.mark.anyio

URL = "http://engine.test/v1"
FAST = Retry(attempts=3, wait_initial=0.0, wait_jitter=0.0)


class GatedEngine:
    """A fake engine whose replies wait until the test lets them go, one by one; it
    records the order in which calls arrived (by job name in the user message)."""

    def __init__(self) -> None:
        self.arrived: list[str] = []
        self.release = anyio.Event()
        self.fake = FakeEngine()

    async def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.arrived.append(body["messages"][-1]["content"])
        if body["messages"][-1]["content"].startswith("wait"):
            await self.release.wait()
        return await self.fake.handle(request)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)


async def until(predicate: Any, timeout_s: float = 5.0) -> None:
    """Wait until ``predicate()`` holds. Polling, on purpose: the state watched lives in
    the runtime (nothing to wait on), and the openai client's first request runs a
    platform probe in a worker thread, so 'all tasks blocked' is not enough."""
    with anyio.fail_after(timeout_s):
        while not predicate():  # noqa: ASYNC110
            await anyio.sleep(0.005)
    await anyio.wait_all_tasks_blocked()


def ask(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


async def test_concurrency_limit_queues_and_reports_queue_time() -> None:
    gate = GatedEngine()
    async with Runtime([URL], transport=gate.transport(), concurrency=1) as rt:
        async with rt.job("j") as job:

            async def first() -> None:
                async with job.session() as s:
                    await s.chat(model="m", messages=ask("wait-1"))

            async def second() -> None:
                async with job.session() as s:
                    await s.chat(model="m", messages=ask("go-2"))

            async with anyio.create_task_group() as tg:
                tg.start_soon(first)
                await until(lambda: gate.arrived)
                tg.start_soon(second)
                await anyio.sleep(0.05)
                # The second call waits in agentrt's queue, not at the engine.
                assert gate.arrived == ["wait-1"]
                await anyio.sleep(0.05)
                gate.release.set()
    assert gate.arrived == ["wait-1", "go-2"]
    reports = {c.turn: c for c in job.report.call_reports}
    queued = [c.queue_s for c in job.report.call_reports]
    assert max(queued) >= 0.04 and min(queued) == 0.0
    assert job.report.queue_s == pytest.approx(sum(queued))
    assert reports  # every call reported
    assert all(c.status == "ok" for c in job.report.call_reports)


async def test_plas_serves_the_program_with_less_service_first() -> None:
    gate = GatedEngine()
    gate.fake.delay_s = 0.0
    async with Runtime(
        [URL], transport=gate.transport(), concurrency=1, policy=lambda: PLAS(levels=(0.01,))
    ) as rt:
        # A long job builds up attained service (> 0.01 LLM seconds). Jobs do not nest,
        # so each runs in a task of its own.
        warmed, go_on = anyio.Event(), anyio.Event()

        async def long_program() -> None:
            async with rt.job("long", program_id="long") as long_job, long_job.session() as s:
                gate.fake = FakeEngine(delay_s=0.02)
                await s.chat(model="m", messages=ask("long-warm"))
                gate.fake = FakeEngine()
                warmed.set()
                await go_on.wait()
                await s.chat(model="m", messages=ask("long-2"))  # queued first...

        async def hold() -> None:
            async with rt.job("blocker") as blocker, blocker.session() as b:
                await b.chat(model="m", messages=ask("wait-blocker"))

        async def short_call() -> None:
            async with rt.job("short") as short, short.session() as ss:
                await ss.chat(model="m", messages=ask("short-1"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(long_program)
            await warmed.wait()
            tg.start_soon(hold)
            await until(lambda: "wait-blocker" in gate.arrived)
            go_on.set()
            await until(lambda: rt.admission_statistics()[0].waiting == 1)
            tg.start_soon(short_call)  # ...but the new program goes first
            await until(lambda: rt.admission_statistics()[0].waiting == 2)
            gate.release.set()
    assert gate.arrived[-2:] == ["short-1", "long-2"]


async def test_fcfs_keeps_arrival_order() -> None:
    gate = GatedEngine()
    async with Runtime([URL], transport=gate.transport(), concurrency=1, policy="fcfs") as rt:
        async with anyio.create_task_group() as tg:
            for i, name in enumerate(("wait-0", "a", "b", "c")):

                async def one(name: str = name) -> None:
                    async with rt.job(name) as job, job.session() as s:
                        await s.chat(model="m", messages=ask(name))

                tg.start_soon(one)
                if i == 0:
                    await until(lambda: gate.arrived)
                else:
                    await until(lambda i=i: rt.admission_statistics()[0].waiting == i)
            gate.release.set()
    assert gate.arrived == ["wait-0", "a", "b", "c"]


async def test_priority_pass_through_follows_the_policy_per_endpoint() -> None:
    fake = FakeEngine()
    eps = [Endpoint(URL, send_priority=True)]
    async with Runtime(eps, transport=fake.transport(), dialect="vllm", policy="plas") as rt:
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
    assert fake.seen[0].body["priority"] == 0
    assert job.report.call_reports[0].priority == 0


def refusing(down: set[str]) -> httpx.MockTransport:
    """A fake engine whose hosts in ``down`` (the caller may change it) refuse connections."""

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host in down:
            raise httpx.ConnectError("refused", request=request)
        return await FakeEngine().handle(request)

    return httpx.MockTransport(handler)


async def test_session_move_is_counted_when_its_replica_fails() -> None:
    down = {"a.test"}
    eps = ["http://a.test/v1", "http://b.test/v1"]
    async with Runtime(eps, transport=refusing(down), retry=FAST) as rt:
        async with rt.job("r") as job, job.session() as s:
            down.clear()
            await s.chat(model="m", messages=MSG)  # lands somewhere, fine
            home = s.endpoint_index
            assert home is not None
            down.add(("a.test", "b.test")[home])  # its replica dies
            await s.chat(model="m", messages=MSG)
        loads = rt.endpoint_loads()
        assert not loads[home].healthy  # a connection error marks it down at once
    last = job.report.call_reports[-1]
    assert last.moved and last.attempts == 2 and last.status == "ok"
    assert job.report.session_moves == 1


async def test_a_down_endpoint_is_probed_and_readmitted() -> None:
    state = {"a_up": False}

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "a.test" and not state["a_up"]:
            raise httpx.ConnectError("refused", request=request)
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"object": "list", "data": []})
        return await FakeEngine().handle(request)

    eps = ["http://a.test/v1", "http://b.test/v1"]
    async with Runtime(
        eps, transport=httpx.MockTransport(handler), retry=FAST, routing="round_robin"
    ) as rt:
        async with rt.job("r") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
            await s.chat(model="m", messages=MSG)
        assert not rt.endpoint_loads()[0].healthy
        state["a_up"] = True
        await until(lambda: rt.endpoint_loads()[0].healthy, timeout_s=10)
    assert job.report.status == "ok"


async def test_metrics_polling_feeds_endpoint_loads() -> None:
    page = (
        'vllm:num_requests_running{model_name="m"} 3\n'
        'vllm:num_requests_waiting{model_name="m"} 2\n'
        'vllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
    )

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=page)
        return await FakeEngine().handle(request)

    async with Runtime([URL], transport=httpx.MockTransport(handler), poll_metrics_s=0.05) as rt:
        await until(lambda: rt.endpoint_loads()[0].running is not None, timeout_s=10)
        load = rt.endpoint_loads()[0]
    assert (load.running, load.waiting, load.kv_usage) == (3, 2, 0.5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"policy": "lottery"}, "unknown scheduling policy"),
        ({"concurrency": 0}, "concurrency must be"),
        ({"concurrency": "fast"}, "concurrency must be"),
        ({"token_budget": -5}, "token_budget must be"),
        ({"routing": "random-ish"}, "routing"),
        ({"poll_metrics_s": 0}, "poll_metrics_s"),
    ],
)
def test_bad_scheduling_settings_are_rejected(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Runtime([URL], **kwargs)


def test_a_policy_instance_serves_one_endpoint_only() -> None:
    Runtime([URL], policy=PLAS())
    with pytest.raises(ValueError, match="one endpoint only"):
        Runtime([URL, "http://other.test/v1"], policy=PLAS())
    Runtime([URL, "http://other.test/v1"], policy=PLAS)  # a factory is fine


async def test_a_policy_that_classifies_with_a_non_int_fails_the_call_before_sending() -> None:
    class Odd(PLAS):
        def classify(self, ticket: Any, now: float) -> int:
            return "high"  # type: ignore[return-value]

    fake = FakeEngine()
    async with Runtime([URL], transport=fake.transport(), policy=Odd(), send_priority=True) as rt:
        async with rt.job("j") as job, job.session() as s:
            with pytest.raises(TypeError, match=r"Odd\.classify returned 'high'; it must return"):
                await s.chat(model="m", messages=MSG)
    assert fake.seen == []
    assert job.report.status == "ok"  # the error was handled inside the job
    assert job.report.call_reports[0].status == "error"


async def test_time_in_the_queue_is_not_attained_service() -> None:
    gate = GatedEngine()
    async with Runtime([URL], transport=gate.transport(), concurrency=1) as rt:
        async with anyio.create_task_group() as tg:

            async def hold() -> None:  # a job of its own: jobs do not nest
                async with rt.job("blocker") as blocker, blocker.session() as b:
                    await b.chat(model="m", messages=ask("wait-0"))

            tg.start_soon(hold)
            await until(lambda: gate.arrived)
            async with rt.job("waiter") as job, job.session() as s:

                async def release_later() -> None:
                    await anyio.sleep(0.1)
                    gate.release.set()

                tg.start_soon(release_later)
                await s.chat(model="m", messages=ask("first"))  # queued ~0.1 s
                await s.chat(model="m", messages=ask("second"))
    first = job.report.call_reports[0]
    assert first.queue_s >= 0.05
    service = parse_agentrt_header(gate.fake.seen[-1].headers["x-agentrt"]).service_s
    assert service < first.queue_s / 2  # the engine answered at once; the wait is not service


class Retaining:
    """Two replicas that keep a session's prefix ``keep_s`` seconds after its last reply:
    a call within that reports its prompt as cached, later ones nothing. Sessions are told
    apart by their user message; calls whose message starts with "wait" block."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self.last: dict[tuple[str, str], float] = {}
        self.release = anyio.Event()
        self.in_flight: list[str] = []

    async def handle(self, request: httpx.Request) -> httpx.Response:
        text = json.loads(request.content)["messages"][-1]["content"]
        if text.startswith("wait"):
            self.in_flight.append(request.url.host)
            await self.release.wait()
        key = (request.url.host, text)
        now = anyio.current_time()
        last = self.last.get(key)
        fake = FakeEngine(prompt_tokens=100, completion_tokens=20)
        fake.cached_tokens = 100 if last is not None and now - last <= self.keep_s else 0
        response = await fake.handle(request)
        self.last[key] = anyio.current_time()
        return response


async def test_a_session_back_after_its_replica_likely_evicted_it_is_routed_by_load() -> None:
    server = Retaining(keep_s=0.12)
    eps = ["http://a.test/v1", "http://b.test/v1"]
    router = SessionAffinity()
    transport = httpx.MockTransport(server.handle)
    events: list[Event] = []
    async with Runtime(
        eps, transport=transport, retry=FAST, routing=router, hooks=[events.append]
    ) as rt:
        async with rt.job("learn") as job:
            sessions = [job._open_session(None, None, None) for _ in range(4)]
            for s in sessions:
                s.endpoint_index = 0  # all at home on replica a
                await s.chat(model="m", messages=ask(s.id))
            for _ in range(2):  # resumes: late (misses), then soon (hits)
                await anyio.sleep(0.4)
                for s in sessions:
                    await s.chat(model="m", messages=ask(s.id))
                for s in sessions:
                    await s.chat(model="m", messages=ask(s.id))
            loads = rt.endpoint_loads()
            retention = loads[0].retention_s
            assert retention is not None and 0.02 < retention < 0.4, loads
            assert loads[1].retention_s is None
            # Late resumes after the estimate formed went by load: a tie, so home won.
            assert router.moves == {}
            assert all(s.endpoint_index == 0 for s in sessions)
            x, blocker = sessions[:2]
            async with anyio.create_task_group() as tg:
                # Load the home replica with one call in flight, then resume x late.
                tg.start_soon(lambda: blocker.chat(model="m", messages=ask("wait")))
                await until(lambda: server.in_flight)
                await anyio.sleep(2.0 * retention)
                await x.chat(model="m", messages=ask("x"))
                server.release.set()
            for s in sessions:
                s._close()
    assert router.moves == {"retention": 1}
    assert x.endpoint_index == 1
    moved = [c for c in job.report.call_reports if c.moved]
    assert len(moved) == 1 and moved[0].session_id == x.id
    assert job.report.session_moves == 1
    moves = [e for e in events if isinstance(e, SessionMoved)]
    assert [(e.session_id, e.reason) for e in moves] == [(x.id, "retention")]


@pytest.mark.parametrize("routing", ["session_affinity", "hash", "least_loaded"])
async def test_endpoint_sessions_count_the_sessions_pinned_now(routing: str) -> None:
    """``EndpointLoad.sessions`` counts the open sessions whose KV is on each endpoint: a
    session counts where it moved to, and stops counting when it ends (it only grew:
    5,000 after 5,000 ended jobs)."""
    urls = ["http://a.test/v1", "http://b.test/v1"]
    async with Runtime(urls, transport=FakeEngine().transport(), routing=routing) as rt:

        def pinned() -> int:
            return sum(load.sessions for load in rt.endpoint_loads())

        for i in range(100):
            async with rt.job(f"j{i}") as job, job.session() as s, job.session() as t:
                await s.chat(model="m", messages=MSG)
                await t.chat(model="m", messages=MSG)
                await s.chat(model="m", messages=MSG)
                assert pinned() == 2
            assert pinned() == 0
        async with rt.job("opened") as job, job.session() as s:
            assert pinned() == 0  # no turn yet: pinned nowhere
            await s.chat(model="m", messages=MSG)
            # a call outside any session is a one-call job: pinned only while it runs
            await rt.openai().chat.completions.create(model="m", messages=MSG)
            assert pinned() == 1
        assert pinned() == 0


async def test_a_moved_session_counts_once_and_ends_at_its_new_home() -> None:
    urls = ["http://a.test/v1", "http://b.test/v1"]
    async with Runtime(
        urls, transport=refusing({"a.test"}), routing="round_robin", retry=FAST
    ) as rt:
        async with rt.job("moved") as job, job.session() as s:
            for _ in range(4):
                await s.chat(model="m", messages=MSG)
                assert [load.sessions for load in rt.endpoint_loads()] == [0, 1]
        assert [load.sessions for load in rt.endpoint_loads()] == [0, 0]


async def test_a_failed_call_outside_a_session_unpins_its_one_call_job() -> None:
    urls = ["http://a.test/v1", "http://b.test/v1"]
    retry = Retry(attempts=1, wait_initial=0.0, wait_jitter=0.0)
    async with Runtime(
        urls, transport=refusing({"a.test"}), routing="round_robin", retry=retry
    ) as rt:
        client = rt.openai()
        for _ in range(6):
            try:
                await client.chat.completions.create(model="m", messages=MSG)
            except Exception:
                pass
        assert [load.sessions for load in rt.endpoint_loads()] == [0, 0]
