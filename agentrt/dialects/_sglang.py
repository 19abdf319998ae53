"""The ``sglang`` dialect: an SGLang server, or the SGLang Model Gateway in front of it.

- header ``X-SMG-Routing-Key`` = the session id: the gateway's ``consistent_hashing`` and
  ``manual`` policies pin a key to one worker, and SGLang's OpenAI endpoints read the same
  header into the request's ``routing_key``;
- body ``priority`` only with ``DialectOptions(send_priority=True)``. SGLang's polarity is
  a server flag: with ``--enable-priority-scheduling`` higher values run first, unless
  ``--schedule-low-priority-values-first`` is set. agentrt's priority is lower-first, so by
  default it is sent negated; ``sglang_dialect(low_priority_values_first=True)`` (name
  ``sglang:low-priority-first``) sends it as is.

SGLang's body ``session_id`` / ``session_params`` are deliberately NOT sent: they name a
stateful session opened with ``/open_session``, and a request naming a session that was
never opened is aborted ("session id ... does not exist").
"""

from __future__ import annotations

from typing import Final

from .._protocol import CallMetadata
from ._base import Dialect, DialectOptions, Encoding
from ._generic import INT32_MAX, INT32_MIN, base_encoding, clamp

__all__ = ["SGLANG", "sglang_dialect", "sglang_priority"]


def sglang_priority(priority: int, *, low_priority_values_first: bool = False) -> int:
    """agentrt priority (lower runs first) to SGLang's, bounded to a 32-bit int."""
    value = priority if low_priority_values_first else -priority
    return clamp(value, INT32_MIN + 1, INT32_MAX)


def sglang_dialect(*, low_priority_values_first: bool = False) -> Dialect:
    """Build the SGLang dialect for a server with the given priority polarity."""

    def encode(meta: CallMetadata, options: DialectOptions) -> Encoding:
        enc = base_encoding(meta)
        enc.headers["x-smg-routing-key"] = meta.session_id
        if options.send_priority and meta.priority is not None:
            enc.body["priority"] = sglang_priority(
                meta.priority, low_priority_values_first=low_priority_values_first
            )
        return enc

    if low_priority_values_first:
        name, order = "sglang:low-priority-first", "as is (lower first)"
    else:
        name, order = "sglang", "negated (higher first)"
    return Dialect(
        name=name,
        encode=encode,
        doc=f"SGLang: X-SMG-Routing-Key = session id; body priority {order}, only with "
        "send_priority.",
    )


SGLANG: Final = sglang_dialect()
