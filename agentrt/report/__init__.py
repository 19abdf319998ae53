"""agentrt.report: tables and plots from journals (``agentrt report JOURNAL...``).

The numbers (:func:`summarize`, :func:`compare`, :func:`breakdown`, :func:`critical_path`)
need nothing beyond agentrt; the terminal table needs rich and the plots matplotlib, both
in the ``report`` extra (``pip install "agentjct[report]"``) and imported only when used.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from ._command import ReportError, Run, load_run, report
    from ._stats import Breakdown, ComparisonRow, NameSummary, breakdown, compare, summarize
    from ._timeline import Activity, activities, critical_path

__all__ = [
    "Activity",
    "Breakdown",
    "ComparisonRow",
    "NameSummary",
    "ReportError",
    "Run",
    "activities",
    "breakdown",
    "compare",
    "critical_path",
    "load_run",
    "report",
    "summarize",
]

_HOMES: dict[str, str] = {
    "ReportError": "._command",
    "Run": "._command",
    "load_run": "._command",
    "report": "._command",
    "Breakdown": "._stats",
    "ComparisonRow": "._stats",
    "NameSummary": "._stats",
    "breakdown": "._stats",
    "compare": "._stats",
    "summarize": "._stats",
    "Activity": "._timeline",
    "activities": "._timeline",
    "critical_path": "._timeline",
}
"""Where each public name lives: imported on first use (the package's face stays light)."""

__getattr__, __dir__ = lazy_names(__name__, globals(), _HOMES)
