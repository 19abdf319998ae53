"""The KV cache on its own: prefix matching, LRU eviction, pins, host tier, session policies."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agentrt.sim._kv import GPU, HOST, QUEUED, KVCache, Node
from tests.sim._kv_steps import cache_sequence, seq, try_request


def test_match_counts_shared_prefix_and_splits_on_admit() -> None:
    kv = KVCache(100, 0, False)
    a = seq("x", 0, 10)
    node = cache_sequence(kv, a, "s1", 0.0)
    kv.release(node, 0, 1.0)
    kv.check()
    b = seq("x", 0, 6) + seq("y", 0, 4)
    m = kv.match(b, 100)
    assert (m.blocks, m.gpu_blocks, m.host_blocks) == (6, 6, 0)
    assert m.partial is node and m.partial_blocks == 6
    deepest, _ = kv.admit(m, 4, "s2", 2.0)
    assert deepest.length == 6 and deepest.refcount == 1 and node.refcount == 0
    kv.check()
    kv.release(deepest, 4, 3.0)
    kv.check()
    assert kv.match(a, 100).blocks == 10  # the split changed nothing for a


def test_lru_evicts_least_recently_used_tail_first() -> None:
    kv = KVCache(30, 0, False)
    nodes = {}
    for t, ns in enumerate(["a", "b", "c"]):
        nodes[ns] = cache_sequence(kv, seq(ns, 0, 10), ns, float(t))
        kv.release(nodes[ns], 0, float(t))
    assert kv.free == 0 and kv.evictable == 30
    assert kv.allocate(4)  # evicts the last 4 blocks of "a", the least recently used
    assert kv.match(seq("a", 0, 10), 100).blocks == 6
    assert kv.match(seq("b", 0, 10), 100).blocks == 10
    kv.check()
    # touching "a" makes "b" the oldest
    n = cache_sequence(kv, seq("a", 0, 6), "a", 10.0)
    kv.release(n, 0, 10.0)
    assert kv.allocate(3)
    assert kv.match(seq("b", 0, 10), 100).blocks == 7
    assert kv.match(seq("a", 0, 10), 100).blocks == 6
    kv.check()


def test_referenced_and_pinned_blocks_are_not_evicted() -> None:
    kv = KVCache(20, 0, False)
    held = cache_sequence(kv, seq("a", 0, 10), "a", 0.0)
    pinned = cache_sequence(kv, seq("b", 0, 10), "b", 0.0)
    kv.pin_path(pinned, 5.0)
    kv.release(pinned, 0, 1.0)
    assert kv.evictable == 0
    assert not kv.allocate(1)
    assert kv.expire_pins(4.0) == 5.0
    assert not kv.allocate(1)
    assert kv.expire_pins(5.0) is None
    assert kv.evictable == 10
    assert kv.allocate(10)
    assert kv.match(seq("b", 0, 10), 100).blocks == 0
    assert kv.match(seq("a", 0, 10), 100).blocks == 10
    kv.release(held, 10, 6.0)
    kv.check()


def test_host_tier_takes_evicted_blocks_and_loads_them_back() -> None:
    kv = KVCache(10, 20, False)
    a = cache_sequence(kv, seq("a", 0, 10), "a", 0.0)
    kv.release(a, 0, 0.0)
    b = cache_sequence(kv, seq("b", 0, 10), "b", 1.0)  # evicts all of a to the host
    kv.check()
    assert kv.host_used == 10 and kv.offloaded_blocks == 10
    m = kv.match(seq("a", 0, 10), 100)
    assert (m.gpu_blocks, m.host_blocks) == (0, 10)
    assert not kv.can_admit(m, 0)  # b holds every GPU block
    kv.release(b, 0, 2.0)
    assert kv.can_admit(m, 0)
    deepest, loaded = kv.admit(m, 0, "a", 3.0)
    assert loaded == 10 and deepest.tier == GPU
    kv.check()
    assert kv.host_used == 10  # b went to the host in turn
    kv.release(deepest, 0, 4.0)
    kv.check()


def test_partial_eviction_to_host_keeps_the_tree_consistent() -> None:
    kv = KVCache(10, 4, False)
    a = cache_sequence(kv, seq("a", 0, 10), "a", 0.0)
    kv.release(a, 0, 0.0)
    assert kv.allocate(3)
    kv.check()
    m = kv.match(seq("a", 0, 10), 100)
    assert (m.gpu_blocks, m.host_blocks) == (7, 3)
    assert kv.allocate(4)  # 4 more: the host (4 blocks) overflows and drops its oldest
    kv.check()
    assert kv.host_used <= 4


def test_drop_and_offload_session_spare_shared_blocks() -> None:
    kv = KVCache(100, 50, True)
    shared = seq("sys", 0, 5)
    s1 = cache_sequence(kv, shared + seq("s1", 0, 5), "s1", 0.0)
    s2 = cache_sequence(kv, shared + seq("s2", 0, 5), "s2", 0.0)
    kv.release(s1, 0, 1.0)
    kv.release(s2, 0, 1.0)
    assert kv.drop_session("s1") == 5
    assert kv.match(shared + seq("s1", 0, 5), 100).blocks == 5
    assert kv.match(shared + seq("s2", 0, 5), 100).blocks == 10
    assert kv.offload_session("s2") == 5
    m = kv.match(shared + seq("s2", 0, 5), 100)
    assert (m.gpu_blocks, m.host_blocks) == (5, 5)
    kv.check()


def test_extending_a_session_node_keeps_one_node_per_conversation() -> None:
    kv = KVCache(100, 0, False)
    n1 = cache_sequence(kv, seq("s", 0, 5), "s", 0.0)
    kv.release(n1, 0, 1.0)
    n2 = cache_sequence(kv, seq("s", 0, 9), "s", 2.0)
    assert n2 is n1 and n1.length == 9 and len(n1.runs) == 1
    kv.release(n2, 0, 3.0)
    kv.check()


def test_offload_tail_pins_on_the_host_and_prefetch_brings_it_back() -> None:
    kv = KVCache(30, 20, True)
    shared = seq("sys", 0, 5)
    s1 = cache_sequence(kv, shared + seq("s1", 0, 10), "s1", 0.0)
    s2 = cache_sequence(kv, shared + seq("s2", 0, 5), "s2", 0.0)
    kv.release(s1, 0, 1.0)
    kv.release(s2, 0, 1.0)
    top, blocks = kv.own_tail(s1, "s1")
    assert top is s1 and blocks == 10  # the shared system prompt is not s1's own
    assert kv.host_room_for(10) and not kv.host_room_for(21)
    assert kv.offload_tail(s1, top, until=50.0) == 10
    assert (kv.host_used, kv.host_pinned) == (10, 10) and not kv.host_room_for(11)
    kv.check()
    # filling the accelerator spills s2 to the host, never the pinned s1 blocks
    assert kv.allocate(25)
    assert kv.host_pinned == 10 and kv.match(shared + seq("s1", 0, 10), 100).host_blocks == 10
    kv.private -= 25
    kv.check()
    # the prefetch is a transfer of 10 blocks at 0.5 s each, after the link is free
    kv.link_free = 12.0
    assert kv.prefetch(s1, start=10.0, block_s=0.5, until=50.0) == 10
    m = kv.match(shared + seq("s1", 0, 10), 100)
    assert (m.gpu_blocks, m.host_blocks, m.ready_at) == (15, 0, 17.0)
    assert kv.prefetches == 1 and kv.prefetched_blocks == 10 and kv.host_pinned == 0
    assert kv.prefetch(s1, start=20.0, block_s=0.5, until=50.0) == 0  # nothing left on the host
    kv.check()
    # pinned until 50 on the accelerator; a request using it makes the prefetch useful
    assert kv.expire_pins(49.0) == 50.0
    deepest, loaded = kv.admit(kv.match(shared + seq("s1", 0, 10), 100), 0, "s1", 49.0)
    assert loaded == 0 and kv.prefetches_useful == 1
    kv.release(deepest, 0, 49.0)
    kv.expire_pins(50.0)
    kv.check()


def offloaded(kv: KVCache) -> tuple[Node, Node]:
    """Session s1's 10 blocks, offloaded (pinned on the host until 5.0): (deepest, top)."""
    s1 = cache_sequence(kv, seq("s1", 0, 10), "s1", 0.0)
    kv.release(s1, 0, 0.0)
    top, _ = kv.own_tail(s1, "s1")
    assert top is not None
    assert kv.offload_tail(s1, top, until=5.0) == 10
    return s1, top


