"""Test and benchmark helpers for agentrt. Not part of the runtime API.

:mod:`agentrt.testing.vllm_cpu` starts real vLLM CPU replicas (from the engine environment that
``scripts/engine_setup.sh`` builds) on loopback ports.
"""

from agentrt.testing.vllm_cpu import (
    SETUP_COMMAND,
    SETUP_MESSAGE,
    EngineEnv,
    EngineStartError,
    KvEventsSubscriber,
    ReplicaServer,
    ReplicaSpec,
    find_engine,
    launch,
    parse_prometheus,
    start_replica,
    start_replicas,
)

__all__ = [
    "SETUP_COMMAND",
    "SETUP_MESSAGE",
    "EngineEnv",
    "EngineStartError",
    "KvEventsSubscriber",
    "ReplicaServer",
    "ReplicaSpec",
    "find_engine",
    "launch",
    "parse_prometheus",
    "start_replica",
    "start_replicas",
]


def __getattr__(name: str) -> object:
    # Names of 0.2.0 (``Replica``), kept one release with a DeprecationWarning.
    from agentrt.testing import vllm_cpu

    return getattr(vllm_cpu, name)
