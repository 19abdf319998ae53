"""Calibrating the twin's engine: from the journal's own latencies, or a live probe.

From a journal: each finished call is a prefill of its uncached prompt tokens and one
decode step per further output token. The preset's :class:`~agentrt.sim.CostModel` gives
each call's prefill seconds and decode seconds as if it ran alone; a non-negative fit of
``latency = fixed + p * prefill + d * decode`` over the calls (and ``ttft = fixed + p *
prefill`` over the streamed ones) scales the preset's prefill terms by ``p`` and its
decode terms by ``d``, and puts what is left of ``fixed`` in ``request_overhead_s``.
Calls slowed by load (queueing, large batches) would inflate the fit, so it is refitted
on the fastest quarter of the calls relative to the fit (the lower envelope: the engine
nearly idle).

From ``--endpoint``: :func:`agentrt.sim.probe_engine` measures the idle engine and
:func:`agentrt.sim.calibrate` fits the whole cost model; :func:`read_cache_config` reads
its KV capacity from vLLM's ``vllm:cache_config_info`` gauge.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from ..scheduling._signals import CacheConfig, parse_cache_config
from ..sim import EngineConfig
from ..sim._cost import _nnls, prefill_pairs
from ..telemetry._report import JobReport

__all__ = ["Fit"]

MIN_CALLS = 8
"""Fewer finished calls than this: the preset is used as it is."""
MAX_CALLS = 4000
"""Calls used for the fit (an even sample of them beyond that)."""


@dataclass(frozen=True, slots=True)
class Fit:
    """How the engine was calibrated: the preset's costs scaled to the journals'
    latencies, a probe of a server, or the preset as it is."""

    source: str
    """``journal``, ``probe`` or ``preset`` (too few calls to fit)."""
    prefill_scale: float
    """The preset's prefill cost times this."""
    decode_scale: float
    """The preset's decode cost times this."""
    overhead_s: float
    """Seconds each call takes beyond its prefill and decode (the calibrated engine's
    ``request_overhead_s``)."""
    error: float | None
    """Median relative error of the fit on the calls it kept."""
    calls: int
    """The calls fitted to."""


