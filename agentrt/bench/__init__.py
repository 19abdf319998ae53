"""The benchmark harness: agent workloads replayed through each client, side by side."""

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from ._clock import VirtualTimeLoop
    from ._drivers import ClientSpec, Prompts
    from ._parallel import Workers
    from ._plan import BLOCK_TOKENS, Call, Fanout, JobPlan, SessionPlan
    from ._runner import BenchConfig, BenchResult, ClientResult, run_bench, run_study
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
    "TraceOptions",
    "VirtualTimeLoop",
    "Workers",
    "make_workload",
    "run_bench",
    "run_study",
]

_HOMES: dict[str, str] = {
    "VirtualTimeLoop": "._clock",
    "ClientSpec": "._drivers",
    "Prompts": "._drivers",
    "Workers": "._parallel",
    "BLOCK_TOKENS": "._plan",
    "Call": "._plan",
    "Fanout": "._plan",
    "JobPlan": "._plan",
    "SessionPlan": "._plan",
    "BenchConfig": "._runner",
    "BenchResult": "._runner",
    "ClientResult": "._runner",
    "run_bench": "._runner",
    "run_study": "._runner",
    "WORKLOADS": "._workloads",
    "Arrivals": "._workloads",
    "TraceOptions": "._workloads",
    "make_workload": "._workloads",
}
"""Where each public name lives: imported on first use (the package's face stays light)."""

__getattr__, __dir__ = lazy_names(__name__, globals(), _HOMES)
