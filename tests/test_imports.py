"""The import graph of agentrt: no module of the package (the core's stages, ``sim/``,
``telemetry/``, every subpackage, and the package's ``__init__`` itself) imports one that
imports it back, neither at import time, nor for typing (``if TYPE_CHECKING:``), nor
inside a function. Each module can then be read and changed alone (docs/architecture.md).

The graph is read from the source with ``ast``, so nothing is imported to check it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import agentrt

PACKAGE = Path(agentrt.__file__).parent

STAGES = (
    "agentrt._notice",
    "agentrt._state",
    "agentrt._blocks",
    "agentrt._checks",
    "agentrt._turns",
    "agentrt._types",
    "agentrt._context",
    "agentrt._jobs",
    "agentrt._httplib",
    "agentrt._wire",
    "agentrt._transport._retry",
    "agentrt._transport._outgoing",
    "agentrt._transport._stream",
    "agentrt._transport._events",
    "agentrt._transport._attempts",
    "agentrt._transport._call",
    "agentrt._transport._entry",
    "agentrt._options",
    "agentrt._upkeep",
    "agentrt._clients",
    "agentrt._runtime",
    "agentrt._sync",
)
"""The runtime's stage modules, each importing only those before it."""


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> Iterator[tuple[str, str]]:
    """(imported agentrt module, how: ``module`` | ``typing`` | ``function``) of a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def targets(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        if node.level:
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            base = f"{base}.{node.module}" if node.module else base
        else:
            base = node.module or ""
        # ``from .x import y``: y may be a submodule of x, else a name in x.
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]

    def walk(node: ast.AST, how: str) -> Iterator[tuple[str, str]]:
        for child in ast.iter_child_nodes(node):
            kind = how
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                kind = "typing"
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                kind = "function"
            if isinstance(child, ast.Import | ast.ImportFrom):
                for target in targets(child):
                    if target in known and target != name:
                        yield target, kind
            yield from walk(child, kind)

    yield from walk(ast.parse(path.read_text(encoding="utf-8")), "module")


ALL = {"module", "typing", "function"}
"""Every kind of import."""


def _graph(kinds: set[str]) -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    # A package is a module too: ``from .. import __version__`` in a module that the
    # package's ``__init__`` imports (for typing, or on first use) is a circle.
    return {
        name: {target for target, how in _imports(name, path, known) if how in kinds}
        for name, path in modules.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The graph's strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read() -> None:
    # The reader sees all three kinds of import (or the checks below would pass vacuously).
    graph = _graph({"module"})
    assert "agentrt._state" in graph["agentrt._runtime"]
    assert "agentrt.telemetry._otel" in _graph({"function"})["agentrt._options"]
    assert "agentrt._state" in _graph({"typing"})["agentrt._transport._attempts"]
    # The subpackages and the package's own ``__init__`` are read too.
    graph = _graph(ALL)
    assert "agentrt.sim.peers" in graph["agentrt.sim._cluster"]
    assert "agentrt.sim._replica" in graph["agentrt.sim.peers._gateway"]
    assert "agentrt._version" in graph["agentrt.telemetry._otel"]
    assert "agentrt._runtime" in graph["agentrt"]
    # And it finds a cycle where there is one.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_no_import_cycle_anywhere_in_the_package() -> None:
    # Counting imports for typing and inside functions too, through any agentrt module,
    # ``sim/`` and ``telemetry/`` included.
    assert _cycles(_graph(ALL)) == []


def test_each_stage_imports_only_the_stages_before_it() -> None:
    graph = _graph(ALL)
    for i, stage in enumerate(STAGES):
        later = set(STAGES[i + 1 :])
        assert not graph[stage] & later, f"{stage} imports {sorted(graph[stage] & later)}"


def test_the_known_circles_stay_open() -> None:
    # Each was a circle once; naming them keeps the reason beside the fix.
    graph = _graph(ALL)
    # The value objects name DialectSpec from dialects/_base.py, not the dialects package
    # (whose session-end hooks import telemetry, which imports _config back).
    assert "agentrt.dialects" not in graph["agentrt._config"]
    # The gateway in front of the simulated replicas reads Replica from its own module,
    # not from the cluster that holds the gateway.
    assert "agentrt.sim._cluster" not in graph["agentrt.sim.peers._gateway"]
    # The OpenTelemetry hook names the version from _version.py, not from the package
    # that imports the hook (through _runtime and _options) back.
    assert "agentrt" not in graph["agentrt.telemetry._otel"]


ROOMS = {
    "agentrt._transport": "the call path (docs/architecture.md): the runtime and the "
    "synchronous clients build an AgentTransport; nothing else reaches inside",
}
"""Packages entered only through their ``__init__`` (their door) from outside: what
their modules hold can move between them without a change elsewhere."""


def test_each_room_is_entered_by_its_door() -> None:
    graph = _graph(ALL)
    for room, why in ROOMS.items():
        for name, targets in graph.items():
            if name == room or name.startswith(room + "."):
                continue
            inside = sorted(t for t in targets if t.startswith(room + "."))
            assert not inside, f"{name} reaches inside {room} ({why}): {inside}"


def test_a_door_check_would_fail() -> None:
    # The check reads the same graph: a module of the room is found from outside it.
    graph = _graph(ALL)
    assert "agentrt._transport" in graph["agentrt._runtime"]
    assert "agentrt._transport._entry" in graph["agentrt._transport"]


def test_the_statistics_module_is_a_leaf() -> None:
    # The report, the bench, the steady-state study, the tuner and the benchmarks' harness
    # read every percentile and bootstrap interval with agentrt/_stats.py; it imports no
    # agentrt module, so each of them reaches it without climbing into another's package
    # (tests/test_stats.py: no second percentile anywhere).
    graph = _graph(ALL)
    assert graph["agentrt._stats"] == set()
    for user in (
        "report._stats",
        "report._command",
        "bench._runner",
        "bench._steady",
        "tune._search",
    ):
        assert "agentrt._stats" in graph[f"agentrt.{user}"]
