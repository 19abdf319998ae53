"""The runtime's shared state: its endpoints, programs and hooks, as every stage sees it.

One :class:`_Core` per :class:`~agentrt.Runtime`. The stages read and update it: the
contexts (``_context``: jobs, sessions, tool waits), the transport (``_transport``: tag,
schedule, route, send, observe), the tool-start notices (``_notice``) and the runtime
itself (``_runtime``: lifecycle, background probes). This module imports none of them but
``_notice`` (whose notices an endpoint's state switches on), so each stage can be read and
changed alone (tests/test_imports.py checks that no core module imports one that imports
it back).
"""

from __future__ import annotations

import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final, Literal

import anyio
import httpx
import openai

from ._config import Endpoint, Retry
from ._log import health_log, hooks_log, scrub, secret_forms
from ._notice import Notices, SendNotice, accepts_notice
from ._waits import WaitEstimator
from .dialects import Dialect, DialectOptions
from .scheduling._admission import Admission
from .scheduling._health import EndpointHealth
from .scheduling._loadcontrol import Gate
from .scheduling._placement import Replicas, RetentionEstimator, WorkingSet
from .scheduling._routing import EndpointLoad, Router, SessionAffinity
from .telemetry._events import Event, Hook
from .telemetry._journal import RateLimitedLog
from .telemetry._prefix import PrefixTracker
from .telemetry._report import JobReport

if TYPE_CHECKING:
    from .scheduling._queue import Ticket

__all__: list[str] = []

PLACEHOLDER_KEY: Final = "agentrt-no-key"
"""The API key of an openai client agentrt builds when it has none (openai's clients
refuse to start without one); the transport never sends it."""


PRIORITY_FEATURE: Final = "priority"
"""In ``x-agentrt-accept``: the server schedules by request priority (docs/protocol.md)."""


def accepts_feature(value: str | None, feature: str) -> bool:
    """Whether an ``x-agentrt-accept`` value lists ``feature`` (case-insensitive)."""
    if not value:
        return False
    return any(part.strip().lower() == feature for part in value.split(","))


@dataclass(slots=True)
class _EndpointState:
    endpoint: Endpoint
    dialect: Dialect
    load: EndpointLoad
    admission: Admission
    health: EndpointHealth
    options: DialectOptions

    urls: dict[str, httpx.URL] = field(default_factory=dict)
    """Parsed URLs by path suffix (a handful: chat/completions, completions, models)."""
    working_set: WorkingSet = field(default_factory=WorkingSet)
    """This client's sessions' KV working set there, and its capacity
    (scheduling/_workingset.py): placement by working set."""
    retention: RetentionEstimator = field(default_factory=RetentionEstimator)
    """How long this replica keeps idle sessions' prefixes, from its cached tokens."""
    accept: str | None = None
    """The ``x-agentrt-accept`` value of its last successful reply."""
    notices: bool = False
    """It advertised tool-start notices (and has not refused one with 405/501)."""
    notices_off: bool = False
    """It refused a notice with 405 or 501: no more are sent, whatever it advertises."""
    authorization: bytes | None = None
    """The ``Authorization`` header its calls carry (see ``_options._authorization``)."""
    priority_auto: bool = False
    """``send_priority='auto'``: priorities go to it while its replies advertise
    ``x-agentrt-accept: priority`` (a server that schedules by priority)."""
    metrics_urls: list[str] | None = None
    """Where its ``/metrics`` may be, first to try first (see ``metrics_candidates``);
    a candidate that answers 404 is dropped while another remains."""
    priority_refused: int = 0
    """Calls it refused for their priority (a vLLM not started with priority scheduling),
    each resent without one; after the first, it gets no more priorities."""

    def accept_header(self, value: str | None) -> None:
        """A successful reply's ``x-agentrt-accept`` value (called when it changes)."""
        self.accept = value
        self.notices = accepts_notice(value) and not self.notices_off
        if self.priority_auto:
            on = accepts_feature(value, PRIORITY_FEATURE)
            if on != self.options.send_priority:
                self.options = replace(self.options, send_priority=on)

    def refuse_priority(self) -> bool:
        """It refused a call for its priority: send it none from now on, whatever it
        advertises. True the first time (then the caller warns)."""
        self.priority_refused += 1
        self.priority_auto = False
        if not self.options.send_priority:
            return False
        self.options = replace(self.options, send_priority=False)
        return True

    def url_for(self, suffix: str, original: httpx.URL) -> httpx.URL:
        """This endpoint's URL for a request path suffix, keeping the query."""
        if original.query:
            url = type(original)(self.endpoint.url + suffix)  # the request's own library
            return url.copy_with(query=original.query)
        cached = self.urls.get(suffix)
        if cached is not None and type(cached) is type(original):
            return cached
        url = type(original)(self.endpoint.url + suffix)
        if len(self.urls) < 64:
            self.urls[suffix] = url
        return url


@dataclass(slots=True)
class _Program:
    service_s: float = 0.0
    service_tokens: int = 0
    jobs: int = 0


