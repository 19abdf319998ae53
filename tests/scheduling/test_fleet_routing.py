"""Routing in a fleet: many processes, each with its own router, on the same replicas.

Each router here stands for one process: its own salt, its own view of the load.
"""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from agentrt.scheduling import (
    EndpointLoad,
    EngineQueueLimit,
    HashAffinity,
    LeastLoaded,
    RoundRobin,
    RouteKey,
    SessionAffinity,
    make_router,
)
from agentrt.scheduling._poll import (
    AUTO_MAX_BACKOFF,
    NO_METRICS_POLLS,
    NO_METRICS_S,
    PollSchedule,
)

URLS = [f"http://replica-{i}/v1" for i in range(8)]


def idle(n: int) -> list[EndpointLoad]:
    return [EndpointLoad() for _ in range(n)]


def first(session_id: str, *, stable: bool = False) -> RouteKey:
    return RouteKey(session_id, None, True, stable=stable)


@pytest.mark.parametrize(
    "make",
    [
        lambda salt: SessionAffinity(salt=salt, endpoints=URLS),
        lambda salt: LeastLoaded(salt=salt),
    ],
)
def test_fresh_processes_spread_their_first_turns(make: object) -> None:
    # 64 processes start at once, every replica idle in each one's view: the lowest
    # index used to win every tie, so all their first sessions went to replica 0.
    picks = Counter(
        make(f"process-{k}".encode()).choose(idle(8), first(f"s{k}"), ())  # type: ignore[operator]
        for k in range(64)
    )
    assert set(picks) == set(range(8))
    assert max(picks.values()) <= 16  # 8 each on average


def test_round_robin_starts_at_a_random_replica() -> None:
    starts = {RoundRobin(salt=f"p{k}".encode()).choose(idle(8), first("s"), ()) for k in range(32)}
    assert len(starts) >= 5
    rr = RoundRobin(salt=b"x")
    loads = idle(4)
    seq = [rr.choose(loads, first("s"), ()) for _ in range(8)]
    assert seq[4:] == seq[:4] and sorted(seq[:4]) == [0, 1, 2, 3]


def test_the_same_salt_breaks_ties_the_same_way() -> None:
    a, b = SessionAffinity(salt=b"same"), SessionAffinity(salt=b"same")
    loads = idle(8)
    assert [a.choose(loads, first(f"s{i}"), ()) for i in range(20)] == [
        b.choose(loads, first(f"s{i}"), ()) for i in range(20)
    ]


def test_a_caller_given_session_id_lands_where_every_process_sends_it() -> None:
    # Different processes (salts), different views of the load, endpoints listed in
    # another order: a session whose id the caller gave goes to the same replica.
    routers = [SessionAffinity(salt=f"p{k}".encode(), endpoints=URLS) for k in range(6)]
    shuffled = URLS[::-1]
    rev = SessionAffinity(salt=b"rev", endpoints=shuffled)
    rng = random.Random(7)
    for n in range(50):
        sid = f"thread-{n}"
        picks = set()
        for router in routers:
            loads = idle(8)
            for load in loads:
                load.in_flight = rng.randrange(2)  # at most one call each: never overloaded
            picks.add(URLS[router.choose(loads, first(sid, stable=True), ())])
        picks.add(shuffled[rev.choose(idle(8), first(sid, stable=True), ())])
        assert len(picks) == 1, sid
    # ...and different ids spread over the replicas.
    router = routers[0]
    spread = Counter(router.choose(idle(8), first(f"t{i}", stable=True), ()) for i in range(800))
    assert set(spread) == set(range(8)) and max(spread.values()) < 2 * 100


def test_a_caller_given_id_leaves_its_hash_replica_when_it_is_overloaded() -> None:
    router = SessionAffinity(endpoints=URLS)
    key = first("thread-9", stable=True)
    top = router.choose(idle(8), key, ())
    loads = idle(8)
    loads[top].running, loads[top].waiting = 40, 10  # the engine says: flooded
    second = router.choose(loads, key, ())
    assert second != top
    assert second == SessionAffinity(salt=b"other", endpoints=URLS).choose(loads, key, ())
    assert router.choose(loads, key, {second}) not in {top, second}


def test_a_generated_id_is_not_placed_by_hash() -> None:
    # Without a caller-given id nothing needs agreeing: the least loaded replica wins.
    router = SessionAffinity(endpoints=URLS)
    loads = idle(8)
    for i, load in enumerate(loads):
        load.in_flight = 0 if i == 5 else 1
    assert all(router.choose(loads, first(f"s{i}"), ()) == 5 for i in range(20))


