"""The modelled vllm-router policies against the real vllm-router 0.1.17, end to end.

python -m benchmarks routing peers's workload (plain chat requests, three sessions of growing
histories with ``x-session-id``, a session keyed only by the body's ``user`` field), one
request at a time through the real router in front of ``agentrt sim serve`` replicas and
through the modelled gateway bound to the same worker URLs in the router's own worker
order: every request lands on the same replica, and the prefix-cache hit shares agree
within 3 points. About 10 s; skipped when ``scripts/engine_setup.sh`` has not installed
the router under ``.engine/router``.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from agentrt.testing.vllm_cpu import ROUTER_SETUP_MESSAGE, RouterSpec, find_router, start_router

pytestmark = [pytest.mark.engine, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]


def _benchmark() -> ModuleType:
    return importlib.import_module("benchmarks._peer_agreement")


@pytest.mark.parametrize("policy", ["consistent_hash", "sticky_least_loaded", "round_robin"])
def test_model_places_as_the_real_router(policy: str, tmp_path: Path) -> None:
    binary = find_router()
    if binary is None:
        pytest.skip(ROUTER_SETUP_MESSAGE)
    bench = _benchmark()
    args = SimpleNamespace(model="tiny-llama", max_tokens=2, preset="cpu-tiny")
    reqs = bench.workload(3, 3, 3)
    with bench.sim_serve(4, "cpu-tiny", tmp_path / "sim.log") as roots:
        router = start_router(
            RouterSpec(policy=policy, log_level="warning"), roots, binary=binary, log_dir=tmp_path
        )
        try:
            real = bench.run_real(router.url, roots, reqs, args)
        finally:
            router.stop()
    model = bench.run_model(f"vllm-router:{policy}", roots, real.order, reqs, args)
    assert -1 not in real.placed
    assert real.placed == model.placed, (roots, real.order)
    assert abs(real.hits / real.queries - model.hits / model.queries) <= 0.03
