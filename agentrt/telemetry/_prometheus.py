"""Prometheus metrics from the event stream (optional extra ``prometheus``)."""

from __future__ import annotations

from typing import Any

from ._events import Event

__all__ = ["PrometheusHook"]


class PrometheusHook:
    """Placeholder while the exporter is written."""

    def __init__(self, registry: Any = None) -> None:
        raise NotImplementedError("the Prometheus exporter is not written yet")

    def __call__(self, event: Event) -> None:
        return None
