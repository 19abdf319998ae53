"""One call through the transport: tag -> route -> admit -> send (with retries) -> check
the reply -> account. :class:`Sender` is what every call of a transport sends through."""

from __future__ import annotations

import json
import logging
import re
from typing import TYPE_CHECKING

import anyio
import httpx

from ._call_events import attempt_failed, call_ended, call_started, log_attempt, moved, sending
from ._context import Job, Session, new_id
from ._errors import DeadlineExceeded, EndpointError, only_cancelled
from ._httplib import ConnTrace, HttpLib, asking_usage, prepare, rebuild, what_to_do
from ._log import credential_forms, scrub_bytes, transport_log
from ._notice import accept_header
from ._protocol import CallMetadata, trusted_model
from ._retry import RETRY_STATUS, RetryableError, RetryableStatus, backoff, retry_after
from ._stream import ObservedStream
from ._wire import (
    USAGE_PATHS,
    asks_usage,
    merge_body,
    reply_object,
    request_body,
    request_facts,
    text_of,
    tool_names_into,
    usage_into,
)
from .scheduling._queue import Ticket
from .scheduling._routing import prefix_fingerprints
from .telemetry._reply import ReplyFacts
from .telemetry._report import CallStatus, _CallState

if TYPE_CHECKING:
    from ._state import _Core, _EndpointState

__all__ = ["Call", "Sender"]

_DEBUG = logging.DEBUG
_INFO = logging.INFO
_PRIORITY_REFUSED = re.compile(rb"priority scheduling is not enabled", re.IGNORECASE)
"""In a 400 to a call that carried a priority: vLLM refuses a non-zero priority with
``Got priority {priority} but Priority scheduling is not enabled.`` when it was not
started with ``--scheduling-policy priority`` (``LLMEngine.add_request`` and the async
engine's ``add_request_async``); a proxy in front of it (LiteLLM) keeps that text."""
_MAX_ERROR_SCAN = 64 * 1024

_MAX_STALE = 256
"""Resends of one attempt after kept-alive connections the server had closed. Each such
connection leaves the pool, so the resends end once the pool's idle connections are
spent (at most its keep-alive limit, 256 in the runtime's own client); this only bounds
them. A bound of 8 was too low: a pool of 20 parallel sub-agents' idle connections, all
closed by the server, ran past it and turned a stale connection into a failed attempt
(the trio soak test, one run in six)."""


class Sender:
    """What the calls of one transport send through: the runtime's core, the wrapped
    transport, its library (and the observed stream on it), the placeholder key."""

    __slots__ = ("core", "inner", "lib", "observed", "placeholder")

    def __init__(self, core: _Core, inner: httpx.AsyncBaseTransport, lib: HttpLib) -> None:
        self.core = core
        self.inner = inner
        self.lib = lib
        self.observed = lib.derive(ObservedStream)
        self.placeholder = f"Bearer {core.placeholder_key}".encode()


