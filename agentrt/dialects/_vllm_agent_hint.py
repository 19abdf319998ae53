"""The ``vllm-agent-hint`` dialect (experimental): the ``agent_hint`` object of a proposal.

It follows RFC vllm-project/vllm#52113, "Session-Aware KV Cache Hints", a proposal and
not a released vLLM API: no vLLM release reads ``agent_hint`` (vLLM 0.32 accepts the
field and ignores it). Its field names are not settled, so they are an option
(``vllm_agent_hint_dialect(fields=...)``); by default it adds one body object::

    "agent_hint": {"session_id": ..., "parent_session_id": ..., "cache_ttl_s": ...}

- ``session_id``: the session, always;
- ``parent_session_id``: the parent session, only when the call has one;
- ``cache_ttl_s``: how long the session's KV cache is worth keeping after the reply,
  only when the session declared its next idle period (``CallMetadata.idle_expected_s``):
  the expected idle plus a margin (Continuum-style: TTL = expected tool wait + margin),
  bounded to ``[0, max_ttl_s]`` and rounded to milliseconds (or sent as whole
  milliseconds with ``ttl_unit="ms"``, as Mooncake's ``cache_ttl_ms`` proposal reads).

With ``shape="rfc"`` (name ``vllm-agent-hint:rfc``) the object takes the shape the RFC's
``AgentHintParams`` sketch gives it instead::

    "agent_hint": {"session_id": ..., "parent_session_id": ...,
                   "cache_control": {"type": "ephemeral", "ttl": ...},
                   "context_management": {"manage_request": true,
                                          "edits": [{"type": "evict"}]}}

``cache_control`` (the soft retention: TTL in seconds, the RFC bounds it to 3600) when
the expected idle is known and the call is not the session's last; on the last call
(``final``) ``context_management`` with one ``evict`` edit and no block range (the whole
request context: the release), unless ``release_on_final=False``.

It sends nothing else of vLLM's own; combine it with ``vllm`` for ``session_id`` and the
headers (``dialect=("vllm", "vllm-agent-hint")``). See docs/protocol.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final, Literal

from .._protocol import CallMetadata, validate_nonneg
from ._base import Dialect, DialectOptions, Encoding
from ._generic import base_encoding

__all__ = [
    "DEFAULT_AGENT_HINT_FIELDS",
    "DEFAULT_AGENT_HINT_MAX_TTL_S",
    "DEFAULT_AGENT_HINT_TTL_MARGIN_S",
    "VLLM_AGENT_HINT",
    "vllm_agent_hint_dialect",
]

DEFAULT_AGENT_HINT_TTL_MARGIN_S: Final = 2.0
"""Seconds added to the expected idle: a tool wait that runs a little long still finds
its cache."""

RFC_MAX_TTL_S: Final = 3600.0
"""The RFC's bound on ``cache_control.ttl`` (``Field(ge=0, le=3600)``)."""

DEFAULT_AGENT_HINT_MAX_TTL_S: Final = 3600.0
"""Upper bound on ``cache_ttl_s``: a wrong declaration cannot pin KV cache for hours."""

DEFAULT_AGENT_HINT_FIELDS: Final[Mapping[str, str | None]] = MappingProxyType(
    {
        "object": "agent_hint",
        "session_id": "session_id",
        "parent_session_id": "parent_session_id",
        "cache_ttl": "cache_ttl_s",
    }
)
"""The body names the dialect sends, by what they carry: ``object`` is the top-level body
key of the hint, the others its members. Override any of them with
``vllm_agent_hint_dialect(fields={...})``; ``None`` leaves a member out (``object`` and
``session_id`` cannot be left out)."""

# A JSON member name a server can read as a Python identifier or a dotted-free key.
_FIELD_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]{0,63}")


def _seconds(value: float, what: str) -> float:
    checked = validate_nonneg(value, what)
    if checked is None:
        raise TypeError(f"{what} must be a number of seconds, got None")
    return checked


def _field_names(fields: Mapping[str, str | None] | None) -> dict[str, str | None]:
    names = dict(DEFAULT_AGENT_HINT_FIELDS)
    if fields is None:
        return names
    if not isinstance(fields, Mapping):
        raise TypeError(f"fields must be a mapping, got {type(fields).__name__}")
    for key, value in fields.items():
        if key not in names:
            known = ", ".join(repr(k) for k in DEFAULT_AGENT_HINT_FIELDS)
            raise ValueError(f"unknown agent hint field {key!r}; the fields are {known}")
        if value is None and key in ("object", "session_id"):
            raise ValueError(f"agent hint field {key!r} cannot be left out")
        if value is not None and (not isinstance(value, str) or not _FIELD_RE.fullmatch(value)):
            raise ValueError(
                f"agent hint field name {value!r} (for {key!r}) must be 1 to 64 letters, "
                "digits, '_' or '-', starting with a letter or '_'"
            )
        names[key] = value
    members = [v for k, v in names.items() if k != "object" and v is not None]
    if len(set(members)) != len(members):
        raise ValueError(f"agent hint member names must differ, got {members}")
    return names


