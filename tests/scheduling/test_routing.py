"""Routing policies: round robin, least loaded, session affinity, bounded-load hashing,
prefix fingerprints and make_router. Property tests check the routers' invariants."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import time
from collections.abc import Collection, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrt.scheduling import (
    DEFAULT_CALL_COST_TOKENS,
    PREFIX_CUTS,
    EndpointLoad,
    HashAffinity,
    LeastLoaded,
    RoundRobin,
    RouteKey,
    Router,
    SessionAffinity,
    load_score,
    make_router,
    prefix_fingerprints,
)
from agentrt.scheduling._routing import ENGINE_FLOOR_CALLS

# ---------------------------------------------------------------- helpers


def key(session: str = "s", home: int | None = None) -> RouteKey:
    return RouteKey(session, home, first_turn=home is None)


def idle(n: int) -> list[EndpointLoad]:
    return [EndpointLoad() for _ in range(n)]


def allowed(loads: Sequence[EndpointLoad], avoid: Collection[int]) -> set[int]:
    """The spec's tiers, written independently of the library."""
    n = len(loads)
    tiers = [
        {i for i in range(n) if i not in avoid and loads[i].healthy},
        {i for i in range(n) if i not in avoid},
        {i for i in range(n) if loads[i].healthy},
        set(range(n)),
    ]
    return next(t for t in tiers if t)


def score(load: EndpointLoad) -> float:
    calls = load.in_flight
    if load.running is not None or load.waiting is not None:
        calls = max(calls, (load.running or 0) + (load.waiting or 0))
    return (load.outstanding_tokens + DEFAULT_CALL_COST_TOKENS * calls) / load.weight


def chat_body(system: str, user: str) -> bytes:
    import json

    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return json.dumps({"messages": messages, "model": "m"}).encode()


endpoint_loads = st.builds(
    EndpointLoad,
    weight=st.sampled_from([0.5, 1.0, 1.0, 2.0, 4.0]),
    in_flight=st.integers(0, 30),
    sessions=st.integers(0, 8),
    outstanding_tokens=st.sampled_from([0, 0, 100, 1000, 5000, 40000]),
    healthy=st.booleans() | st.just(True),
    running=st.none() | st.integers(0, 40),
    waiting=st.none() | st.integers(0, 40),
    kv_usage=st.none() | st.floats(0, 1),
)


@st.composite
def situations(draw: st.DrawFn) -> tuple[list[EndpointLoad], set[int]]:
    loads = draw(st.lists(endpoint_loads, min_size=1, max_size=7))
    avoid = draw(st.sets(st.integers(0, len(loads) - 1), max_size=len(loads)))
    return loads, avoid


# ---------------------------------------------------------------- prefix fingerprints


def test_fingerprints_only_cuts_shorter_than_the_body() -> None:
    assert prefix_fingerprints(b"") == ()
    assert prefix_fingerprints(b"x" * 256) == ()
    assert len(prefix_fingerprints(b"x" * 257)) == 1
    assert len(prefix_fingerprints(b"x" * 5000)) == 3
    assert len(prefix_fingerprints(b"x" * 1_000_000)) == len(PREFIX_CUTS)


def test_shared_system_prompt_shares_early_fingerprints() -> None:
    system = "You are a careful research agent. " * 60  # about 2 KiB
    a = prefix_fingerprints(chat_body(system, "question one " * 400))
    b = prefix_fingerprints(chat_body(system, "another question " * 400))
    other = prefix_fingerprints(chat_body("You are a poet. " * 120, "question one " * 400))
    assert a[:2] == b[:2] and a[2:] != b[2:]  # 256 B and 1 KiB cuts fall in the system prompt
    assert not set(a) & set(other)
    # Every byte counts, not just samples.
    body = bytearray(b"z" * 70_000)
    before = prefix_fingerprints(bytes(body))
    body[30_000] = ord("q")
    after = prefix_fingerprints(bytes(body))
    assert before[:4] == after[:4] and before[4] != after[4]


