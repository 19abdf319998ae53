"""Serving a cluster in wall-clock time on loopback with uvicorn (the ``serve`` extra).

One port serves every replica under a path prefix: replica ``i`` is
``http://HOST:PORT/replica-i/v1``. ``GET /`` lists them.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import anyio
from anyio.abc import TaskStatus

from ._cluster import Cluster
from ._config import EngineConfig

__all__ = ["serve", "serve_async"]

_MISSING_UVICORN = (
    "serving the simulator needs uvicorn, which is not installed; "
    "install it with: pip install 'agentrt[serve]'"
)


def _import_uvicorn() -> Any:
    try:
        import uvicorn
    except ImportError as e:
        raise RuntimeError(_MISSING_UVICORN) from e
    return uvicorn


def served_urls(host: str, port: int, replicas: int) -> tuple[str, ...]:
    """The base URLs :func:`serve` gives its replicas."""
    shown = f"[{host}]" if ":" in host else host
    return tuple(f"http://{shown}:{port}/replica-{i}/v1" for i in range(replicas))


async def serve_async(
    replicas: int = 1,
    host: str = "127.0.0.1",
    port: int = 8000,
    preset: EngineConfig | str = "h100-8b",
    *,
    log_level: str = "warning",
    on_ready: Callable[[tuple[str, ...]], None] | None = None,
    task_status: TaskStatus[tuple[str, ...]] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``replicas`` simulated engines until cancelled (asyncio backend only).

    ``port=0`` picks a free port. ``task_status.started`` (for ``TaskGroup.start``) and
    ``on_ready`` receive the replicas' base URLs once the socket listens.
    """
    uvicorn = _import_uvicorn()
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            "serve_async needs the asyncio backend (uvicorn runs on asyncio)"
        ) from None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
        sock.setblocking(False)
        bound_port = sock.getsockname()[1]
        async with Cluster(replicas, preset) as cluster:
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

            urls = served_urls(host, bound_port, replicas)
            async with anyio.create_task_group() as tg:
                tg.start_soon(run_server)
                await ready.wait()
                if done.is_set():
                    raise RuntimeError(f"the simulator's server did not start on {host}:{port}")
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


def serve(
    replicas: int = 1,
    host: str = "127.0.0.1",
    port: int = 8000,
    preset: EngineConfig | str = "h100-8b",
    *,
    log_level: str = "info",
    on_ready: Callable[[tuple[str, ...]], None] | None = None,
) -> None:
    """Serve ``replicas`` simulated engines in wall-clock time until interrupted (Ctrl-C).

    Blocking; for ``agentrt sim serve``. Replica ``i`` answers at
    ``http://HOST:PORT/replica-i/v1``; ``on_ready`` receives those URLs once listening.
    """
    _import_uvicorn()  # fail early with the install hint
    anyio.run(
        lambda: serve_async(replicas, host, port, preset, log_level=log_level, on_ready=on_ready),
        backend="asyncio",
    )
