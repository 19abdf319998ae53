"""Clients behind a modelled peer (``CLIENT>PEER``): the spec, and what the gateway changes."""

from __future__ import annotations

import pytest

from agentrt.bench import BenchConfig, ClientSpec, run_bench
from agentrt.bench._runner import check_config


def test_spec_behind_a_peer_names_it_and_speaks_its_dialect() -> None:
    plain = ClientSpec.parse("plain>vllm-router")
    assert (plain.kind, plain.gateway, plain.name) == (
        "plain",
        "vllm-router:cache_aware",
        "plain>vllm-router:cache_aware",
    )
    agent = ClientSpec.parse("agentrt:defaults > vllm-router:consistent_hash")
    assert (agent.kind, agent.gateway, agent.dialect, agent.defaults) == (
        "agentrt",
        "vllm-router:consistent_hash",
        "vllm-router",
        True,
    )
    own = ClientSpec.parse("agentrt:session,dialect=vllm>vllm-router:round_robin")
    assert own.dialect == "vllm"
    assert ClientSpec.parse("agentrt:session").gateway is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("plain>", "CLIENT>PEER"),
        (">vllm-router", "CLIENT>PEER"),
        ("plain>nginx", "unknown gateway 'nginx'"),
        ("plain>vllm-router>llm-d", "CLIENT>PEER"),
        ("agentrt:nonsense>vllm-router", "nonsense"),
    ],
)
def test_bad_specs_behind_a_peer_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ClientSpec.parse(text)


def test_a_gateway_needs_the_embedded_cluster() -> None:
    cfg = BenchConfig(clients=("plain>vllm-router",), endpoints=("http://127.0.0.1:1/v1",))
    with pytest.raises(ValueError, match="embedded engine only"):
        check_config(cfg)


def test_round_robin_gateway_replays_exactly_as_a_plain_client() -> None:
    # The plain client round-robins per call over the replicas' URLs; the gateway's
    # round_robin does the same per request at one URL: same placements, same times.
    cfg = BenchConfig(
        workload="coding",
        jobs=6,
        replicas=3,
        clients=("plain", "plain>vllm-router:round_robin", "plain>vllm-router:cache_aware"),
        stretch=False,
        api="http",
    )
    res = run_bench(cfg)
    plain, rr, cache = res.clients
    assert rr.failed == plain.failed == cache.failed == 0
    assert rr.jct == plain.jct
    assert rr.prefix_cache_hit_rate == plain.prefix_cache_hit_rate
    # cache_aware keeps a conversation where its prefix went: more hits than round-robin.
    assert cache.prefix_cache_hit_rate is not None and plain.prefix_cache_hit_rate is not None
    assert cache.prefix_cache_hit_rate > plain.prefix_cache_hit_rate + 0.05


def test_agentrt_behind_sticky_least_loaded_finishes_its_sessions() -> None:
    # agentrt tells the router each session's end (vllm_router_session_ends), so the
    # router's per-worker session counts go back to zero; a plain client has no sessions.
    import anyio

    from agentrt.bench._clock import VirtualTimeLoop
    from agentrt.bench._drivers import Prompts, make_driver
    from agentrt.bench._runner import prepare
    from agentrt.sim import Cluster

    cfg = BenchConfig(workload="coding", jobs=3, replicas=2, stretch=False, api="http")
    plans = prepare(cfg)
    spec = ClientSpec.parse("agentrt:defaults>vllm-router:sticky_least_loaded")

    async def main() -> tuple[int, dict[int, int]]:
        async with Cluster(2, "h100-8b", gateway=spec.gateway) as cluster:
            driver = make_driver(
                spec, [cluster.gateway_url], cluster.transport(), "m", Prompts("sim"), False, "http"
            )
            async with driver:
                for plan in plans:
                    await driver.run_job(plan, anyio.current_time())
            assert cluster.gateway is not None
            policy = cluster.gateway.policy
            return sum(cluster.gateway.routed), dict(policy.counts)  # type: ignore[attr-defined]

    routed, counts = anyio.run(main, backend_options={"loop_factory": VirtualTimeLoop})
    assert routed > 3
    assert counts == {}