def test_an_unused_prefetch_evicted_again_is_wasted_and_no_room_says_so() -> None:
    kv = KVCache(20, 20, True)
    s1, _ = offloaded(kv)
    held = cache_sequence(kv, seq("x", 0, 15), "x", 1.0)  # 15 of 20 blocks referenced
    assert kv.prefetch(s1, 2.0, 0.1, 5.0) == -1 and kv.prefetches_skipped == 0  # no room
    kv.release(held, 0, 2.0)
    assert kv.prefetch(s1, 2.0, 0.1, 5.0) == 10
    kv.expire_pins(6.0)
    assert kv.allocate(20)  # evicts the prefetched blocks before any request used them
    assert kv.prefetches_wasted == 1 and kv.prefetches_useful == 0
    kv.private -= 20
    kv.check()


def test_drop_tail_frees_both_tiers() -> None:
    kv = KVCache(20, 20, True)
    _, top = offloaded(kv)
    assert kv.drop_tail(top) == 10 and kv.host_used == kv.host_pinned == 0
    assert kv.drop_tail(top) == 0
    kv.check()


def test_yield_pins_unpins_the_earliest_ending_pins_and_parents_last() -> None:
    kv = KVCache(30, 0, True)
    shared = seq("sys", 0, 5)
    a = cache_sequence(kv, shared + seq("a", 0, 5), "a", 0.0)
    b = cache_sequence(kv, shared + seq("b", 0, 5), "b", 0.0)
    kv.pin_path(a, 5.0)
    kv.pin_path(b, 9.0)
    kv.release(a, 0, 0.0)
    kv.release(b, 0, 0.0)
    assert kv.available() == 15
    assert kv.yield_pins(20) and kv.yielded_blocks == 5  # a's pin ends first
    assert not a.pinned and b.pinned and kv.available() == 20
    kv.check()
    assert kv.yield_pins(30) and kv.available() == 30  # b, then the shared node
    kv.check()


