"""OpenTelemetry spans and metrics from the event stream (optional extra ``otel``).

Spans and metrics go to the globally installed tracer and meter providers (no-ops until
the application installs real ones). Names follow the OpenTelemetry GenAI semantic
conventions (development status; docs/telemetry.md names the commit checked):

* ``invoke_workflow {job name}`` (INTERNAL) for each job, the child of the span that was
  current when the job started, and itself current inside the job's block;
* ``invoke_agent {session name}`` (INTERNAL) for each session of a job, a child of its
  parent session's agent span (a sub-agent) or else of the job's workflow span; a job
  with one session has one;
* ``{chat|text_completion|embeddings} {model}`` (CLIENT) for each call, a child of its
  session's agent span; its W3C ``traceparent`` goes out with every attempt
  (``CallSent.headers``) so that the engine's own spans join the trace;
* ``execute_tool {tool name}`` (INTERNAL) for each tool wait, a child of its session's
  agent span, with the id of the tool call it answers when the session's last reply
  asked for a tool of that name.

Which GenAI names: by default those of semantic-conventions-genai ``SEMCONV_COMMIT``;
``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental`` selects the latest ones
(``SEMCONV_LATEST_COMMIT``: ``gen_ai.client.inference.*`` metrics,
``gen_ai.invoke_workflow.duration``; the token usage metrics of ``SEMCONV_USAGE_COMMIT``:
counters ``gen_ai.client.inference.usage.detailed.*`` and histograms
``gen_ai.client.inference.usage.{input,output}_tokens``), and
``gen_ai_latest_experimental/dup`` both. docs/telemetry.md has every name per mode.

A call made outside any job (an implicit one-call job) has no workflow or agent span:
its call span is a child of the span current when it was made. A session that announced
no start (``SyncRuntime``'s sessions emit no ``SessionOpened``) gets its agent span at
its first call or tool wait, ended with the job.

Event times (``anyio.current_time()``, monotonic or virtual) become epoch nanoseconds
through each job's anchor: ``JobStarted`` carries both its clock time and the wall-clock
start. State is kept per open job, session, call and tool wait, and dropped when it ends.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from ._events import (
    AttemptFailed,
    CallEnded,
    CallSent,
    CallStarted,
    Event,
    FirstToken,
    Hook,
    JobEnded,
    JobStarted,
    SessionClosed,
    SessionMoved,
    SessionOpened,
    ToolEnded,
    ToolStarted,
)
from ._otel_use import otel_in_use

if TYPE_CHECKING:
    from contextvars import Token

    from opentelemetry.context import Context
    from opentelemetry.metrics import Meter, MeterProvider
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from ._report import CallReport

__all__ = ["otel_hook"]

SEMCONV_COMMIT = "004902b8cb70aa5ae6ca4ae07132b7daabcd3e10"
"""The open-telemetry/semantic-conventions-genai commit whose ``model/gen-ai/spans.yaml``
and ``metrics.yaml`` every ``gen_ai.*`` name here was checked against."""

SEMCONV_LATEST_COMMIT = "32c328e85013588c6fe32ebc30934ab5b1752b6a"
"""The open-telemetry/semantic-conventions-genai commit of ``docs/gen-ai/non-normative/
migration.md`` whose names the opt-in mode emits (with ``model/gen-ai/token-metrics.yaml``
at 9b2ce3b4 and ``docs/gen-ai/client-inference.md`` at ac48b1f9)."""

SEMCONV_USAGE_COMMIT = "2f4c6b1ccd79b294ad445e7ea899544cc07ff9da"
"""The open-telemetry/semantic-conventions-genai commit of ``model/gen-ai/usage-metrics.yaml``
(with ``docs/gen-ai/gen-ai-inference-usage-metrics.md`` at ef678ba7) whose token usage
metrics the opt-in mode emits: counters ``gen_ai.client.inference.usage.detailed.*`` by
``gen_ai.token.modality``, histograms ``gen_ai.client.inference.usage.{input,output}_tokens``
(the names ``token-metrics.yaml`` at 9b2ce3b4 had given the counters)."""

SEMCONV_LATEST_SPAN_COMMIT = "024a4f944a1291fcb627c9c47da69e79868dd15e"
"""The open-telemetry/semantic-conventions-genai commit of ``docs/gen-ai/client-inference.md``
whose inference span attributes ``gen_ai.usage.cache_write.input_tokens`` and
``gen_ai.usage.reasoning.output_tokens`` (both recommended, each a subset of the input or
output total) the opt-in mode adds to call spans when the server reports them."""

SEMCONV_OPT_IN_ENV = "OTEL_SEMCONV_STABILITY_OPT_IN"
"""The environment variable OpenTelemetry's instrumentations read for opt-in conventions:
a comma-separated list of category values."""
SEMCONV_LATEST = "gen_ai_latest_experimental"
"""The value that selects the latest GenAI names (and drops today's)."""
SEMCONV_DUP = "gen_ai_latest_experimental/dup"
"""agentrt's value for both name sets at once, after the ``http/dup`` convention."""

SemconvMode = Literal["default", "latest", "both"]


def semconv_mode(value: str | None) -> SemconvMode:
    """The GenAI name set an ``OTEL_SEMCONV_STABILITY_OPT_IN`` value selects: ``latest``
    for ``gen_ai_latest_experimental``, ``both`` for ``gen_ai_latest_experimental/dup``
    (it wins when both are listed), else ``default``. Other categories' values (``http``,
    ``database/dup``) are not agentrt's and are ignored, as every instrumentation does."""
    if not value:
        return "default"
    values = {v.strip().lower() for v in value.split(",")}
    if SEMCONV_DUP in values:
        return "both"
    if SEMCONV_LATEST in values:
        return "latest"
    return "default"


PROVIDER = "openai"
"""``gen_ai.provider.name``: every endpoint agentrt drives speaks the OpenAI REST API."""
TOOL_TYPE = "function"
"""``gen_ai.tool.type``: a tool the application runs itself (``session.tool(...)``)."""
TOKEN_MODALITY = "unknown"
"""``gen_ai.token.modality`` on the latest usage counters: an OpenAI-style usage object
does not break tokens down by modality, and the conventions then ask for ``unknown``."""

DURATION_BUCKETS: tuple[float, ...] = tuple(0.01 * 2**i for i in range(14))
"""The bucket boundaries the GenAI conventions advise for ``gen_ai.client.operation.duration``
(0.01, 0.02, ..., 81.92 s); agentrt uses them for the time to first chunk too."""
TOKEN_BUCKETS = tuple(4**i for i in range(14))
"""The bucket boundaries advised for ``gen_ai.client.token.usage`` (1, 4, ..., 4**13)."""
TOOL_BUCKETS: tuple[float, ...] = tuple(0.01 * 2**i for i in range(17))
"""Tool executions: 0.01 s to about 11 minutes (the conventions advise none)."""
JOB_BUCKETS: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0)
JOB_BUCKETS += (250.0, 500.0, 1000.0, 2500.0, 5000.0)
"""Jobs and agents run from under a second to over an hour (the conventions advise none)."""

