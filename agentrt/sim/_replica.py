"""One simulated replica: its engine, its ASGI app and its base URL. A room of its own so that
the cluster and the peers' gateway in front of it both read it without importing each other."""

from __future__ import annotations

from ._app import ASGIApp, ReplicaApp, render_metrics
from ._config import EngineConfig
from ._engine import Engine, ReplicaStats

__all__ = ["Replica"]


class Replica:
    """One simulated engine: its ASGI app, its base URL and its statistics."""

    def __init__(self, index: int, config: EngineConfig, host_suffix: str) -> None:
        self.index = index
        self.name = f"replica-{index}"
        self.host = f"{self.name}{host_suffix}"
        self.base_url = f"http://{self.host}/v1"
        """The OpenAI base URL that :meth:`Cluster.transport` routes to this replica."""
        self.config = config
        self.engine = Engine(config, self.name)
        self.app: ASGIApp = ReplicaApp(self.engine)
        """The replica's ASGI application (works only while its cluster runs)."""

    def stats(self) -> ReplicaStats:
        """A frozen snapshot of the engine's state and counters."""
        return self.engine.stats()

    def metrics_text(self) -> str:
        """What ``GET /metrics`` returns."""
        return render_metrics(self.engine)

    def __repr__(self) -> str:
        return f"<Replica {self.name} {self.base_url}>"
