"""What ``agentrt check`` reads from each URL, and what it makes of it.

Each URL is asked two GETs, the ones a runtime itself sends: ``/models`` under its base
URL (is the OpenAI API there, and which models does it serve) and its Prometheus
``/metrics`` page, looked for where the runtime's polls look (``metrics_candidates``) and
read with the runtime's own parsers (``parse_vllm_metrics``, ``parse_cache_config``). No
completion is sent: checking costs the servers nothing.
"""

from __future__ import annotations

import json
import socket
import ssl
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import anyio
import httpx

from .._config import Endpoint
from .._options import _authorization, _poll_interval
from .._state import metrics_candidates
from ..dialects import get_dialect
from ..scheduling._signals import parse_cache_config, parse_prometheus, parse_vllm_metrics

__all__ = ["EndpointCheck", "Plan", "check_endpoints", "lines", "plan"]

_SGLANG_KV: Final = "sglang:max_total_num_tokens"
"""SGLang's KV pool in tokens: not read by the runtime (it reads vLLM's gauges), but the
figure to give as ``Endpoint(kv_capacity=...)``."""

_PREFIXES: Final = (("dynamo_", "dynamo"), ("sglang:", "sglang"), ("vllm:", "vllm"))
"""Metric name prefixes and the dialect they show, the first found wins (a Dynamo
frontend may republish its workers' ``vllm:`` names beside its own)."""

_OWNERS: Final = {"vllm": "vllm", "sglang": "sglang", "agentrt-sim": "vllm"}
"""A model list's ``owned_by`` and the dialect it shows (the embedded engine speaks
vLLM's metrics)."""


@dataclass(frozen=True, slots=True)
class EndpointCheck:
    """What one URL answered, and what a runtime would read from it."""

    url: str
    """The base URL (credentials removed)."""
    problem: str | None = None
    """Why a runtime could not use it (a few words), or None: usable."""
    models: tuple[str, ...] = ()
    """The models its ``/models`` lists."""
    dialect: str = "generic"
    """The dialect it looks like: vllm, sglang, dynamo, openai, litellm or generic."""
    evidence: str = "nothing engine-specific seen"
    """What the dialect was told from."""
    metrics: str | None = None
    """Where its ``/metrics`` page answered, or None."""
    metrics_note: str = ""
    """Why no metrics page was read (when ``metrics`` is None)."""
    load: bool = False
    """Its page has the engine load gauges the runtime reads (vLLM's running, waiting,
    KV use)."""
    kv_tokens: int | None = None
    """KV capacity in tokens, as the runtime reads it (``vllm:cache_config_info``)."""
    kv_hint: int | None = None
    """A KV capacity the page states in a form the runtime does not read (SGLang's):
    give it as ``Endpoint(url, kv_capacity=...)``."""

    @property
    def usable(self) -> bool:
        return self.problem is None


def _message(reply: httpx.Response) -> str:
    """A server's own words in an error reply (OpenAI's ``error.message``, FastAPI's
    ``detail``, or the text itself; not an HTML page), on one line and short."""
    if "html" in reply.headers.get("content-type", ""):
        return ""
    text = reply.content.decode("utf-8", "replace").strip()
    try:
        data: Any = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        found = data.get("error", data.get("detail", data.get("message")))
        if isinstance(found, dict):
            found = found.get("message")
        if isinstance(found, str):
            text = found
    text = " ".join(text.split())
    return text if len(text) <= 70 else text[:67] + "..."