_ERROR_NAME = re.compile(r"^(?:endpoint \S+ failed after \d+ attempt\(s\): )?([A-Za-z_][\w.]*): ")


def otel_hook(*, capture_content: bool = False) -> Hook | None:
    """The span and metrics hook; None when ``opentelemetry-api`` is not installed, or
    when no tracer or meter provider has been installed yet (then spans would be no-ops:
    install the SDK's providers before building the Runtime). Its GenAI names are those
    ``OTEL_SEMCONV_STABILITY_OPT_IN`` selects when it is built (:func:`semconv_mode`).

    Nothing is imported when no provider can have been installed: OpenTelemetry's API not
    imported yet and no provider named in the environment (a runtime in a program that
    does not use OpenTelemetry pays nothing for it)."""
    if not otel_in_use():
        return None
    try:
        import opentelemetry.metrics
        import opentelemetry.propagate
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        return None
    semconv = semconv_mode(os.environ.get(SEMCONV_OPT_IN_ENV))
    hook = _OtelHook(capture_content=capture_content, semconv=semconv)
    # Without an SDK provider (installed before the Runtime is built, the usual order)
    # every span would be a no-op: install no hook at all, so no event is even built.
    return hook if hook._sdk_installed() else None


@dataclass(slots=True)
class _Job:
    offset_ns: int
    """Epoch nanoseconds at clock time 0 (this job's anchor)."""
    parent: Context
    """What the job's sessions are children of (its workflow span, when it has one)."""
    name: str = ""
    span: Span | None = None
    """The ``invoke_workflow`` span; None for an implicit one-call job."""
    token: Token[Context] | None = None
    """The context token of the job span made current (detached at JobEnded)."""
    sessions: list[str] = field(default_factory=list)
    """The ids of its sessions that have an agent span still open."""


@dataclass(slots=True)
class _Agent:
    """A session's ``invoke_agent`` span, and what it sums over the session's calls."""

    span: Span
    context: Context
    name: str
    start_t: float
    session_id: str
    tool_calls: list[tuple[str, str]] = field(default_factory=list)
    """``(id, name)`` of the tool calls its last reply asked for, not yet matched to a
    tool wait."""
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None


@dataclass(slots=True)
class _Call:
    span: Span
    offset_ns: int
    metric_attrs: dict[str, Any]
    agent: _Agent | None
    context: Context | None = None


