"""The ``llm-d`` dialect: session affinity through llm-d's inference scheduler.

llm-d's ``session-affinity-scorer`` sets an ``x-session-token`` response header (the
base64 name of the pod that served the call); a later request carrying the same header
gets that pod scored first. So the dialect asks the runtime to remember the header per
session (``echo_headers``) and sends it back on the session's later calls, from
``CallMetadata.echo``. The first call of a session carries no token.

Every call also carries ``x-llm-d-inference-fairness-id: <program id>``: the fairness id
that llm-d's flow control keys its queues on (``program-aware-fairness`` serves the
program with the least attained service first when the pool is saturated). Without it
llm-d puts every agentrt call in one shared ``default-flow`` queue; an EPP without flow
control ignores the header.
"""

from __future__ import annotations

from typing import Final

from .._protocol import CallMetadata
from ._base import Dialect, DialectOptions, Encoding
from ._generic import base_encoding, check_header_value, echo_into

__all__ = ["FAIRNESS_ID_HEADER", "LLMD", "SESSION_TOKEN_HEADER"]

SESSION_TOKEN_HEADER: Final = "x-session-token"
FAIRNESS_ID_HEADER: Final = "x-llm-d-inference-fairness-id"
_ECHO: Final = (SESSION_TOKEN_HEADER,)


def _encode(meta: CallMetadata, options: DialectOptions) -> Encoding:
    enc = base_encoding(meta)
    enc.headers[FAIRNESS_ID_HEADER] = check_header_value(meta.program_id, "program id")
    echo_into(enc.headers, meta, _ECHO)
    return enc


LLMD: Final = Dialect(
    name="llm-d",
    encode=_encode,
    echo_headers=_ECHO,
    doc="llm-d: echo the x-session-token response header on the session's later calls; "
    "x-llm-d-inference-fairness-id = the program id.",
)
"""The ``llm-d`` dialect: the ``x-session-token`` a reply carries is sent back on the
session's later calls; every call names its program as its fairness id."""
