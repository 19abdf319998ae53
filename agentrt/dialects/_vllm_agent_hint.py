"""The ``vllm-agent-hint`` dialect (experimental): the ``agent_hint`` object of a proposal.

It follows RFC vllm-project/vllm#52113, "Session-Aware KV Cache Hints", a proposal and
not a released vLLM API: no vLLM release reads ``agent_hint`` (vLLM 0.32 accepts the
field and ignores it). It adds one body object::

    "agent_hint": {"session_id": ..., "parent_session_id": ..., "cache_ttl_s": ...}

- ``session_id``: the session, always;
- ``parent_session_id``: the parent session, only when the call has one;
- ``cache_ttl_s``: how long the session's KV cache is worth keeping after the reply,
  only when the session declared its next idle period (``CallMetadata.idle_expected_s``):
  the expected idle plus a margin (Continuum-style: TTL = expected tool wait + margin),
  bounded to ``[0, max_ttl_s]`` and rounded to milliseconds.

It sends nothing else of vLLM's own; combine it with ``vllm`` for ``session_id`` and the
headers (``dialect=("vllm", "vllm-agent-hint")``). See docs/protocol.md.
"""

from __future__ import annotations

import math
from typing import Any, Final

from .._protocol import CallMetadata, validate_nonneg
from ._base import Dialect, DialectOptions, Encoding
from ._generic import base_encoding

__all__ = [
    "DEFAULT_AGENT_HINT_MAX_TTL_S",
    "DEFAULT_AGENT_HINT_TTL_MARGIN_S",
    "VLLM_AGENT_HINT",
    "vllm_agent_hint_dialect",
]

DEFAULT_AGENT_HINT_TTL_MARGIN_S: Final = 2.0
"""Seconds added to the expected idle: a tool wait that runs a little long still finds
its cache."""

DEFAULT_AGENT_HINT_MAX_TTL_S: Final = 3600.0
"""Upper bound on ``cache_ttl_s``: a wrong declaration cannot pin KV cache for hours."""


def _seconds(value: float, what: str) -> float:
    checked = validate_nonneg(value, what)
    if checked is None:
        raise TypeError(f"{what} must be a number of seconds, got None")
    return checked


def vllm_agent_hint_dialect(
    *,
    ttl_margin_s: float = DEFAULT_AGENT_HINT_TTL_MARGIN_S,
    max_ttl_s: float = DEFAULT_AGENT_HINT_MAX_TTL_S,
) -> Dialect:
    """Build the ``vllm-agent-hint`` dialect (experimental, see the module docstring).

    ``cache_ttl_s = min(idle_expected_s + ttl_margin_s, max_ttl_s)``, sent only when
    ``idle_expected_s`` is known.
    """
    margin = _seconds(ttl_margin_s, "ttl_margin_s")
    cap = _seconds(max_ttl_s, "max_ttl_s")

    def encode(meta: CallMetadata, options: DialectOptions) -> Encoding:
        enc = base_encoding(meta)
        hint: dict[str, Any] = {"session_id": meta.session_id}
        if meta.parent_session_id is not None:
            hint["parent_session_id"] = meta.parent_session_id
        idle = meta.idle_expected_s
        if idle is not None and math.isfinite(idle) and idle >= 0:
            hint["cache_ttl_s"] = round(min(idle + margin, cap), 3)
        enc.body["agent_hint"] = hint
        return enc

    return Dialect(
        name="vllm-agent-hint",
        encode=encode,
        doc="vLLM RFC #52113 (experimental proposal, not a released API): body agent_hint "
        "{session_id, parent_session_id if any, cache_ttl_s = expected idle + "
        f"{margin:g} s, at most {cap:g} s, if known}}.",
    )


VLLM_AGENT_HINT: Final = vllm_agent_hint_dialect()
