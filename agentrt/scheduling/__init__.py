"""Scheduling and routing: where and in which order calls go."""

from ._priority import DEFAULT_LEVELS_S, plas_priority
from ._routing import EndpointLoad, RoundRobin, Router, SessionAffinity, make_router

__all__ = [
    "DEFAULT_LEVELS_S",
    "EndpointLoad",
    "RoundRobin",
    "Router",
    "SessionAffinity",
    "make_router",
    "plas_priority",
]
