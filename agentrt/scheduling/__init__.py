"""Scheduling and routing: where and in which order calls go."""

from ._admission import Admission, AdmissionStatistics
from ._health import (
    DEFAULT_FAILURES_TO_DOWN,
    DEFAULT_PROBE_INTERVAL_S,
    DEFAULT_WINDOW_S,
    EndpointHealth,
    HealthStatistics,
)
from ._limiter import AIMDLimit, EngineQueueLimit, FixedLimit, GradientLimit, Limit, make_limit
from ._placement import CallOutcome
from ._priority import DEFAULT_LEVELS_S, plas_priority
from ._queue import ATLAS, EDF, FCFS, MLFQ, PLAS, Policy, Ticket, make_policy
from ._retention import DEFAULT_RETENTION_SAMPLES, MIN_CACHEABLE_TOKENS, RetentionEstimator
from ._routing import (
    DEFAULT_CALL_COST_TOKENS,
    DEFAULT_PREFIX_CAPACITY,
    DEFAULT_RETENTION_MARGIN,
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
    "ATLAS",
    "DEFAULT_CALL_COST_TOKENS",
    "DEFAULT_FAILURES_TO_DOWN",
    "DEFAULT_LEVELS_S",
    "DEFAULT_PREFIX_CAPACITY",
    "DEFAULT_PROBE_INTERVAL_S",
    "DEFAULT_RETENTION_MARGIN",
    "DEFAULT_RETENTION_SAMPLES",
    "DEFAULT_WINDOW_S",
    "EDF",
    "FCFS",
    "MIN_CACHEABLE_TOKENS",
    "MLFQ",
    "PLAS",
    "PREFIX_CUTS",
    "AIMDLimit",
    "Admission",
    "AdmissionStatistics",
    "CallOutcome",
    "EndpointHealth",
    "EndpointLoad",
    "EngineQueueLimit",
    "EngineSignals",
    "FixedLimit",
    "GradientLimit",
    "HashAffinity",
    "HealthStatistics",
    "LeastLoaded",
    "Limit",
    "Policy",
    "RetentionEstimator",
    "RoundRobin",
    "RouteKey",
    "Router",
    "SessionAffinity",
    "Ticket",
    "load_score",
    "make_limit",
    "make_policy",
    "make_router",
    "parse_vllm_metrics",
    "plas_priority",
    "prefix_fingerprints",
]
