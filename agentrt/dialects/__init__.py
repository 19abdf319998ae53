"""Dialects: the same call metadata in the form each engine or router reads.

A dialect is a small pure function from :class:`~agentrt._protocol.CallMetadata` to
headers and JSON body fields (see :mod:`agentrt.dialects._base`). Every dialect sends
agentrt's own ``x-agentrt`` header and adds its own fields. The spec, with the
citation behind every field, is docs/protocol.md.

>>> from agentrt.dialects import get_dialect, combine
>>> d = combine(get_dialect("vllm"), get_dialect("vllm-router"))
>>> d.name
'vllm+vllm-router'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final

from .._protocol import CallMetadata
from ._base import Dialect, DialectOptions, DialectSpec, Encoding, SessionEnd
from ._dynamo import DYNAMO, DYNAMO_SESSION_HEADER, dynamo_dialect, dynamo_priority
from ._generic import GENERIC
from ._llmd import LLMD, llmd_dialect, llmd_from_option
from ._openai import OPENAI, openai_dialect
from ._session_ends import (
    CLOSE_SESSION,
    FINISH_SESSION,
    sglang_session_ends,
    vllm_router_session_ends,
)
from ._session_header import (
    LITELLM,
    LITELLM_SESSION_HEADER,
    session_header,
    session_header_from_option,
)
from ._sglang import SGLANG, sglang_dialect, sglang_from_options, sglang_priority
from ._vllm import VLLM, vllm_dialect
from ._vllm_agent_hint import (
    DEFAULT_AGENT_HINT_FIELDS,
    DEFAULT_AGENT_HINT_MAX_TTL_S,
    DEFAULT_AGENT_HINT_TTL_MARGIN_S,
    VLLM_AGENT_HINT,
    vllm_agent_hint_dialect,
)
from ._vllm_router import VLLM_ROUTER, vllm_router_dialect
from ._vllm_router_agentic import (
    DEFAULT_ROUTER_MAX_TTL_S,
    DEFAULT_ROUTER_TTL_MARGIN_S,
    VLLM_ROUTER_AGENTIC,
    vllm_router_agentic_dialect,
)

__all__ = [
    "CLOSE_SESSION",
    "DEFAULT_AGENT_HINT_FIELDS",
    "DEFAULT_AGENT_HINT_MAX_TTL_S",
    "DEFAULT_AGENT_HINT_TTL_MARGIN_S",
    "DEFAULT_ROUTER_MAX_TTL_S",
    "DEFAULT_ROUTER_TTL_MARGIN_S",
    "DIALECTS",
    "DYNAMO",
    "DYNAMO_SESSION_HEADER",
    "FINISH_SESSION",
    "GENERIC",
    "LITELLM",
    "LITELLM_SESSION_HEADER",
    "LLMD",
    "OPENAI",
    "SGLANG",
    "VLLM",
    "VLLM_AGENT_HINT",
    "VLLM_ROUTER",
    "VLLM_ROUTER_AGENTIC",
    "Dialect",
    "DialectOptions",
    "DialectSpec",
    "Encoding",
    "SessionEnd",
    "combine",
    "dynamo_dialect",
    "dynamo_priority",
    "get_dialect",
    "llmd_dialect",
    "openai_dialect",
    "register_dialect",
    "resolve_dialect",
    "session_header",
    "sglang_dialect",
    "sglang_priority",
    "sglang_session_ends",
    "vllm_agent_hint_dialect",
    "vllm_dialect",
    "vllm_router_agentic_dialect",
    "vllm_router_dialect",
    "vllm_router_session_ends",
]


_REGISTRY: dict[str, Dialect] = {
    d.name: d
    for d in (
        GENERIC,
        VLLM,
        VLLM_ROUTER,
        VLLM_ROUTER_AGENTIC,
        VLLM_AGENT_HINT,
        SGLANG,
        DYNAMO,
        LLMD,
        OPENAI,
        LITELLM,
    )
}

DIALECTS: Final[Mapping[str, Dialect]] = MappingProxyType(_REGISTRY)
"""The known dialects by name (read-only view; add one with :func:`register_dialect`)."""


_SESSION_HEADER: Final = "session-header"
"""The name of :func:`session_header` dialects: ``session-header:<header>[,<job header>]``."""


def _parameterized(base: str, arg: str) -> Dialect:
    if base == "vllm-router":
        return vllm_router_dialect(arg)
    if base == "sglang":
        return sglang_from_options(arg)
    if base == _SESSION_HEADER:
        return session_header_from_option(arg)
    if base == "dynamo":
        return _dynamo_from_option(arg)
    if base == "vllm" and arg.strip().lower() == "retention":
        return vllm_dialect(retention=True)
    if base == "openai" and arg.strip().lower() == "cache-options":
        return openai_dialect(cache_options=True)
    if base == "llm-d":
        return llmd_from_option(arg)
    if base == "vllm-agent-hint" and arg.strip().lower() in ("rfc", "rfc,no-release"):
        release = arg.strip().lower() == "rfc"
        return vllm_agent_hint_dialect(shape="rfc", release_on_final=release)
    raise ValueError(
        f"dialect {base!r} takes no option (got {arg!r}); options exist for "
        "'vllm-router:<session header>', 'sglang:low-priority-first,session-id,"
        "close-session', 'dynamo:[<session header>][,cache-control]', "
        "'llm-d:session-id[=<header>][,retention]', 'vllm:retention', "
        "'openai:cache-options', 'vllm-agent-hint:rfc' and "
        "'session-header:<header>[,<job header>]'"
    )


def _dynamo_from_option(arg: str) -> Dialect:
    """``dynamo:<header>``, ``dynamo:cache-control`` or ``dynamo:<header>,cache-control``."""
    parts = [p.strip() for p in arg.split(",")]
    cache = "cache-control" in (p.lower() for p in parts)
    rest = [p for p in parts if p.lower() != "cache-control"]
    if len(rest) > 1 or (rest and not rest[0]) or len(parts) - len(rest) > 1:
        raise ValueError(
            f"unknown option {arg!r} for dialect 'dynamo'; give '<session header>', "
            "'cache-control' or '<session header>,cache-control'"
        )
    if rest:
        return dynamo_dialect(session_header=rest[0], cache_control=cache)
    return dynamo_dialect(cache_control=cache)


def get_dialect(name: str) -> Dialect:
    """The dialect called ``name``.

    Some take an option after a colon: ``"vllm-router:<header>"`` (the session header a
    production-stack router reads, its ``--session-key``); ``"sglang:<options>"`` with
    ``low-priority-first`` (a server started with ``--schedule-low-priority-values-first``),
    ``session-id`` (send the body ``session_id``) and ``close-session`` (close each session
    at its end), comma-separated; ``"dynamo:<header>"`` (a frontend's
    ``--router-session-header-key``); ``"llm-d:session-id[=<header>]"`` (the EPP's
    ``session_id_header`` affinity) or ``"llm-d:echo=<header>"``, each with
    ``,retention`` (or ``"llm-d:retention"``: ``retention_directives``);
    ``"vllm-agent-hint:rfc"`` (the RFC's ``agent_hint`` shape); and
    ``"session-header:<header>[,<job header>]"`` (:func:`session_header`).
    """
    if not isinstance(name, str):
        raise TypeError(f"a dialect name must be a str, got {type(name).__name__}")
    key = name.strip().lower()
    found = _REGISTRY.get(key)
    if found is not None:
        return found
    base, sep, arg = key.partition(":")
    if sep and (base in _REGISTRY or base == _SESSION_HEADER) and arg:
        return _parameterized(base, name.strip().partition(":")[2])
    known = ", ".join(sorted(_REGISTRY))
    raise ValueError(f"unknown dialect {name!r}; known dialects: {known}")


def register_dialect(dialect: Dialect, *, replace: bool = False) -> None:
    """Make ``dialect`` available by its name (for string configuration)."""
    if not isinstance(dialect, Dialect):
        raise TypeError(f"expected a Dialect, got {type(dialect).__name__}")
    name = dialect.name.strip().lower()
    if not name or ":" in name or "+" in name:
        raise ValueError(f"dialect name {dialect.name!r} must be non-empty, without ':' or '+'")
    if name in _REGISTRY and not replace:
        raise ValueError(f"dialect {name!r} is already registered; pass replace=True")
    _REGISTRY[name] = dialect


def _combine_body(
    into: dict[str, Any], add: Mapping[str, Any], owner: dict[str, str], who: str, path: str
) -> None:
    """Dialect ``who``'s body fields into the combined dialect's (``owner``: who set each
    field): combined dialects must agree, a field set to two values raises. (What a
    call's caller set always wins over any dialect's: ``_wire.merged``.)"""
    for key, value in add.items():
        where = f"{path}.{key}" if path else key
        if key not in into:
            into[key] = _copy_nested(value)
            owner[where] = who
        elif isinstance(into[key], dict) and isinstance(value, Mapping):
            owner.setdefault(where, who)
            _combine_body(into[key], value, owner, who, where)
        elif into[key] != value:
            raise ValueError(
                f"dialects {owner.get(where, '?')!r} and {who!r} both set body field "
                f"{where!r}, to different values; they cannot be combined"
            )


def _copy_nested(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy_nested(v) for k, v in value.items()}
    return value


def combine(*dialects: Dialect, name: str | None = None) -> Dialect:
    """One dialect sending what each of ``dialects`` sends.

    Headers are merged by lower-case name, body dicts key by key (nested dicts too).
    The same field set to the same value by two dialects is sent once; set to different
    values it is a configuration error, raised as ``ValueError`` when the call is
    encoded. ``echo_headers`` and ``session_ends`` are the unions, in order.
    """
    flat: list[Dialect] = []
    for d in dialects:
        if not isinstance(d, Dialect):
            raise TypeError(f"combine() takes Dialect objects, got {type(d).__name__}")
        flat.append(d)
    if not flat:
        raise ValueError("combine() needs at least one dialect")
    if len(flat) == 1 and name is None:
        return flat[0]
    parts = tuple(flat)

    def encode(meta: CallMetadata, options: DialectOptions) -> Encoding:
        headers: dict[str, str] = {}
        header_owner: dict[str, str] = {}
        body: dict[str, Any] = {}
        body_owner: dict[str, str] = {}
        for d in parts:
            enc = d.encode(meta, options)
            for raw_key, value in enc.headers.items():
                key = raw_key.lower()
                if key not in headers:
                    headers[key] = value
                    header_owner[key] = d.name
                elif headers[key] != value:
                    raise ValueError(
                        f"dialects {header_owner[key]!r} and {d.name!r} both set header "
                        f"{key!r}, to different values; they cannot be combined"
                    )
            _combine_body(body, enc.body, body_owner, d.name, "")
        return Encoding(headers=headers, body=body)

    echo: dict[str, None] = {}
    ends: dict[SessionEnd, None] = {}
    for d in parts:
        for h in d.echo_headers:
            echo.setdefault(h.lower(), None)
        for end in d.session_ends:
            ends.setdefault(end, None)
    return Dialect(
        name=name if name is not None else "+".join(d.name for d in parts),
        encode=encode,
        echo_headers=tuple(echo),
        doc=" | ".join(d.doc for d in parts if d.doc),
        session_ends=tuple(ends),
    )


def resolve_dialect(spec: DialectSpec) -> Dialect:
    """A :class:`Dialect` from a name, a dialect, or a sequence of either (combined)."""
    if isinstance(spec, Dialect):
        return spec
    if isinstance(spec, str):
        return get_dialect(spec)
    if isinstance(spec, Iterable):
        items = [resolve_dialect(s) if isinstance(s, str | Dialect) else _bad(s) for s in spec]
        if not items:
            raise ValueError("an empty list of dialects; give at least one name")
        return combine(*items)
    return _bad(spec)


def _bad(spec: object) -> Dialect:
    raise TypeError(
        f"a dialect is a name, a Dialect or a sequence of them, got {type(spec).__name__}"
    )
