"""What each attempt of a call sends: the metadata it carries (:func:`metadata`) and the
request that carries it (:class:`Outgoing`): the caller's, its JSON body parsed once per
call, with the dialect's headers and body fields for that metadata. Nothing here routes,
admits or counts (the attempts do, ``_attempts``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx

from .._httplib import HttpLib, asking_usage, prepare
from .._protocol import CallMetadata, trusted_model
from .._wire import USAGE_PATHS, ask_usage, asks_usage, json_bytes, merged

if TYPE_CHECKING:
    from .._context import Session
    from .._state import _EndpointState
    from .._turns import TurnStart
    from ..dialects._base import Encoding
    from ..scheduling._queue import Ticket
    from ..telemetry._report import _CallState

__all__ = ["Outgoing", "metadata"]


def metadata(
    session: Session,
    state: _CallState,
    ticket: Ticket,
    turn: TurnStart,
    max_out: int | None,
    clock: Callable[[], float],
) -> CallMetadata:
    """The metadata an attempt of a call carries (``state.priority``: its priority where
    its endpoint takes one; ``max_out``: the output tokens the request allows); ``clock``
    tells the time left to its deadline."""
    job = session.job
    service_s, service_tokens = job._attained()
    number, idle_s, declared, expected, source, final, _ = turn
    deadline = ticket.deadline_at
    # Not validated again: the ids were checked when the job and session were made,
    # the numbers are agentrt's own (tests/transport/test_hot_path.py compares the two ways).
    return trusted_model(
        CallMetadata,
        {
            "call_id": state.call_id,
            "job_id": job.id,
            "session_id": session.id,
            "program_id": job.program_id,
            "parent_session_id": session.parent_id,
            "root_session_id": session.root_id,
            "session_name": session.name,
            "blocks_parent": session.blocks_parent,
            "turn": number,
            "first_turn": number == 0,
            "service_s": float(service_s),
            "service_tokens": service_tokens,
            "idle_expected_s": None if expected is None else float(expected),
            "idle_expected_source": source,
            "idle_s": idle_s,
            "idle_declared_s": None if declared is None else float(declared),
            "priority": state.priority,
            "expected_output_tokens": max_out,
            "final": final,
            "deadline_s": None if deadline is None else max(0.0, deadline - clock()),
            "echo": dict(echo) if (echo := session.echo) else {},
        },
    )


class Outgoing:
    """A call's request as its attempts send it: the caller's (``request``) to the URL
    its path (``suffix``) has on each endpoint; its JSON body (``body``) parsed once per
    call and serialized at most once per attempt. For a streamed call whose caller did
    not ask for usage, agentrt asks for it (``added_usage``: the usage chunk is read for
    the report and dropped from what the caller receives)."""

    __slots__ = (
        "added_usage",
        "asked",
        "asked_whole",
        "base",
        "body",
        "lib",
        "placeholder",
        "request",
        "suffix",
    )

    def __init__(
        self,
        lib: HttpLib,
        placeholder: bytes,
        request: httpx.Request,
        base: str,
        suffix: str,
        body: dict[str, Any] | None,
        stream: bool,
    ) -> None:
        self.lib = lib
        self.placeholder = placeholder
        self.request = request
        self.base = base
        self.suffix = suffix
        self.body = body
        self.added_usage = False
        if stream and body is not None and suffix in USAGE_PATHS and not asks_usage(body):
            ask_usage(body)
            self.added_usage = True
        self.asked: httpx.Request | None = None
        """The caller's request asking for usage (``added_usage``), built on the first
        attempt: with the body (``asked_whole``), else without one."""
        self.asked_whole = False

    def to(self, ep: _EndpointState, enc: Encoding) -> httpx.Request:
        """The request of an attempt to ``ep``: ``enc``'s headers (those the caller did
        not set), its body fields merged into the body (never over the caller's), the
        endpoint's URL and ``Authorization``."""
        body = self.body
        content = None
        if enc.body and body is not None:
            content = json_bytes(merged(body, enc.body))
            request = self._asking(False) if self.added_usage else self.request
        else:
            request = self._asking(True) if self.added_usage else self.request
        url = request.url if ep.endpoint.url == self.base else ep.url_for(self.suffix, request.url)
        return prepare(
            self.lib, request, url, enc.headers, ep.authorization, content, self.placeholder
        )

    def callers_session_id(self, enc: Encoding, session_id: str) -> str | None:
        """The caller's own session id where the caller set a header or body field that
        ``enc`` would fill with ``session_id`` (the caller's wins on the wire, so the
        server knows the session by it); None where there is none."""
        headers = self.request.headers
        for name, value in enc.headers.items():
            if value == session_id:
                theirs = headers.get(name)
                if theirs is not None and theirs != session_id:
                    return str(theirs)
        body = self.body
        if body is not None:
            for key, value in enc.body.items():
                if value == session_id:
                    theirs = body.get(key)
                    if isinstance(theirs, str) and theirs != session_id:
                        return theirs
        return None

    def _asking(self, whole: bool) -> httpx.Request:
        """The caller's request asking for usage, built once: with the body serialized
        where it goes as it is (``whole``), else without one (an attempt's body, with a
        dialect's fields merged, takes its place); one with the body serves both."""
        asked = self.asked
        if asked is None or (whole and not self.asked_whole):
            assert self.body is not None
            content = json_bytes(self.body) if whole else None
            asked = self.asked = asking_usage(self.lib, self.request, content)
            self.asked_whole = whole
        return asked
