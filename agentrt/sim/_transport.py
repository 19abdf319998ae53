"""An httpx transport that calls in-process ASGI apps by host, streaming the response.

httpx's own ``ASGITransport`` buffers the whole response body before returning it. This
one delivers each chunk when the app produces it, so the time to the first streamed token
is the engine's, not the end of the request:

- a simulated replica's app (:class:`ReplicaApp`) is called directly through
  :meth:`ReplicaApp.respond`, in the caller's task: no task per request, and a streamed
  body is produced by the reader's task as the engine emits tokens;
- any other ASGI app runs in a task of the owner's task group, its body handed over chunk
  by chunk as the app sends it.

Closing the response early, or cancelling the call, aborts the request.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import anyio
import httpx

from ._app import INPROCESS_EXTENSION, ASGIApp, Message, ReplicaApp, ReplyStream

if TYPE_CHECKING:
    from ..scheduling._kvevents import KvEvent
    from ._engine import Engine

__all__ = ["ASGIDispatchTransport"]

Spawn = Callable[..., Any]


class _Exchange:
    """One request/response between the transport and an app task."""

    __slots__ = (
        "_ev",
        "body",
        "chunks",
        "closed",
        "done",
        "error",
        "headers",
        "scope",
        "started",
        "status",
    )

    def __init__(self, body: bytes) -> None:
        self.body: bytes | None = body
        self.chunks: deque[bytes] = deque()
        self.started = anyio.Event()
        self.closed = anyio.Event()
        self.status = 500
        self.headers: list[tuple[bytes, bytes]] = []
        self.done = False
        self.error: BaseException | None = None
        self.scope: anyio.CancelScope | None = None
        self._ev: anyio.Event | None = None

    def _wake(self) -> None:
        ev = self._ev
        if ev is not None:
            self._ev = None
            ev.set()

    async def receive(self) -> Message:
        body = self.body
        if body is not None:
            self.body = None
            return {"type": "http.request", "body": body, "more_body": False}
        await self.closed.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status = message["status"]
            self.headers = list(message.get("headers", []))
            self.started.set()
        elif kind == "http.response.body":
            chunk = message.get("body", b"")
            if chunk:
                self.chunks.append(bytes(chunk))
            if not message.get("more_body", False):
                self.done = True
            self._wake()

    async def run(self, app: ASGIApp, scope: dict[str, Any]) -> None:
        with anyio.CancelScope() as cs:
            self.scope = cs
            try:
                await app(scope, self.receive, self.send)
            except Exception as e:  # handed to the client side
                self.error = e
            finally:
                self.done = True
                self.started.set()
                self._wake()

    def cancel(self) -> None:
        self.closed.set()
        if self.scope is not None and not self.done:
            self.scope.cancel()

    async def next_chunk(self) -> bytes | None:
        while True:
            if self.chunks:
                return self.chunks.popleft()
            if self.done:
                if self.error is not None:
                    raise httpx.ReadError(f"simulated server failed: {self.error!r}")
                return None
            ev = self._ev = anyio.Event()
            await ev.wait()


class _Body(httpx.AsyncByteStream):
    """The response body; a plain async iterator (no async generator to finalize)."""

    def __init__(self, exchange: _Exchange) -> None:
        self._x = exchange

    def __aiter__(self) -> _Body:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._x.next_chunk()
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        self._x.cancel()


class _SSEBody(httpx.AsyncByteStream):
    """A replica's streamed reply, read straight from the engine by the caller's task."""

    def __init__(self, stream: ReplyStream) -> None:
        self._stream = stream

    def __aiter__(self) -> _SSEBody:
        return self

    async def __anext__(self) -> bytes:
        return await self._stream.__anext__()

    async def aclose(self) -> None:
        self._stream.close()


class ASGIDispatchTransport(httpx.AsyncBaseTransport):
    """Routes each request to the ASGI app registered for its URL host.

    A generic ASGI app runs in a task started with ``spawn()(fn, *args)`` (a task group's
    ``start_soon``), its body handed over chunk by chunk. A simulated replica's app is
    called directly (:meth:`ReplicaApp.respond`): same requests and replies, no task per
    request, and a streamed body is produced by the reader's own task as the engine emits
    tokens.
    """

    def __init__(self, apps: Mapping[str, ASGIApp], spawn: Callable[[], Spawn]) -> None:
        self._apps = dict(apps)
        self._spawn = spawn
        self._readers: dict[str, tuple[Engine | None]] = {}
        self._posts: dict[str, tuple[ReplicaApp | None, str]] = {}

    def replica_app(self, url: str) -> tuple[ReplicaApp, str] | None:
        """The in-process app (a replica's or a gateway's) that serves ``url`` and the
        path below it (``http://replica-0.sim/v1`` gives the app and ``/v1``), or None for
        any other app or host. The bench's plain clients call :meth:`ReplicaApp.respond`
        through it directly: the requests and replies of an HTTP client, without one."""
        parsed = httpx.URL(url)
        app = self._apps.get(parsed.host)
        if not isinstance(app, ReplicaApp):
            return None
        self._spawn()  # raises when the owner (the cluster) is not running
        return app, parsed.path.rstrip("/")

    def engine_reading(self, url: str) -> tuple[int, int, float] | None:
        """What a GET of ``url`` would show of a simulated replica's load when ``url`` is
        its ``/metrics`` page: ``(running, waiting, kv_usage)``, the values
        ``parse_vllm_metrics`` reads off that page, from the engine without rendering or
        parsing it (agentrt's metrics polls ask this first: a fleet's polls of a long
        replay were most of its CPU). None for any other URL, app or host, or while the
        cluster is not running (then the page is fetched as any other)."""
        cached = self._readers.get(url)
        if cached is None:
            parsed = httpx.URL(url)
            app = self._apps.get(parsed.host)
            engine = None
            if type(app) is ReplicaApp and parsed.path == "/metrics" and not parsed.query:
                engine = app.engine
            cached = self._readers[url] = (engine,)
        engine = cached[0]
        if engine is None or not engine.started:
            return None
        waiting, running, kv_usage = engine.live_metrics()
        return running, waiting, min(max(kv_usage, 0.0), 1.0)

    def engine_capacity(self, url: str) -> int | None:
        """The KV capacity in tokens a simulated replica's ``/metrics`` page at ``url``
        shows in its ``vllm:cache_config_info`` gauge (``num_gpu_blocks * block_size``),
        read from its engine; None for any other URL (see :meth:`engine_reading`)."""
        if self.engine_reading(url) is None:
            return None
        engine = self._readers[url][0]
        if engine is None:  # pragma: no cover - engine_reading said it is there
            return None
        cfg = engine.config
        return int(cfg.num_gpu_blocks * cfg.block_size)

    def engine_host_capacity(self, url: str) -> int | None:
        """The host tier's KV capacity in tokens of the simulated replica at ``url``
        (``num_cpu_blocks * block_size`` on its ``vllm:cache_config_info``), None for any
        other URL or without a host tier."""
        if self.engine_reading(url) is None:
            return None
        engine = self._readers[url][0]
        if engine is None:  # pragma: no cover - engine_reading said it is there
            return None
        cfg = engine.config
        return int(cfg.num_host_blocks * cfg.block_size) or None

    def kv_event_feed(
        self, url: str
    ) -> Callable[[Callable[[list[KvEvent]], None]], Callable[[], None]] | None:
        """Subscribes to the KV-cache events of the simulated replica whose base URL is
        ``url`` (its engine's ``subscribe_kv``): agentrt's ``Endpoint(kv_events=...)``
        reads them in-process, in virtual time, with no socket. None for any other URL."""
        served = self.replica_app(url)
        if served is None or type(served[0]) is not ReplicaApp:
            return None
        return served[0].engine.subscribe_kv

    async def post_status(
        self, url: str, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> int | None:
        """POST ``body`` to ``url`` on a simulated replica without an HTTP request or
        response object: the reply's status (its body unread; a streamed one closed), the
        same the app gives :meth:`handle_async_request`. None where ``url`` is not a
        simulated replica's, or while the cluster is not running: then send it as any
        other. agentrt's tool-start notices take this path (a notice per tool wait)."""
        cached = self._posts.get(url)
        if cached is None:
            parsed = httpx.URL(url)
            app = self._apps.get(parsed.host)
            if isinstance(app, ReplicaApp) and not parsed.query:
                cached = self._posts[url] = (app, parsed.path)
            else:
                cached = self._posts[url] = (None, "")
        app, path = cached
        if app is None or not app.engine.started:
            return None
        self._spawn()  # raises when the owner (the cluster) is not running
        reply = await app.respond("POST", path, headers, body)
        if reply.stream is not None:
            reply.stream.close()
        return reply.status

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        app = self._apps.get(host)
        if app is None:
            raise httpx.ConnectError(
                f"no simulated replica at {host!r}; known: {', '.join(sorted(self._apps))}",
                request=request,
            )
        spawn = self._spawn()  # raises when the owner (the cluster) is not running
        body = await request.aread()
        url = request.url
        if isinstance(app, ReplicaApp):
            path = url.path
            if app.wants_query and url.query:
                path = f"{path}?{url.query.decode('latin-1')}"
            reply = await app.respond(
                request.method, path, [(k.lower(), v) for k, v in request.headers.raw], body
            )
            if reply.stream is not None:
                return httpx.Response(
                    reply.status,
                    headers=reply.headers,
                    stream=_SSEBody(reply.stream),
                    request=request,
                )
            return httpx.Response(
                reply.status,
                headers=reply.headers,
                stream=httpx.ByteStream(reply.body),
                request=request,
            )
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": url.scheme,
            "path": url.path,
            "raw_path": url.raw_path.split(b"?", 1)[0],
            "query_string": url.query,
            "root_path": "",
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "client": ("127.0.0.1", 0),
            "server": (host, url.port or 80),
            "extensions": {INPROCESS_EXTENSION: {}},
        }
        x = _Exchange(body)
        spawn(x.run, app, scope)
        try:
            await x.started.wait()
        except BaseException:
            x.cancel()
            raise
        if x.error is not None:
            raise httpx.RemoteProtocolError(
                f"simulated server failed before responding: {x.error!r}", request=request
            ) from x.error
        return httpx.Response(
            status_code=x.status,
            headers=x.headers,
            stream=_Body(x),
            request=request,
        )
