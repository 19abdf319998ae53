"""A cluster of simulated replicas, owned by a task group (structured concurrency)."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

import anyio
import httpx
from anyio.abc import TaskGroup

from ._app import ASGIApp, ClusterApp
from ._config import EngineConfig, resolve_config
from ._engine import ReplicaStats
from ._replica import Replica
from ._transport import ASGIDispatchTransport
from .peers import GatewayApp, PeerPolicy, make_policy

__all__ = ["Cluster"]


class Cluster:
    """N simulated replicas; an async context manager that runs their engine loops.

    Usage::

        async with Cluster(4, "h100-8b") as cluster:
            http = httpx.AsyncClient(transport=cluster.transport())
            client = openai.AsyncOpenAI(
                base_url=cluster.base_urls[0], api_key="x", http_client=http
            )

    Every replica has its own base URL (``http://replica-<i>.sim/v1``); the transport routes
    by host and streams responses as the engines produce them. ``gateway=`` puts a modelled
    peer (a router such as ``"vllm-router:cache_aware"``, see :mod:`agentrt.sim.peers`) in
    front of them at :attr:`gateway_url`. Under trio's
    ``MockClock(autojump_threshold=0)`` the whole cluster runs in virtual time.
    """

    def __init__(
        self,
        replicas: int = 1,
        config: EngineConfig | str = "h100-8b",
        *,
        host_suffix: str = ".sim",
        gateway: str | PeerPolicy | None = None,
    ) -> None:
        if replicas < 1:
            raise ValueError("a cluster needs at least 1 replica")
        cfg = resolve_config(config)
        self.config = cfg
        self.replicas: tuple[Replica, ...] = tuple(
            Replica(i, cfg, host_suffix) for i in range(replicas)
        )
        self.gateway: GatewayApp | None = None
        """The modelled peer in front of the replicas (``gateway=``), or None."""
        self.gateway_host = f"gateway{host_suffix}"
        if gateway is not None:
            policy = make_policy(gateway) if isinstance(gateway, str) else gateway
            self.gateway = GatewayApp(self.replicas, policy)
        self._tg: TaskGroup | None = None
        self._entered = False

    @property
    def base_urls(self) -> tuple[str, ...]:
        """One OpenAI base URL per replica."""
        return tuple(r.base_url for r in self.replicas)

    @property
    def gateway_url(self) -> str:
        """The gateway's OpenAI base URL (``http://gateway.sim/v1``); a
        :class:`RuntimeError` without one."""
        if self.gateway is None:
            raise RuntimeError("this cluster has no gateway: pass Cluster(gateway=...)")
        return f"http://{self.gateway_host}/v1"

    async def __aenter__(self) -> Cluster:
        if self._entered:
            raise RuntimeError("a Cluster can be entered only once")
        self._entered = True
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        try:
            for r in self.replicas:
                await tg.start(r.engine.run, name=f"agentrt.sim {r.name}")
        except BaseException:
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)
            self._tg = None
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        tg = self._tg
        assert tg is not None
        self._tg = None
        tg.cancel_scope.cancel()
        # The body's own exception propagates unchanged; only the engines' errors, if any,
        # come out of the task group.
        await tg.__aexit__(None, None, None)

    def _spawner(self) -> Callable[..., Any]:
        tg = self._tg
        if tg is None:
            raise RuntimeError("the Cluster is not running: use it inside 'async with'")
        return tg.start_soon

    def transport(self) -> httpx.AsyncBaseTransport:
        """An httpx transport reaching every replica in-process (by URL host)."""
        apps: dict[str, ASGIApp] = {r.host: r.app for r in self.replicas}
        if self.gateway is not None:
            apps[self.gateway_host] = self.gateway
        return ASGIDispatchTransport(apps, self._spawner)

    def asgi_app(self) -> ASGIApp:
        """One ASGI app serving replica ``i`` under the path prefix ``/replica-i``, and the
        gateway (if any) as its front door ``/v1``."""
        return ClusterApp({r.name: r.app for r in self.replicas}, front=self.gateway)

    def stats(self) -> tuple[ReplicaStats, ...]:
        """A snapshot of every replica."""
        return tuple(r.stats() for r in self.replicas)

    def __repr__(self) -> str:
        return f"<Cluster replicas={len(self.replicas)} model={self.config.model_name!r}>"
