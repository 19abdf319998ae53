"""Fixtures that run tests against real vLLM CPU replicas (see docs/engines.md).

Fixtures (each hands out live replicas; the pool behind them is session-scoped):

- ``vllm_engine`` -> ReplicaServer: FCFS, prefix caching, prompt token details, KV events on ZMQ,
  forced tool choice (hermes tool-call parser).
- ``vllm_priority_engine`` -> ReplicaServer: ``--scheduling-policy priority``, ``--max-num-seqs 1``.
- ``vllm_pair`` -> list[ReplicaServer]: two replicas, 64 KV blocks (8192 tokens) each, worker of
  replica i bound to core i.
- ``engine_pool`` -> EnginePool: ``acquire(key, specs)`` for other set-ups,
  ``private(specs)`` for replicas a test may kill.
- ``vllm_env`` -> EngineEnv: the engine's python and model.

Replicas start when a test first asks for them and stay up for later tests; at most
``MAX_ALIVE`` run at once (RAM and cores), so asking for another set-up stops the least recently
used one. Engine tests are reordered to group those that share a set-up, and get a longer
timeout (startup counts against the test that triggers it).

Without the engine the tests skip with the setup command, except under ``CI=true``, where a
missing engine fails them.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from agentrt.testing.vllm_cpu import (
    SETUP_MESSAGE,
    EngineEnv,
    ReplicaServer,
    ReplicaSpec,
    find_engine,
    launch,
    start_replicas,
)

MAX_ALIVE = 2
READY_TIMEOUT_S = 300.0
ENGINE_TEST_TIMEOUT_S = 2 * READY_TIMEOUT_S

# Each replica's worker gets a core of its own: two workers on one core stall each other, and a
# worker spread over both cores starves the API server and the engine core (see docs/engines.md).
ENGINE_SPEC = ReplicaSpec(
    name="engine",
    prefix_caching=True,
    prompt_tokens_details=True,
    per_request_metrics=True,
    kv_events=True,
    kv_cache_space_gib=1,
    cpu_bind="0",
    # Forced tool choice (tool_choice="required" or a named tool) needs a tool-call parser:
    # the framework adapters' engine tests make the random-weight model call a tool.
    extra_args=("--enable-auto-tool-choice", "--tool-call-parser", "hermes"),
)
PRIORITY_SPEC = ReplicaSpec(
    name="priority",
    priority_scheduling=True,
    max_num_seqs=1,  # one request at a time, so the waiting queue's order shows
    max_model_len=8192,  # room for a long request that holds the slot
    per_request_metrics=True,
    kv_cache_space_gib=1,
    cpu_bind="1",
)
PAIR_BLOCKS = 64
PAIR_SPECS = (
    ReplicaSpec(name="pair-0", num_gpu_blocks=PAIR_BLOCKS, kv_cache_space_gib=1, cpu_bind="0"),
    ReplicaSpec(name="pair-1", num_gpu_blocks=PAIR_BLOCKS, kv_cache_space_gib=1, cpu_bind="1"),
)

# Fixtures in the order their tests run, so that each set-up starts once.
_ENGINE_FIXTURES = ("vllm_engine", "vllm_priority_engine", "vllm_pair", "engine_pool")


class EnginePool:
    """Live replica sets by key, at most ``max_alive`` replicas in all."""

    def __init__(self, engine: EngineEnv, log_dir: Path, max_alive: int = MAX_ALIVE) -> None:
        self.engine = engine
        self.log_dir = log_dir
        self.max_alive = max_alive
        self._live: OrderedDict[str, tuple[tuple[ReplicaSpec, ...], list[ReplicaServer]]] = (
            OrderedDict()
        )
        self._private = 0

    def alive(self) -> int:
        return self._private + sum(len(rs) for _, rs in self._live.values())

    def _make_room(self, needed: int) -> None:
        if needed > self.max_alive:
            raise ValueError(f"{needed} replicas asked for, at most {self.max_alive} at once")
        while self._live and self.alive() + needed > self.max_alive:
            _, (_, replicas) = self._live.popitem(last=False)
            for r in replicas:
                r.stop()
        if self.alive() + needed > self.max_alive:
            raise RuntimeError("too many private replicas alive")

    def acquire(
        self, key: str, specs: Sequence[ReplicaSpec], *, alone: bool = False
    ) -> list[ReplicaServer]:
        """The replicas for ``key``, started (or restarted, if one died) as needed.

        ``alone``: every other pooled replica is stopped first (a timing test: on 2 cores
        idle replicas' engine loops busy-poll and starve a replica's API server)."""
        specs = tuple(specs)
        if alone:
            for other in [k for k in self._live if k != key]:
                _, replicas = self._live.pop(other)
                for r in replicas:
                    r.stop()
        entry = self._live.get(key)
        if entry is not None:
            old_specs, replicas = entry
            if old_specs == specs and all(r.is_alive() for r in replicas):
                self._live.move_to_end(key)
                return replicas
            del self._live[key]
            for r in replicas:
                r.stop()
        self._make_room(len(specs))
        replicas = start_replicas(
            specs, engine=self.engine, log_dir=self.log_dir, ready_timeout=READY_TIMEOUT_S
        )
        self._live[key] = (specs, replicas)
        return replicas

    @contextlib.contextmanager
    def private(self, specs: Sequence[ReplicaSpec]) -> Iterator[list[ReplicaServer]]:
        """Replicas for one test only (it may kill them); stopped when the block ends."""
        self._make_room(len(specs))
        self._private += len(specs)
        try:
            with launch(
                specs, engine=self.engine, log_dir=self.log_dir, ready_timeout=READY_TIMEOUT_S
            ) as replicas:
                yield replicas
        finally:
            self._private -= len(specs)

    def close(self) -> None:
        while self._live:
            _, (_, replicas) = self._live.popitem(last=False)
            for r in replicas:
                r.stop()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    slots: list[int] = []
    for i, item in enumerate(items):
        if item.get_closest_marker("engine") is None or here not in Path(item.path).parents:
            continue
        slots.append(i)
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(ENGINE_TEST_TIMEOUT_S))

    def rank(item: pytest.Item) -> int:
        names = getattr(item, "fixturenames", ())
        for n, fixture in enumerate(_ENGINE_FIXTURES):
            if fixture in names:
                return n
        return len(_ENGINE_FIXTURES)

    ordered = sorted((items[i] for i in slots), key=rank)
    for i, item in zip(slots, ordered, strict=True):
        items[i] = item


@pytest.fixture(scope="session")
def vllm_env() -> EngineEnv:
    engine = find_engine()
    if engine is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {SETUP_MESSAGE}", pytrace=False)
        pytest.skip(SETUP_MESSAGE)
    return engine


@pytest.fixture(scope="session")
def engine_pool(
    vllm_env: EngineEnv, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EnginePool]:
    pool = EnginePool(vllm_env, tmp_path_factory.mktemp("vllm-logs"))
    atexit.register(pool.close)  # in case the session dies before its teardown
    try:
        yield pool
    finally:
        pool.close()
        atexit.unregister(pool.close)


@pytest.fixture
def vllm_engine(engine_pool: EnginePool) -> ReplicaServer:
    return engine_pool.acquire("engine", [ENGINE_SPEC])[0]


@pytest.fixture
def vllm_priority_engine(engine_pool: EnginePool) -> ReplicaServer:
    return engine_pool.acquire("priority", [PRIORITY_SPEC], alone=True)[0]


@pytest.fixture
def vllm_pair(engine_pool: EnginePool) -> list[ReplicaServer]:
    return engine_pool.acquire("pair", PAIR_SPECS)
