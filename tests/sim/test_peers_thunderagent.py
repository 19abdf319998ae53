"""The peers that do load control: Dynamo's ThunderAgent router (its program scheduler's
state machine: placement, pause at the threshold, drain to the target, marking, resume
order and placement, forced resume, idle expiry) and llm-d's default flow control (the
saturation detector's gate, one FCFS queue, the queue-wait budget); each end to end
through the gateway and in a bench replay."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import anyio
import httpx
import pytest

from agentrt.bench import ClientSpec
from agentrt.bench._runner import BenchConfig, prepare, replay_part
from agentrt.sim import Cluster
from agentrt.sim.peers import PEERS, GatewayRequest, ReplicaView, make_policy, peer_dialect
from agentrt.sim.peers._llmd import LLMDFairness, LLMDFlow
from agentrt.sim.peers._thunderagent import (
    ProgramScheduler,
    ThunderAgent,
    ThunderAgentConfig,
    ThunderAgentHome,
)
from tests.sim._helpers import virtual_backend

pytestmark = pytest.mark.anyio

BS = 16
BUF = 100  # buffer_per_program


@pytest.fixture
def anyio_backend() -> Any:
    return virtual_backend()


def test_registered_with_the_dynamo_dialect() -> None:
    assert PEERS["thunderagent"] is ThunderAgent
    assert type(make_policy("thunderagent")) is ThunderAgent
    assert peer_dialect("thunderagent") == "dynamo"
    assert PEERS["thunderagent:home"] is ThunderAgentHome
    assert ThunderAgentHome().cfg.resume_home and not ThunderAgent().cfg.resume_home
    assert PEERS["llm-d:flow"] is LLMDFlow
    assert peer_dialect("llm-d:flow") == "llm-d"
    spec = ClientSpec.parse("plain:session>thunderagent")
    assert (spec.kind, spec.session_headers, spec.gateway) == ("plain", True, "thunderagent")
    assert not ClientSpec.parse("plain>thunderagent").session_headers
    assert ClientSpec.parse("agentrt:defaults>thunderagent").dialect == "dynamo"


# --------------------------------------------------------------------------- the scheduler


def acting(s: ProgramScheduler, pid: str, tokens: int, now: float = 0.0) -> None:
    """A program that ran one turn of ``tokens`` and is now in a tool."""
    assert not s.admit(pid, tokens, now)
    s.complete(pid, tokens, 0, now)


def test_new_programs_go_where_the_decayed_load_is_least() -> None:
    s = ProgramScheduler([10_000, 10_000])
    assert not s.admit("a", 3000, 0.0)
    assert s.programs["a"].replica == 0
    assert not s.admit("b", 1000, 0.0)  # a's turn in flight counts in full
    assert s.programs["b"].replica == 1
    s.complete("a", 3000, 0, 0.0)
    # 10 s later a's idle tokens have decayed to ~0 in the ranking (still in the budget),
    # b's turn in flight has not: c goes beside a
    assert not s.admit("c", 2000, 10.0)
    assert s.programs["c"].replica == 0
    assert s.utilization(10.0) == [pytest.approx(5200 / 10_000), pytest.approx(1100 / 10_000)]
    # no room anywhere for a new 9000-token program: it waits, paused
    assert s.admit("d", 9000, 11.0)
    assert list(s.paused) == ["d"] and s.programs["d"].paused_from is None


def test_pause_at_the_threshold_smallest_acting_first_down_to_the_target() -> None:
    s = ProgramScheduler([10_000])
    for pid, tokens in [("big", 4000), ("mid", 2500), ("small", 1500), ("tiny", 900)]:
        acting(s, pid, tokens)
    # used 9300: below 0.95 x 10000, nothing happens
    s.tick(5.0)
    assert s.paused == {}
    s.admit("big", 4500, 6.0)  # big's next turn grows it: 9800 > 9500
    s.tick(10.0)
    # pause idle ones smallest first until used <= 8000: tiny (-1000 -> 8800), small
    # (-1600 -> 7200); big is reasoning and stays
    assert list(s.paused) == ["tiny", "small"]
    assert s.programs["tiny"].replica is None
    assert s.programs["mid"].lifecycle == "active"
    assert s.utilization(10.0) == [pytest.approx(0.72)]
    assert s.pauses == 2 and s.marks == 0


def test_reasoning_programs_are_marked_and_paused_when_their_turn_ends() -> None:
    s = ProgramScheduler([10_000])
    acting(s, "idle", 1000)
    for pid, tokens in [("r1", 5000), ("r2", 3500)]:
        assert not s.admit(pid, tokens, 0.0)
    s.tick(5.0)  # 9800 > 9500: idle paused (-> 8700 > 8000), then every turn marked
    assert list(s.paused) == ["idle"]
    assert s.programs["r1"].marked and s.programs["r2"].marked
    assert s.marks == 2
    s.complete("r2", 3500, 100, 6.0)
    assert list(s.paused) == ["idle", "r2"]
    assert s.programs["r2"].paused_from == 0


def test_resume_order_waiting_turns_then_new_then_idle_smallest_first() -> None:
    s = ProgramScheduler([100_000])
    for pid, tokens in [("w-big", 5000), ("w-small", 2000), ("i-small", 500), ("i-big", 900)]:
        acting(s, pid, tokens)
    for pid in list(s.programs):
        s._pause(s.programs[pid], 0.0)
    s.admit("w-big", 5000, 1.0)  # next turns arrive and wait
    s.admit("w-small", 2000, 1.0)
    assert s.admit("new", 300, 1.0)  # a new program queues behind paused ones
    order = [p.pid for p in s.resume_order()]
    assert order == ["w-small", "w-big", "new", "i-small", "i-big"]


@pytest.mark.parametrize("home", [False, True])
def test_resume_fits_under_the_ceiling_and_goes_where_the_headroom_is(home: bool) -> None:
    woken: list[str] = []
    cfg = ThunderAgentConfig(resume_home=home)
    s = ProgramScheduler([10_000, 10_000], cfg, on_resume=woken.append)
    acting(s, "home", 1000)  # replica 0
    acting(s, "other", 4000)  # replica 1 (less load)
    acting(s, "filler", 3500)  # replica 0 (1100 against 4100)
    s._pause(s.programs["home"], 0.0)
    assert s.programs["home"].paused_from == 0
    assert s.admit("home", 1000, 1.0)  # its next turn waits
    assert not s.admit("filler", 4500, 3.0)  # replica 0 now holds 4600, replica 1 4100
    s.tick(5.0)
    # ceiling 0.85: headroom 8500 - 4600 = 3900 on 0, 8500 - 4100 = 4400 on 1: the
    # program resumes on replica 1, not its own (thunderagent:home keeps it home, where
    # it fits too)
    assert woken == ["home"]
    assert s.programs["home"].replica == (0 if home else 1)
    assert (s.resumes, s.moved) == (1, 0 if home else 1)


def test_nothing_resumes_above_the_ceiling_until_room_frees() -> None:
    woken: list[str] = []
    s = ProgramScheduler([10_000], on_resume=woken.append)
    acting(s, "p", 2000)
    acting(s, "q", 6500)
    s._pause(s.programs["p"], 0.0)
    assert s.admit("p", 2000, 0.0)
    # 6600 used: 8500 - 6600 = 1900 < 2100 needed
    s.tick(5.0)
    assert woken == [] and list(s.paused) == ["p"]
    s.end("q")  # a final request releases q (and wakes any turn of q waiting)
    s.tick(10.0)
    assert woken == ["q", "p"] and s.paused == {}
    assert s.moved == 0  # back where it was


def test_forced_resume_goes_to_the_least_loaded_replica() -> None:
    s = ProgramScheduler([10_000, 10_000])
    acting(s, "a", 5000)  # replica 0, idle
    assert not s.admit("b", 1000, 0.0)  # replica 1, in flight
    assert not s.admit("c", 500, 0.0)  # replica 1 (a's 5000 count in full at t = 0)
    assert s.programs["c"].replica == 1
    s._pause(s.programs["c"], 0.0)
    # 20 s on, a has decayed away: replica 0 is the least loaded, whatever the budget
    assert s.force_resume("c", 20.0)
    assert s.programs["c"].replica == 0 and (s.forced, s.moved) == (1, 1)
    assert not s.force_resume("c", 21.0)


def test_idle_programs_expire_after_the_ttl() -> None:
    s = ProgramScheduler([10_000], ThunderAgentConfig(idle_ttl_s=600.0))
    acting(s, "gone", 3000, 0.0)
    acting(s, "alive", 3000, 0.0)
    s.admit("alive", 3000, 100.0)
    s.catch_up(599.0)
    assert "gone" in s.programs
    s.catch_up(605.0)
    assert "gone" not in s.programs and "alive" in s.programs
    assert s.expired == 1 and s.ticks == 121


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="pause_target"):
        ThunderAgentConfig(pause_target=0.99)
    with pytest.raises(ValueError, match="capacity"):
        ProgramScheduler([0])


# --------------------------------------------------------------------------- the gateway


async def _chat(http: httpx.AsyncClient, url: str, sid: str | None, tokens: int) -> int:
    headers = {"x-dynamo-session-id": sid} if sid else {}
    r = await http.post(
        url + "/chat/completions",
        json={
            "model": "m",
            "messages": [{"role": "user", "content": f"{sid} " + "y" * (4 * tokens)}],
            "max_tokens": 8,
        },
        headers=headers,
    )
    return r.status_code


async def test_thunderagent_holds_a_paused_program_while_idle_ones_fill_the_budget() -> None:
    """Three sessions fill 0.96 of one replica's budget: a tick pauses one (smallest idle
    first); its next turn waits until the others, idle, expire 600 s after their turns."""
    policy = ThunderAgent()
    async with Cluster(1, "h100-8b", gateway=policy) as c:
        sched = policy.scheduler
        assert sched is not None and sched.capacities == [16 * 26_624]  # the preset's KV
        async with httpx.AsyncClient(transport=c.transport()) as http:
            url = c.gateway_url
            assert await _chat(http, url, None, 100) == 200  # no session: passthrough
            assert sched.programs == {}
            sizes = {"a": 150_000, "b": 150_000, "c": 110_000}
            for sid, tokens in sizes.items():
                assert await _chat(http, url, sid, tokens) == 200
            await anyio.sleep(5.0)
            sched.catch_up(anyio.current_time())  # (the next request would run it)
            assert len(sched.paused) == 1
            (paused,) = sched.paused
            assert sched.utilization(anyio.current_time())[0] <= 0.80
            codes: list[int] = []

            async def turn(sid: str) -> None:  # each context grows by 1000 tokens
                codes.append(await _chat(http, url, sid, sizes[sid] + 1000))

            t0 = anyio.current_time()
            async with anyio.create_task_group() as tg:
                for sid in ("a", "b", "c"):
                    tg.start_soon(turn, sid)
        assert codes == [200, 200, 200]
        assert policy.held == 1 and sched.resumes == 1
        assert 590.0 <= policy.hold_s[0] <= 620.0  # the idle TTL, on the 5 s grid
        assert sched.expired == 2 and anyio.current_time() - t0 >= 590.0
        assert paused not in sched.paused
        assert c.gateway is not None and sum(c.gateway.routed) == 7


async def test_thunderagent_new_program_waits_behind_a_paused_one() -> None:
    policy = ThunderAgent()
    async with Cluster(1, "h100-8b", gateway=policy) as c:
        sched = policy.scheduler
        assert sched is not None
        async with httpx.AsyncClient(transport=c.transport()) as http:
            url = c.gateway_url
            for sid in ("a", "b", "c"):
                assert await _chat(http, url, sid, 140_000) == 200
            await anyio.sleep(5.0)
            sched.catch_up(anyio.current_time())  # 0.99 of the budget: one paused
            assert len(sched.paused) == 1
            done: list[str] = []

            async def call(sid: str) -> None:
                assert await _chat(http, url, sid, 1000) == 200
                done.append(sid)

            async with anyio.create_task_group() as tg:
                tg.start_soon(call, "new")
                await anyio.sleep(1.0)
                assert done == []  # queued behind the paused program
                started = anyio.current_time()
                # a running program's final request releases it; the next tick resumes
                running = next(pid for pid in ("a", "b", "c") if pid not in sched.paused)
                r = await http.post(
                    url + "/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
                    headers={"x-dynamo-session-id": running, "x-dynamo-session-final": "true"},
                )
                assert r.status_code == 200  # forwarded here (see the module docstring)
            assert done == ["new"]
            assert anyio.current_time() - started <= 6.0
        assert policy.held == 1 and sched.ended == 1 and sched.paused == {}


# --------------------------------------------------------------------------- llm-d flow


class FakeEngine:
    def __init__(self) -> None:
        self.num_waiting = 0
        self.running: list[Any] = []
        self.kv_usage = 0.0
        self.config = SimpleNamespace(block_size=BS)

    def scrape_every(self, interval_s: float) -> None:
        pass

    def scraped(self) -> tuple[int, int, float]:
        return self.num_waiting, len(self.running), self.kv_usage


_seq = iter(range(1_000_000))


def request(**headers: str) -> GatewayRequest:
    prompt = SimpleNamespace(runs=[("p", 0, 10)], num_tokens=160, num_full_blocks=10)
    hdr = {k.replace("_", "-"): v for k, v in headers.items()}
    return GatewayRequest(hdr, {}, b"{}", prompt, 0.0, next(_seq))  # type: ignore[arg-type]


def flow_views(n: int) -> tuple[list[ReplicaView], list[FakeEngine]]:
    engines = [FakeEngine() for _ in range(n)]
    vs = [ReplicaView(i, f"vllm-{i}", f"http://r{i}", e) for i, e in enumerate(engines)]  # type: ignore[arg-type]
    return vs, engines


def test_saturation_is_the_mean_of_each_pods_tighter_resource() -> None:
    p = LLMDFlow()
    vs, es = flow_views(2)
    p.bind(vs)
    es[0].num_waiting, es[0].kv_usage = 2, 0.72  # max(2/5, 0.72/0.8) = 0.9
    es[1].num_waiting, es[1].kv_usage = 6, 0.4  # max(6/5, 0.5) = 1.2
    assert p.saturation() == pytest.approx((0.9 + 1.2) / 2)
    es[1].num_waiting = 4  # max(0.8, 0.5)
    assert p.saturation() == pytest.approx((0.9 + 0.8) / 2)


async def test_flow_is_one_fcfs_queue_where_fairness_is_least_served_first() -> None:
    orders = {}
    for cls in (LLMDFlow, LLMDFairness):
        p = cls()
        vs, es = flow_views(1)
        p.bind(vs)
        p.done(request(x_llm_d_inference_fairness_id="a"), 0, 0.0)  # a has been served
        es[0].kv_usage = 0.9  # saturated: everything queues
        admitted: list[str] = []

        async def call(
            program: str, name: str, p: LLMDFairness = p, out: list[str] = admitted
        ) -> None:
            await p.admit(request(x_llm_d_inference_fairness_id=program))
            out.append(name)

        async with anyio.create_task_group() as tg:
            for program, name in [("a", "a1"), ("a", "a2"), ("b", "b1")]:
                tg.start_soon(call, program, name)
                await anyio.sleep(0.01)
            await anyio.sleep(1.0)
            assert admitted == []
            es[0].kv_usage = 0.0
        orders[cls] = p.dispatched_order
        assert p.stats()["held"] == 3
    assert orders[LLMDFlow] == ["a", "a", "b"]  # first come, first served
    assert orders[LLMDFairness] == ["b", "a", "a"]  # least attained service first


async def test_flow_sheds_a_request_past_its_queue_budget() -> None:
    p = LLMDFlow()
    assert p.request_ttl_s == 60.0
    vs, es = flow_views(1)
    p.bind(vs)
    es[0].kv_usage = 0.95
    from agentrt.sim._app import _HTTPError

    t0 = anyio.current_time()
    with pytest.raises(_HTTPError) as err:
        await p.admit(request())
    assert err.value.status == 429
    assert anyio.current_time() - t0 == pytest.approx(60.0)
    assert p.queues == {} and p.shed == 1
    es[0].kv_usage = 0.0
    with anyio.fail_after(0.001):
        await p.admit(request())


async def test_flow_end_to_end_answers_429_past_the_budget() -> None:
    """One replica whose KV a 300k-token prompt fills: the next request waits in flow
    control past 60 s and is shed; one that arrives after the pod drains goes through."""
    async with Cluster(1, "h100-8b", gateway="llm-d:flow") as c:
        policy = c.gateway.policy if c.gateway else None
        assert isinstance(policy, LLMDFlow)
        async with httpx.AsyncClient(transport=c.transport()) as http:
            url = c.gateway_url
            codes: list[int] = []

            async def long() -> None:
                r = await http.post(
                    url + "/chat/completions",
                    json={
                        "model": "m",
                        "messages": [{"role": "user", "content": "y" * 1_500_000}],
                        "max_tokens": 20_000,
                    },
                )
                codes.append(r.status_code)

            async with anyio.create_task_group() as tg:
                tg.start_soon(long)
                await anyio.sleep(100.0)  # its prefill is done: KV 0.88, decoding
                t0 = anyio.current_time()
                codes.append(await _chat(http, url, None, 100))
                assert codes == [429]  # the second waited 60 s behind the saturated pod
                assert anyio.current_time() - t0 == pytest.approx(60.0)
                assert policy.shed == 1
        assert codes == [429, 200]  # the first one finished


# --------------------------------------------------------------------------- a replay


def test_plain_session_replay_through_thunderagent_pauses_and_completes() -> None:
    """A closed-loop bench replay of the coding workload on 2 replicas whose KV the 16
    agents oversubscribe: the router sees every session as a program, pauses some and
    resumes them, and every job completes."""
    cfg = BenchConfig(
        workload="coding",
        jobs=16,
        users=16,
        clients=("plain:session>thunderagent", "plain>thunderagent"),
        replicas=2,
        gpu_blocks=16384,  # 262k tokens: every prompt fits, 16 agents do not
        stretch=False,
        api="http",
    )
    plans = prepare(cfg)
    run = replay_part(cfg, plans, 0)
    assert all(r.status == "ok" for r in run.results)
    peer = run.peer
    assert peer is not None
    assert peer["programs"] == sum(r.sessions for r in run.results)
    assert peer["pauses"] > 0 and peer["resumes"] > 0
    plain = replay_part(cfg, plans, 1)  # no session named: all passes through
    assert plain.peer is not None and plain.peer["programs"] == 0
