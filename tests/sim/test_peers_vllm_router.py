"""The vllm-router peers (agentrt.sim.peers._vllm_router) on hand-made replica views:
round robin's order, consistent_hash's ring and keys, cache_aware's threshold, imbalance
switch and tree eviction, sticky_least_loaded's sessions and tie-breaks, and fbi_hash.

The placements marked "measured" are what the real vllm-router 0.1.17 did in front of
``agentrt sim serve`` replicas at those worker URLs (python -m benchmarks routing peers,
results/peer_agreement.json): the ring and rendezvous hashes depend on the URL strings,
so the model must reproduce them exactly."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentrt.sim._tokenize import Tokenizer
from agentrt.sim.peers import GatewayRequest, ReplicaView, make_policy
from agentrt.sim.peers._fbi import fbi_hash, murmur_hash_64a
from agentrt.sim.peers._vllm_router import (
    CacheAware,
    ConsistentHash,
    PeerRoundRobin,
    StickyLeastLoaded,
    hash_key,
    routing_text,
    session_key,
)

BS = 16
TOK = Tokenizer(BS)


def views(urls: list[str], order: list[int] | None = None) -> list[ReplicaView]:
    """Views of replicas at ``urls`` (index = position), listed in ``order``."""
    out = [ReplicaView(i, f"replica-{i}", u, None) for i, u in enumerate(urls)]  # type: ignore[arg-type]
    return [out[i] for i in order] if order is not None else out


def urls(port: int, n: int = 4) -> list[str]:
    return [f"http://127.0.0.1:{port}/replica-{i}" for i in range(n)]


_seq = iter(range(1_000_000))


def chat(text: str, *, session: str | None = None, **body: Any) -> GatewayRequest:
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": text}]
    doc = {"model": "m", "messages": messages, **body}
    hdr = {} if session is None else {"x-session-id": session}
    raw = json.dumps(doc).encode()
    return GatewayRequest(hdr, doc, raw, TOK.chat(messages), 0.0, next(_seq))


def completion(prompt: str) -> GatewayRequest:
    doc = {"model": "m", "prompt": prompt}
    return GatewayRequest({}, doc, json.dumps(doc).encode(), TOK.completion(prompt), 0.0, 0)


# -- round_robin ---------------------------------------------------------------------------


def test_round_robin_walks_the_bound_order() -> None:
    p = PeerRoundRobin()
    p.bind(views(urls(1), order=[2, 3, 0, 1]))  # the router's registry order
    assert [p.pick(chat("x"), 0.0) for _ in range(6)] == [2, 3, 0, 1, 2, 3]


# -- consistent_hash -----------------------------------------------------------------------


def test_consistent_hash_places_sessions_as_the_real_router() -> None:
    # measured: 0.1.17 at these URLs (worker order [1, 2, 3, 0]; the ring ignores it)
    p = ConsistentHash()
    p.bind(views(urls(38993), order=[1, 2, 3, 0]))
    got = [p.pick(chat("t", session=f"agent-session-{s}"), 0.0) for s in range(3)]
    assert got == [1, 0, 3]
    assert p.pick(chat("plain"), 0.0) == 3  # key "request:"


def test_consistent_hash_is_stable_and_spreads_sessions() -> None:
    p = ConsistentHash()
    p.bind(views(urls(8000)))
    first = {s: p.pick(chat("a", session=f"s{s}"), 0.0) for s in range(40)}
    again = {s: p.pick(chat("longer history " * 20, session=f"s{s}"), 0.0) for s in range(40)}
    assert first == again
    assert len(set(first.values())) == 4


def test_consistent_hash_falls_back_to_the_routing_text() -> None:
    # 0.1.17: a chat request's routing text is empty, so a plain chat client's requests
    # (and a chat body's ``user`` field) all hash as "request:" (measured).
    assert hash_key(chat("anything")) == "request:"
    assert hash_key(chat("anything", user="alice")) == "request:"
    assert session_key(chat("anything", user="alice")) is None
    assert hash_key(chat("x", session="s-1")) == "header:x-session-id:s-1"
    # a text completion's routing text is its prompt (measured: "request:hello" and a
    # request_hash for a long one); fields are searched in that text
    assert routing_text(completion("hello")) == "hello"
    assert hash_key(completion("hello")) == "request:hello"
    long = "hello " * 40
    assert hash_key(completion(long)) == f"request_hash:{fbi_hash(long):016x}"
    assert hash_key(completion('{"user": "bob", "q": 1}')) == "user:bob"
    assert hash_key(completion("session_id: abc, more")) == "session:abc"
    assert hash_key(completion('{"session_params": {"session_id": "n1"}}')) == "session:n1"
    p = ConsistentHash()
    p.bind(views(urls(8000)))
    assert len({p.pick(chat(f"question {i}"), 0.0) for i in range(20)}) == 1


# -- cache_aware ---------------------------------------------------------------------------


def test_cache_aware_threshold_follows_the_longest_match() -> None:
    p = CacheAware(block_size=BS)
    vs = views(urls(1, 3))
    p.bind(vs)
    shared = "the shared part of a long history " * 20
    assert p.pick(chat(shared), 0.0) == 0  # no match: least loaded, first on ties
    vs[0].inflight = 5  # balanced still (5 - 0 <= 64)
    assert p.pick(chat(shared + " one more turn"), 1.0) == 0  # match rate > 0.3
    assert p.pick(chat("something else entirely " * 20), 2.0) == 1  # no match: least loaded
    # a short shared system prompt under a long new turn: rate <= 0.3, least loaded
    vs[1].inflight = 5
    assert p.pick(chat(shared[:40] + " unrelated " * 200), 3.0) == 2


def test_cache_aware_imbalance_switches_to_least_loaded() -> None:
    p = CacheAware(block_size=BS)
    vs = views(urls(1, 2))
    p.bind(vs)
    text = "cached history " * 40
    assert p.pick(chat(text), 0.0) == 0
    vs[0].inflight, vs[1].inflight = 100, 10  # 90 > 64 and 100 > 1.5 * 10
    assert p.pick(chat(text), 1.0) == 1
    # 30 <= 64: balanced, the match wins: the tree learnt worker 1 in the imbalanced
    # pick too, and the tenant that touched the deepest node last takes it
    vs[0].inflight, vs[1].inflight = 100, 70
    assert p.pick(chat(text), 2.0) == 1
    assert p.pick(chat("unrelated " * 40), 3.0) == 1  # no match: least loaded


def test_cache_aware_eviction_drops_a_tenants_old_leaves() -> None:
    p = CacheAware(block_size=BS, max_tree_size=4 * BS * 8, eviction_interval_s=10.0)
    vs = views(urls(1, 2))
    p.bind(vs)
    old, new = "an old history " * 60, "a new history " * 60
    assert p.pick(chat(old), 1.0) == 0
    assert p.pick(chat(new), 2.0) == 0  # ties: the first worker
    assert p.tree.size[0] > 8
    vs[0].inflight = 1
    # the next pick past the interval evicts worker 0 down to 8 blocks, oldest first
    assert p.pick(chat(old), 20.0) == 1  # old is gone from worker 0's tree
    assert p.tree.size[0] <= 8 + len(chat(old).prompt.runs)


# -- sticky_least_loaded -------------------------------------------------------------------


def test_sticky_least_loaded_as_the_real_router() -> None:
    # measured: 0.1.17 at these URLs, worker order [0, 3, 2, 1]
    p = StickyLeastLoaded()
    p.bind(views(urls(36401), order=[0, 3, 2, 1]))
    assert p.pick(chat("q0"), 0.0) == 3  # stateless, all tied: rendezvous on ":{url}"
    assert p.pick(chat("q1"), 0.0) == 3  # not recorded: the same tie again
    got = [p.pick(chat("t", session=f"agent-session-{s}"), 0.0) for s in range(3)]
    assert got == [3, 0, 1]
    assert p.pick(chat("q2"), 0.0) == 2  # the only worker without a session
    assert p.pick(chat("t2", session="agent-session-0"), 1.0) == 3  # sticky


def test_sticky_least_loaded_fewest_sessions_and_finish() -> None:
    p = StickyLeastLoaded()
    p.bind(views(urls(8000, 2)))
    a = p.pick(chat("x", session="a"), 0.0)
    b = p.pick(chat("x", session="b"), 0.0)
    assert {a, b} == {0, 1}
    assert p.counts == {0: 1, 1: 1}
    assert p.control("/finish_session", {"session_id": "a"}, {}) == (
        200,
        {"status": "ok", "session_id": "a"},
    )
    assert p.counts == {b: 1}
    assert p.pick(chat("x", session="c"), 0.0) == a  # the freed worker
    assert p.control("/finish_session", {}, {})[0] == 400  # type: ignore[index]
    assert p.control("/other", {}, {}) is None


def test_sticky_least_loaded_tie_break_is_rendezvous_on_the_session() -> None:
    vs = views(urls(8000))
    for sid in ("s-1", "s-2", "s-3"):
        p = StickyLeastLoaded()
        p.bind(vs)
        best = max(range(4), key=lambda i: fbi_hash(f"{sid}:{vs[i].url}"))
        assert p.pick(chat("x", session=sid), 0.0) == best


def test_sticky_least_loaded_expires_untouched_sessions() -> None:
    p = StickyLeastLoaded(expiration_s=100.0, sweep_interval_s=10.0)
    p.bind(views(urls(8000, 2)))
    p.pick(chat("x", session="a"), 0.0)
    p.pick(chat("x", session="b"), 50.0)
    p.pick(chat("x"), 120.0)  # sweeps: a (untouched 120 s) expires, b stays
    assert set(p.sessions) == {"b"}


# -- fbi_hash ------------------------------------------------------------------------------


def test_fbi_hash_pinned_values() -> None:
    # Pinned from this implementation, which the measured placements above validate
    # against the real router (a change here moves every ring point).
    assert murmur_hash_64a(b"") == 0x4D408DE62DEE109A
    assert murmur_hash_64a(b"hello world") == 0x4903639D3AE98D4B
    assert fbi_hash("request:") == 0x13B2F1AE12A8B5AB
    assert fbi_hash("header:x-session-id:agent-session-0") == 0x566649A00E0EA98B
    assert fbi_hash("http://127.0.0.1:38993/replica-0:0") == 0xB084F8EF5EF1B524


def test_make_policy_names() -> None:
    assert isinstance(make_policy("vllm-router"), CacheAware)
    assert isinstance(make_policy("vllm-router:sticky_least_loaded"), StickyLeastLoaded)
    with pytest.raises(ValueError, match="known"):
        make_policy("vllm-router:nope")
