"""Serving a cluster in wall-clock time on loopback with uvicorn (the ``serve`` extra).

One port serves the OpenAI API at ``http://HOST:PORT/v1`` (the front door: with one
replica, that replica; with several, round-robin per request, as a plain load balancer
spreads them) and every replica under a path prefix: replica ``i`` is
``http://HOST:PORT/replica-i/v1``. ``GET /`` lists them.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from anyio.abc import TaskStatus

from ._app import ReplicaApp
from ._cluster import Cluster
from ._config import EngineConfig

__all__ = ["ServeError", "ServedURLs", "serve", "serve_async"]


class ServeError(RuntimeError):
    """The embedded engine's server could not start: uvicorn is missing, the port is in use, the
    address cannot be bound. The message is one line saying what to do."""


_MISSING_UVICORN = (
    "serving the embedded engine needs uvicorn, which is not installed; "
    "install it with: pip install 'agentjct[serve]'"
)


def _import_uvicorn() -> Any:
    try:
        import uvicorn
    except ImportError as e:
        raise ServeError(_MISSING_UVICORN) from e
    return uvicorn


class ServedURLs(tuple[str, ...]):
    """The replicas' base URLs (``http://HOST:PORT/replica-i/v1``, in order), and in
    :attr:`url` the front door ``http://HOST:PORT/v1`` that serves them all."""

    url: str
    """The OpenAI base URL of the whole cluster: the replica itself when there is one,
    round-robin per request over the replicas when there are several."""

    model: str | None
    """The model name the replicas serve (``GET /v1/models``), when known."""

    gateway: str | None
    """The modelled peer at the front door (``serve(gateway=...)``), or None."""

    def __new__(
        cls,
        url: str,
        replicas: tuple[str, ...],
        model: str | None = None,
        gateway: str | None = None,
    ) -> ServedURLs:
        self = super().__new__(cls, replicas)
        self.url = url
        self.model = model
        self.gateway = gateway
        return self

    def lines(self) -> list[str]:
        """What ``agentrt sim serve`` prints on start-up: each URL and what it serves."""
        width = max(len(self.url), *(len(u) for u in self))
        what = "1 replica" if len(self) == 1 else f"round-robin over {len(self)} replicas"
        if self.gateway is not None:
            what = "the gateway below"
        out = [f"{self.url:<{width}}  OpenAI API ({what})"]
        out += [f"{u:<{width}}  replica {i}" for i, u in enumerate(self)]
        if self.gateway is not None:
            out.append(f"gateway: {self.gateway} (a modelled peer)")
        if self.model is not None:
            out.append(f"model: {self.model}")
        return out


def served_urls(
    host: str, port: int, replicas: int, model: str | None = None, gateway: str | None = None
) -> ServedURLs:
    """The URLs :func:`serve` serves: the front door and each replica's base URL."""
    shown = f"[{host}]" if ":" in host else host
    origin = f"http://{shown}:{port}"
    return ServedURLs(
        f"{origin}/v1", tuple(f"{origin}/replica-{i}/v1" for i in range(replicas)), model, gateway
    )


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket, or a one-line :class:`ServeError` saying what to do."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise ServeError(f"cannot serve on host {host!r}: {e}; pick another with --host") from None
    family = infos[0][0] if infos else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(infos[0][4])
        sock.listen(2048)
        sock.setblocking(False)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ServeError(f"port {port} on {host} is in use; pick another with --port") from None
        if e.errno in (errno.EACCES, errno.EPERM):
            raise ServeError(
                f"no permission to listen on port {port} on {host}; "
                "pick a port above 1023 with --port"
            ) from None
        raise ServeError(
            f"cannot listen on {host}:{port}: {e.strerror or e}; "
            "pick another address with --host/--port"
        ) from None
    return sock


