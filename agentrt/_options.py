"""Runtime's arguments: the checks they pass, and the endpoint states, policies and
timeouts they make (``Runtime.__init__`` builds the runtime from them)."""

from __future__ import annotations

import base64
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, Literal, Protocol, cast

from ._config import Endpoint, Retry, check_api_key
from ._ids import random_bytes
from ._state import _EndpointState
from .dialects import DialectOptions, DialectSpec, resolve_dialect
from .scheduling._admission import Admission
from .scheduling._health import EndpointHealth
from .scheduling._limiter import make_limit
from .scheduling._loadcontrol import LoadControl
from .scheduling._placement import WorkingSet
from .scheduling._poll import AUTO_POLL_S
from .scheduling._queue import Policy, make_policy
from .scheduling._routing import EndpointLoad, Router, make_router
from .telemetry._events import Hook
from .telemetry._journal import Journal
from .telemetry._otel_use import otel_in_use

__all__ = ["AsyncTransport", "Checked", "PolicySpec", "TimeoutLike", "check", "telemetry_hooks"]


def _poll_interval(
    poll: float | Literal["auto"] | None,
    n_endpoints: int,
    concurrency: object,
    policy: object,
) -> float | None:
    """The metrics polls' (base) interval, or None for none. ``"auto"`` polls where a
    decision reads the engines' load: routing among several endpoints, or an
    ``"engine"`` cap that holds calls for a policy other than FCFS."""
    if poll != "auto":
        return poll
    if n_endpoints > 1 or (concurrency == "engine" and policy != "fcfs"):
        return AUTO_POLL_S
    return None


class AsyncTransport(Protocol):
    """An async transport of legacy ``httpx`` or of ``httpx2`` (same shape)."""

    async def handle_async_request(self, request: Any) -> Any: ...

    async def aclose(self) -> None: ...


class TimeoutLike(Protocol):
    """An ``httpx.Timeout`` or an ``httpx2.Timeout``: each phase's limit in seconds
    (``None``: none)."""

    @property
    def connect(self) -> float | None: ...
    @property
    def read(self) -> float | None: ...
    @property
    def write(self) -> float | None: ...
    @property
    def pool(self) -> float | None: ...


_PHASES: Final = ("connect", "read", "write", "pool")


def _timeout_phases(timeout: object) -> dict[str, float | None]:
    """The four phases' limits of ``timeout_s``: a number is every phase's but the
    connect's (10 s); a Timeout of either library gives its own, each checked."""
    if isinstance(timeout, int | float) and not isinstance(timeout, bool):
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout_s must be a finite number > 0, got {timeout!r}")
        return {"connect": 10.0, "read": timeout, "write": timeout, "pool": timeout}
    if type(timeout).__name__ != "Timeout" or not all(hasattr(timeout, p) for p in _PHASES):
        raise TypeError(
            "timeout_s must be a number of seconds or an httpx.Timeout (or httpx2.Timeout), "
            f"got {timeout!r}"
        )
    phases: dict[str, float | None] = {}
    for phase in _PHASES:
        value = getattr(timeout, phase)
        if value is not None and not (
            isinstance(value, int | float) and math.isfinite(value) and value > 0
        ):
            raise ValueError(
                f"timeout_s's {phase} timeout must be a finite number > 0 or None, got {value!r}"
            )
        phases[phase] = value
    return phases


PolicySpec = str | Policy | Callable[[], Policy]
"""A policy name (``"fcfs"``, ``"plas"``, ``"atlas"``, ``"mlfq"``, ``"edf"``), a factory
(e.g. ``lambda: PLAS(starvation_ratio=2.0)``) or, with a single endpoint, an instance."""


def _policy_factory(policy: PolicySpec, n_endpoints: int) -> Callable[[], Policy]:
    """Each endpoint queues its own calls, so each gets its own policy instance (fed the
    same feedback, they classify alike)."""
    if isinstance(policy, str):
        make_policy(policy)  # fail now on a bad name
        return partial(make_policy, policy)
    if isinstance(policy, type) or not hasattr(policy, "pop"):
        if not callable(policy):
            raise TypeError(f"policy must be a name, a Policy or a factory, got {policy!r}")
        return cast("Callable[[], Policy]", policy)
    if n_endpoints > 1:
        raise ValueError(
            "a Policy instance can serve one endpoint only (each endpoint queues its own "
            "calls); pass a policy name or a factory such as 'lambda: PLAS(...)'"
        )
    instance = cast("Policy", policy)
    return lambda: instance