class Call:
    """One call through the transport: its metadata, its attempts, its accounting."""

    __slots__ = (
        "added_usage",
        "backoff_s",
        "base",
        "body",
        "clock",
        "core",
        "ended",
        "ep",
        "failed",
        "finish_reason",
        "implicit",
        "output",
        "prefix",
        "reply",
        "request",
        "sender",
        "sent_at",
        "session",
        "state",
        "suffix",
        "ticket",
        "tools",
        "turn",
    )

    def __init__(
        self,
        sender: Sender,
        request: httpx.Request,
        base: str,
        suffix: str,
        session: Session,
        implicit: Job | None,
    ) -> None:
        self.sender = sender
        self.core = core = sender.core
        self.request = request
        self.base = base
        self.suffix = suffix
        self.session = session
        self.implicit = implicit
        self.ep: _EndpointState | None = None
        """The endpoint of the attempt in flight, counted in its load until released."""
        self.failed: set[int] = set()
        self.backoff_s = 0.0
        """Seconds slept between attempts: not service the program received."""
        self.ended = False
        self.output: str | None = None
        """The completion text, collected only with ``capture_content`` and hooks."""
        self.finish_reason: str | None = None
        """The first choice's finish reason, looked up only when there are hooks or the
        runtime learns tool waits."""
        self.tools: tuple[str, ...] = ()
        """The tools the reply calls, looked up only when the runtime learns tool waits."""
        self.reply = ReplyFacts() if core.hooks else None
        """The reply's id, model, finish reasons and tool calls, read only for hooks."""
        job = session.job
        content = request.content if request.method == "POST" else b""
        self.body = body = request_body(content) if content else None
        stream, model, max_out = request_facts(body)
        self.added_usage = False
        """agentrt asked for the stream's usage chunk (the caller did not): the chunk is
        read for the report and dropped from what the caller receives."""
        if stream and body is not None and suffix in USAGE_PATHS and not asks_usage(body):
            self.request = asking_usage(sender.lib, request, body)
            self.added_usage = True

        self.clock = clock = core.clock
        now = clock()
        after_tools = bool(session._period_tools)  # tool waits since the last call
        turn, idle_s, declared, expected, source, final = session._begin_turn(now)
        self.turn = (turn, idle_s, declared, expected, source, max_out, final)
        call_id = new_id("call")
        self.state = _CallState(
            call_id,
            session.id,
            session.name,
            turn,
            suffix,
            model,
            stream,
            now - job._t0,
            now,
        )
        job._calls.append(self.state)
        if self.turn[1] is not None:
            self.state.idle_s = self.turn[1]
            if after_tools:
                self.state.idle_cause = "tool"
        if core.prefixes is not None and content:
            self.state.prefix = core.prefixes.observe(session.id, content)
        tokens = len(content) // 4 + (max_out or 0)  # ~4 bytes of JSON per prompt token
        deadline = None if job.deadline_s is None else job._t0 + job.deadline_s
        self.ticket = Ticket(
            call_id, job.id, job.program_id, session.id, session.parent_id, tokens, deadline
        )
        self.prefix: tuple[int, ...] = ()
        if core.prefix_aware and session.endpoint_index is None and content:
            self.prefix = prefix_fingerprints(content)
        self.sent_at = now
        if core.hooks:
            call_started(core, session, self.state, body, max_out)

    # -- sending ------------------------------------------------------------------------

    def _metadata(self, priority: int | None) -> CallMetadata:
        session = self.session
        job = session.job
        program = job._program
        turn, idle_s, declared, expected, source, max_out, final = self.turn
        deadline = self.ticket.deadline_at
        # Not validated again: the ids were checked when the job and session were made,
        # the numbers are agentrt's own (tests/test_hot_path.py compares the two ways).
        return trusted_model(
            CallMetadata,
            {
                "call_id": self.state.call_id,
                "job_id": job.id,
                "session_id": session.id,
                "program_id": job.program_id,
                "parent_session_id": session.parent_id,
                "root_session_id": session.root_id,
                "session_name": session.name,
                "blocks_parent": session.blocks_parent,
                "turn": turn,
                "first_turn": turn == 0,
                "service_s": float(program.service_s),
                "service_tokens": program.service_tokens,
                "idle_expected_s": None if expected is None else float(expected),
                "idle_expected_source": source,
                "idle_s": idle_s,
                "idle_declared_s": None if declared is None else float(declared),
                "priority": priority,
                "expected_output_tokens": max_out,
                "final": final,
                "deadline_s": None if deadline is None else max(0.0, deadline - self.clock()),
                "echo": dict(echo) if (echo := session.echo) else {},
            },
        )

    async def _attempt(self) -> httpx.Response:
        """One attempt: route, admit, send once, check the reply."""
        index = self._route()
        ep = self.core.endpoints[index]
        admission = ep.admission
        ticket = self.ticket
        ticket.enqueued_at = -1.0
        if not admission.try_admit(ticket):
            await admission.admit(ticket)
        out = self._admitted(ep)
        response = await self._send(index, ep, out)
        status = response.status_code
        try:
            self.state.http_status = status
            if transport_log.isEnabledFor(_DEBUG):  # one dict lookup when off
                self._log_attempt(ep, f"HTTP {status}")
            if status in RETRY_STATUS:
                await response.aread()
                raise RetryableStatus(response, retry_after(response.headers))
        except BaseException:
            self._release(ok=status not in RETRY_STATUS)
            if status >= 500:
                self.core.record_health(ep, False)
            if self.core.hooks:
                self._failed(ep, f"HTTP {status}")
            await response.aclose()
            raise
        self._accepted(ep, response)
        return response

    def _route(self) -> int:
        """The attempt's endpoint (the router's choice; a move told), its priority (the
        endpoint's policy's queue level, where it takes one)."""
        core, state, ticket = self.core, self.state, self.ticket
        session = self.session
        placement = session.placement
        home = placement.home
        index, reason = placement.route(
            core, self.failed, self.prefix, ticket.tokens, not session._closed
        )
        ep = core.endpoints[index]
        if reason is not None:
            state.moved = True
            previous = state.endpoint or (
                core.endpoints[home].endpoint.url if home is not None else None
            )
            moved(core, ticket, state, previous, ep.endpoint.url, reason)
        policy = ep.admission.policy
        priority = policy.classify(ticket, state.started)
        if core.send_priority:
            if type(priority) is not int:
                raise TypeError(
                    f"scheduling policy {type(policy).__name__}.classify returned "
                    f"{priority!r}; it must return an int (the queue level, lower first)"
                )
            # Only to an endpoint that takes priorities (send_priority, or 'auto' and it
            # advertised a priority scheduler).
            state.priority = priority if ep.options.send_priority else None
        return index

    def _admitted(self, ep: _EndpointState) -> httpx.Request:
        """The attempt let through ``ep``'s admission gate: counted in its load, its
        request built (the room given back if building it fails)."""
        state, ticket = self.state, self.ticket
        try:
            queued = ticket.enqueued_at >= 0.0
            if queued or state.attempts:  # it waited in the queue, or this is a retry
                self.sent_at = now = self.clock()
                if queued:
                    state.queue_s += now - ticket.enqueued_at
            state.attempts += 1
            state.endpoint = ep.endpoint.url
            out = self._build(ep, queued)
        except BaseException:
            ep.admission.release(ticket, latency_s=None, tokens=0, ok=True)
            raise
        load = ep.load
        load.in_flight += 1
        load.outstanding_tokens += ticket.tokens
        self.ep = ep
        return out

    async def _send(self, index: int, ep: _EndpointState, out: httpx.Request) -> httpx.Response:
        """Send the attempt's request once; again at once on another connection where a
        kept-alive one had been closed, and once without the priority where ``ep``
        refused it. A transport error ends the attempt (:class:`RetryableError`)."""
        sender = self.sender
        lib = sender.lib
        resent = False
        stale = 0
        trace = ConnTrace.install(out)
        while True:
            try:
                response = await sender.inner.handle_async_request(out)
            except lib.transport_errors as exc:
                if trace.reused and stale < _MAX_STALE and isinstance(exc, lib.stale_errors):
                    # A kept-alive connection the server had closed (its keep-alive
                    # expired as this request went out): no reply came, the endpoint is
                    # not at fault. Resent at once, in the same attempt, on another
                    # connection (httpcore dropped that one from its pool).
                    stale += 1
                    if transport_log.isEnabledFor(_DEBUG):
                        self._log_attempt(
                            ep,
                            f"{type(exc).__name__}: {exc} on a kept-alive connection the "
                            "server had closed; resent on another connection",
                        )
                    trace = ConnTrace.install(out)
                    continue
                self._unreached(index, ep, exc)
                raise RetryableError(exc, index) from exc
            except BaseException:
                self._release(ok=True)
                raise
            if (
                response.status_code != 400
                or resent
                or self.state.priority is None
                or not await self._priority_refused(ep, response)
            ):
                return response
            # Resent at once without the priority, in the same attempt (it holds its
            # room and its retries): once per call, so a second 400 goes to the caller.
            resent = True
            try:
                self.sent_at = self.clock()
                out = self._build(ep, False)
            except BaseException:
                self._release(ok=True)
                raise
            trace = ConnTrace.install(out)

    def _unreached(self, index: int, ep: _EndpointState, exc: Exception) -> None:
        """The attempt's request got no reply (``exc``): released, told, and counted
        against ``ep``'s health. Only a connection that could not be made marks the
        endpoint down at once and sends the retry elsewhere; a read timeout or a
        connection closed without a reply is one failure toward the threshold, and the
        retry stays where the session is. Our own pool's timeout is no failure of the
        endpoint's."""
        self._release(ok=False)
        core, lib = self.core, self.sender.lib
        connect = isinstance(exc, lib.connect_errors)
        if not isinstance(exc, lib.mod.PoolTimeout):
            core.record_health(ep, False, connect=connect)
        if connect:
            self.failed.add(index)
        if core.hooks:
            self._failed(ep, f"{type(exc).__name__}: {exc}")
        if transport_log.isEnabledFor(_DEBUG):
            self._log_attempt(ep, f"{type(exc).__name__}: {exc}")

    def _accepted(self, ep: _EndpointState, response: httpx.Response) -> None:
        """A reply that ends the attempts: ``ep``'s health, the features it accepts, the
        headers the dialect echoes on the session's next calls."""
        status = response.status_code
        if status < 500:
            ep.health.record_success(self.sent_at)
        if status < 300:  # the features it accepts (tool-start notices)
            accept = accept_header(response.headers)
            if accept != ep.accept:
                ep.accept_header(accept)
        for name in ep.dialect.echo_headers:
            value = response.headers.get(name)
            if value is not None and len(value) <= 1024 and "\r" not in value:
                self.session.echo[name] = value

    def _build(self, ep: _EndpointState, queued: bool) -> httpx.Request:
        """The request of the attempt to ``ep``: the dialect's headers and body fields for
        the call's metadata (its priority where ``ep`` takes one), the hooks' headers."""
        enc = ep.dialect.encode(self._metadata(self.state.priority), ep.options)
        if self.core.hooks:
            self._sending(ep, queued, enc.headers)
        content = None
        if enc.body and self.body is not None:
            send_body = dict(self.body)
            merge_body(send_body, enc.body)
            content = json.dumps(send_body, separators=(",", ":")).encode()
        request = self.request
        base = ep.endpoint.url
        url = request.url if base == self.base else ep.url_for(self.suffix, request.url)
        return prepare(
            self.sender.lib,
            request,
            url,
            enc.headers,
            ep.authorization,
            content,
            self.sender.placeholder,
        )

    async def _priority_refused(self, ep: _EndpointState, response: httpx.Response) -> bool:
        """Whether a 400 to a call that carried a priority refuses the priority itself
        (vLLM not started with ``--scheduling-policy priority``). If so, the reply is
        closed and ``ep`` gets no more priorities; the call's priority is cleared (its
        report shows none was sent). Any other 400 stays as it is, read, for the caller."""
        try:
            body = await response.aread()
        except BaseException:
            self._release(ok=True)
            await response.aclose()
            raise
        if _PRIORITY_REFUSED.search(body[:_MAX_ERROR_SCAN]) is None:
            return False
        await response.aclose()
        state = self.state
        state.http_status = 400
        if transport_log.isEnabledFor(_DEBUG):
            self._log_attempt(ep, "HTTP 400 (priority scheduling is not enabled)")
        if self.core.hooks:
            self._failed(ep, "HTTP 400", will_retry=True)
        state.priority = None
        if ep.refuse_priority():
            transport_log.warning(
                "endpoint %s refused a call's priority (HTTP 400: priority scheduling is "
                "not enabled there); the call was resent without one, and this runtime "
                "sends that endpoint no more priorities. To silence this, set "
                "send_priority=False for it (Endpoint(url, send_priority=False)), or start "
                "the server with --scheduling-policy priority",
                ep.endpoint.url,
            )
        return True

    def _scrubbed(self, body: bytes) -> bytes:
        """An error reply's body without the runtime's secrets or the credential the call
        carried, before the caller's client reads it: servers echo them (OpenAI's 401
        quotes the key), and the exception, the job's error and the journal would."""
        own = credential_forms(self.request.headers.get("authorization"))
        return scrub_bytes(body, tuple(sorted({*self.core.secrets, *own}, key=len, reverse=True)))

    def _log_attempt(self, ep: _EndpointState, outcome: str) -> None:
        elapsed = self.clock() - self.sent_at
        log_attempt(
            self.core, self.ticket, self.state, ep.endpoint.url, self.suffix, outcome, elapsed
        )

    def _sending(self, ep: _EndpointState, queued: bool, headers: dict[str, str]) -> None:
        sending(self.core, self.ticket, self.state, ep.endpoint.url, queued, self.sent_at, headers)

    def _failed(self, ep: _EndpointState, error: str, *, will_retry: bool = False) -> None:
        attempt_failed(self.core, self.ticket, self.state, ep.endpoint.url, error, will_retry)

    async def _sleep(self, seconds: float) -> None:
        """A backoff between attempts, counted apart from the call's service."""
        start = self.clock()
        try:
            await anyio.sleep(seconds)
        finally:
            self.backoff_s += self.clock() - start

    async def _attempts(self) -> httpx.Response:
        """The call's attempts, one after another with a backoff between them, until one
        is not retried; the last one's failure if every one failed."""
        retry = self.core.retry
        n = 1
        while True:
            try:
                return await self._attempt()
            except (RetryableStatus, RetryableError) as exc:
                if n >= retry.attempts:
                    raise
                delay = backoff(retry, n, exc)
            await self._sleep(delay)
            n += 1

    async def run_bounded(self, deadline: float) -> httpx.Response:
        """:meth:`run` within its job's deadline: a call of a job with a deadline is
        bounded here whatever path it came by (an async or a sync client, a framework's
        model, a task outside the job's block). A call without one goes to :meth:`run`
        straight (no scope, no extra coroutine)."""
        with anyio.CancelScope(deadline=deadline) as scope:
            return await self.run()
        assert scope.cancelled_caught
        raise self.deadline_exceeded()

    def why_cancelled(self) -> str:
        """Why a cancelled call was cancelled: its job's deadline, or something else."""
        deadline = self.ticket.deadline_at
        if deadline is not None and self.clock() >= deadline:
            job = self.session.job
            job._deadline_hit = True
            return f"deadline of {job.deadline_s:g} s exceeded"
        return "cancelled"

    def deadline_exceeded(self) -> DeadlineExceeded:
        """End the call at its job's deadline; the error to raise."""
        job = self.session.job
        job._deadline_hit = True
        self.end("cancelled", f"deadline of {job.deadline_s:g} s exceeded")
        return DeadlineExceeded(f"job {job.id!r} exceeded its deadline of {job.deadline_s:g} s")

    async def run(self) -> httpx.Response:
        """Send the call (with retries) and check its reply."""
        try:
            response = await self._attempts()
        except RetryableStatus as exc:
            return self._out_of_attempts(exc.response)
        except RetryableError as exc:
            raise self._unreachable(exc) from exc.error
        except EndpointError:  # (as it was: a call it ends has ended)
            raise
        except BaseException as exc:
            self._ended_by(exc)
            raise
        if (
            self.state.stream
            and response.status_code < 300
            and not response.headers.get("content-type", "").startswith("application/json")
        ):
            response.stream = self.sender.observed(self, response)
            return response
        try:
            raw = await response.aread()
        except BaseException as exc:
            self._ended_by(exc)  # first: a cancelled aclose() may raise it again
            await response.aclose()
            raise
        if response.status_code >= 300:
            raw = self._scrubbed(raw)
            self.end("error", f"HTTP {response.status_code}")
        else:
            self._check_reply(response, raw)
        return rebuild(self.sender.lib, response, raw)

    def _ended_by(self, exc: BaseException) -> None:
        """The call ends with ``exc``: cancelled (trio's cancellation may come in a group,
        from a nursery), else an error."""
        if only_cancelled(exc):
            self.end("cancelled", self.why_cancelled())
        else:
            self.end("error", f"{type(exc).__name__}: {exc}")

    def _out_of_attempts(self, response: httpx.Response) -> httpx.Response:
        """Out of attempts on a retryable status: the last error reply goes to the caller
        (openai raises its usual typed error from it)."""
        state = self.state
        self.end("error", f"HTTP {response.status_code}")
        transport_log.warning(
            "call %s (job %s, session %s): HTTP %d on the last of %d attempt(s), "
            "from %s; that answer goes to the caller",
            state.call_id,
            self.ticket.job_id,
            state.session_id,
            response.status_code,
            state.attempts,
            state.endpoint,
        )
        return rebuild(self.sender.lib, response, self._scrubbed(response.content))

    def _unreachable(self, exc: RetryableError) -> EndpointError:
        """Out of attempts on transport errors: the call ends; the error to raise."""
        state = self.state
        url = self.core.endpoints[exc.endpoint].endpoint.url
        message = self.core.redact(
            f"endpoint {url} failed after {state.attempts} attempt(s): "
            f"{type(exc.error).__name__}: {exc.error}; "
            + what_to_do(exc.error, url, self.sender.lib.mod)
        )
        self.end("error", message)
        transport_log.warning(
            "call %s (job %s, session %s): %s",
            state.call_id,
            self.ticket.job_id,
            state.session_id,
            message,
        )
        return EndpointError(message, endpoint=url, attempts=state.attempts)

    def _check_reply(self, response: httpx.Response, raw: bytes) -> None:
        """A 2xx reply, read whole: a JSON completion (its usage, finish reason, tool calls
        and text taken; the call ends ``ok``), else the call ends in
        :class:`EndpointError`."""
        state = self.state
        reply, problem = reply_object(raw, self.suffix)
        if reply is None or state.stream:
            if state.stream:  # a JSON reply to a streamed call: no client can read it
                problem = "a JSON body, not an event stream, to a streamed call"
            url = self.ep.endpoint.url if self.ep is not None else self.base
            ctype = response.headers.get("content-type", "?")
            message = self.core.redact(
                f"endpoint {url} did not answer like an OpenAI-compatible server: "
                f"{problem}; HTTP {response.status_code}, content-type {ctype}, "
                f"body starts {raw[:80]!r}"
            )
            self.end("error", message)
            raise EndpointError(message, endpoint=url, attempts=state.attempts)
        usage_into(state, reply.get("usage"))
        core = self.core
        choices = reply.get("choices")
        if choices.__class__ is not list:
            choices = None  # an API without choices (embeddings, models)
        if core.hooks or core.waits is not None:
            # The first choice's (as the hooks report it), else the last one's (tool
            # calls are spotted from it).
            choice = (choices[0] if core.hooks else choices[-1]) if choices else None
            finish = choice.get("finish_reason") if choice.__class__ is dict else None
            self.finish_reason = finish if isinstance(finish, str) else None
        if self.finish_reason == "tool_calls" and core.waits is not None:
            names: list[str] = []
            tool_names_into(names, choices, "message")
            self.tools = tuple(names)
        if core.hooks and core.capture_content:
            self.output = text_of(choices[0]) if choices else None
        if self.reply is not None:
            self.reply.read(reply, "message")
        self.end("ok", None)

    # -- ending ---------------------------------------------------------------------------

    def _release(self, *, ok: bool, now: float | None = None) -> None:
        """The attempt in flight is over (at ``now``, else read from the clock): its
        endpoint no longer carries it, its room in the admission gate goes to the next
        call, and its latency feeds the limit."""
        ep = self.ep
        if ep is None:
            return
        self.ep = None
        ticket = self.ticket
        load = ep.load
        load.in_flight -= 1
        load.outstanding_tokens -= ticket.tokens
        latency = (self.clock() if now is None else now) - self.sent_at
        ep.admission.release(ticket, latency, self.state.completion_tokens or 0, ok)

    def end(self, status: CallStatus, error: str | None) -> None:
        """The call is over (once): release its endpoint, account it, end an implicit job."""
        if self.ended:
            return
        self.ended = True
        now = self.clock()  # one read for the release and the accounting
        if self.ep is not None:
            self._release(ok=status != "error", now=now)
        state = self.state
        if not state.done:
            state.done = True
            state.latency_s = latency = now - state.started
            state.status = status
            state.error = error if error is None else self.core.redact(error)
            core, session, ticket = self.core, self.session, self.ticket
            job = session.job
            program = job._program
            tokens = (state.prompt_tokens or 0) + (state.completion_tokens or 0)
            service = latency - state.queue_s - self.backoff_s  # not queueing nor backoff
            if service < 0.0:
                service = 0.0
            program.service_s += service
            program.service_tokens += tokens
            ticket.idle_expected_s = self.turn[3]
            core.call_ended(ticket, service, tokens)
            if status == "ok":
                session.placement.replied(core, now, state, self.turn[1])  # cache retention
                if self.tools:
                    session._tool_calls(self.tools)
            if core.hooks:
                call_ended(
                    core, ticket, state, status, now, self.finish_reason, self.output, self.reply
                )
        if self.implicit is not None:
            self.session._unpin()
            self.implicit._end_implicit()
