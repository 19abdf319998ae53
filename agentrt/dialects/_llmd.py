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

llm-d's ``session-affinity-scorer`` has a second algorithm, ``session_id_header``
(llm-d/llm-d-router#2238; llm-d 0.9): the client sends its own opaque session id in a
request header (``headerName``, by default the same ``x-session-token``) and the EPP keeps
a server-side binding from it to the pod that served it, dropped after a TTL of disuse.
``llmd_dialect(session_affinity="session_id_header")`` (name ``llm-d:session-id``, or
``llm-d:session-id=<header>`` for another ``headerName``) sends the session id in that
header on every call, the first included, and echoes nothing.
"""

from __future__ import annotations

from typing import Final, Literal

from .._protocol import CallMetadata
from ._base import Dialect, DialectOptions, Encoding
from ._generic import base_encoding, check_header_name, check_header_value, echo_into

__all__ = ["FAIRNESS_ID_HEADER", "LLMD", "SESSION_TOKEN_HEADER", "llmd_dialect"]

LlmdAffinity = Literal["encoded_endpoint_header", "session_id_header"]

SESSION_TOKEN_HEADER: Final = "x-session-token"
FAIRNESS_ID_HEADER: Final = "x-llm-d-inference-fairness-id"


def llmd_dialect(
    *,
    session_affinity: LlmdAffinity = "encoded_endpoint_header",
    session_header: str = SESSION_TOKEN_HEADER,
) -> Dialect:
    """Build the llm-d dialect for the EPP's ``session-affinity-scorer`` algorithm.

    ``"encoded_endpoint_header"`` (the scorer's default): echo the ``session_header`` a
    reply carries on the session's later calls. ``"session_id_header"``: send the session
    id in ``session_header`` (the scorer's ``headerName``) on every call.
    """
    if session_affinity not in ("encoded_endpoint_header", "session_id_header"):
        raise ValueError(
            "session_affinity must be 'encoded_endpoint_header' or 'session_id_header', "
            f"got {session_affinity!r}"
        )
    header = check_header_name(session_header, "llm-d session header")
    if header == FAIRNESS_ID_HEADER:
        raise ValueError(f"{session_header!r} is llm-d's fairness header, not a session header")
    if session_affinity == "encoded_endpoint_header":
        echo = (header,)

        def encode(meta: CallMetadata, options: DialectOptions) -> Encoding:
            enc = base_encoding(meta)
            enc.headers[FAIRNESS_ID_HEADER] = check_header_value(meta.program_id, "program id")
            echo_into(enc.headers, meta, echo)
            return enc

        name = "llm-d" if header == SESSION_TOKEN_HEADER else f"llm-d:echo={header}"
        return Dialect(
            name=name,
            encode=encode,
            echo_headers=echo,
            doc=f"llm-d: echo the {header} response header on the session's later calls; "
            "x-llm-d-inference-fairness-id = the program id.",
        )

    def encode_id(meta: CallMetadata, options: DialectOptions) -> Encoding:
        enc = base_encoding(meta)
        enc.headers[FAIRNESS_ID_HEADER] = check_header_value(meta.program_id, "program id")
        enc.headers[header] = meta.session_id
        return enc

    suffix = "" if header == SESSION_TOKEN_HEADER else f"={header}"
    return Dialect(
        name=f"llm-d:session-id{suffix}",
        encode=encode_id,
        doc=f"llm-d session_id_header affinity: session id in {header} on every call; "
        "x-llm-d-inference-fairness-id = the program id.",
    )


def llmd_from_option(arg: str) -> Dialect:
    """The dialect of ``llm-d:session-id[=<header>]`` or ``llm-d:echo=<header>``."""
    option, _, header = arg.strip().partition("=")
    option = option.strip().lower()
    if option == "session-id":
        return llmd_dialect(
            session_affinity="session_id_header",
            session_header=header.strip() or SESSION_TOKEN_HEADER,
        )
    if option == "echo" and header.strip():
        return llmd_dialect(session_header=header.strip())
    raise ValueError(
        f"unknown option {arg!r} for dialect 'llm-d'; the options are 'session-id', "
        "'session-id=<header>' and 'echo=<header>'"
    )


LLMD: Final = llmd_dialect()
"""The ``llm-d`` dialect: the ``x-session-token`` a reply carries is sent back on the
session's later calls; every call names its program as its fairness id
(:func:`llmd_dialect` with its defaults)."""
