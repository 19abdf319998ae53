"""Ordering policies and concurrency limits, on a simulated clock (``now`` passed in)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrt.scheduling import (
    ATLAS,
    DEFAULT_LEVELS_S,
    EDF,
    FCFS,
    MLFQ,
    PLAS,
    AIMDLimit,
    FixedLimit,
    GradientLimit,
    Limit,
    Policy,
    Ticket,
    make_limit,
    make_policy,
)

_ids = itertools.count()


def ticket(
    job: str = "j",
    *,
    program: str | None = None,
    session: str | None = None,
    parent: str | None = None,
    tokens: int = 100,
    deadline: float | None = None,
) -> Ticket:
    return Ticket(
        call_id=f"c{next(_ids)}",
        job_id=job,
        program_id=program or job,
        session_id=session or f"{job}/s",
        parent_session_id=parent,
        tokens=tokens,
        deadline_at=deadline,
    )


def drain(policy: Policy, now: float = 0.0) -> list[Ticket]:
    out = []
    while (t := policy.pop(now)) is not None:
        out.append(t)
    return out


ALL: dict[str, type[Policy]] = {
    "fcfs": FCFS,
    "plas": PLAS,
    "atlas": ATLAS,
    "mlfq": MLFQ,
    "edf": EDF,
}


# --- make_policy ---------------------------------------------------------------------


def test_make_policy_by_name() -> None:
    for name, cls in ALL.items():
        p = make_policy(name)
        assert isinstance(p, cls)
        assert p.name == name
        assert make_policy(name) is not p  # fresh state per endpoint
    assert isinstance(make_policy(" PLAS "), PLAS)


def test_make_policy_passes_a_policy_through() -> None:
    p = PLAS(starvation_ratio=None)
    assert make_policy(p) is p


def test_make_policy_error_names_the_choices() -> None:
    with pytest.raises(ValueError, match=r"'lifo'.*atlas, edf, fcfs, mlfq, plas"):
        make_policy("lifo")


@pytest.mark.parametrize(
    "factory",
    [
        lambda: PLAS(levels=(4.0, 1.0)),
        lambda: PLAS(starvation_ratio=0),
        lambda: ATLAS(service_floor_s=0),
        lambda: MLFQ(levels=0),
        lambda: MLFQ(base_quota_tokens=0),
        lambda: MLFQ(max_wait_s=-1),
    ],
)
def test_bad_parameters(factory: Callable[[], Policy]) -> None:
    with pytest.raises(ValueError):
        factory()


# --- common queue behaviour -----------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_push_pop_remove_len(name: str) -> None:
    p = make_policy(name)
    ts = [ticket(f"j{i}") for i in range(5)]
    for i, t in enumerate(ts):
        p.push(t, float(i))
        assert t.enqueued_at == float(i)
    assert len(p) == 5
    assert p.remove(ts[2])
    assert not p.remove(ts[2])
    assert len(p) == 4
    with pytest.raises(ValueError, match="already queued"):
        p.push(ts[0], 9.0)
    out = drain(p, 5.0)
    assert set(out) == set(ts) - {ts[2]}
    assert len(p) == 0
    assert p.pop(6.0) is None
    assert not p.remove(ts[0])
    # A popped or removed ticket may be queued again.
    p.push(ts[2], 7.0)
    assert p.pop(7.0) is ts[2]


@pytest.mark.parametrize("name", ALL)
def test_lazy_deletion_is_swept(name: str) -> None:
    p = make_policy(name)
    keep = ticket("keep", tokens=1)
    p.push(keep, 0.0)
    for i in range(5000):
        t = ticket(f"j{i}", tokens=i)
        p.push(t, 1.0)
        assert p.remove(t)
    assert len(p) == 1
    # Dead entries never outnumber live ones by more than a constant.
    raw = sum(len(getattr(p, a)) for a in ("_q", "_heap", "_rest", "_fifo") if hasattr(p, a))
    for attr in ("_queues",):
        raw += sum(len(q) for q in getattr(p, attr, []))
    raw += sum(len(q) for level in getattr(p, "_classes", []) for q in level)
    assert raw < 300
    assert drain(p, 2.0) == [keep]


def test_fcfs_order() -> None:
    p = FCFS()
    ts = [ticket(f"j{i}", tokens=1000 - i) for i in range(10)]
    for t in ts:
        assert p.classify(t, 0.0) == 0
        p.push(t, 0.0)
    assert drain(p) == ts


# --- PLAS -----------------------------------------------------------------------------


def test_plas_least_attained_program_first_fcfs_inside_a_level() -> None:
    p = PLAS(starvation_ratio=None)
    heavy, light = ticket("heavy"), ticket("light")
    p.classify(heavy, 0.0)
    p.on_call_end(heavy, service_s=20.0, tokens=500)  # level 3 of DEFAULT_LEVELS_S
    p.on_call_end(ticket("mid"), service_s=2.0, tokens=50)  # level 1
    order = [ticket("heavy"), ticket("mid"), ticket("light"), ticket("mid"), ticket("new")]
    for t in order:
        p.push(t, 0.0)
    assert [t.priority for t in order] == [3, 1, 0, 1, 0]
    assert drain(p) == [order[2], order[4], order[1], order[3], order[0]]
    assert light.priority == 0


def test_plas_priority_is_per_program() -> None:
    p = PLAS()
    a = ticket("job-a", program="prog")
    p.on_call_end(a, service_s=5.0, tokens=10)
    b = ticket("job-b", program="prog")
    assert p.classify(b, 0.0) == 2  # the sibling job shares the program's service


def test_plas_anti_starvation_promotes_the_oldest_starving_head() -> None:
    p = PLAS(starvation_ratio=2.0, service_floor_s=1.0)
    p.on_call_end(ticket("heavy"), service_s=10.0, tokens=0)  # level 2
    old = ticket("heavy")
    p.push(old, 0.0)
    fresh = [ticket(f"new{i}") for i in range(3)]
    for i, t in enumerate(fresh):
        p.push(t, 1.0 + i)
    assert p.pop(5.0) is fresh[0]  # wait 5 < 2 * 10: not starving yet
    # new1 (wait 19 >= 2 * floor) starves too, but `old` is older: it goes first.
    assert p.pop(20.0) is old
    assert p.pop(20.0) is fresh[1]


def test_plas_starvation_off() -> None:
    p = PLAS(starvation_ratio=None)
    p.on_call_end(ticket("heavy"), service_s=1000.0, tokens=0)
    old = ticket("heavy")
    p.push(old, 0.0)
    p.push(ticket("new"), 1e9)
    assert p.pop(1e9) is not old


def test_plas_state_lives_while_the_program_has_jobs() -> None:
    p = PLAS()
    for job in ("j1", "j2"):
        t = ticket(job, program="prog")
        p.classify(t, 0.0)
        p.on_call_end(t, service_s=3.0, tokens=10)
    p.on_job_end("j1", "prog")
    assert p.classify(ticket("j2", program="prog"), 0.0) == 2  # 6 s: still known
    p.on_job_end("j2", "prog")
    assert p.known_programs() == 0
    p.on_job_end("never-seen", "prog")  # harmless


# --- ATLAS ----------------------------------------------------------------------------


def test_atlas_critical_path_inherits_from_the_parent_at_spawn() -> None:
    p = ATLAS(starvation_ratio=None)
    root = ticket("j", session="root")
    p.classify(root, 0.0)
    p.on_call_end(root, service_s=2.0, tokens=0)
    child = ticket("j", session="child", parent="root")
    p.classify(child, 0.0)
    p.on_call_end(root, service_s=5.0, tokens=0)  # after the spawn: not inherited
    p.on_call_end(child, service_s=1.0, tokens=0)
    assert p.critical_path("root") == 7.0
    assert p.critical_path("child") == 3.0
    grandchild = ticket("j", session="gc", parent="child")
    p.on_call_end(grandchild, service_s=0.5, tokens=0)
    assert p.critical_path("gc") == 3.5
    assert p.critical_path("unknown") == 0.0
    # The program's priority is its longest critical path (7 s: level 2), not the sum.
    assert p.classify(ticket("j", session="child"), 0.0) == 2


def test_atlas_does_not_penalise_width() -> None:
    plas, atlas = PLAS(starvation_ratio=None), ATLAS(starvation_ratio=None)
    for pol in (plas, atlas):
        for i in range(8):  # 8 parallel sub-agents of 0.9 s each
            t = ticket("wide", session=f"sub{i}", parent="root")
            pol.classify(t, 0.0)
            pol.on_call_end(t, service_s=0.9, tokens=0)
    assert plas.classify(ticket("wide"), 0.0) == 2  # 7.2 s attained
    assert atlas.classify(ticket("wide"), 0.0) == 0  # 0.9 s along any path


def test_atlas_forgets_sessions_at_job_end() -> None:
    p = ATLAS()
    for i in range(100):
        t = ticket("j", session=f"s{i}", parent=f"s{i - 1}" if i else None)
        p.classify(t, 0.0)
        p.on_call_end(t, service_s=0.1, tokens=0)
    assert p.critical_path("s99") == pytest.approx(10.0)
    p.on_job_end("j", "j")
    assert p.critical_path("s99") == 0.0
    assert p.known_programs() == 0
    assert not p._sessions and not p._job_sessions


# --- MLFQ -----------------------------------------------------------------------------


def test_mlfq_demotes_a_job_that_burns_its_quota() -> None:
    p = MLFQ(base_quota_tokens=100)
    t = ticket("j")
    assert p.classify(t, 0.0) == 0
    p.on_call_end(t, 0.1, tokens=99)
    assert p.level_of("j") == 0
    p.on_call_end(t, 0.1, tokens=1)  # 100 >= quota(0)
    assert p.level_of("j") == 1
    p.on_call_end(t, 0.1, tokens=700)  # 200 at level 1, then 400 at level 2, 100 left
    assert p.level_of("j") == 3
    p.on_call_end(t, 0.1, tokens=10**9)
    assert p.level_of("j") == 7  # the last level
    assert p.classify(ticket("j"), 0.0) == 7


def demoted_mlfq(io_ratio: float = 1.0) -> MLFQ:
    """An MLFQ whose job "j" sits at level 2 after a call of 1 s of service."""
    p = MLFQ(base_quota_tokens=100, io_ratio=io_ratio)
    p.on_call_end(ticket("j"), 1.0, tokens=350)
    assert p.level_of("j") == 2
    return p


def test_mlfq_a_declared_long_wait_promotes() -> None:
    p = demoted_mlfq()
    p.on_tool("j", "j/s", 5.0)  # 5 s >= 1 x 1 s of service: I/O-bound
    assert p.level_of("j") == 1
    p.on_tool_end("j", "j/s", 5.0)  # already classified: once per call
    assert p.level_of("j") == 1


def test_mlfq_a_declared_tiny_wait_does_not_promote() -> None:
    p = demoted_mlfq()
    p.on_tool("j", "j/s", 0.01)  # far shorter than the call's service: CPU-bound
    p.on_tool_end("j", "j/s", 30.0)  # classified at the start: the observation is not used
    assert p.level_of("j") == 2


def test_mlfq_one_promotion_per_call() -> None:
    p = demoted_mlfq()
    for _ in range(3):  # three parallel tools of one reply
        p.on_tool("j", "j/s", 60.0)
    assert p.level_of("j") == 1
    p.on_call_end(ticket("j"), 1.0, tokens=10)
    p.on_tool("j", "j/s", 60.0)
    assert p.level_of("j") == 0
    p.on_call_end(ticket("j"), 1.0, tokens=10)
    p.on_tool("j", "j/s", 60.0)  # level 0 is the top
    assert p.level_of("j") == 0


def test_mlfq_without_an_expectation_the_observed_wait_decides() -> None:
    p = demoted_mlfq()
    p.on_tool("j", "j/s", None)
    assert p.level_of("j") == 2  # not decided yet
    p.on_tool_end("j", "j/s", 0.2)  # short: not promoted
    assert p.level_of("j") == 2
    p.on_call_end(ticket("j"), 1.0, tokens=10)
    p.on_tool("j", "j/s", None)
    p.on_tool_end("j", "j/s", 3.0)
    assert p.level_of("j") == 1


def test_mlfq_the_calls_idle_expected_stands_in_for_an_undeclared_wait() -> None:
    p = MLFQ(base_quota_tokens=100)
    t = ticket("j")
    t.idle_expected_s = 8.0  # what the transport sets: the idle expected after the call
    p.on_call_end(t, 2.0, tokens=350)
    p.on_tool("j", "j/s", None)
    assert p.level_of("j") == 1
    t2 = ticket("j")
    t2.idle_expected_s = 0.5
    p.on_call_end(t2, 2.0, tokens=10)
    p.on_tool("j", "j/s", None)
    assert p.level_of("j") == 1
    p.on_tool("j", "j/s", 9.0)  # already classified by the call's expectation
    assert p.level_of("j") == 1


def test_mlfq_io_ratio_scales_the_rule() -> None:
    p = demoted_mlfq(io_ratio=10.0)
    p.on_tool("j", "j/s", 5.0)  # 5 s < 10 x 1 s
    assert p.level_of("j") == 2
    p.on_call_end(ticket("j"), 1.0, tokens=10)
    p.on_tool("j", "j/s", 10.0)
    assert p.level_of("j") == 1
    with pytest.raises(ValueError, match="io_ratio"):
        MLFQ(io_ratio=0.0)


def test_mlfq_tool_feedback_for_unknown_jobs_creates_no_state() -> None:
    p = MLFQ()
    p.on_tool("unknown", "s", 5.0)
    p.on_tool_end("unknown", "s", 5.0)
    assert p.level_of("unknown") == 0
    assert not p._jobs


def test_mlfq_levels_first_then_highest_response_ratio() -> None:
    p = MLFQ(base_quota_tokens=100, max_wait_s=None)
    p.on_call_end(ticket("low"), 0.1, tokens=100)  # level 1
    low = ticket("low", tokens=1)
    p.push(low, 0.0)
    big_old = ticket("a", tokens=1000)
    small_new = ticket("b", tokens=10)
    small_newer = ticket("c", tokens=10)
    p.push(big_old, 0.0)
    p.push(small_new, 5.0)
    p.push(small_newer, 5.5)
    # At t=6: ratios wait/tokens: big 6/1000, small 1/10, newer 0.5/10.
    assert p.pop(6.0) is small_new
    # At t=100: big 100/1000 = 0.1 < newer 94.5/10.
    assert p.pop(100.0) is small_newer
    assert p.pop(100.0) is big_old
    assert p.pop(100.0) is low


def test_mlfq_response_ratio_ages_a_large_call() -> None:
    p = MLFQ(max_wait_s=None)
    big = ticket("a", tokens=1000)
    p.push(big, 0.0)
    # A fresh small call (waited 0.5 s, 10 tokens: ratio 0.05) beats the big one while
    # the big one's ratio wait / 1000 is lower, i.e. until it has waited 50 s.
    p.push(ticket("b", tokens=10), 9.5)
    assert p.pop(10.0) is not big
    p.push(ticket("c", tokens=10), 59.5)
    assert p.pop(60.0) is big


def test_mlfq_aging_across_levels() -> None:
    p = MLFQ(base_quota_tokens=10, max_wait_s=30.0)
    p.on_call_end(ticket("hog"), 1.0, tokens=10**6)
    hog = ticket("hog")
    p.push(hog, 0.0)
    for i in range(5):
        p.push(ticket(f"n{i}"), 10.0 + i)
    assert p.pop(29.0) is not hog
    assert p.pop(30.0) is hog


def test_mlfq_forgets_jobs() -> None:
    p = MLFQ()
    for i in range(100):
        p.on_call_end(ticket(f"j{i}"), 0.1, tokens=10)
    for i in range(100):
        p.on_job_end(f"j{i}", f"j{i}")
    assert not p._jobs


# --- EDF ------------------------------------------------------------------------------


def test_edf_order() -> None:
    p = EDF()
    none1, d30, d10, none2, d10b = (
        ticket(deadline=None),
        ticket(deadline=30.0),
        ticket(deadline=10.0),
        ticket(deadline=None),
        ticket(deadline=10.0),
    )
    for t in (none1, d30, d10, none2, d10b):
        p.push(t, 0.0)
    assert [t.priority for t in (none1, d30)] == [1, 0]
    assert drain(p) == [d10, d10b, d30, none1, none2]


# --- properties -----------------------------------------------------------------------

_ops = st.lists(
    st.tuples(
        st.sampled_from(["push", "push", "pop", "remove"]),
        st.integers(0, 7),  # job
        st.integers(0, 5000),  # tokens
        st.one_of(st.none(), st.floats(0, 100)),  # deadline
    ),
    max_size=60,
)


@settings(deadline=None, max_examples=40)
@given(name=st.sampled_from(sorted(ALL)), ops=_ops, services=st.lists(st.floats(0, 300)))
def test_every_ticket_leaves_exactly_once(
    name: str, ops: list[tuple[str, int, int, float | None]], services: list[float]
) -> None:
    p = make_policy(name)
    queued: list[Ticket] = []
    left: dict[int, Ticket] = {}  # by id, holding the tickets so ids are not reused
    now = 0.0
    for i, (op, job, tokens, deadline) in enumerate(ops):
        now += 0.5
        if op == "push":
            t = ticket(f"j{job}", tokens=tokens, deadline=deadline)
            if services:
                p.on_call_end(t, services[i % len(services)], tokens)
            p.push(t, now)
            queued.append(t)
        elif op == "pop":
            got = p.pop(now)
            assert (got is None) == (not queued)
            if got is not None:
                assert id(got) not in left
                queued.remove(got)
                left[id(got)] = got
        elif queued:
            victim = queued.pop(job % len(queued))
            assert p.remove(victim)
            left[id(victim)] = victim
        assert len(p) == len(queued)
    rest = drain(p, now)
    assert sorted(map(id, rest)) == sorted(map(id, queued))


@settings(deadline=None, max_examples=40)
@given(ops=_ops)
def test_order_matches_a_reference_model(ops: list[tuple[str, int, int, float | None]]) -> None:
    # Without anti-starvation, PLAS pops the minimum (level, arrival); EDF the minimum
    # (no deadline, deadline, arrival); FCFS the minimum arrival.
    plas, edf, fcfs = PLAS(starvation_ratio=None), EDF(), FCFS()
    for job in range(8):
        plas.on_call_end(ticket(f"j{job}"), DEFAULT_LEVELS_S[-1] * job / 6, 0)
    models: dict[str, list[tuple[tuple[float, ...], Ticket]]] = {"plas": [], "edf": [], "fcfs": []}
    policies: dict[str, Policy] = {"plas": plas, "edf": edf, "fcfs": fcfs}
    for i, (op, job, tokens, deadline) in enumerate(ops):
        for name, p in policies.items():
            model = models[name]
            if op == "push":
                t = ticket(f"j{job}", tokens=tokens, deadline=deadline)
                p.push(t, float(i))
                key: tuple[float, ...] = {
                    "plas": (t.priority, i),
                    "edf": (deadline is None, deadline or 0.0, i),
                    "fcfs": (i,),
                }[name]
                model.append((key, t))
            elif op == "pop":
                got = p.pop(float(i))
                if not model:
                    assert got is None
                    continue
                best = min(model, key=lambda e: e[0])
                assert got is best[1], name
                model.remove(best)
            elif model:
                victim = model.pop(job % len(model))
                assert p.remove(victim[1])


@settings(deadline=None, max_examples=30)
@given(
    service=st.floats(0, 200),
    ratio=st.floats(0.5, 8),
    arrivals=st.lists(st.integers(1, 3), min_size=1, max_size=50),
    dt=st.floats(0.1, 5),
    atlas=st.booleans(),
)
def test_no_starvation_under_a_stream_of_short_programs(
    service: float, ratio: float, arrivals: list[int], dt: float, atlas: bool
) -> None:
    # A call of a program with attained service S waits at most ratio * max(S, floor)
    # plus one decision interval, however many fresh (level 0) calls keep arriving.
    p: PLAS | ATLAS = ATLAS(starvation_ratio=ratio) if atlas else PLAS(starvation_ratio=ratio)
    p.on_call_end(ticket("old"), service, 0)
    old = ticket("old")
    p.push(old, 0.0)
    bound = ratio * max(service, 1.0) + dt
    now = 0.0
    step = 0
    while True:
        now = step * dt
        for k in range(arrivals[step % len(arrivals)]):
            p.push(ticket(f"new{step}-{k}"), now)
        got = p.pop(now)
        if got is old:
            break
        assert now <= bound, (now, bound)
        step += 1
    assert now <= bound


@settings(deadline=None, max_examples=30)
@given(
    max_wait=st.floats(1, 100),
    arrivals=st.lists(st.integers(1, 3), min_size=1, max_size=50),
    dt=st.floats(0.1, 5),
)
def test_mlfq_aging_bounds_the_wait(max_wait: float, arrivals: list[int], dt: float) -> None:
    p = MLFQ(base_quota_tokens=1, max_wait_s=max_wait)
    p.on_call_end(ticket("hog"), 1.0, tokens=10**9)
    hog = ticket("hog", tokens=10**6)
    p.push(hog, 0.0)
    step = 0
    while True:
        now = step * dt
        for k in range(arrivals[step % len(arrivals)]):
            p.push(ticket(f"n{step}-{k}", tokens=1), now)
        if p.pop(now) is hog:
            break
        step += 1
    assert now <= max_wait + dt


# --- limits ---------------------------------------------------------------------------


def test_fixed_limit_and_make_limit() -> None:
    assert FixedLimit(3).limit == 3
    assert make_limit(None).limit is None
    assert make_limit(8).limit == 8
    assert isinstance(make_limit("auto"), GradientLimit)
    assert isinstance(make_limit("aimd"), AIMDLimit)
    g = GradientLimit()
    assert make_limit(g) is g
    for bad in (0, -1, True):
        with pytest.raises(ValueError):
            make_limit(bad)
    with pytest.raises(ValueError, match="'auto'"):
        make_limit("fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        GradientLimit(initial=4, min_limit=8)


def feed(limit: Limit, per_token_s: float, n: int, tokens: int = 100) -> None:
    for _ in range(n):
        cur = limit.limit or 1
        limit.on_sample(per_token_s * (tokens + 1), tokens, cur, True)


def test_gradient_grows_while_latency_is_steady() -> None:
    g = GradientLimit(initial=16, max_limit=64)
    feed(g, 0.01, 400)
    assert g.limit == 64


def test_gradient_normalises_by_tokens() -> None:
    # Steady time per token, wildly varying lengths: no congestion, the limit grows.
    g = GradientLimit(initial=16, max_limit=64)
    for i in range(400):
        tokens = [1, 2000, 50, 800][i % 4]
        g.on_sample(0.01 * (tokens + 1), tokens, g.limit, True)
    assert g.limit == 64


def test_gradient_shrinks_when_latency_grows() -> None:
    g = GradientLimit(initial=16, max_limit=64)
    feed(g, 0.01, 100)
    high = g.limit
    feed(g, 0.04, 40)  # time per token x4: the engine's batch is too large
    assert g.limit < high / 2
    assert g.limit >= 1


def test_gradient_does_not_grow_when_app_limited() -> None:
    g = GradientLimit(initial=16)
    for _ in range(200):
        g.on_sample(1.0, 100, 2, True)
    assert g.limit == 16


def test_gradient_backs_off_on_overload_signals() -> None:
    g = GradientLimit(initial=20, min_limit=2)
    for _ in range(100):
        g.on_sample(1.0, 10, 20, False)
    assert g.limit == 2


def test_aimd() -> None:
    a = AIMDLimit(initial=10, max_limit=12, slow_per_token_s=0.1)
    for _ in range(5):
        a.on_sample(1.0, 100, 10, True)
    assert a.limit == 12
    a.on_sample(1.0, 100, 1, False)
    assert a.limit == 10  # 12 * 0.9
    a.on_sample(50.0, 100, 10, True)  # 0.5 s per token: too slow
    assert a.limit == 9
    a.on_sample(1.0, 100, 1, True)  # app-limited: no growth
    assert a.limit == 9


_samples = st.lists(
    st.tuples(
        st.floats(0, 1e4, allow_nan=False),
        st.integers(0, 10**6),
        st.integers(0, 5000),
        st.booleans(),
    ),
    max_size=200,
)


@settings(deadline=None, max_examples=50)
@given(
    samples=_samples,
    bounds=st.tuples(st.integers(1, 50), st.integers(0, 50), st.integers(0, 500)),
    aimd=st.booleans(),
)
def test_limits_stay_within_bounds(
    samples: list[tuple[float, int, int, bool]], bounds: tuple[int, int, int], aimd: bool
) -> None:
    lo, up1, up2 = bounds
    initial, hi = lo + up1, lo + up1 + up2
    lim: GradientLimit | AIMDLimit = (
        AIMDLimit(initial, min_limit=lo, max_limit=hi, slow_per_token_s=0.05)
        if aimd
        else GradientLimit(initial, min_limit=lo, max_limit=hi)
    )
    for latency, tokens, in_flight, ok in samples:
        lim.on_sample(latency, tokens, in_flight, ok)
        assert lo <= lim.limit <= hi
