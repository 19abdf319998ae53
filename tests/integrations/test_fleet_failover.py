"""A caller-given session id whose replica is down fails over alike in every process
(issue 35, item 2): 8 real OS processes, each its own ``Runtime`` with the defaults, on
the 4 replicas of ``agentrt sim serve --replicas 4`` and one dead URL (nothing listens
there). The process that discovers the dead replica and those that already knew it send
an agreed id to the same next replica in its rendezvous order: no conversation splits
(with failover as a least-loaded move, 11 of 40 did)."""

from __future__ import annotations

from collections import defaultdict

import httpx
import pytest

from agentrt.scheduling._routing import EndpointLoad, _rendezvous
from tests.integrations import _gateway as gw
from tests.integrations._fleet import run_fleet

pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")
pytestmark = pytest.mark.timeout(300)

REPLICAS = 4
FLEET = 8


def test_failover_of_an_agreed_id_follows_the_agreed_order(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    folder = tmp_path_factory.mktemp("failover")
    dead = f"http://127.0.0.1:{gw.free_port()}/v1"
    with gw.sim_replicas(folder, replicas=REPLICAS) as origin:
        live = [f"{origin}/replica-{i}/v1" for i in range(REPLICAS)]
        model = httpx.get(f"{live[0]}/models", timeout=10.0).json()["data"][0]["id"]
        urls = [*live, dead]
        run = run_fleet(
            urls, model, folder, fleet=FLEET, jobs=6, turns=2, more_turns=2, words=60, tool_s=0.02
        )
    assert run.statuses and set(run.statuses) == {"ok"}
    where: dict[str, set[str]] = defaultdict(set)
    for c in run.calls:
        if c.session_id.startswith("fleet-"):  # caller-given: shared by two processes
            assert c.endpoint is not None
            where[c.session_id].add(c.endpoint)
    assert len(where) == FLEET * 5
    names, idle = [u.encode() for u in urls], [EndpointLoad() for _ in urls]
    on_dead = [sid for sid in where if urls[_rendezvous(sid, names, idle)[0]] == dead]
    assert on_dead, "no id had the dead replica first: the check could not fail"
    split = {sid: sorted(eps) for sid, eps in where.items() if len(eps) > 1}
    assert not split, f"{len(split)} of {len(where)} conversations split: {split}"
    # Each id that had the dead replica first went to the next in its agreed order.
    for sid in on_dead:
        order = [urls[i] for i in _rendezvous(sid, names, idle)]
        assert where[sid] == {order[1]}, (sid, where[sid], order)