@dataclass(slots=True)
class _Tool:
    span: Span
    offset_ns: int
    metric_attrs: dict[str, Any]


def _add(total: int | None, n: int | None) -> int | None:
    return total if n is None else (total or 0) + n


class _Instruments:
    """The hook's metric instruments, today's names and the latest ones (``semconv``
    picks which the hook records to)."""

    def __init__(self, meter: Meter) -> None:
        self.op_duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.token_usage = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        )
        self.first_chunk = meter.create_histogram(
            "gen_ai.client.operation.time_to_first_chunk",
            unit="s",
            description="Time to receive the first chunk of a streamed reply.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.workflow_duration = meter.create_histogram(
            "gen_ai.workflow.duration",
            unit="s",
            description="GenAI workflow duration: a job's completion time.",
            explicit_bucket_boundaries_advisory=JOB_BUCKETS,
        )
        self.agent_duration = meter.create_histogram(
            "gen_ai.invoke_agent.duration",
            unit="s",
            description="Duration of an agent invocation: a session, opened to closed.",
            explicit_bucket_boundaries_advisory=JOB_BUCKETS,
        )
        self.tool_duration = meter.create_histogram(
            "gen_ai.execute_tool.duration",
            unit="s",
            description="Duration of a tool execution (a tool wait).",
            explicit_bucket_boundaries_advisory=TOOL_BUCKETS,
        )
        # The latest names (semantic-conventions-genai SEMCONV_LATEST_COMMIT): inference
        # metrics of their own (#521), the workflow metric's new name; token counters and
        # per-operation histograms in place of gen_ai.client.token.usage, as
        # SEMCONV_USAGE_COMMIT's usage-metrics.yaml names them.
        self.inference_duration = meter.create_histogram(
            "gen_ai.client.inference.duration",
            unit="s",
            description="GenAI inference duration.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.inference_first_chunk = meter.create_histogram(
            "gen_ai.client.inference.time_to_first_chunk",
            unit="s",
            description="Time to receive the first chunk of a streamed inference reply.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        (
            self.usage_input,
            self.usage_output,
            self.usage_cache_read,
            self.usage_cache_write,
            self.usage_reasoning,
        ) = (
            meter.create_counter(f"gen_ai.client.inference.usage.detailed.{what}", "{token}", brief)
            for what, brief in (
                (
                    "input_tokens",
                    "The number of input (prompt) tokens used, including cached tokens.",
                ),
                ("output_tokens", "The number of output tokens used, including reasoning tokens."),
                ("cache_read.input_tokens", "Input tokens served from a provider-managed cache."),
                ("cache_write.input_tokens", "Input tokens written to a provider-managed cache."),
                ("reasoning.output_tokens", "Output tokens used for reasoning."),
            )
        )
        self.operation_input = meter.create_histogram(
            "gen_ai.client.inference.usage.input_tokens",
            unit="{token}",
            description="The number of input (prompt) tokens used per inference operation.",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        )
        self.operation_output = meter.create_histogram(
            "gen_ai.client.inference.usage.output_tokens",
            unit="{token}",
            description="The number of output (completion) tokens used per inference operation.",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        )
        self.invoke_workflow_duration = meter.create_histogram(
            "gen_ai.invoke_workflow.duration",
            unit="s",
            description="GenAI workflow duration: a job's completion time.",
            explicit_bucket_boundaries_advisory=JOB_BUCKETS,
        )
        self.job_phase = meter.create_histogram(
            "agentrt.job.phase.duration",
            unit="s",
            description=(
                "A job's time per phase (agentrt.phase: held, queue, llm, critical_llm, tool)."
            ),
            explicit_bucket_boundaries_advisory=JOB_BUCKETS,
        )
        self.journal_lines = meter.create_counter(
            "agentrt.journal.lines",
            unit="{line}",
            description="Job reports the journal wrote or lost (agentrt.journal.outcome).",
        )


def _tracer_and_meter(
    tracer_provider: TracerProvider | None, meter_provider: MeterProvider | None
) -> tuple[Tracer, Meter]:
    """agentrt's tracer and meter, from the given providers or the global ones."""
    from opentelemetry import metrics, trace

    from .._version import __version__

    tracer = (
        tracer_provider.get_tracer("agentrt", __version__)
        if tracer_provider is not None
        else trace.get_tracer("agentrt", __version__)
    )
    meter = (
        meter_provider.get_meter("agentrt", __version__)
        if meter_provider is not None
        else metrics.get_meter("agentrt", __version__)
    )
    return tracer, meter


