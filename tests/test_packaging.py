"""The distributions hold what an installed agentrt needs: ``python -m build`` (the sdist,
then the wheel built from it, as a release is built) once into a temporary folder, then
the files and metadata of each are checked against the source tree and pyproject.toml.
scripts/test.sh also installs the wheel into a fresh virtual environment and runs
``agentrt demo`` from it."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.message import Message
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
NAME, VERSION = PROJECT["name"], PROJECT["version"]
STEM = f"{NAME}-{VERSION}"


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("build", reason="the dev extra: pip install -e '.[dev]'")
    pytest.importorskip("hatchling", reason="the dev extra: pip install -e '.[dev]'")
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: the backend of the dev extra, no download; the wheel is built from
    # the sdist, so a file the sdist lacks is missing from the wheel too.
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


@pytest.fixture(scope="module")
def wheel(dist: Path) -> zipfile.ZipFile:
    (path,) = dist.glob("*.whl")
    assert path.name == f"{STEM}-py3-none-any.whl"
    return zipfile.ZipFile(path)


@pytest.fixture(scope="module")
def metadata(wheel: zipfile.ZipFile) -> Message:
    return Parser().parsestr(wheel.read(f"{STEM}.dist-info/METADATA").decode())


def _package_files() -> set[str]:
    """Every file of the agentrt package in the source tree, caches aside."""
    return {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "agentrt").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


def test_the_wheel_holds_every_module_and_data_file_of_the_package(
    wheel: zipfile.ZipFile,
) -> None:
    names = set(wheel.namelist())
    package = {n for n in names if n.startswith("agentrt/")}
    source = _package_files()
    assert {"agentrt/__init__.py", "agentrt/py.typed", "agentrt/cli.py"} <= source
    assert any(n.endswith(".py") and "/" in n[8:] for n in source)  # subpackages too
    assert package == source
    # nothing beside the package and its metadata: no tests, docs or benchmarks
    assert names - package == {n for n in names if n.startswith(f"{STEM}.dist-info/")}


def test_the_wheel_ships_the_claude_code_sample_with_its_license(wheel: zipfile.ZipFile) -> None:
    from agentrt.bench._traces import SAMPLE_COUNT

    folder = "agentrt/bench/traces/claude-code/"
    names = [n for n in wheel.namelist() if n.startswith(folder)]
    assert len([n for n in names if n.endswith(".json.gz")]) == SAMPLE_COUNT
    assert {folder + "LICENSE", folder + "README.md"} <= set(names)
    assert "agentrt/bench/traces/kv-cache-tester.sha1" in wheel.namelist()
    assert sum(wheel.getinfo(n).file_size for n in names) <= 1_000_000


def test_the_wheel_carries_the_license_notice_and_entry_point(wheel: zipfile.ZipFile) -> None:
    info = f"{STEM}.dist-info"
    for name in ("LICENSE", "NOTICE"):
        assert wheel.read(f"{info}/licenses/{name}") == (ROOT / name).read_bytes()
    assert b"Apache License" in wheel.read(f"{info}/licenses/LICENSE")
    entry_points = wheel.read(f"{info}/entry_points.txt").decode()
    assert "agentrt = agentrt.cli:main" in entry_points.splitlines()


def test_the_metadata_names_the_distribution_and_describes_it(metadata: Message) -> None:
    assert metadata["Name"] == NAME != "agentrt"
    assert metadata["Version"] == VERSION
    assert metadata["License-Expression"] == "Apache-2.0"
    assert sorted(metadata.get_all("License-File") or []) == ["LICENSE", "NOTICE"]
    assert metadata["Requires-Python"] == PROJECT["requires-python"]
    classifiers = metadata.get_all("Classifier") or []
    assert {"Typing :: Typed", "Framework :: AnyIO"} <= set(classifiers)
    minor = f"Programming Language :: Python :: {sys.version_info[0]}.{sys.version_info[1]}"
    assert minor in classifiers  # the Python these tests run on
    assert not [c for c in classifiers if c.startswith("License ::")]  # PEP 639
    assert set(PROJECT["keywords"]) <= set((metadata["Keywords"] or "").split(","))
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL") or [])
    assert {"Homepage", "Documentation", "Source", "Issues", "Changelog"} <= set(urls)
    assert all(u.startswith("https://") for u in urls.values())
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert "import agentrt" in (metadata.get_payload() or "")  # the README, naming the package
    extras = set(metadata.get_all("Provides-Extra") or [])
    assert {"report", "serve", "otel", "prometheus", "dev", "docs", "all"} <= extras
    # the all extra names this distribution, not the old name
    requires = metadata.get_all("Requires-Dist") or []
    assert not [r for r in requires if r.startswith("agentrt")]


def test_the_sdist_holds_the_sources_docs_and_tests_without_caches(dist: Path) -> None:
    (path,) = dist.glob("*.tar.gz")
    assert path.name == f"{STEM}.tar.gz"
    with tarfile.open(path) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    for name in ("LICENSE", "NOTICE", "CHANGELOG.md", "README.md", "pyproject.toml"):
        assert name in names
    assert {"mkdocs.yml", "docs/index.md", "tests/test_packaging.py"} <= names
    assert _package_files() <= names
    assert not [n for n in names if {"__pycache__", ".hypothesis", ".venv"} & set(n.split("/"))]


def test_the_installed_version_and_the_changelog_follow_pyproject() -> None:
    import importlib.metadata

    import agentrt

    # __version__ is read from the distribution's metadata, under its PyPI name
    assert importlib.metadata.version(NAME) == VERSION == agentrt.__version__
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"\n## [{VERSION}] - " in changelog
