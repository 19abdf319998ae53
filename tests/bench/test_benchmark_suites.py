"""benchmarks/ as a few suites (benchmarks/_suites.py): every script is an entry of one
suite, every suite has a page, and every file of results/ is named by what it measures and
listed in results/README.md."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

from tests._benchmarks import BENCHMARKS, load_benchmark

ROOT = BENCHMARKS.parent
RESULTS = ROOT / "results"
SLOTS = {"steady_state"}
"""Entries announced before their script lands."""


def _suites() -> tuple[object, ...]:
    return tuple(load_benchmark("_suites").SUITES)


def test_every_script_is_an_entry_of_one_suite_and_every_entry_is_a_script() -> None:
    entries = [e.name for s in _suites() for e in s.entries]  # type: ignore[attr-defined]
    assert len(entries) == len(set(entries))
    scripts = {p.stem for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_")}
    assert scripts - set(entries) == set()
    assert set(entries) - scripts <= SLOTS


def test_every_suite_has_its_page_and_the_index_links_it() -> None:
    index = (ROOT / "docs" / "benchmarks.md").read_text()
    for suite in _suites():
        page = ROOT / "docs" / "benchmarks" / suite.page  # type: ignore[attr-defined]
        assert page.exists(), page
        assert f"benchmarks/{suite.page}" in index  # type: ignore[attr-defined]


def test_results_are_named_by_what_they_measure_and_indexed() -> None:
    listed = (RESULTS / "README.md").read_text()
    claimed = {n for s in _suites() for e in s.entries for n in e.results}  # type: ignore[attr-defined]
    for path in RESULTS.iterdir():
        if path.name == "README.md":
            continue
        assert not re.search(r"issue|before|after", path.name), path.name
        assert path.name in claimed, f"{path.name} is claimed by no entry of benchmarks/_suites.py"
        assert f"`{path.name}`" in listed, f"{path.name} is not in results/README.md"


def test_the_command_lists_the_suites() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks", "list"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": "80"},
    ).stdout
    for suite in _suites():
        assert f"{suite.name}: " in out  # type: ignore[attr-defined]
    assert max(len(line) for line in out.splitlines()) <= 80


def test_a_run_records_what_command_commit_and_date(tmp_path: Path) -> None:
    harness = load_benchmark("_harness")
    out = tmp_path / "r.json"
    harness.write_result(out, {"x": 1}, "What it measures.\n\nMore.")
    doc = json.loads(out.read_text())
    assert doc["x"] == 1
    assert doc["run"]["what"] == "What it measures."
    assert {"command", "date"} <= set(doc["run"])
    point, lo, hi = harness.intervals([1.0, 2.0, 3.0, 4.0, 100.0], (0.5,))["p50"]
    assert point == 3.0 and 1.0 <= lo <= 3.0 <= hi <= 100.0


def test_the_run_options_and_quantiles_are_spelled_once() -> None:
    harness = load_benchmark("_harness")
    parser = argparse.ArgumentParser()
    harness.add_run_args(parser, out="x.json", seeds=2, rounds=3)
    args = parser.parse_args([])
    assert args.out == RESULTS / "x.json" and args.seeds == 2 and args.rounds == 3
    assert list(harness.seeds(args.seeds)) == [0, 1]
    assert parser.parse_args(["--out", "y.json"]).out == Path("y.json")
    none = argparse.ArgumentParser()
    harness.add_run_args(none, out="", seed=7)
    assert none.parse_args([]).out is None and none.parse_args([]).seed == 7
    # Nearest rank (the bench's summaries), and the cost benchmarks' int(q n) convention.
    values = [5.0, 1.0, 4.0, 2.0, 3.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    assert harness.quantile(values, 0.5) == 5.0
    assert harness.quantile(values, 0.5, floor=True) == 6.0
    assert harness.quantile(values, 0.99, floor=True) == 10.0
    assert math.isnan(harness.quantile([], 0.5))
    # Repetitions interleaved: ABBA, or a fresh shuffle of every variant each round.
    assert list(harness.interleaved(3, "AB", abba=True)) == [
        (0, "A"),
        (0, "B"),
        (1, "B"),
        (1, "A"),
        (2, "A"),
        (2, "B"),
    ]
    shuffled = list(harness.interleaved(4, "ABC"))
    assert [sorted(v for r, v in shuffled if r == k) for k in range(4)] == [list("ABC")] * 4
