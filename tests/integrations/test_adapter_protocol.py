"""Every framework adapter is built on the public adapter protocol alone
(``agentrt.integrations``: Bridge, Agents, bind, unbind; docs/integrations.md, "Write an
adapter"), and so are the examples and recipes: none imports a private agentrt module or
name, or reaches a private member of agentrt's objects (``rt._core``,
``rt._check_open``, ``agents._start_job``, ...). Only the protocol's own module,
``agentrt/integrations/_bridge.py``, reaches into the runtime.

Read from the source with ``ast``, so no framework needs to be installed.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import agentrt
import agentrt.integrations

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(agentrt.integrations.__file__).parent
PROTOCOL = PACKAGE / "_bridge.py"
ADAPTERS = sorted(p for p in PACKAGE.glob("*.py") if p.name not in {"__init__.py", "_bridge.py"})
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
PUBLIC_MODULES = {"agentrt", "agentrt.integrations", "agentrt.telemetry", "agentrt.sim"}
"""The agentrt modules an adapter or an example may import names from."""


def _module_of(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


def private_imports(tree: ast.AST, package: str) -> list[str]:
    """Imports of agentrt's private modules or names (``package``: where a relative
    import starts)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "agentrt"]
            found = [m for m in found if m not in PUBLIC_MODULES]
        elif isinstance(node, ast.ImportFrom):
            module = _module_of(node, package)
            if module.split(".")[0] != "agentrt":
                continue
            if module not in PUBLIC_MODULES:
                found.append(module)
            found += [f"{module}.{a.name}" for a in node.names if a.name.startswith("_")]
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


def _members(cls: type) -> set[str]:
    """The private methods and attributes of an agentrt class, from its source."""
    names = {n for n in vars(cls) if _private(n)}
    for node in ast.walk(ast.parse(inspect.getsource(cls))):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and isinstance(node.ctx, ast.Store)
            and _private(node.attr)
        ):
            names.add(node.attr)
    return names


AGENTRT_PRIVATE = set().union(
    *(
        _members(cls)
        for cls in (
            agentrt.Runtime,
            agentrt.SyncRuntime,
            agentrt.Job,
            agentrt.Session,
            agentrt.SyncJob,
            agentrt.SyncSession,
            agentrt.integrations.Bridge,
            agentrt.integrations.Agents,
        )
    )
)
"""Private members of the objects an adapter holds (``_core``, ``_check_open``, ...)."""


def _own_names(tree: ast.AST) -> set[str]:
    """The private names a module defines itself (its functions, classes, attributes)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return {n for n in names if _private(n)}


def private_members(tree: ast.AST, *, strict: bool) -> list[str]:
    """``x._name`` where ``x`` is not ``self``, ``cls`` or ``super()``: a private member
    of agentrt's (every private name the module does not define itself, when
    ``strict``)."""
    own = _own_names(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not _private(node.attr):
            continue
        value = node.value
        if isinstance(value, ast.Name) and value.id in {"self", "cls"}:
            continue
        if isinstance(value, ast.Call) and ast.unparse(value.func) == "super":
            continue
        if node.attr in AGENTRT_PRIVATE or (strict and node.attr not in own):
            found.append(ast.unparse(node))
    return found


def _package_of(path: Path) -> str:
    return "agentrt.integrations" if path.parent == PACKAGE else ""


def test_the_checks_see_what_they_forbid() -> None:
    old = ast.parse(
        "from .._clients import client_kwargs\n"
        "from ._bridge import Bridge\n"
        "from agentrt._context import Session\n"
        "from agentrt import _HOMES, Runtime\n"
        "import agentrt._runtime\n"
        "def f(rt, agents):\n"
        "    rt._check_open()\n"
        "    agents._start_job('x')\n"
        "    return client_kwargs(rt._core, {})\n"
    )
    assert private_imports(old, "agentrt.integrations") == [
        "agentrt._clients",
        "agentrt.integrations._bridge",
        "agentrt._context",
        "agentrt._HOMES",
        "agentrt._runtime",
    ]
    # agentrt's private members always; in an adapter, any not its own
    assert private_members(old, strict=False) == ["rt._check_open", "rt._core"]
    assert private_members(old, strict=True) == [
        "rt._check_open",
        "agents._start_job",
        "rt._core",
    ]
    own = ast.parse("class A:\n    _n = 0\n    def _f(self): self._g = A()._n + self._g._f()\n")
    assert private_members(own, strict=True) == []
    # The protocol module itself does what the adapters may not.
    protocol = ast.parse(PROTOCOL.read_text(encoding="utf-8"))
    assert private_imports(protocol, "agentrt.integrations")
    assert "self.rt._check_open" in private_members(protocol, strict=False)


def test_adapters_use_only_the_public_protocol() -> None:
    assert {p.stem for p in ADAPTERS} >= {
        "ag2",
        "google_adk",
        "langchain",
        "llamaindex",
        "openai_agents",
        "pydantic_ai",
        "strands",
    }
    for path in ADAPTERS:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert private_imports(tree, "agentrt.integrations") == [], path.name
        assert private_members(tree, strict=True) == [], path.name


def test_examples_and_recipes_use_only_public_names() -> None:
    # Agno and AutoGen (Agents), smolagents and CrewAI (SyncRuntime's blocks), the toy
    # framework's adapter, and the adapters' own examples.
    names = {p.stem for p in EXAMPLES}
    assert {"agno_agent", "autogen_agent", "smolagents_agent", "crewai_agent"} <= names
    assert "custom_adapter_agent" in names
    for path in EXAMPLES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert private_imports(tree, _package_of(path)) == [], path.name
        assert private_members(tree, strict=False) == [], path.name


def test_the_protocol_is_exported_where_the_adapters_import_it() -> None:
    assert agentrt.integrations.__all__ == [
        "Agents",
        "Binding",
        "Bridge",
        "OpenJob",
        "OpenTool",
        "bind",
        "unbind",
    ]
    for name in agentrt.integrations.__all__:
        assert getattr(agentrt.integrations, name) is not None