async def serve_async(
    replicas: int = 1,
    host: str = "127.0.0.1",
    port: int = 8000,
    preset: EngineConfig | str = "h100-8b",
    *,
    log_level: str = "warning",
    on_ready: Callable[[ServedURLs], None] | None = None,
    gateway: str | None = None,
    kv_events_port: int | None = None,
    task_status: TaskStatus[ServedURLs] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``replicas`` simulated engines until cancelled (asyncio backend only).

    ``port=0`` picks a free port. ``task_status.started`` (for ``TaskGroup.start``) and
    ``on_ready`` receive the :class:`ServedURLs` once the socket listens: the replicas'
    base URLs, and in ``.url`` the front door ``http://HOST:PORT/v1``. A port in use,
    an address that cannot be bound or a missing uvicorn raise :class:`ServeError` before
    anything starts. ``gateway``: a modelled peer (:mod:`agentrt.sim.peers`, e.g.
    ``"vllm-router:cache_aware"``) answers the front door instead of the round-robin.
    ``kv_events_port``: replica ``i`` publishes its KV-cache events on ZMQ at
    ``tcp://HOST:kv_events_port+i``, as vLLM's ``--kv-events-config`` (``_kvpublish``),
    and lists it at ``GET /replica-i/kv_event_sources``.
    """
    uvicorn = _import_uvicorn()
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            "serve_async needs the asyncio backend (uvicorn runs on asyncio)"
        ) from None
    sock = _bind(host, port)
    try:
        bound_port = sock.getsockname()[1]
        async with (
            Cluster(replicas, preset, gateway=gateway) as cluster,
            _publishing(cluster, host, kv_events_port),
        ):
            config = uvicorn.Config(
                cluster.asgi_app(),
                lifespan="off",
                log_level=log_level,
                access_log=False,
                timeout_graceful_shutdown=2,
            )
            ready = anyio.Event()

            class _Server(uvicorn.Server):  # type: ignore[misc,name-defined]
                async def startup(self, sockets: Any = None) -> None:
                    await super().startup(sockets=sockets)
                    ready.set()

            server = _Server(config)
            done = anyio.Event()

            async def run_server() -> None:
                try:
                    with anyio.CancelScope(shield=True):
                        await server.serve(sockets=[sock])
                finally:
                    done.set()
                    ready.set()

            name = None if cluster.gateway is None else cluster.gateway.policy.name
            urls = served_urls(host, bound_port, replicas, cluster.config.model_name, name)
            async with anyio.create_task_group() as tg:
                tg.start_soon(run_server)
                await ready.wait()
                if done.is_set():
                    raise ServeError(f"the embedded engine's server did not start on {host}:{port}")
                if on_ready is not None:
                    on_ready(urls)
                task_status.started(urls)
                try:
                    await done.wait()
                finally:
                    server.should_exit = True
                    with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                        await done.wait()
    finally:
        sock.close()


@contextlib.asynccontextmanager
async def _publishing(cluster: Cluster, host: str, port: int | None) -> AsyncIterator[None]:
    """While it lasts, each replica's KV-cache events go out on ZMQ (``port`` + its
    index), if ``port`` is given."""
    if port is None:
        yield
        return
    from ._kvpublish import ZmqPublisher, sources_reply

    bind = "*" if host in ("0.0.0.0", "::", "") else host
    opened: list[tuple[ZmqPublisher, Callable[[], None]]] = []
    try:
        for r in cluster.replicas:
            try:
                publisher = ZmqPublisher(f"tcp://{bind}:{port + r.index}")
            except RuntimeError as exc:
                raise ServeError(str(exc)) from None
            opened.append((publisher, r.engine.subscribe_kv(publisher)))
            if isinstance(r.app, ReplicaApp):
                r.app.kv_event_sources = sources_reply(publisher.address)
        yield
    finally:
        for publisher, unsubscribe in opened:
            unsubscribe()
            publisher.close()


def serve(
    replicas: int = 1,
    host: str = "127.0.0.1",
    port: int = 8000,
    preset: EngineConfig | str = "h100-8b",
    *,
    log_level: str = "info",
    on_ready: Callable[[ServedURLs], None] | None = None,
    gateway: str | None = None,
    kv_events_port: int | None = None,
) -> None:
    """Serve ``replicas`` simulated engines in wall-clock time until interrupted (Ctrl-C).

    Blocking; for ``agentrt sim serve``. The OpenAI API is at ``http://HOST:PORT/v1``
    (round-robin per request over several replicas), replica ``i`` at
    ``http://HOST:PORT/replica-i/v1``; ``on_ready`` receives the :class:`ServedURLs` once
    listening (``urls.lines()`` is what to print). Raises :class:`ServeError` (one line)
    when uvicorn is missing or the port is in use or cannot be bound.
    """
    _import_uvicorn()  # fail early with the install hint
    anyio.run(
        lambda: serve_async(
            replicas,
            host,
            port,
            preset,
            log_level=log_level,
            on_ready=on_ready,
            gateway=gateway,
            kv_events_port=kv_events_port,
        ),
        backend="asyncio",
    )
