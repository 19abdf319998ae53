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

llm-d's ``session-affinity-scorer`` and its hard counterpart, the
``session-affinity-filter``, have a second strategy, ``session_id`` (llm-d/llm-d-router#2238,
first named ``session_id_header``): the client sends its own opaque session id in a request
header and the EPP keeps a server-side binding from it to the pod that served it, dropped
after 300 s of disuse (``evictionTtlSeconds``). The header is read from the strategy's
``sessionIdConfig.sources``, by default one header source ``x-session-id``
(``DefaultSessionIDHeader``, ``pkg/epp/framework/plugins/scheduling/util/sessionaffinity/
session_id.go``); the first releases read the scorer's ``headerName``, by default
``x-session-token``. ``llmd_dialect(session_affinity="session_id")`` (name
``llm-d:session-id``) sends the session id in both, on every call, the first included, and
echoes nothing; ``llm-d:session-id=<header>`` sends it in that one header only
(``=x-session-token`` names the default, both).
"""

from __future__ import annotations

from typing import Final, Literal

from .._protocol import CallMetadata
from ._base import Dialect, DialectOptions, Encoding
from ._generic import base_encoding, check_header_name, check_header_value, echo_into

__all__ = [
    "FAIRNESS_ID_HEADER",
    "LLMD",
    "SESSION_ID_HEADER",
    "SESSION_TOKEN_HEADER",
    "llmd_dialect",
]

LlmdAffinity = Literal["encoded_endpoint_header", "session_id", "session_id_header"]

SESSION_TOKEN_HEADER: Final = "x-session-token"
SESSION_ID_HEADER: Final = "x-session-id"
"""The header the ``session_id`` strategy of llm-d's session-affinity filter and scorer
reads by default."""
FAIRNESS_ID_HEADER: Final = "x-llm-d-inference-fairness-id"


def llmd_dialect(
    *,
    session_affinity: LlmdAffinity = "encoded_endpoint_header",
    session_header: str = SESSION_TOKEN_HEADER,
) -> Dialect:
    """Build the llm-d dialect for the EPP's session-affinity strategy (the
    ``session-affinity-scorer``'s and the ``session-affinity-filter``'s).

    ``"encoded_endpoint_header"`` (their default): echo the ``session_header`` a reply
    carries on the session's later calls. ``"session_id"`` (or its first name
    ``"session_id_header"``): send the session id on every call, in ``x-session-id`` (the
    strategy's default source) and ``x-session-token`` (the first releases' default
    ``headerName``) unless another ``session_header`` is given, then in that one only.
    """
    if session_affinity not in ("encoded_endpoint_header", "session_id", "session_id_header"):
        raise ValueError(
            "session_affinity must be 'encoded_endpoint_header', 'session_id' or "
            f"'session_id_header', got {session_affinity!r}"
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

    default = header == SESSION_TOKEN_HEADER
    headers = (SESSION_ID_HEADER, SESSION_TOKEN_HEADER) if default else (header,)

    def encode_id(meta: CallMetadata, options: DialectOptions) -> Encoding:
        enc = base_encoding(meta)
        enc.headers[FAIRNESS_ID_HEADER] = check_header_value(meta.program_id, "program id")
        for name in headers:
            enc.headers[name] = meta.session_id
        return enc

    suffix = "" if header == SESSION_TOKEN_HEADER else f"={header}"
    return Dialect(
        name=f"llm-d:session-id{suffix}",
        encode=encode_id,
        doc=f"llm-d session_id affinity (session-affinity-filter or -scorer): session id in "
        f"{' and '.join(headers)} on every call; x-llm-d-inference-fairness-id = the program id.",
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
