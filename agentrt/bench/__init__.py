"""The benchmark harness: agent workloads replayed through each client, side by side.

Besides the replay (:func:`run_bench`, :func:`run_study`; :func:`replay` for jobs of your
own against your servers) and its workloads, it exports
the one statistic every figure agentrt prints is read with, for code that reports
figures of its own (the checkout's ``benchmarks/``): :func:`quantile` (nearest rank: the
``ceil(q n)``-th smallest of ``n`` sorted values) and :func:`bootstrap_interval` (a
quantile with its 90% percentile-bootstrap interval), and :func:`parse_workers`, the
``--workers`` option's parser (an int >= 1, ``auto`` or ``ray``; :data:`Workers`).
:func:`steady_study` runs the steady-state study (:class:`SteadyConfig`: throughput
against JCT per client, closed and open loop; docs/benchmarks/steady.md).
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from .._stats import bootstrap_interval, quantile
    from ._clock import VirtualTimeLoop
    from ._drivers import ClientSpec, Prompts
    from ._parallel import Workers, parse_workers
    from ._plan import BLOCK_TOKENS, Call, Fanout, JobPlan, SessionPlan
    from ._runner import BenchConfig, BenchResult, ClientResult, replay, run_bench, run_study
    from ._steady import SteadyConfig, steady_study
    from ._workloads import WORKLOADS, Arrivals, TraceOptions, make_workload

__all__ = [
    "BLOCK_TOKENS",
    "WORKLOADS",
    "Arrivals",
    "BenchConfig",
    "BenchResult",
    "Call",
    "ClientResult",
    "ClientSpec",
    "Fanout",
    "JobPlan",
    "Prompts",
    "SessionPlan",
    "SteadyConfig",
    "TraceOptions",
    "VirtualTimeLoop",
    "Workers",
    "bootstrap_interval",
    "make_workload",
    "parse_workers",
    "quantile",
    "replay",
    "run_bench",
    "run_study",
    "steady_study",
]

_HOMES: dict[str, str] = {
    "VirtualTimeLoop": "._clock",
    "ClientSpec": "._drivers",
    "Prompts": "._drivers",
    "Workers": "._parallel",
    "parse_workers": "._parallel",
    "quantile": ".._stats",
    "bootstrap_interval": ".._stats",
    "BLOCK_TOKENS": "._plan",
    "Call": "._plan",
    "Fanout": "._plan",
    "JobPlan": "._plan",
    "SessionPlan": "._plan",
    "BenchConfig": "._runner",
    "BenchResult": "._runner",
    "ClientResult": "._runner",
    "replay": "._runner",
    "run_bench": "._runner",
    "run_study": "._runner",
    "SteadyConfig": "._steady",
    "steady_study": "._steady",
    "WORKLOADS": "._workloads",
    "Arrivals": "._workloads",
    "TraceOptions": "._workloads",
    "make_workload": "._workloads",
}
"""Where each public name lives: imported on first use (the package's face stays light)."""

__getattr__, __dir__ = lazy_names(__name__, globals(), _HOMES)
