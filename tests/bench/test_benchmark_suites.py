"""benchmarks/ as a package of a few suites (benchmarks/_suites.py), each one entry
point with one parser: every module of the folder is a suite's part or what the parts
share, nothing puts the folder on ``sys.path`` or imports a private agentrt module, every
suite has a page, and every file of results/ is named by what it measures and listed in
results/README.md."""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import io
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
RESULTS = ROOT / "results"
SHARED = {"__init__", "__main__", "_harness", "_suites", "_slo", "_echo_server"}
"""The modules that are no part: the package, its entry, what the parts share."""


def _suites() -> tuple[object, ...]:
    return tuple(importlib.import_module("benchmarks._suites").SUITES)


def test_at_most_twelve_entry_points_and_every_module_is_a_part_of_one() -> None:
    suites = _suites()
    assert len(suites) <= 12
    parts = [p.module for s in suites for p in s.parts]  # type: ignore[attr-defined]
    assert len(parts) == len(set(parts))
    modules = {p.stem for p in BENCHMARKS.glob("*.py")}
    assert modules - SHARED == set(parts)
    # a part is a private module: the suites are the only entry points
    assert all(m.startswith("_") for m in modules - {"__init__", "__main__"})
    for suite in suites:
        for part in suite.parts:  # type: ignore[attr-defined]
            module = part.load()
            assert callable(module.add_args) and callable(module.main), part.module


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return names


