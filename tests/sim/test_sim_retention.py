"""Retention directives in the embedded engine: the eviction order of a replica that
honours them (ended sessions first, then plain LRU, then the session that wakes latest),
its cost per eviction, and the engine reading them from the request."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from agentrt.sim import EngineConfig
from agentrt.sim._kv import ENDED, GPU, QUEUED, KVCache, Node
from tests.sim._kv_steps import cache_sequence, seq, try_request


def idle_sessions(kv: KVCache, names: str, blocks: int = 10) -> dict[str, Node]:
    """Sessions of ``blocks`` blocks each, used at t = 0, 1, 2, ... in order, idle since."""
    nodes = {}
    for t, ns in enumerate(names):
        nodes[ns] = cache_sequence(kv, seq(ns, 0, blocks), ns, float(t))
        kv.release(nodes[ns], 0, float(t))
    return nodes


def directive(kv: KVCache, node: Node, until: float) -> None:
    top, _ = kv.own_tail(node, node.session)
    assert top is not None
    kv.hint_resume(node, top, until)


def cached(kv: KVCache, ns: str, blocks: int = 10) -> int:
    return kv.match(seq(ns, 0, blocks), 1000).blocks


def test_ended_first_then_lru_then_the_latest_wake() -> None:
    """Five idle sessions, least recently used first: a, b, c, d, e. "d" ended; "a" wakes
    at 50, "c" at 500; "b" and "e" said nothing. Plain LRU would evict a, b, c, d, e."""
    kv = KVCache(50, 0, False, directives=True)
    nodes = idle_sessions(kv, "abcde")
    kv.expire_pins(10.0)
    directive(kv, nodes["a"], 50.0)
    directive(kv, nodes["c"], 500.0)
    directive(kv, nodes["d"], ENDED)
    order = []
    for _ in range(5):
        assert kv.allocate(10)
        gone = [ns for ns in "abcde" if ns not in order and cached(kv, ns) == 0]
        assert len(gone) == 1, gone
        order += gone
        kv.check()
    assert order == ["d", "b", "e", "c", "a"]


def test_a_session_whose_request_waits_goes_last() -> None:
    """A queued request's session woke: its blocks go after every retained one."""
    kv = KVCache(30, 0, False, directives=True)
    nodes = idle_sessions(kv, "abc")
    kv.expire_pins(3.0)
    directive(kv, nodes["a"], QUEUED)
    directive(kv, nodes["b"], 100.0)
    directive(kv, nodes["c"], 50.0)
    assert kv.allocate(20)
    assert (cached(kv, "a"), cached(kv, "b"), cached(kv, "c")) == (10, 0, 0)
    assert kv.allocate(5)
    assert cached(kv, "a") == 5
    kv.check()


def test_a_retention_that_ran_out_falls_back_to_lru() -> None:
    """ "a" was retained until 20 and did not come back by 30: it is LRU again, aged from
    20 (when it was expected), so "b" (used at 1, no directive) goes first, then "a";
    "c" is still retained."""
    kv = KVCache(30, 0, False, directives=True)
    nodes = idle_sessions(kv, "abc")
    kv.expire_pins(5.0)
    directive(kv, nodes["a"], 20.0)
    directive(kv, nodes["c"], 100.0)
    kv.expire_pins(30.0)
    assert kv.allocate(10)
    assert (cached(kv, "a"), cached(kv, "b"), cached(kv, "c")) == (10, 0, 10)
    assert kv.allocate(10)
    assert (cached(kv, "a"), cached(kv, "c")) == (0, 10)
    kv.check()


def test_partial_eviction_trims_the_latest_waker_and_keeps_its_place() -> None:
    kv = KVCache(30, 0, False, directives=True)
    nodes = idle_sessions(kv, "abc")
    kv.expire_pins(3.0)
    for ns, until in (("a", 40.0), ("b", 90.0), ("c", 60.0)):
        directive(kv, nodes[ns], until)
    assert kv.allocate(4)
    assert (cached(kv, "a"), cached(kv, "b"), cached(kv, "c")) == (10, 6, 10)
    assert kv.allocate(8)  # the rest of "b", then 2 of "c"
    assert (cached(kv, "a"), cached(kv, "b"), cached(kv, "c")) == (10, 0, 8)
    kv.check()


def test_a_session_that_comes_back_clears_its_directive() -> None:
    """A resumed session's blocks are referenced again (not evictable); released, they are
    plain LRU until its next directive, not "ended" any more."""
    kv = KVCache(30, 0, False, directives=True)
    nodes = idle_sessions(kv, "abc")
    kv.expire_pins(3.0)
    directive(kv, nodes["a"], ENDED)
    again = cache_sequence(kv, seq("a", 0, 12), "a", 4.0)  # "a" is back: 2 blocks more
    assert kv.allocate(6)  # only b and c can go: b (LRU), 2 + 6 of its blocks
    assert (cached(kv, "a", 12), cached(kv, "b"), cached(kv, "c")) == (12, 2, 10)
    kv.release(again, 0, 5.0)
    assert kv.allocate(10)  # the rest of b, then c: "a" is the most recent, not "ended"
    assert cached(kv, "a", 12) == 12
    assert (cached(kv, "b"), cached(kv, "c")) == (0, 2)
    kv.check()


