"""Load signals polled from engines: Prometheus text in, a few numbers out.

Parsing never raises: a page that is empty, truncated or garbage yields ``None``s.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Final

__all__ = [
    "CacheConfig",
    "EngineSignals",
    "parse_cache_config",
    "parse_prometheus",
    "parse_vllm_metrics",
]

# name, optional {labels} (quoted values may hold '}' and escaped quotes), value.
# A trailing timestamp, if any, is ignored.
_SAMPLE: Final = re.compile(
    r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?\s+(\S+)'
)

_RUNNING: Final = ("vllm:num_requests_running",)
_WAITING: Final = ("vllm:num_requests_waiting",)
_KV_USAGE: Final = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
"""``gpu_cache_usage_perc`` is the name in vLLM before the V1 engine."""
_VLLM_NAMES: Final = (*_RUNNING, *_WAITING, *_KV_USAGE)
_SAMPLE_AT: Final = re.compile(
    r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?:[^"}\n]|"(?:[^"\\\n]|\\.)*")*\})?[ \t]+(\S+)'
)
"""One sample where its name starts (the names looked for are found with ``str.find``:
a vLLM page is a thousand lines of histograms, polled every second by every process)."""


@dataclass(frozen=True, slots=True)
class EngineSignals:
    """An engine's load as its metrics page reports it; ``None`` where not reported."""

    running: int | None = None
    """Requests in the engine's running batch."""
    waiting: int | None = None
    """Requests queued in the engine."""
    kv_usage: float | None = None
    """Fraction of the KV cache in use, 0..1."""

    @property
    def reading(self) -> tuple[int | None, int | None, float | None]:
        """``(running, waiting, kv_usage)``, to compare two polls."""
        return (self.running, self.waiting, self.kv_usage)


def _samples(text: str) -> dict[str, list[float]]:
    """Prometheus text format to ``{sample name: [value per label set]}``, finite values
    only. Comments, blank lines and lines that do not parse are skipped."""
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group(2))
        except ValueError:
            continue
        if math.isfinite(value):
            out.setdefault(m.group(1), []).append(value)
    return out


def _sample_at(text: str, at: int, name: str) -> re.Match[str] | None:
    """The sample of exactly ``name`` at ``at`` if it begins its line (after blanks), else
    None (a comment, a label value, a longer name)."""
    j = at
    while j and text[j - 1] in " \t":
        j -= 1
    if j and text[j - 1] not in "\n\r":
        return None
    m = _SAMPLE_AT.match(text, at)
    return m if m is not None and m.group(1) == name else None


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text format to ``{sample name: value summed over label sets}``.

    Never raises: lines that do not parse and non-finite values (``NaN``, ``+Inf``) are
    skipped.
    """
    if not isinstance(text, str):
        return {}
    return {name: math.fsum(values) for name, values in _samples(text).items()}


def parse_vllm_metrics(text: str) -> EngineSignals:
    """The load signals on a vLLM ``/metrics`` page.

    ``running`` and ``waiting`` are summed over label sets (several models or engines
    behind one server); ``kv_usage`` is the largest over label sets, since the fullest
    cache is the one that preempts (a sum of fractions would exceed 1). Metrics missing
    from the page are ``None``; bad input gives all ``None``.
    """
    if not isinstance(text, str):
        return EngineSignals()
    samples: dict[str, list[float]] = {}
    for name in _VLLM_NAMES:
        at = text.find(name)
        while at >= 0:
            m = _sample_at(text, at, name)
            at = text.find(name, at + len(name))
            if m is None:
                continue
            try:
                value = float(m.group(2))
            except ValueError:
                continue
            if math.isfinite(value):
                samples.setdefault(name, []).append(value)

    def first(names: tuple[str, ...]) -> list[float] | None:
        for name in names:
            if name in samples:
                return samples[name]
        return None

    running = first(_RUNNING)
    waiting = first(_WAITING)
    kv = first(_KV_USAGE)
    return EngineSignals(
        running=None if running is None else max(0, round(math.fsum(running))),
        waiting=None if waiting is None else max(0, round(math.fsum(waiting))),
        kv_usage=None if kv is None else min(max(max(kv), 0.0), 1.0),
    )


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """An engine's KV capacity, as its ``vllm:cache_config_info`` gauge labels it."""

    gpu_blocks: int
    block_size: int
    host_blocks: int | None = None


_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_cache_config(text: str) -> CacheConfig | None:
    """The first ``vllm:cache_config_info`` series of a Prometheus page with a whole
    ``num_gpu_blocks`` >= 1 and ``block_size`` >= 1 (vLLM writes ``None`` before the
    engine has profiled its memory); None when there is none."""
    if not isinstance(text, str) or "vllm:cache_config_info{" not in text:
        return None
    for line in text.splitlines():
        if not line.startswith("vllm:cache_config_info{"):
            continue
        labels = dict(_LABEL.findall(line.split("{", 1)[1].rsplit("}", 1)[0]))
        try:
            gpu = int(labels.get("num_gpu_blocks", ""))
            size = int(labels.get("block_size", ""))
        except ValueError:
            continue
        if gpu >= 1 and size >= 1:
            try:
                host: int | None = int(labels.get("num_cpu_blocks", ""))
            except ValueError:
                host = None
            return CacheConfig(gpu, size, host if host is not None and host > 0 else None)
    return None