def _origin_and_path(url: str) -> tuple[tuple[str, str, int | None], str]:
    """A base URL's (scheme, host, port) and path with a trailing ``/``, as httpx reads a
    request's URL (default ports dropped, host lower case)."""
    u = httpx.URL(url)
    return (u.scheme, u.host, u.port), u.path.rstrip("/") + "/"


class _Core:
    """The runtime's shared state, as the transport and the contexts see it."""

    def __init__(
        self,
        endpoints: list[_EndpointState],
        router: Router,
        retry: Retry,
        api_key: str | None,
    ) -> None:
        self.endpoints = endpoints
        self.router = router
        self.retry = retry
        self.api_key = api_key
        self.placeholder_key = PLACEHOLDER_KEY
        pairs = [e.endpoint.basic_auth for e in endpoints if e.endpoint.basic_auth]
        self.secrets = secret_forms(
            api_key,
            *(e.endpoint.api_key for e in endpoints),
            *(password for _, password in pairs),
            *(f"{user}:{password}" for user, password in pairs),
        )
        """The runtime's and its endpoints' keys and passwords, in every form they are
        sent (:meth:`redact` takes them out of every error text agentrt stores)."""
        self.send_priority = any(e.options.send_priority or e.priority_auto for e in endpoints)
        """Whether any endpoint takes engine-level priorities (then calls carry one)."""
        self.prefix_aware = isinstance(router, SessionAffinity) and len(endpoints) > 1
        """Whether calls carry their prompts' prefix fingerprints (the session router,
        over several endpoints)."""
        self.replicas = Replicas(endpoints, router)
        """The endpoints as placement sees them (``scheduling/_placement.py``): each
        one's load, working set and retention estimate, the router, the clock."""
        self.gate: Gate | None = None
        """Load control (``scheduling/_loadcontrol.py``), when on (set by Runtime, with
        ``replicas.load_control``)."""
        self.programs: dict[str, _Program] = {}
        self.active_jobs: dict[str, str] = {}
        """The ids of the jobs running now (and their names), in the order they started."""
        self.client: openai.AsyncOpenAI = None  # type: ignore[assignment]  # set by Runtime
        self.closed = False
        """Set when the runtime's block ends: every client it built then refuses calls
        (one attribute read per call, in the transport)."""
        self.loop_thread = 0
        """The thread of the event loop the runtime was entered in (set then): a call made
        in another thread comes from another event loop, and is refused (the transport)."""
        self.on_report: Callable[[JobReport], None] = lambda report: None
        self.hooks: tuple[Hook, ...] = ()
        """Event hooks (set by Runtime). Emission points test ``if core.hooks:`` first, so
        no event is built when nobody listens."""
        self.capture_content = False
        self.prefixes: PrefixTracker | None = None
        """Prefix-sharing fingerprints of the calls, for the journal (set by Runtime when
        it keeps one; telemetry/_prefix.py)."""
        self.opened_at = 0.0
        """The clock's time when the runtime opened: jobs' ``arrival_s`` count from it."""
        self.settings: dict[str, Any] | None = None
        """The runtime's settings as keyword arguments (``JobReport.runtime``)."""
        """Carry prompt and completion text in the call events (opt-in)."""
        self.waits: WaitEstimator | None = WaitEstimator()
        """Per-tool expected waits learned from the finished ones; None when off."""
        self._broken_hooks: set[int] = set()
        self.hook_errors = 0
        """Events a hook raised on (each hook counted apart), over the runtime's life."""
        self.last_hook_error: str | None = None
        self._hook_log = RateLimitedLog("agentrt hooks raised on events", log=hooks_log)
        self.health_changed: anyio.Event | None = None
        """Set when an endpoint is marked down (wakes the runtime's prober)."""
        self.notices: Notices | None = None
        """Sends tool-start notices (set by Runtime)."""
        self.fresh_view: Callable[[], Awaitable[None]] | None = None
        """Polls the endpoints whose engine readings are stale, for a first turn about
        to be placed (set while the runtime's block lasts, with the default polls:
        ``Upkeep.fresh_view``)."""
        self.clock: Callable[[], float] = anyio.current_time
        """The clock of calls (``anyio.current_time``'s), set to the runtime's event loop's
        own when it opens (0.06 µs a read against 0.4 µs): a runtime lives in one loop.
        Placement reads the same (``replicas.clock``, set with it)."""
        # Base paths by origin, longest first so that nested ones match the most specific.
        self._paths: dict[tuple[str, str, int | None], list[tuple[str, str]]] = {}
        for e in endpoints:
            origin, path = _origin_and_path(e.endpoint.url)
            self._paths.setdefault(origin, []).append((path, e.endpoint.url))
        for paths in self._paths.values():
            paths.sort(key=lambda p: -len(p[0]))

    def note_kv(self) -> None:
        """Put what placement assumes of each replica's KV capacity (tokens, and where
        the figure came from) in the settings jobs report (the journal's record)."""
        settings = self.settings
        if not self.replicas.kv_aware or settings is None:
            return
        capacities: list[int | None] = []
        for e in self.endpoints:
            tokens = e.working_set.capacity_tokens
            capacities.append(None if tokens is None else round(tokens))
        settings["kv_capacity"] = capacities
        settings["kv_capacity_source"] = [e.working_set.source for e in self.endpoints]

    def redact(self, text: str, extra: tuple[str, ...] = ()) -> str:
        """``text`` (an error) without the runtime's secrets (:attr:`secrets`), the
        ``extra`` forms (:func:`~agentrt._log.credential_forms`) or URL userinfo."""
        forms = self.secrets
        if extra:
            forms = tuple(sorted(set(forms + extra), key=len, reverse=True))
        return scrub(text, forms)

    def match(self, url: httpx.URL) -> tuple[str, str] | None:
        """(base URL, path suffix) of a request addressed to an endpoint, else None.

        Reads the URL's parts without rendering it again (half the cost)."""
        paths = self._paths.get((url.scheme, url.host, url.port))
        if paths is not None:
            path = url.path
            for prefix, base in paths:
                if path.startswith(prefix):
                    return base, path[len(prefix) - 1 :]
        return None

    def tool_started(
        self,
        job_id: str,
        session_id: str,
        endpoint_index: int | None,
        tool: str,
        expected_s: float | None,
        source: Literal["declared", "learned"] | None,
    ) -> SendNotice | None:
        """A session of ``job_id`` whose KV is on ``endpoint_index`` (None: no call yet)
        started a tool wait: tell every policy; return the tool-start notice to post to
        that replica, if it takes notices (the caller runs it while the wait lasts)."""
        for e in self.endpoints:
            e.admission.policy.on_tool(job_id, session_id, expected_s)
        if endpoint_index is None or self.notices is None:
            return None
        ep = self.endpoints[endpoint_index]
        if not ep.notices:
            return None
        key = ep.endpoint.api_key if ep.endpoint.api_key is not None else self.api_key
        return self.notices.prepare(
            ep,
            key,
            session_id=session_id,
            job_id=job_id,
            tool=tool,
            expected_s=expected_s,
            source=source,
        )

    # Feedback to the policies: every endpoint's (they classify alike), from here only.

    def call_ended(self, ticket: Ticket, service_s: float, tokens: int) -> None:
        """A call ended after ``service_s`` of service and ``tokens`` tokens."""
        for e in self.endpoints:
            e.admission.policy.on_call_end(ticket, service_s, tokens)

    def tool_ended(self, job_id: str, session_id: str, duration_s: float) -> None:
        """A session's tool wait ended (not cut short) after ``duration_s``."""
        for e in self.endpoints:
            e.admission.policy.on_tool_end(job_id, session_id, duration_s)

    def job_ended(self, job_id: str, program_id: str) -> None:
        """A job ended."""
        for e in self.endpoints:
            e.admission.policy.on_job_end(job_id, program_id)

    def emit(self, event: Event) -> None:
        """Hand ``event`` to every hook. A hook that raises never disturbs the call: the
        first error of each hook is a warning, and every error is counted
        (``hook_errors``) and logged on the ``agentrt.hooks`` logger (rate-limited)."""
        for hook in self.hooks:
            try:
                hook(event)
            except Exception as exc:
                self.hook_errors += 1
                self.last_hook_error = error = (
                    f"hook {hook!r} raised {type(exc).__name__}: {exc} (on {type(event).__name__})"
                )
                self._hook_log(error)
                if id(hook) not in self._broken_hooks:
                    self._broken_hooks.add(id(hook))
                    warnings.warn(
                        f"agentrt {error}; further errors of this hook are counted in "
                        "rt.journal_statistics().hook_errors and logged on the "
                        "'agentrt.hooks' logger",
                        RuntimeWarning,
                        stacklevel=2,
                    )

    def record_health(self, ep: _EndpointState, ok: bool, *, connect: bool = False) -> None:
        """Feed an attempt's outcome to the endpoint's health tracker."""
        now = anyio.current_time()
        health = ep.health
        if ok:
            health.record_success(now)
            return
        was = health.healthy
        health.record_failure(now, connect=connect)
        ep.load.healthy = health.healthy
        if was and not health.healthy:
            health_log.info(
                "endpoint %s marked down (%s); probed every %g s until it answers",
                ep.endpoint.url,
                "no connection" if connect else "repeated failures",
                health.probe_interval_s,
            )
            if self.health_changed is not None:
                self.health_changed.set()

    def program(self, program_id: str) -> _Program:
        program = self.programs.get(program_id)
        if program is None:
            program = self.programs[program_id] = _Program()
        return program


def metrics_candidates(base_url: str) -> list[str]:
    """Where an endpoint's Prometheus ``/metrics`` page may be: beside its API (``/v1``
    dropped: a path-prefixed replica such as ``sim serve``'s ``/replica-0/v1``, or a
    gateway's ``/openai/v1``), then at its origin (where vLLM and SGLang serve it)."""
    u = httpx.URL(base_url)
    origin = f"{u.scheme}://{u.netloc.decode('ascii')}"
    path = u.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    beside = f"{origin}{path}/metrics"
    at_origin = f"{origin}/metrics"
    return [beside] if beside == at_origin else [beside, at_origin]
