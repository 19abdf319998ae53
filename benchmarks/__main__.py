"""``python -m benchmarks list | index | SUITE [PART] [OPTIONS...]`` (see __init__.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from ._harness import RESULTS, ROOT
from ._suites import SUITES, find


def _list() -> None:
    width = min(shutil.get_terminal_size().columns, 100)

    def say(text: str, indent: str = "", hang: str = "  ") -> None:
        print(textwrap.fill(text, width, initial_indent=indent, subsequent_indent=hang))

    for suite in SUITES:
        say(f"{suite.name}: {suite.question} (docs/benchmarks/{suite.page})")
        for i, p in enumerate(suite.parts):
            say(f"{p.name:14s} {p.what}", f"  {'*' if i == 0 else ' '} ", " " * 19)
    print()
    say("* the suite's default part")
    say("run: python -m benchmarks SUITE [PART] [OPTIONS...] (SUITE [PART] --help: the options)")


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        return ""


def _recorded(path: Path) -> dict[str, str]:
    """The run record a result carries (``run``, or the older ``command`` / ``commit`` /
    ``date`` keys), else the commit and date that last wrote the file in git (a rename
    is no writing)."""
    found: dict[str, str] = {}
    if path.suffix == ".json":
        try:
            doc = json.loads(path.read_text())
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            for where in (doc.get("run"), doc.get("meta"), doc):
                if isinstance(where, dict):
                    for key in ("command", "commit", "date", "when"):
                        value = where.get(key)
                        if isinstance(value, str) and key not in found:
                            found["date" if key == "when" else key] = value
    if "commit" not in found or "date" not in found:
        log = _git(
            "log",
            "--follow",
            "--diff-filter=AM",
            "--format=%h %cs",
            "--",
            str(path.relative_to(ROOT)),
        )
        if log:
            head, _, day = log.splitlines()[0].partition(" ")
            found.setdefault("commit", head)
            found.setdefault("date", day)
    return found


def _index() -> None:
    """Write results/README.md: each file, what it measures, its command, commit, date."""
    lines = [
        "# results/",
        "",
        "What each file measures, the command that wrote it, and its commit and date (the",
        "file's own record where it has one, else the commit that last changed it). Written",
        "by `python -m benchmarks index`; the pages of docs/benchmarks/ read these files.",
        "",
    ]
    listed: set[str] = set()
    for suite in SUITES:
        lines += [f"## {suite.name}: {suite.question}", ""]
        lines += ["| file | what | command | commit | date |", "|---|---|---|---|---|"]
        for e in suite.parts:
            for name in e.results:
                path = RESULTS / name
                if not path.exists():
                    continue
                listed.add(name)
                rec = _recorded(path)
                part = f" {e.name}" if len(suite.parts) > 1 else ""
                command = rec.get("command", f"python -m benchmarks {suite.name}{part}")
                lines.append(
                    f"| `{name}` | {e.what} | `{command}` | {rec.get('commit', '')} "
                    f"| {rec.get('date', '')[:10]} |"
                )
        lines.append("")
    stray = sorted(p.name for p in RESULTS.iterdir() if p.name not in listed | {"README.md"})
    if stray:
        lines += ["## Not yet filed under a suite", ""] + [f"- `{n}`" for n in stray] + [""]
    (RESULTS / "README.md").write_text("\n".join(lines))
    print(f"wrote {RESULTS / 'README.md'}")


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("list", "LIST", "-h", "--help"):
        _list()
    elif argv[0] == "index":
        _index()
    else:
        find(argv[0]).run(argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