def test_hash_bound_counts_the_engines_calls_when_polled() -> None:
    router = HashAffinity(endpoints=URLS)
    key = first("s1")
    top = router.choose(idle(8), key, ())
    loads = idle(8)
    # This process has nothing in flight anywhere, but the engines report the fleet's
    # calls: the top replica carries 30 of 44, far above its bound.
    for load in loads:
        load.running, load.waiting = 2, 0
    loads[top].running = 30
    assert router.choose(loads, key, ()) != top
    # The same loads seen locally only (not polled): the bound cannot see them.
    local = idle(8)
    assert router.choose(local, key, ()) == top


def test_endpoint_load_view_says_whose_load_is_compared() -> None:
    load = EndpointLoad(in_flight=3)
    assert load.view == "local"
    load.running, load.waiting = 5, 0
    assert load.view == "engine"


def test_make_router_names_endpoints_for_the_hashing_routers() -> None:
    a = make_router("hash", endpoints=URLS)
    b = make_router("hash", endpoints=URLS[::-1])
    key = first("abc")
    assert URLS[a.choose(idle(8), key, ())] == URLS[::-1][b.choose(idle(8), key, ())]
    assert make_router("round_robin", endpoints=URLS).name == "round_robin"


# ---------------------------------------------------------------- the engine cap's share


def test_engine_cap_is_this_process_share_of_the_batch() -> None:
    alone, member = EngineQueueLimit(), EngineQueueLimit()
    # Alone: all 24 calls at the engine are ours, the cap is the batch plus 1/8.
    alone.on_signals(16, 8, 0, 24)
    assert alone.limit == 18
    # One of 4 equal processes: 6 of the 24 are ours, the cap is a quarter of the batch.
    member.on_signals(16, 8, 0, 6)
    assert member.limit == 4 + 1
    # Four such caps together admit about one batch, not four.
    assert 4 * member.limit <= 16 + 4
    # Calls waiting in our own queue count as our demand.
    queued = EngineQueueLimit()
    queued.on_signals(16, 8, 24, 6)
    assert queued.limit == math.ceil(16 * 30 / 48) + 2
    # Unknown in-flight count (an old caller): the whole batch, as before.
    old = EngineQueueLimit()
    old.on_signals(16, 8, 0)
    assert old.limit == 18


# ---------------------------------------------------------------- the polling schedule


def test_a_fixed_interval_polls_every_endpoint_together() -> None:
    s = PollSchedule(3, 1.0, adaptive=False, start=10.0, rng=random.Random(0))
    assert s.next_at() == 11.0 and s.due(11.0) == [0, 1, 2]
    for i in range(3):
        s.polled(i, 11.0, (1, 0, 0.1), busy=False)
    assert s.next_at() == 12.0


def test_the_default_schedule_spreads_jitters_and_backs_off() -> None:
    s = PollSchedule(64, 1.0, adaptive=True, start=0.0, rng=random.Random(1))
    phases = [s._next[i] for i in range(64)]
    assert all(0.0 <= p < 1.0 for p in phases) and len(set(phases)) == 64
    # A changing reading while busy: about every second, jittered.
    t = 0.0
    for n in range(20):
        s.polled(0, t, (n, 0, 0.5), busy=True)
        gap = s._next[0] - t
        assert 0.8 <= gap <= 1.2
        t = s._next[0]
    # Unchanged readings: the interval doubles up to the cap, and a change resets it.
    intervals = []
    for _ in range(6):
        s.polled(0, t, (7, 0, 0.5), busy=True)
        intervals.append(s.interval(0))
    assert intervals[-1] == AUTO_MAX_BACKOFF
    assert intervals[:3] == [1.0, 2.0, 4.0]  # the first equals the last changing one
    s.polled(0, t, (8, 0, 0.5), busy=True)
    assert s.interval(0) == 1.0
    # Idle (nothing in flight, nothing sent since): back off too.
    s.polled(0, t, (9, 0, 0.5), busy=False)
    assert s.interval(0) == 2.0


def test_an_endpoint_without_metrics_is_asked_rarely() -> None:
    s = PollSchedule(1, 1.0, adaptive=True, start=0.0, rng=random.Random(2))
    for n in range(NO_METRICS_POLLS):
        assert s.interval(0) == 1.0
        s.polled(0, float(n), None, busy=True)
    assert s.interval(0) == NO_METRICS_S
    s.polled(0, 100.0, (1, 0, None), busy=True)  # it came up
    assert s.interval(0) == 1.0


def test_a_poll_in_progress_is_not_due_and_a_slow_one_is_known() -> None:
    s = PollSchedule(2, 1.0, adaptive=True, start=0.0, rng=random.Random(3))
    s.started(0)
    assert s.due(5.0) == [1]  # 0's poll is in progress: not due again
    s.polled(0, 5.0, (1, 0, 0.1), busy=True, took_s=0.7)
    assert s.slow(0) and 0 not in s.due(5.7)
    s.polled(0, 6.0, (2, 0, 0.1), busy=True, took_s=0.1)
    assert not s.slow(0)
    s.waited_out(0)  # a first turn gave up on it
    assert s.slow(0) and not s.slow(1)
