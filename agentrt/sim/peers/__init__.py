"""Modelled peers: the routers and gateways a team deploys in front of its engines instead
of (or beside) agentrt, as a gateway in front of the simulated replicas (docs/sim.md,
"Peers"). One small module per peer, each citing the source it follows:

- ``_vllm_router``: vllm-project/router's ``round_robin``, ``cache_aware``,
  ``consistent_hash``, ``sticky_least_loaded``;
- ``_vllm_router_programs``: its program scheduling (``--enable-program-scheduling``)
  over ``consistent_hash``;
- ``_llmd``: llm-d's endpoint picker, ``llm-d`` (precise prefix + load scorers, as its
  precise-prefix guide configures it, with the information a deployment has: metrics
  scraped every 50 ms, KV events applied late, 64-token index blocks), ``llm-d:ideal``
  (the same scoring on live metrics and an exact index), ``llm-d:affinity`` (plus the
  session-affinity scorer), ``llm-d:flow`` (plus flow control as it comes by default: the
  saturation detector's gate, one first-come first-served queue, a 60 s queue budget) and
  ``llm-d:fairness`` (plus ``program-aware-fairness`` flow control);
- ``_dynamo``: NVIDIA Dynamo's KV router, ``dynamo`` and ``dynamo:affinity`` (session
  affinity, TTL 300 s);
- ``_thunderagent``: Dynamo's experimental ThunderAgent router, ``thunderagent``
  (program-level pause and resume at tool boundaries in front of Dynamo's KV router) and
  ``thunderagent:home`` (resuming a program only where it was paused: not Dynamo's);

Use one by name: ``Cluster(8, gateway="vllm-router:cache_aware")``,
``agentrt bench --client "plain>vllm-router:cache_aware"``,
``agentrt sim serve --gateway vllm-router:cache_aware``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from ._base import GatewayRequest, PeerPolicy, ReplicaView
from ._dynamo import Dynamo, DynamoAffinity
from ._gateway import GatewayApp
from ._llmd import LLMD, LLMDAffinity, LLMDFairness, LLMDFlow, LLMDIdeal
from ._thunderagent import ThunderAgent, ThunderAgentHome
from ._vllm_router import CacheAware, ConsistentHash, PeerRoundRobin, StickyLeastLoaded
from ._vllm_router_programs import ProgramScheduling

__all__ = [
    "PEERS",
    "GatewayApp",
    "GatewayRequest",
    "PeerPolicy",
    "ReplicaView",
    "make_policy",
    "peer_dialect",
    "peer_name",
]

PEERS: Final[dict[str, Callable[[], PeerPolicy]]] = {
    "vllm-router:round_robin": PeerRoundRobin,
    "vllm-router:cache_aware": CacheAware,
    "vllm-router:consistent_hash": ConsistentHash,
    "vllm-router:sticky_least_loaded": StickyLeastLoaded,
    "vllm-router:programs": ProgramScheduling,
    "llm-d": LLMD,
    "llm-d:ideal": LLMDIdeal,
    "llm-d:affinity": LLMDAffinity,
    "llm-d:flow": LLMDFlow,
    "llm-d:fairness": LLMDFairness,
    "dynamo": Dynamo,
    "dynamo:affinity": DynamoAffinity,
    "thunderagent": ThunderAgent,
    "thunderagent:home": ThunderAgentHome,
}
"""The modelled peers by name: a factory of a fresh policy each."""

_ALIASES: Final = {"vllm-router": "vllm-router:cache_aware"}


def peer_name(name: str) -> str:
    """The canonical name of the peer ``name`` (an alias resolved); a :class:`ValueError`
    names the known ones."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in PEERS:
        raise ValueError(f"unknown gateway {name!r}; known: {', '.join(sorted(PEERS))}")
    return key


def make_policy(name: str) -> PeerPolicy:
    """A fresh policy of the peer ``name`` (see :data:`PEERS`)."""
    return PEERS[peer_name(name)]()


_DIALECTS: Final = (
    ("vllm-router:programs", "vllm-router-agentic"),
    ("vllm-router", "vllm-router"),
    ("llm-d", "llm-d"),
    ("dynamo", "dynamo"),
    ("thunderagent", "dynamo"),
    ("sglang", "sglang"),
)


def peer_dialect(name: str) -> str:
    """The agentrt dialect that speaks to the peer ``name``: what agentrt sends it by
    default in ``agentrt bench --client "agentrt...>PEER"``."""
    key = peer_name(name)
    for prefix, dialect in _DIALECTS:
        if key.startswith(prefix):
            return dialect
    return "vllm"
