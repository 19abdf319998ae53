"""The ``vllm-router-agentic`` dialect: vllm-project/router's program scheduling contract.

vllm-router 0.1.17 (PyPI ``vllm-router``, a Rust load balancer in front of vLLM
replicas) schedules *programs*: it admits a bounded number per replica, keeps one's
slot for an "acting" TTL after each reply, and pauses it after. A request opts in with
the body object ``vllm_xargs.agentic_context`` (``src/request_identity.rs``,
``canonical_context``; its fields are read in ``src/program_scheduling/identity.rs``,
``apply_canonical_scheduling``). This dialect fills it from what agentrt knows, with
the router's program being one agentrt session (one conversation, one KV prefix):

- ``program_id``, ``session_id``: the session id; ``agent_id``: the session's name
  (``job.session(name)``), else its id;
- ``task_id``: the job id (the router groups a task's programs: its placement key);
- ``agent_role``: ``"lead"`` for a session without a parent, ``"subagent"`` with one,
  and then ``parent_program_id``: the parent session, ``root_program_id``: the root of
  the session's tree, and ``blocks_parent`` when the caller said it
  (``job.session(..., blocks_parent=...)``; the router's default is true for a
  sub-agent);
- ``expected_resume``: ``false`` on a call the caller marked as the session's last
  (``session.chat(..., final=True)`` or ``session.expect_final()``), which ends the
  program at the router when the reply is done and frees its slot at once; ``true``
  otherwise (a program that stops calling is paused when its acting TTL runs out,
  dropped 30 min later);
- ``step_id``: the call's turn in its session; ``request_id``: the call's id (the one
  agentrt keeps across the call's attempts; the router keeps it as a correlation id that
  "never participates in identity");
- ``spawn_reason``: for a sub-agent with a name, that name (the kind of sub-agent it is:
  the router reads the field also as ``subagent_type`` or ``agent_type``);
- ``kv_retention_ttl_seconds``: the idle the session expects after this reply (a
  declared or learned tool wait) plus a margin, bounded, when known (it replaces the
  TTL the router computes; ``max_acting_ttl_seconds``, 10 s by default, caps only the
  computed one: ``docs/program_scheduling.md``, ``scheduler_lifecycle.rs``);
- ``deadline_seconds``: the seconds left before the job's deadline, when it has one (the
  router bounds a paused program's wait for its force-resume by it);
- ``expected_output_length``: the request's ``max_tokens``, when given (the name the
  router documents as canonical), and the same value as ``expected_output_tokens``, the
  alias that routers before it read (the router reads the first of
  ``["expected_output_length", "expected_output_tokens"]`` present, and ignores keys it
  does not know: ``src/program_scheduling/identity.rs``, ``canonical_identity``);
- ``priority``: agentrt's priority negated (the router resumes larger values first),
  only with ``DialectOptions(send_priority=True)``.

The object travels as a JSON string (the router accepts both forms, up to 16 KiB):
the router forwards ``vllm_xargs`` to the replica, and vLLM accepts only strings,
numbers and lists as its values. The header ``x-session-id`` carries the session id
too, for the ``consistent_hash`` and ``sticky_least_loaded`` policies
(``src/policies/hash_key.rs``). A caller's own ``vllm_xargs.agentic_context`` (in
``extra_body``) replaces this one whole.

When a session that called the router ends, the runtime sends the router
``POST /finish_session?session_id=ID`` (:data:`~agentrt.dialects.FINISH_SESSION`):
``sticky_least_loaded`` otherwise counts the session on its worker for two hours. On by
default; ``vllm_router_agentic_dialect(finish_session=False)`` turns it off. See
docs/protocol.md.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

from .._protocol import CallMetadata, validate_nonneg
from ._base import Dialect, DialectOptions, Encoding
from ._generic import base_encoding, clamp
from ._session_ends import FINISH_SESSION

__all__ = [
    "DEFAULT_ROUTER_MAX_TTL_S",
    "DEFAULT_ROUTER_TTL_MARGIN_S",
    "VLLM_ROUTER_AGENTIC",
    "vllm_router_agentic_dialect",
]

DEFAULT_ROUTER_TTL_MARGIN_S: Final = 2.0
"""Seconds added to the expected idle: a tool wait that runs a little long still finds
the program's slot (and its KV) held."""

DEFAULT_ROUTER_MAX_TTL_S: Final = 3600.0
"""Upper bound on ``kv_retention_ttl_seconds`` as sent (the router bounds it again)."""

_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


