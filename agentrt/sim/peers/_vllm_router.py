"""vllm-router's load-balancing policies (vllm-project/router 0.1.17, ``src/policies/``).

- ``round_robin`` (``round_robin.rs``): the next worker in turn, per request;
- ``cache_aware`` (``cache_aware.rs``, the router's default): an approximate prefix tree
  of what each worker was sent; if the workers' in-flight counts are imbalanced
  (``max - min > balance_abs_threshold`` and ``max > min * balance_rel_threshold``) the
  least loaded; else the worker whose tree matches the request's longest prefix when the
  match rate exceeds ``cache_threshold``, the least loaded otherwise. Defaults as the
  router's CLI: 0.3, 64, 1.5; each worker's tree bounded to ``max_tree_size`` characters
  (2**25), least recently used leaves evicted every ``eviction_interval_secs`` (120).
  0.1.17 keys its prefix on token ids it gets from the worker
  (``POST /v1/chat/completions/render``, ``/tokenize``), which the model stands in for
  with the replicas' own block runs; a worker without those endpoints (``agentrt sim
  serve``) gets no prefix routing from the real router (``render_unavailable``);
- ``consistent_hash`` (``consistent_hash.rs``, ``hash_key.rs``): a ring of 160 virtual
  nodes per worker URL hashed with ``fbi_hash``; the key is the first of the headers
  ``x-session-id``, ``x-user-id``, ``x-tenant-id``, ``x-correlation-id``,
  ``x-request-id``, ``x-trace-id``, then ``session_params.session_id``, ``user``,
  ``session_id``, ``user_id`` found in the routing text by the router's plain-text
  search, else the text itself (``request:TEXT``, or its hash past 100 bytes). In 0.1.17
  a chat request's routing text is empty: a chat body's ``user`` field is not read, and
  every chat request without a session header has the key ``request:`` and goes to one
  worker (measured, python -m benchmarks routing peers);
- ``sticky_least_loaded`` (``sticky_least_loaded.rs``): a new session (id as above,
  headers then the routing text) goes to the worker with the fewest active sessions,
  ties broken by rendezvous hashing of ``"{session}:{url}"`` (highest wins, the first in
  worker order on equal weights); its later requests follow it; a session ends with
  ``POST /finish_session?session_id=ID`` or after 2 h untouched (swept at most once a
  minute); a request without a session id goes to the worker with the fewest sessions,
  ties broken by ``"{routing text}:{url}"`` (``":{url}"`` for chat), and is not
  recorded.

Workers are taken in the order the policy was bound with: the real router's registry
order (``GET /list_workers``), not the command line's.

Worker load is the router's count of its requests in flight there.
"""

from __future__ import annotations

import hashlib
import json
from bisect import bisect_left
from typing import Any, Final

from ._base import GatewayRequest, PeerPolicy
from ._fbi import fbi_hash
from ._prefix import PrefixTree

__all__ = [
    "CacheAware",
    "ConsistentHash",
    "PeerRoundRobin",
    "StickyLeastLoaded",
    "hash_key",
    "routing_text",
    "session_key",
]

SESSION_HEADERS: Final = (
    "x-session-id",
    "x-user-id",
    "x-tenant-id",
    "x-correlation-id",
    "x-request-id",
    "x-trace-id",
)
_EXACT_HASH_BYTES: Final = 4096
"""Longer fallback keys (a plain client's request text) are hashed with BLAKE2 instead of
``fbi_hash``, which is slow in Python: the placement is as arbitrary either way."""


def _hash(key: str) -> int:
    if len(key) <= _EXACT_HASH_BYTES:
        return fbi_hash(key)
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def routing_text(req: GatewayRequest) -> str:
    """The request text 0.1.17's hash-keyed policies see: empty for a chat request (its
    ``consistent_hash`` and ``sticky_least_loaded`` get no text for
    ``/v1/chat/completions``: a plain chat turn hashes as ``"request:"``, measured with
    python -m benchmarks routing peers), the prompt for a text completion."""
    if "messages" in req.body:
        return ""
    prompt = req.body.get("prompt")
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


