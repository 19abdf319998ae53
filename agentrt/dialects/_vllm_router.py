"""The ``vllm-router`` dialect: session affinity through a vLLM router.

Both routers hash a session key to pick a replica, so every turn of a session lands on
the replica that holds its KV prefix:

- vllm-project/router, policy ``consistent_hash``: reads ``x-session-id`` first (then
  ``x-user-id``, ``x-tenant-id``, ``x-correlation-id``, ``x-request-id``, ...);
- vllm-project/production-stack's router, ``--routing-logic session --session-key NAME``:
  reads the header ``NAME`` (then the body field ``NAME``). The key is configurable, so
  the header name is too: ``vllm_router_dialect("x-user-id")`` or, by name,
  ``get_dialect("vllm-router:x-user-id")``.
"""

from __future__ import annotations

from typing import Final

from .._protocol import CallMetadata
from ._base import Dialect, DialectOptions, Encoding
from ._generic import base_encoding, check_header_name

__all__ = ["DEFAULT_SESSION_HEADER", "VLLM_ROUTER", "vllm_router_dialect"]

DEFAULT_SESSION_HEADER: Final = "x-session-id"


def vllm_router_dialect(session_header: str = DEFAULT_SESSION_HEADER) -> Dialect:
    """Build the router dialect sending the session id in ``session_header``.

    Use the name the production-stack router was started with (``--session-key``).
    """
    header = check_header_name(session_header, "router session header")

    def encode(meta: CallMetadata, options: DialectOptions) -> Encoding:
        enc = base_encoding(meta)
        enc.headers[header] = meta.session_id
        return enc

    name = "vllm-router" if header == DEFAULT_SESSION_HEADER else f"vllm-router:{header}"
    return Dialect(
        name=name,
        encode=encode,
        doc=f"vLLM routers (vllm-project/router, production-stack): session id in {header}.",
    )


VLLM_ROUTER: Final = vllm_router_dialect()
"""The ``vllm-router`` dialect with its defaults (:func:`vllm_router_dialect`)."""
