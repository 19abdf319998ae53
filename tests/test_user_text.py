"""What a user reads cites no issue of this project's tracker ("The steady-state benchmark
(issue 34)", "issue 19, item 3"): a reader has no way to look one up. Checked: the docs
pages (the changelog aside: it is history), the README, every ``agentrt`` command's help,
and every string in the package, the benchmark scripts and the examples (docstrings, help
texts, error messages; comments are not read by users). Upstream references name their
project and keep their ``#`` ("vLLM PR #38514", "vllm-project/router issue #219")."""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrt.cli import _parser

ROOT = Path(__file__).resolve().parents[1]
ISSUE = re.compile(r"\bissues?[ -]?\d+", re.IGNORECASE)
"""This project's style of citing its own issues: "issue 34", "Issue 19's", "issue34"."""
HISTORY = {ROOT / "docs" / "changelog.md"}


def _hits(text: str) -> list[str]:
    return [text[max(0, m.start() - 30) : m.end() + 10] for m in ISSUE.finditer(text)]


def test_the_pattern_finds_our_style_and_spares_upstream_references() -> None:
    for ours in ("(issue 34)", "Issue 19's check", "issues 12 and 13", "at issue34bench"):
        assert ISSUE.search(ours), ours
    for upstream in ("vLLM PR #38514", "router issue #219 shows", "issues #511, #477"):
        assert not ISSUE.search(upstream), upstream


def _pages() -> list[Path]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p for p in pages if p not in HISTORY]


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_pages_cite_no_issue_numbers(page: Path) -> None:
    assert _hits(page.read_text(encoding="utf-8")) == []


def _parsers(parser: argparse.ArgumentParser, name: str) -> Iterator[tuple[str, str]]:
    yield name, parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, p in action.choices.items():
                yield from _parsers(p, f"{name} {sub}")


def test_no_command_help_cites_an_issue_number() -> None:
    helps = dict(_parsers(_parser(), "agentrt"))
    assert {"agentrt bench", "agentrt report", "agentrt sim serve"} <= helps.keys()
    assert {name: _hits(text) for name, text in helps.items() if _hits(text)} == {}


def _sources() -> list[Path]:
    return [
        *sorted((ROOT / "agentrt").rglob("*.py")),
        *sorted((ROOT / "benchmarks").glob("*.py")),
        *sorted((ROOT / "examples").glob("*.py")),
    ]


def test_no_string_in_the_package_benchmarks_or_examples_cites_an_issue_number() -> None:
    """Docstrings (public API, modules, the benchmark scripts' --help), help texts and
    error messages are all string literals."""
    found = []
    for path in _sources():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found += [f"{path.relative_to(ROOT)}:{node.lineno}: {h}" for h in _hits(node.value)]
    assert len(_sources()) > 100
    assert found == []