def _endpoints(
    endpoints: Sequence[str | Endpoint] | str | Endpoint,
    dialect: DialectSpec,
    policy: PolicySpec,
    concurrency: int | Literal["auto", "engine"] | None,
    token_budget: int | None,
    send_priority: bool | Literal["auto"],
    polled: bool,
) -> list[_EndpointState]:
    if isinstance(endpoints, str | Endpoint):
        endpoints = [endpoints]
    if not endpoints:
        raise ValueError("Runtime needs at least one endpoint, e.g. ['http://127.0.0.1:8000/v1']")
    out = []
    seen: set[str] = set()
    new_policy = _policy_factory(policy, len(endpoints))
    if concurrency is not None and not (
        concurrency in ("auto", "engine")
        or (isinstance(concurrency, int) and not isinstance(concurrency, bool) and concurrency >= 1)
    ):
        raise ValueError(
            f"concurrency must be an int >= 1, 'auto', 'engine' or None, got {concurrency!r}"
        )
    if not (isinstance(send_priority, bool) or send_priority == "auto"):
        raise ValueError(f"send_priority must be True, False or 'auto', got {send_priority!r}")
    # 'engine' caps only on the engine's queue, which only polled metrics show: without
    # polling it is no limit at all (and keeps the admission gate's fast path).
    limit = None if concurrency == "engine" and not polled else concurrency
    if token_budget is not None and not (isinstance(token_budget, int) and token_budget >= 1):
        raise ValueError(f"token_budget must be an int >= 1 or None, got {token_budget!r}")
    for item in endpoints:
        ep = Endpoint(item) if isinstance(item, str) else item
        if not isinstance(ep, Endpoint):
            raise TypeError(f"an endpoint must be a URL string or agentrt.Endpoint, got {ep!r}")
        if ep.url in seen:
            raise ValueError(f"endpoint {ep.url} is listed twice")
        seen.add(ep.url)
        d = resolve_dialect(ep.dialect if ep.dialect is not None else dialect)
        prio = send_priority if ep.send_priority is None else ep.send_priority
        state = _EndpointState(
            ep,
            d,
            EndpointLoad(weight=ep.weight),
            Admission(new_policy(), make_limit(limit), token_budget),
            EndpointHealth(),
            DialectOptions(send_priority=prio is True),
            working_set=WorkingSet(ep.kv_capacity, source="setting"),
        )
        state.priority_auto = prio == "auto"
        out.append(state)
    return out


def _authorization(endpoint: Endpoint, api_key: str | None) -> bytes | None:
    """The ``Authorization`` header of an endpoint's calls: its own ``api_key``, else its
    Basic credentials (``basic_auth``, or ``user:password@`` in its URL, as httpx would
    send them), else the runtime's ``api_key``; None: the caller's header goes as it is
    (less agentrt's placeholder key)."""
    if endpoint.api_key is not None:
        return f"Bearer {endpoint.api_key}".encode()
    if endpoint.basic_auth is not None:
        user, password = endpoint.basic_auth
        return b"Basic " + base64.b64encode(f"{user}:{password}".encode())
    if api_key is not None:
        return f"Bearer {api_key}".encode()
    return None


@dataclass(slots=True)
class Checked:
    """Runtime's arguments, checked, and what they make without a side effect."""

    states: list[_EndpointState]
    router: Router
    timeouts: dict[str, float | None]
    poll: float | None
    """The metrics polls' interval (None: no polls)."""
    settings: dict[str, Any]
    """The settings each job's report records (``JobReport.runtime``)."""


