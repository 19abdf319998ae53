"""The benchmark harness: agent workloads replayed through each client, side by side."""

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
