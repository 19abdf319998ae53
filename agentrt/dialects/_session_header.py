"""Session affinity by a header: ``session_header(name)``, and the ``litellm`` dialect.

Many gateways pin a session to one backend by a request header whose name they let the
operator choose: Envoy Gateway's header session persistence
(``BackendTrafficPolicy.sessionPersistence.header.name``), Bifrost, Vercel's AI gateway
and others. :func:`session_header` sends the session id in the header of that name and,
optionally, the job id in a second one, so a gateway can group or log a job's sessions.

LiteLLM's proxy (v1.91+) reads ``x-litellm-session-id`` into ``metadata.session_id``, which
its router's ``session_affinity`` pre-call check keys on: the ``litellm`` dialect is
``session_header("x-litellm-session-id")``. See docs/protocol.md.
"""

from __future__ import annotations

from typing import Final

from .._protocol import CallMetadata
from ._base import Dialect, DialectOptions, Encoding
from ._generic import base_encoding, check_header_name

__all__ = ["LITELLM", "LITELLM_SESSION_HEADER", "session_header"]

LITELLM_SESSION_HEADER: Final = "x-litellm-session-id"
"""The header LiteLLM's router keys session affinity on."""


def session_header(
    header: str, job_header: str | None = None, *, name: str | None = None
) -> Dialect:
    """A dialect sending the session id in ``header`` (and the job id in ``job_header``).

    Header names are checked (RFC 9110 tokens, not ``authorization``, ``host``, hop-by-hop
    or agentrt's own ``x-agentrt*``) and sent in lower case. The dialect's name is
    ``session-header:<header>[,<job_header>]`` unless ``name`` is given; the same string
    works with :func:`~agentrt.dialects.get_dialect` and ``Runtime(dialect=...)``.
    """
    session = check_header_name(header, "session header")
    job = None if job_header is None else check_header_name(job_header, "job header")
    if job == session:
        raise ValueError(f"the session and job headers must differ, both are {session!r}")

    def encode(meta: CallMetadata, options: DialectOptions) -> Encoding:
        enc = base_encoding(meta)
        enc.headers[session] = meta.session_id
        if job is not None:
            enc.headers[job] = meta.job_id
        return enc

    if name is None:
        name = f"session-header:{session}" + (f",{job}" if job is not None else "")
    elif not isinstance(name, str) or not name.strip():
        raise ValueError(f"name must be a non-empty str, got {name!r}")
    job_doc = f", job id in {job}" if job is not None else ""
    return Dialect(
        name=name,
        encode=encode,
        doc=f"Session affinity by header: session id in {session}{job_doc}.",
    )


def session_header_from_option(arg: str) -> Dialect:
    """The dialect of ``session-header:<header>[,<job header>]``."""
    parts = [p.strip() for p in arg.split(",")]
    if len(parts) > 2:
        raise ValueError(
            f"'session-header:{arg}' names {len(parts)} headers; give a session header and "
            "at most one job header, comma-separated"
        )
    return session_header(parts[0], parts[1] if len(parts) == 2 else None)


LITELLM: Final = Dialect(
    name="litellm",
    encode=session_header(LITELLM_SESSION_HEADER).encode,
    doc="LiteLLM proxy (v1.91+): x-litellm-session-id = session id (metadata.session_id; "
    "router session_affinity keys on it).",
)
"""The ``litellm`` dialect: the session id in :data:`LITELLM_SESSION_HEADER`."""
