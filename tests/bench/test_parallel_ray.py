"""Parallel replays on Ray (the ray extra): a local Ray instance gives the results of one by
one. scripts/test.sh installs the extra in the main environment, where this runs."""

from __future__ import annotations

import dataclasses

import pytest

from agentrt.bench import BenchResult, run_study
from tests.bench.test_parallel import comparable, grid

ray = pytest.importorskip(
    "ray", reason="the ray extra is not installed (scripts/test.sh installs it)"
)


def test_ray_gives_the_results_of_one_by_one() -> None:
    failing = dataclasses.replace(grid()[2], kv_sample_s=0.0)  # fails in its replays
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        seen: list[str] = []
        on_ray = run_study(
            [*grid(), failing], workers="ray", progress=seen.append, return_exceptions=True
        )
        # A Ray instance the study did not start is left running.
        assert ray.is_initialized()
    finally:
        ray.shutdown()
    *results, error = on_ray
    assert isinstance(error, ValueError) and "kv_sample_s" in str(error)
    assert all(isinstance(r, BenchResult) for r in results)
    one_by_one = run_study(grid(), workers=1)
    assert [comparable(r) for r in results if isinstance(r, BenchResult)] == [
        comparable(r) for r in one_by_one
    ]
    assert seen.count("alone") == 6 * 3  # the failing configuration's solo runs ran too
