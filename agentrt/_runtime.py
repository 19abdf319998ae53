"""Runtime and SyncRuntime: lifecycle, endpoints, and the clients agentrt builds."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from threading import get_ident
from types import TracebackType
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    Literal,
    TypeVar,
    cast,
)

import anyio
import anyio.abc
import httpx
import openai

from ._blocks import async_block
from ._clients import AgentOpenAI, client_kwargs
from ._config import DEFAULT_RETRY, Endpoint, Retry
from ._context import Job
from ._errors import (
    CLOSED_MESSAGE,
    WRONG_LOOP_MESSAGE,
    AgentrtError,
    RuntimeClosedError,
    WrongLoopError,
)
from ._httplib import HttpLib, http_lib, loop_clock
from ._jobs import check_not_nested, close_job, run_job, still_running
from ._notice import Notices, NoticeStatistics
from ._options import AsyncTransport, PolicySpec, TimeoutLike, check, telemetry_hooks
from ._platform import give_platform, openai_platform
from ._settings import with_config
from ._state import _Core
from ._transport import AgentTransport, SharedTransport
from ._upkeep import Upkeep
from .dialects import DialectSpec
from .scheduling._admission import AdmissionStatistics
from .scheduling._loadcontrol import Gate, LoadControl, LoadStatistics
from .scheduling._routing import EndpointLoad, Router
from .telemetry._events import Hook
from .telemetry._journal import JournalStatistics
from .telemetry._prefix import PrefixTracker
from .telemetry._report import JobReport

if TYPE_CHECKING:
    pass

__all__ = ["DEFAULT_TIMEOUT_S", "Runtime"]

DEFAULT_TIMEOUT_S: Final = 600.0
"""Read timeout of one attempt, seconds (LLM replies can be long). Connect: 10 s."""

_MAX_CONNECTIONS: Final = 1000
"""Connections the default HTTP pool opens at most (openai's clients cap theirs alike)."""

_T = TypeVar("_T")


class Runtime:
    """agentrt's runtime: the async context manager that agent code runs its calls through.

    Endpoints that fail (connection errors, bursts of 5xx) are marked down, probed in the
    background and readmitted when they answer; their sessions fail over (the move is
    counted in the report). An endpoint whose replies advertise ``x-agentrt-accept:
    idle-notice`` is told in the background when one of its sessions starts a tool wait
    (docs/protocol.md; ``notice_statistics()``).

    Parameters:

    * **endpoints** - base URLs (``"http://127.0.0.1:8000/v1"``) or :class:`Endpoint`
      objects.
    * **config** - *(optional)* a TOML file of these keyword arguments (at its top level or
      in a ``[runtime]`` table), such as the one ``agentrt tune`` writes; without it, the
      file named by the ``AGENTRT_CONFIG`` environment variable, if set. Arguments passed
      here win over the file's settings (docs/tune.md, "Applying the settings").
    * **dialect** - *(optional)* how calls are tagged for the engines (docs/protocol.md).
    * **api_key** - *(optional)* goes to every endpoint without a key of its own; without
      one, ``rt.openai()`` clients take ``OPENAI_API_KEY`` from the environment, as
      openai's own do (keyless local servers ignore it).
    * **routing** - *(optional)* picks each call's endpoint (docs/routing.md):
      ``"session_affinity"`` (a session's turns stay on the replica holding its KV,
      SMetric-style), ``"hash"`` (bounded-load rendezvous hashing: processes agree without
      talking), ``"least_loaded"`` or ``"round_robin"``, or a
      :class:`~agentrt.scheduling.Router`.
    * **policy** - *(optional)* orders the calls waiting for room (docs/scheduling.md):
      ``"fcfs"``, ``"plas"``, ``"atlas"``, ``"mlfq"`` or ``"edf"``.
    * **concurrency**, **token_budget** - *(optional)* bound what each endpoint has in
      flight (calls; estimated tokens). ``"engine"`` (the default) puts no client-side cap
      until the endpoint's engine reports a waiting queue (seen through
      ``poll_metrics_s``; without polling it never caps), then caps at about what the
      engine runs, so the calls it could not run yet wait in the policy's order.
      ``"auto"`` adapts the call limit from observed latency per token (a gradient
      limiter). ``None`` never caps: calls go out at once, as from a plain client.
    * **send_priority** - *(optional)* where the policy's queue level goes as the engine's
      priority: ``"auto"`` (the default) to the endpoints whose replies advertise
      ``x-agentrt-accept: priority``, ``True`` to all (only for servers started with
      priority scheduling), ``False`` to none; :class:`Endpoint` can override it per
      endpoint.
    * **retry** - *(optional)* agentrt's one retry layer, a :class:`Retry`.
    * **timeout_s** - *(optional)* bounds each attempt of a call: a number of seconds
      bounds reading the reply (and writing the request, and waiting for a pooled
      connection), with 10 s to connect; an ``httpx.Timeout`` (or ``httpx2.Timeout``) sets
      each phase itself, as openai's clients take it (``None``: no limit). A call's own
      ``timeout=`` (openai's per-request option) overrides it.
    * **transport** - *(optional)* replaces the HTTP transport underneath (tests, the
      embedded engine); the clients agentrt builds then come from that transport's
      library (legacy ``httpx`` or ``httpx2``). Without one, agentrt uses ``httpx2`` when
      it is installed and openai is 3.x or later (openai's native stack, markedly faster
      under concurrency), else legacy ``httpx``.
    * **on_job_end** - *(optional)* receives each finished job's report (docs/telemetry.md).
    * **keep_reports** - *(optional)* how many recent reports :meth:`reports` keeps.
    * **poll_metrics_s** - *(optional)* polls each engine's ``/metrics`` (vLLM's running
      and waiting requests, KV usage) at that interval, so routing sees load from other
      clients too.
    * **hooks** - *(optional)* receive every event (job and session start and end, each
      call's start, queueing, attempts, first token and end, tool waits, session moves:
      ``agentrt.telemetry``).
    * **journal** - *(optional)* a file that gets one JSON line per finished job.
    * **otel** - *(optional)* on by default: OpenTelemetry spans and metrics to the
      globally installed providers when ``opentelemetry`` is installed (no-ops without
      an SDK).
    * **prometheus** - *(optional)* registers agentrt's metrics: ``True`` in the default
      registry, or in the ``CollectorRegistry`` given.
    * **capture_content** - *(optional)* records prompt and completion text in events
      and spans (off by default).
    * **load_control** - *(optional)* on by default: past the knee, a session's next
      call waits at its tool boundary while its replica's KV is full of other live
      sessions' contexts, instead of every session thrashing the cache (an operating
      system's load control; docs/scheduling.md, "Load control"). It gates a replica
      only once its KV capacity is known (the engine's figure, read by the default
      metrics polls, or ``Endpoint(kv_capacity=)``). ``False`` turns it off; an
      :class:`agentrt.LoadControl` sets its bound and watermark.
    * **learn_waits** - *(optional)* on by default: learns each tool's typical wait from
      the finished ones, to expect a wait whose caller gave no ``expected_s`` and to
      predict a session's idle from the tools its replies call (docs/concepts.md,
      "Expected tool waits").
    """

    @with_config
    def __init__(
        self,
        endpoints: Sequence[str | Endpoint] | str | Endpoint,
        *,
        config: str | os.PathLike[str] | None = None,
        dialect: DialectSpec = "generic",
        api_key: str | None = None,
        routing: str | Router = "session_affinity",
        policy: PolicySpec = "fcfs",
        concurrency: int | Literal["auto", "engine"] | None = "engine",
        token_budget: int | None = None,
        send_priority: bool | Literal["auto"] = "auto",
        retry: Retry = DEFAULT_RETRY,
        timeout_s: float | TimeoutLike = DEFAULT_TIMEOUT_S,
        transport: AsyncTransport | None = None,
        on_job_end: Callable[[JobReport], None] | None = None,
        keep_reports: int = 1000,
        poll_metrics_s: float | Literal["auto"] | None = "auto",
        hooks: Sequence[Hook] = (),
        journal: str | os.PathLike[str] | None = None,
        otel: bool = True,
        prometheus: Any = None,
        capture_content: bool = False,
        learn_waits: bool = True,
        load_control: bool | LoadControl = True,
    ) -> None:
        checked = check(
            endpoints,
            dialect=dialect,
            api_key=api_key,
            routing=routing,
            policy=policy,
            concurrency=concurrency,
            token_budget=token_budget,
            send_priority=send_priority,
            retry=retry,
            timeout_s=timeout_s,
            keep_reports=keep_reports,
            poll_metrics_s=poll_metrics_s,
            hooks=hooks,
            otel=otel,
            prometheus=prometheus,
            learn_waits=learn_waits,
            load_control=load_control,
        )
        states, poll = checked.states, checked.poll
        self._core = core = _Core(states, checked.router, retry, api_key)
        if load_control is not False:
            core.gate = gate = Gate(
                [e.working_set for e in states],
                lambda i: states[i].load.healthy,
                LoadControl() if load_control is True else load_control,
                lambda: core.clock(),
            )
            core.replicas.load_control(gate.changed)
        self._core.capture_content = bool(capture_content)
        if not learn_waits:
            self._core.waits = None
        self._core.hooks, self._journal = telemetry_hooks(
            hooks,
            otel=otel,
            prometheus=prometheus,
            journal=journal,
            capture_content=capture_content,
            load=self if core.gate is not None else None,
        )
        if self._journal is not None:
            self._core.prefixes = PrefixTracker()
        self._core.settings = checked.settings
        # The HTTP library (legacy httpx or httpx2), chosen once: everything below and
        # every client this runtime builds comes from it.
        self._lib: HttpLib = http_lib(transport)
        mod = self._lib.mod
        self._timeout: Any = mod.Timeout(**checked.timeouts)
        self._owns_inner = transport is None
        # At most 1,000 connections, as openai's own clients: with no cap, thousands of
        # calls at once open as many sockets, overflow a server's accept backlog and time
        # out connecting (python -m benchmarks load load, docs/benchmarks/cost.md "Load and soak").
        self._inner: httpx.AsyncBaseTransport = cast(Any, transport) or mod.AsyncHTTPTransport(
            limits=mod.Limits(max_connections=_MAX_CONNECTIONS, max_keepalive_connections=256)
        )
        self._reports: deque[JobReport] = deque(maxlen=keep_reports)
        self._on_job_end = on_job_end
        self._core.on_report = self._record
        self._http: httpx.AsyncClient | None = None
        self._opened = False
        self._closed = False
        self._notices = Notices(mod, self._inner)
        self._core.notices = self._notices
        self._upkeep = Upkeep(
            self._core, self._lib, self._inner, self._notices, poll, poll_metrics_s == "auto"
        )
        self._platform: Any = openai_platform()  # with the pool, not per first call

    def __repr__(self) -> str:
        # Endpoint URLs carry no credentials (Endpoint keeps them apart).
        urls = [e.endpoint.url for e in self._core.endpoints]
        state = "closed" if self._closed else "open" if self._opened else "not entered"
        return f"<agentrt.Runtime endpoints={urls!r} routing={self._core.router.name!r} {state}>"

    @property
    def endpoints(self) -> list[Endpoint]:
        return [e.endpoint for e in self._core.endpoints]

    def reports(self) -> list[JobReport]:
        """The reports of the most recently finished jobs (``keep_reports`` of them)."""
        return list(self._reports)

    def endpoint_loads(self) -> list[EndpointLoad]:
        """A snapshot of each endpoint's load as agentrt sees it (from any thread, and
        before the runtime is entered)."""
        # Before it opens no session is placed anywhere: the working sets are empty
        # whatever the time, and there is no event loop's clock to read yet.
        now = self._core.clock() if self._opened else 0.0
        self._core.replicas.refresh(now)
        return [replace(e.load) for e in self._core.endpoints]

    def load_statistics(self) -> LoadStatistics | None:
        """A snapshot of what load control did (sessions held now, holds, forced ones,
        time held, the longest hold); None when it is off."""
        gate = self._core.gate
        return None if gate is None else replace(gate.stats)

    def admission_statistics(self) -> list[AdmissionStatistics]:
        """A snapshot of each endpoint's admission gate (limit, in flight, waiting)."""
        return [e.admission.statistics() for e in self._core.endpoints]

    def journal_statistics(self) -> JournalStatistics:
        """A snapshot of what the journal wrote and lost, and of the events hooks failed
        on (docs/telemetry.md, "What nothing lost means"). All zero without a journal
        and with hooks that never fail."""
        journal, core = self._journal, self._core
        return JournalStatistics(
            written=journal.jobs if journal is not None else 0,
            lost=journal.lost if journal is not None else 0,
            hook_errors=core.hook_errors,
            last_error=(journal.last_error if journal is not None else None)
            or core.last_hook_error,
        )

    def notice_statistics(self) -> NoticeStatistics:
        """A snapshot of the tool-start notices sent so far (docs/protocol.md)."""
        return self._notices.statistics()

    def _record(self, report: JobReport) -> None:
        self._reports.append(report)
        if self._on_job_end is not None:
            self._on_job_end(report)

    async def __aenter__(self) -> Runtime:
        if self._opened:
            raise AgentrtError("a Runtime can be entered only once")
        self._opened = True
        self._http = self.http_client()
        self._core.client = self.openai()
        self._core.clock = self._core.replicas.clock = loop_clock()
        self._core.loop_thread = get_ident()  # its loop's: other loops are refused
        self._core.opened_at = self._core.clock()
        await self._upkeep.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closed = True
        self._core.closed = True  # the clients it built refuse new calls from now on
        running = list(self._core.active_jobs)  # their ids
        await self._upkeep.stop()
        with anyio.CancelScope(shield=True):
            if self._owns_inner:
                await self._inner.aclose()
            if self._journal is not None:
                self._journal.close()
        if running and exc is None:
            raise still_running(running)

    def _check_open(self) -> None:
        if not self._opened:
            raise AgentrtError("use the Runtime inside 'async with Runtime(...) as rt:'")
        if self._closed:
            raise RuntimeClosedError(CLOSED_MESSAGE)

    @async_block("rt.job(...) as job")
    async def job(
        self,
        name: str,
        *,
        job_id: str | None = None,
        program_id: str | None = None,
        deadline_s: float | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> AsyncIterator[Job]:
        """Run one job. Its completion time runs from entering this block to leaving it.

        ``program_id`` groups jobs whose attained service is shared (defaults to the job
        id). ``deadline_s`` cancels the block after that many seconds and ends the job with
        status ``deadline`` (raising ``TimeoutError``). The report is in ``job.report``
        after the block, whatever happened inside.
        """
        self._check_open()
        if get_ident() != self._core.loop_thread:  # before the job starts
            raise WrongLoopError(WRONG_LOOP_MESSAGE)
        check_not_nested(self._core, name)
        job = self._new_job(name, job_id, program_id, deadline_s, metadata)
        async with run_job(job, enforce_deadline=True):
            yield job

    def _open_job(
        self,
        name: str,
        *,
        job_id: str | None = None,
        program_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Job:
        """Start a job without a block, for framework adapters whose callbacks start and
        end a run (``agentrt.integrations._bridge``); :meth:`_close_job` ends it. It has
        no deadline: no block encloses its work to cancel."""
        job = self._new_job(name, job_id, program_id, None, metadata)
        job._start()
        return job

    def _new_job(
        self,
        name: str,
        job_id: str | None,
        program_id: str | None,
        deadline_s: float | None,
        metadata: dict[str, Any] | None,
    ) -> Job:
        self._check_open()
        return Job(
            self._core,
            name,
            job_id=job_id,
            program_id=program_id,
            deadline_s=deadline_s,
            metadata=metadata,
        )

    def _close_job(self, job: Job, exc: BaseException | None = None) -> JobReport:
        """End a job started by :meth:`_open_job` (:func:`close_job`)."""
        return close_job(job, exc)

    def http_client(self) -> httpx.AsyncClient:
        """An async HTTP client whose requests go through agentrt (for frameworks that
        accept one). Requests to an endpoint's base URL are tagged, routed and reported.

        It is an ``httpx2.AsyncClient`` when httpx2 is installed with openai 3.x (or the
        runtime's ``transport`` is an httpx2 one), else a legacy ``httpx.AsyncClient``;
        both have the same API."""
        self._check_open()
        return self._lib.mod.AsyncClient(  # type: ignore[no-any-return]
            transport=self._http_transport(), timeout=self._timeout
        )

    def _http_transport(self) -> httpx.AsyncBaseTransport:
        """The transport of :meth:`http_client` (the bench's virtual-time replays send
        their requests to it directly: agentrt's whole path, without the client's)."""
        lib = self._lib
        return lib.derive(SharedTransport)(lib.derive(AgentTransport)(self._core, self._inner))  # type: ignore[no-any-return]

    def openai(self, **kwargs: Any) -> openai.AsyncOpenAI:
        """An ``openai.AsyncOpenAI`` whose calls go through agentrt.

        Inside ``job.session(...)`` its calls are that session's turns; inside a job's
        block but no session, the turns of the job's ``default`` session (opened by the
        first); outside any job each call is counted in an implicit one-call job
        (docs/concepts.md, "The report"). Keyword arguments go
        to ``AsyncOpenAI`` (``max_retries`` is fixed at 0, in its copies too: agentrt
        retries). Its API key:
        ``api_key=`` if given, else the runtime's, else ``OPENAI_API_KEY`` (as openai's
        clients read it), else none (a placeholder that is never sent); an endpoint's
        own key or credentials replace it on that endpoint's calls.
        """
        self._check_open()
        kwargs = client_kwargs(self._core, kwargs)
        http = self._http or self.http_client()
        # openai 3.x types its client as httpx2.AsyncClient and accepts legacy httpx clients.
        client = AgentOpenAI(http_client=http, **kwargs)  # type: ignore[arg-type,unused-ignore]
        give_platform(client, self._platform)  # found once, not per client (_platform.py)
        return client
