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

Every call also carries ``x-session-type``: ``agentic`` for a session without a parent,
``agentic-subagent`` for a sub-agent (the workload types llm-d's
``session-interturn-latency-producer`` keys its inter-turn estimators on, read from its
``sessionTypeHeader``, by default ``x-session-type``; llm-d/llm-d-router
``pkg/epp/framework/plugins/requestcontrol/dataproducer/interturnlatency/README.md``).

``llmd_dialect(retention=True)`` (option ``retention``, e.g. ``llm-d:retention`` or
``llm-d:session-id,retention``) also sends the body ``retention_directives`` and
``retention_scope`` that llm-d's ``kv-cache-hint`` / ``kv-cache-retention`` plugins write
for vLLM's retention API (PR vllm-project/vllm#38514), from the session's declared or
learned idle instead of the plugin's log-normal guess: "requests that already carry
``retention_directives`` pass through untouched: client-supplied directives win"
(``pkg/epp/framework/plugins/requestcontrol/kvcachehint/README.md``). Work in progress
upstream on both sides, hence an option.
"""

from __future__ import annotations

from typing import Final, Literal

from .._protocol import CallMetadata
from ._base import Dialect, DialectOptions, Encoding
from ._generic import base_encoding, check_header_name, check_header_value, echo_into
from ._retention import (
    DEFAULT_RETENTION_MARGIN_S,
    DEFAULT_RETENTION_MAX_S,
    check_window,
    retention_directives,
)

__all__ = [
    "FAIRNESS_ID_HEADER",
    "LLMD",
    "SESSION_TOKEN_HEADER",
    "SESSION_TYPE_HEADER",
    "llmd_dialect",
]

LlmdAffinity = Literal["encoded_endpoint_header", "session_id_header"]

SESSION_TOKEN_HEADER: Final = "x-session-token"
FAIRNESS_ID_HEADER: Final = "x-llm-d-inference-fairness-id"
SESSION_TYPE_HEADER: Final = "x-session-type"
"""llm-d's workload type header: ``agentic`` or ``agentic-subagent``."""


def session_type(meta: CallMetadata) -> str:
    """``agentic-subagent`` for a session with a parent, else ``agentic``."""
    return "agentic" if meta.parent_session_id is None else "agentic-subagent"


def llmd_dialect(
    *,
    session_affinity: LlmdAffinity = "encoded_endpoint_header",
    session_header: str = SESSION_TOKEN_HEADER,
    retention: bool = False,
    retention_margin_s: float = DEFAULT_RETENTION_MARGIN_S,
    retention_max_s: float = DEFAULT_RETENTION_MAX_S,
) -> Dialect:
    """Build the llm-d dialect for the EPP's ``session-affinity-scorer`` algorithm.

    ``"encoded_endpoint_header"`` (the scorer's default): echo the ``session_header`` a
    reply carries on the session's later calls. ``"session_id_header"``: send the session
    id in ``session_header`` (the scorer's ``headerName``) on every call.

    ``retention=True``: the body ``retention_directives`` / ``retention_scope`` from the
    session's expected idle (plus ``retention_margin_s``, at most ``retention_max_s``)
    and its end (see :mod:`agentrt.dialects._retention`).
    """
    if not isinstance(retention, bool):
        raise TypeError(f"retention must be a bool, got {type(retention).__name__}")
    margin, cap = check_window(retention_margin_s, retention_max_s)

    def common(meta: CallMetadata) -> Encoding:
        enc = base_encoding(meta)
        enc.headers[FAIRNESS_ID_HEADER] = check_header_value(meta.program_id, "program id")
        enc.headers[SESSION_TYPE_HEADER] = session_type(meta)
        if retention:
            fields = retention_directives(meta, margin, cap)
            if fields is not None:
                enc.body.update(fields)
        return enc

    suffix_r = ",retention" if retention else ""
    doc_r = "; body retention_directives / retention_scope" if retention else ""
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
            enc = common(meta)
            echo_into(enc.headers, meta, echo)
            return enc

        if header == SESSION_TOKEN_HEADER:
            name = "llm-d:retention" if retention else "llm-d"
        else:
            name = f"llm-d:echo={header}{suffix_r}"
        return Dialect(
            name=name,
            encode=encode,
            echo_headers=echo,
            doc=f"llm-d: echo the {header} response header on the session's later calls; "
            "x-llm-d-inference-fairness-id = the program id; x-session-type = agentic or "
            f"agentic-subagent{doc_r}.",
        )

    def encode_id(meta: CallMetadata, options: DialectOptions) -> Encoding:
        enc = common(meta)
        enc.headers[header] = meta.session_id
        return enc

    suffix = "" if header == SESSION_TOKEN_HEADER else f"={header}"
    return Dialect(
        name=f"llm-d:session-id{suffix}{suffix_r}",
        encode=encode_id,
        doc=f"llm-d session_id_header affinity: session id in {header} on every call; "
        "x-llm-d-inference-fairness-id = the program id; x-session-type = agentic or "
        f"agentic-subagent{doc_r}.",
    )


def llmd_from_option(arg: str) -> Dialect:
    """The dialect of ``llm-d:<options>``: ``session-id[=<header>]`` or
    ``echo=<header>``, and ``retention``, comma-separated."""
    affinity: LlmdAffinity = "encoded_endpoint_header"
    header = SESSION_TOKEN_HEADER
    retention = False
    seen: set[str] = set()
    for part in arg.split(","):
        option, eq, value = part.strip().partition("=")
        option = option.strip().lower()
        known = (option == "session-id") or (option == "echo" and value.strip())
        if option in seen or not (known or (option == "retention" and not eq)):
            raise ValueError(
                f"unknown option {arg!r} for dialect 'llm-d'; the options are 'session-id', "
                "'session-id=<header>' or 'echo=<header>', and 'retention', "
                "comma-separated"
            )
        seen.add(option)
        if option == "retention":
            retention = True
        elif option == "session-id":
            affinity = "session_id_header"
            header = value.strip() or SESSION_TOKEN_HEADER
        else:
            header = value.strip()
    if "session-id" in seen and "echo" in seen:
        raise ValueError("llm-d options 'session-id' and 'echo' exclude each other")
    return llmd_dialect(session_affinity=affinity, session_header=header, retention=retention)


LLMD: Final = llmd_dialect()
"""The ``llm-d`` dialect: the ``x-session-token`` a reply carries is sent back on the
session's later calls; every call names its program as its fairness id
(:func:`llmd_dialect` with its defaults)."""
