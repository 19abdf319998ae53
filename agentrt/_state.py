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
from collections.abc import Awaitable, Callable, Collection
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
from .scheduling._retention import RetentionEstimator
from .scheduling._routing import EndpointLoad, RouteKey, Router, SessionAffinity, kv_fill
from .scheduling._workingset import KvShadow
from .telemetry._events import Event, Hook
from .telemetry._journal import RateLimitedLog
from .telemetry._prefix import PrefixTracker
from .telemetry._report import JobReport

if TYPE_CHECKING:
    from .scheduling._queue import Ticket
    from .telemetry._report import _CallState

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
    shadow: KvShadow = field(default_factory=KvShadow)
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

    def refresh_retention(self) -> None:
        """Its load's ``retention_s`` from the estimate, if replies moved it since."""
        retention = self.retention
        if retention.dirty:
            self.load.retention_s = retention.estimate()

    def refresh_kv(self, now: float) -> None:
        """Its load's KV capacity and working set from the shadow, as of ``now``."""
        shadow, load = self.shadow, self.load
        load.kv_capacity = shadow.capacity_tokens
        load.kv_capacity_source = shadow.source
        load.kv_demand = shadow.demand(now)

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


class Placement:
    """Where one session's calls go, kept by the router side: the replica its KV lives on
    (``home``, as the router last chose it), when its last reply came, and what that
    replica could still hold of it for the next turn (feeds the replica's retention
    estimate). A session holds one (``Session.placement``); its calls are routed through
    it (:meth:`route`) and report their replies to it (:meth:`replied`)."""

    __slots__ = (
        "cacheable",
        "distance",
        "ended",
        "home",
        "last_reply_at",
        "session_id",
        "stable",
        "target",
        "unserved",
    )

    def __init__(self, session_id: str, stable: bool) -> None:
        self.session_id = session_id
        self.stable = stable
        """The caller gave the session's id (the conversation may go on in another
        process): its first turn here is placed by hashing it, as every process does."""
        self.home: int | None = None
        self.last_reply_at: float | None = None
        self.cacheable: tuple[int, int] | None = None
        """(endpoint, prompt + completion tokens) of the last successful call: what that
        replica could still hold for the next turn."""
        self.ended = False
        """The session ended (:meth:`unpin`): it counts in no replica's load."""
        self.unserved = False
        """``home`` was chosen for a first turn that has not been answered yet: nothing
        of the session is there (a retry of that turn is still a first turn)."""
        self.target: int | None = None
        """Where load control resumes the session, away from its home (its context was
        no longer resident there, and another replica had room): the next route goes
        there, a move for ``"load"``."""
        self.distance: int | None = None
        """Tokens other sessions touched at its home between its previous call and this
        one (the stack distance when this call was routed there), for the capacity
        estimate; None when the call did not resume at home."""

    def route(
        self,
        core: _Core,
        avoid: Collection[int],
        prefix: tuple[int, ...],
        tokens: int,
    ) -> tuple[int, str | None]:
        """The endpoint for the session's call, and why the session moved there from the
        replica that served its previous turn (its KV cache there is lost), or None if
        it did not move: ``"unavailable"`` (its replica failed or is down), the router's
        own reason where it gives one (``SessionAffinity.move_reason``: ``"retention"``,
        ``"overload"``), else ``"routing"``. A session counts in its replica's load
        until it ends (a call still in flight may move an ended one: counted nowhere)."""
        endpoints = core.endpoints
        home = self.home
        index = 0
        sid = self.session_id
        self.distance = None
        target = None
        if len(endpoints) > 1:
            idle = None
            context, resident = 0, None
            now = anyio.current_time()
            # A home chosen for a first turn not answered yet (its attempt failed there)
            # holds nothing of the session: the call is still its first turn. A
            # caller-given id's is placed again by its rendezvous order, as every process
            # places it; any other is routed as from the replica it was placed on (kept
            # there unless the router moves it: a failing replica collects its failures
            # and is marked down), yet not counted as a move.
            held = None if self.unserved and self.stable else home
            if held is not None and self.last_reply_at is not None:
                idle = now - self.last_reply_at
                endpoints[held].refresh_retention()
            loads = [e.load for e in endpoints]
            if core.kv_aware:
                context, resident = self._kv_view(core, loads, held, idle, avoid, now)
            key = RouteKey(
                sid, held, held is None, prefix, tokens, idle, self.stable, context, resident
            )
            target, self.target = self.target, None
            if target is not None and target not in avoid and endpoints[target].load.healthy:
                index = target
            else:
                target = None
                index = core.router.choose(loads, key, avoid)
            core.router.served(index, key)
            if core.kv_aware and not self.ended:
                if home is not None and home != index:
                    endpoints[home].shadow.leave(sid)
                    self.distance = None
                endpoints[index].shadow.start(sid, max(tokens, context))
        elif core.kv_aware and not self.ended:  # one replica, under load control
            shadow = endpoints[0].shadow
            if home is not None:
                self.distance = shadow.stack_distance(sid)
            shadow.start(sid, max(tokens, shadow.context(sid)))
        if home == index:
            return index, None
        self.home = index
        if not self.ended:
            endpoints[index].load.sessions += 1
            if home is not None:
                endpoints[home].load.sessions -= 1
        if home is None or self.unserved:
            self.unserved = True
            return index, None  # nothing of the session was anywhere: not a move
        if home in avoid or not endpoints[home].load.healthy:
            return index, "unavailable"
        if target is not None:
            return index, "load"
        reason: str | None = getattr(core.router, "move_reason", None)
        return index, reason or "routing"

    def reserve(self, core: _Core, index: int) -> None:
        """Load control admitted the session's first turn on replica ``index`` (where
        there was room): it is placed there, as a home chosen for a first turn that has
        not been answered yet (the router keeps it there unless it is down)."""
        if self.home is not None or self.ended:
            return
        self.home = index
        self.unserved = True
        core.endpoints[index].load.sessions += 1

    def _kv_view(
        self,
        core: _Core,
        loads: list[EndpointLoad],
        home: int | None,
        idle: float | None,
        avoid: Collection[int],
        now: float,
    ) -> tuple[int, int | None]:
        """The session's context at ``home`` and how much of it is likely still cached
        there (``RouteKey.context``, ``.resident``); the replicas' working sets refreshed
        where the router may look: all of them for a first turn or a session that may
        leave, for any reason (home overfull, or the router may not keep it there:
        avoided, down, overloaded, its cache likely gone), else home's alone (the
        others' marked not computed)."""
        endpoints = core.endpoints
        if home is None:
            for e in endpoints:
                e.refresh_kv(now)
            return 0, None
        sid = self.session_id
        here = endpoints[home]
        shadow = here.shadow
        self.distance = shadow.stack_distance(sid)
        here.refresh_kv(now)
        fill = kv_fill(here.load)
        router = core.router
        leaving = (
            (fill is not None and fill > 1.0)
            # A router other than the session router's (kept under load control) may
            # send any call anywhere.
            or not isinstance(router, SessionAffinity)
            or not router.keeps(loads, home, idle, avoid)
        )
        for e in endpoints:
            if e is not here:
                if leaving:
                    e.refresh_kv(now)
                else:  # it stays, or moves by load alone
                    e.load.kv_demand = None
        return shadow.context(sid), shadow.resident(sid)

    def replied(
        self,
        core: _Core,
        now: float,
        state: _CallState,
        idle_s: float | None,
        wake_in: float | None,
    ) -> None:
        """A call succeeded at ``now``, after ``idle_s`` idle, and the session is
        expected to send again ``wake_in`` seconds from now (None: unknown): if it
        resumed the session on the replica that served its previous turn, record
        whether that replica still had the prefix (only where replies feed the retention
        estimates and the working sets)."""
        self.last_reply_at = now
        self.unserved = False
        index = self.home
        if index is None or not (core.learn_retention or core.kv_aware):
            return
        previous, self.cacheable = self.cacheable, None
        context = (
            None
            if state.prompt_tokens is None
            else state.prompt_tokens + (state.completion_tokens or 0)
        )
        if core.kv_aware and not self.ended:
            shadow = core.endpoints[index].shadow
            shadow.finish(self.session_id, context, None if wake_in is None else now + wake_in)
            distance = self.distance
            if (
                distance is not None
                and previous is not None
                and previous[0] == index
                and state.cached_tokens is not None
                and not state.moved
                and not state.held_s  # held: its context was meant to age out
            ):
                shadow.observe(distance, previous[1], state.cached_tokens, state.prompt_tokens)
            if core.gate is not None:
                core.gate.changed()
        if context is None:
            return
        self.cacheable = (index, context)
        if core.learn_retention and (
            previous is not None
            and previous[0] == index
            and idle_s is not None
            and state.cached_tokens is not None
            and not state.moved
        ):
            hit = RetentionEstimator.hit(previous[1], state.cached_tokens)
            if hit is not None:
                core.endpoints[index].retention.observe(idle_s, hit)

    def failed(self, core: _Core) -> None:
        """A call of the session ended without a reply: its context is idle again."""
        if core.kv_aware and self.home is not None and not self.ended:
            core.endpoints[self.home].shadow.finish(self.session_id, None, None)
            if core.gate is not None:
                core.gate.changed()

    def unpin(self, core: _Core) -> None:
        """The session ended: it no longer counts in its replica's load, nor in its
        working set. Idempotent."""
        if self.ended:
            return
        self.ended = True
        if self.home is not None:
            core.endpoints[self.home].load.sessions -= 1
            if core.kv_aware:
                core.endpoints[self.home].shadow.leave(self.session_id)
                if core.gate is not None:
                    core.gate.changed()


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
        self.kv_aware = self.prefix_aware
        """Whether sessions' working sets are kept per replica (placement by working
        set: the session router, over several endpoints; or load control)."""
        self.gate: Gate | None = None
        """Load control (``scheduling/_loadcontrol.py``), when on (set by Runtime)."""
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
        own when it opens (0.06 µs a read against 0.4 µs): a runtime lives in one loop."""
        self.learn_retention = len(endpoints) > 1
        """Whether replies feed the replicas' retention estimates (only routing uses them)."""
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
        if not self.kv_aware or settings is None:
            return
        capacities: list[int | None] = []
        for e in self.endpoints:
            tokens = e.shadow.capacity_tokens
            capacities.append(None if tokens is None else round(tokens))
        settings["kv_capacity"] = capacities
        settings["kv_capacity_source"] = [e.shadow.source for e in self.endpoints]

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