def test_yield_pins_never_unpins_a_parent_before_its_child() -> None:
    kv = KVCache(30, 0, True)
    a = cache_sequence(kv, seq("sys", 0, 5) + seq("a", 0, 5), "a", 0.0)
    b = cache_sequence(kv, seq("sys", 0, 5) + seq("b", 0, 5), "b", 0.0)  # sys: a node
    kv.release(b, 0, 0.0)
    kv.pin_path(a, 5.0)
    kv.release(a, 0, 0.0)
    assert kv.yield_pins(25) and not a.pinned  # only a
    kv.pin_path(a, 5.0)  # re-pinned: the shared node's entry is pushed again, after a's
    assert a.parent is not None and a.parent.pin_seq > a.pin_seq
    assert kv.yield_pins(25) and not a.pinned and a.parent.pinned  # a first
    kv.check()
    assert kv.yield_pins(30) and kv.available() == 30
    kv.check()


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(
                [
                    *("req", "req", "alloc", "pin", "drop", "offload", "tail", "fetch"),
                    *("yield", "tick", "hint"),
                ]
            ),
            st.integers(0, 4),
            st.integers(1, 12),
        ),
        max_size=40,
    ),
    host=st.sampled_from([0, 8]),
)
def test_counters_stay_consistent(ops: list[tuple[str, int, int]], host: int) -> None:
    """Random admissions, releases, allocations, pins and policies keep every counter exact."""
    kv = KVCache(24, host, True)
    now = 0.0
    held: list[tuple[Node, int]] = []
    tails: list[Node] = []
    for op, who, n in ops:
        now += 1.0
        kv.expire_pins(now)
        if op == "fetch" and tails:
            kv.prefetch(tails.pop(who % len(tails)), now, 0.25, now + n)
        if op == "req":
            got = try_request(kv, who, n, now)
            if got is not None:
                held.append(got)
        elif op == "alloc" and kv.allocate(n % 4):
            kv.private -= n % 4
        elif op == "yield":
            kv.yield_pins(n)
        elif op == "pin" and held:
            node, private = held.pop(who % len(held))
            kv.pin_path(node, now + n)
            kv.release(node, private, now)
        elif op == "tail" and held:
            node, private = held.pop(who % len(held))
            kv.release(node, private, now)
            top, blocks = kv.own_tail(node, node.session)
            if top is not None and n % 2:
                kv.drop_tail(top)
            elif top is not None and host and kv.host_room_for(blocks):
                kv.offload_tail(node, top, now + n)
                tails.append(node)
        elif op == "hint" and held:
            node, private = held.pop(who % len(held))
            kv.release(node, private, now)
            top, _ = kv.own_tail(node, node.session)
            if top is not None:
                kv.hint_resume(node, top, QUEUED if n == 12 else now + n - 3)
        elif op in ("drop", "offload") and held:
            node, private = held.pop(who % len(held))
            kv.release(node, private, now)
            if op == "drop":
                kv.drop_session(node.session)
            elif host:
                kv.offload_session(node.session)
        kv.check()
        for node, _ in held:
            assert node.alive and node.tier == GPU and node.refcount > 0
    for node, private in held:
        kv.release(node, private, now)
    kv.check()
    assert kv.private == 0
    assert all(n.tier in (GPU, HOST) for n in kv.root.children.values())


