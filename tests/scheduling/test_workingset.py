"""Placement by working set: each replica's KV working set (scheduling/_workingset.py)
and the session router's memory rules (docs/routing.md, "Placement by working set")."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrt import Endpoint, Runtime
from agentrt.scheduling._placement import Placement
from agentrt.scheduling._routing import EndpointLoad, RouteKey, SessionAffinity, kv_fill
from agentrt.scheduling._signals import parse_cache_config
from agentrt.scheduling._workingset import WorkingSet
from tests._fake import FakeEngine

# ---------------------------------------------------------------- the working set


def test_stack_distance_counts_only_what_ran_after_the_session() -> None:
    kv = WorkingSet(1000)
    kv.start("a", 300)
    kv.finish("a", 300, None)
    kv.start("b", 200)
    kv.finish("b", 200, None)
    kv.start("c", 100)  # still in flight
    assert kv.stack_distance("a") == 300  # b and c ran after a
    assert kv.stack_distance("b") == 100  # c only
    assert kv.stack_distance("c") == 0
    assert kv.resident("a") == 300  # 1000 - 300 >= 300: all of it fits
    kv.start("d", 500)
    kv.finish("d", 500, None)
    # a: 800 touched after it, 200 of its 300 left under LRU
    assert kv.resident("a") == 200
    assert kv.resident("d") == 500
    assert kv.resident("nobody") == 0


def test_resident_is_unknown_without_a_capacity() -> None:
    kv = WorkingSet()
    kv.start("a", 300)
    assert kv.resident("a") is None
    assert kv.capacity_tokens is None and kv.source is None


def test_demand_weighs_sessions_by_when_they_wake() -> None:
    kv = WorkingSet(10_000, horizon_s=30.0)
    kv.start("busy", 1000)  # in flight: full weight
    kv.start("soon", 2000)
    kv.finish("soon", 2000, wake_at=110.0)  # wakes in 10 s: full weight
    kv.start("late", 3000)
    kv.finish("late", 3000, wake_at=220.0)  # wakes in 120 s: 30/120 of it
    kv.start("unknown", 400)
    kv.finish("unknown", 400, None)  # unknown wait: full weight
    assert kv.demand(100.0) == pytest.approx(1000 + 2000 + 3000 * 30 / 120 + 400)
    kv.leave("late")  # its job ended: it weighs nothing
    assert kv.demand(100.0) == pytest.approx(3400)
    assert kv.sessions == 3 and kv.tokens() == 3400


def test_a_sleeping_session_whose_context_is_evicted_weighs_nothing() -> None:
    # Its KV is gone already: nothing of it is left to keep, and its next call
    # recomputes it wherever it goes (load control gates that call on its own).
    kv = WorkingSet(1000, horizon_s=30.0)
    kv.start("old", 600)
    kv.finish("old", 600, None)  # due back soon
    kv.start("x", 500)
    kv.finish("x", 500, None)
    kv.start("y", 300)  # in flight
    # old: 800 touched since, 200 of its 600 left (under half): evicted
    assert kv.resident("old") == 200 and kv.evicted() == {"old"}
    assert kv.demand(0.0) == 800.0  # x and y; old weighs nothing
    assert kv.demand(0.0, "x") == 300.0
    kv.start("old", 600)  # in flight again, it weighs fully, and pushes x out
    assert kv.evicted() == {"x"} and kv.demand(0.0) == 900.0
    assert WorkingSet().evicted() == set()  # no capacity: nothing is known evicted
    kv.host_tokens = 1000  # a host tier keeps what the accelerator evicts: x comes back
    assert kv.evicted() == set() and kv.demand(0.0) == 1400.0


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["start", "finish", "admit", "hold", "leave"]),
            st.sampled_from("abcd"),
            st.integers(1, 5000),
            st.sampled_from([None, 5.0, 29.0, 31.0, 400.0]),
            st.sampled_from([0.0, 0.5, 7.0, 40.0]),
            st.sampled_from([None, "a", "b", "e"]),
        ),
        max_size=40,
    )
)
def test_the_kept_demand_is_the_one_worked_out_afresh(
    steps: list[tuple[str, str, int, float | None, float, str | None]],
) -> None:
    # Load control asks each replica's demand at every look: it is kept while nothing
    # changes and every live session weighs fully, and must equal a fresh sum exactly
    # (a look's decisions compare it with token counts).
    kv = WorkingSet(10_000, horizon_s=30.0)
    now = 0.0
    for op, sid, tokens, wait, dt, exclude in steps:
        now += dt
        if op == "start":
            kv.start(sid, tokens)
        elif op == "finish":
            kv.finish(sid, tokens, None if wait is None else now + wait)
        elif op == "admit":
            kv.admit(sid, tokens)
        elif op == "hold":
            kv.hold(sid)
        else:
            kv.leave(sid)
        kv.demand(now)  # kept from now on, where it may be
        for ex in (None, exclude):
            for t in (now, now + dt):
                kept = kv.demand(t, ex)
                saved, kv._demand = kv._demand, None
                assert kept == kv.demand(t, ex)  # worked out afresh
                kv._demand = saved


def test_an_eviction_teaches_the_capacity_and_hits_give_it_back() -> None:
    kv = WorkingSet()  # nothing known
    kv.observe(distance=5000, previous=2000, cached=0)  # evicted: held at most 5000
    assert kv.capacity_tokens == 5000 and kv.source == "learned" and kv.evictions == 1
    kv.observe(distance=3000, previous=2000, cached=500)  # held at most 3500
    assert kv.capacity_tokens == pytest.approx(5000 + 0.25 * (3500 - 5000))
    before = kv.capacity_tokens
    kv.observe(distance=9000, previous=2000, cached=2000)  # a hit beyond the estimate
    assert kv.capacity_tokens is not None and kv.capacity_tokens > before


def test_the_engine_figure_caps_the_learned_one() -> None:
    kv = WorkingSet()
    kv.set_capacity(8000, "engine")
    assert kv.capacity_tokens == 8000 and kv.source == "engine"
    kv.observe(distance=4000, previous=2000, cached=0)  # a fleet's share: less is ours
    assert kv.capacity_tokens == pytest.approx(8000 + 0.25 * (4000 - 8000))
    assert kv.source == "learned"
    for _ in range(40):  # full hits far above the estimate bring it back to the engine's
        kv.observe(distance=20_000, previous=2000, cached=2000)
    assert kv.capacity_tokens == 8000 and kv.source == "engine"


def test_rewritten_prompts_teach_nothing() -> None:
    kv = WorkingSet()
    kv.set_capacity(400_000, "engine")
    # Nothing else ran there since: an LRU cache that just held the context kept it,
    # whatever the shortfall (a Claude Code trace's rewritten prompt)
    kv.observe(distance=0, previous=96_000, cached=15_000, prompt=97_000)
    # A compacted conversation: the prompt is under half the previous context
    kv.observe(distance=120_000, previous=164_000, cached=12_000, prompt=27_000)
    assert kv.capacity_tokens == 400_000 and kv.source == "engine" and kv.evictions == 0
    # The same shortfall with others' contexts between, the prompt extending: evidence
    kv.observe(distance=120_000, previous=164_000, cached=12_000, prompt=170_000)
    assert kv.evictions == 1 and kv.source == "learned"


def test_tiny_contexts_teach_nothing() -> None:
    kv = WorkingSet()
    kv.observe(distance=100, previous=100, cached=0)
    assert kv.capacity_tokens is None and kv.evictions == 0


def test_bad_capacity_is_refused() -> None:
    with pytest.raises(ValueError, match="KV capacity"):
        WorkingSet(0)
    with pytest.raises(ValueError, match="horizon_s"):
        WorkingSet(10, horizon_s=float("nan"))


@given(
    st.lists(
        st.tuples(st.sampled_from("abcdef"), st.integers(0, 5000), st.booleans()),
        max_size=40,
    ),
    st.integers(1, 20_000),
)
def test_resident_never_exceeds_context_or_capacity(
    steps: list[tuple[str, int, bool]], capacity: int
) -> None:
    kv = WorkingSet(capacity)
    for sid, tokens, leave in steps:
        if leave:
            kv.leave(sid)
        else:
            kv.start(sid, tokens)
            kv.finish(sid, tokens, None)
    for sid in "abcdef":
        r = kv.resident(sid)
        assert r is not None and 0 <= r <= min(kv.context(sid), capacity)


def test_the_engine_capacity_gauge_is_read() -> None:
    page = (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig.\n"
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="2048"} 1.0\n'
    )
    config = parse_cache_config(page)
    assert config is not None and config.gpu_blocks * config.block_size == 32768
    assert parse_cache_config("garbage{") is None


# ---------------------------------------------------------------- the router's rules


def _loads(demands: list[float], capacity: float = 10_000) -> list[EndpointLoad]:
    return [EndpointLoad(kv_capacity=capacity, kv_demand=d) for d in demands]


def test_a_session_evicted_at_an_overfull_home_moves_where_it_fits() -> None:
    router = SessionAffinity(salt=b"x")
    loads = _loads([15_000, 9_500, 2_000])
    key = RouteKey("s", home=0, first_turn=False, tokens=3000, context=3000, resident=0)
    assert router.choose(loads, key, ()) == 2  # 1 has no room for 3000 more
    assert router.move_reason == "memory" and router.moves == {"memory": 1}


def test_a_session_still_cached_at_an_overfull_home_stays() -> None:
    router = SessionAffinity(salt=b"x")
    loads = _loads([15_000, 2_000, 2_000])
    key = RouteKey("s", home=0, first_turn=False, tokens=3000, context=3000, resident=2900)
    assert router.choose(loads, key, ()) == 0
    assert router.move_reason is None


def test_an_evicted_session_stays_when_home_has_room_or_nothing_else_does() -> None:
    router = SessionAffinity(salt=b"x")
    key = RouteKey("s", home=0, first_turn=False, tokens=3000, context=3000, resident=0)
    assert router.choose(_loads([8_000, 1_000]), key, ()) == 0  # home not overfull
    assert router.choose(_loads([15_000, 9_000, 9_500]), key, ()) == 0  # no room elsewhere
    assert router.moves == {}


def test_first_turns_go_where_working_sets_leave_room() -> None:
    router = SessionAffinity(salt=b"x")
    key = RouteKey("s", home=None, first_turn=True, tokens=1000)
    loads = _loads([9_000, 2_000, 8_500, 3_000])
    # in-flight load would prefer replica 0 (idle), memory says 1 or 3
    loads[1].in_flight = 2
    loads[3].in_flight = 1
    assert router.choose(loads, key, ()) == 3
    assert kv_fill(loads[3], 1000) == pytest.approx(0.4)


def test_with_ample_memory_first_turns_go_by_load_as_before() -> None:
    router = SessionAffinity(salt=b"x")
    key = RouteKey("s", home=None, first_turn=True, tokens=1000)
    loads = _loads([4_000, 100, 3_000])
    loads[1].in_flight = 3
    loads[2].in_flight = 1
    assert router.choose(loads, key, ()) == 0  # all under half full: load decides


def test_unknown_capacities_change_nothing() -> None:
    router = SessionAffinity(salt=b"x")
    loads = [EndpointLoad(), EndpointLoad()]
    key = RouteKey("s", home=0, first_turn=False, tokens=3000, context=3000, resident=None)
    assert router.choose(loads, key, ()) == 0


# ---------------------------------------------------------------- the runtime's view


@pytest.mark.anyio
@pytest.mark.parametrize("reason", ["overload", "retention"])
async def test_a_session_that_moves_for_any_reason_goes_where_there_is_room(
    reason: str,
) -> None:
    """Fills A 0.04 (the session's home), B 1.47, C 0.05, B the least loaded of the
    three: a session leaving A, overloaded or back after its cache likely expired
    there, goes to C, not B. Only moves for memory used to see the other replicas'
    fills (a move for overload went to B)."""
    urls = [f"http://{name}.test/v1" for name in "abc"]
    endpoints = [Endpoint(url, kv_capacity=10_000) for url in urls]
    async with Runtime(endpoints, transport=FakeEngine().transport(), poll_metrics_s=None) as rt:
        core = rt._core
        a, b, c = core.endpoints
        a.working_set.start("s", 400)
        a.working_set.finish("s", 400, None)
        b.working_set.start("big", 14_700)  # in flight: all of it counts
        c.working_set.start("small", 500)
        c.load.outstanding_tokens = 2_000  # C carries more than B
        if reason == "overload":
            a.load.outstanding_tokens = 100_000
        else:
            a.load.outstanding_tokens = 3_000  # and A more than C: load alone picks B
            a.load.retention_s = 1.0
        placement = Placement("s", stable=False)
        placement.home = 0
        placement.last_reply_at = anyio.current_time() - (10.0 if reason == "retention" else 0)
        fills = [kv_fill(load) for load in rt.endpoint_loads()]
        index, moved = placement.route(core.replicas, (), (), 400)
    assert fills == pytest.approx([0.04, 1.47, 0.05])
    assert (index, moved) == (2, reason)
