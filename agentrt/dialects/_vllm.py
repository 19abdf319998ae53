"""The ``vllm`` dialect: a vLLM OpenAI-compatible server reached directly.

- body ``session_id`` and header ``X-Session-ID``: vLLM's request-level session identity
  (identity only: vLLM itself neither routes nor schedules on it);
- header ``X-Request-Id`` = the call id: vLLM uses it as the request id it reports back;
- body ``priority`` (lower runs first, agentrt's own order) only with
  ``DialectOptions(send_priority=True)``: a non-zero priority is an error on a server not
  started with ``--scheduling-policy priority``.

See docs/protocol.md for the citations.
"""

from __future__ import annotations

from typing import Final

from .._protocol import CallMetadata
from ._base import Dialect, DialectOptions, Encoding
from ._generic import base_encoding, clamp

__all__ = ["VLLM", "vllm_dialect"]

_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


def vllm_dialect(*, send_request_id: bool = True) -> Dialect:
    """Build the vLLM dialect.

    ``send_request_id=False`` leaves ``X-Request-Id`` out, for servers where a retried
    call reusing its id could collide with the first attempt still running.
    """

    def encode(meta: CallMetadata, options: DialectOptions) -> Encoding:
        enc = base_encoding(meta)
        enc.headers["x-session-id"] = meta.session_id
        if send_request_id:
            enc.headers["x-request-id"] = meta.call_id
        enc.body["session_id"] = meta.session_id
        if options.send_priority and meta.priority is not None:
            enc.body["priority"] = clamp(meta.priority, _INT64_MIN, _INT64_MAX)
        return enc

    return Dialect(
        name="vllm",
        encode=encode,
        doc="vLLM: body session_id, X-Session-ID, X-Request-Id = call id; "
        "body priority (lower first) only with send_priority.",
    )


VLLM: Final = vllm_dialect()
"""The ``vllm`` dialect with its defaults (:func:`vllm_dialect`)."""
