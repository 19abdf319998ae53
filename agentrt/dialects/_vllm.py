"""The ``vllm`` dialect: a vLLM OpenAI-compatible server reached directly.

- body ``session_id`` and header ``X-Session-ID``: vLLM's request-level session identity
  (identity only: vLLM itself neither routes nor schedules on it);
- header ``X-Request-Id`` = the call id: vLLM uses it as the request id it reports back;
- body ``priority`` (lower runs first, agentrt's own order) only with
  ``DialectOptions(send_priority=True)``: a non-zero priority is an error on a server not
  started with ``--scheduling-policy priority``;
- with ``vllm_dialect(retention=True)`` (name ``vllm:retention``): body
  ``retention_directives`` and ``retention_scope``, the Context-Aware KV-Cache Retention
  API of the open PR vllm-project/vllm#38514 (RFC #37003), not in a released vLLM (which
  accepts the fields and ignores them): see :mod:`agentrt.dialects._retention`.

See docs/protocol.md for the citations.
"""

from __future__ import annotations

from typing import Final

from .._protocol import CallMetadata
from ._base import Dialect, DialectOptions, Encoding
from ._generic import base_encoding, clamp
from ._retention import (
    DEFAULT_RETENTION_MARGIN_S,
    DEFAULT_RETENTION_MAX_S,
    check_window,
    retention_directives,
)

__all__ = ["VLLM", "vllm_dialect"]

_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


def vllm_dialect(
    *,
    send_request_id: bool = True,
    retention: bool = False,
    retention_margin_s: float = DEFAULT_RETENTION_MARGIN_S,
    retention_max_s: float = DEFAULT_RETENTION_MAX_S,
) -> Dialect:
    """Build the vLLM dialect.

    ``send_request_id=False`` leaves ``X-Request-Id`` out, for servers where a retried
    call reusing its id could collide with the first attempt still running.

    ``retention=True``: send the retention directives of PR vllm-project/vllm#38514
    (unmerged): the session's expected idle plus ``retention_margin_s``, at most
    ``retention_max_s``, as a whole-prompt directive's ``duration``; priority 0 on the
    session's last call (docs/protocol.md).
    """
    if not isinstance(retention, bool):
        raise TypeError(f"retention must be a bool, got {type(retention).__name__}")
    margin, cap = check_window(retention_margin_s, retention_max_s)

    def encode(meta: CallMetadata, options: DialectOptions) -> Encoding:
        enc = base_encoding(meta)
        enc.headers["x-session-id"] = meta.session_id
        if send_request_id:
            enc.headers["x-request-id"] = meta.call_id
        enc.body["session_id"] = meta.session_id
        if options.send_priority and meta.priority is not None:
            enc.body["priority"] = clamp(meta.priority, _INT64_MIN, _INT64_MAX)
        if retention:
            fields = retention_directives(meta, margin, cap)
            if fields is not None:
                enc.body.update(fields)
        return enc

    extra = (
        "; body retention_directives / retention_scope (PR #38514, unmerged)" if retention else ""
    )
    return Dialect(
        name="vllm:retention" if retention else "vllm",
        encode=encode,
        doc="vLLM: body session_id, X-Session-ID, X-Request-Id = call id; "
        "body priority (lower first) only with send_priority" + extra + ".",
    )


VLLM: Final = vllm_dialect()
"""The ``vllm`` dialect with its defaults (:func:`vllm_dialect`)."""
