"""``mypy --strict`` accepts typed use of the public API, every example, and the README's
Python code; and it rejects misuse (so the calls are typed, not ``Any``).

``Session.chat`` / ``complete`` and their ``SyncSession`` twins are overloaded on
``stream`` as openai's own ``create`` is: ``reply.choices[0].message.content`` type-checks
without a cast, and a stream is iterated as chunks.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TYPING = ROOT / "tests" / "typed"
_ERROR = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): error: .*\[(?P<code>[a-z-]+)\]$")
_EXPECTED = re.compile(r"# E: (?P<code>[a-z-]+)")

# Frameworks the examples use: where one is not installed in this environment (the
# openai 2.x one has LlamaIndex only, the main one LangChain and the Agents SDK), mypy takes its
# imports as Any, as the project's own mypy config does for LlamaIndex, and the example
# may use its decorators (untyped then). Each example is checked in full where its
# framework is installed.
_FRAMEWORKS = (
    "langchain",
    "langchain_core",
    "langgraph",
    "agents",
    "llama_index",
    # issue 36's: each tested in an environment of its own (scripts/test_frameworks.sh)
    "pydantic_ai",
    "agno",
    "strands",
    "autogen_agentchat",
    "autogen_ext",
    "ag2",
    "google.adk",
    "google.genai",
    "litellm",
    "smolagents",
    "crewai",
)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package (google, of google.adk) is not
        return False


def _config(tmp: Path) -> Path:
    lines = ["[mypy]", "strict = True", "python_version = 3.11", "warn_unused_ignores = True"]
    missing = [m for m in _FRAMEWORKS if not _installed(m)]
    for module in missing:
        lines += [f"[mypy-{module}.*]", "ignore_missing_imports = True"]
    for example in sorted((ROOT / "examples").glob("*.py")):
        text = example.read_text(encoding="utf-8")
        if any(re.search(rf"^(from|import) {m}\b", text, re.M) for m in missing):
            lines += [f"[mypy-{example.stem}]", "disallow_untyped_decorators = False"]
    path = tmp / "mypy.ini"
    path.write_text("\n".join(lines) + "\n")
    return path


def _mypy(tmp: Path, *paths: Path) -> tuple[int, list[tuple[str, int, str]], str]:
    """Run mypy over ``paths``: (exit status, [(file name, line, error code)], output)."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(_config(tmp)),
            "--show-error-codes",
            "--no-error-summary",
            "--no-pretty",
            *map(str, paths),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    errors = [
        (Path(m["path"]).name, int(m["line"]), m["code"])
        for line in out.stdout.splitlines()
        if (m := _ERROR.match(line))
    ]
    return out.returncode, errors, out.stdout + out.stderr


def readme_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def test_public_api_examples_and_readme_pass_mypy_strict(tmp_path: Path) -> None:
    blocks = readme_blocks()
    assert blocks, "the README has no ```python block to check"
    files = [TYPING / "usage.py", *sorted((ROOT / "examples").glob("*.py"))]
    for i, block in enumerate(blocks):
        path = tmp_path / f"readme_block_{i}.py"
        path.write_text(block, encoding="utf-8")
        files.append(path)
    assert len(files) >= 4
    status, errors, output = _mypy(tmp_path, *files)
    assert status == 0 and not errors, output


def test_mypy_rejects_misuse(tmp_path: Path) -> None:
    """Every line of tests/typed/wrong.py marked ``# E: <code>`` is reported with that
    code, and nothing else is: a stream has no ``choices``, a reply is not iterable, a
    bad argument type or a missing ``model`` does not match any overload."""
    wrong = TYPING / "wrong.py"
    expected = {
        ("wrong.py", n, m["code"])
        for n, line in enumerate(wrong.read_text().splitlines(), start=1)
        if (m := _EXPECTED.search(line))
    }
    assert len(expected) >= 6
    status, errors, output = _mypy(tmp_path, wrong)
    assert status == 1, output
    assert set(errors) == expected, output