def three_idle_sessions(kv: KVCache) -> dict[str, Node]:
    """Sessions a, b, c of 10 blocks each, used at t = 0, 1, 2 and all idle since."""
    nodes = {}
    for t, ns in enumerate(["a", "b", "c"]):
        nodes[ns] = cache_sequence(kv, seq(ns, 0, 10), ns, float(t))
        kv.release(nodes[ns], 0, float(t))
    return nodes


def test_hinted_eviction_keeps_the_session_resuming_soon() -> None:
    kv = KVCache(30, 0, False)
    nodes = three_idle_sessions(kv)
    kv.expire_pins(3.0)
    # "a" (least recently used) resumes at 4, "c" at 100, "b" declared nothing (its job
    # ended): LRU would evict "a" first
    for ns, resume in (("a", 4.0), ("c", 100.0)):
        top, _ = kv.own_tail(nodes[ns], ns)
        assert top is not None
        kv.hint_resume(nodes[ns], top, resume)
    assert kv.allocate(12)
    assert kv.match(seq("b", 0, 10), 100).blocks == 0
    assert kv.match(seq("c", 0, 10), 100).blocks == 8
    assert kv.match(seq("a", 0, 10), 100).blocks == 10
    kv.check()
    assert kv.allocate(9)
    assert kv.match(seq("c", 0, 10), 100).blocks == 0
    assert kv.match(seq("a", 0, 10), 100).blocks == 9
    kv.check()


def test_a_late_declared_session_is_aged_from_its_resume_time() -> None:
    kv = KVCache(30, 0, False)
    nodes = three_idle_sessions(kv)
    for ns, resume in (("a", 40.0), ("b", 10.0), ("c", 100.0)):
        top, _ = kv.own_tail(nodes[ns], ns)
        assert top is not None
        kv.hint_resume(nodes[ns], top, resume)
    kv.expire_pins(50.0)  # "b" is 40 s late, "a" 10 s late; "c" back in 50 s
    assert kv.allocate(10)
    assert kv.match(seq("c", 0, 10), 100).blocks == 0  # 50 s ahead > 40 s late
    assert kv.allocate(10)
    assert kv.match(seq("b", 0, 10), 100).blocks == 0  # the older lateness
    assert kv.match(seq("a", 0, 10), 100).blocks == 10
    kv.check()


def test_hints_past_due_fall_back_to_age_and_queued_sessions_go_last() -> None:
    kv = KVCache(30, 0, False)
    nodes = three_idle_sessions(kv)
    top, _ = kv.own_tail(nodes["c"], "c")
    assert top is not None
    kv.hint_resume(nodes["c"], top, 5.0)
    top, _ = kv.own_tail(nodes["a"], "a")
    assert top is not None
    kv.hint_resume(nodes["a"], top, QUEUED)
    kv.expire_pins(50.0)  # "c" is 45 s late: aged from its resume time, after "b"
    assert kv.allocate(12)
    assert kv.match(seq("b", 0, 10), 100).blocks == 0
    assert kv.match(seq("c", 0, 10), 100).blocks == 8
    assert kv.match(seq("a", 0, 10), 100).blocks == 10  # queued: last
    kv.check()
    assert kv.allocate(9)
    assert kv.match(seq("a", 0, 10), 100).blocks == 9
    kv.check()
    # A request admitted on "a" clears the hint.
    m = kv.match(seq("a", 0, 9), 100)
    deepest, _ = kv.admit(m, 0, "a", 60.0)
    assert deepest.resume_at == 0.0
    kv.release(deepest, 0, 60.0)
    kv.check()


def test_hinted_eviction_spills_the_latest_resume_to_the_host_first() -> None:
    kv = KVCache(30, 30, False)
    nodes = three_idle_sessions(kv)
    kv.expire_pins(3.0)
    for ns, resume in (("a", 10.0), ("b", 200.0), ("c", 50.0)):
        top, _ = kv.own_tail(nodes[ns], ns)
        assert top is not None
        kv.hint_resume(nodes[ns], top, resume)
    assert kv.allocate(15)
    assert nodes["b"].tier == HOST and nodes["c"].tier == GPU
    m = kv.match(seq("c", 0, 10), 100)
    assert (m.gpu_blocks, m.host_blocks) == (5, 5)
    assert kv.match(seq("a", 0, 10), 100).gpu_blocks == 10
    kv.check()