class _OtelHook:
    """Turns events into spans and metrics. One per Runtime."""

    def __init__(
        self,
        *,
        capture_content: bool,
        semconv: SemconvMode = "default",
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        """``tracer_provider`` and ``meter_provider`` replace the global ones (tests);
        with them the hook counts as installed."""
        from opentelemetry import context, metrics, propagate, trace

        if semconv not in ("default", "latest", "both"):
            raise ValueError(f"semconv must be 'default', 'latest' or 'both', not {semconv!r}")
        self.semconv: SemconvMode = semconv
        self._legacy = semconv != "latest"
        """Emit today's names (those of :data:`SEMCONV_COMMIT`)."""
        self._latest = semconv != "default"
        """Emit the latest names (those of :data:`SEMCONV_LATEST_COMMIT`)."""
        self._own_providers = tracer_provider is not None or meter_provider is not None

        self._trace = trace
        self._metrics = metrics
        self._context = context
        self._on = False
        """Whether an SDK provider was installed when the last job started."""
        self._propagate = propagate
        self._capture = capture_content
        self._tracer, meter = _tracer_and_meter(tracer_provider, meter_provider)
        self._m = _Instruments(meter)
        # Fallback anchor, for events of a job this hook did not see start.
        self._offset_ns = time.time_ns() - time.monotonic_ns()
        self._jobs: dict[str, _Job] = {}
        self._agents: dict[tuple[str, str], _Agent] = {}
        """Open agent spans by (job id, session id): session ids may be the caller's."""
        self._calls: dict[str, _Call] = {}
        self._tools: dict[tuple[str, int], _Tool] = {}
        self._servers: dict[str, tuple[str | None, int | None]] = {}
        self._handlers = self._event_handlers()

    def __call__(self, event: Event, /) -> None:
        kind = type(event)
        if kind is JobStarted:
            self._on = self._sdk_installed()  # checked once per job
        if not self._on and not self._jobs and not self._calls:
            return  # the API alone would make no-op spans: skip the work entirely
        handler = self._handlers.get(kind)
        if handler is not None:
            handler(event)

    def journal_line(self, written: bool) -> None:
        """Count one journal line, written or lost (the runtime's journal calls this)."""
        outcome = "written" if written else "lost"
        self._m.journal_lines.add(1, {"agentrt.journal.outcome": outcome})

    def _sdk_installed(self) -> bool:
        """Whether a tracer or meter provider has been installed globally (until then the
        API hands out proxies, and every span and measurement would be dropped)."""
        if self._own_providers:
            return True
        tracer_provider = self._trace.get_tracer_provider()
        if not isinstance(tracer_provider, self._trace.ProxyTracerProvider):
            return True
        meter_provider = self._metrics.get_meter_provider()
        return type(meter_provider).__name__ != "_ProxyMeterProvider"

    def _event_handlers(self) -> dict[type[Event], Callable[[Any], None]]:
        """Which method handles each kind of event (the others are ignored)."""
        return {
            JobStarted: self._job_started,
            JobEnded: self._job_ended,
            SessionOpened: self._session_opened,
            SessionClosed: self._session_closed,
            CallStarted: self._call_started,
            CallSent: self._call_sent,
            AttemptFailed: self._attempt_failed,
            FirstToken: self._first_token,
            SessionMoved: self._session_moved,
            CallEnded: self._call_ended,
            ToolStarted: self._tool_started,
            ToolEnded: self._tool_ended,
        }

    def __repr__(self) -> str:
        return "<agentrt OpenTelemetry hook>"

    # -- jobs ---------------------------------------------------------------------------

    def _job_started(self, e: JobStarted) -> None:
        offset = int(e.started_at.timestamp() * 1e9) - int(e.t * 1e9)
        parent = self._context.get_current()
        if e.implicit:
            self._jobs[e.job_id] = _Job(offset, parent, e.name)
            return
        span = self._tracer.start_span(
            f"invoke_workflow {e.name}",
            context=parent,
            kind=self._trace.SpanKind.INTERNAL,
            start_time=offset + int(e.t * 1e9),
            attributes={
                "gen_ai.operation.name": "invoke_workflow",
                "gen_ai.workflow.name": e.name,
                "agentrt.job.id": e.job_id,
                "agentrt.program.id": e.program_id,
            },
        )
        ctx = self._trace.set_span_in_context(span, parent)
        token = self._context.attach(ctx)
        self._jobs[e.job_id] = _Job(offset, ctx, e.name, span, token)

    def _job_ended(self, e: JobEnded) -> None:
        job = self._jobs.pop(e.job_id, None)
        if job is None:
            return
        for session_id in job.sessions:  # sessions still open (or never announced)
            agent = self._agents.pop((e.job_id, session_id), None)
            if agent is not None:
                self._end_agent(agent, job.offset_ns, e.t)
        if job.span is None:
            return
        span, r = job.span, e.report
        if job.token is not None and self._trace.get_current_span() is span:
            # Only where it was made current: an event from another context leaves it.
            self._context.detach(job.token)
        error_type = None
        if r.status == "error":
            error_type = _error_type(r.error)
        elif r.status in ("deadline", "cancelled"):
            error_type = r.status
        if span.is_recording():
            span.set_attributes(
                {
                    "agentrt.job.status": r.status,
                    "agentrt.job.jct_s": r.jct_s,
                    "agentrt.job.llm_s": r.llm_s,
                    "agentrt.job.critical_llm_s": r.critical_llm_s,
                    "agentrt.job.queue_s": r.queue_s,
                    "agentrt.job.held_s": r.held_s,
                    "agentrt.job.tool_s": r.tool_s,
                    "agentrt.job.calls": r.calls,
                    "agentrt.job.tool_waits": r.tool_waits,
                    "agentrt.job.sessions": r.sessions,
                    "agentrt.job.retries": r.retries,
                    "agentrt.job.session_moves": r.session_moves,
                    "gen_ai.usage.input_tokens": r.prompt_tokens,
                    "gen_ai.usage.output_tokens": r.completion_tokens,
                    "gen_ai.usage.cache_read.input_tokens": r.cached_tokens,
                }
            )
            if error_type is not None:
                span.set_attribute("error.type", error_type)
            if r.status in ("error", "deadline"):
                span.set_status(self._trace.StatusCode.ERROR, r.error)
        span.end(end_time=job.offset_ns + int(e.t * 1e9))
        attrs = {"gen_ai.workflow.name": r.name}
        if error_type is not None:
            attrs["error.type"] = error_type
        if self._legacy:
            self._m.workflow_duration.record(r.jct_s, attrs)
        if self._latest:
            self._m.invoke_workflow_duration.record(r.jct_s, attrs)
        name = r.name
        phase = self._m.job_phase
        phase.record(r.held_s, {"agentrt.job.name": name, "agentrt.phase": "held"})
        phase.record(r.queue_s, {"agentrt.job.name": name, "agentrt.phase": "queue"})
        phase.record(r.llm_s, {"agentrt.job.name": name, "agentrt.phase": "llm"})
        phase.record(r.critical_llm_s, {"agentrt.job.name": name, "agentrt.phase": "critical_llm"})
        phase.record(r.tool_s, {"agentrt.job.name": name, "agentrt.phase": "tool"})

    def _job(self, job_id: str) -> _Job:
        job = self._jobs.get(job_id)
        if job is None:  # started before this hook was installed: a root of its own
            job = _Job(self._offset_ns, self._context.get_current())
        return job

    # -- sessions (agents) ------------------------------------------------------------------

    def _session_opened(self, e: SessionOpened) -> None:
        job = self._jobs.get(e.job_id)
        if job is not None and job.span is not None:
            parent = None
            if e.parent_id is not None:
                parent = self._agents.get((e.job_id, e.parent_id))
            self._open_agent(job, e.job_id, e.session_id, e.name, parent, e.t)

    def _open_agent(
        self,
        job: _Job,
        job_id: str,
        session_id: str,
        name: str | None,
        parent: _Agent | None,
        t: float,
    ) -> _Agent:
        agent_name = name or job.name
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": agent_name,
            "gen_ai.conversation.id": session_id,
            "agentrt.job.id": job_id,
            "agentrt.session.id": session_id,
        }
        if parent is not None:
            attrs["agentrt.session.parent_id"] = parent.session_id
        span = self._tracer.start_span(
            f"invoke_agent {agent_name}",
            context=parent.context if parent is not None else job.parent,
            kind=self._trace.SpanKind.INTERNAL,
            start_time=job.offset_ns + int(t * 1e9),
            attributes=attrs,
        )
        ctx = self._trace.set_span_in_context(span)
        agent = self._agents[job_id, session_id] = _Agent(span, ctx, agent_name, t, session_id)
        job.sessions.append(session_id)
        return agent

    def _session_closed(self, e: SessionClosed) -> None:
        agent = self._agents.pop((e.job_id, e.session_id), None)
        if agent is None:
            return
        job = self._jobs.get(e.job_id)
        if job is not None:
            try:
                job.sessions.remove(e.session_id)
            except ValueError:
                pass
        self._end_agent(agent, job.offset_ns if job is not None else self._offset_ns, e.t)

    def _end_agent(self, agent: _Agent, offset_ns: int, t: float) -> None:
        span = agent.span
        if span.is_recording():
            attrs: dict[str, Any] = {}
            if agent.input_tokens is not None:
                attrs["gen_ai.usage.input_tokens"] = agent.input_tokens
            if agent.output_tokens is not None:
                attrs["gen_ai.usage.output_tokens"] = agent.output_tokens
            if agent.cached_tokens is not None and self._legacy:
                # The latest conventions dropped it from invoke_agent spans (#469).
                attrs["gen_ai.usage.cache_read.input_tokens"] = agent.cached_tokens
            span.set_attributes(attrs)
        span.end(end_time=offset_ns + int(t * 1e9))
        duration = t - agent.start_t
        self._m.agent_duration.record(
            duration if duration > 0.0 else 0.0, {"gen_ai.agent.name": agent.name}
        )

    def _parent(
        self, job: _Job, job_id: str, session_id: str, name: str | None, t: float
    ) -> _Agent | None:
        """The agent span of a session; opened here for a session of a job with a
        workflow span that announced no start (``SyncRuntime``'s)."""
        agent = self._agents.get((job_id, session_id))
        if agent is None and job.span is not None and self._jobs.get(job_id) is job:
            agent = self._open_agent(job, job_id, session_id, name, None, t)
        return agent

    # -- calls --------------------------------------------------------------------------

    def _call_started(self, e: CallStarted) -> None:
        job = self._job(e.job_id)
        agent = self._parent(job, e.job_id, e.session_id, e.session_name, e.t)
        op = _operation(e.path)
        attrs: dict[str, Any] = {"gen_ai.operation.name": op, "gen_ai.provider.name": PROVIDER}
        if e.model:
            attrs["gen_ai.request.model"] = e.model
        metric_attrs = dict(attrs)
        attrs["gen_ai.conversation.id"] = e.session_id
        if e.stream:
            attrs["gen_ai.request.stream"] = True
        if e.max_tokens is not None:
            attrs["gen_ai.request.max_tokens"] = e.max_tokens
        if e.temperature is not None:
            attrs["gen_ai.request.temperature"] = e.temperature
        attrs["agentrt.job.id"] = e.job_id
        attrs["agentrt.session.id"] = e.session_id
        attrs["agentrt.call.id"] = e.call_id
        attrs["agentrt.turn"] = e.turn
        if self._capture and e.content is not None:
            attrs["gen_ai.input.messages"] = json.dumps(_input_messages(e.content), default=str)
        span = self._tracer.start_span(
            f"{op} {e.model}" if e.model else op,
            context=agent.context if agent is not None else job.parent,
            kind=self._trace.SpanKind.CLIENT,
            start_time=job.offset_ns + int(e.t * 1e9),
            attributes=attrs,
        )
        self._calls[e.call_id] = _Call(span, job.offset_ns, metric_attrs, agent)

    def _call_sent(self, e: CallSent) -> None:
        call = self._calls.get(e.call_id)
        if call is None:
            return
        span = call.span
        if call.context is None:
            call.context = self._trace.set_span_in_context(span)
        if "traceparent" not in e.headers:  # an earlier hook's trace context wins
            self._propagate.inject(e.headers, context=call.context)
        address, port = self._server(e.endpoint)
        if address is not None:
            call.metric_attrs["server.address"] = address
            if port is not None:
                call.metric_attrs["server.port"] = port
        if span.is_recording():
            attrs: dict[str, Any] = {
                "agentrt.endpoint": e.endpoint,
                "agentrt.attempts": e.attempt,
                "agentrt.held_s": e.held_s,
                "agentrt.queue_s": e.queue_s,
            }
            if address is not None:
                attrs["server.address"] = address
                if port is not None:
                    attrs["server.port"] = port
            if e.priority is not None:
                attrs["agentrt.priority"] = e.priority
            span.set_attributes(attrs)

    def _attempt_failed(self, e: AttemptFailed) -> None:
        call = self._calls.get(e.call_id)
        if call is not None and call.span.is_recording():
            call.span.add_event(
                "agentrt.attempt_failed",
                {
                    "agentrt.attempt": e.attempt,
                    "agentrt.endpoint": e.endpoint,
                    "agentrt.error": e.error,
                    "agentrt.will_retry": e.will_retry,
                },
                timestamp=call.offset_ns + int(e.t * 1e9),
            )

    def _first_token(self, e: FirstToken) -> None:
        call = self._calls.get(e.call_id)
        if call is not None:
            call.span.set_attribute("gen_ai.response.time_to_first_chunk", e.ttft_s)

    def _session_moved(self, e: SessionMoved) -> None:
        call = self._calls.get(e.call_id)
        if call is not None:
            call.span.set_attribute("agentrt.session.moved", True)

    def _call_ended(self, e: CallEnded) -> None:
        call = self._calls.pop(e.call_id, None)
        if call is None:
            return
        span, r = call.span, e.report
        error_type = None
        if r.status == "error":
            if r.http_status is not None and r.http_status >= 400:
                error_type = str(r.http_status)
            else:
                error_type = _error_type(r.error)
        elif r.status == "cancelled":
            error_type = "cancelled"
        finish_reasons = e.finish_reasons
        if not finish_reasons and e.finish_reason is not None:
            finish_reasons = (e.finish_reason,)
        if span.is_recording():
            attrs: dict[str, Any] = {
                "agentrt.attempts": r.attempts,
                "agentrt.held_s": r.held_s,
                "agentrt.queue_s": r.queue_s,
                "agentrt.status": r.status,
            }
            if e.response_id is not None:
                attrs["gen_ai.response.id"] = e.response_id
            if e.response_model is not None:
                attrs["gen_ai.response.model"] = e.response_model
            if finish_reasons:
                attrs["gen_ai.response.finish_reasons"] = list(finish_reasons)
            if r.prompt_tokens is not None:
                attrs["gen_ai.usage.input_tokens"] = r.prompt_tokens
            if r.completion_tokens is not None:
                attrs["gen_ai.usage.output_tokens"] = r.completion_tokens
            if r.cached_tokens is not None:
                attrs["gen_ai.usage.cache_read.input_tokens"] = r.cached_tokens
            if self._latest:  # the inference span's attributes at SEMCONV_LATEST_SPAN_COMMIT
                if r.cache_write_tokens is not None:
                    attrs["gen_ai.usage.cache_write.input_tokens"] = r.cache_write_tokens
                if r.reasoning_tokens is not None:
                    attrs["gen_ai.usage.reasoning.output_tokens"] = r.reasoning_tokens
            if r.http_status is not None:
                attrs["http.response.status_code"] = r.http_status
            if r.moved:
                attrs["agentrt.session.moved"] = True
            if error_type is not None:
                attrs["error.type"] = error_type
            if self._capture and e.output is not None:
                finish = e.finish_reason or ("unknown" if r.status == "ok" else "error")
                attrs["gen_ai.output.messages"] = json.dumps(
                    [
                        {
                            "role": "assistant",
                            "parts": [{"type": "text", "content": e.output}],
                            "finish_reason": finish,
                        }
                    ]
                )
            span.set_attributes(attrs)
            if r.status == "error":
                span.set_status(self._trace.StatusCode.ERROR, r.error)
        span.end(end_time=call.offset_ns + int(e.t * 1e9))
        agent = call.agent
        if agent is not None:
            agent.input_tokens = _add(agent.input_tokens, r.prompt_tokens)
            agent.output_tokens = _add(agent.output_tokens, r.completion_tokens)
            agent.cached_tokens = _add(agent.cached_tokens, r.cached_tokens)
            if r.status == "ok":  # the tool waits that follow answer these calls
                agent.tool_calls = list(e.tool_calls)
        attrs = call.metric_attrs
        if e.response_model is not None:
            attrs["gen_ai.response.model"] = e.response_model
        if self._latest:
            self._record_latest(dict(attrs), error_type, r)
        if not self._legacy:
            return
        if r.ttft_s is not None:
            self._m.first_chunk.record(r.ttft_s, attrs)
        if error_type is not None:
            attrs["error.type"] = error_type
        if r.latency_s is not None:
            self._m.op_duration.record(r.latency_s, attrs)
        if r.prompt_tokens is not None:
            self._m.token_usage.record(r.prompt_tokens, {**attrs, "gen_ai.token.type": "input"})
        if r.completion_tokens is not None:
            self._m.token_usage.record(
                r.completion_tokens, {**attrs, "gen_ai.token.type": "output"}
            )

    def _record_latest(self, attrs: dict[str, Any], error_type: str | None, r: CallReport) -> None:
        """A call's metrics under the latest names: inference (chat, text completion) on
        ``gen_ai.client.inference.*``; embeddings on ``gen_ai.client.operation.duration``,
        which stays for operations other than inference (unless today's names already
        recorded it there)."""
        failed = {**attrs, "error.type": error_type} if error_type is not None else attrs
        if attrs.get("gen_ai.operation.name") == "embeddings":
            if r.latency_s is not None and not self._legacy:
                self._m.op_duration.record(r.latency_s, failed)
            return
        if r.ttft_s is not None:
            self._m.inference_first_chunk.record(r.ttft_s, attrs)
        if r.latency_s is not None:
            self._m.inference_duration.record(r.latency_s, failed)
        usage = {**attrs, "gen_ai.token.modality": TOKEN_MODALITY}
        if r.prompt_tokens is not None:
            self._m.usage_input.add(r.prompt_tokens, usage)
            self._m.operation_input.record(r.prompt_tokens, attrs)
        if r.completion_tokens is not None:
            self._m.usage_output.add(r.completion_tokens, usage)
            self._m.operation_output.record(r.completion_tokens, attrs)
        if r.cached_tokens is not None:
            self._m.usage_cache_read.add(r.cached_tokens, usage)
        if r.cache_write_tokens is not None:
            self._m.usage_cache_write.add(r.cache_write_tokens, usage)
        if r.reasoning_tokens is not None:
            self._m.usage_reasoning.add(r.reasoning_tokens, usage)

    def _server(self, endpoint: str) -> tuple[str | None, int | None]:
        server = self._servers.get(endpoint)
        if server is None:
            try:
                parts = urlsplit(endpoint)
                port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
                server = (parts.hostname, port)
            except ValueError:
                server = (None, None)
            if len(self._servers) < 1024:  # endpoints are few; never grow without bound
                self._servers[endpoint] = server
        return server

    # -- tool waits ---------------------------------------------------------------------

    def _tool_started(self, e: ToolStarted) -> None:
        job = self._job(e.job_id)
        agent = self._parent(job, e.job_id, e.session_id, None, e.t)
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": e.name,
            "gen_ai.tool.type": TOOL_TYPE,
        }
        metric_attrs = dict(attrs)
        del metric_attrs["gen_ai.operation.name"]
        if agent is not None:
            attrs["gen_ai.agent.name"] = metric_attrs["gen_ai.agent.name"] = agent.name
            calls = agent.tool_calls
            for i, (call_id, name) in enumerate(calls):
                if name == e.name:  # the first call of this tool not answered yet
                    attrs["gen_ai.tool.call.id"] = call_id
                    del calls[i]
                    break
        attrs["agentrt.job.id"] = e.job_id
        attrs["agentrt.session.id"] = e.session_id
        if e.expected_s is not None:
            attrs["agentrt.tool.expected_s"] = e.expected_s
        span = self._tracer.start_span(
            f"execute_tool {e.name}",
            context=agent.context if agent is not None else job.parent,
            kind=self._trace.SpanKind.INTERNAL,
            start_time=job.offset_ns + int(e.t * 1e9),
            attributes=attrs,
        )
        self._tools[(e.job_id, e.wait_id)] = _Tool(span, job.offset_ns, metric_attrs)

    def _tool_ended(self, e: ToolEnded) -> None:
        tool = self._tools.pop((e.job_id, e.wait_id), None)
        if tool is None:
            return
        span = tool.span
        error_type = None
        if e.status == "error":
            error_type = e.error_type or "_OTHER"
        elif e.status == "cancelled":
            error_type = "cancelled"
        if span.is_recording():
            span.set_attribute("agentrt.status", e.status)
            if error_type is not None:
                span.set_attribute("error.type", error_type)
            if e.status == "error":
                span.set_status(self._trace.StatusCode.ERROR)
        span.end(end_time=tool.offset_ns + int(e.t * 1e9))
        attrs = tool.metric_attrs
        if error_type is not None:
            attrs["error.type"] = error_type
        self._m.tool_duration.record(e.duration_s, attrs)


