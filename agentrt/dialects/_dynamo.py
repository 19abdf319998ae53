"""The ``dynamo`` dialect: an NVIDIA Dynamo frontend.

- headers ``X-Dynamo-Session-ID`` (always) and ``X-Dynamo-Parent-Session-ID`` (sub-agent
  sessions only): Dynamo's canonical session identity, normalized into its
  ``agent_context``;
- header ``X-Dynamo-Session-Final: true`` on a call the caller marked as the session's
  last (``session.chat(..., final=True)`` or ``session.expect_final()``): Dynamo marks
  the session final and asks the engine to evict its KV (``kv_hints.evict_session``);
- body ``nvext.agent_hints``: ``osl`` (expected output tokens, here the request's
  ``max_tokens`` when given, so an upper bound) and, only with
  ``DialectOptions(send_priority=True)``, ``priority``. Dynamo's priority is
  higher = more important, the inverse of agentrt's lower-runs-first, so
  :func:`dynamo_priority` negates it (0 stays 0).
- the session id also in the header a frontend started with
  ``--router-session-header-key NAME`` reads for its router-local session affinity
  (ai-dynamo/dynamo#11702), with ``dynamo_dialect(session_header=NAME)`` (name
  ``dynamo:NAME``): such a header "affects routing only", so ``X-Dynamo-Session-ID`` still
  goes for the agent context;
- no ``nvext.session_control``: the body-level session control is deprecated (removed from
  the router with the header-based affinity of ai-dynamo/dynamo#10875) and agentrt never
  sent it;
- ``nvext.cache_control`` ``{"type": "ephemeral", "ttl": "<N>s"}`` only with
  ``dynamo_dialect(cache_control=True)`` (name ``dynamo:cache-control``): the session's
  expected idle plus a margin, in whole seconds rounded up, on a call that is not its
  session's last (ai-dynamo/dynamo#6213: the router pins the request's prefix on the
  worker it chose for the TTL, behind the frontend's ``--enable-agentic-cache-control``;
  docs/protocol.md says what the stored source shows);
- ``strict_priority`` (a router pending-queue tier, higher first) and
  ``speculative_prefill`` (warm the next turn's prefix after the reply) only when chosen
  with :func:`dynamo_dialect`: Dynamo versions that predate a hint reject the request
  (``agent_hints`` denies unknown fields).
"""

from __future__ import annotations

import math
from typing import Any, Final

from .._protocol import CallMetadata
from ._base import Dialect, DialectOptions, Encoding
from ._generic import INT32_MAX, INT32_MIN, base_encoding, check_header_name, clamp
from ._retention import (
    DEFAULT_RETENTION_MARGIN_S,
    DEFAULT_RETENTION_MAX_S,
    check_window,
    retention_window,
)

__all__ = ["DYNAMO", "DYNAMO_SESSION_HEADER", "dynamo_dialect", "dynamo_priority"]

DYNAMO_SESSION_HEADER: Final = "x-dynamo-session-id"
"""Dynamo's canonical session header (and ``--router-session-header-key``'s default)."""

_UINT32_MAX: Final = 2**32 - 1


def dynamo_priority(priority: int) -> int:
    """agentrt priority (lower runs first) to Dynamo's (higher = more important, i32)."""
    return clamp(-priority, INT32_MIN + 1, INT32_MAX)


