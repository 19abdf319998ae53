"""The defaults that adapt by themselves (docs/tune.md, "What adapts by itself"):
``concurrency="engine"`` caps an endpoint only while its engine reports a waiting queue,
and ``send_priority="auto"`` passes priorities only to endpoints that advertise a
priority scheduler. Unit tests of the limit, then the embedded engine (real replicas,
in-process)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from agentrt import Endpoint, Runtime
from agentrt.scheduling import FCFS, Admission, EngineQueueLimit, Ticket, make_limit
from agentrt.sim import PRESETS, Cluster

pytestmark = pytest.mark.anyio

MSG = [{"role": "user", "content": "tell me a long story " * 20}]


# -- the limit ---------------------------------------------------------------------------


def test_no_limit_until_the_engine_queues_then_about_its_batch() -> None:
    lim = EngineQueueLimit(window=3)
    assert lim.limit is None
    lim.on_signals(None, None, 5)  # the engine reports nothing: nothing to learn
    lim.on_signals(0, 6, 0)  # arrivals before a step: nothing runs yet, no batch to cap at
    assert lim.limit is None
    lim.on_signals(12, 0, 0)  # busy, no queue: still no cap
    assert lim.limit is None
    lim.on_signals(16, 7, 0)  # a queue formed: its batch plus 1/8 (at least 1)
    assert lim.limit == 18
    lim.on_signals(40, 3, 9)  # the batch grew (KV freed): the cap follows it
    assert lim.limit == 45
    lim.on_signals(2, 5, 9)  # a poll between steps: the batch is the recent most
    assert lim.limit == 45
    lim.on_signals(4, 2, 9)
    lim.on_signals(4, 2, 9)  # the batch shrank for a whole window: the cap follows
    assert lim.limit == 5


def test_the_cap_grows_while_the_engine_has_room_and_lifts_when_calm() -> None:
    lim = EngineQueueLimit(calm_polls=3)
    lim.on_signals(8, 1, 0)
    assert lim.limit == 9
    lim.on_signals(9, 0, 4)  # no queue there, calls wait here: the engine has room
    assert lim.limit == 11
    lim.on_signals(11, 0, 2)
    assert lim.limit == 13
    lim.on_signals(5, 0, 0)
    lim.on_signals(5, 0, 0)
    assert lim.limit == 13  # not yet calm for 3 polls
    lim.on_signals(5, 0, 0)
    assert lim.limit is None
    with pytest.raises(ValueError, match="headroom"):
        EngineQueueLimit(headroom=2.0)
    assert isinstance(make_limit("engine"), EngineQueueLimit)


async def test_admission_admits_the_waiting_calls_when_the_cap_grows() -> None:
    lim = EngineQueueLimit(headroom=0.0)
    gate = Admission(FCFS(), lim)
    lim.on_signals(1, 1, 0)  # capped at 1 (no headroom: at least one)
    assert lim.limit == 2
    held = [Ticket(f"c{i}", "j", "j", session_id="s") for i in range(4)]
    admitted: list[str] = []

    async def call(t: Ticket) -> None:
        await gate.admit(t)
        admitted.append(t.call_id)

    async with anyio.create_task_group() as tg:
        for t in held:
            tg.start_soon(call, t)
        await anyio.wait_all_tasks_blocked()
        assert len(admitted) == 2 and gate.statistics().waiting == 2
        gate.engine_signals(2, 0)  # room at the engine while two wait here: 2 -> 3
        await anyio.wait_all_tasks_blocked()
        assert len(admitted) == 3
        gate.engine_signals(None, None)  # nothing reported: nothing changes
        await anyio.wait_all_tasks_blocked()
        assert len(admitted) == 3
        gate.engine_signals(3, 0)
    assert sorted(admitted) == ["c0", "c1", "c2", "c3"]


# -- on the embedded engine -----------------------------------------------------------


async def _burst(rt: Runtime, n: int, limits: list[int | None]) -> None:
    """``n`` concurrent jobs of 3 turns each; ``limits`` samples the endpoint's cap
    meanwhile."""

    async def one(i: int) -> None:
        async with rt.job(f"j{i}") as job, job.session() as s:
            for _ in range(3):
                await s.chat(model="m", messages=MSG, max_tokens=10)
        assert job.report.status == "ok"

    async def watch() -> None:
        while True:
            limits.append(rt.admission_statistics()[0].limit)
            await anyio.sleep(0.005)

    async with anyio.create_task_group() as outer:
        outer.start_soon(watch)
        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
        outer.cancel_scope.cancel()


async def test_the_default_caps_only_while_the_engine_queues() -> None:
    batch = 4
    engine = PRESETS["h100-8b"].replace(max_num_seqs=batch)
    async with Cluster(1, engine) as cluster:
        limits: list[int | None] = []
        async with Runtime(
            cluster.base_urls, transport=cluster.transport(), poll_metrics_s=0.01
        ) as rt:
            assert rt.admission_statistics()[0].limit is None  # no queue seen yet
            await _burst(rt, 16, limits)
            stats = rt.admission_statistics()[0]
            # The engine runs 4 at a time and queued the rest: agentrt held calls back.
            assert stats.queued_total > 0
            caps = [x for x in limits if x is not None]
            assert caps, "the cap never engaged"
            # Not below what the engine runs, but for a first poll that lands between two
            # engine steps (few running, arrivals waiting): with calls queued in agentrt
            # and none at the engine, the next polls raise it. It cannot throttle
            # throughput for long.
            low = [c for c in caps if c < batch]
            assert len(low) <= len(caps) // 4, caps
            assert caps[-1] >= batch
            with anyio.fail_after(5):  # the queue drained: the cap lifts
                for _ in range(500):
                    if rt.admission_statistics()[0].limit is None:
                        break
                    await anyio.sleep(0.01)
            assert rt.admission_statistics()[0].limit is None


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"concurrency": None, "poll_metrics_s": 0.01}],
    ids=["no-polling", "concurrency-none"],
)
async def test_no_cap_without_engine_signals_or_with_none(kwargs: dict[str, Any]) -> None:
    engine = PRESETS["h100-8b"].replace(max_num_seqs=4)
    async with Cluster(1, engine) as cluster:
        limits: list[int | None] = []
        async with Runtime(cluster.base_urls, transport=cluster.transport(), **kwargs) as rt:
            await _burst(rt, 16, limits)
            assert rt.admission_statistics()[0].queued_total == 0
    assert set(limits) == {None}


class Level3(FCFS):
    """Every call at queue level 3: a non-zero priority, which a server that does not
    schedule by priority rejects."""

    def classify(self, ticket: Ticket, now: float) -> int:
        ticket.priority = 3
        return 3


async def _priorities(cluster: Cluster, **kwargs: Any) -> list[int | None]:
    async with Runtime(
        cluster.base_urls, transport=cluster.transport(), policy=Level3, dialect="vllm", **kwargs
    ) as rt:
        async with rt.job("j") as job, job.session() as s:
            for _ in range(3):
                await s.chat(model="m", messages=MSG, max_tokens=2)
    assert job.report.status == "ok"
    return [c.priority for c in job.report.call_reports]


async def test_auto_passes_priorities_to_a_replica_that_schedules_by_them() -> None:
    async with Cluster(1, PRESETS["h100-8b"].replace(scheduling="priority")) as cluster:
        # The first reply advertises the priority scheduler; the calls after carry one.
        assert await _priorities(cluster) == [None, 3, 3]
        assert await _priorities(cluster, send_priority=False) == [None, None, None]


async def test_auto_sends_none_to_a_replica_that_does_not() -> None:
    async with Cluster(1, "h100-8b") as cluster:
        assert await _priorities(cluster) == [None, None, None]
        # What 'auto' avoids: forced on, the replica rejects the call (HTTP 400).
        with pytest.raises(Exception, match="priority"):
            await _priorities(cluster, send_priority=True)
        # An endpoint's own setting still overrides the runtime's.
        eps = [Endpoint(cluster.base_urls[0], send_priority=False)]
        async with Runtime(
            eps, transport=cluster.transport(), send_priority=True, dialect="vllm"
        ) as rt:
            async with rt.job("j") as job, job.session() as s:
                await s.chat(model="m", messages=MSG, max_tokens=2)
        assert job.report.call_reports[0].priority is None
