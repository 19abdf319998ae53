"""The ``sglang`` dialect: an SGLang server, or the SGLang Model Gateway in front of it.

- header ``X-SMG-Routing-Key`` = the session id: the gateway's ``consistent_hashing`` and
  ``manual`` policies pin a key to one worker (and any policy does, on a gateway started
  with ``--routing-key-override``), and SGLang's OpenAI endpoints read the same header
  into the request's ``routing_key``;
- header ``X-SMG-Priority``, only with ``DialectOptions(send_priority=True)``: the
  gateway's priority class (``bulk < default < interactive < system``; an unknown value
  is ``default``; ``model_gateway/src/middleware/scheduler/class.rs``), from the call's
  queue level: level 0 ``interactive``, 1 ``default``, 2 and later ``bulk``
  (:data:`SMG_PRIORITY_CLASSES`; ``sglang_dialect(priority_classes=...)`` maps them
  otherwise). ``system`` is the gateway's own control traffic, and the gateway clamps an
  external tenant below it. A request the gateway preempts for a higher class gets 503
  with ``X-SMG-Preempted: true`` and ``Retry-After: 1``: agentrt retries it after that
  wait and does not count it against the replica's health;
- body ``priority`` only with ``DialectOptions(send_priority=True)``. SGLang's polarity is
  a server flag: with ``--enable-priority-scheduling`` higher values run first, unless
  ``--schedule-low-priority-values-first`` is set. agentrt's priority is lower-first, so by
  default it is sent negated; ``sglang_dialect(low_priority_values_first=True)`` (name
  ``sglang:low-priority-first``) sends it as is;
- body ``session_id`` = the session id, only with ``sglang_dialect(send_session_id=True)``
  (name ``sglang:session-id``): SGLang 0.5.15 and later read a top-level ``session_id`` as
  the request's stable session identity (sgl-project/sglang#29436); a server started with
  ``--enable-session-radix-cache`` tags the session's KV with it, no ``/open_session``
  needed, and keeps it referenced until ``/close_session`` (agentrt's
  :func:`~agentrt.dialects.sglang_session_ends` hook sends that when the session ends).
  Off by default: older servers do not know the field.
- with ``sglang_dialect(send_session_id=True, close_session=True)`` (name
  ``sglang:session-id,close-session``) the runtime itself sends each server
  ``POST /close_session`` with ``{"session_id": ID}`` when a session that called it ends
  (:data:`~agentrt.dialects.CLOSE_SESSION`): the close that frees a radix session's KV
  (sgl-project/sglang#27058, #29436). Off by default: without
  ``--enable-session-radix-cache`` a server has no such session to close.
"""

from __future__ import annotations

from typing import Final

from .._protocol import CallMetadata
from ._base import Dialect, DialectOptions, Encoding
from ._generic import INT32_MAX, INT32_MIN, base_encoding, clamp
from ._session_ends import CLOSE_SESSION

__all__ = [
    "SGLANG",
    "SGLANG_OPTIONS",
    "SMG_PRIORITY_CLASSES",
    "sglang_dialect",
    "sglang_priority",
    "smg_priority_class",
]

SMG_PRIORITY_CLASSES: Final = ("interactive", "default", "bulk")
"""The gateway's priority class of each queue level (0 runs first), the last one for the
levels past it."""
_SMG_CLASSES: Final = frozenset({"system", "interactive", "default", "bulk"})

SGLANG_OPTIONS: Final = ("low-priority-first", "session-id", "close-session")
"""The options of the dialect name ``sglang:<option>[,<option>]``."""


def sglang_priority(priority: int, *, low_priority_values_first: bool = False) -> int:
    """agentrt priority (lower runs first) to SGLang's, bounded to a 32-bit int."""
    value = priority if low_priority_values_first else -priority
    return clamp(value, INT32_MIN + 1, INT32_MAX)