def vllm_agent_hint_dialect(
    *,
    ttl_margin_s: float = DEFAULT_AGENT_HINT_TTL_MARGIN_S,
    max_ttl_s: float = DEFAULT_AGENT_HINT_MAX_TTL_S,
    fields: Mapping[str, str | None] | None = None,
    ttl_unit: Literal["s", "ms"] = "s",
    shape: Literal["flat", "rfc"] = "flat",
    release_on_final: bool = True,
) -> Dialect:
    """Build the ``vllm-agent-hint`` dialect (experimental, see the module docstring).

    ``shape="rfc"``: the RFC's ``cache_control`` / ``context_management`` objects instead
    of the flat members (then ``fields`` and ``ttl_unit`` do not apply, and the TTL is at
    most 3600 s); ``release_on_final`` sends the ``evict`` edit on a session's last call.

    ``cache_ttl = min(idle_expected_s + ttl_margin_s, max_ttl_s)``, sent only when
    ``idle_expected_s`` is known: in seconds rounded to milliseconds, or with
    ``ttl_unit="ms"`` in whole milliseconds. ``fields`` renames the hint's object and
    members (keys of :data:`DEFAULT_AGENT_HINT_FIELDS`; ``None`` leaves a member out),
    e.g. ``fields={"cache_ttl": "cache_ttl_ms"}, ttl_unit="ms"``.
    """
    margin = _seconds(ttl_margin_s, "ttl_margin_s")
    cap = _seconds(max_ttl_s, "max_ttl_s")
    if ttl_unit not in ("s", "ms"):
        raise ValueError(f"ttl_unit must be 's' or 'ms', got {ttl_unit!r}")
    if shape not in ("flat", "rfc"):
        raise ValueError(f"shape must be 'flat' or 'rfc', got {shape!r}")
    if not isinstance(release_on_final, bool):
        raise TypeError(f"release_on_final must be a bool, got {type(release_on_final).__name__}")
    if shape == "rfc":
        if fields is not None or ttl_unit != "s":
            raise ValueError("fields and ttl_unit apply to shape='flat' only")
        return _rfc_dialect(margin, min(cap, RFC_MAX_TTL_S), release_on_final)
    names = _field_names(fields)
    obj = names["object"]
    session_key = names["session_id"]
    parent_key = names["parent_session_id"]
    ttl_key = names["cache_ttl"]
    assert obj is not None and session_key is not None

    def encode(meta: CallMetadata, options: DialectOptions) -> Encoding:
        enc = base_encoding(meta)
        hint: dict[str, Any] = {session_key: meta.session_id}
        if parent_key is not None and meta.parent_session_id is not None:
            hint[parent_key] = meta.parent_session_id
        idle = meta.idle_expected_s
        if ttl_key is not None and idle is not None and math.isfinite(idle) and idle >= 0:
            ttl = min(idle + margin, cap)
            hint[ttl_key] = round(ttl * 1000) if ttl_unit == "ms" else round(ttl, 3)
        enc.body[obj] = hint
        return enc

    members = [session_key] + [m for m in (parent_key, ttl_key) if m is not None]
    return Dialect(
        name="vllm-agent-hint",
        encode=encode,
        doc="vLLM RFC #52113 (experimental proposal, not a released API): body "
        f"{obj} {{{', '.join(members)}}}: session, parent if any, cache TTL = expected idle "
        f"+ {margin:g} s, at most {cap:g} s, in {ttl_unit}, if known.",
    )


def _rfc_dialect(margin: float, cap: float, release_on_final: bool) -> Dialect:
    """The ``agent_hint`` of RFC vllm-project/vllm#52113's ``AgentHintParams``."""

    def encode(meta: CallMetadata, options: DialectOptions) -> Encoding:
        enc = base_encoding(meta)
        hint: dict[str, Any] = {"session_id": meta.session_id}
        if meta.parent_session_id is not None:
            hint["parent_session_id"] = meta.parent_session_id
        idle = meta.idle_expected_s
        if meta.final:
            if release_on_final:
                hint["context_management"] = {
                    "manage_request": True,
                    "edits": [{"type": "evict"}],
                }
        elif idle is not None and math.isfinite(idle) and idle >= 0:
            ttl = round(min(idle + margin, cap), 3)
            hint["cache_control"] = {"type": "ephemeral", "ttl": ttl}
        enc.body["agent_hint"] = hint
        return enc

    release = "; on a final call context_management evict" if release_on_final else ""
    return Dialect(
        name="vllm-agent-hint:rfc" + ("" if release_on_final else ",no-release"),
        encode=encode,
        doc="vLLM RFC #52113 AgentHintParams (experimental proposal, not a released API): "
        "body agent_hint {session_id, parent_session_id, cache_control {ephemeral, ttl = "
        f"expected idle + {margin:g} s, at most {cap:g} s}}{release}.",
    )


VLLM_AGENT_HINT: Final = vllm_agent_hint_dialect()
"""The ``vllm-agent-hint`` dialect with its defaults (:func:`vllm_agent_hint_dialect`)."""