def _causes(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(out) < 10:
        out.append(seen)
        seen = seen.__cause__ or seen.__context__
    return out


def _unreachable(exc: httpx.HTTPError, timeout: float) -> str:
    """A transport error in a few words (from the OS's error under httpx's: on asyncio
    a refused connection reads 'All connection attempts failed')."""
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer within {timeout:g} s ({type(exc).__name__})"
    causes = _causes(exc)
    if any(isinstance(c, ConnectionRefusedError) for c in causes):
        return "connection refused: is the server running, on this port?"
    if any(isinstance(c, socket.gaierror) for c in causes):
        return "host not found (DNS): check the host name"
    if any(isinstance(c, ssl.SSLError) for c in causes):
        return f"TLS failed: {str(exc)[:60]}"
    text = str(exc)
    what = "could not connect" if isinstance(exc, httpx.ConnectError) else type(exc).__name__
    return f"{what}: {text[:60]}" if text else what


def _models(body: bytes) -> tuple[list[str], set[str]] | None:
    """The model ids and owners of an OpenAI model list, or None if it is not one."""
    try:
        data: Any = json.loads(body)
    except ValueError:
        return None
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return None
    ids = [m["id"] for m in items if isinstance(m, dict) and isinstance(m.get("id"), str)]
    owners = {m.get("owned_by") for m in items if isinstance(m, dict)}
    return ids, {o for o in owners if isinstance(o, str)}


def _dialect(names: Sequence[str], owners: set[str], headers: httpx.Headers) -> tuple[str, str]:
    """The dialect a server looks like, and what told it: its metric names' prefixes,
    else its model list's ``owned_by``, else its reply headers."""
    for prefix, dialect in _PREFIXES:
        if any(name.startswith(prefix) for name in names):
            return dialect, f"{prefix}* metrics"
    for owner in sorted(owners):
        if owner in _OWNERS:
            return _OWNERS[owner], f"owned_by {owner}"
    keys = {k.lower() for k in headers}
    if any(k.startswith("x-litellm-") for k in keys):
        return "litellm", "x-litellm-* headers"
    if keys & {"openai-version", "openai-organization", "openai-processing-ms"}:
        return "openai", "openai-* headers"
    return "generic", "nothing engine-specific seen"


async def _get(
    client: httpx.AsyncClient, url: str, auth: bytes | None
) -> httpx.Response | httpx.HTTPError:
    headers = {} if auth is None else {"authorization": auth.decode("latin-1")}
    try:
        return await client.get(url, headers=headers)
    except httpx.HTTPError as exc:
        return exc


async def _check_one(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    api_key: str | None,
    model: str | None,
    answer_s: float,
) -> EndpointCheck:
    url = endpoint.url
    auth = _authorization(endpoint, api_key)
    got = await _get(client, f"{url}/models", auth)
    if isinstance(got, httpx.HTTPError):
        return EndpointCheck(url, _unreachable(got, answer_s))
    status = got.status_code
    if status in (401, 403):
        hint = "the key was refused" if auth else "it needs a key: --api-key-env VAR"
        return EndpointCheck(url, f"HTTP {status} on GET /models: {hint}")
    if status != 200:
        said = _message(got)
        where = "" if status != 404 else "no OpenAI API at this path"
        if status == 404 and not url.endswith("/v1"):
            where += " (most servers serve it under /v1)"
        text = "; ".join(t for t in (where, f"it says {said!r}" if said else "") if t)
        return EndpointCheck(url, f"HTTP {status} on GET /models" + (f": {text}" if text else ""))
    listed = _models(got.content)
    if listed is None:
        return EndpointCheck(url, "GET /models answered, but not with an OpenAI model list")
    models, owners = listed
    problem = None
    if model is not None and model not in models:
        problem = f"does not serve model {model!r}"
    headers = got.headers
    page: str | None = None
    where_metrics: str | None = None
    note = "no /metrics"
    for candidate in metrics_candidates(url):
        reply = await _get(client, candidate, auth)
        if isinstance(reply, httpx.HTTPError):
            note = f"/metrics: {_unreachable(reply, answer_s)}"
            break
        if reply.status_code == 200:
            page, where_metrics = reply.text, candidate
            headers = httpx.Headers([*headers.multi_items(), *reply.headers.multi_items()])
            break
        said = _message(reply)
        note = f"no /metrics (HTTP {reply.status_code}" + (f": {said!r})" if said else ")")
        if reply.status_code != 404:
            break
    samples = parse_prometheus(page) if page is not None else {}
    dialect, evidence = _dialect(list(samples), owners, headers)
    if "agentrt-sim" in owners:
        evidence += ", agentrt sim"
    load = False
    kv_tokens: int | None = None
    kv_hint: int | None = None
    if page is not None:
        load = parse_vllm_metrics(page).reading != (None, None, None)
        config = parse_cache_config(page)
        if config is not None:
            kv_tokens = config.gpu_blocks * config.block_size
        pool = samples.get(_SGLANG_KV)
        if kv_tokens is None and pool is not None and pool >= 1:
            kv_hint = int(pool)
    return EndpointCheck(
        url,
        problem,
        tuple(models),
        dialect,
        evidence,
        where_metrics,
        note if where_metrics is None else "",
        load,
        kv_tokens,
        kv_hint,
    )


async def check_endpoints(
    endpoints: Sequence[Endpoint],
    *,
    api_key: str | None = None,
    model: str | None = None,
    answer_s: float = 5.0,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[EndpointCheck]:
    """Check each endpoint, all at once; the results in the given order. ``answer_s``:
    the longest wait for each connection and each answer (httpx's timeouts)."""
    out: list[EndpointCheck | None] = [None] * len(endpoints)
    async with httpx.AsyncClient(transport=transport, timeout=answer_s) as client:

        async def one(i: int, endpoint: Endpoint) -> None:
            with anyio.move_on_after(3 * answer_s + 1):
                out[i] = await _check_one(client, endpoint, api_key, model, answer_s)
                return
            out[i] = EndpointCheck(endpoint.url, f"no answer within {3 * answer_s + 1:g} s")

        async with anyio.create_task_group() as tg:
            for i, endpoint in enumerate(endpoints):
                tg.start_soon(one, i, endpoint)
    return [c for c in out if c is not None]


@dataclass(frozen=True, slots=True)
class Plan:
    """What ``Runtime(urls)`` with its defaults does with the usable endpoints."""

    replicas: int
    """Usable endpoints."""
    polled: bool
    """Their ``/metrics`` are polled (the defaults poll where routing reads them: with
    several endpoints)."""
    dialect: str | None
    """The dialect to pass, when every usable endpoint looks alike; None when they
    differ (or none is usable)."""


def plan(checks: Sequence[EndpointCheck], defaults: Mapping[str, Any]) -> Plan:
    """What a runtime with ``defaults`` (``Runtime``'s keyword defaults) does with the
    usable endpoints of ``checks``."""
    usable = [c for c in checks if c.usable]
    poll = _poll_interval(  # the runtime is given every URL, usable or not
        defaults["poll_metrics_s"], len(checks), defaults["concurrency"], defaults["policy"]
    )
    dialects = {c.dialect for c in usable}
    return Plan(len(usable), poll is not None, dialects.pop() if len(dialects) == 1 else None)


def _kv(c: EndpointCheck, polled: bool) -> str:
    if c.kv_tokens is not None:
        return f"KV {c.kv_tokens:,} tok" + ("; KV placement on" if polled else "")
    if c.kv_hint is not None:
        return (
            f"KV unknown to agentrt: for KV placement give Endpoint(url, "
            f"kv_capacity={c.kv_hint}) (its {_SGLANG_KV})"
        )
    return "KV unknown" + ("; KV placement once evictions show it" if polled else "")


def _line(c: EndpointCheck, polled: bool) -> str:
    if c.problem is not None and not c.models:
        return f"FAIL  {c.url}: {c.problem}"
    shown = ", ".join(c.models[:3]) + (f" (+{len(c.models) - 3})" if len(c.models) > 3 else "")
    parts = [f"{c.dialect} ({c.evidence})", f"models {shown or '(none listed)'}"]
    if c.problem is not None:
        return f"FAIL  {c.url}: {c.problem}; " + "; ".join(parts)
    parts.append(_kv(c, polled))
    if polled:
        parts.append(
            "engine load polled from its /metrics"
            if c.load
            else f"load: its own calls only ({c.metrics_note or 'no vLLM load gauges'})"
        )
    elif c.metrics is None:
        parts.append(c.metrics_note)
    return f"ok    {c.url}: " + "; ".join(parts)


def _summary(checks: Sequence[EndpointCheck], p: Plan) -> list[tuple[str, str]]:
    """What the runtime does with the URLs: (topic, text) rows under a heading row."""
    n = len(checks)
    urls = f"[...{n} URLs]" if n > 1 else "URL"
    dialect = f", dialect={p.dialect!r}" if p.dialect not in (None, "generic") else ""
    rows = [("", f"With Runtime({urls}{dialect}) and its defaults:")]
    if p.replicas == 0:
        return [*rows, ("", "  nothing to send to")]
    if n == 1:
        rows.append(("routing", "none: one replica"))
    else:
        text = f"each session to the replica that holds its KV, over {p.replicas} replicas"
        if p.replicas < n:
            text += f"; the {n - p.replicas} unusable: marked down at a failed call, probed"
        rows.append(("routing", text))
    if p.polled:
        usable = [c for c in checks if c.usable]
        load = sum(c.load for c in usable)
        kv = sum(c.kv_tokens is not None for c in usable)
        rows.append(
            (
                "polls",
                f"each /metrics about every 1 s: engine load on {load} of {p.replicas}, "
                f"KV placement on {kv} of {p.replicas}; a queue on the client only "
                "while an engine queues",
            )
        )
    else:
        rows.append(("polls", "none (only routing or a queue policy reads them)"))
    if p.dialect is None:
        rows.append(
            (
                "calls",
                "the URLs look like different servers: give each its "
                "dialect, Endpoint(url, dialect=...)",
            )
        )
    else:
        doc = get_dialect(p.dialect).doc
        rows.append(("calls", "carry " + (doc.partition(": ")[2] or doc)))
    return rows


def lines(checks: Sequence[EndpointCheck], p: Plan, width: int = 79) -> list[str]:
    """The report: one entry per URL, then what a runtime does with them, each wrapped
    to ``width`` columns (continuations indented)."""
    out = []
    for c in checks:
        out += textwrap.wrap(
            _line(c, p.polled), width, subsequent_indent=" " * 6, break_on_hyphens=False
        )
    for topic, text in _summary(checks, p):
        if not topic:
            out.append(text)
            continue
        out += textwrap.wrap(
            text,
            width,
            initial_indent=f"  {topic:<8}  ",
            subsequent_indent=" " * 12,
            break_on_hyphens=False,
        )
    bad = sum(not c.usable for c in checks)
    if bad:
        out.append(f"{bad} of {len(checks)} URLs unusable: fix them or leave them out")
    return out