def _field(text: str, name: str) -> str | None:
    """``hash_key.rs``'s ``extract_field_value``: the first ``"name"``, ``'name'`` or
    bare ``name`` in ``text`` followed by a colon, and its quoted or bare value."""
    for pattern in (f'"{name}"', f"'{name}'", name):
        at = text.find(pattern)
        if at < 0:
            continue
        after = text[at + len(pattern) :]
        rest = after.lstrip()
        if not rest.startswith(":"):
            continue
        value = rest[1:].lstrip()
        if value[:1] in ('"', "'"):
            close = value.find(value[0], 1)
            if close >= 0:
                return value[1:close]
            continue
        cut = min((i for i in (value.find(c) for c in ", }]\n\r\t") if i >= 0), default=len(value))
        if cut > 0:
            return value[:cut]
    return None


def _nested_field(text: str, parent: str, child: str) -> str | None:
    """``extract_nested_field_value``: ``child`` inside the object after ``parent``."""
    for pattern in (f'"{parent}"', f"'{parent}'"):
        at = text.find(pattern)
        if at < 0:
            continue
        rest = text[at + len(pattern) :].lstrip()
        if not rest.startswith(":"):
            continue
        brace = rest.find("{")
        if brace < 0:
            return None
        depth = 0
        for i, ch in enumerate(rest[brace:]):
            depth += (ch == "{") - (ch == "}")
            if depth == 0:
                return _field(rest[brace : brace + i + 1], child)
        return None
    return None


def _text_session(text: str) -> tuple[str, str] | None:
    """``extract_hash_key_from_body`` on the routing text (not the JSON body: a chat
    body's ``user`` field is not read in 0.1.17)."""
    if not text:
        return None
    found = _nested_field(text, "session_params", "session_id")
    if found is not None:
        return "session", found
    for field, kind in (("user", "user"), ("session_id", "session"), ("user_id", "user")):
        value = _field(text, field)
        if value is not None:
            return kind, value
    return None


def session_key(req: GatewayRequest) -> str | None:
    """The raw session id vllm-router reads (``extract_session_id``), or None."""
    for name in SESSION_HEADERS:
        value = req.headers.get(name)
        if value:
            return value
    found = _text_session(routing_text(req))
    return None if found is None else found[1]


def hash_key(req: GatewayRequest) -> str:
    """``extract_hash_key``: headers, then fields in the routing text, then the text."""
    for name in SESSION_HEADERS:
        value = req.headers.get(name)
        if value:
            return f"header:{name}:{value}"
    text = routing_text(req)
    found = _text_session(text)
    if found is not None:
        return f"{found[0]}:{found[1]}"
    if len(text.encode()) > 100:
        return f"request_hash:{_hash(text):016x}"
    return f"request:{text}"


class PeerRoundRobin(PeerPolicy):
    name = "vllm-router:round_robin"
    source = "vllm-project/router src/policies/round_robin.rs"

    def __init__(self) -> None:
        self._next = 0

    def pick(self, req: GatewayRequest, now: float) -> int:
        # The worker list in the order it was bound: the real router walks its registry's
        # order, which is not the command line's (``GET /list_workers`` shows it).
        view = self.replicas[self._next % len(self.replicas)]
        self._next += 1
        return view.index


