"""Prometheus metrics from the event stream (optional extra ``prometheus``).

``Runtime(prometheus=registry)`` installs a :class:`PrometheusHook` that registers
agentrt's metrics in that ``CollectorRegistry`` (``prometheus=True``: the default
registry) and updates them from the events. The metric objects are created once per
registry and shared by every hook on it, so several runtimes (or a runtime re-created in
the same process) may use one registry.

Labels come only from bounded sets: the job name (``job_name``), the endpoint's base URL
(``endpoint_url``), the status, the tool name, the reason of a failed attempt; never a
job, session or call id. No label is one that Prometheus or its Kubernetes operator sets
on every scraped series (``job``, ``instance``, ``endpoint``, ``service``, ``pod``,
``namespace``, ``container``): with the default ``honor_labels: false`` such a label is
renamed ``exported_<name>``. Names follow Prometheus' conventions: the base unit as a
suffix (``_seconds``), ``_total`` on counters (added by prometheus_client). Job
and tool names are the caller's strings, so each label keeps at most
``max_label_values`` distinct values per registry (default
:data:`DEFAULT_MAX_LABEL_VALUES`); later new values are reported as ``"other"``. Give
jobs a name per kind of job (``rt.job("triage")``), not per instance.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Final

from ._events import (
    AttemptFailed,
    CallEnded,
    CallSent,
    CallStarted,
    Event,
    JobEnded,
    JobStarted,
    SessionMoved,
    ToolEnded,
)

__all__ = [
    "CALL_BUCKETS",
    "DEFAULT_MAX_LABEL_VALUES",
    "HELD_BUCKETS",
    "JOB_BUCKETS",
    "QUEUE_BUCKETS",
    "TOOL_BUCKETS",
    "TTFT_BUCKETS",
    "PrometheusHook",
]

INSTALL_HINT: Final = 'pip install "agentjct[prometheus]"'

DEFAULT_MAX_LABEL_VALUES: Final = 100
"""Distinct job names (and, separately, tool names, endpoints, failure reasons) kept as
label values per registry; later new ones become ``"other"``."""

OTHER: Final = "other"
JOB: Final = "job_name"
"""Not ``job``: Prometheus sets ``job`` on every series it scrapes (the scrape job)."""
ENDPOINT: Final = "endpoint_url"
"""Not ``endpoint``: the Prometheus operator's ServiceMonitor sets ``endpoint`` (the port)."""
JOB_ENDPOINT: Final = (JOB, ENDPOINT)

CALL_BUCKETS: Final = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300, 600)
"""LLM call latency, queue and retries included: 50 ms to 10 minutes."""
TTFT_BUCKETS: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120)
QUEUE_BUCKETS: Final = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
HELD_BUCKETS: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
"""Holds by load control: 10 ms to 10 minutes (its default bound is 300 s)."""
TOOL_BUCKETS: Final = (0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800)
JOB_BUCKETS: Final = (
    0.5,
    1,
    2,
    5,
    10,
    20,
    30,
    60,
    120,
    300,
    600,
    1200,
    1800,
    3600,
    7200,
    14400,
)
"""Job completion time: a second to four hours."""


def _import_prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        raise ImportError(
            f"Runtime(prometheus=...) needs the prometheus_client package: {INSTALL_HINT}"
        ) from exc
    return prometheus_client


def check_registry(registry: Any) -> Any:
    """The registry ``Runtime(prometheus=...)`` names (None: the default one); raises if
    prometheus_client is missing or ``registry`` is not one of its registries."""
    prom = _import_prometheus()
    if registry is None:
        return prom.REGISTRY
    if not isinstance(registry, prom.CollectorRegistry):
        raise TypeError(
            f"prometheus must be True or a prometheus_client.CollectorRegistry, got {registry!r}"
        )
    return registry


class _Bounded:
    """Maps a caller's string to itself while fewer than ``limit`` distinct values have
    been seen, else to ``"other"``; a value seen once keeps its label."""

    __slots__ = ("limit", "seen")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen: set[str] = set()

    def __call__(self, value: str) -> str:
        seen = self.seen
        if value in seen:
            return value
        if len(seen) < self.limit:
            seen.add(value)
            return value
        return OTHER


