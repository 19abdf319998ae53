"""What a modelled peer (a router or gateway a team deploys in front of its engines) sees
of a request and of the replicas, and the policy interface each peer module implements."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._engine import Engine
    from .._tokenize import Prompt

__all__ = ["GatewayRequest", "PeerPolicy", "ReplicaView"]


class GatewayRequest:
    """One generation request as the gateway received it.

    ``headers``: the request headers by lower-case name (what the real router reads);
    ``body``: the parsed JSON body; ``raw``: its bytes; ``prompt``: the prompt tokenized
    as the replicas tokenize it (a stand-in for the router's own text or token view:
    the embedded engine's tokens are 4-byte pieces of the text, so token counts are character
    counts / 4); ``arrival``: the gateway's clock when it arrived.
    """

    __slots__ = ("_text", "arrival", "body", "headers", "prompt", "raw", "seq")

    def __init__(
        self,
        headers: dict[str, str],
        body: dict[str, Any],
        raw: bytes,
        prompt: Prompt,
        arrival: float,
        seq: int,
    ) -> None:
        self.headers = headers
        self.body = body
        self.raw = raw
        self.prompt = prompt
        self.arrival = arrival
        self.seq = seq
        self._text: str | None = None

    @property
    def max_tokens(self) -> int:
        value = self.body.get("max_completion_tokens") or self.body.get("max_tokens") or 16
        return value if isinstance(value, int) and not isinstance(value, bool) else 16

    def text(self) -> str:
        """The request's text as vllm-router's routing text: the messages' contents joined
        (chat) or the prompt (completions)."""
        if self._text is None:
            messages = self.body.get("messages")
            if isinstance(messages, list):
                parts = []
                for m in messages:
                    content = m.get("content") if isinstance(m, dict) else None
                    if isinstance(content, str):
                        parts.append(content)
                    elif content is not None:
                        parts.append(json.dumps(content))
                self._text = " ".join(parts)
            else:
                prompt = self.body.get("prompt")
                self._text = prompt if isinstance(prompt, str) else json.dumps(prompt)
        return self._text


class ReplicaView:
    """One replica as a gateway sees it: its URL, the requests the gateway has in flight
    on it, and (for peers that read the engines' own state, as KV-event and metrics
    scorers do) its engine."""

    __slots__ = ("engine", "index", "inflight", "name", "url")

    def __init__(self, index: int, name: str, url: str, engine: Engine) -> None:
        self.index = index
        self.name = name
        self.url = url
        self.engine = engine
        self.inflight = 0
        """Requests the gateway sent there that have not finished (the router's load)."""

    @property
    def queued(self) -> int:
        """Requests waiting in the engine's queue (vLLM's ``num_requests_waiting``)."""
        return self.engine.num_waiting

    @property
    def running(self) -> int:
        """Requests running in the engine's batch (``num_requests_running``)."""
        return len(self.engine.running)

    @property
    def kv_usage(self) -> float:
        """The engine's KV-cache usage, 0..1 (``kv_cache_usage_perc``)."""
        kv = self.engine.kv
        return kv.used / kv.capacity if kv.capacity else 0.0

    def cached_blocks(self, prompt: Prompt) -> int:
        """Blocks of ``prompt``'s prefix the engine holds on the accelerator now (what a
        KV-event indexer knows: exact, no text approximation)."""
        return self.engine.kv.match(prompt.runs, 1 << 62).gpu_blocks


class PeerPolicy:
    """A peer's routing (and optionally scheduling) policy; the defaults do nothing.

    The gateway calls, per generation request: :meth:`admit` (await until the request may
    be dispatched; a scheduling peer queues here), :meth:`pick` (the replica's index),
    then :meth:`reply_headers` for the response, :meth:`started` when the reply begins,
    and :meth:`done` when the reply has
    finished (or failed, or the client went away). :meth:`control` answers the peer's
    own endpoints (``POST /finish_session``).
    """

    name = "policy"
    source = ""
    """The peer's source file this model follows (for docs and the bench's output)."""

    def bind(self, replicas: Sequence[ReplicaView]) -> None:
        """Called once with the replicas, before any request."""
        self.replicas = replicas

    async def admit(self, req: GatewayRequest) -> None:
        """Wait until ``req`` may be dispatched (default: at once)."""

    def pick(self, req: GatewayRequest, now: float) -> int:
        """The index of the replica ``req`` goes to (``now``: the gateway's clock)."""
        raise NotImplementedError

    def reply_headers(self, req: GatewayRequest, index: int) -> list[tuple[bytes, bytes]]:
        """Headers the peer adds to the reply (llm-d's ``x-session-token``)."""
        return []

    def started(self, req: GatewayRequest, index: int, now: float) -> None:
        """The reply to ``req`` from replica ``index`` began (its first streamed chunk: the
        prompt's prefill is done), or, not streamed, arrived whole."""

    def done(self, req: GatewayRequest, index: int, now: float) -> None:
        """``req`` finished on replica ``index`` (its reply ended, failed or was dropped)."""

    def stats(self) -> dict[str, Any] | None:
        """The peer's own counters for a report (a scheduling peer's holds, pauses and
        resumes), or None."""
        return None

    def control(
        self, path: str, params: dict[str, str], body: dict[str, Any]
    ) -> tuple[int, dict[str, Any]] | None:
        """A POST to ``path`` (its query ``params``, its JSON ``body``) other than a
        generation: a status and a JSON answer, or None (404)."""
        return None
