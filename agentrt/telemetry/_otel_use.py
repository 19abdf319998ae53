"""Whether OpenTelemetry can be in use, told without importing it or the span hook
(``_otel``, a module that costs a first Runtime a few milliseconds to import): a runtime
in a program that does not use OpenTelemetry pays nothing for it."""

from __future__ import annotations

import os
import sys
from typing import Final

__all__ = ["otel_in_use"]

_PROVIDER_ENV: Final = ("OTEL_PYTHON_TRACER_PROVIDER", "OTEL_PYTHON_METER_PROVIDER")
"""Environment variables that name a provider OpenTelemetry's API loads on first use."""


def otel_in_use() -> bool:
    """Whether a tracer or meter provider may be installed: the API was imported (every
    way to install one imports it first) or the environment names one."""
    imported = "opentelemetry.trace" in sys.modules or "opentelemetry.metrics" in sys.modules
    return imported or any(os.environ.get(name) for name in _PROVIDER_ENV)
