"""agentrt tune: replay journals in the embedded cluster (a digital twin) under a grid of
settings and pick the best (docs/tune.md).

The command ``agentrt tune JOURNAL...`` prints the ranking and writes the chosen settings
to a TOML file; from Python, :func:`tune` returns them as a :class:`TuneResult`: its
ranked :class:`Score` per :class:`Setting`, the one chosen, as ``Runtime`` keyword
arguments (:meth:`TuneResult.runtime_kwargs`) or as the file's text
(:meth:`TuneResult.to_toml`). :data:`ROUTINGS`, :data:`POLICIES` and
:data:`CONCURRENCY` are the values the grid tries, :data:`LOADS` the loads each setting
is replayed at.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from ._command import TuneResult, tune
    from ._fit import Fit
    from ._search import CONCURRENCY, LOADS, POLICIES, ROUTINGS, Score, Setting

__all__ = [
    "CONCURRENCY",
    "LOADS",
    "POLICIES",
    "ROUTINGS",
    "Fit",
    "Score",
    "Setting",
    "TuneResult",
    "tune",
]

_HOMES: dict[str, str] = {
    "TuneResult": "._command",
    "tune": "._command",
    "Fit": "._fit",
    "CONCURRENCY": "._search",
    "LOADS": "._search",
    "POLICIES": "._search",
    "ROUTINGS": "._search",
    "Score": "._search",
    "Setting": "._search",
}
"""Where each public name lives: imported on first use (the command's arguments,
``_cli.py``, stay light)."""

__getattr__, __dir__ = lazy_names(__name__, globals(), _HOMES)
