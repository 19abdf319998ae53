"""The per-endpoint admission gate, on asyncio and trio."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Coroutine
from typing import Any

import anyio
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from agentrt.scheduling import (
    FCFS,
    PLAS,
    Admission,
    AIMDLimit,
    FixedLimit,
    Limit,
    Ticket,
    make_policy,
)

_ids = itertools.count()


def ticket(job: str = "j", tokens: int = 100) -> Ticket:
    return Ticket(
        call_id=f"c{next(_ids)}", job_id=job, program_id=job, session_id=f"{job}/s", tokens=tokens
    )


def run_without_suspending(coro: Coroutine[Any, Any, None]) -> None:
    """Run ``coro`` to completion in one step: it must not await anything."""
    with pytest.raises(StopIteration):
        coro.send(None)


def release(adm: Admission, t: Ticket, ok: bool = True) -> None:
    adm.release(t, latency_s=1.0, tokens=t.tokens, ok=ok)


class Waiter:
    """A task admitting one ticket; records how its admission ended."""

    def __init__(self, adm: Admission, t: Ticket) -> None:
        self.adm, self.ticket = adm, t
        self.scope = anyio.CancelScope()
        self.admitted = False
        self.done = False

    async def __call__(self) -> None:
        with self.scope:
            await self.adm.admit(self.ticket)
            self.admitted = True
        self.done = True


async def start(tg: anyio.abc.TaskGroup, adm: Admission, t: Ticket) -> Waiter:
    w = Waiter(adm, t)
    tg.start_soon(w)
    await anyio.wait_all_tasks_blocked()
    return w


def test_fast_path_without_limit_never_awaits() -> None:
    adm = Admission(FCFS())
    ts = [ticket(tokens=10**6) for _ in range(3)]
    for t in ts:
        run_without_suspending(adm.admit(t))
    s = adm.statistics()
    assert (s.limit, s.in_flight, s.outstanding_tokens, s.admitted) == (None, 3, 3 * 10**6, 3)
    for t in ts:
        release(adm, t)
    assert adm.statistics().in_flight == 0


def test_fast_path_with_room_never_awaits() -> None:
    adm = Admission(FCFS(), FixedLimit(2), token_budget=1000)
    a, b = ticket(tokens=400), ticket(tokens=600)
    run_without_suspending(adm.admit(a))
    run_without_suspending(adm.admit(b))
    assert adm.statistics().outstanding_tokens == 1000
    assert adm.statistics().queued_total == 0


def test_fixed_unlimited_is_the_fast_path() -> None:
    assert Admission(FCFS(), FixedLimit(None)).limit is None


def test_misuse_is_visible() -> None:
    adm = Admission(FCFS())
    t = ticket()
    run_without_suspending(adm.admit(t))
    with pytest.raises(RuntimeError, match="already admitted"):
        run_without_suspending(adm.admit(t))
    release(adm, t)
    with pytest.raises(RuntimeError, match="not admitted"):
        release(adm, t)
    with pytest.raises(ValueError):
        Admission(FCFS(), token_budget=0)


def test_statistics_is_a_frozen_snapshot() -> None:
    adm = Admission(FCFS(), FixedLimit(4))
    s = adm.statistics()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.in_flight = 3  # type: ignore[misc]
    assert "fcfs" in repr(adm)


@pytest.mark.anyio
async def test_waiters_leave_in_policy_order() -> None:
    policy = PLAS(starvation_ratio=None)
    for job, service in (("heavy", 100.0), ("mid", 5.0)):
        policy.on_call_end(ticket(job), service, 0)
    adm = Admission(policy, FixedLimit(1))
    first = ticket("first")
    await adm.admit(first)
    async with anyio.create_task_group() as tg:
        ws = [await start(tg, adm, ticket(job)) for job in ("heavy", "mid", "light")]
        assert adm.statistics().waiting == 3
        order = []
        running = first
        for _ in range(3):
            release(adm, running)
            await anyio.wait_all_tasks_blocked()
            (w,) = [w for w in ws if w.admitted and w.ticket not in order]
            order.append(w.ticket)
            running = w.ticket
        release(adm, running)
    assert [t.job_id for t in order] == ["light", "mid", "heavy"]
    s = adm.statistics()
    assert (s.in_flight, s.waiting, s.admitted, s.queued_total) == (0, 0, 4, 3)


@pytest.mark.anyio
async def test_token_budget_is_head_of_line() -> None:
    adm = Admission(FCFS(), token_budget=1000)
    a = ticket(tokens=600)
    await adm.admit(a)
    async with anyio.create_task_group() as tg:
        big = await start(tg, adm, ticket(tokens=600))
        small = await start(tg, adm, ticket(tokens=100))
        assert not big.admitted and not small.admitted  # no backfill past the head
        release(adm, a)
        await anyio.wait_all_tasks_blocked()
        assert big.admitted and small.admitted
        assert adm.statistics().outstanding_tokens == 700
        release(adm, big.ticket)
        release(adm, small.ticket)


@pytest.mark.anyio
async def test_a_call_larger_than_the_budget_runs_alone() -> None:
    adm = Admission(FCFS(), token_budget=100)
    small = ticket(tokens=50)
    await adm.admit(small)
    async with anyio.create_task_group() as tg:
        huge = await start(tg, adm, ticket(tokens=10**6))
        assert not huge.admitted
        release(adm, small)
        await anyio.wait_all_tasks_blocked()
        assert huge.admitted
        after = await start(tg, adm, ticket(tokens=1))
        assert not after.admitted
        release(adm, huge.ticket)
        await anyio.wait_all_tasks_blocked()
        assert after.admitted
        release(adm, after.ticket)


@pytest.mark.anyio
async def test_cancel_while_waiting_leaves_the_queue() -> None:
    policy = FCFS()
    adm = Admission(policy, FixedLimit(1))
    a = ticket()
    await adm.admit(a)
    async with anyio.create_task_group() as tg:
        w = await start(tg, adm, ticket())
        w2 = await start(tg, adm, ticket())
        w.scope.cancel()
        await anyio.wait_all_tasks_blocked()
        assert w.done and not w.admitted
        assert adm.statistics().waiting == 1 and len(policy) == 1
        release(adm, a)
        await anyio.wait_all_tasks_blocked()
        assert w2.admitted
        release(adm, w2.ticket)
    assert adm.statistics().in_flight == 0


@pytest.mark.anyio
async def test_cancelling_the_head_of_line_unblocks_the_next() -> None:
    adm = Admission(FCFS(), token_budget=1000)
    a = ticket(tokens=900)
    await adm.admit(a)
    async with anyio.create_task_group() as tg:
        head = await start(tg, adm, ticket(tokens=500))
        small = await start(tg, adm, ticket(tokens=50))
        head.scope.cancel()
        await anyio.wait_all_tasks_blocked()
        assert small.admitted and not head.admitted
        release(adm, small.ticket)
    release(adm, a)
    assert adm.statistics().outstanding_tokens == 0


@pytest.mark.anyio
async def test_room_granted_to_a_cancelled_waiter_is_not_leaked() -> None:
    adm = Admission(FCFS(), FixedLimit(1))
    a = ticket()
    await adm.admit(a)
    b = ticket()

    async def waiter(scope: anyio.CancelScope) -> None:
        with scope:
            await adm.admit(b)
            try:  # trio resumes a woken task normally; the cancel lands here
                await anyio.sleep_forever()
            finally:
                release(adm, b)

    scope = anyio.CancelScope()
    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter, scope)
        await anyio.wait_all_tasks_blocked()
        release(adm, a)  # grants b's room and sets its event ...
        scope.cancel()  # ... and cancels it before it resumes
    s = adm.statistics()
    assert (s.in_flight, s.waiting, s.outstanding_tokens) == (0, 0, 0)
    # anyio completes the wait and cancels at the caller's next checkpoint.
    assert s.admitted == 2
    c = ticket()
    run_without_suspending(adm.admit(c))  # the room is there


@pytest.mark.anyio
async def test_a_growing_limit_admits_more() -> None:
    adm = Admission(FCFS(), AIMDLimit(initial=1))
    a = ticket()
    await adm.admit(a)
    async with anyio.create_task_group() as tg:
        ws = [await start(tg, adm, ticket()) for _ in range(2)]
        release(adm, a)  # 1 of 1 in flight: +1
        await anyio.wait_all_tasks_blocked()
        assert all(w.admitted for w in ws)
        assert adm.statistics().limit == 2
        for w in ws:
            release(adm, w.ticket)


# --- properties -----------------------------------------------------------------------

_op = st.tuples(
    st.sampled_from(["admit", "admit", "admit", "release", "release", "cancel", "race"]),
    st.integers(0, 1500),  # admit: tokens; others: which one
    st.integers(0, 5),  # admit: job; release: ok unless 0
)


def check(adm: Admission, waiters: list[Waiter], released: set[int]) -> None:
    s = adm.statistics()
    waiting = [w for w in waiters if not w.done]
    running = [w for w in waiters if w.admitted and id(w) not in released]
    # Every ticket is waiting, running, released or cancelled; the counters agree.
    assert s.waiting == len(waiting) == len(adm.policy) + (adm._next is not None)
    assert s.in_flight == len(running)
    assert s.outstanding_tokens == sum(w.ticket.tokens for w in running)
    assert s.admitted == sum(w.admitted for w in waiters)
    # Limits hold (a call over the token budget runs alone).
    budget = adm._budget
    if budget is not None:
        assert s.outstanding_tokens <= budget or s.in_flight == 1
    # Work-conserving: nobody waits while there is room for the next in line.
    if s.waiting:
        full = s.limit is not None and s.in_flight >= s.limit
        nxt = adm._next
        blocked = (
            nxt is not None
            and budget is not None
            and s.in_flight > 0
            and s.outstanding_tokens + nxt.tokens > budget
        )
        assert full or blocked, s


@pytest.mark.anyio
@settings(deadline=None, max_examples=60)
@given(
    policy=st.sampled_from(["fcfs", "plas", "atlas", "mlfq", "edf"]),
    limit=st.sampled_from([None, 1, 2, 3, "aimd"]),
    budget=st.one_of(st.none(), st.integers(100, 2000)),
    ops=st.lists(_op, min_size=5, max_size=40),
)
async def test_admission_invariants(
    policy: str, limit: int | str | None, budget: int | None, ops: list[tuple[str, int, int]]
) -> None:
    lim: Limit | None = (
        AIMDLimit(initial=2, max_limit=4)
        if limit == "aimd"
        else None
        if limit is None
        else FixedLimit(int(limit))
    )
    adm = Admission(make_policy(policy), lim, token_budget=budget)
    waiters: list[Waiter] = []
    released: set[int] = set()
    async with anyio.create_task_group() as tg:
        for op, n, arg in ops:
            running = [w for w in waiters if w.admitted and id(w) not in released]
            if op == "admit":
                t = ticket(f"j{arg}", tokens=n)
                adm.policy.classify(t, anyio.current_time())
                w = Waiter(adm, t)
                waiters.append(w)
                tg.start_soon(w)
            elif op in ("release", "race") and running:
                w = running[n % len(running)]
                released.add(id(w))
                adm.release(w.ticket, latency_s=0.5, tokens=w.ticket.tokens, ok=bool(arg))
            if op in ("cancel", "race") and (pending := [w for w in waiters if not w.done]):
                # "race": the waiter may have just been granted room, not yet resumed.
                pending[n % len(pending)].scope.cancel()
            await anyio.wait_all_tasks_blocked()
            check(adm, waiters, released)
        # Drain: release everything; every waiter ends admitted (then released) or cancelled.
        while running := [w for w in waiters if w.admitted and id(w) not in released]:
            released.add(id(running[0]))
            release(adm, running[0].ticket)
            await anyio.wait_all_tasks_blocked()
            check(adm, waiters, released)
    assert all(w.done for w in waiters)
    s = adm.statistics()
    assert (s.in_flight, s.waiting, s.outstanding_tokens) == (0, 0, 0)
    assert len(adm.policy) == 0
    assert s.admitted == len(released) == sum(w.admitted for w in waiters)
    event(f"queued: {min(s.queued_total, 5)}{'+' if s.queued_total >= 5 else ''}")
    event(f"cancelled: {sum(not w.admitted for w in waiters) > 0}")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_native_asyncio_cancel_after_grant_hands_the_room_on() -> None:
    # A plain task.cancel() (asyncio.timeout, wait_for) lands inside admit() even when
    # the room was granted just before: admit() must give the room to the next waiter.
    adm = Admission(FCFS(), FixedLimit(1))
    a = ticket()
    await adm.admit(a)
    b, c = ticket(), ticket()
    tb = asyncio.create_task(adm.admit(b))
    tc = asyncio.create_task(adm.admit(c))
    await anyio.wait_all_tasks_blocked()
    release(adm, a)  # grants b
    tb.cancel()
    with pytest.raises(asyncio.CancelledError):
        await tb
    await tc  # c got b's room
    s = adm.statistics()
    assert (s.in_flight, s.waiting, s.admitted) == (1, 0, 2)
    release(adm, c)