def _seconds(value: float, what: str) -> float:
    checked = validate_nonneg(value, what)
    if checked is None:
        raise TypeError(f"{what} must be a number of seconds, got None")
    return checked


def _context_of(
    meta: CallMetadata,
    options: DialectOptions,
    *,
    ttl_margin_s: float = DEFAULT_ROUTER_TTL_MARGIN_S,
    max_ttl_s: float = DEFAULT_ROUTER_MAX_TTL_S,
) -> dict[str, Any]:
    """The ``agentic_context`` object of one call (before it is encoded as a string)."""
    session = meta.session_id
    ctx: dict[str, Any] = {
        "program_id": session,
        "task_id": meta.job_id,
        "session_id": session,
        "agent_id": meta.session_name or session,
    }
    parent = meta.parent_session_id
    if parent is not None and parent != session:
        ctx["agent_role"] = "subagent"
        ctx["parent_program_id"] = parent
        root = meta.root_session_id
        if root is not None and root != session:
            ctx["root_program_id"] = root
        if meta.blocks_parent is not None:
            ctx["blocks_parent"] = meta.blocks_parent
    else:
        ctx["agent_role"] = "lead"
    ctx["expected_resume"] = not meta.final
    ctx["step_id"] = max(0, meta.turn)
    ctx["request_id"] = meta.call_id
    if parent is not None and parent != session and meta.session_name:
        ctx["spawn_reason"] = meta.session_name
    idle = meta.idle_expected_s
    if idle is not None and math.isfinite(idle) and idle >= 0 and not meta.final:
        ctx["kv_retention_ttl_seconds"] = round(min(idle + ttl_margin_s, max_ttl_s), 3)
    deadline = meta.deadline_s
    if deadline is not None and math.isfinite(deadline) and deadline >= 0:
        ctx["deadline_seconds"] = round(deadline, 3)
    tokens = meta.expected_output_tokens
    if tokens is not None and tokens >= 0:
        ctx["expected_output_length"] = tokens
        ctx["expected_output_tokens"] = tokens  # the alias older routers read
    if options.send_priority and meta.priority is not None:
        ctx["priority"] = clamp(-meta.priority, _INT64_MIN, _INT64_MAX)
    return ctx


def vllm_router_agentic_dialect(
    *,
    ttl_margin_s: float = DEFAULT_ROUTER_TTL_MARGIN_S,
    max_ttl_s: float = DEFAULT_ROUTER_MAX_TTL_S,
    finish_session: bool = True,
) -> Dialect:
    """Build the ``vllm-router-agentic`` dialect (see the module docstring).

    ``kv_retention_ttl_seconds = min(idle_expected_s + ttl_margin_s, max_ttl_s)``, sent
    only when the session's next idle is known (declared or learned).

    ``finish_session``: when a session that called the router ends, the runtime sends it
    ``POST /finish_session?session_id=ID`` (its ``sticky_least_loaded`` policy holds a
    session it is not told of for two hours). agentrt cannot see the router's policy, so it
    is sent whatever the policy.
    """
    margin = _seconds(ttl_margin_s, "ttl_margin_s")
    cap = _seconds(max_ttl_s, "max_ttl_s")
    if not isinstance(finish_session, bool):
        raise TypeError(f"finish_session must be a bool, got {type(finish_session).__name__}")

    def encode(meta: CallMetadata, options: DialectOptions) -> Encoding:
        enc = base_encoding(meta)
        enc.headers["x-session-id"] = meta.session_id
        ctx = _context_of(meta, options, ttl_margin_s=margin, max_ttl_s=cap)
        enc.body["vllm_xargs"] = {"agentic_context": json.dumps(ctx, separators=(",", ":"))}
        return enc

    return Dialect(
        name="vllm-router-agentic",
        encode=encode,
        doc="vllm-project/router 0.1.17 program scheduling: body vllm_xargs.agentic_context "
        "(a JSON string: program = session, task = job, agent = session name, parent, "
        "root, lead/subagent, blocks_parent, expected_resume false on a final call, "
        f"step, request id, sub-agent spawn_reason, kv_retention_ttl_seconds = expected "
        f"idle + {margin:g} s, deadline, expected_output_length (and its alias "
        "expected_output_tokens), negated priority with "
        "send_priority) and X-Session-ID"
        + ("; POST /finish_session when a session ends." if finish_session else "."),
        session_ends=(FINISH_SESSION,) if finish_session else (),
    )


VLLM_ROUTER_AGENTIC: Final = vllm_router_agentic_dialect()
"""The ``vllm-router-agentic`` dialect with its defaults (:func:`vllm_router_agentic_dialect`)."""
