"""llm-d's inference scheduler (the endpoint picker, EPP) as its precise-prefix and
agentic-serving guides configure it (llm-d/llm-d-router at ebab687, Aug 2026; the guides in
llm-d/llm-d ``guides/``).

``llm-d`` (scoring only; no flow control):

- ``precise-prefix-cache-scorer`` (``pkg/epp/framework/plugins/scheduling/scorer/
  preciseprefixcache``, ``.../requestcontrol/dataproducer/preciseprefixcache``,
  ``pkg/kvcache/kvblock_scorer.go``): the KV-event index gives, per pod, the longest run of
  the prompt's blocks cached from block 0 (``LongestPrefix``); the score is
  ``matchBlocks / totalBlocks`` (``prefix-cache-scorer`` with its default
  ``matchLengthWeight`` 0, ``scorer/prefix/plugin.go``), 0 when the prompt has no full
  block. The index is in 64-token blocks (``tokenProcessorConfig.blockSize: 64`` in
  ``deploy/config/epp-precise-prefix-cache-config.yaml``): the replica's cached prefix,
  in tokens, floored to whole index blocks. It learns of blocks from the engines' KV
  events, which arrive late: blocks a request stores on a pod count only
  :data:`KV_EVENT_LAG_S` after its prefill ends (the first streamed chunk, or a whole
  reply's ``Server-Timing``); until then a prompt sharing them scores what was cached
  there when that request arrived (speculative indexing, off by default, is not
  modelled);
- ``kv-cache-utilization-scorer`` (``scorer/kvcacheutilization``): ``1 - kv_usage``;
- ``queue-scorer`` (``scorer/queuedepth/queue.go``): ``(max - q) / (max - min)`` over the
  pods' waiting queues, 1 for every pod when they are equal;
- ``session-affinity-scorer`` (``scorer/sessionaffinity``, default strategy
  ``encoded_endpoint_header``): 1 for the pod named by the request's ``x-session-token``
  (base64 of ``namespace/name``), 0 elsewhere; every reply carries
  ``x-session-token`` naming the pod that served it;
- ``max-score-picker`` (``picker/maxscore/picker.go``): the highest weighted sum, ties
  broken at random (seeded here). Weights as
  ``guides/precise-prefix-cache-aware/scheduler/precise-prefix-cache-aware.values.yaml``:
  precise prefix 2, kv-cache utilization 1, queue 1. That guide does not configure the
  session-affinity scorer, so ``llm-d`` scores no session (weight 0; its replies still
  carry the token); ``llm-d:affinity`` adds it at the EPP's default weight 1
  (``pkg/epp/config/loader/defaults.go`` ``DefaultScorerWeight``), as a deployment that
  enables it gets.

``llm-d:fairness`` adds flow control with ``program-aware-fairness``
(``pkg/epp/framework/plugins/flowcontrol/fairness/program-aware/``; enabled as in
``guides/agentic-serving/router/fairness-las-plugins.yaml``):

- the fairness id (``pkg/epp/requestcontrol/director.go``, ``pkg/epp/metadata/consts.go``):
  header ``x-llm-d-inference-fairness-id`` (or its deprecated alias
  ``x-gateway-inference-fairness-id``), else the ``agent-identity`` plugin's identity (the
  guide enables it; ``requestcontrol/requestheader/agentidentity``): the first of
  ``x-claude-code-session-id``, ``x-session-affinity``, ``session-id``, ``session_id``,
  else ``default-flow``;
- the saturation detector: the default one when flow control is on, the
  ``utilization-detector`` (``saturationdetector/utilization``, ``config/loader/
  defaults.go`` ``ensureSaturationDetector``): pool saturation is the mean over pods of
  ``max(queue / 5, kv_usage / 0.8)``; a dispatch cycle dispatches while it is below 1
  (``flowcontrol/controller/internal/processor.go``; one item per cycle, a cycle on each
  arrival and each millisecond). Below saturation a request passes straight through;
- LAS (``strategy_las.go``): among the programs with queued requests, the highest
  ``0.8 * (1 - norm(service)) + 0.2 * norm(head wait)`` (min-max normalized across those
  programs, 0.5 when all equal); service is a program's weighted tokens
  (``input + 2 * output``), added at completion, halving every 60 s; within a program,
  first come first served.

The information the EPP has is the real default: the pods' metrics (waiting queue, running
batch, KV usage) as scraped every 50 ms (``DefaultRefreshMetricsInterval``,
``pkg/epp/server/options.go``), answered by :meth:`Engine.scraped` at no cost (the state at
the last poll), the lagged 64-token index above. ``llm-d:ideal`` (:class:`LLMDIdeal`) keeps
the ideal: live metrics, an exact index updated at once, in the engine's blocks. Sources
checked at llm-d/llm-d-inference-scheduler 520af47896e5 (May 2026).

Where this model departs from the real one (unvalidated against a running EPP):

- the polls of all pods fall at the same instants (multiples of 50 ms; the real collectors
  run one per pod, each from its own start); KV events of evicted blocks are applied at
  once (only stores lag);
- under flow control a pod's queue counts the requests the
  gateway sent it that the engine has not yet started (``max(queued, inflight -
  running)``), and released requests not yet routed count as queued, so a burst cannot
  overshoot saturation the way stale metrics let it; a dispatch cycle runs on each
  arrival, each completion and every 50 ms while requests wait (not every 1 ms);
- attained service counts input tokens only (the gateway does not see the reply's usage;
  agent calls' outputs are a few percent of their tokens);
- the precise index's CPU-tier credit (``kvcache.DefaultKVCacheBackendConfig``) is not
  modelled: only the accelerator's blocks count;
- the saturation detector's filter role, flow control's request TTLs and queue capacity
  limits, program eviction after 3600 s idle, and picker randomness (seeded) are left out.
"""

