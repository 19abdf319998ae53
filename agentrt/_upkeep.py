"""A runtime's background work while its block lasts: endpoints marked down are probed
until they answer, engines' metrics are polled when asked (scheduling/_poll.py says
when) and their KV-cache events read where an endpoint names them (``_kvfeed.py``), in
the runtime's task group (there is one only with several endpoints, metrics polls or
events read over ZMQ); the tool-start notices are sent in it, and the dialects'
session-end requests beside it."""

from __future__ import annotations

import functools
import math
import random
from contextlib import AsyncExitStack
from typing import Any

import anyio
import anyio.abc
import httpx

from ._httplib import HttpLib
from ._ids import random_bytes
from ._kvfeed import KvFeed, attach_inprocess, check_extra
from ._log import health_log
from ._notice import Notices
from ._state import _Core, _EndpointState, metrics_candidates
from .scheduling._health import DEFAULT_PROBE_INTERVAL_S
from .scheduling._poll import FIRST_TURN_WAIT_S, PollSchedule
from .scheduling._signals import EngineSignals, parse_cache_config, parse_vllm_metrics

__all__ = ["Upkeep"]


class Upkeep:
    """One runtime's background work: :meth:`start` when its block begins, :meth:`stop`
    when it ends; the probes and polls of its endpoints (:meth:`run`) in between."""

    def __init__(
        self,
        core: _Core,
        lib: HttpLib,
        inner: httpx.AsyncBaseTransport,
        notices: Notices,
        poll_s: float | None,
        adaptive: bool,
    ) -> None:
        self._core = core
        self._lib = lib
        self._inner = inner
        self._notices = notices
        self._tasks: anyio.abc.TaskGroup | None = None
        self._session_ends: AsyncExitStack | None = None
        """The dialects' session-end requests (dialects/_session_ends.py), when any."""
        self._poll_s = poll_s
        """The polls' interval (None: no polls)."""
        self._poll_adaptive = adaptive
        """``poll_metrics_s="auto"``: the schedule adapts to what the polls read."""
        self._get_urls: dict[str, Any] = {}  # the URLs _get asks, parsed
        self._read_engine: Any = getattr(inner, "engine_reading", None)
        self._read_capacity: Any = getattr(inner, "engine_capacity", None)
        self._read_host: Any = getattr(inner, "engine_host_capacity", None)
        """A transport that serves simulated engines in this process (the embedded engine's,
        ``agentrt.sim``) reads their load without a page to render and parse: the same
        signals, at a fraction of the CPU (a fleet's polls of a long replay)."""
        self._schedule: PollSchedule | None = None
        """When each endpoint's metrics are polled (while the block lasts, if polled)."""
        self.feeds: list[KvFeed] = []
        """The endpoints' KV-event feeds read over ZMQ (while the block lasts)."""
        self._unsubscribe: list[Any] = []
        """Ends the in-process engines' event feeds (the embedded engine's transport)."""
        self._polls: dict[int, anyio.Event] = {}
        """The polls in progress, by endpoint: each set when it ends."""
        self._poll_ended: anyio.Event | None = None
        """Set when a poll ends (its endpoint's next poll is then scheduled): made
        when :meth:`run` starts, in the event loop."""

    async def start(self) -> None:
        """The runtime's block begins: notices may be sent, the dialects' session-end
        requests open, and the background work starts if there is any."""
        core = self._core
        self._open_feeds()  # first: it may refuse (the extra missing)
        self._notices.open = True
        ends = [
            (state.endpoint.url, state.dialect.session_ends, state.authorization)
            for state in core.endpoints
            if state.dialect.session_ends
        ]
        if ends:  # a dialect asks for a request when each session ends
            from .dialects._session_ends import open_session_ends

            self._session_ends, end_hooks = await open_session_ends(ends, self._inner)
            core.hooks = (*core.hooks, *end_hooks)
        # Background work (with several endpoints or metrics polling: health probes and
        # polls) runs in the runtime's task group (structured: it ends when the runtime's
        # block does). Only then is there one: its cancel scope would enclose all the
        # agent's code, and every cancel scope and checkpoint of the HTTP stack on every
        # call would walk one level more (docs/benchmarks/cost.md, "Cancel scopes").
        if len(core.endpoints) > 1 or self._poll_s is not None or self.feeds:
            self._tasks = anyio.create_task_group()
            await self._tasks.__aenter__()
            self._notices.tasks = self._tasks
            core.health_changed = anyio.Event()
            if self._poll_s is not None:
                self._schedule = PollSchedule(
                    len(core.endpoints),
                    self._poll_s,
                    adaptive=self._poll_adaptive,
                    start=anyio.current_time(),
                    rng=random.Random(random_bytes(16)),
                    slow_s=FIRST_TURN_WAIT_S,
                )
                if self._poll_adaptive:
                    core.fresh_view = self.fresh_view
            self._tasks.start_soon(self.run)
            for feed in self.feeds:
                self._tasks.start_soon(feed.run)

    def _open_feeds(self) -> None:
        """The endpoints' KV-event feeds: in-process where the transport serves the
        replica's engine (``kv_event_feed``), else over ZMQ (checked here: without the
        extra, one line says so before any call is sent)."""
        inprocess: Any = getattr(self._inner, "kv_event_feed", None)
        feeds = []
        for e in self._core.endpoints:
            if e.endpoint.kv_events is None:
                continue
            subscribe = None if inprocess is None else inprocess(e.endpoint.url)
            if subscribe is not None:
                self._unsubscribe.append(attach_inprocess(e, subscribe))
            else:
                feeds.append(KvFeed(e, functools.partial(self._get, e)))
        if feeds:
            check_extra()
        self.feeds = feeds

    async def stop(self) -> None:
        """The runtime's block ends: no notice is sent from now on, the background work
        ends, and the pending session ends are sent."""
        self._notices.open = False
        self._notices.tasks = None
        self._core.fresh_view = None
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe.clear()
        if self._tasks is not None:
            # Its scope encloses the runtime's block: leave it first (it ends at once).
            self._tasks.cancel_scope.cancel()
            await self._tasks.__aexit__(None, None, None)
        if self._session_ends is not None:
            # Entered before the task group, left after it (its own task group's scope
            # must be the current one: no shield around it); pending ends are sent.
            await self._session_ends.aclose()

    async def run(self) -> None:
        """Probe endpoints marked down until they answer; poll engine metrics if asked
        (scheduling/_poll.py says when)."""
        core = self._core
        endpoints = core.endpoints
        probe_every = DEFAULT_PROBE_INTERVAL_S
        schedule = self._schedule
        admitted = 0  # calls admitted anywhere, at the previous poll
        probe_at = -math.inf
        self._poll_ended = ended = anyio.Event()
        while True:
            down = not all(e.health.healthy for e in endpoints)
            if schedule is None and not down:
                core.health_changed = event = anyio.Event()
                await event.wait()
                continue
            now = anyio.current_time()
            if down and probe_at == -math.inf:
                probe_at = now + probe_every
            wake = min(schedule.next_at() if schedule else math.inf, probe_at if down else math.inf)
            with anyio.move_on_after(max(0.0, wake - now)):
                await ended.wait()  # a poll in progress is not due: its end is
            if ended.is_set():
                self._poll_ended = ended = anyio.Event()
            now = anyio.current_time()
            if down and now >= probe_at:
                probe_at = -math.inf
                for e in endpoints:
                    if not e.health.healthy and e.health.probe_due(now):
                        ok = await self._fetch(e, "/models") is not None
                        e.health.probed(anyio.current_time(), ok)
                        e.load.healthy = e.health.healthy
                        if ok:
                            health_log.info(
                                "endpoint %s answered a probe: readmitted", e.endpoint.url
                            )
            if schedule is None:
                continue
            due = schedule.due(now)
            if not due:
                continue
            total = sum(e.admission.admitted for e in endpoints)
            busy = total != admitted or any(e.load.in_flight for e in endpoints)
            admitted = total
            for i in due:
                self._polling(schedule, i, busy)

    def _polling(
        self, schedule: PollSchedule, i: int, busy: bool, first_turn: bool = False
    ) -> anyio.Event:
        """Endpoint ``i``'s poll in progress, else one started now in the runtime's task
        group (it runs to its end whoever waits for it); the event is set when it ends."""
        done = self._polls.get(i)
        if done is None:
            assert self._tasks is not None  # polls run only while the block lasts
            done = self._polls[i] = anyio.Event()
            schedule.started(i)
            self._tasks.start_soon(self._poll, schedule, i, busy, first_turn, done)
        return done

    async def _poll(
        self, schedule: PollSchedule, i: int, busy: bool, first_turn: bool, done: anyio.Event
    ) -> None:
        try:
            await self._poll_once(schedule, i, busy, first_turn)
        finally:
            del self._polls[i]
            done.set()
            if self._poll_ended is not None:
                self._poll_ended.set()
        self._note_view()

    async def _poll_once(
        self, schedule: PollSchedule, i: int, busy: bool, first_turn: bool
    ) -> None:
        """Poll endpoint ``i``'s metrics once (``first_turn``: for a first turn about to
        be placed); its load and admission read them."""
        e = self._core.endpoints[i]
        started = anyio.current_time()
        signals: EngineSignals | None = self._read_direct(e)
        direct = signals is not None
        text = None if direct else await self._fetch_metrics(e)
        if text is not None:
            signals = parse_vllm_metrics(text)
        elif direct:
            pass
        elif self._poll_adaptive:
            signals = EngineSignals()  # no answer: its load is unknown now
        else:
            signals = None  # a fixed interval keeps the last reading
        if text is not None and e.working_set.capacity is None:
            config = parse_cache_config(text)  # once: it does not change
            if config is not None:
                e.working_set.set_capacity(config.gpu_blocks * config.block_size, "engine")
                if config.host_blocks:
                    e.working_set.host_tokens = config.host_blocks * config.block_size
        if signals is not None:
            e.load.running = signals.running
            e.load.waiting = signals.waiting
            e.load.kv_usage = signals.kv_usage
            e.admission.engine_signals(signals.running, signals.waiting)
            if signals.running is not None:
                # More calls at the engine than this process has there: other clients
                # share the replica (load control then fills only its learned share).
                calls = signals.running + (signals.waiting or 0)
                e.working_set.saw_others(calls > e.load.in_flight + 2, anyio.current_time())
            capacity = e.working_set.capacity
            if signals.kv_usage is not None and capacity is not None:
                e.working_set.engine_used = signals.kv_usage * capacity
        answered = direct or text is not None
        reading = signals.reading if answered and signals is not None else None
        now = anyio.current_time()
        schedule.polled(
            i, now, reading, busy, answered=answered, first_turn=first_turn, took_s=now - started
        )

    async def fresh_view(self) -> None:
        """A first turn is about to be placed: the endpoints whose readings are stale
        (``PollSchedule.stale``) are polled now, all together (a poll in progress is
        joined), and the first turn waits for their readings up to
        ``FIRST_TURN_WAIT_S``, but not for an endpoint known slow to poll
        (``PollSchedule.slow``); one whose poll outlasts the wait is slow from now on.
        The polls run to their end in the runtime's task group either way."""
        schedule = self._schedule
        if schedule is None or self._tasks is None:
            return
        stale = schedule.stale(anyio.current_time())
        waits = [(i, self._polling(schedule, i, True, True)) for i in stale]
        waits = [(i, done) for i, done in waits if not schedule.slow(i)]
        if not waits:
            return
        with anyio.move_on_after(FIRST_TURN_WAIT_S):
            for _, done in waits:
                await done.wait()
        for i, done in waits:
            if not done.is_set():
                schedule.waited_out(i)

    def _note_view(self) -> None:
        """Record whose load routing compares now, in the settings jobs report."""
        views = {e.load.view for e in self._core.endpoints}
        view = views.pop() if len(views) == 1 else "mixed"
        settings = self._core.settings
        if settings is not None and settings.get("load_view") != view:
            settings["load_view"] = view

    async def _fetch(self, ep: _EndpointState, path: str) -> str | None:
        """GET ``path`` under the endpoint's base URL; the body if it answered below 500,
        else None."""
        reply = await self._get(ep, ep.endpoint.url + path)
        return None if reply is None or reply[0] >= 500 else reply[1]

    def _read_direct(self, ep: _EndpointState) -> EngineSignals | None:
        """The endpoint's load read straight from a simulated engine (see
        ``_read_engine``): what its ``/metrics`` page would say; None where the transport
        cannot (a real server), and the page is fetched."""
        read = self._read_engine
        if read is None:
            return None
        if ep.metrics_urls is None:
            ep.metrics_urls = metrics_candidates(ep.endpoint.url)
        for url in ep.metrics_urls:
            got = read(url)
            if got is not None:
                running, waiting, kv_usage = got
                if ep.working_set.capacity is None and self._read_capacity is not None:
                    tokens = self._read_capacity(url)  # the page's cache_config_info
                    if tokens:
                        ep.working_set.set_capacity(tokens, "engine")
                    if self._read_host is not None:
                        ep.working_set.host_tokens = self._read_host(url) or 0
                return EngineSignals(running=running, waiting=waiting, kv_usage=kv_usage)
        return None

    async def _fetch_metrics(self, ep: _EndpointState) -> str | None:
        """The endpoint's ``/metrics`` page, or None. Its place is found once: beside
        its API first, then at its origin (``_state.metrics_candidates``); one that
        answers 404 is not asked again while another remains."""
        if ep.metrics_urls is None:
            ep.metrics_urls = metrics_candidates(ep.endpoint.url)
        for url in list(ep.metrics_urls):
            reply = await self._get(ep, url)
            if reply is None:
                return None  # unreachable now: the same place is asked next time
            status, body = reply
            if status == 404 and len(ep.metrics_urls) > 1:
                ep.metrics_urls.remove(url)
                continue
            return body if status < 500 else None
        return None

    async def _get(self, ep: _EndpointState, url: str) -> tuple[int, str] | None:
        """GET ``url`` with the endpoint's credentials: its status and body, or None
        when it did not answer within 3 s. A connection that could not be made counts
        against the endpoint's health as a call's would: it is marked down at once, and
        no call pays a failed attempt to find out."""
        mod = self._lib.mod
        timeout = {"connect": 2.0, "read": 2.0, "write": 2.0, "pool": 2.0}
        # With the endpoint's key or credentials, as its calls carry them.
        headers = [] if ep.authorization is None else [(b"authorization", ep.authorization)]
        parsed = self._get_urls.get(url)
        if parsed is None:  # parsed once: every process polls every engine each second
            parsed = self._get_urls[url] = mod.URL(url)
        request = mod.Request("GET", parsed, headers=headers, extensions={"timeout": timeout})
        with anyio.move_on_after(3.0):
            try:
                response = await self._inner.handle_async_request(request)
                try:
                    body = await response.aread()
                finally:
                    await response.aclose()
            except (*self._lib.transport_errors, ValueError) as exc:  # type: ignore[misc]
                if isinstance(exc, self._lib.connect_errors):
                    self._core.record_health(ep, False, connect=True)
                return None
            return response.status_code, body.decode("utf-8", "replace")
        return None