class _Metrics:
    """agentrt's metric objects in one registry, and the label caps they share."""

    def __init__(self, prom: Any, registry: Any, max_label_values: int) -> None:
        def hist(name: str, doc: str, labels: tuple[str, ...], buckets: Any) -> Any:
            return prom.Histogram(name, doc, labels, buckets=buckets, registry=registry)

        def counter(name: str, doc: str, labels: tuple[str, ...] = JOB_ENDPOINT) -> Any:
            return prom.Counter(name, doc, labels, registry=registry)

        self.job_duration = hist(
            "agentrt_job_duration_seconds",
            "Job completion time: from entering rt.job(...) to leaving it.",
            (JOB, "status"),
            JOB_BUCKETS,
        )
        self.call_duration = hist(
            "agentrt_call_duration_seconds",
            "LLM call latency as the job saw it: time held, queue time and retries included.",
            (JOB, ENDPOINT, "status"),
            CALL_BUCKETS,
        )
        self.call_queue = hist(
            "agentrt_call_queue_seconds",
            "Time a call waited in agentrt's admission queue.",
            JOB_ENDPOINT,
            QUEUE_BUCKETS,
        )
        self.call_held = hist(
            "agentrt_call_held_seconds",
            "Time a held call waited at its session's tool boundary for room in its "
            "replica's KV (load control); calls that were not held are not observed.",
            JOB_ENDPOINT,
            HELD_BUCKETS,
        )
        self.ttft = hist(
            "agentrt_call_time_to_first_token_seconds",
            "Time to the first streamed chunk (streaming calls only).",
            JOB_ENDPOINT,
            TTFT_BUCKETS,
        )
        self.tool_wait = hist(
            "agentrt_tool_wait_seconds",
            "Tool waits: the idle gaps in a session between its LLM calls.",
            (JOB, "tool", "status"),
            TOOL_BUCKETS,
        )
        self.attempts = counter(
            "agentrt_call_attempts", "Attempts sent (retries and failovers included)."
        )
        self.failed = counter(
            "agentrt_call_attempt_failures",
            "Failed attempts (connection error or retryable status), by reason.",
            (JOB, ENDPOINT, "reason", "retried"),
        )
        self.moves = counter(
            "agentrt_session_moves",
            "Calls whose session went to another replica than its previous turn "
            "(the cached prefix there is lost): overload moves and failovers.",
            (JOB, "from_endpoint", "to_endpoint"),
        )
        self.prompt_tokens = counter(
            "agentrt_prompt_tokens", "Prompt tokens of finished calls, as servers reported them."
        )
        self.completion_tokens = counter(
            "agentrt_completion_tokens", "Completion tokens of finished calls, as reported."
        )
        self.cached_tokens = counter(
            "agentrt_cached_tokens", "Prompt tokens served from the server's prefix cache."
        )
        self.journal_lines = prom.Counter(
            "agentrt_journal_lines",
            "Job reports the journal wrote (outcome=written) or lost (outcome=lost).",
            ("outcome",),
            registry=registry,
        )
        self.jobs_in_progress = prom.Gauge(
            "agentrt_jobs_in_progress", "Jobs running.", (JOB,), registry=registry
        )
        self.calls_in_progress = prom.Gauge(
            "agentrt_calls_in_progress", "LLM calls in flight.", (JOB,), registry=registry
        )
        self.job_label = _Bounded(max_label_values)
        self.tool_label = _Bounded(max_label_values)
        self.endpoint_label = _Bounded(max_label_values)
        self.reason_label = _Bounded(max_label_values)
        self._children: dict[tuple[object, ...], Any] = {}
        self.load = _LoadCollector(prom)
        registry.register(self.load)

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, cached (labels() takes a lock and builds a key)."""
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def call_end(self, job: str, endpoint: str, status: str) -> tuple[Any, ...]:
        """The series a finished call updates, in one cached lookup (the hot path)."""
        key = ("call_end", job, endpoint, status)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (
                self.calls_in_progress.labels(job),
                self.call_duration.labels(job, endpoint, status),
                self.call_queue.labels(job, endpoint),
                self.ttft.labels(job, endpoint),
                self.prompt_tokens.labels(job, endpoint),
                self.completion_tokens.labels(job, endpoint),
                self.cached_tokens.labels(job, endpoint),
            )
        return children


class _LoadCollector:
    """Load control's state, read from the watched runtimes' ``load_statistics()`` when
    the registry is scraped (nothing on the calls' path): ``agentrt_sessions_held`` (a
    gauge: sessions held at a tool boundary now) and ``agentrt_load_control_forced``
    (a counter: holds that ended at the bound without room), each summed over the live
    runtimes of the registry whose load control is on. No series while there is none:
    the held time itself is ``agentrt_call_held_seconds``, from the calls' events."""

    def __init__(self, prom: Any) -> None:
        self._core = prom.metrics_core
        self.sources: weakref.WeakSet[Any] = weakref.WeakSet()

    def describe(self) -> list[Any]:
        return []  # the names are checked at each collect, not at registration

    def collect(self) -> list[Any]:
        stats = [s for s in (source.load_statistics() for source in list(self.sources)) if s]
        if not stats:
            return []
        core = self._core
        return [
            core.GaugeMetricFamily(
                "agentrt_sessions_held",
                "Sessions held by load control at their tool boundaries now (their "
                "replica's KV full of other live sessions' contexts).",
                value=sum(s.held_now for s in stats),
            ),
            core.CounterMetricFamily(
                "agentrt_load_control_forced",
                "Holds that ended at load control's bound (max_hold_s) without room: "
                "forced admissions.",
                value=sum(s.forced for s in stats),
            ),
        ]


_BY_REGISTRY: weakref.WeakKeyDictionary[Any, _Metrics] = weakref.WeakKeyDictionary()