from __future__ import annotations

import base64
import binascii
import math
import random
from collections import deque
from collections.abc import Sequence
from typing import Any, Final

import anyio

from .._app import _HTTPError
from .._tokenize import Run
from ._base import GatewayRequest, PeerPolicy, ReplicaView

__all__ = ["LLMD", "LLMDAffinity", "LLMDFairness", "LLMDFlow", "LLMDIdeal", "fairness_id"]

METRICS_INTERVAL_S: Final = 0.05
"""The EPP's ``DefaultRefreshMetricsInterval`` (``pkg/epp/server/options.go``)."""
KV_EVENT_LAG_S: Final = 0.01
"""Seconds from a prefill's end until its ``BlockStored`` events are in the index (vLLM
publishes a step's events over ZMQ as the step ends, the ``kvevents.Pool`` applies them:
an assumption, not a measured figure)."""
INDEX_BLOCK_TOKENS: Final = 64
"""The precise-prefix guide's ``tokenProcessorConfig.blockSize``."""

SESSION_TOKEN_HEADER: Final = "x-session-token"
FAIRNESS_HEADERS: Final = ("x-llm-d-inference-fairness-id", "x-gateway-inference-fairness-id")
AGENT_IDENTITY_HEADERS: Final = (
    "x-claude-code-session-id",
    "x-session-affinity",
    "session-id",
    "session_id",
)
DEFAULT_FAIRNESS_ID: Final = "default-flow"


def fairness_id(req: GatewayRequest) -> str:
    """The flow-control fairness id the EPP's director gives ``req``."""
    headers = req.headers
    for name in FAIRNESS_HEADERS + AGENT_IDENTITY_HEADERS:
        value = headers.get(name)
        if value:
            return value
    return DEFAULT_FAIRNESS_ID


