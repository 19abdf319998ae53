"""Scheduling and routing: where and in which order calls go."""

from ._health import (
    DEFAULT_FAILURES_TO_DOWN,
    DEFAULT_PROBE_INTERVAL_S,
    DEFAULT_WINDOW_S,
    EndpointHealth,
    HealthStatistics,
)
from ._priority import DEFAULT_LEVELS_S, plas_priority
from ._routing import (
    DEFAULT_CALL_COST_TOKENS,
    DEFAULT_PREFIX_CAPACITY,
    PREFIX_CUTS,
    EndpointLoad,
    HashAffinity,
    LeastLoaded,
    RoundRobin,
    RouteKey,
    Router,
    SessionAffinity,
    load_score,
    make_router,
    prefix_fingerprints,
)
from ._signals import EngineSignals, parse_vllm_metrics

__all__ = [
    "DEFAULT_CALL_COST_TOKENS",
    "DEFAULT_FAILURES_TO_DOWN",
    "DEFAULT_LEVELS_S",
    "DEFAULT_PREFIX_CAPACITY",
    "DEFAULT_PROBE_INTERVAL_S",
    "DEFAULT_WINDOW_S",
    "PREFIX_CUTS",
    "EndpointHealth",
    "EndpointLoad",
    "EngineSignals",
    "HashAffinity",
    "HealthStatistics",
    "LeastLoaded",
    "RoundRobin",
    "RouteKey",
    "Router",
    "SessionAffinity",
    "load_score",
    "make_router",
    "parse_vllm_metrics",
    "plas_priority",
    "prefix_fingerprints",
]
