"""A gateway in front of the simulated replicas that routes (and schedules) as a peer does.

:class:`GatewayApp` is an OpenAI-compatible front door at one URL: a client sees one base
URL, as it does in production behind vllm-router, llm-d or Dynamo. Per generation request
it parses the body once, tokenizes the prompt as the replicas do, waits for the peer's
admission (:meth:`PeerPolicy.admit`), asks the peer for a replica
(:meth:`PeerPolicy.pick`) and forwards the request unchanged (headers and body: the
replica reads what it reads behind the real router), counting it in flight there until
its reply ends. The reply goes back with the peer's own headers added (llm-d's
``x-session-token``) and agentrt's ``x-agentrt-accept`` removed: a real router does not
take agentrt's tool-start notices, so agentrt behind a gateway sends none
(``POST /v1/agentrt/idle`` answers 404 here).

Other routes: ``GET /v1/models`` (the first replica's), ``GET /health``, and the peer's
control endpoints (vllm-router's ``POST /finish_session``), else 404.
"""

from __future__ import annotations

import itertools
import json
import urllib.parse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import anyio

from .._app import ReplicaApp, Reply, ReplyStream, _error_body, _HTTPError, _json_reply
from .._tokenize import PromptError
from ._base import GatewayRequest, PeerPolicy, ReplicaView

if TYPE_CHECKING:
    from .._replica import Replica

__all__ = ["GatewayApp"]

_GENERATE: Final = ("/v1/chat/completions", "/v1/completions")
_STRIP: Final = frozenset({b"x-agentrt-accept"})


class _Tracked:
    """A streamed reply that tells the gateway when it ends (read out, or closed)."""

    __slots__ = ("_end", "_first", "_inner")

    def __init__(self, inner: ReplyStream, end: Any, first: Any = None) -> None:
        self._inner = inner
        self._end = end
        self._first = first

    def __aiter__(self) -> _Tracked:
        return self

    async def __anext__(self) -> bytes:
        try:
            chunk = await self._inner.__anext__()
        except BaseException:
            self._finish()
            raise
        first = self._first
        if first is not None:
            self._first = None
            first()
        return chunk

    def close(self) -> None:
        self._inner.close()
        self._finish()

    def _finish(self) -> None:
        end = self._end
        if end is not None:
            self._end = None
            end()


class GatewayApp(ReplicaApp):
    """The front door of a cluster behind a modelled peer (see the module docstring).

    A :class:`ReplicaApp` as far as the ASGI adapter and the in-process transport go: it
    answers through :meth:`respond`.
    """

    def __init__(self, replicas: Sequence[Replica], policy: PeerPolicy) -> None:
        if not replicas:
            raise ValueError("a gateway needs at least 1 replica")
        super().__init__(replicas[0].engine)
        self.replicas = tuple(replicas)
        apps = []
        for r in replicas:
            app = r.app
            if not isinstance(app, ReplicaApp):  # pragma: no cover - replicas only
                raise TypeError(f"{r.name} is not a simulated replica")
            apps.append(app)
        self._apps: tuple[ReplicaApp, ...] = tuple(apps)
        self.policy = policy
        self.views = tuple(
            ReplicaView(r.index, r.name, f"http://{r.host}", r.engine) for r in replicas
        )
        policy.bind(self.views)
        self._seq = itertools.count()
        self.routed = [0] * len(replicas)
        """Generation requests sent to each replica."""

    wants_query = True

    async def respond(
        self, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> Reply:
        path, _, query = path.partition("?")
        try:
            if path in _GENERATE:
                if method != "POST":
                    raise _HTTPError(405, f"{method} is not allowed on {path}")
                return await self._generate_via(path, headers, body)
            if method == "POST":
                params = dict(urllib.parse.parse_qsl(query))
                answer = self.policy.control(path, params, _json_or_empty(body))
                if answer is None:
                    raise _HTTPError(404, f"no route {path} on the {self.policy.name} gateway")
                status, doc = answer
                return _json_reply(status, json.dumps(doc).encode())
            if path in ("/v1/models", "/health"):
                return await self._apps[0].respond(method, path, headers, body)
            raise _HTTPError(404, f"no route {path} on the {self.policy.name} gateway")
        except _HTTPError as e:
            return _json_reply(e.status, _error_body(e))

    async def _generate_via(
        self, path: str, headers: list[tuple[bytes, bytes]], raw: bytes
    ) -> Reply:
        engine = self.replicas[0].engine
        try:
            body = json.loads(raw)
        except ValueError as e:
            raise _HTTPError(400, f"invalid JSON body: {e}") from None
        if not isinstance(body, dict):
            raise _HTTPError(400, "the body must be a JSON object")
        try:
            if path == "/v1/chat/completions":
                prompt = engine.tokenizer.chat(body.get("messages"))
            else:
                prompt = engine.tokenizer.completion(body.get("prompt", ""))
        except PromptError:
            # The replica answers the error, as behind a real router.
            return await self._apps[0].respond("POST", path, headers, raw)
        hdr = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in headers}
        req = GatewayRequest(hdr, body, raw, prompt, anyio.current_time(), next(self._seq))
        policy = self.policy
        await policy.admit(req)
        index = policy.pick(req, anyio.current_time())
        view = self.views[index]
        view.inflight += 1
        self.routed[index] += 1
        finished = False

        def end() -> None:
            nonlocal finished
            if not finished:
                finished = True
                view.inflight -= 1
                policy.done(req, index, anyio.current_time())

        try:
            reply = await self._apps[index].respond("POST", path, headers, raw)
        except BaseException:
            end()
            raise
        extra = policy.reply_headers(req, index)
        reply.headers = [h for h in reply.headers if h[0] not in _STRIP] + extra
        if reply.stream is None:
            policy.started(req, index, _prefill_end(reply, anyio.current_time()))
            end()
        else:
            reply.stream = _Tracked(
                reply.stream, end, lambda: policy.started(req, index, anyio.current_time())
            )
        return reply


def _prefill_end(reply: Reply, now: float) -> float:
    """When the engine produced a whole (not streamed) reply's first token: ``now`` less
    its decode time, read from the replica's ``Server-Timing`` (``engine`` - ``ttft``)."""
    for name, value in reply.headers:
        if name == b"server-timing":
            parts = dict(
                p.strip().split(";dur=", 1) for p in value.decode().split(",") if ";dur=" in p
            )
            try:
                decode = (float(parts["engine"]) - float(parts["ttft"])) / 1e3
            except (KeyError, ValueError):
                return now
            return now - max(decode, 0.0)
    return now


def _json_or_empty(raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}