def _decode_pod(token: str | None) -> str | None:
    if not token:
        return None
    try:
        return base64.b64decode(token, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


class LLMD(PeerPolicy):
    """llm-d's EPP scoring as the precise-prefix guide configures it: precise prefix +
    kv-cache utilization + queue, max-score picker (see the module docstring);
    ``session_weight`` > 0 adds the session-affinity scorer (:class:`LLMDAffinity`)."""

    name = "llm-d"
    source = (
        "llm-d/llm-d-router pkg/epp/framework/plugins/scheduling/scorer/"
        "{preciseprefixcache,prefix,kvcacheutilization,queuedepth,sessionaffinity}, "
        "picker/maxscore; llm-d/llm-d guides/precise-prefix-cache-aware"
    )

    def __init__(
        self,
        *,
        prefix_weight: float = 2.0,
        kv_weight: float = 1.0,
        queue_weight: float = 1.0,
        session_weight: float = 0.0,
        namespace: str = "default",
        seed: int = 0,
        metrics_interval_s: float | None = METRICS_INTERVAL_S,
        kv_event_lag_s: float | None = KV_EVENT_LAG_S,
        index_block_tokens: int | None = INDEX_BLOCK_TOKENS,
    ) -> None:
        if metrics_interval_s is not None and not metrics_interval_s > 0:
            raise ValueError(f"metrics_interval_s must be > 0 or None, not {metrics_interval_s!r}")
        if kv_event_lag_s is not None and kv_event_lag_s < 0:
            raise ValueError(f"kv_event_lag_s must be >= 0 or None, not {kv_event_lag_s!r}")
        if index_block_tokens is not None and index_block_tokens < 1:
            raise ValueError(f"index_block_tokens must be >= 1 or None, not {index_block_tokens!r}")
        self.metrics_interval_s = metrics_interval_s
        """Seconds between metric scrapes (None: read live, the ideal)."""
        self.kv_event_lag_s = kv_event_lag_s
        """Seconds from a prefill's end to its blocks in the index (None: exact, at once)."""
        self.index_block_tokens = index_block_tokens
        """Tokens per block of the precise index (None: the engine's blocks)."""
        self._unindexed: list[list[_Stored]] = []
        self._stored: dict[int, _Stored] = {}
        self.prefix_weight = prefix_weight
        self.kv_weight = kv_weight
        self.queue_weight = queue_weight
        self.session_weight = session_weight
        self.namespace = namespace
        self._rng = random.Random(seed)

    def bind(self, replicas: Sequence[ReplicaView]) -> None:
        super().bind(replicas)
        if self.metrics_interval_s is not None:
            for r in replicas:
                r.engine.scrape_every(self.metrics_interval_s)
        self._unindexed = [[] for _ in replicas]
        self.pod_ids = [f"{self.namespace}/{r.name}" for r in replicas]
        self._by_pod = {pod: i for i, pod in enumerate(self.pod_ids)}
        self._tokens = [base64.b64encode(p.encode()).decode("ascii") for p in self.pod_ids]

    def token(self, index: int) -> str:
        """The ``x-session-token`` value naming replica ``index``."""
        return self._tokens[index]

    def metrics(self, index: int) -> tuple[int, int, float]:
        """Replica ``index``'s ``(waiting, running, kv_usage)`` as the EPP last scraped them
        (live in the ideal model)."""
        return self.replicas[index].engine.scraped()

    def prefix_score(self, req: GatewayRequest, index: int, now: float) -> float:
        """The precise prefix scorer's ``matched / total`` blocks for ``req`` on replica
        ``index``, in the index's blocks, from the index as the KV events it has applied by
        ``now`` built it."""
        prompt = req.prompt
        engine_blocks = prompt.num_full_blocks
        if not engine_blocks:
            return 0.0
        hit = self.replicas[index].cached_blocks(prompt)
        if self.kv_event_lag_s is not None and hit:
            hit = self._indexed(prompt.runs, index, hit, now)
        bt = self.index_block_tokens
        if bt is None:
            return hit / engine_blocks
        total = prompt.num_tokens // bt
        if not total:
            return 0.0
        bs = self.replicas[index].engine.config.block_size
        return min(total, hit * bs // bt) / total

    def _indexed(self, runs: list[Run], index: int, hit: int, now: float) -> int:
        """``hit`` (blocks cached on the replica) less the blocks whose KV events the index
        has not applied yet: those a request routed there stored (past what was cached when
        it arrived) until ``kv_event_lag_s`` after its prefill ended."""
        pending = self._unindexed[index]
        if pending:
            keep = [e for e in pending if e.visible_at > now]
            if len(keep) != len(pending):
                pending[:] = keep
            for e in keep:
                if hit > e.before and _common_blocks(runs, e.runs, hit) > e.before:
                    hit = e.before
        return hit

    def scores(self, req: GatewayRequest, now: float | None = None) -> list[float]:
        """Each replica's weighted score for ``req`` (``now``: the gateway's clock; None:
        with every KV event in flight applied)."""
        when = math.inf if now is None else now
        n = len(self.replicas)
        seen = [self.metrics(i) for i in range(n)]
        queues = [m[0] for m in seen]
        lo, hi = min(queues), max(queues)
        pod = _decode_pod(req.headers.get(SESSION_TOKEN_HEADER))
        bound = self._by_pod.get(pod) if pod is not None else None
        out = []
        for i in range(n):
            prefix = self.prefix_score(req, i, when)
            queue = 1.0 if hi == lo else (hi - queues[i]) / (hi - lo)
            kv = 1.0 - seen[i][2]
            session = 1.0 if bound == i else 0.0
            out.append(
                self.prefix_weight * prefix
                + self.kv_weight * kv
                + self.queue_weight * queue
                + self.session_weight * session
            )
        return out

    def pick(self, req: GatewayRequest, now: float) -> int:
        scores = self.scores(req, now)
        best = max(scores)
        ties = [i for i, s in enumerate(scores) if s == best]
        index = ties[0] if len(ties) == 1 else self._rng.choice(ties)
        if self.kv_event_lag_s is not None:
            entry = _Stored(req.prompt.runs, self.replicas[index].cached_blocks(req.prompt))
            self._unindexed[index].append(entry)
            self._stored[req.seq] = entry
        return index

    def started(self, req: GatewayRequest, index: int, now: float) -> None:
        entry = self._stored.pop(req.seq, None)
        if entry is not None and self.kv_event_lag_s is not None:
            entry.visible_at = now + self.kv_event_lag_s

    def reply_headers(self, req: GatewayRequest, index: int) -> list[tuple[bytes, bytes]]:
        return [(SESSION_TOKEN_HEADER.encode(), self._tokens[index].encode())]

    def done(self, req: GatewayRequest, index: int, now: float) -> None:
        self.started(req, index, now)  # no reply began (an error): what it stored shows


class _Stored:
    """Blocks a request stored on a replica that the index may not show yet: its prompt's
    ``runs``, the blocks cached there ``before`` it arrived, and when its KV events are
    applied (``visible_at``; infinity until its prefill ends)."""

    __slots__ = ("before", "runs", "visible_at")

    def __init__(self, runs: list[Run], before: int) -> None:
        self.runs = runs
        self.before = before
        self.visible_at = math.inf


def _common_blocks(a: list[Run], b: list[Run], limit: int) -> int:
    """Blocks two run lists share from the start (at most ``limit``)."""
    ia = ib = oa = ob = m = 0
    na, nb = len(a), len(b)
    while ia < na and ib < nb and m < limit:
        ta, sa, ca = a[ia]
        tb, sb, cb = b[ib]
        if ta != tb or sa + oa != sb + ob:
            break
        step = min(ca - oa, cb - ob, limit - m)
        m += step
        oa += step
        ob += step
        if oa == ca:
            ia += 1
            oa = 0
        if ob == cb:
            ib += 1
            ob = 0
    return m


class LLMDIdeal(LLMD):
    """:class:`LLMD` with ideal information: metrics read live, an exact KV index updated
    at once, in the engine's blocks (what this model did before the real defaults)."""

    name = "llm-d:ideal"

    def __init__(self, **scoring: Any) -> None:
        scoring.setdefault("metrics_interval_s", None)
        scoring.setdefault("kv_event_lag_s", None)
        scoring.setdefault("index_block_tokens", None)
        super().__init__(**scoring)


class LLMDAffinity(LLMD):
    """:class:`LLMD` with the session-affinity scorer enabled at the EPP's default weight
    (1): a request carrying the ``x-session-token`` of an earlier reply scores that pod
    one point higher."""

    name = "llm-d:affinity"

    def __init__(self, **scoring: Any) -> None:
        scoring.setdefault("session_weight", 1.0)
        super().__init__(**scoring)


_WAIT, _TICK, _GO = 0, 1, 2


class _Waiter:
    __slots__ = ("enqueued", "event", "program", "state")

    def __init__(self, program: str, enqueued: float) -> None:
        self.program = program
        self.enqueued = enqueued
        self.state = _WAIT
        self.event = anyio.Event()


class LLMDFairness(LLMD):
    """:class:`LLMD` behind flow control with ``program-aware-fairness`` (LAS)."""

    name = "llm-d:fairness"
    source = LLMD.source + (
        "; pkg/epp/framework/plugins/flowcontrol/fairness/program-aware, "
        "saturationdetector/utilization, pkg/epp/flowcontrol/controller/internal/processor.go"
    )

    def __init__(
        self,
        *,
        queue_depth_threshold: int = 5,
        kv_cache_util_threshold: float = 0.8,
        weight_service: float = 0.8,
        weight_head_wait: float = 0.2,
        half_life_s: float = 60.0,
        tick_s: float = 0.05,
        request_ttl_s: float | None = None,
        **scoring: Any,
    ) -> None:
        super().__init__(**scoring)
        if request_ttl_s is not None and not request_ttl_s > 0:
            raise ValueError(f"request_ttl_s must be > 0 or None, not {request_ttl_s!r}")
        self.request_ttl_s = request_ttl_s
        """Flow control's queue-wait budget (``defaultRequestTTL``); None: none."""
        self.shed = 0
        """Requests shed because they waited ``request_ttl_s`` (answered 429)."""
        self.held = 0
        """Requests that waited in flow control's queues."""
        self.hold_s: list[float] = []
        """How long each request dispatched from the queues waited."""
        self.queue_depth_threshold = queue_depth_threshold
        self.kv_cache_util_threshold = kv_cache_util_threshold
        self.weight_service = weight_service
        self.weight_head_wait = weight_head_wait
        self.half_life_s = half_life_s
        self.tick_s = tick_s
        self.queues: dict[str, deque[_Waiter]] = {}
        """Waiting requests per program, oldest first (only non-empty queues)."""
        self._service: dict[str, tuple[float, float]] = {}
        """program -> (attained service, when its decay was last folded in)"""
        self._released = 0
        self._ticker: _Waiter | None = None
        self.dispatched_order: list[str] = []
        """The program of each request as flow control released it (for tests, reports)."""
        self.peak_waiting = 0
        """The most requests flow control held at once (the EPP's peak queue depth)."""

    # ---------------------------------------------------------------- saturation

    def saturation(self) -> float:
        """The utilization detector's pool saturation (see the module docstring)."""
        replicas = self.replicas
        qt, kt = self.queue_depth_threshold, self.kv_cache_util_threshold
        total = 0.0
        for i, r in enumerate(replicas):
            waiting, running, kv_usage = self.metrics(i)
            queued = max(waiting, r.inflight - running)
            total += max(queued / qt, kv_usage / kt)
        return (total + self._released / qt) / len(replicas)

    # ---------------------------------------------------------------- LAS

    def service(self, program: str, now: float) -> float:
        """``program``'s attained service, decayed to ``now``."""
        value, since = self._service.get(program, (0.0, now))
        if self.half_life_s > 0 and now > since:
            value *= 2.0 ** (-(now - since) / self.half_life_s)
        self._service[program] = (value, now)
        return value

    def _pick_queue(self, now: float) -> str:
        programs = list(self.queues)
        if len(programs) == 1:
            return programs[0]
        services = [self.service(p, now) for p in programs]
        waits = [(now - self.queues[p][0].enqueued) * 1000.0 for p in programs]
        s_lo, s_hi, w_lo, w_hi = min(services), max(services), min(waits), max(waits)
        best, best_score = programs[0], float("-inf")
        for p, s, w in zip(programs, services, waits, strict=True):
            ns = 0.5 if s_hi == s_lo else (s - s_lo) / (s_hi - s_lo)
            nw = 0.5 if w_hi == w_lo else (w - w_lo) / (w_hi - w_lo)
            score = self.weight_service * (1.0 - ns) + self.weight_head_wait * nw
            if score > best_score:
                best, best_score = p, score
        return best

    def _pump(self) -> None:
        """Dispatch cycles: release waiting requests while the pool is not saturated."""
        now = anyio.current_time()
        while self.queues and self.saturation() < 1.0:
            program = self._pick_queue(now)
            q = self.queues[program]
            w = q.popleft()
            if not q:
                del self.queues[program]
            self._release(w)
        self._ensure_ticker()

    def _release(self, w: _Waiter) -> None:
        w.state = _GO
        self._released += 1
        self.dispatched_order.append(w.program)
        if self._ticker is w:
            self._ticker = None
        w.event.set()

    def _ensure_ticker(self) -> None:
        if self._ticker is not None or not self.queues:
            return
        oldest = min((q[0] for q in self.queues.values()), key=lambda w: w.enqueued)
        oldest.state = _TICK
        self._ticker = oldest
        oldest.event.set()

    def _forget(self, w: _Waiter) -> None:
        q = self.queues.get(w.program)
        if q is not None and w in q:
            q.remove(w)
            if not q:
                del self.queues[w.program]
        if self._ticker is w:
            self._ticker = None
            self._ensure_ticker()

    async def admit(self, req: GatewayRequest) -> None:
        program = fairness_id(req)
        if not self.queues and self.saturation() < 1.0:
            self.dispatched_order.append(program)
            return
        w = _Waiter(program, anyio.current_time())
        self.queues.setdefault(program, deque()).append(w)
        self.held += 1
        waiting = sum(len(q) for q in self.queues.values())
        self.peak_waiting = max(self.peak_waiting, waiting)
        self._pump()
        ttl = self.request_ttl_s
        deadline = math.inf if ttl is None else w.enqueued + ttl
        try:
            while w.state != _GO:
                left = deadline - anyio.current_time()
                if left <= 0:
                    self._forget(w)
                    self.shed += 1
                    raise _HTTPError(429, f"request timed out in queue after {ttl:g} s")
                if w.state == _TICK:
                    w.event = anyio.Event()
                    with anyio.move_on_after(min(self.tick_s, left)):
                        await w.event.wait()
                    if w.state != _GO:
                        self._pump()
                    continue
                with anyio.move_on_after(left):
                    await w.event.wait()
                if w.state == _WAIT:
                    w.event = anyio.Event()
        except BaseException:
            if w.state == _GO:
                self._released -= 1
            else:
                self._forget(w)
            raise
        self._released -= 1
        self.hold_s.append(anyio.current_time() - w.enqueued)

    def stats(self) -> dict[str, Any]:
        holds = sorted(self.hold_s)
        return {
            "held": self.held,
            "shed": self.shed,
            "hold_p50_s": holds[len(holds) // 2] if holds else 0.0,
            "hold_max_s": holds[-1] if holds else 0.0,
            "peak_waiting": self.peak_waiting,
        }

    def done(self, req: GatewayRequest, index: int, now: float) -> None:
        super().done(req, index, now)
        program = fairness_id(req)
        value = self.service(program, now)
        self._service[program] = (value + req.prompt.num_tokens, now)
        if self.queues:
            self._pump()


class LLMDFlow(LLMDFairness):
    """:class:`LLMD` behind flow control as it comes by default: the ``utilization-detector``
    gate, one priority band whose flows are served ``global-strict`` (the oldest head
    request of any flow first) and ordered ``fcfs`` within (together: one first-come,
    first-served queue), and the 60 s queue-wait budget (``defaultRequestTTL``), past which
    a request is shed with 429."""

    name = "llm-d:flow"
    source = LLMD.source + (
        "; pkg/epp/framework/plugins/flowcontrol/{saturationdetector/utilization,"
        "fairness/globalstrict,ordering/fcfs}, pkg/epp/flowcontrol/registry/config.go, "
        "pkg/epp/flowcontrol/controller/config.go"
    )

    def __init__(self, *, request_ttl_s: float | None = 60.0, **options: Any) -> None:
        super().__init__(request_ttl_s=request_ttl_s, **options)

    def _pick_queue(self, now: float) -> str:
        return min(self.queues, key=lambda p: self.queues[p][0].enqueued)