def check(
    endpoints: Sequence[str | Endpoint] | str | Endpoint,
    *,
    dialect: DialectSpec,
    api_key: str | None,
    routing: str | Router,
    policy: PolicySpec,
    concurrency: int | Literal["auto", "engine"] | None,
    token_budget: int | None,
    send_priority: bool | Literal["auto"],
    retry: Retry,
    timeout_s: float | TimeoutLike,
    keep_reports: int,
    poll_metrics_s: float | Literal["auto"] | None,
    hooks: Sequence[Hook],
    otel: bool,
    prometheus: Any,
    learn_waits: bool,
    load_control: bool | LoadControl = True,
) -> Checked:
    """Check :class:`Runtime`'s arguments (raising as it raises), before anything is
    opened or registered: ``Runtime.__init__`` builds on the result, and ``SyncRuntime``
    checks its arguments with it before its thread starts."""
    if api_key is not None:
        check_api_key(api_key)
    if not isinstance(retry, Retry):
        raise TypeError("retry must be an agentrt.Retry")
    timeouts = _timeout_phases(timeout_s)
    if keep_reports < 0:
        raise ValueError("keep_reports must be >= 0")
    if (
        poll_metrics_s is not None
        and poll_metrics_s != "auto"
        and not (
            isinstance(poll_metrics_s, int | float)
            and not isinstance(poll_metrics_s, bool)
            and math.isfinite(poll_metrics_s)
            and poll_metrics_s > 0
        )
    ):
        raise ValueError(
            f"poll_metrics_s must be 'auto', a number > 0 or None, got {poll_metrics_s!r}"
        )
    n_endpoints = 1 if isinstance(endpoints, str | Endpoint) else len(endpoints)
    poll = _poll_interval(poll_metrics_s, n_endpoints, concurrency, policy)
    states = _endpoints(
        endpoints,
        dialect,
        policy,
        concurrency,
        token_budget,
        send_priority,
        polled=poll is not None,
    )
    for state in states:
        state.authorization = _authorization(state.endpoint, api_key)
    router = make_router(routing, endpoints=[state.endpoint.url for state in states])
    for hook in hooks:
        if not callable(hook):
            raise TypeError(f"a hook must be a callable taking one event, got {hook!r}")
    if not isinstance(otel, bool):
        raise TypeError(f"otel must be True or False, got {otel!r}")
    if not isinstance(learn_waits, bool):
        raise TypeError(f"learn_waits must be True or False, got {learn_waits!r}")
    if not isinstance(load_control, bool | LoadControl):
        raise TypeError(
            f"load_control must be True, False or an agentrt.LoadControl, got {load_control!r}"
        )
    if prometheus is not None and prometheus is not False:
        from .telemetry._prometheus import check_registry

        check_registry(None if prometheus is True else prometheus)
    settings = {
        "routing": routing if isinstance(routing, str) else router.name,
        "policy": policy if isinstance(policy, str) else type(policy).__name__,
        "concurrency": concurrency,
        "token_budget": token_budget,
        "send_priority": send_priority,
        "learn_waits": learn_waits,
        "load_control": load_control if isinstance(load_control, bool) else True,
        "poll_metrics_s": poll_metrics_s,  # "engine" caps only when polled
        "endpoints": len(states),
        # Whose load routing compares: "engine" (polled metrics: the fleet's),
        # "local" (this process's calls only) or "mixed"; kept current by the polls.
        "load_view": "local",
        # This runtime, so that journals written by a fleet tell its processes apart.
        "runtime_id": random_bytes(6).hex(),
    }
    return Checked(states, router, timeouts, poll, settings)


def telemetry_hooks(
    hooks: Sequence[Hook],
    *,
    otel: bool,
    prometheus: Any,
    journal: str | os.PathLike[str] | None,
    capture_content: bool,
    load: Any = None,
) -> tuple[tuple[Hook, ...], Journal | None]:
    """A runtime's hooks, in the order they hear each event: the caller's, OpenTelemetry's
    (when it is installed), Prometheus's, then the journal (opened now: a bad path fails
    here), which tells the exporters of each line it writes or loses. ``load``: the
    runtime whose ``load_statistics()`` Prometheus reads when scraped (its load control
    is on)."""
    out = list(hooks)
    counters: list[Callable[[bool], None]] = []
    """The exporters' journal-line counters."""
    if otel and otel_in_use():  # (the hook's module is imported only then)
        from .telemetry._otel import otel_hook

        span_hook = otel_hook(capture_content=bool(capture_content))
        if span_hook is not None:  # None: opentelemetry is not installed
            out.append(span_hook)
            counters.append(span_hook.journal_line)  # type: ignore[attr-defined]
    if prometheus is not None and prometheus is not False:
        from .telemetry._prometheus import PrometheusHook

        prom_hook = PrometheusHook(None if prometheus is True else prometheus)
        if load is not None:
            prom_hook.watch_load(load)
        out.append(prom_hook)
        counters.append(prom_hook.journal_line)
    opened = None
    if journal is not None:
        opened = Journal(journal)
        opened.observers.extend(counters)
        out.append(opened)
    return tuple(out), opened