def _metrics_for(prom: Any, registry: Any, max_label_values: int) -> _Metrics:
    metrics = _BY_REGISTRY.get(registry)
    if metrics is None:
        metrics = _BY_REGISTRY[registry] = _Metrics(prom, registry, max_label_values)
    return metrics


def _reason(error: str) -> str:
    """``HTTP 503`` -> ``http_503``; ``ConnectError: ...`` -> ``ConnectError``."""
    if error.startswith("HTTP "):
        return "http_" + error[5:].strip()
    return error.partition(":")[0].strip() or "error"


class PrometheusHook:
    """A hook that keeps agentrt's Prometheus metrics (see docs/telemetry.md).

    ``registry``: a ``prometheus_client.CollectorRegistry``; None: the default registry.
    The metrics are registered once per registry; hooks on the same registry share them
    (and the label caps, ``max_label_values`` being the first hook's).
    """

    def __init__(
        self, registry: Any = None, *, max_label_values: int = DEFAULT_MAX_LABEL_VALUES
    ) -> None:
        prom = _import_prometheus()
        registry = check_registry(registry)
        if max_label_values < 1:
            raise ValueError("max_label_values must be >= 1")
        self.registry = registry
        self._m = _metrics_for(prom, registry, max_label_values)
        self._jobs: dict[str, str] = {}
        """Job id -> its job label, while the job runs."""
        self._dispatch: dict[type[Event], Callable[[Any], None]] = {
            JobStarted: self._job_started,
            JobEnded: self._job_ended,
            CallStarted: self._call_started,
            CallSent: self._call_sent,
            AttemptFailed: self._attempt_failed,
            CallEnded: self._call_ended,
            SessionMoved: self._session_moved,
            ToolEnded: self._tool_ended,
        }

    def __repr__(self) -> str:
        return f"<agentrt PrometheusHook registry={self.registry!r}>"

    def watch_load(self, runtime: Any) -> None:
        """Read ``runtime.load_statistics()`` (its load control's held sessions and forced
        admissions) whenever the registry is scraped, while the runtime lives (a weak
        reference: a runtime that is gone drops out)."""
        self._m.load.sources.add(runtime)

    def journal_line(self, written: bool) -> None:
        """Count one journal line, written or lost (the runtime's journal calls this)."""
        self._m.child(self._m.journal_lines, "written" if written else "lost").inc()

    def __call__(self, event: Event) -> None:
        handler = self._dispatch.get(type(event))
        if handler is not None:
            handler(event)

    def _job(self, job_id: str) -> str:
        return self._jobs.get(job_id, "unknown")

    def _job_started(self, e: JobStarted) -> None:
        m = self._m
        label = self._jobs[e.job_id] = m.job_label(e.name)
        m.child(m.jobs_in_progress, label).inc()

    def _job_ended(self, e: JobEnded) -> None:
        m = self._m
        label = self._jobs.pop(e.job_id, None)
        if label is None:
            label = m.job_label(e.report.name)
        else:
            m.child(m.jobs_in_progress, label).dec()
        m.child(m.job_duration, label, e.report.status).observe(e.report.jct_s)

    def _call_started(self, e: CallStarted) -> None:
        m = self._m
        m.child(m.calls_in_progress, self._job(e.job_id)).inc()

    def _call_sent(self, e: CallSent) -> None:
        m = self._m
        m.child(m.attempts, self._job(e.job_id), m.endpoint_label(e.endpoint)).inc()

    def _attempt_failed(self, e: AttemptFailed) -> None:
        m = self._m
        m.child(
            m.failed,
            self._job(e.job_id),
            m.endpoint_label(e.endpoint),
            m.reason_label(_reason(e.error)),
            "true" if e.will_retry else "false",
        ).inc()

    def _call_ended(self, e: CallEnded) -> None:
        m, r = self._m, e.report
        endpoint = m.endpoint_label(r.endpoint) if r.endpoint is not None else "none"
        in_progress, duration, queue, ttft, prompt, completion, cached = m.call_end(
            self._job(e.job_id), endpoint, e.status
        )
        in_progress.dec()
        if r.latency_s is not None:
            duration.observe(r.latency_s)
        queue.observe(r.queue_s)
        if r.ttft_s is not None:
            ttft.observe(r.ttft_s)
        if r.held_s > 0.0:
            m.child(m.call_held, self._job(e.job_id), endpoint).observe(r.held_s)
        if r.prompt_tokens:
            prompt.inc(r.prompt_tokens)
        if r.completion_tokens:
            completion.inc(r.completion_tokens)
        if r.cached_tokens:
            cached.inc(r.cached_tokens)

    def _session_moved(self, e: SessionMoved) -> None:
        m = self._m
        source = m.endpoint_label(e.from_endpoint) if e.from_endpoint else "none"
        m.child(m.moves, self._job(e.job_id), source, m.endpoint_label(e.to_endpoint)).inc()

    def _tool_ended(self, e: ToolEnded) -> None:
        m = self._m
        m.child(m.tool_wait, self._job(e.job_id), m.tool_label(e.name), e.status).observe(
            e.duration_s
        )
