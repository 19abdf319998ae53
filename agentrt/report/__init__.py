"""agentrt.report: tables and plots from journals (``agentrt report JOURNAL...``).

The numbers (:func:`summarize`, :func:`compare`, :func:`breakdown`, :func:`critical_path`)
need nothing beyond agentrt; the terminal table needs rich and the plots matplotlib, both
in the ``report`` extra (``pip install "agentjct[report]"``) and imported only when used.
"""

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
