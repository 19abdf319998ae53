"""Fleets for real: 8 OS processes, each its own ``Runtime`` with the defaults, on the 4
replicas of ``agentrt sim serve --replicas 4`` (issue 24).

The processes share nothing but the replicas' URLs (tests/integrations/_fleet.py): their
first turns must spread over the replicas, every session's turns stay on one replica, and
a session that another process continues under its caller-given id lands where its
first process left it, in the cache (docs/routing.md, "Fleets").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest

from agentrt import JobReport, Runtime
from agentrt.bench._clock import VirtualTimeLoop
from agentrt.scheduling._routing import EndpointLoad, _rendezvous
from agentrt.sim import PRESETS, Cluster
from tests.integrations import _gateway as gw
from tests.integrations._fleet import FleetRun, run_fleet

pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")
pytestmark = pytest.mark.timeout(180)

REPLICAS = 4
FLEET = 8
MODEL = "sim-llama-3.1-8b"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FleetRun, list[str]]]:
    folder = tmp_path_factory.mktemp("fleet")
    with gw.sim_replicas(folder, replicas=REPLICAS) as origin:
        urls = [f"{origin}/replica-{i}/v1" for i in range(REPLICAS)]
        # A name the server serves (sim_replicas chooses them; other names answer 404).
        model = httpx.get(f"{urls[0]}/models", timeout=10.0).json()["data"][0]["id"]
        yield run_fleet(urls, model, folder, fleet=FLEET), urls


def test_every_process_is_a_runtime_of_its_own(fleet: tuple[FleetRun, list[str]]) -> None:
    run, _ = fleet
    assert run.statuses and set(run.statuses) == {"ok"}
    per_worker: dict[int, set[str]] = {}
    for c in run.calls:
        per_worker.setdefault(c.worker, set())
    assert len(per_worker) == FLEET
    ids = {r["runtime_id"] for r in run.runtimes}
    assert len(ids) == FLEET, ids


def test_first_turns_spread_over_the_replicas(fleet: tuple[FleetRun, list[str]]) -> None:
    run, urls = fleet
    first = run.first_turns()
    assert set(first) <= set(urls)
    assert sum(first.values()) == FLEET * 3
    assert len(first) >= REPLICAS - 1, first
    # The very first call of each process (a generated id, every replica idle): random
    # ties per process, not all on replica 0.
    firsts = {c.endpoint for c in run.calls if c.job == "work" and c.turn == 0}
    assert len(firsts) > 1


def test_each_session_stays_on_one_replica(fleet: tuple[FleetRun, list[str]]) -> None:
    run, urls = fleet
    for sid, calls in run.sessions().items():
        assert len({c.endpoint for c in calls}) == 1, (sid, calls)
        # The replies' ids name the replica that wrote them: the same one every turn.
        writers = {
            r.removeprefix("chatcmpl-sim-replica-").split("-")[0] for r in run.reply_ids[sid]
        }
        assert writers == {str(urls.index(calls[0].endpoint or ""))}, (sid, run.reply_ids[sid])


def test_another_process_continues_a_session_where_its_cache_is(
    fleet: tuple[FleetRun, list[str]],
) -> None:
    run, _ = fleet
    continued = 0
    for sid, calls in run.sessions().items():
        later = [c for c in calls if c.job == "continue"]
        if not later:
            continue
        continued += 1
        before = [c for c in calls if c.job == "work"]
        assert {c.worker for c in later} == {(before[0].worker - 1) % FLEET}
        assert later[0].endpoint == before[0].endpoint
        # A hit as the runtime counts one (docs/routing.md, "Cache retention"): the
        # conversation so far was in the replica's prefix cache.
        assert later[0].cached_tokens >= before[-1].prompt_tokens // 2, (sid, calls)
    assert continued == FLEET * 2


def test_the_processes_see_the_engines_load(fleet: tuple[FleetRun, list[str]]) -> None:
    run, _ = fleet
    assert all(views == ["engine"] * REPLICAS for views in run.views), run.views
    # Each process's last job says so in its journal (a job that ends before every
    # endpoint's first poll, a random phase within the first second, says "mixed").
    last = {r["runtime_id"]: r["load_view"] for r in run.runtimes}
    assert len(last) == FLEET and set(last.values()) == {"engine"}, last
    assert {r["load_view"] for r in run.runtimes} <= {"engine", "mixed", "local"}


def _same_top(urls: list[str], count: int) -> list[str]:
    """``count`` caller-given ids whose rendezvous order starts at the same endpoint."""
    names, idle = [u.encode() for u in urls], [EndpointLoad() for _ in urls]
    by_top: dict[int, list[str]] = {}
    for i in range(100):
        sid = f"conversation-{i}"
        by_top.setdefault(_rendezvous(sid, names, idle)[0], []).append(sid)
    return next(ids[:count] for ids in by_top.values() if len(ids) >= count)


def test_a_busy_process_places_a_caller_given_id_where_an_idle_one_does() -> None:
    """Virtual time, two runtimes on one embedded cluster: A places conversation X while
    its own other session's call is in flight on X's first choice; B, idle, continues X."""
    placed: dict[str, Any] = {}

    async def turn(rt: Runtime, sid: str, max_tokens: int) -> JobReport:
        async with rt.job(sid) as job, job.session(session_id=sid) as s:
            content = f"{sid} " + "word " * 800
            await s.chat(
                model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=max_tokens
            )
        return job.report

    async def main() -> None:
        async with Cluster(REPLICAS, PRESETS["h100-8b"]) as cluster:
            other, x = _same_top(cluster.base_urls, 2)
            async with Runtime(cluster.base_urls, transport=cluster.transport()) as a:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(turn, a, other, 512)  # in flight while X is placed
                    await anyio.sleep(0.01)
                    placed["a"] = (await turn(a, x, 8)).call_reports[0].endpoint
            async with Runtime(cluster.base_urls, transport=cluster.transport()) as b:
                placed["b"] = (await turn(b, x, 8)).call_reports[0].endpoint

    anyio.run(main, backend_options={"loop_factory": VirtualTimeLoop})
    assert placed["a"] == placed["b"], placed
