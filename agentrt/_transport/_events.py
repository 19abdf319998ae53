"""What a call tells as it goes: its events to the runtime's hooks (built only when a
hook is installed) and its log lines. Each function takes the facts it reports; none
changes the call (``_call`` decides, this module only tells)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .._log import routing_log, transport_log
from .._wire import content_of
from ..dialects._generic import check_header_name, check_header_value
from ..telemetry._events import (
    AttemptFailed,
    CallEnded,
    CallQueued,
    CallSent,
    CallStarted,
    SessionMoved,
)
from ..telemetry._reply import ReplyFacts, temperature_of

if TYPE_CHECKING:
    from .._context import Session
    from .._state import _Core
    from ..scheduling._queue import Ticket
    from ..telemetry._report import CallStatus, _CallState

__all__ = [
    "attempt_failed",
    "call_ended",
    "call_started",
    "log_attempt",
    "moved",
    "priority_refused",
    "sending",
]

_INFO = logging.INFO


def call_started(
    core: _Core,
    session: Session,
    state: _CallState,
    body: dict[str, Any] | None,
    max_out: int | None,
) -> None:
    """``CallStarted`` (hooks only)."""
    core.emit(
        CallStarted(
            t=state.started,
            job_id=session.job.id,
            session_id=session.id,
            call_id=state.call_id,
            turn=state.turn,
            path=state.path,
            model=state.model,
            stream=state.stream,
            content=content_of(body) if core.capture_content else None,
            max_tokens=max_out,
            temperature=temperature_of(body),
            session_name=session.name,
        )
    )


def moved(
    core: _Core, ticket: Ticket, state: _CallState, previous: str | None, to: str, reason: str
) -> None:
    """A session moved to another replica (its KV cache there is lost): ``SessionMoved``
    to the hooks, a line at INFO on ``agentrt.routing``."""
    if core.hooks:
        core.emit(
            SessionMoved(
                t=core.clock(),
                job_id=ticket.job_id,
                session_id=ticket.session_id,
                call_id=state.call_id,
                from_endpoint=previous or "",
                to_endpoint=to,
                reason=reason,
            )
        )
    if routing_log.isEnabledFor(_INFO):
        routing_log.info(
            "session %s (job %s) moved from %s to %s (%s): its KV cache there is lost",
            ticket.session_id,
            ticket.job_id,
            previous,
            to,
            reason,
        )


def sending(
    core: _Core,
    ticket: Ticket,
    state: _CallState,
    url: str,
    queued: bool,
    sent_at: float,
    headers: dict[str, str],
    wire_session_id: str | None = None,
) -> None:
    """Emit ``CallQueued`` (if it waited) and ``CallSent``; merge the hooks' headers."""
    if queued:
        core.emit(
            CallQueued(
                t=ticket.enqueued_at,
                job_id=ticket.job_id,
                session_id=ticket.session_id,
                call_id=state.call_id,
                endpoint=url,
                attempt=state.attempts,
            )
        )
    event = CallSent(
        t=sent_at,
        job_id=ticket.job_id,
        session_id=ticket.session_id,
        call_id=state.call_id,
        endpoint=url,
        attempt=state.attempts,
        queue_s=state.queue_s,
        held_s=state.held_s,
        priority=state.priority,
        wire_session_id=wire_session_id,
    )
    core.emit(event)
    for name, value in event.headers.items():
        headers[check_header_name(name).lower()] = check_header_value(
            value, f"header {name!r} from a hook"
        )


def attempt_failed(
    core: _Core, ticket: Ticket, state: _CallState, url: str, error: str, will_retry: bool
) -> None:
    """``AttemptFailed`` (hooks only)."""
    core.emit(
        AttemptFailed(
            t=core.clock(),
            job_id=ticket.job_id,
            session_id=ticket.session_id,
            call_id=state.call_id,
            endpoint=url,
            attempt=state.attempts,
            error=core.redact(error),
            will_retry=will_retry,
        )
    )


def log_attempt(
    core: _Core, ticket: Ticket, state: _CallState, url: str, suffix: str, outcome: str, s: float
) -> None:
    """One attempt's outcome after ``s`` seconds, at DEBUG on ``agentrt.transport``."""
    transport_log.debug(
        "call %s (job %s, session %s) attempt %d of %d to %s%s: %s after %.3f s",
        state.call_id,
        ticket.job_id,
        state.session_id,
        state.attempts,
        core.retry.attempts,
        url,
        suffix,
        core.redact(outcome),
        s,
    )


def priority_refused(url: str) -> None:
    """The warning, once per endpoint, that the endpoint at ``url`` refused a priority."""
    transport_log.warning(
        "endpoint %s refused a call's priority (HTTP 400: priority scheduling is not "
        "enabled there); the call was resent without one, and this runtime sends that "
        "endpoint no more priorities. To silence this, set send_priority=False for it "
        "(Endpoint(url, send_priority=False)), or start the server with "
        "--scheduling-policy priority",
        url,
    )


def call_ended(
    core: _Core,
    ticket: Ticket,
    state: _CallState,
    status: CallStatus,
    now: float,
    finish_reason: str | None,
    output: str | None,
    reply: ReplyFacts | None,
) -> None:
    """``CallEnded`` (hooks only)."""
    facts = reply if reply is not None else ReplyFacts()
    core.emit(
        CallEnded(
            t=now,
            job_id=ticket.job_id,
            session_id=ticket.session_id,
            call_id=state.call_id,
            status=status,
            report=state.to_report(),
            finish_reason=finish_reason,
            output=output,
            response_id=facts.id,
            response_model=facts.model,
            finish_reasons=tuple(facts.finish_reasons),
            tool_calls=tuple(facts.tool_calls),
        )
    )
