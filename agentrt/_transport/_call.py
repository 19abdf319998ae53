"""One call through the transport: its setup (the request read once, the turn claimed,
its record and ticket), its attempts (an ``_attempts.Attempts`` it holds), its outcome
(the reply checked, or the error raised) and its end (accounted once)."""

from __future__ import annotations

import anyio
import httpx

from .._context import Job, Session
from .._errors import DeadlineExceeded, EndpointError, only_cancelled
from .._httplib import rebuild, what_to_do
from .._ids import new_id
from .._log import credential_forms, scrub_bytes, transport_log
from .._wire import (
    reply_object,
    request_body,
    request_facts,
    text_of,
    tool_names_into,
    usage_into,
)
from ..scheduling._queue import Ticket
from ..scheduling._routing import prefix_fingerprints
from ..telemetry._reply import ReplyFacts
from ..telemetry._report import CallStatus
from ._attempts import Attempts, Sender
from ._events import call_ended, call_started
from ._outgoing import Outgoing
from ._retry import RetryableError, RetryableStatus

__all__ = ["TransportCall"]


class TransportCall:
    """One call through the transport: its metadata, its attempts, its accounting."""

    __slots__ = (
        "attempts",
        "base",
        "clock",
        "core",
        "ended",
        "finish_reason",
        "implicit",
        "out",
        "output",
        "reply",
        "sender",
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
        self.clock = clock = core.clock
        self.base = base
        self.suffix = suffix
        self.session = session
        self.implicit = implicit
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
        body = request_body(content) if content else None
        stream, model, max_out = request_facts(body)
        self.out = Outgoing(sender.lib, sender.placeholder, request, base, suffix, body, stream)
        """What each attempt sends."""

        now = clock()
        self.turn = start = session._begin_turn(now)
        """The session's turn this call takes (its idle time before it, what it expects)."""
        call_id = new_id("call")
        self.state = state = job._open_call(
            call_id, session, start.turn, suffix, model, stream, now
        )
        """The call's record: what its report is built from."""
        if start.idle_s is not None:
            state.idle_s = start.idle_s
            if start.after_tools:
                state.idle_cause = "tool"
        if core.prefixes is not None and content:
            state.prefix = core.prefixes.observe(session.id, content)
        tokens = len(content) // 4 + (max_out or 0)  # ~4 bytes of JSON per prompt token
        self.ticket = Ticket(
            call_id,
            job.id,
            job.program_id,
            session.id,
            session.parent_id,
            tokens,
            job._deadline_at(),
        )
        """What the scheduler and the router know of the call."""
        prefix: tuple[int, ...] = ()
        if core.prefix_aware and session.endpoint_index is None and content:
            prefix = prefix_fingerprints(content)
        self.attempts = Attempts(
            sender, self.out, session, state, self.ticket, start, max_out, prefix, now
        )
        """Its attempts: route, admit, send, retry."""
        if core.hooks:
            call_started(core, session, state, body, max_out)

    def _scrubbed(self, body: bytes) -> bytes:
        """An error reply's body without the runtime's secrets or the credential the call
        carried, before the caller's client reads it: servers echo them (OpenAI's 401
        quotes the key), and the exception, the job's error and the journal would."""
        own = credential_forms(self.out.request.headers.get("authorization"))
        return scrub_bytes(body, tuple(sorted({*self.core.secrets, *own}, key=len, reverse=True)))

    async def run_bounded(self, deadline: float) -> httpx.Response:
        """:meth:`run` within its job's deadline: a call of a job with a deadline is
        bounded here whatever path it came by (an async or a sync client, a framework's
        model, a task outside the job's block). A call without one goes to :meth:`run`
        straight (no scope, no extra coroutine)."""
        with anyio.CancelScope(deadline=deadline) as scope:
            return await self.run()
        assert scope.cancelled_caught
        raise self.deadline_exceeded()

    def replied_from(self) -> str:
        """The URL of the endpoint whose reply this is (the attempt in flight), else the
        URL the caller's client sent to."""
        ep = self.attempts.ep
        return ep.endpoint.url if ep is not None else self.base

    def why_cancelled(self) -> str:
        """Why a cancelled call was cancelled: its job's deadline, or something else."""
        deadline = self.ticket.deadline_at
        if deadline is not None and self.clock() >= deadline:
            return self.session.job._hit_deadline()
        return "cancelled"

    def deadline_exceeded(self) -> DeadlineExceeded:
        """End the call at its job's deadline; the error to raise."""
        job = self.session.job
        self.end("cancelled", job._hit_deadline())
        return DeadlineExceeded(f"job {job.id!r} exceeded its deadline of {job.deadline_s:g} s")

    async def run(self) -> httpx.Response:
        """Send the call (with retries) and check its reply."""
        try:
            response = await self.attempts.run()
        except RetryableStatus as exc:
            return self._out_of_attempts(exc.response)
        except RetryableError as exc:
            raise self._unreachable(exc) from None  # the transport's error: its .error
        except BaseException as exc:  # an EndpointError of a wrapped agentrt transport too
            self._ended_by(exc)
            raise
        if (
            self.state.stream
            and response.status_code < 300
            and not response.headers.get("content-type", "").startswith("application/json")
        ):
            if response.is_stream_consumed:
                return await self._observe_read(response)
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

    async def _observe_read(self, response: httpx.Response) -> httpx.Response:
        """A streamed reply whose body came already read (an ``httpx.MockTransport``
        reply built from ``content=``: the caller reads ``response.content``, never the
        stream): observed now, whole, as the caller's reading would have (usage, time to
        first token, the call's end), and handed on with what the caller is to read."""
        lib = self.sender.lib
        response.stream = lib.Bytes(response.content)
        observed = self.sender.observed(self, response)
        try:
            content = b"".join([chunk async for chunk in observed])
        finally:
            await observed.aclose()
        if "content-length" in response.headers:  # less, where the usage chunk was removed
            response.headers["content-length"] = str(len(content))
        return rebuild(lib, response, content)

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
        url = exc.endpoint
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
        return EndpointError(message, endpoint=url, attempts=state.attempts, error=exc.error)

    def _check_reply(self, response: httpx.Response, raw: bytes) -> None:
        """A 2xx reply, read whole: a JSON completion (its usage, finish reason, tool calls
        and text taken; the call ends ``ok``), else the call ends in
        :class:`EndpointError`."""
        state = self.state
        reply, problem = reply_object(raw, self.suffix)
        if reply is None or state.stream:
            if state.stream:  # a JSON reply to a streamed call: no client can read it
                problem = "a JSON body, not an event stream, to a streamed call"
            url = self.replied_from()
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

    def end(self, status: CallStatus, error: str | None) -> None:
        """The call is over (once): release its endpoint, account it, end an implicit job."""
        if self.ended:
            return
        self.ended = True
        now = self.clock()  # one read for the release and the accounting
        attempts = self.attempts
        if attempts.ep is not None:
            attempts.release(ok=status != "error", now=now)
        state = self.state
        if not state.done:
            state.done = True
            state.latency_s = latency = now - state.started
            state.status = status
            state.error = error if error is None else self.core.redact(error)
            core, session, ticket = self.core, self.session, self.ticket
            tokens = (state.prompt_tokens or 0) + (state.completion_tokens or 0)
            # Not held, queueing nor backoff: service the program received.
            service = latency - state.held_s - state.queue_s - attempts.backoff_s
            if service < 0.0:
                service = 0.0
            session.job._served(service, tokens)
            ticket.idle_expected_s = self.turn.idle_expected_s
            core.call_ended(ticket, service, tokens)
            if status == "ok":
                session.placement.replied(  # cache retention, working set
                    core, now, state, self.turn.idle_s, self.turn.idle_expected_s
                )
                if self.tools:
                    session._tool_calls(self.tools)
            else:
                session.placement.failed(core)
            if core.hooks:
                call_ended(
                    core, ticket, state, status, now, self.finish_reason, self.output, self.reply
                )
        if self.implicit is not None:
            self.session._unpin()
            self.implicit._end_implicit()
