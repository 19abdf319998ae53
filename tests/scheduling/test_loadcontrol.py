"""Load control (scheduling/_loadcontrol.py): sessions held at their tool boundaries
while their replica's live working set leaves no room, resumed resident first, then the
longest held, never past the bound."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

from agentrt import LoadControl
from agentrt.scheduling._loadcontrol import ANY, Gate
from agentrt.scheduling._workingset import WorkingSet

pytestmark = pytest.mark.anyio

FAR = 1e9
"""A wake time so far away that a sleeping session weighs nothing."""


def gate(
    *capacities: int | None, max_hold_s: float = 60.0, healthy: set[int] | None = None
) -> tuple[Gate, list[WorkingSet]]:
    shadows = [WorkingSet(c) for c in capacities]
    up = set(range(len(shadows))) if healthy is None else healthy
    settings = LoadControl(max_hold_s=max_hold_s, watermark=1.0, tick_s=0.01)
    return Gate(shadows, lambda i: i in up, settings, anyio.current_time), shadows


def resumer(g: Gate, order: list[str]) -> Callable[[str, int], Awaitable[None]]:
    """A task that resumes ``sid`` at replica 0 and notes when it went on."""

    async def resume(sid: str, tokens: int) -> None:
        await g.admit(sid, 0, tokens)
        order.append(sid)

    return resume


def running(shadow: WorkingSet, sid: str, tokens: int) -> None:
    """``sid`` holds ``tokens`` on ``shadow`` and is about to send again."""
    shadow.start(sid, tokens)
    shadow.finish(sid, tokens, None)


def calling(shadow: WorkingSet, sid: str, tokens: int) -> None:
    """``sid`` holds ``tokens`` on ``shadow`` with a call in flight (a replica with no
    call in flight takes a held session whatever the room)."""
    shadow.start(sid, tokens)


async def test_a_session_that_fits_goes_on_at_once_at_home() -> None:
    g, (kv,) = gate(1000)
    running(kv, "a", 400)
    running(kv, "b", 500)
    assert (await g.admit("a", 0, 100))[::2] == (0, False)
    assert g.stats.holds == 0
    assert not kv.held("a")


async def test_a_session_without_room_is_held_until_another_leaves() -> None:
    g, (kv,) = gate(1000)
    running(kv, "b", 600)
    calling(kv, "a", 600)  # the replica is overcommitted: 1,200 of 1,000
    got: list[tuple[int, bool]] = []

    async def resume_b() -> None:
        grant = await g.admit("b", 0, 600)
        assert grant.held_s >= 0.04
        got.append((grant.replica, grant.forced))

    async with anyio.create_task_group() as tg:
        tg.start_soon(resume_b)
        await anyio.sleep(0.05)
        assert not got and g.held == 1
        assert kv.held("b")
        assert kv.demand(0.0) == 600  # b counts in no demand while held
        kv.leave("a")  # a's job ended
        g.changed()
    assert got == [(0, False)]
    assert not kv.held("b")
    assert g.stats.holds == 1 and g.stats.forced == 0
    assert 0.04 <= g.stats.longest_s < 1.0


async def test_a_replica_with_no_call_in_flight_takes_a_held_session() -> None:
    # Work conservation: sleeping sessions due back soon fill the room, yet once no
    # call runs on the replica the held session goes on (before, it waited for the
    # bound while the replica sat idle).
    g, (kv,) = gate(1000, max_hold_s=60.0)
    running(kv, "b", 500)
    running(kv, "a", 300)  # due back soon: weighs fully
    calling(kv, "c", 400)
    got: list[tuple[int, bool]] = []

    async def resume_b() -> None:
        grant = await g.admit("b", 0, 500)
        got.append((grant.replica, grant.forced))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(resume_b)
            await anyio.sleep(0.05)
            assert not got and g.held == 1  # 700 live beside a call in flight: no room
            kv.finish("c", 400, None)  # c's call ended; due back soon, it still weighs
            assert kv.demand(anyio.current_time(), "b") == 700.0
            g.changed()
    assert got == [(0, False)] and g.stats.forced == 0
    # b's call now runs there: a's resume waits for room, or for the replica to idle.
    with anyio.move_on_after(0.05):
        await g.admit("a", 0, 300)
    assert g.stats.holds == 2


async def test_a_sleeping_session_waking_past_the_horizon_leaves_room() -> None:
    g, (kv,) = gate(1000)
    kv.start("a", 900)
    kv.finish("a", 900, FAR)  # a long tool wait: a's context weighs almost nothing
    assert (await g.admit("b", None, 500))[::2] == (0, False)


async def test_the_bound_forces_a_held_session_on() -> None:
    g, (kv,) = gate(1000, max_hold_s=0.1)
    running(kv, "b", 900)
    calling(kv, "a", 900)
    with anyio.fail_after(2):
        assert (await g.admit("b", 0, 900))[::2] == (0, True)
    assert g.stats.forced == 1
    assert 0.1 <= g.stats.longest_s < 1.0


async def test_first_turns_go_to_the_replica_with_the_most_room() -> None:
    g, (k0, k1, k2) = gate(1000, 1000, 1000)
    running(k0, "a", 700)
    running(k1, "b", 200)
    running(k2, "c", 400)
    assert (await g.admit("new", None, 300))[::2] == (1, False)
    assert k1.context("new") == 300  # reserved there at once: the next one sees it
    assert (await g.admit("new2", None, 300))[::2] == (2, False)


async def test_no_gate_where_a_capacity_is_unknown() -> None:
    g, (k0, k1) = gate(1000, None)
    running(k0, "a", 5000)
    assert (await g.admit("new", None, 300))[::2] == (ANY, False)
    running(k1, "b", 10**6)
    assert (await g.admit("b", 1, 10**6))[::2] == (1, False)


async def test_a_session_alone_on_its_replica_always_fits() -> None:
    g, (kv,) = gate(1000)
    running(kv, "huge", 5000)
    assert (await g.admit("huge", 0, 5000))[::2] == (0, False)


async def test_a_new_session_queues_behind_held_ones() -> None:
    g, (kv,) = gate(1000)
    calling(kv, "a", 800)
    order: list[str] = []

    async def first_turn(sid: str) -> None:
        await g.admit(sid, None, 600)
        order.append(sid)

    async with anyio.create_task_group() as tg:
        tg.start_soon(first_turn, "early")
        await anyio.sleep(0.03)
        tg.start_soon(first_turn, "late")
        await anyio.sleep(0.03)
        assert order == [] and g.held == 2
        kv.leave("a")
        g.changed()
        await anyio.sleep(0.03)
        assert order == ["early"]  # room for one of them: the one that came first
        kv.leave("early")
        g.changed()
    assert order == ["early", "late"]


async def test_a_resident_session_resumes_before_an_older_evicted_one() -> None:
    g, (kv,) = gate(1000)
    # "old" ran first, then a lot ran after it: its context is evicted (LRU).
    running(kv, "old", 700)
    running(kv, "young", 400)  # ran last: resident
    calling(kv, "x", 700)
    order: list[str] = []

    async def resume(sid: str, tokens: int) -> None:
        await g.admit(sid, 0, tokens)
        order.append(sid)

    async with anyio.create_task_group() as tg:
        tg.start_soon(resume, "old", 700)
        await anyio.sleep(0.03)
        tg.start_soon(resume, "young", 400)
        await anyio.sleep(0.03)
        assert order == [] and g.held == 2  # beside x's 700, neither fits
        kv.finish("x", 700, FAR)  # x went into a long tool wait: it weighs nothing
        g.changed()
        await anyio.sleep(0.03)
        assert order == ["young"]  # resident first; old's 700 does not fit beside it
        kv.leave("young")
        g.changed()
    assert order == ["young", "old"]


async def test_a_session_held_past_half_the_bound_reserves_its_replica() -> None:
    g, (kv,) = gate(1000, max_hold_s=1.0)
    running(kv, "small", 250)  # ran first: evicted since (a resident one goes on)
    running(kv, "big", 800)
    calling(kv, "x", 700)
    order: list[str] = []
    resume = resumer(g, order)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(resume, "big", 800)
            await anyio.sleep(0.6)  # past half the bound
            tg.start_soon(resume, "small", 250)  # would fit beside x, but big waits longer
    assert order[0] == "big"  # forced at the bound, then small
    assert g.stats.forced >= 1


async def test_a_resident_resume_is_held_back_by_room_not_by_a_reservation() -> None:
    # "big" is held past half the bound: it reserves replica 0. "small" ran last (its
    # context is resident) and fits beside x: it goes on at once, on arrival as in a
    # pass (held, its context would age out), and big is held until room or the bound.
    g, (kv,) = gate(1000, max_hold_s=2.0)
    running(kv, "big", 800)
    calling(kv, "x", 700)
    order: list[str] = []

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(resumer(g, order), "big", 800)
            await anyio.sleep(1.05)  # big is past half the bound
            running(kv, "small", 250)
            grant = await g.admit("small", 0, 250)
            assert (grant.replica, grant.held_s, grant.forced) == (0, 0.0, False)
            assert order == [] and g.held == 1  # big still waits for its room
            kv.leave("x")
            kv.finish("small", 250, FAR)
            g.changed()
    assert order == ["big"] and g.stats.forced == 0


async def test_a_first_turn_held_past_half_the_bound_reserves_only_one_replica() -> None:
    # A session with no home to wait for reserves the replica it would take (the one
    # with the most room), not every replica: sessions elsewhere go on meanwhile.
    g, (k0, k1) = gate(1000, 1000, max_hold_s=2.0)
    calling(k0, "a", 800)  # 200 of room: the most
    running(k1, "c", 50)
    calling(k1, "b", 900)
    got: list[tuple[int, float, bool]] = []

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(g.admit, "new", None, 500)
            await anyio.sleep(1.1)  # past half the bound: it fits nowhere
            assert g.held == 1
            with anyio.move_on_after(0.5):
                got.append(tuple(await g.admit("c", 1, 50)))  # fits on replica 1
            assert got == [(1, 0.0, False)]  # at once: replica 1 is not reserved
            assert g._reserved(anyio.current_time(), [True, True]) == {0}
            tg.cancel_scope.cancel()


class _Counting(Gate):
    """A gate that counts its passes over the held sessions."""

    __slots__ = ("looks",)

    def _dispatch(self, now: float, *args: object) -> None:
        self.looks = getattr(self, "looks", 0) + 1
        super()._dispatch(now, *args)  # type: ignore[arg-type]


async def test_the_timer_looks_again_only_once_something_changed() -> None:
    shadows = [WorkingSet(1000), WorkingSet(1000)]
    settings = LoadControl(max_hold_s=60.0, watermark=1.0, tick_s=0.01)
    g = _Counting(shadows, lambda i: True, settings, anyio.current_time)
    kv = shadows[0]
    running(kv, "b", 600)
    calling(kv, "a", 600)
    calling(shadows[1], "x", 900)
    got: list[int] = []

    async def resume_b() -> None:
        got.append((await g.admit("b", 0, 600)).replica)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(resume_b)
            await anyio.sleep(0.05)
            assert g.held == 1
            before = g.looks
            await anyio.sleep(0.2)  # twenty ticks, nothing changed
            assert g.looks == before
            g.changed()  # told of a change that is none: no look either
            assert g.looks == before
            kv.host_tokens = 1200  # a figure from outside, no call to changed()
            await anyio.sleep(0.05)  # the next tick sees it
    assert got == [0] and g.looks == before + 1


class _Spinning(RuntimeError):
    pass


class _Bounded(Gate):
    """A gate that stops a replay whose timer looks too often (it would spin forever)."""

    __slots__ = ("looks",)

    def _count(self) -> None:
        self.looks = getattr(self, "looks", 0) + 1
        if self.looks > 1000:
            raise _Spinning

    def _look(self, now: float) -> None:
        self._count()
        super()._look(now)

    def _dispatch(self, now: float, *args: object) -> None:
        self._count()
        super()._dispatch(now, *args)  # type: ignore[arg-type]


def test_the_bound_is_reached_where_the_clock_rounds_below_it() -> None:
    # In virtual time, held from 1019.6758356529996 with a 300 s bound, the timer wakes at
    # 1319.6758356529995: since + bound - now is 0.0, yet now - since is one unit short
    # of 300. The timer then slept 0 s again and again at a clock that never moved (a
    # replay at N = 96 spun there for minutes).
    from agentrt.bench._clock import VirtualTimeLoop

    since = 1019.6758356529996
    assert since + 300.0 - 1319.6758356529995 == 0.0 and 1319.6758356529995 - since < 300.0
    got: list[tuple[int, bool]] = []

    async def main() -> None:
        kv = WorkingSet(1000)
        running(kv, "b", 900)
        calling(kv, "a", 900)
        settings = LoadControl(max_hold_s=300.0, watermark=1.0, tick_s=1.0)
        g = _Bounded([kv], lambda i: True, settings, anyio.current_time)
        await anyio.sleep(since - anyio.current_time())
        assert anyio.current_time() == since
        grant = await g.admit("b", 0, 900)
        got.append((grant.replica, grant.forced))

    anyio.run(main, backend_options={"loop_factory": VirtualTimeLoop})
    assert got == [(0, True)]


async def test_a_cancelled_hold_leaves_no_waiter() -> None:
    g, (kv,) = gate(1000)
    running(kv, "b", 900)
    calling(kv, "a", 900)
    with anyio.move_on_after(0.05):
        await g.admit("b", 0, 900)
    assert g.stats.holds == 1 and g.held == 0 and g.stats.held_now == 0


async def test_a_down_home_resumes_where_there_is_room() -> None:
    g, (k0, _) = gate(1000, 1000, healthy={1})
    running(k0, "a", 900)
    assert (await g.admit("a", 0, 900))[::2] == (1, False)


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max_hold_s"):
        LoadControl(max_hold_s=0)
    with pytest.raises(ValueError, match="watermark"):
        LoadControl(watermark=2.0)
    with pytest.raises(ValueError, match="tick_s"):
        LoadControl(tick_s=float("nan"))


# ---------------------------------------------------------------- in the runtime


async def test_the_runtime_holds_a_session_whose_replica_is_full() -> None:
    from agentrt import Endpoint, Runtime
    from tests._fake import FakeEngine

    fake = FakeEngine(prompt_tokens=550, completion_tokens=50, delay_s=0.3)
    url = "http://engine.test/v1"
    a_ran, b_runs = anyio.Event(), anyio.Event()
    rt = Runtime(
        [Endpoint(url, kv_capacity=1000)],
        transport=fake.transport(),
        api_key="k",
        poll_metrics_s=None,
        load_control=LoadControl(watermark=1.0, tick_s=0.01),
    )
    ask = [{"role": "user", "content": "hi"}]
    async with rt:
        client = rt.openai()

        async def a() -> None:
            async with rt.job("a") as job, job.session("main") as s:
                await s.chat(model="m", messages=ask)
                a_ran.set()
                await b_runs.wait()
                await anyio.sleep(0.05)  # b's call (600) now runs beside a's context (600)
                await s.chat(model="m", messages=ask)  # held until b's call ends

        async def b() -> None:
            async with rt.job("b") as job, job.session("main") as s:
                await a_ran.wait()
                await s.chat(model="m", messages=ask)  # b's context: 600
                b_runs.set()
                # No call runs: the replica takes b whatever a's context leaves.
                await s.chat(model="m", messages=ask)

        async with anyio.create_task_group() as tg:
            tg.start_soon(a)
            tg.start_soon(b)
        del client
        reports = {r.name: r for r in rt.reports()}
        stats = rt.load_statistics()
    second = reports["a"].call_reports[1]
    assert 0.1 <= second.held_s < 10.0  # b's call takes 0.3 s (a loaded machine: more)
    assert reports["a"].held_s == second.held_s
    assert reports["b"].held_s == 0.0
    assert "held" in str(reports["a"])
    assert stats is not None and stats.holds == 1 and stats.forced == 0
    assert reports["a"].runtime is not None and reports["a"].runtime["load_control"] is True


async def test_load_control_off_holds_nothing() -> None:
    from agentrt import Endpoint, Runtime
    from tests._fake import FakeEngine

    fake = FakeEngine(prompt_tokens=550, completion_tokens=50)
    rt = Runtime(
        [Endpoint("http://engine.test/v1", kv_capacity=1000)],
        transport=fake.transport(),
        api_key="k",
        load_control=False,
    )
    assert rt.load_statistics() is None
    with pytest.raises(TypeError, match="load_control"):
        Runtime("http://engine.test/v1", load_control="yes")  # type: ignore[arg-type]


async def test_a_host_tier_counts_as_room_at_its_weight() -> None:
    g, (kv,) = gate(1000)
    running(kv, "b", 900)
    calling(kv, "a", 900)
    with anyio.move_on_after(0.05):
        await g.admit("b", 0, 900)  # 1,800 of 1,000: held
    assert g.stats.holds == 1
    kv.host_tokens = 2000  # half of it counts: 2,000 of room
    assert (await g.admit("b", 0, 900))[::2] == (0, False)


def test_the_host_tier_is_read_from_the_engines_cache_config() -> None:
    from agentrt.scheduling._signals import parse_cache_config

    page = (
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="100",'
        'num_cpu_blocks="400",enable_prefix_caching="True"} 1.0\n'
    )
    config = parse_cache_config(page)
    assert config is not None and (config.gpu_blocks, config.host_blocks) == (100, 400)
    assert parse_cache_config(page.replace('"400"', '"0"')).host_blocks is None  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="host_weight"):
        LoadControl(host_weight=1.5)


def test_a_shared_replica_is_gated_at_the_learned_share() -> None:
    kv = WorkingSet(1000, source="engine")
    assert kv.gate_capacity == 1000.0
    kv.start("a", 600)
    kv.finish("a", 600, None)
    kv.start("b", 300)
    kv.finish("b", 300, None)
    kv.observe(distance=300, previous=600, cached=0)  # evicted: at most 300 held
    assert kv.capacity_tokens is not None and kv.capacity_tokens < 1000
    assert kv.gate_capacity == 1000.0  # alone: the engine's figure
    kv.saw_others(True, now=10.0)
    assert kv.gate_capacity == kv.capacity_tokens  # shared: its learned share
    kv.saw_others(False, now=100.0)
    assert kv.gate_capacity == kv.capacity_tokens  # seen lately: still shared
    kv.saw_others(False, now=200.0)
    assert kv.gate_capacity == 1000.0


async def test_on_a_shared_replica_what_others_run_there_is_taken() -> None:
    g, (kv,) = gate(1000)
    running(kv, "a", 300)
    assert (await g.admit("a", 0, 300))[::2] == (0, False)  # alone: 300 of 1,000
    kv.engine_used = 900.0  # the engine's running requests hold 900, 300 of them a's
    assert (await g.admit("a", 0, 300))[::2] == (0, False)  # not shared: all a's own
    kv.saw_others(True, now=0.0)
    assert kv.others_tokens() == 600.0  # a is busy (admitted): 900 - 300
    kv.finish("a", 300, None)
    with anyio.move_on_after(0.05):
        await g.admit("a", 0, 300)  # others hold 900 now (a not running): no room
    assert g.stats.holds == 1
