"""agentrt.sim: the embedded engine, OpenAI-compatible simulated replicas with a modelled
clock.

Each replica is a continuous-batching engine (vLLM V1 semantics: iteration-level
scheduling, a token budget, chunked prefill, FCFS or priority order, preemption by
recompute) whose steps last what a linear :class:`CostModel` says, with a paged KV cache, a
prefix cache and an optional host tier. Time only passes through ``anyio.sleep``, so a
:class:`Cluster` runs in wall-clock time on asyncio and in virtual time under trio's
``MockClock(autojump_threshold=0)``. See docs/sim.md.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from ._calibrate import probe_engine
    from ._cluster import Cluster
    from ._config import PRESETS, EngineConfig
    from ._cost import CostModel, StepSample, calibrate
    from ._metrics import ReplicaStats
    from ._replica import Replica
    from ._serve import ServedURLs, ServeError, serve, serve_async
    from ._tokenize import count_tokens, output_text, prompt_for_blocks

__all__ = [
    "PRESETS",
    "Cluster",
    "CostModel",
    "EngineConfig",
    "Replica",
    "ReplicaStats",
    "ServeError",
    "ServedURLs",
    "StepSample",
    "calibrate",
    "count_tokens",
    "output_text",
    "probe_engine",
    "prompt_for_blocks",
    "serve",
    "serve_async",
]

_HOMES: dict[str, str] = {
    "probe_engine": "._calibrate",
    "Cluster": "._cluster",
    "PRESETS": "._config",
    "EngineConfig": "._config",
    "CostModel": "._cost",
    "StepSample": "._cost",
    "calibrate": "._cost",
    "ReplicaStats": "._metrics",
    "Replica": "._replica",
    "ServedURLs": "._serve",
    "ServeError": "._serve",
    "serve": "._serve",
    "serve_async": "._serve",
    "count_tokens": "._tokenize",
    "output_text": "._tokenize",
    "prompt_for_blocks": "._tokenize",
}
"""Where each public name lives: imported on first use (the package's face stays light)."""

__getattr__, __dir__ = lazy_names(__name__, globals(), _HOMES)
