"""A fleet: K independent clients (a service's K worker processes) sharing the replicas.

Each member is a whole driver: for agentrt its own :class:`~agentrt.Runtime` (its own
router, admission gates and learned waits), for ``plain`` its own round-robin. They share
nothing but the replicas, as K processes would. Jobs are dealt to them in arrival order
(``round_robin``: the i-th job to arrive goes to member ``i % K``, as a load balancer in
front of the workers does), by a stable hash of the job's name (``hash``: blake2b, the
same member on every run and machine), or as each job says (``plan``: its
``JobPlan.worker``, as ``agentrt tune`` replays a fleet's journal).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Final, Literal

from ._drivers import Driver, JobResult
from ._plan import JobPlan

__all__ = ["FLEET_ASSIGNS", "Fleet", "FleetAssign", "assign_members", "plain_starts"]

FleetAssign = Literal["round_robin", "hash", "plan"]
"""How a fleet's jobs are dealt to its members."""
FLEET_ASSIGNS: Final = ("round_robin", "hash", "plan")


def assign_members(plans: Sequence[JobPlan], fleet: int, assign: FleetAssign) -> list[int]:
    """The member (0 to ``fleet - 1``) that runs each of ``plans``, in ``plans`` order.
    ``round_robin``: by arrival order (ties in the order given, as the replay starts
    them); ``hash``: blake2b of the job's name; ``plan``: each job's ``worker`` (modulo
    ``fleet``), the jobs without one round-robin among themselves."""
    if assign == "plan":
        dealt = [p.worker for p in plans]
        rest = [p for p, w in zip(plans, dealt, strict=True) if w is None]
        others = iter(assign_members(rest, fleet, "round_robin"))
        return [next(others) if w is None else w % fleet for w in dealt]
    if assign == "hash":
        return [
            int.from_bytes(hashlib.blake2b(p.name.encode(), digest_size=8).digest(), "big") % fleet
            for p in plans
        ]
    order = sorted(range(len(plans)), key=lambda i: plans[i].arrival_s)
    members = [0] * len(plans)
    for rank, i in enumerate(order):
        members[i] = rank % fleet
    return members


def plain_starts(fleet: int, replicas: int, seed: int) -> list[int]:
    """Where each plain member's round-robin begins: replica 0 for a lone client; in a
    fleet, a random replica per member (seeded by ``seed`` and the member), as independent
    client-side balancers start at unrelated replicas."""
    if fleet == 1:
        return [0]
    return [random.Random(f"{seed}:{m}").randrange(replicas) for m in range(fleet)]


class Fleet:
    """A driver made of ``members`` (drivers sharing the replicas): each job of ``plans``
    runs on the member :func:`assign_members` gives it, and its :class:`JobResult` says
    which (``worker``). Entering the fleet enters every member, in order."""

    def __init__(
        self, members: Sequence[Driver], plans: Sequence[JobPlan], assign: FleetAssign
    ) -> None:
        self.members = list(members)
        self._plans = list(plans)  # kept alive: the member map is keyed by identity
        given = assign_members(self._plans, len(self.members), assign)
        # By identity: the tuner's jobs may share a name.
        self._member = {id(p): m for p, m in zip(self._plans, given, strict=True)}
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> Fleet:
        async with AsyncExitStack() as stack:
            for member in self.members:
                await stack.enter_async_context(member)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def run_job(self, plan: JobPlan, t0: float) -> JobResult:
        worker = self._member[id(plan)]
        result = await self.members[worker].run_job(plan, t0)
        result.worker = worker
        return result
