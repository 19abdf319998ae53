"""The llm-d and Dynamo peers: each scorer on hand-made replicas, LAS order under
saturation, Dynamo's cost and affinity TTL, and an end-to-end run through the gateway in
virtual time."""

from __future__ import annotations

import base64
from types import SimpleNamespace
from typing import Any

import anyio
import httpx
import pytest

from agentrt.sim import Cluster
from agentrt.sim.peers import PEERS, GatewayRequest, ReplicaView, make_policy, peer_dialect
from agentrt.sim.peers._dynamo import Dynamo, DynamoAffinity
from agentrt.sim.peers._llmd import LLMD, LLMDAffinity, LLMDFairness, LLMDIdeal, fairness_id
from tests.sim._helpers import virtual_backend

pytestmark = pytest.mark.anyio

BS = 16


@pytest.fixture
def anyio_backend() -> Any:
    return virtual_backend()


class FakeKV:
    def __init__(self) -> None:
        self.used = 0
        self.capacity = 100
        self.hits: dict[str, tuple[int, int]] = {}
        """prompt tag -> (accelerator blocks, host blocks) cached"""

    def match(self, runs: list[tuple[Any, int, int]], max_blocks: int) -> Any:
        gpu, host = self.hits.get(runs[0][0], (0, 0)) if runs else (0, 0)
        return SimpleNamespace(gpu_blocks=gpu, host_blocks=host)


class FakeEngine:
    def __init__(self) -> None:
        self.kv = FakeKV()
        self.num_waiting = 0
        self.running: list[Any] = []
        self.config = SimpleNamespace(block_size=BS)
        self.scrape_s: float | None = None

    def scrape_every(self, interval_s: float) -> None:
        self.scrape_s = interval_s

    def scraped(self) -> tuple[int, int, float]:
        return self.num_waiting, len(self.running), self.kv.used / self.kv.capacity


def views(n: int) -> list[ReplicaView]:
    return [ReplicaView(i, f"vllm-{i}", f"http://r{i}", FakeEngine()) for i in range(n)]  # type: ignore[arg-type]


def engine(v: ReplicaView) -> FakeEngine:
    e = v.engine
    assert isinstance(e, FakeEngine)
    return e


_seq = iter(range(1_000_000))