def _features(engine: EngineConfig, prompt: int, cached: int, output: int) -> tuple[float, float]:
    """(prefill seconds, decode seconds) of one call alone under ``engine``'s costs."""
    cost = engine.cost
    new = max(1, prompt - cached)
    chunk = engine.max_num_batched_tokens
    steps = -(-new // chunk)
    prefill = cost.prefill_token_s * new
    done = cached
    for _ in range(steps):
        n = min(chunk, prompt - done) if prompt > done else 1
        prefill += cost.prefill_pair_s * prefill_pairs(n, done)
        done += n
    prefill += cost.step_s * (steps - 1)
    ctx = prompt + output / 2
    per_token = cost.step_s + cost.decode_seq_s + cost.decode_context_token_s * (ctx + 1)
    return prefill, per_token * max(0, output - 1) + cost.step_s


def from_journal(reports: Sequence[JobReport], engine: EngineConfig) -> tuple[EngineConfig, Fit]:
    """``engine`` with its costs fitted to the journal's call latencies."""
    rows: list[tuple[float, float, float, float]] = []  # (fixed, prefill, decode, seconds)
    quiet = _quiet_calls(reports)
    for r in reports:
        for c in r.call_reports:
            if c.status != "ok" or not c.latency_s or c.prompt_tokens is None:
                continue
            if quiet is not None and c.call_id not in quiet:
                continue
            waited = c.held_s + c.queue_s  # held by load control, then queued: no service
            latency = c.latency_s - waited
            out = c.completion_tokens or 1
            pre, dec = _features(engine, c.prompt_tokens, c.cached_tokens or 0, out)
            if latency > 0:
                rows.append((1.0, pre, dec, latency))
            if c.ttft_s is not None and c.ttft_s - waited > 0:
                rows.append((1.0, pre, 0.0, c.ttft_s - waited))
    if len(rows) < MIN_CALLS:
        return engine, Fit("preset", 1.0, 1.0, engine.request_overhead_s, None, len(rows))
    if len(rows) > MAX_CALLS:
        step = len(rows) / MAX_CALLS
        rows = [rows[int(i * step)] for i in range(MAX_CALLS)]
    kept = rows
    coef = [engine.request_overhead_s + engine.cost.step_s, 1.0, 1.0]
    for _ in range(3):
        # Relative errors: each row weighted by 1 / its seconds.
        coef = _nnls([[f / row[3] for f in row[:3]] for row in kept], [1.0] * len(kept))
        ratios = [row[3] / max(1e-12, _predict(coef, row)) for row in rows]
        cut = sorted(ratios)[len(ratios) // 4]  # the fastest quarter: nearly idle
        low = [row for row, q in zip(rows, ratios, strict=True) if q <= cut]
        if len(low) >= MIN_CALLS:
            kept = low
    fixed, p, d = coef
    p = min(100.0, max(0.01, p or 1.0))
    d = min(100.0, max(0.01, d or 1.0))
    cost = engine.cost
    fitted = cost.__class__(
        step_s=cost.step_s * d,
        prefill_token_s=cost.prefill_token_s * p,
        decode_seq_s=cost.decode_seq_s * d,
        decode_context_token_s=cost.decode_context_token_s * d,
        prefill_pair_s=cost.prefill_pair_s * p,
    )
    overhead = max(0.0, fixed - fitted.step_s)
    errors = [abs(row[3] / max(1e-12, _predict(coef, row)) - 1.0) for row in kept]
    fit = Fit("journal", p, d, overhead, statistics.median(errors), len(rows))
    return engine.replace(cost=fitted, request_overhead_s=overhead), fit


def _quiet_calls(reports: Sequence[JobReport]) -> set[str] | None:
    """The calls that started with the fewest others in flight at their endpoint (the
    quietest quarter, from the jobs' ``arrival_s``): batching slows the others down. None
    when the journal has no arrivals (then all calls are used)."""
    if any(r.arrival_s is None for r in reports):
        return None
    events: dict[str | None, list[tuple[float, int, str]]] = {}
    for r in reports:
        t0 = r.arrival_s or 0.0
        for c in r.call_reports:
            if c.latency_s is None:
                continue
            start = t0 + c.start_s + c.held_s + c.queue_s
            lane = events.setdefault(c.endpoint, [])
            lane.append((start, 1, c.call_id))
            lane.append((t0 + c.start_s + c.latency_s, -1, c.call_id))
    busy: list[tuple[int, str]] = []
    for lane in events.values():
        lane.sort(key=lambda e: (e[0], e[1]))  # ends before starts at the same time
        running = 0
        for _, delta, call_id in lane:
            if delta > 0:
                busy.append((running, call_id))
            running += delta
    if len(busy) < 4 * MIN_CALLS:
        return None
    busy.sort()
    cut = busy[len(busy) // 4][0]
    return {call_id for n, call_id in busy if n <= cut}


def _predict(coef: Sequence[float], row: tuple[float, float, float, float]) -> float:
    return coef[0] * row[0] + coef[1] * row[1] + coef[2] * row[2]


async def _probe_async(url: str, model: str | None) -> tuple[list[object], str]:
    import httpx

    from ..sim import probe_engine

    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0)) as client:
        if model is None:
            resp = await client.get(url.rstrip("/") + "/models")
            resp.raise_for_status()
            model = str(resp.json()["data"][0]["id"])
        samples = await probe_engine(client, url, model=model, repeats=2)
    return list(samples), model


def from_probe(
    url: str, engine: EngineConfig, model: str | None = None
) -> tuple[EngineConfig, Fit]:
    """``engine`` with the cost model fitted to a probe of the idle engine at ``url``."""
    import anyio
    import httpx

    from ..sim import StepSample, calibrate

    try:
        samples, _ = anyio.run(_probe_async, url, model)
    except httpx.HTTPError as exc:
        hint = ""
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
            hint = f"; is a server running at {url}? Check --endpoint"
        raise ValueError(f"probing {url} failed: {type(exc).__name__}: {exc}{hint}") from None
    cost = calibrate([s for s in samples if isinstance(s, StepSample)])
    fit = Fit(
        "probe",
        cost.prefill_token_s / engine.cost.prefill_token_s if engine.cost.prefill_token_s else 1,
        (cost.step_s + cost.decode_seq_s) / (engine.cost.step_s + engine.cost.decode_seq_s),
        engine.request_overhead_s,
        None,
        len(samples),
    )
    return engine.replace(cost=cost), fit


def read_cache_config(url: str) -> CacheConfig | None:
    """The KV capacity the server at ``url`` (an OpenAI base URL) reports on
    ``/metrics`` at its origin, where vLLM serves it; None when it has no such gauge or
    does not answer."""
    import httpx

    u = httpx.URL(url)
    origin = f"{u.scheme}://{u.netloc.decode('ascii')}"
    try:
        resp = httpx.get(origin + "/metrics", timeout=10.0)
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    return parse_cache_config(resp.text)
