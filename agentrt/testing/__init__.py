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
    Replica,
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
    "Replica",
    "ReplicaSpec",
    "find_engine",
    "launch",
    "parse_prometheus",
    "start_replica",
    "start_replicas",
]