def _operation(path: str) -> str:
    """``gen_ai.operation.name`` for a request path."""
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/completions"):
        return "text_completion"
    if path.endswith("/embeddings"):
        return "embeddings"
    return "chat"


def _error_type(error: str | None) -> str:
    """A low-cardinality ``error.type``: the exception's class name, else ``_OTHER``."""
    if error:
        m = _ERROR_NAME.match(error)
        if m is not None:
            return m.group(1)
    return "_OTHER"


def _input_messages(content: object) -> list[dict[str, Any]]:
    """OpenAI ``messages`` (or a completion ``prompt``) in the GenAI input-messages shape."""
    if isinstance(content, str):
        return [{"role": "user", "parts": [{"type": "text", "content": content}]}]
    if not isinstance(content, list):
        return [{"role": "user", "parts": [{"type": "text", "content": str(content)}]}]
    out: list[dict[str, Any]] = []
    for msg in content:
        if isinstance(msg, str):  # a list of prompts
            out.append({"role": "user", "parts": [{"type": "text", "content": msg}]})
            continue
        if not isinstance(msg, dict):
            continue
        role = str(msg.get("role", "user"))
        parts: list[dict[str, Any]] = []
        body = msg.get("content")
        if role == "tool":
            parts.append(
                {"type": "tool_call_response", "id": msg.get("tool_call_id"), "response": body}
            )
        elif isinstance(body, str):
            parts.append({"type": "text", "content": body})
        elif isinstance(body, list):
            for part in body:
                if isinstance(part, dict) and part.get("type") == "text":
                    parts.append({"type": "text", "content": part.get("text", "")})
                elif isinstance(part, dict):
                    parts.append({"type": str(part.get("type", "unknown"))})
        for tc in msg.get("tool_calls") or ():
            if not isinstance(tc, dict):
                continue
            fn = tc.get("function") or {}
            args = fn.get("arguments")
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except ValueError:
                    pass
            parts.append(
                {"type": "tool_call", "id": tc.get("id"), "name": fn.get("name"), "arguments": args}
            )
        out.append({"role": role, "parts": parts})
    return out