def test_fingerprints_are_cheap(monkeypatch: pytest.MonkeyPatch) -> None:
    """One pass over at most 64 KiB, whatever the body's size: the bytes hashed are
    counted (no clock), and the time is this thread's CPU time, the best of five batches
    (a machine busy with other work preempts the thread; it does not make it slower)."""
    import zlib

    from agentrt.scheduling import _routing

    hashed = 0

    class Counting:
        @staticmethod
        def crc32(data: memoryview, value: int = 0) -> int:
            nonlocal hashed
            hashed += len(data)
            return zlib.crc32(data, value)

    body = os.urandom(1024 * 1024)
    with monkeypatch.context() as patch:
        patch.setattr(_routing, "zlib", Counting)
        assert len(prefix_fingerprints(body)) == len(PREFIX_CUTS)
    assert hashed == PREFIX_CUTS[-1]  # every byte up to the last cut once, none beyond
    body = body[: 64 * 1024 + 1]
    runs = 300
    best = math.inf
    for _ in range(5):
        t0 = time.thread_time()
        for _ in range(runs):
            prefix_fingerprints(body)
        best = min(best, (time.thread_time() - t0) / runs)
    assert best < 200e-6  # about 10 µs here; a loose bound against a slow regression


# ---------------------------------------------------------------- round robin / least loaded