def request(tag: str = "p", tokens: int = 160, **headers: str) -> GatewayRequest:
    prompt = SimpleNamespace(
        runs=[(tag, 0, tokens // BS)], num_tokens=tokens, num_full_blocks=tokens // BS
    )
    hdr = {k.replace("_", "-"): v for k, v in headers.items()}
    return GatewayRequest(hdr, {}, b"{}", prompt, 0.0, next(_seq))  # type: ignore[arg-type]


def token(name: str) -> str:
    return base64.b64encode(f"default/{name}".encode()).decode()


# --------------------------------------------------------------------------- registry


def test_registered_with_their_dialects() -> None:
    for name, cls in [
        ("llm-d", LLMD),
        ("llm-d:ideal", LLMDIdeal),
        ("llm-d:fairness", LLMDFairness),
        ("dynamo", Dynamo),
        ("dynamo:affinity", DynamoAffinity),
    ]:
        assert PEERS[name] is cls
        assert type(make_policy(name)) is cls
    assert peer_dialect("llm-d:fairness") == "llm-d"
    assert peer_dialect("dynamo:affinity") == "dynamo"


# --------------------------------------------------------------------------- llm-d scorers


def test_llmd_prefix_decides_at_equal_load() -> None:
    p = LLMDIdeal()
    vs = views(3)
    p.bind(vs)
    engine(vs[2]).kv.hits["p"] = (8, 0)
    engine(vs[1]).kv.hits["p"] = (2, 0)
    req = request("p", 160)
    assert p.pick(req, 0.0) == 2
    # precise prefix (2 x 8/10), kv (1 x 1.0), queue (1 x 1.0: all queues equal)
    assert p.scores(req) == pytest.approx([2.0, 2.0 + 2 * 0.2, 2.0 + 2 * 0.8])


def test_llmd_real_information_by_default() -> None:
    from agentrt.bench import ClientSpec

    assert ClientSpec.parse("plain>llm-d:ideal").gateway == "llm-d:ideal"
    assert ClientSpec.parse("agentrt:defaults>llm-d:ideal").dialect == "llm-d"
    real, ideal = LLMD(), LLMDIdeal()
    assert (real.metrics_interval_s, real.index_block_tokens) == (0.05, 64)
    assert real.kv_event_lag_s is not None and real.kv_event_lag_s > 0
    assert (ideal.metrics_interval_s, ideal.kv_event_lag_s, ideal.index_block_tokens) == (
        None,
        None,
        None,
    )
    vs, ws = views(2), views(2)
    real.bind(vs)
    ideal.bind(ws)
    assert [engine(v).scrape_s for v in vs] == [0.05, 0.05]
    assert [engine(w).scrape_s for w in ws] == [None, None]
    # 64-token index blocks: 3 engine blocks (48 tokens) of a 160-token prompt are no full
    # index block (0 of 2); the ideal index counts 3 of 10 engine blocks
    for v in (vs[0], ws[0]):
        engine(v).kv.hits["p"] = (3, 0)
    req = request("p", 160)
    assert real.prefix_score(req, 0, 0.0) == 0.0
    assert ideal.prefix_score(req, 0, 0.0) == pytest.approx(0.3)
    engine(vs[0]).kv.hits["p"] = (9, 0)  # 144 tokens: 2 of 2 index blocks
    assert real.prefix_score(req, 0, 0.0) == 1.0


def test_llmd_kv_events_arrive_late() -> None:
    p = LLMD(kv_event_lag_s=0.5)
    vs = views(2)
    p.bind(vs)
    first = request("s", 640)
    where = p.pick(first, 0.0)
    engine(vs[where]).kv.hits["s"] = (40, 0)  # its prefill stored the prompt's blocks
    nxt = request("s", 640)
    assert p.prefix_score(nxt, where, 1.0) == 0.0  # prefill not ended: not indexed
    p.started(first, where, 2.0)
    assert p.prefix_score(nxt, where, 2.4) == 0.0  # events still in flight
    assert p.prefix_score(nxt, where, 2.5) == 1.0
    # another conversation's prompt is not held back by this one's events
    q = request("t", 640)
    p.pick(q, 3.0)
    engine(vs[where]).kv.hits["s"] = (40, 0)
    assert p.prefix_score(request("s", 640), where, 3.0) == 1.0


def test_llmd_load_decides_without_a_prefix() -> None:
    p = LLMD()
    vs = views(3)
    p.bind(vs)
    engine(vs[0]).num_waiting = 4
    engine(vs[1]).num_waiting = 2
    engine(vs[2]).num_waiting = 4
    assert p.pick(request("q"), 0.0) == 1
    engine(vs[1]).num_waiting = 4
    engine(vs[0]).kv.used = 90
    engine(vs[1]).kv.used = 50
    engine(vs[2]).kv.used = 10
    assert p.pick(request("q"), 0.0) == 2


def test_llmd_prefix_outweighs_one_loaded_pod() -> None:
    p = LLMDIdeal()
    vs = views(2)
    p.bind(vs)
    engine(vs[0]).kv.hits["p"] = (10, 0)
    engine(vs[0]).num_waiting = 3
    engine(vs[0]).kv.used = 50
    req = request("p", 160)
    # r0: 2 x 1.0 + 0.5 + 0 = 2.5; r1: 0 + 1.0 + 1.0 = 2.0
    assert p.scores(req) == pytest.approx([2.5, 2.0])
    assert p.pick(req, 0.0) == 0
    engine(vs[0]).kv.used = 100
    engine(vs[0]).kv.hits["p"] = (4, 0)  # r0: 2 x 0.4 + 0 + 0 = 0.8 < r1's 2.0
    assert p.pick(req, 0.0) == 1


def test_llmd_as_its_guide_ignores_the_session_token() -> None:
    p = LLMD()
    vs = views(3)
    p.bind(vs)
    req = request("s", x_session_token=token("vllm-2"))
    assert p.scores(req) == pytest.approx([2.0, 2.0, 2.0])
    assert p.reply_headers(req, 1) == [(b"x-session-token", token("vllm-1").encode())]


def test_llmd_session_token_pins_softly() -> None:
    p = LLMDAffinity()
    assert p.name == "llm-d:affinity" and make_policy("llm-d:affinity").session_weight == 1.0
    vs = views(3)
    p.bind(vs)
    assert p.reply_headers(request(), 2) == [(b"x-session-token", token("vllm-2").encode())]
    assert base64.b64decode(p.token(1)) == b"default/vllm-1"
    req = request("s", x_session_token=token("vllm-2"))
    assert p.pick(req, 0.0) == 2
    assert p.scores(req)[2] - p.scores(req)[0] == pytest.approx(1.0)
    # a stronger prefix elsewhere (2 x 1.0 > 1.0) wins: the scorer is soft
    engine(vs[0]).kv.hits["s"] = (10, 0)
    assert p.pick(req, 0.0) == 0
    # a token naming no pod, or not base64, scores nothing
    for bad in ("bm8tc3VjaC1wb2Q=", "***"):
        assert p.scores(request("t", x_session_token=bad)) == pytest.approx([2.0, 2.0, 2.0])


def test_llmd_fairness_id_resolution() -> None:
    assert fairness_id(request(x_llm_d_inference_fairness_id="p1", session_id="c")) == "p1"
    assert fairness_id(request(x_gateway_inference_fairness_id="old")) == "old"
    assert fairness_id(request(x_claude_code_session_id="cc", session_id="codex")) == "cc"
    assert fairness_id(request(x_session_affinity="oc")) == "oc"
    assert fairness_id(request(session_id="codex")) == "codex"
    assert fairness_id(request(x_session_id="not-read")) == "default-flow"


# --------------------------------------------------------------------------- llm-d flow control


async def test_fairness_passes_through_below_saturation() -> None:
    p = LLMDFairness()
    vs = views(2)
    p.bind(vs)
    engine(vs[0]).num_waiting = 4  # saturation (4/5 + 0) / 2 = 0.4
    assert p.saturation() == pytest.approx(0.4)
    with anyio.fail_after(0.001):
        await p.admit(request(x_llm_d_inference_fairness_id="a"))
    assert p.queues == {}
    assert p.dispatched_order == ["a"]


async def test_fairness_dispatches_least_attained_service_first() -> None:
    p = LLMDFairness()
    vs = views(2)
    p.bind(vs)
    # program "a" has been served (a 10k-token prompt); "b" not at all
    p.done(request("x", 10_000, x_llm_d_inference_fairness_id="a"), 0, anyio.current_time())
    for v in vs:
        engine(v).num_waiting = 5  # saturation 1.0: everything queues
    assert p.saturation() == pytest.approx(1.0)
    admitted: list[str] = []

    async def call(program: str, name: str) -> None:
        await p.admit(request(x_llm_d_inference_fairness_id=program))
        admitted.append(name)

    async with anyio.create_task_group() as tg:
        for program, name in [("a", "a1"), ("a", "a2"), ("b", "b1")]:
            tg.start_soon(call, program, name)
            await anyio.wait_all_tasks_blocked()
        await anyio.sleep(1.0)  # dispatch cycles tick, but the pool stays saturated
        assert admitted == []
        assert [len(q) for q in p.queues.values()] == [2, 1]
        for v in vs:
            engine(v).num_waiting = 0
        # the next cycle (within 50 ms) releases all three, the least served program first
    assert sorted(admitted) == ["a1", "a2", "b1"]
    assert p.dispatched_order == ["b", "a", "a"]
    assert p.queues == {}


async def test_fairness_releases_one_per_freed_slot() -> None:
    p = LLMDFairness()
    vs = views(1)
    p.bind(vs)
    engine(vs[0]).num_waiting = 5  # five of the gateway's requests wait there
    vs[0].inflight = 5
    admitted: list[int] = []

    async def call(i: int) -> None:
        await p.admit(request(x_llm_d_inference_fairness_id=f"p{i}"))
        vs[0].inflight += 1  # as the gateway does when it routes the request
        admitted.append(i)

    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(call, i)
            await anyio.wait_all_tasks_blocked()
        engine(vs[0]).num_waiting = 4  # one starts running: room for one more
        engine(vs[0]).running = [SimpleNamespace(first_token_time=None)]
        await anyio.sleep(0.2)  # the released one counts as queued (in transit)
        assert len(admitted) == 1
        engine(vs[0]).num_waiting = 0  # all done: the pool drains
        engine(vs[0]).running = []
        vs[0].inflight = 0
    assert sorted(admitted) == [0, 1, 2]


async def test_fairness_cancelled_waiter_leaves_the_queue() -> None:
    p = LLMDFairness()
    vs = views(1)
    p.bind(vs)
    engine(vs[0]).num_waiting = 5
    with anyio.move_on_after(0.3):
        await p.admit(request(x_llm_d_inference_fairness_id="gone"))
    assert p.queues == {}
    engine(vs[0]).num_waiting = 0
    with anyio.fail_after(0.001):
        await p.admit(request(x_llm_d_inference_fairness_id="next"))


def test_las_service_decays_with_half_life() -> None:
    p = LLMDFairness()
    p.bind(views(1))
    p.done(request("x", 1000, x_llm_d_inference_fairness_id="a"), 0, 10.0)
    assert p.service("a", 10.0) == pytest.approx(1000)
    assert p.service("a", 70.0) == pytest.approx(500)
    assert p.service("a", 130.0) == pytest.approx(250)


# --------------------------------------------------------------------------- Dynamo


def test_dynamo_cost_is_prefill_after_overlap_plus_decode_blocks() -> None:
    d = Dynamo()
    vs = views(3)
    d.bind(vs)
    engine(vs[0]).kv.hits["p"] = (8, 0)
    engine(vs[1]).kv.hits["p"] = (0, 4)  # host tier: credited at 0.75
    req = request("p", 160)  # 10 blocks
    assert d.costs(req) == pytest.approx([2 + 10, 10 - 3 + 10, 10 + 10])
    assert d.pick(req, 0.0) == 0


def test_dynamo_active_blocks_push_away_and_free_on_done() -> None:
    d = Dynamo()
    vs = views(2)
    d.bind(vs)
    engine(vs[0]).kv.hits["p"] = (8, 0)
    engine(vs[0]).kv.hits["big"] = (100, 0)
    big = request("big", 1600)
    assert d.pick(big, 0.0) == 0  # fully cached there: no prefill, 100 active blocks
    req = request("p", 160)
    assert d.costs(req) == pytest.approx([2 + 10 + 100, 20])
    assert d.pick(req, 0.0) == 1
    d.done(req, 1, 1.0)
    d.done(big, 0, 1.0)
    assert d.pick(request("p", 160), 2.0) == 0


def test_dynamo_prompt_load_lasts_until_first_token() -> None:
    d = Dynamo()
    vs = views(2)
    d.bind(vs)
    engine(vs[1]).kv.hits["z"] = (2, 0)
    z = request("z", 320)  # 20 blocks, 2 cached on r1
    assert d.pick(z, 0.0) == 1
    engine(vs[1]).num_waiting = 1  # the engine has it queued
    assert d.prefill_tokens(1) == 320 - 2 * BS
    engine(vs[1]).num_waiting = 0
    engine(vs[1]).running = [SimpleNamespace(first_token_time=None)]
    assert d.prefill_tokens(1) == 320 - 2 * BS
    engine(vs[1]).running = [SimpleNamespace(first_token_time=0.5)]
    assert d.prefill_tokens(1) == 0


def test_dynamo_ignores_the_session_without_affinity() -> None:
    d = Dynamo()
    vs = views(2)
    d.bind(vs)
    engine(vs[0]).kv.hits["p"] = (10, 0)
    assert d.pick(request("p", x_dynamo_session_id="s"), 0.0) == 0
    engine(vs[0]).kv.hits.clear()
    engine(vs[1]).kv.hits["p"] = (10, 0)
    assert d.pick(request("p", x_dynamo_session_id="s"), 1.0) == 1
    assert d.bindings == {}


def test_dynamo_affinity_binds_until_idle_ttl() -> None:
    d = DynamoAffinity(session_affinity_ttl_s=10.0)
    vs = views(2)
    d.bind(vs)
    engine(vs[0]).kv.hits["p"] = (10, 0)
    first = request("p", x_dynamo_session_id="s")
    assert d.pick(first, 0.0) == 0
    engine(vs[0]).kv.hits.clear()
    engine(vs[1]).kv.hits["p"] = (10, 0)  # r1 is now much cheaper
    second = request("p", x_dynamo_session_id="s")
    assert d.pick(second, 1.0) == 0  # hard affinity
    d.done(first, 0, 2.0)
    assert d.bound_worker("s", 100.0) == 0  # a request in flight keeps it alive
    d.done(second, 0, 5.0)  # idle from t=5
    assert d.bound_worker("s", 14.9) == 0
    other = request("p", x_dynamo_session_id="other")
    assert d.pick(other, 14.9) == 1  # unbound: by cost
    d.done(other, 1, 14.95)
    third = request("p", x_dynamo_session_id="s")
    assert d.pick(third, 15.0) == 1  # expired: rebound by cost
    assert d.bindings["s"].worker == 1


def test_dynamo_affinity_ttl_must_be_positive() -> None:
    with pytest.raises(ValueError, match="session_affinity_ttl_s"):
        Dynamo(session_affinity_ttl_s=0)


# --------------------------------------------------------------------------- end to end


async def _sessions(cluster: Cluster, n: int, turns: int) -> dict[int, list[str | None]]:
    tokens: dict[int, list[str | None]] = {s: [] for s in range(n)}
    async with httpx.AsyncClient(transport=cluster.transport()) as http:

        async def session(s: int) -> None:
            msgs = [{"role": "user", "content": f"session {s} " + "x" * 8000}]
            tok: str | None = None
            for _ in range(turns):
                headers = {
                    "x-dynamo-session-id": f"s{s}",
                    "x-llm-d-inference-fairness-id": f"prog{s % 2}",
                }
                if tok:
                    headers["x-session-token"] = tok
                r = await http.post(
                    cluster.gateway_url + "/chat/completions",
                    json={"model": "m", "messages": msgs, "max_tokens": 8},
                    headers=headers,
                )
                assert r.status_code == 200, r.text
                tok = r.headers.get("x-session-token")
                tokens[s].append(tok)
                msgs.append(
                    {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]}
                )
                msgs.append({"role": "user", "content": "more " * 200})

        async with anyio.create_task_group() as tg:
            for s in range(n):
                tg.start_soon(session, s)
    return tokens


@pytest.mark.parametrize("gateway", ["llm-d", "llm-d:fairness"])
async def test_llmd_end_to_end(gateway: str) -> None:
    async with Cluster(4, "h100-8b", gateway=gateway) as c:
        tokens = await _sessions(c, 6, 3)
        gw = c.gateway
        names = {f"default/{v.name}" for v in gw.views}
        assert sum(gw.routed) == 18
        assert all(v.inflight == 0 for v in gw.views)
        for toks in tokens.values():
            assert all(t is not None and base64.b64decode(t).decode() in names for t in toks)
            assert len(set(toks)) == 1  # prefix and token keep a session on its pod
        assert len({toks[0] for toks in tokens.values()}) > 1  # sessions spread out
        if gateway == "llm-d:fairness":
            assert isinstance(gw.policy, LLMDFairness)
            assert len(gw.policy.dispatched_order) == 18
            assert set(gw.policy.dispatched_order) == {"prog0", "prog1"}


@pytest.mark.parametrize("gateway", ["dynamo", "dynamo:affinity"])
async def test_dynamo_end_to_end(gateway: str) -> None:
    async with Cluster(4, "h100-8b", gateway=gateway) as c:
        tokens = await _sessions(c, 6, 3)
        gw = c.gateway
        assert sum(gw.routed) == 18
        assert all(v.inflight == 0 for v in gw.views)
        assert all(t is None for toks in tokens.values() for t in toks)  # no llm-d token
        policy = gw.policy
        assert isinstance(policy, Dynamo)
        assert all(not active for active in policy._active)
        assert sum(policy._active_blocks) == 0
        if gateway == "dynamo:affinity":
            assert set(policy.bindings) == {f"s{s}" for s in range(6)}
            assert all(b.active == 0 for b in policy.bindings.values())
            assert len({b.worker for b in policy.bindings.values()}) > 1
        else:
            assert policy.bindings == {}


async def test_llmd_fairness_queues_when_the_pod_saturates() -> None:
    """20k-token prompts fill one replica's KV past 80 %: flow control holds the rest and
    releases them all as the pod drains."""
    async with Cluster(1, "h100-8b", gateway="llm-d:fairness") as c:
        policy = c.gateway.policy
        assert isinstance(policy, LLMDFairness)
        async with httpx.AsyncClient(transport=c.transport()) as http:

            async def one(s: int) -> None:
                r = await http.post(
                    c.gateway_url + "/chat/completions",
                    json={
                        "model": "m",
                        "messages": [{"role": "user", "content": f"s{s} " + "y" * 80_000}],
                        "max_tokens": 32,
                    },
                    headers={"x-llm-d-inference-fairness-id": f"p{s % 3}"},
                )
                assert r.status_code == 200, r.text

            async with anyio.create_task_group() as tg:
                for s in range(24):
                    tg.start_soon(one, s)
        assert policy.peak_waiting > 5
        assert len(policy.dispatched_order) == 24
        assert policy.queues == {}
        assert policy._released == 0


async def test_engine_scraped_metrics_are_the_last_polls() -> None:
    from agentrt.sim import PRESETS
    from agentrt.sim._engine import Engine

    e = Engine(PRESETS["h100-8b"])
    assert e.scraped() == (0, 0, 0.0)  # without polls: live
    e.scrape_every(0.05)
    t0 = anyio.current_time()
    base = (int(t0 / 0.05) + 1) * 0.05
    await anyio.sleep_until(base + 0.01)
    prompt = e.tokenizer.completion("x" * 4000)
    e.submit(prompt, 8, request_id="a")
    assert e.num_waiting == 1
    assert e.scraped()[0] == 0  # the poll at `base` saw an empty queue
    await anyio.sleep_until(base + 0.04)
    e.submit(prompt, 8, request_id="b")
    assert e.scraped()[0] == 0
    await anyio.sleep_until(base + 0.05)
    assert e.scraped()[0] == 2  # the next poll sees both
    await anyio.sleep_until(base + 0.07)
    e.submit(prompt, 8, request_id="c")
    assert e.scraped()[0] == 2  # unchanged since the poll at base + 0.05
    await anyio.sleep_until(base + 0.26)
    assert e.scraped()[0] == 3


async def test_transport_reads_an_engine_as_its_metrics_page_says() -> None:
    from agentrt.scheduling._signals import parse_vllm_metrics
    from agentrt.sim._app import render_metrics

    async with Cluster(2, "h100-8b") as c:
        t = c.transport()
        engine = c.replicas[0].engine
        page_url = c.base_urls[0].removesuffix("/v1") + "/metrics"
        prompt = engine.tokenizer.completion("y" * 40_000)
        for i in range(40):
            engine.submit(prompt, 64, request_id=f"r{i}")
        await anyio.sleep(0.2)
        got = t.engine_reading(page_url)
        assert got is not None and got[0] > 0 and got[1] > 0 and got[2] > 0
        page = parse_vllm_metrics(render_metrics(engine))
        assert got == (page.running, page.waiting, page.kv_usage)
        assert t.engine_reading(c.base_urls[0] + "/metrics") is None  # /v1/metrics: 404
        assert t.engine_reading("http://elsewhere/metrics") is None
