"""The docs site (mkdocs.yml) documents every public name: each public module has an API
reference page, and each name in a public module's ``__all__``, with its public methods,
has a docstring. mkdocstrings renders a name without one silently, so this is the check
that fails. The names are read the way the site reads them: statically, with griffe (from
the ``docs`` extra). ``mkdocs build --strict`` itself runs in scripts/test.sh."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("griffe", reason="the docs extra: pip install -e '.[docs]'")
import griffe

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"
NOT_IN_REFERENCE = {"agentrt.cli", "agentrt.__main__", "agentrt.check"}
"""Public modules that are commands, not an API (docs/telemetry.md, docs/deploy.md and
--help cover them)."""


def _documented_modules() -> set[str]:
    found = set()
    for page in REFERENCE.glob("*.md"):
        found |= set(re.findall(r"^::: ([\w.]+)$", page.read_text(encoding="utf-8"), re.M))
    return found


@pytest.fixture(scope="module")
def package() -> griffe.Module:
    # the extension the site uses (mkdocs.yml): docstrings inherited from a base's method
    extensions = griffe.load_extensions(str(REFERENCE / "_griffe.py"))
    loader = griffe.GriffeLoader(search_paths=[str(ROOT)], extensions=extensions)
    module = loader.load("agentrt")
    assert isinstance(module, griffe.Module)
    loader.resolve_aliases(external=False)
    return module


def _public_modules(module: griffe.Module) -> list[griffe.Module]:
    out = [module]
    for name, member in module.modules.items():
        if not name.startswith("_"):
            out += _public_modules(member)
    return out


def _exported(module: griffe.Module) -> list[str]:
    exports = module.exports
    if exports is None:  # a module without __all__: its names not starting with _
        return [n for n, m in module.members.items() if not n.startswith("_") and not m.is_alias]
    return [n if isinstance(n, str) else n.name for n in exports]


def _missing(obj: griffe.Object | griffe.Alias, path: str) -> list[str]:
    if isinstance(obj, griffe.Alias):
        obj = obj.final_target
    if obj.is_module:
        return []  # documented on its own page
    missing = [] if obj.docstring and obj.docstring.value.strip() else [path]
    if obj.is_class:
        for name, member in obj.members.items():
            if name.startswith("_") or member.is_alias:
                continue
            if member.is_function and not (member.docstring and member.docstring.value.strip()):
                missing.append(f"{path}.{name}")
    return missing


def test_every_public_module_has_a_reference_page(package: griffe.Module) -> None:
    public = {m.path for m in _public_modules(package)} - NOT_IN_REFERENCE
    documented = _documented_modules()
    assert public - documented == set(), "add a ::: line for it under docs/reference/"
    assert documented - public == set(), "a ::: line names a module that is not public"


def test_every_public_name_and_method_has_a_docstring(package: griffe.Module) -> None:
    missing = []
    for module in _public_modules(package):
        if module.path in NOT_IN_REFERENCE:
            continue
        assert module.docstring is not None, f"{module.path} has no module docstring"
        for name in _exported(module):
            missing += _missing(module[name], f"{module.path}.{name}")
    assert missing == [], "no docstring:\n" + "\n".join(sorted(set(missing)))


def test_the_home_page_is_the_readme_with_working_links() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("_hooks", REFERENCE / "_hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    assert hooks.INCLUDE in index.splitlines()
    repo = "https://example.org/repo"
    home = hooks.readme_for_site(repo)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert home.count("```") == readme.count("```")  # the quick start and example, whole
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", home)  # relative: into docs/
    assert links and all((ROOT / "docs" / link).is_file() for link in links), links
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", readme):
        if not target.startswith("docs/"):  # another file of the repository
            assert f"]({repo}/blob/main/{target})" in home
            assert (ROOT / target).exists(), target