def test_round_robin_cycles_and_skips_avoided_and_unhealthy() -> None:
    seq = [RoundRobin().choose(idle(3), key(), ()) for _ in range(30)]
    assert len(set(seq)) > 1  # each from a random start
    rr = RoundRobin(start=0)
    loads = idle(3)
    assert [rr.choose(loads, key(), ()) for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    loads[1].healthy = False
    assert [rr.choose(loads, key(), ()) for _ in range(4)] == [0, 2, 0, 2]
    assert [rr.choose(loads, key(), {0}) for _ in range(2)] == [2, 2]
    assert rr.choose(loads, key(), {0, 1, 2}) in {0, 2}  # all avoided: healthy ones
    rr.served(0, key())


def test_least_loaded_orders_by_tokens_then_calls_weighted() -> None:
    ll = LeastLoaded()
    loads = [
        EndpointLoad(in_flight=1, outstanding_tokens=5000),
        EndpointLoad(in_flight=9, outstanding_tokens=100),
        EndpointLoad(in_flight=2, outstanding_tokens=100),
    ]
    assert ll.choose(loads, key(), ()) == 2  # fewest tokens, then fewest calls
    assert ll.choose(loads, key(), {2}) == 1
    loads[0].weight = 100.0  # 50 tokens per unit of weight
    assert ll.choose(loads, key(), ()) == 0
    # Without token estimates it is least calls in flight, weighted.
    loads = [EndpointLoad(in_flight=3), EndpointLoad(in_flight=2), EndpointLoad(weight=4.0)]
    loads[2].in_flight = 6  # (6 + 1) / 4 < 2 + 1
    assert ll.choose(loads, key(), ()) == 2
    loads[2].healthy = False
    assert ll.choose(loads, key(), ()) == 1
    # Ties go to fewer pinned sessions, then at random.
    loads = [EndpointLoad(sessions=2), EndpointLoad(sessions=1), EndpointLoad(sessions=1)]
    assert {ll.choose(loads, key(), ()) for _ in range(64)} == {1, 2}


def test_least_loaded_counts_polled_engine_queue() -> None:
    loads = [EndpointLoad(in_flight=1, running=8, waiting=4), EndpointLoad(in_flight=2)]
    assert LeastLoaded().choose(loads, key(), ()) == 1
    assert load_score(loads[0]) == DEFAULT_CALL_COST_TOKENS * 12


# ---------------------------------------------------------------- session affinity


def test_session_stays_home_until_overloaded() -> None:
    router = SessionAffinity()
    loads = idle(4)
    loads[1].in_flight = 1  # one call's worth is never overloaded
    assert router.choose(loads, key(home=1), ()) == 1
    loads[1].in_flight = 3  # mean 0.75 calls, 2 x mean = 1.5 < 3
    assert router.overloaded(loads, 1)
    assert router.choose(loads, key(home=1), ()) in {0, 2, 3}  # the idle ones, at random
    for other in (0, 2, 3):
        loads[other].in_flight = 2  # mean 2.25, 2 x mean = 4.5 >= 3
    assert router.choose(loads, key(home=1), ()) == 1
    assert SessionAffinity(overload=1.2).choose(loads, key(home=1), ()) in {0, 2, 3}


def test_a_polled_home_with_few_requests_is_never_overloaded() -> None:
    """With the engines' metrics (the fleet's view) a home that runs and queues at most
    ENGINE_FLOOR_CALLS requests keeps its sessions, however that compares with the mean:
    far below any engine's batch, a move costs the cache and saves nothing. Above the
    floor, the load rule applies."""
    router = SessionAffinity()
    loads = [EndpointLoad(running=0, waiting=0) for _ in range(4)]
    loads[1].running, loads[1].waiting = 1, 1  # a request caught between engine steps
    assert not router.overloaded(loads, 1)  # 2 calls against a mean of 0.5
    loads[1].running, loads[1].waiting = ENGINE_FLOOR_CALLS - 2, 2
    assert not router.overloaded(loads, 1)
    assert router.choose(loads, key(home=1), ()) == 1
    loads[1].waiting = 3
    assert router.overloaded(loads, 1)
    assert router.choose(loads, key(home=1), ()) in {0, 2, 3}
    assert router.moves == {"overload": 1}
    # Without metrics (this process's own calls only) the load rule alone decides.
    local = idle(4)
    local[1].in_flight = 3
    assert router.overloaded(local, 1)


def test_session_leaves_unhealthy_or_avoided_home() -> None:
    router = SessionAffinity()
    loads = idle(3)
    assert router.choose(loads, key(home=2), {2}) in {0, 1}
    loads[2].healthy = False
    assert router.choose(loads, key(home=2), ()) in {0, 1}
    loads[0].healthy = loads[1].healthy = False
    assert router.choose(loads, key(home=2), ()) == 2  # all unhealthy: stay put


def test_first_turn_follows_the_longest_known_prefix() -> None:
    router = SessionAffinity()
    loads = idle(3)
    system = "You are agent Smith. " * 100
    first = RouteKey("a", None, True, prefix_fingerprints(chat_body(system, "hi " * 600)))
    assert router.choose(loads, first, ()) in {0, 1, 2}  # nothing known: idle ones tie
    router.served(2, first)  # say the runtime sent it to 2 after all
    assert router.prefix_entries == len(first.prefix)
    sibling = RouteKey("b", None, True, prefix_fingerprints(chat_body(system, "yo " * 600)))
    assert router.choose(loads, sibling, ()) == 2
    # A stranger's prompt shares nothing: least loaded.
    loads[0].in_flight = 1
    stranger = RouteKey("c", None, True, prefix_fingerprints(chat_body("Be brief. " * 50, "?")))
    assert router.choose(loads, stranger, ()) in {1, 2}
    # The holder is overloaded or avoided: least loaded instead.
    loads[0].in_flight = 0
    loads[2].in_flight = 5
    assert router.choose(loads, sibling, ()) in {0, 1}
    loads[2].in_flight = 0
    assert router.choose(loads, sibling, {2}) in {0, 1}


def test_a_deeper_prefix_holder_wins_over_a_shallower_one() -> None:
    router = SessionAffinity()
    loads = idle(3)
    shallow = RouteKey("a", None, True, (11, 22))
    deep = RouteKey("b", None, True, (11, 22, 33))
    router.served(0, deep)
    router.served(1, shallow)  # 11 and 22 now point at 1, 33 still at 0
    assert router.choose(loads, RouteKey("c", None, True, (11, 22, 33, 44)), ()) == 0
    assert router.choose(loads, RouteKey("d", None, True, (11, 22, 99)), ()) == 1


def test_prefix_index_is_lru_bounded() -> None:
    router = SessionAffinity(prefix_capacity=3)
    router.served(0, RouteKey("a", None, True, (1, 2)))
    router.served(1, RouteKey("b", None, True, (3,)))
    router.served(2, RouteKey("c", None, True, (1, 4)))  # 2 is least recently used
    assert router.prefix_entries == 3
    loads = idle(3)
    assert router.choose(loads, RouteKey("x", None, True, (2,)), ()) in {0, 1, 2}  # forgotten
    assert router.choose(loads, RouteKey("x", None, True, (3,)), ()) == 1
    assert router.choose(loads, RouteKey("x", None, True, (1,)), ()) == 2
    off = SessionAffinity(prefix_capacity=0)
    off.served(1, RouteKey("a", None, True, (1, 2)))
    assert off.prefix_entries == 0


def test_session_affinity_validates_options() -> None:
    with pytest.raises(ValueError, match="overload"):
        SessionAffinity(overload=0.5)
    with pytest.raises(ValueError, match="call_cost"):
        SessionAffinity(call_cost=0)
    with pytest.raises(ValueError, match="prefix_capacity"):
        SessionAffinity(prefix_capacity=-1)


# ---------------------------------------------------------------- hash


def test_hash_is_deterministic_and_spreads_sessions() -> None:
    router = HashAffinity()
    loads = idle(4)
    picks = [router.choose(loads, key(f"s{i}"), ()) for i in range(2000)]
    assert picks == [HashAffinity().choose(loads, key(f"s{i}"), ()) for i in range(2000)]
    counts = [picks.count(i) for i in range(4)]
    assert all(400 < c < 600 for c in counts), counts


def test_hash_with_names_moves_only_a_share_when_an_endpoint_joins() -> None:
    names = [f"http://r{i}.test/v1" for i in range(4)]
    before = HashAffinity(endpoints=names)
    after = HashAffinity(endpoints=[*names, "http://r4.test/v1"])
    sessions = [f"sess-{i}" for i in range(2000)]
    a = [names[before.choose(idle(4), key(s), ())] for s in sessions]
    b = [[*names, "http://r4.test/v1"][after.choose(idle(5), key(s), ())] for s in sessions]
    moved = [(x, y) for x, y in zip(a, b, strict=True) if x != y]
    assert all(y == "http://r4.test/v1" for _, y in moved)  # only to the newcomer
    assert 300 < len(moved) < 500  # about 1/5


def test_hash_weights_and_caps() -> None:
    router = HashAffinity()
    loads = [EndpointLoad(weight=3.0), EndpointLoad(weight=1.0)]
    picks = [router.choose(loads, key(f"w{i}"), ()) for i in range(2000)]
    assert 1350 < picks.count(0) < 1650  # about 3/4
    # A session's replica at its cap sends it to the next in its ranking.
    sid = "pinned"
    loads = [EndpointLoad(in_flight=1) for _ in range(3)]
    first = router.choose(loads, key(sid), ())
    loads[first].in_flight = 2  # cap = ceil(1.25 * (4 + 1) / 3) = 3
    assert router.choose(loads, key(sid), ()) == first
    loads[first].in_flight = 3  # cap = ceil(1.25 * (5 + 1) / 3) = 3
    assert router.choose(loads, key(sid), ()) != first


def test_hash_validates_options() -> None:
    with pytest.raises(ValueError, match="balance"):
        HashAffinity(balance=0.9)
    with pytest.raises(ValueError, match="distinct"):
        HashAffinity(endpoints=["a", "a"])
    with pytest.raises(ValueError, match="knows 2 endpoints"):
        HashAffinity(endpoints=["a", "b"]).choose(idle(3), key(), ())


def test_hash_agrees_across_processes() -> None:
    """Another interpreter (another hash seed) puts the same sessions on the same replicas."""
    names = ["http://a.test/v1", "http://b.test/v1", "http://c.test/v1"]
    code = (
        "from agentrt.scheduling import HashAffinity, EndpointLoad, RouteKey\n"
        f"r = HashAffinity(endpoints={names!r})\n"
        "loads = [EndpointLoad(in_flight=k) for k in (0, 1, 2)]\n"
        "print(','.join(str(r.choose(loads, RouteKey(f'x{i}', None, True), ())) "
        "for i in range(60)))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout.strip()
    router = HashAffinity(endpoints=names)
    loads = [EndpointLoad(in_flight=k) for k in (0, 1, 2)]
    mine = [router.choose(loads, key(f"x{i}"), ()) for i in range(60)]
    assert out == ",".join(map(str, mine))


# ---------------------------------------------------------------- make_router


def test_make_router_names_aliases_and_options() -> None:
    assert isinstance(make_router("round_robin"), RoundRobin)
    assert isinstance(make_router("round-robin"), RoundRobin)
    assert isinstance(make_router("least_loaded"), LeastLoaded)
    assert isinstance(make_router("session"), SessionAffinity)
    router = make_router("session_affinity", overload=3.0)
    assert isinstance(router, SessionAffinity) and router.overload == 3.0
    hashed = make_router("hash", endpoints=["a", "b"], balance=1.5)
    assert isinstance(hashed, HashAffinity) and hashed.balance == 1.5
    mine = RoundRobin()
    assert make_router(mine) is mine
    assert {make_router(n).name for n in ("round_robin", "least_loaded", "session", "hash")} == {
        "round_robin",
        "least_loaded",
        "session_affinity",
        "hash",
    }


def test_make_router_rejects_bad_names_listing_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown routing 'nope'") as info:
        make_router("nope")
    for name in ("round_robin", "least_loaded", "session_affinity", "hash", "session"):
        assert repr(name) in str(info.value)
    with pytest.raises(ValueError, match="by name"):
        make_router(RoundRobin(), overload=2.0)
    with pytest.raises(TypeError):
        make_router("round_robin", overload=2.0)


def test_routers_satisfy_the_protocol() -> None:
    routers: list[Router] = [RoundRobin(), LeastLoaded(), SessionAffinity(), HashAffinity()]
    for router in routers:
        assert router.choose(idle(1), key(), ()) == 0
        router.served(0, key())


# ---------------------------------------------------------------- properties


@settings(deadline=None, max_examples=300)
@given(
    data=situations(),
    home_seed=st.integers(0, 100),
    overload=st.sampled_from([1.0, 1.5, 2.0, 3.0]),
    learned=st.lists(st.tuples(st.integers(0, 6), st.lists(st.integers(0, 5), max_size=3))),
    prefix=st.lists(st.integers(0, 5), max_size=4),
)
def test_session_stays_home_exactly_when_the_rule_says(
    data: tuple[list[EndpointLoad], set[int]],
    home_seed: int,
    overload: float,
    learned: list[tuple[int, list[int]]],
    prefix: list[int],
) -> None:
    loads, avoid = data
    n = len(loads)
    home = home_seed % n
    router = SessionAffinity(overload=overload)
    for index, fps in learned:  # whatever the prefix index holds must not matter
        router.served(index % n, RouteKey("other", None, True, tuple(fps)))
    choice = router.choose(loads, RouteKey("s", home, False, tuple(prefix)), avoid)

    pool = allowed(loads, avoid)
    assert choice in pool
    healthy = [score(x) for x in loads if x.healthy] or [score(x) for x in loads]
    threshold = max(overload * math.fsum(healthy) / len(healthy), DEFAULT_CALL_COST_TOKENS)
    # A polled engine with few requests is never overloaded: far below its batch.
    h = loads[home]
    calm = h.view == "engine" and max(h.in_flight, (h.running or 0) + (h.waiting or 0)) <= 8
    stays = home in pool and (calm or score(loads[home]) <= threshold)
    if stays:
        assert choice == home
    elif len(pool) > 1:
        assert choice != home


@settings(deadline=None, max_examples=40)
@given(
    n=st.integers(2, 5),
    turns=st.lists(
        st.tuples(st.integers(0, 4), st.integers(-3, 3), st.booleans(), st.booleans()),
        min_size=1,
        max_size=25,
    ),
)
def test_a_session_across_turns(n: int, turns: list[tuple[int, int, bool, bool]]) -> None:
    """A session's turns move only when the guard fires or its home becomes unusable."""
    router = SessionAffinity()
    loads = idle(n)
    home: int | None = None
    for target, delta, sick, avoid_home in turns:
        loads[target % n].in_flight = max(0, loads[target % n].in_flight + delta)
        if sick:
            loads[target % n].healthy = not loads[target % n].healthy
        avoid = {home} if avoid_home and home is not None else set()
        rk = RouteKey("s", home, home is None)
        choice = router.choose(loads, rk, avoid)
        if home is not None and choice != home:
            usable = home in allowed(loads, avoid)
            assert not usable or router.overloaded(loads, home)
        router.served(choice, rk)
        home = choice


@settings(deadline=None, max_examples=60)
@given(
    n=st.integers(1, 6),
    balance=st.sampled_from([1.0, 1.1, 1.25, 2.0]),
    sick=st.sets(st.integers(0, 5)),
    seed=st.integers(0, 2**32),
)
def test_bounded_load_hashing_respects_its_cap(
    n: int, balance: float, sick: set[int], seed: int
) -> None:
    rng = random.Random(seed)
    router = HashAffinity(balance=balance)
    loads = idle(n)
    for i in sick & set(range(n)):
        loads[i].healthy = False
    in_flight: list[int] = []
    for step in range(200):
        if in_flight and rng.random() < 0.45:
            loads[in_flight.pop(rng.randrange(len(in_flight)))].in_flight -= 1
            continue
        pool = allowed(loads, ())
        total = sum(loads[i].in_flight for i in pool)
        cap = math.ceil(balance * (total + 1) / len(pool))
        choice = router.choose(loads, key(f"s{rng.randrange(30)}-{step % 3}"), ())
        assert choice in pool
        assert loads[choice].in_flight < cap
        loads[choice].in_flight += 1
        in_flight.append(choice)


@settings(deadline=None, max_examples=100)
@given(data=situations(), sessions=st.lists(st.text(max_size=12), min_size=1, max_size=5))
def test_independent_hash_routers_agree(
    data: tuple[list[EndpointLoad], set[int]], sessions: list[str]
) -> None:
    loads, avoid = data
    names = [f"http://replica-{i}.test/v1" for i in range(len(loads))]
    one, two = HashAffinity(endpoints=names), HashAffinity(endpoints=names)
    for sid in sessions:
        assert one.choose(loads, key(sid), avoid) == two.choose(loads, key(sid), avoid)
    # Listed in another order (with the loads in that order), the same replica by name.
    order = list(range(len(loads)))[::-1]
    three = HashAffinity(endpoints=[names[i] for i in order])
    shuffled = [loads[i] for i in order]
    moved_avoid = {order.index(i) for i in avoid}
    for sid in sessions:
        a = one.choose(loads, key(sid), avoid)
        b = three.choose(shuffled, key(sid), moved_avoid)
        assert names[a] == names[order[b]]


@settings(deadline=None, max_examples=200)
@given(
    data=situations(),
    which=st.sampled_from(["round_robin", "least_loaded", "session_affinity", "hash"]),
    warmup=st.integers(0, 7),
    home=st.none() | st.integers(0, 6),
    prefix=st.lists(st.integers(0, 3), max_size=3),
)
def test_routers_avoid_avoided_and_unhealthy_replicas(
    data: tuple[list[EndpointLoad], set[int]],
    which: str,
    warmup: int,
    home: int | None,
    prefix: list[int],
) -> None:
    loads, avoid = data
    n = len(loads)
    router = make_router(which)
    for w in range(warmup):
        router.served(w % n, RouteKey("w", None, True, tuple(prefix)))
        router.choose(idle(n), key(f"w{w}"), ())
    rk = RouteKey("s", None if home is None else home % n, home is None, tuple(prefix), 10)
    for _ in range(3):
        assert router.choose(loads, rk, avoid) in allowed(loads, avoid)


@settings(deadline=None, max_examples=60)
@given(
    capacity=st.integers(0, 20),
    batches=st.lists(st.lists(st.integers(0, 60), max_size=6), max_size=40),
)
def test_prefix_index_stays_bounded(capacity: int, batches: list[list[int]]) -> None:
    router = SessionAffinity(prefix_capacity=capacity)
    for i, fps in enumerate(batches):
        router.served(i % 3, RouteKey("s", None, True, tuple(fps)))
        assert router.prefix_entries <= capacity
        if 0 < len(set(fps)) <= capacity:  # the newest are kept
            last = fps[-1]
            assert router.choose(idle(3), RouteKey("q", None, True, (last,)), ()) == i % 3
