"""vllm-router's program scheduling peer: identity, admission bound, acting TTL hold and
pause, resume order, force resume, the final call, plain requests, and an end-to-end run
of agentrt's ``vllm-router-agentic`` dialect through the gateway, all in virtual time."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

import agentrt
from agentrt.sim import Cluster
from agentrt.sim.peers import PEERS, GatewayRequest, ReplicaView, make_policy, peer_dialect
from agentrt.sim.peers._vllm_router import ConsistentHash
from agentrt.sim.peers._vllm_router_programs import (
    ProgramScheduling,
    cache_miss_impact_s,
    fitted_acting_ttl,
    program_identity,
)
from tests.sim._helpers import virtual_backend

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> Any:
    return virtual_backend()


class FakeEngine:
    def __init__(self) -> None:
        self.num_waiting = 0
        self.running: list[Any] = []


def views(n: int) -> list[ReplicaView]:
    return [ReplicaView(i, f"vllm-{i}", f"http://r{i}", FakeEngine()) for i in range(n)]  # type: ignore[arg-type]


_seq = iter(range(1 << 30))


def request(ctx: dict[str, Any] | None = None, *, session: str | None = None) -> GatewayRequest:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    if ctx is not None:
        body["vllm_xargs"] = {"agentic_context": json.dumps(ctx)}
    headers = {"x-session-id": session} if session else {}
    raw = json.dumps(body).encode()
    prompt = SimpleNamespace(num_tokens=1000, runs=[])
    return GatewayRequest(headers, body, raw, prompt, 0.0, next(_seq))  # type: ignore[arg-type]


def ctx(program: str, **extra: Any) -> dict[str, Any]:
    return {"program_id": program, "task_id": "job", "agent_role": "lead", **extra}


class Driver:
    """Runs requests through a policy as the gateway does; records dispatch times."""

    def __init__(self, policy: ProgramScheduling, n: int = 1) -> None:
        self.policy = policy
        self.views = views(n)
        policy.bind(self.views)
        self.dispatched: dict[str, list[float]] = {}

    async def call(self, name: str, req: GatewayRequest, service_s: float = 1.0) -> int:
        await self.policy.admit(req)
        index = self.policy.pick(req, anyio.current_time())
        self.dispatched.setdefault(name, []).append(anyio.current_time())
        self.views[index].inflight += 1
        await anyio.sleep(service_s)
        self.views[index].inflight -= 1
        self.policy.done(req, index, anyio.current_time())
        return index


# --------------------------------------------------------------------------- identity


def test_registered_with_its_dialect() -> None:
    assert PEERS["vllm-router:programs"] is ProgramScheduling
    assert isinstance(make_policy("vllm-router:programs"), ProgramScheduling)
    assert peer_dialect("vllm-router:programs") == "vllm-router-agentic"


def test_identity_reads_the_agentic_context() -> None:
    assert program_identity(request()) is None  # a plain client
    ident = program_identity(request(ctx("s1", kv_retention_ttl_seconds=4.5, deadline_seconds=9)))
    assert ident is not None
    assert ident.program_id == "s1"
    assert ident.placement_key == "job"
    assert ident.expected_resume is True
    assert ident.kv_retention_ttl_s == 4.5
    assert ident.deadline_s == 9.0
    final = program_identity(request(ctx("s1", expected_resume=False)))
    assert final is not None and final.expected_resume is False
    # task + agent without program_id; a blocking sub-agent does not expect to resume
    sub = program_identity(request({"task_id": "t", "agent_id": "researcher"}))
    assert sub is not None
    assert sub.program_id == "t:researcher"
    assert sub.expected_resume is False
    # the object form is accepted as well as the JSON string
    req = request()
    req.body["vllm_xargs"] = {"agentic_context": {"program_id": "p", "priority": 3}}
    obj = program_identity(req)
    assert obj is not None and obj.priority == 3
    with pytest.raises(ValueError):
        program_identity(request({"program_id": "p", "expected_resume": "yes"}))


def test_binding_follows_the_session_header_like_consistent_hash() -> None:
    policy = ProgramScheduling()
    vs = views(8)
    policy.bind(vs)
    plain = ConsistentHash()
    plain.bind(vs)
    targets = set()
    for s in range(16):
        ident = program_identity(request(ctx(f"p{s}"), session=f"s{s}"))
        assert ident is not None
        target = policy._bind_target(ident)
        assert target == plain.pick(request(session=f"s{s}"), 0.0)
        targets.add(target)
    assert len(targets) > 1


def test_fitted_ttl_is_zero_without_gain_and_capped() -> None:
    impact = cache_miss_impact_s(50_000)
    # the docs' reference: about 13.93 s for a 50,000-token cold prefill, x (2 - 0.15)
    assert impact / (2 - 0.15) == pytest.approx(13.93, abs=0.01)
    # returns within ~1 s with a 20 s miss: keep the KV, up to the 10 s cap
    short = fitted_acting_ttl([0.8, 1.0, 1.2] * 40, impact, 10.0)
    assert 1.2 < short <= 10.0 + 1e-9
    # returns after ~100 s: holding is not worth it
    assert fitted_acting_ttl([90.0, 100.0, 110.0] * 40, impact, 10.0) == 0.0
    assert fitted_acting_ttl([], impact, 10.0) == 0.0


# --------------------------------------------------------------------------- scheduling


async def test_admission_bound_and_ttl_hold_then_pause() -> None:
    """Two slots: the third program waits while the first two run and then hold their
    slots for their acting TTL (5 s); it is admitted at the tick after the TTL ends."""
    policy = ProgramScheduling(max_active_programs_per_target=2)
    d = Driver(policy)
    async with anyio.create_task_group() as tg:
        for p in ("a", "b"):
            tg.start_soon(d.call, p, request(ctx(p, kv_retention_ttl_seconds=5)), 1.0)
        await anyio.sleep(0.1)
        tg.start_soon(d.call, "c", request(ctx("c")), 1.0)
        await anyio.sleep(2.0)  # a and b are done: acting, slots held
        assert policy.state("a") == policy.state("b") == "acting"
        assert policy.state("c") == "paused"
        assert "c" not in d.dispatched
        await anyio.sleep(2.5)  # t = 4.6 < 1 + 5
        assert "c" not in d.dispatched
    (t_c,) = d.dispatched["c"]
    assert 6.0 <= t_c <= 7.0 + 1e-6  # TTL end (6.0) up to the next tick
    # c's TTL is 0 (no hint, no mature window): it is paused as its reply ends
    assert policy.counts["ttl_expired"] == 3
    assert policy.state("a") == policy.state("c") == "paused"
    assert policy.active_on(0) == 0


async def test_return_within_ttl_goes_at_once_after_it_waits() -> None:
    policy = ProgramScheduling(max_active_programs_per_target=1)
    d = Driver(policy)
    await d.call("a", request(ctx("a", kv_retention_ttl_seconds=3)))
    t0 = anyio.current_time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(d.call, "b", request(ctx("b")))
        await anyio.sleep(0.5)
        await d.call("a", request(ctx("a", kv_retention_ttl_seconds=3)))  # slot held
        assert d.dispatched["a"][1] == pytest.approx(t0 + 0.5)
        assert "b" not in d.dispatched
    # b got the slot only after a's second TTL ran out (a finished at t0 + 1.5)
    assert d.dispatched["b"][0] >= t0 + 4.5
    assert policy.counts["admit"] == 2


async def test_resume_order_is_most_recently_finished_first() -> None:
    policy = ProgramScheduling(max_active_programs_per_target=1)
    d = Driver(policy)
    await d.call("old", request(ctx("old")))
    await anyio.sleep(2.0)
    await d.call("new", request(ctx("new")))
    await anyio.sleep(2.0)  # both paused (TTL 0)
    assert policy.state("old") == policy.state("new") == "paused"
    async with anyio.create_task_group() as tg:
        tg.start_soon(d.call, "hog", request(ctx("hog", kv_retention_ttl_seconds=2)))
        await anyio.sleep(0.1)
        tg.start_soon(d.call, "old", request(ctx("old")))
        await anyio.sleep(0.1)
        tg.start_soon(d.call, "new", request(ctx("new")))
    assert d.dispatched["new"][1] < d.dispatched["old"][1]


async def test_deadline_force_resumes_past_the_bound() -> None:
    policy = ProgramScheduling(max_active_programs_per_target=1)
    d = Driver(policy)
    async with anyio.create_task_group() as tg:
        tg.start_soon(d.call, "hog", request(ctx("hog", kv_retention_ttl_seconds=100)))
        await anyio.sleep(0.1)
        tg.start_soon(d.call, "late", request(ctx("late", deadline_seconds=3)))
        tg.start_soon(d.call, "patient", request(ctx("patient")))
        await anyio.sleep(3.5)
        assert d.dispatched["late"] == [pytest.approx(3.1)]
        assert policy.counts["force_resume"] == 1
        assert policy.active_on(0) == 2  # over the bound
        await anyio.sleep(10.0)
        assert "patient" not in d.dispatched  # no deadline: the 300 s fallback
    assert d.dispatched["patient"][0] <= 300.1 + 1e-6


async def test_final_call_frees_the_slot_at_once() -> None:
    policy = ProgramScheduling(max_active_programs_per_target=1)
    d = Driver(policy)
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            d.call, "a", request(ctx("a", kv_retention_ttl_seconds=50, expected_resume=False))
        )
        await anyio.sleep(0.1)
        tg.start_soon(d.call, "b", request(ctx("b")))
    assert d.dispatched["b"] == [pytest.approx(1.0)]  # a's reply ended at 1.0
    assert policy.state("a") is None  # released, not held for its 50 s
    assert policy.counts["terminate"] == 1


async def test_waiting_gate_holds_admission_while_the_engine_queues() -> None:
    policy = ProgramScheduling()
    d = Driver(policy)
    engine = d.views[0].engine
    assert isinstance(engine, FakeEngine)
    engine.num_waiting = 3
    async with anyio.create_task_group() as tg:
        tg.start_soon(d.call, "a", request(ctx("a")))
        await anyio.sleep(2.5)
        assert "a" not in d.dispatched  # the polled waiting count blocks it
        engine.num_waiting = 0
    assert 2.5 <= d.dispatched["a"][0] <= 3.0 + 1e-6  # admitted at the next tick


async def test_plain_requests_pass_through_unscheduled() -> None:
    policy = ProgramScheduling(max_active_programs_per_target=1)
    d = Driver(policy, n=4)
    plain = ConsistentHash()
    plain.bind(d.views)
    async with anyio.create_task_group() as tg:
        tg.start_soon(d.call, "hog", request(ctx("hog", kv_retention_ttl_seconds=100)))
        for s in range(8):
            tg.start_soon(d.call, f"plain{s}", request(session=f"s{s}"))
    for s in range(8):
        assert d.dispatched[f"plain{s}"] == [0.0]  # no wait, not even behind the hog
    assert policy.counts["plain"] == 8
    assert set(policy.programs) == {"hog"}


async def test_cancelled_waiter_leaves_no_program() -> None:
    policy = ProgramScheduling(max_active_programs_per_target=1)
    d = Driver(policy)
    async with anyio.create_task_group() as tg:
        tg.start_soon(d.call, "hog", request(ctx("hog", kv_retention_ttl_seconds=100)))
        await anyio.sleep(0.1)
        with anyio.move_on_after(1.0):
            await d.call("gone", request(ctx("gone")))
        assert policy.state("gone") is None
        assert all("gone" not in [p.id for p in q] for q in policy._queues)
        tg.cancel_scope.cancel()


# --------------------------------------------------------------------------- end to end


async def test_agentrt_through_the_programs_gateway() -> None:
    """agentrt's vllm-router-agentic dialect behind the gateway: every call completes,
    the declared tool wait becomes the acting TTL, and final calls end the programs."""
    policy = ProgramScheduling(max_active_programs_per_target=1)
    async with (
        Cluster(2, "h100-8b", gateway=policy) as cluster,
        agentrt.Runtime(
            cluster.gateway_url,
            transport=cluster.transport(),
            dialect="vllm-router-agentic",
            otel=False,
        ) as rt,
    ):
        held: list[float] = []
        most = [0, 0]

        async def agent(job: Any, s: int) -> None:
            async with job.session(f"agent{s}", session_id=f"s{s}") as sess:
                msgs = [{"role": "user", "content": f"agent {s} " + "x" * 4000}]
                for turn in range(3):
                    sess.expect_idle(3.0)
                    await sess.chat(model="m", messages=msgs, max_tokens=8)
                    target = policy.programs[f"s{s}"].target
                    most[target] = max(most[target], policy.active_on(target))
                    if s == 0 and turn == 0:
                        program = policy.programs[f"s{s}"]
                        assert program.acting and program.ttl_deadline is not None
                        held.append(program.ttl_deadline - anyio.current_time())
                    async with sess.tool("search", expected_s=3.0):
                        await anyio.sleep(3.0)
                    msgs.append({"role": "user", "content": "more " * 50})
                await sess.chat(model="m", messages=msgs, max_tokens=8, final=True)

        t0 = anyio.current_time()
        async with rt.job("j") as job, anyio.create_task_group() as tg:
            for s in range(6):
                tg.start_soon(agent, job, s)
        # one replica hosts 3 or more programs, one after another (9 s of tools each)
        assert anyio.current_time() - t0 >= 27.0
        gw = cluster.gateway
        assert gw is not None
        assert sum(gw.routed) == 6 * 4
        assert all(v.inflight == 0 for v in gw.views)
    assert held == [pytest.approx(5.0, abs=0.01)]  # 3 s expected idle + the 2 s margin
    assert policy.counts["plain"] == 0
    assert policy.counts["terminate"] == 6
    assert policy.programs == {}
    # each program returns within its 5 s TTL, so it keeps its replica's one slot from
    # its first call to its final one, and the next program on that replica waits
    assert most == [1, 1]
    assert policy.counts["admit"] == 6
    assert policy.counts["force_resume"] == policy.counts["ttl_expired"] == 0