def dynamo_dialect(
    *,
    strict_priority: int | None = None,
    speculative_prefill: bool = False,
    send_final: bool = True,
    session_header: str = DYNAMO_SESSION_HEADER,
    cache_control: bool = False,
    retention_margin_s: float = DEFAULT_RETENTION_MARGIN_S,
    retention_max_s: float = DEFAULT_RETENTION_MAX_S,
) -> Dialect:
    """Build the Dynamo dialect.

    ``cache_control``: send ``nvext.cache_control`` with a TTL of the session's expected
    idle plus ``retention_margin_s`` (at most ``retention_max_s``), in whole seconds
    rounded up, when that idle is known and the call is not the session's last.

    ``session_header``: the header the frontend's ``--router-session-header-key`` names
    (``DYN_ROUTER_SESSION_HEADER_KEY``); the session id goes in it as well as in
    ``X-Dynamo-Session-ID``. Checked as every header name agentrt sends.

    ``strict_priority``: the router pending-queue tier of every call through this dialect
    (an unsigned 32-bit int; a higher tier always goes ahead of a lower one; router only,
    not forwarded to the engine). Give interactive and background agents different tiers
    with an endpoint or runtime each. ``None`` sends none.

    ``speculative_prefill``: ask Dynamo to prefill the predicted next-turn prefix after
    each reply, so the session's next call finds its KV warm; not sent on a session's
    last call (``final``), which has no next turn.

    ``send_final``: send ``X-Dynamo-Session-Final: true`` on a call marked ``final``.
    """
    if strict_priority is not None and (
        isinstance(strict_priority, bool)
        or not isinstance(strict_priority, int)
        or not 0 <= strict_priority <= _UINT32_MAX
    ):
        raise ValueError(
            f"strict_priority must be an int in [0, {_UINT32_MAX}] or None, got {strict_priority!r}"
        )
    margin, cap = check_window(retention_margin_s, retention_max_s)
    for what, flag in (
        ("speculative_prefill", speculative_prefill),
        ("send_final", send_final),
        ("cache_control", cache_control),
    ):
        if not isinstance(flag, bool):
            raise TypeError(f"{what} must be a bool, got {type(flag).__name__}")
    affinity = check_header_name(session_header, "Dynamo session header")
    if affinity.startswith("x-dynamo-") and affinity != DYNAMO_SESSION_HEADER:
        raise ValueError(
            f"{session_header!r} is one of Dynamo's own headers, not a session header; "
            f"give the name --router-session-header-key was started with"
        )

    def encode(meta: CallMetadata, options: DialectOptions) -> Encoding:
        enc = base_encoding(meta)
        enc.headers[DYNAMO_SESSION_HEADER] = meta.session_id
        if affinity != DYNAMO_SESSION_HEADER:
            enc.headers[affinity] = meta.session_id
        if meta.parent_session_id is not None:
            enc.headers["x-dynamo-parent-session-id"] = meta.parent_session_id
        if send_final and meta.final:
            enc.headers["x-dynamo-session-final"] = "true"
        hints: dict[str, Any] = {}
        if options.send_priority and meta.priority is not None:
            hints["priority"] = dynamo_priority(meta.priority)
        if strict_priority is not None:
            hints["strict_priority"] = strict_priority
        if meta.expected_output_tokens is not None and meta.expected_output_tokens >= 0:
            hints["osl"] = min(meta.expected_output_tokens, _UINT32_MAX)
        if speculative_prefill and not meta.final:
            hints["speculative_prefill"] = True
        nvext: dict[str, Any] = {"agent_hints": hints} if hints else {}
        if cache_control:
            window = retention_window(meta, margin, cap)
            if window is not None:
                nvext["cache_control"] = {"type": "ephemeral", "ttl": f"{math.ceil(window)}s"}
        if nvext:
            enc.body["nvext"] = nvext
        return enc

    extras = []
    if strict_priority is not None:
        extras.append(f"strict_priority {strict_priority}")
    if speculative_prefill:
        extras.append("speculative_prefill on non-final calls")
    if cache_control:
        extras.append("nvext.cache_control ephemeral, ttl = expected idle + margin")
    final = ", X-Dynamo-Session-Final on a final call" if send_final else ""
    custom = "" if affinity == DYNAMO_SESSION_HEADER else f", session id in {affinity} too"
    options = ([affinity] if custom else []) + (["cache-control"] if cache_control else [])
    return Dialect(
        name="dynamo" + (":" + ",".join(options) if options else ""),
        encode=encode,
        doc=f"NVIDIA Dynamo: X-Dynamo-Session-ID{custom}, X-Dynamo-Parent-Session-ID{final}, "
        "nvext.agent_hints.osl and (with send_priority) priority = -agentrt priority"
        + ("; " + ", ".join(extras) if extras else "")
        + ".",
    )


DYNAMO: Final = dynamo_dialect()
"""The ``dynamo`` dialect with its defaults (:func:`dynamo_dialect`)."""
