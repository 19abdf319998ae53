"""OpenTelemetry spans and metrics from the event stream (optional extra ``otel``).

Placeholder while the exporter is written: without ``opentelemetry`` installed the hook
is None (no spans, no cost).
"""

from __future__ import annotations

import importlib.util

from ._events import Hook

__all__ = ["otel_hook"]


def otel_hook(*, capture_content: bool = False) -> Hook | None:
    """The span and metrics hook, or None when ``opentelemetry-api`` is not installed."""
    if importlib.util.find_spec("opentelemetry") is None:
        return None
    return None
