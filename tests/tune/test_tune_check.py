"""python -m benchmarks tune twin's loop, tiny: record a journal with Runtime's defaults, tune
it, apply the file it wrote through ``agentrt:config=FILE`` and measure it beside tune's
finalists on fresh jobs. Asserts that each step did its part, not the goals."""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from types import ModuleType

import pytest

from agentrt import Runtime
from agentrt._settings import load_config
from agentrt.tune import Setting

ROOT = Path(__file__).resolve().parents[2]


def _check() -> ModuleType:
    return importlib.import_module("benchmarks._tune_check")


@pytest.mark.timeout(300)  # ~20 s of CPU; far more wall time on a busy shared machine
def test_the_loop_records_tunes_applies_and_measures(tmp_path: Path) -> None:
    tc = _check()
    assert tc.config_supported()
    tiny = tc.Workload("mixed", "mixed", rate=1.0, record_jobs=8, fresh_jobs=4, sample=3, seeds=1)
    (check,) = tc.run([tiny], tmp_path, workers=1, only=[])
    defaults = tc.default_setting().label()

    # Recorded with Runtime's defaults: tune read them back from the journal.
    assert check.tune["recording"]["jobs"] == 8 and check.tune["recording"]["failed"] == 0
    assert check.tune["recorded"] == defaults
    assert check.tune["replays"] > 0 and check.tune["ranked"]

    # The file tune wrote loads into Runtime(config=) and holds the chosen settings.
    file = tmp_path / "mixed" / "agentrt-tuned.toml"
    Runtime(["http://127.0.0.1:9/v1"], config=file)
    assert Setting.of(load_config(file)).label() == check.chosen

    # Applied on the fresh jobs: every job ran; the same as the grid's copy of it.
    assert check.applied["jobs"] == 4 and check.applied["failed"] == 0
    assert check.chosen in check.measured and defaults in check.measured
    assert check.applied["p50"] == pytest.approx(check.measured[check.chosen]["p50"], rel=1e-9)
    for ranked in check.tune["ranked"]:  # every finalist tune scored was measured
        assert ranked["setting"] in check.measured

    summary = check.summary()
    assert math.isfinite(check.predicted) and check.predicted > 0
    assert math.isfinite(summary["measured_p50_ratio"]) and summary["measured_p50_ratio"] > 0
    assert summary["gap_to_best"] >= 0  # the best of what was measured, the pick included
    assert isinstance(summary["goal_gap_met"], bool)
    lines = tc.table([check]) + tc.grid_table(check)
    assert all(len(line) <= 80 for line in lines)