def smg_priority_class(priority: int, classes: tuple[str, ...] = SMG_PRIORITY_CLASSES) -> str:
    """The ``X-SMG-Priority`` class of agentrt queue level ``priority`` (0 runs first)."""
    return classes[min(max(priority, 0), len(classes) - 1)]


def sglang_dialect(
    *,
    low_priority_values_first: bool = False,
    send_session_id: bool = False,
    close_session: bool = False,
    priority_classes: tuple[str, ...] = SMG_PRIORITY_CLASSES,
) -> Dialect:
    """Build the SGLang dialect for a server with the given priority polarity.

    ``send_session_id=True`` adds the body ``session_id`` (SGLang 0.5.15 or later; with
    ``--enable-session-radix-cache`` it keeps the session's KV until the session is closed).
    ``close_session=True`` (with ``send_session_id``) has the runtime send
    ``POST /close_session`` to each server a session called when the session ends.
    ``priority_classes``: the gateway's ``X-SMG-Priority`` class of queue level 0, 1, ...
    (the last for the levels past it), sent with ``send_priority``.
    """
    if (
        not isinstance(priority_classes, tuple)
        or not priority_classes
        or any(c not in _SMG_CLASSES for c in priority_classes)
    ):
        raise ValueError(
            "priority_classes must be a non-empty tuple of 'system', 'interactive', "
            f"'default', 'bulk', got {priority_classes!r}"
        )
    classes = priority_classes
    for what, flag in (
        ("low_priority_values_first", low_priority_values_first),
        ("send_session_id", send_session_id),
        ("close_session", close_session),
    ):
        if not isinstance(flag, bool):
            raise TypeError(f"{what} must be a bool, got {type(flag).__name__}")
    if close_session and not send_session_id:
        raise ValueError(
            "close_session=True needs send_session_id=True: a server tags a session's KV "
            "only by the body session_id ('sglang:session-id,close-session')"
        )

    def encode(meta: CallMetadata, options: DialectOptions) -> Encoding:
        enc = base_encoding(meta)
        enc.headers["x-smg-routing-key"] = meta.session_id
        if send_session_id:
            enc.body["session_id"] = meta.session_id
        if options.send_priority and meta.priority is not None:
            enc.body["priority"] = sglang_priority(
                meta.priority, low_priority_values_first=low_priority_values_first
            )
            enc.headers["x-smg-priority"] = smg_priority_class(meta.priority, classes)
        return enc

    chosen = [
        opt
        for opt, on in zip(
            SGLANG_OPTIONS,
            (low_priority_values_first, send_session_id, close_session),
            strict=True,
        )
        if on
    ]
    name = "sglang" + (":" + ",".join(chosen) if chosen else "")
    order = "as is (lower first)" if low_priority_values_first else "negated (higher first)"
    session = "; body session_id = session id" if send_session_id else ""
    close = "; POST /close_session when a session ends" if close_session else ""
    return Dialect(
        name=name,
        encode=encode,
        doc=f"SGLang: X-SMG-Routing-Key = session id{session}; body priority {order} and "
        f"X-SMG-Priority = {'/'.join(classes)} by queue level, only with send_priority{close}.",
        session_ends=(CLOSE_SESSION,) if close_session else (),
    )


def sglang_from_options(arg: str) -> Dialect:
    """The dialect of ``sglang:<arg>``: options from :data:`SGLANG_OPTIONS`, comma-separated."""
    opts = [part.strip().lower() for part in arg.split(",")]
    unknown = [o for o in opts if o not in SGLANG_OPTIONS]
    if unknown or not opts:
        known = ", ".join(repr(o) for o in SGLANG_OPTIONS)
        raise ValueError(f"unknown option {arg!r} for dialect 'sglang'; the options are {known}")
    return sglang_dialect(
        low_priority_values_first="low-priority-first" in opts,
        send_session_id="session-id" in opts,
        close_session="close-session" in opts,
    )


SGLANG: Final = sglang_dialect()
"""The ``sglang`` dialect with its defaults (:func:`sglang_dialect`)."""