class CacheAware(PeerPolicy):
    name = "vllm-router:cache_aware"
    source = "vllm-project/router src/policies/cache_aware.rs, src/tree.rs"

    def __init__(
        self,
        *,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        eviction_interval_s: float = 120.0,
        max_tree_size: int = 2**25,
        block_size: int = 16,
    ) -> None:
        self.cache_threshold = cache_threshold
        self.abs_threshold = balance_abs_threshold
        self.rel_threshold = balance_rel_threshold
        self.eviction_interval_s = eviction_interval_s
        self.budget_blocks = max_tree_size // 4 // block_size
        self.tree = PrefixTree(block_size)
        self._last_evict = 0.0

    def _least_loaded(self) -> int:
        return min(self.replicas, key=lambda r: r.inflight).index

    def pick(self, req: GatewayRequest, now: float) -> int:
        if now - self._last_evict >= self.eviction_interval_s:
            self._last_evict = now
            for r in self.replicas:
                self.tree.evict(r.index, self.budget_blocks)
        loads = [r.inflight for r in self.replicas]
        lo, hi = min(loads), max(loads)
        runs = req.prompt.runs
        if hi - lo > self.abs_threshold and hi > lo * self.rel_threshold:
            index = self._least_loaded()
        else:
            matched, tenant = self.tree.match(runs)
            tokens = req.prompt.num_tokens
            rate = matched * self.tree.block_size / tokens if tokens else 0.0
            if rate > self.cache_threshold and tenant is not None:
                index = tenant
            else:
                index = self._least_loaded()
        self.tree.insert(runs, index, now)
        return index


class ConsistentHash(PeerPolicy):
    name = "vllm-router:consistent_hash"
    source = "vllm-project/router src/policies/consistent_hash.rs, src/policies/hash_key.rs"

    VIRTUAL_NODES: Final = 160

    def bind(self, replicas: Any) -> None:
        super().bind(replicas)
        ring = sorted(
            (fbi_hash(f"{r.url}:{i}"), r.index) for r in replicas for i in range(self.VIRTUAL_NODES)
        )
        self._points: list[int] = [p for p, _ in ring]
        self._owners: list[int] = [o for _, o in ring]

    def pick(self, req: GatewayRequest, now: float) -> int:
        h = _hash(hash_key(req))
        i = bisect_left(self._points, h)
        return self._owners[i if i < len(self._owners) else 0]


class StickyLeastLoaded(PeerPolicy):
    name = "vllm-router:sticky_least_loaded"
    source = "vllm-project/router src/policies/sticky_least_loaded.rs, src/server.rs"

    def __init__(self, *, expiration_s: float = 7200.0, sweep_interval_s: float = 60.0) -> None:
        self.expiration_s = expiration_s
        self.sweep_interval_s = sweep_interval_s
        self.sessions: dict[str, tuple[int, float]] = {}
        """session id -> (worker index, last access)"""
        self.counts: dict[int, int] = {}
        self._last_sweep = 0.0

    def _least(self, tie_key: str) -> int:
        counts = self.counts
        low = min(counts.get(r.index, 0) for r in self.replicas)
        best, weight = self.replicas[0].index, -1
        for r in self.replicas:
            if counts.get(r.index, 0) != low:
                continue
            w = _hash(f"{tie_key}:{r.url}")
            if w > weight:
                best, weight = r.index, w
        return best

    def _sweep(self, now: float) -> None:
        if now - self._last_sweep < self.sweep_interval_s:
            return
        self._last_sweep = now
        for sid, (index, last) in list(self.sessions.items()):
            if now - last >= self.expiration_s:
                self._drop(sid, index)

    def _drop(self, sid: str, index: int) -> None:
        del self.sessions[sid]
        left = self.counts.get(index, 0) - 1
        if left > 0:
            self.counts[index] = left
        else:
            self.counts.pop(index, None)

    def pick(self, req: GatewayRequest, now: float) -> int:
        self._sweep(now)
        sid = session_key(req)
        if sid is None:
            return self._least(routing_text(req))
        entry = self.sessions.get(sid)
        if entry is not None:
            self.sessions[sid] = (entry[0], now)
            return entry[0]
        index = self._least(sid)
        self.sessions[sid] = (index, now)
        self.counts[index] = self.counts.get(index, 0) + 1
        return index

    def control(
        self, path: str, params: dict[str, str], body: dict[str, Any]
    ) -> tuple[int, dict[str, Any]] | None:
        if path != "/finish_session":
            return None
        sid = params.get("session_id") or body.get("session_id")
        if not isinstance(sid, str) or not sid:
            return 400, {"error": "session_id is required"}
        entry = self.sessions.get(sid)
        if entry is not None:
            self._drop(sid, entry[0])
        return 200, {"status": "ok", "session_id": sid}
