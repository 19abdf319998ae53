"""NVIDIA Dynamo's KV router (``python -m dynamo.frontend --router-mode kv``), with its
optional session affinity (ai-dynamo/dynamo, 2026 main).

Cost per worker (``docs/design-docs/router-design.md`` "Cost Calculation";
``lib/kv-router/src/scheduling/selector/default.rs`` ``worker_logit``)::

    prefill_blocks  = (active prompt-side tokens + this request's input tokens) / block_size
    adjusted        = max(0, prefill_blocks - overlap_score_credit * device_overlap_blocks
                                            - host_cache_hit_weight * host_overlap_blocks)
    decode_blocks   = active blocks on the worker + this request's blocks
    cost            = prefill_load_scale * adjusted + decode_blocks

with the defaults of ``lib/kv-router/src/scheduling/config.rs`` (``KvRouterConfig``):
``overlap_score_credit`` 1.0, ``prefill_load_scale`` 1.0 (the deprecated
``--kv-overlap-score-weight`` sets it), ``host_cache_hit_weight`` 0.75,
``router_temperature`` 0 (so the lowest cost wins; ties at random, seeded here),
``router_track_active_blocks`` on, ``router_track_output_blocks`` off. The overlap is the
KV-event index's (exact here: the engine's own prefix match, accelerator and host tiers).
A request counts in its worker's active blocks from routing until it ends (``Free``), and
its new prompt tokens (input minus the device overlap) in the worker's prompt-side load
until its first token (``MarkPrefillCompleted``).

Session affinity (``docs/.../router-guide`` "Session Affinity";
``lib/llm/src/session_affinity``): off by default in Dynamo (peer ``dynamo``); on with
``--router-session-affinity-ttl-secs`` (peer ``dynamo:affinity``, TTL 300 s, the docs'
example). The first dispatched request of an ``X-Dynamo-Session-ID`` binds the session to
its worker; later requests go there (mode ``hard``, the default: exact dispatch). The TTL
is an idle timeout: a session's requests in flight keep the binding alive and the timer
restarts when its last one ends. ``soft`` mode passes the binding as an advisory target
that the built-in selector keeps while the worker is eligible; without busy thresholds
(off by default) every worker is eligible, so here ``soft`` routes as ``hard``.

Where this model departs from the real one (unvalidated against a running frontend):

- the router's active blocks are summed per request, not deduplicated across requests
  sharing a prefix on one worker; the gateway sees no first token, so the prompt-side load
  counts the worker's newest in-flight requests, as many as the engine has not yet
  started decoding (its queue, its requests without a first token, and requests in
  transit);
- the router's pending queue (``router_queue_threshold``), busy thresholds, per-request
  ``nvext`` overrides, agent-native session headers, and the 65,536-binding cap are not
  modelled.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Final

from ._base import GatewayRequest, PeerPolicy, ReplicaView

__all__ = ["Dynamo", "DynamoAffinity"]

SESSION_HEADER: Final = "x-dynamo-session-id"
_NO_LIMIT: Final = 1 << 62


class _Binding:
    __slots__ = ("active", "idle_since", "worker")

    def __init__(self, worker: int, now: float) -> None:
        self.worker = worker
        self.active = 0
        self.idle_since = now


class Dynamo(PeerPolicy):
    """Dynamo's KV router: lowest prefill + decode block cost (see the module docstring)."""

    name = "dynamo"
    source = (
        "ai-dynamo/dynamo lib/kv-router/src/scheduling/selector/default.rs, "
        "lib/kv-router/src/scheduling/config.rs, docs/design-docs/router-design.md"
    )

    def __init__(
        self,
        *,
        overlap_score_credit: float = 1.0,
        prefill_load_scale: float = 1.0,
        host_cache_hit_weight: float = 0.75,
        session_affinity_ttl_s: float | None = None,
        seed: int = 0,
    ) -> None:
        if session_affinity_ttl_s is not None and session_affinity_ttl_s <= 0:
            raise ValueError("session_affinity_ttl_s must be > 0 or None")
        self.overlap_score_credit = overlap_score_credit
        self.prefill_load_scale = prefill_load_scale
        self.host_cache_hit_weight = host_cache_hit_weight
        self.ttl_s = session_affinity_ttl_s
        self._rng = random.Random(seed)
        self.bindings: dict[str, _Binding] = {}

    def bind(self, replicas: Sequence[ReplicaView]) -> None:
        super().bind(replicas)
        self._active: list[dict[int, tuple[int, int]]] = [{} for _ in replicas]
        """per worker: request seq -> (new prompt tokens, blocks), oldest first"""
        self._active_blocks = [0] * len(replicas)

    # ---------------------------------------------------------------- load

    def prefill_tokens(self, index: int) -> int:
        """Worker ``index``'s prompt-side load: new prompt tokens of its requests that
        have not produced a first token."""
        active = self._active[index]
        if not active:
            return 0
        r = self.replicas[index]
        running = r.engine.running
        prefilling = sum(1 for x in running if x.first_token_time is None)
        in_transit = max(0, len(active) - r.queued - len(running))
        n = min(len(active), r.queued + prefilling + in_transit)
        if n == 0:
            return 0
        newest = list(active.values())[-n:]
        return sum(tokens for tokens, _ in newest)

    def costs(self, req: GatewayRequest) -> list[float]:
        """Each worker's cost for ``req`` (lower is better)."""
        prompt = req.prompt
        isl = prompt.num_tokens
        out = []
        for i, r in enumerate(self.replicas):
            bs = r.engine.config.block_size
            match = r.engine.kv.match(prompt.runs, _NO_LIMIT)
            prefill_blocks = (self.prefill_tokens(i) + isl) / bs
            adjusted = max(
                0.0,
                prefill_blocks
                - self.overlap_score_credit * match.gpu_blocks
                - self.host_cache_hit_weight * match.host_blocks,
            )
            decode_blocks = self._active_blocks[i] + -(-isl // bs)
            out.append(self.prefill_load_scale * adjusted + decode_blocks)
        return out

    def _select(self, req: GatewayRequest) -> int:
        costs = self.costs(req)
        best = min(costs)
        ties = [i for i, c in enumerate(costs) if c == best]
        return ties[0] if len(ties) == 1 else self._rng.choice(ties)

    # ---------------------------------------------------------------- affinity

    def _session(self, req: GatewayRequest) -> str | None:
        if self.ttl_s is None:
            return None
        return req.headers.get(SESSION_HEADER) or None

    def bound_worker(self, sid: str, now: float) -> int | None:
        """The worker session ``sid`` is bound to at ``now``, or None (unbound, expired)."""
        b = self.bindings.get(sid)
        if b is None:
            return None
        assert self.ttl_s is not None
        if b.active == 0 and now - b.idle_since >= self.ttl_s:
            del self.bindings[sid]
            return None
        return b.worker

    # ---------------------------------------------------------------- policy

    def pick(self, req: GatewayRequest, now: float) -> int:
        sid = self._session(req)
        index = self.bound_worker(sid, now) if sid is not None else None
        if index is None:
            index = self._select(req)
            if sid is not None:
                self.bindings[sid] = _Binding(index, now)
        if sid is not None:
            self.bindings[sid].active += 1
        self.track(req, index)
        return index

    def track(self, req: GatewayRequest, index: int) -> None:
        """Count ``req`` in worker ``index``'s load until :meth:`done` (what the router
        does for every request it sends, a pinned one included)."""
        r = self.replicas[index]
        bs = r.engine.config.block_size
        isl = req.prompt.num_tokens
        device = r.cached_blocks(req.prompt)
        blocks = -(-isl // bs)
        self._active[index][req.seq] = (max(0, isl - device * bs), blocks)
        self._active_blocks[index] += blocks

    def done(self, req: GatewayRequest, index: int, now: float) -> None:
        entry = self._active[index].pop(req.seq, None)
        if entry is not None:
            self._active_blocks[index] -= entry[1]
        sid = self._session(req)
        if sid is not None:
            b = self.bindings.get(sid)
            if b is not None and b.active > 0:
                b.active -= 1
                if b.active == 0:
                    b.idle_since = now


class DynamoAffinity(Dynamo):
    """:class:`Dynamo` with ``--router-session-affinity-ttl-secs 300`` (mode ``hard``)."""

    name = "dynamo:affinity"

    def __init__(self, *, session_affinity_ttl_s: float = 300.0, seed: int = 0) -> None:
        super().__init__(session_affinity_ttl_s=session_affinity_ttl_s, seed=seed)