def test_shared_prefix_is_not_part_of_an_ended_session() -> None:
    """Only the session's own tail is marked: the system prompt it shares stays cached
    while other sessions' tails go (leaves first)."""
    kv = KVCache(40, 0, False, directives=True)
    nodes = {}
    for t, ns in enumerate("ab"):
        runs = seq("sys", 0, 8) + seq(ns, 0, 8)
        nodes[ns] = cache_sequence(kv, runs, ns, float(t))
        kv.release(nodes[ns], 0, float(t))
    kv.expire_pins(3.0)
    directive(kv, nodes["b"], ENDED)
    top, blocks = kv.own_tail(nodes["b"], "b")
    assert top is not None and blocks == 8
    assert kv.allocate(40 - 24)  # free already
    assert kv.allocate(8)  # b's own 8 go first, though a is older
    assert kv.match(seq("sys", 0, 8) + seq("a", 0, 8), 100).blocks == 16
    assert kv.match(seq("sys", 0, 8) + seq("b", 0, 8), 100).blocks == 8
    kv.check()


def test_without_directives_the_same_hints_do_not_change_lru() -> None:
    """The switch: a replica that does not honour directives is plain LRU (resume hints
    are only given with ``directives`` or the ``resume`` policy)."""
    kv = KVCache(30, 0, False)
    idle_sessions(kv, "abc")
    kv.expire_pins(3.0)
    assert kv.allocate(10)
    assert (cached(kv, "a"), cached(kv, "b"), cached(kv, "c")) == (0, 10, 10)


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["req", "req", "alloc", "end", "retain", "tick", "pin"]),
            st.integers(0, 5),
            st.integers(1, 12),
        ),
        max_size=40,
    ),
    host=st.sampled_from([0, 8]),
)
def test_counters_stay_consistent_with_directives(
    ops: list[tuple[str, int, int]], host: int
) -> None:
    kv = KVCache(24, host, True, directives=True)
    now = 0.0
    held: list[tuple[Node, int]] = []
    for op, who, n in ops:
        now += 1.0 if op != "tick" else n
        kv.expire_pins(now)
        if op == "req":
            got = try_request(kv, who, n, now)
            if got is not None:
                held.append(got)
        elif op == "alloc" and kv.allocate(n % 4):
            kv.private -= n % 4
        elif op == "pin" and held:
            node, private = held.pop(who % len(held))
            kv.pin_path(node, now + n)
            kv.release(node, private, now)
        elif op in ("end", "retain") and held:
            node, private = held.pop(who % len(held))
            kv.release(node, private, now)
            top, _ = kv.own_tail(node, node.session)
            if top is not None:
                kv.hint_resume(node, top, ENDED if op == "end" else now + n)
        kv.check()
        for node, _ in held:
            assert node.alive and node.tier == GPU and node.refcount > 0
    for node, private in held:
        kv.release(node, private, now)
    kv.check()


def test_eviction_cost_does_not_grow_with_the_retained_sessions() -> None:
    """Heaps, not scans: evicting through 20,000 idle sessions (a third ended, a third
    retained, a third without a directive) costs about what 2,000 do, per eviction."""

    def per_eviction(sessions: int) -> float:
        kv = KVCache(sessions * 2, 0, False, directives=True)
        for i in range(sessions):
            node = cache_sequence(kv, seq(f"s{i}", 0, 2), f"s{i}", float(i))
            kv.release(node, 0, float(i))
            if i % 3:
                top, _ = kv.own_tail(node, f"s{i}")
                assert top is not None
                kv.hint_resume(node, top, ENDED if i % 3 == 1 else 1e6 + i)
        kv.expire_pins(float(sessions))
        t0 = time.perf_counter()
        for _ in range(sessions):
            assert kv.allocate(2)
        return (time.perf_counter() - t0) / sessions

    # Interleaved, the best of five each: a busy machine slows both sizes alike.
    rounds = [(per_eviction(2_000), per_eviction(20_000)) for _ in range(5)]
    small = min(r[0] for r in rounds)
    large = min(r[1] for r in rounds)
    assert large < 3 * small, (small, large)


def test_config_switch_and_its_conflict() -> None:
    assert EngineConfig().retention_directives is False
    assert EngineConfig(retention_directives=True).retention_directives is True
    try:
        EngineConfig(retention_directives=True, tool_wait_policy="resume")
    except ValueError as exc:
        assert "resume" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("retention_directives with resume must be refused")