@pytest.mark.parametrize("path", sorted(BENCHMARKS.glob("*.py")), ids=lambda p: p.name)
def test_one_package_one_parser_no_path_trick(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert "sys.path" not in text
    # siblings are imported relatively: ``from ._harness import ...``
    siblings = {p.stem for p in BENCHMARKS.glob("*.py")}
    assert not [m for m in _imports(path) if m.split(".")[0] in siblings]
    # one parser per suite, built in _suites.py (the echo server is a process of its own)
    if path.stem not in ("_suites", "_echo_server"):
        assert "ArgumentParser(" not in text


def _private(dotted: str) -> bool:
    """``agentrt._x``, ``agentrt.x._y``: a private part (dunders such as ``__version__``
    are public)."""
    parts = dotted.split(".")
    return parts[0] == "agentrt" and any(
        p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in parts[1:]
    )


def _private_uses(path: Path) -> set[str]:
    """What of agentrt's private side ``path`` imports or reads: ``import agentrt._x``,
    ``from agentrt.x._y import ...``, ``from agentrt.x import _y``, ``agentrt._x.y``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if _private(a.name)}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                if _private(f"{node.module}.{a.name}"):
                    found.add(node.module if _private(node.module) else f"{node.module}.{a.name}")
        elif isinstance(node, ast.Attribute):
            chain = [node.attr]
            value = node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and _private(".".join([value.id, *reversed(chain)])):
                found.add(".".join([value.id, *reversed(chain)]))
    return found


def test_no_part_reads_agentrt_private_side(tmp_path: Path) -> None:
    # A benchmark measures what users run: the public API (agentrt, agentrt.bench,
    # agentrt.tune, ...); what it lacks is added there, not reached around.
    uses = {p.stem: _private_uses(p) for p in sorted(BENCHMARKS.glob("*.py"))}
    assert {k: v for k, v in uses.items() if v} == {}
    # the check sees each form
    probe = tmp_path / "probe.py"
    forms = (
        "import agentrt._runtime\n"
        "from agentrt.bench._steady import plot\n"
        "from agentrt.bench import _x\n"
        "import agentrt\n"
        "agentrt._context._CALL_SESSION\n"
        "agentrt.__version__\n"
    )
    probe.write_text(forms, encoding="utf-8")
    assert _private_uses(probe) == {
        "agentrt._runtime",
        "agentrt.bench._steady",
        "agentrt.bench._x",
        "agentrt._context._CALL_SESSION",
        "agentrt._context",
    }


def test_every_suite_has_its_page_and_the_index_links_it() -> None:
    index = (ROOT / "docs" / "benchmarks.md").read_text()
    for suite in _suites():
        page = ROOT / "docs" / "benchmarks" / suite.page  # type: ignore[attr-defined]
        assert page.exists(), page
        assert f"benchmarks/{suite.page}" in index  # type: ignore[attr-defined]


def test_results_are_named_by_what_they_measure_and_indexed() -> None:
    listed = (RESULTS / "README.md").read_text()
    claimed = {n for s in _suites() for e in s.parts for n in e.results}  # type: ignore[attr-defined]
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
    harness = importlib.import_module("benchmarks._harness")
    out = tmp_path / "r.json"
    harness.write_result(out, {"x": 1}, "What it measures.\n\nMore.")
    doc = json.loads(out.read_text())
    assert doc["x"] == 1
    assert doc["run"]["what"] == "What it measures."
    assert {"command", "date"} <= set(doc["run"])
    point, lo, hi = harness.intervals([1.0, 2.0, 3.0, 4.0, 100.0], (0.5,))["p50"]
    assert point == 3.0 and 1.0 <= lo <= 3.0 <= hi <= 100.0


def test_the_run_options_and_quantiles_are_spelled_once() -> None:
    harness = importlib.import_module("benchmarks._harness")
    parser = argparse.ArgumentParser()
    harness.add_run_args(parser, out="x.json", seeds=2, rounds=3)
    args = parser.parse_args([])
    assert args.out == RESULTS / "x.json" and args.seeds == 2 and args.rounds == 3
    assert list(harness.seeds(args.seeds)) == [0, 1]
    assert parser.parse_args(["--out", "y.json"]).out == Path("y.json")
    none = argparse.ArgumentParser()
    harness.add_run_args(none, out="", seed=7)
    assert none.parse_args([]).out is None and none.parse_args([]).seed == 7
    # One percentile, nearest rank (the package's, agentrt.bench.quantile), in any order.
    values = [5.0, 1.0, 4.0, 2.0, 3.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    assert harness.quantile(values, 0.5) == 5.0
    assert harness.quantile(values, 0.9) == 9.0
    assert harness.quantile(values, 0.99) == 10.0
    assert math.isnan(harness.quantile([], 0.5))
    with pytest.raises(TypeError):
        harness.quantile(values, 0.5, floor=True)  # the second convention is gone
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


def test_every_part_runs_through_its_suite_and_its_help_fits_80_columns() -> None:
    # One process for all of them: each suite's one parser, each part's options on it.
    code = (
        "import contextlib, io, sys\n"
        "from benchmarks._suites import SUITES\n"
        "for s in SUITES:\n"
        "    for argv in ([], *([p.name] for p in s.parts)):\n"
        "        out = io.StringIO()\n"
        "        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
        "            s.run([*argv, '--help'])\n"
        "        text = out.getvalue()\n"
        "        assert text.startswith('usage: python -m benchmarks ' + s.name), text\n"
        "        wide = [line for line in text.splitlines() if len(line) > 80]\n"
        "        assert not wide, (s.name, argv, wide)\n"
    )
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, env=env, timeout=300)


def test_a_run_records_its_command_as_the_suite_and_part() -> None:
    harness = importlib.import_module("benchmarks._harness")
    argv, entry = sys.argv, list(harness.ENTRY)
    try:
        sys.argv = ["benchmarks/__main__.py", "cost", "--rounds", "2"]  # the default part
        harness.ENTRY[:] = ["cost", "overhead"]
        assert harness.run_record("x")["command"] == "python -m benchmarks cost overhead --rounds 2"
        sys.argv = ["benchmarks/__main__.py", "cost", "overhead", "--rounds", "2"]
        assert harness.run_record("x")["command"] == "python -m benchmarks cost overhead --rounds 2"
        assert harness.again("--one")[1:] == ["-m", "benchmarks", "cost", "overhead", "--one"]
    finally:
        sys.argv, harness.ENTRY[:] = argv, entry


def _quoted_commands(text: str) -> list[str]:
    """Every ``python -m benchmarks ...`` a page quotes: inline code (across a line
    break) and the lines of a code block (continued with ``\\``, up to a comment)."""
    found = [" ".join(c.split()) for c in re.findall(r"`python -m benchmarks ([^`]*)`", text)]
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        for line in re.sub(r"\\\n", " ", block).splitlines():
            for c in re.findall(r"python -m benchmarks ([^#;|]*)", line):
                found.append(" ".join(c.split()))
    return found


def test_every_command_the_docs_quote_parses() -> None:
    # The pages quote hundreds of runs; each names a suite, a part and options it has.
    suites: dict[str, Any] = {s.name: s for s in _suites()}  # type: ignore[attr-defined]
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    checked = 0
    for page in pages:
        text = page.read_text(encoding="utf-8")
        # a part is no script: the retired ``python benchmarks/overhead.py`` is quoted nowhere
        assert not re.findall(r"\bbenchmarks/[a-z]\w*\.py", text), page.name
        for command in _quoted_commands(text):
            argv = [a.replace("$n", "1") for a in command.split()]
            if not argv or argv[0] in ("list", "index") or "[" in command or argv[0].isupper():
                continue
            assert argv[0] in suites, f"{page.name}: no suite in `{command}`"
            suite = suites[argv[0]]
            names = {p.name: p for p in suite.parts} if len(suite.parts) > 1 else {}
            rest = argv[1:]
            part = names.get(rest[0] if rest else "", suite.parts[0])
            if names and not (rest and rest[0] in names):
                rest.insert(0, part.name)  # the default part
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                try:
                    suite.parser(part).parse_args(rest)
                except SystemExit as e:
                    if e.code:  # --help exits 0
                        quoted = f"`python -m benchmarks {command}`"
                        pytest.fail(f"{page.name}: {quoted}: {err.getvalue()}")
            checked += 1
    assert checked > 100
