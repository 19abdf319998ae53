"""Engine configuration and the cost-model presets (sources in docs/sim.md)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Literal

from ._cost import CostModel

__all__ = [
    "PRESETS",
    "EngineConfig",
    "FinalPolicy",
    "KVPolicy",
    "Replies",
    "SchedulingPolicy",
    "resolve_config",
]

SchedulingPolicy = Literal["fcfs", "priority"]
Replies = Literal["filler", "agent"]
KVPolicy = Literal["lru", "keep", "pin", "offload", "drop", "adaptive", "resume"]

FinalPolicy = Literal["lru", "drop"]

_KV_POLICIES: Final = ("lru", "keep", "pin", "offload", "drop", "adaptive", "resume")
_FINAL_POLICIES: Final = ("lru", "drop")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything one simulated replica needs: limits, KV cache, policies, cost model.

    The defaults are the ``h100-8b`` preset's (vLLM's own defaults where it has one).
    :meth:`replace` derives a variant; instances are immutable.
    """

    cost: CostModel = field(default_factory=lambda: CostModel(6.2e-3, 32e-6, 120e-6, 51e-9, 1.0e-9))
    model_name: str = "sim-model"
    """The name ``/v1/models`` lists (first). Requests name it, one of
    ``served_model_names``, or (when that is None) any model; the reply echoes it."""
    served_model_names: tuple[str, ...] | None = None
    """The model names requests may ask for (vLLM's ``--served-model-name``; the first
    is ``model_name``): another is answered 404 ``model_not_found``, as vLLM and OpenAI
    answer. None: any name (the in-process default, which tests and the bench use).
    ``agentrt sim serve`` serves the preset's name only."""
    block_size: int = 16
    """Tokens per KV block (vLLM's ``--block-size``); prefix caching works per block."""
    num_gpu_blocks: int = 26_624
    """KV blocks on the accelerator."""
    num_host_blocks: int = 0
    """KV blocks in the host-memory tier (0: no host tier). Blocks evicted from the
    accelerator spill there; a prefix hit on them loads them back at ``host_bandwidth``."""
    host_bandwidth: float = 25e9
    """Host-to-accelerator bytes per second for loading offloaded KV blocks."""
    kv_bytes_per_token: int = 131_072
    """KV-cache bytes per token (sets the host-tier transfer time)."""
    max_num_seqs: int = 1024
    """Most requests running at once (vLLM ``--max-num-seqs``)."""
    max_num_batched_tokens: int = 8192
    """Token budget of one step (vLLM ``--max-num-batched-tokens``); prefills are chunked
    to fit it."""
    long_prefill_token_threshold: int = 0
    """Cap on one request's prefill chunk per step (0: only the budget caps it)."""
    max_model_len: int | None = None
    """Longest prompt + output accepted (None: limited by the KV capacity only)."""
    scheduling: SchedulingPolicy = "fcfs"
    """``fcfs`` or ``priority`` (lower ``priority`` first, then arrival), as in vLLM."""
    tool_wait_policy: KVPolicy = "lru"
    """What happens to a session's KV while it waits on a tool (the wait its call declared
    as ``idle-exp`` in ``x-agentrt``, or a tool-start notice's ``expected_s``): ``lru``
    nothing (today's engines); ``keep``/``pin`` pin it for the wait plus ``pin_margin_s``;
    ``offload`` move it to the host tier when the wait exceeds the transfer break-even and
    prefetch it back for the expected resume (else pin); ``drop`` free it at once;
    ``adaptive`` choose among these by KV memory pressure; ``resume`` leave the KV in place
    but evict by declared resume time (the leaf expected back last first, Belady-like) and
    prefetch what was spilled to the host tier for the expected resume (docs/sim.md)."""
    final_policy: FinalPolicy = "lru"
    """What happens to a session's KV when its declared last call (``final`` in
    ``x-agentrt``: ``session.chat(..., final=True)`` or ``expect_final()``) finishes:
    ``lru`` nothing, LRU decides (today's engines, vLLM's); ``drop`` free the session's own
    blocks at once (those no other session used: a shared prefix stays cached) and forget
    the session, superseding a pending tool-wait pin or prefetch (docs/sim.md)."""
    retention_directives: bool = False
    """Honour retention directives (docs/sim.md): when a request finishes, what it said
    about its session (``x-agentrt``'s ``final`` and ``idle-exp``, the facts every
    retention dialect is made of) orders this replica's evictions: an ended session's own
    blocks go first, then blocks without a directive or whose retention ran out (LRU),
    then retained blocks, those whose session wakes latest first (retained until the
    expected wake-up plus ``pin_margin_s``). Off: plain LRU, as released vLLM. Not with
    ``tool_wait_policy='resume'`` (both order eviction by wake-up)."""
    pin_margin_s: float = 2.0
    """Extra seconds a pin lasts beyond the expected wait (also for prefetched blocks and
    for a retention directive's window)."""
    offload_margin_s: float = 1.0
    """Seconds a wait must exceed the write-out plus read-back time of the session's blocks
    (at ``host_bandwidth``) before ``offload`` and ``adaptive`` move them to the host."""
    adaptive_pressure: float = 0.6
    """``adaptive``: the KV pressure (blocks referenced or pinned plus the blocks queued
    requests need, over ``num_gpu_blocks``) from which no wait is pinned past the
    break-even: it is offloaded instead."""
    adaptive_pin_max_s: float = 10.0
    """``adaptive``: below ``adaptive_pressure``, a wait up to this long is pinned; a longer
    one is offloaded (past the break-even, with room on the host) or left to LRU."""
    adaptive_max_wait_s: float = 300.0
    """``adaptive``: a longer wait is left to LRU, or dropped under pressure."""
    request_overhead_s: float = 0.0
    """Seconds the API server spends on a request before the engine sees it (HTTP,
    parsing, tokenizing); fitted for ``cpu-tiny``, negligible for ``h100-8b``."""
    default_max_tokens: int = 16
    """Output length when a request gives no ``max_tokens``."""
    stream_interval: int = 1
    """Tokens per streamed chunk (vLLM ``--stream-interval``); larger values let the engine
    advance long decodes in bigger leaps."""
    cache_output_blocks: bool = True
    """Cache the full blocks of generated text too (as vLLM does), so a next turn that
    sends the reply back hits them."""
    replies: Replies = "filler"
    """What replies say: ``filler`` (deterministic filler text of the requested length) or
    ``agent`` (follow ``CALL``/``ANSWER`` directives in the last user message: tool calls
    for agent frameworks, see ``agentrt.sim._replies``)."""

    def __post_init__(self) -> None:
        positive = (
            "block_size",
            "num_gpu_blocks",
            "max_num_seqs",
            "max_num_batched_tokens",
            "default_max_tokens",
            "stream_interval",
            "kv_bytes_per_token",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"EngineConfig.{name} must be an int > 0, got {value!r}")
        if self.num_host_blocks < 0 or self.long_prefill_token_threshold < 0:
            raise ValueError("num_host_blocks and long_prefill_token_threshold must be >= 0")
        if not (self.request_overhead_s >= 0 and math.isfinite(self.request_overhead_s)):
            raise ValueError("request_overhead_s must be a finite number >= 0")
        if self.host_bandwidth <= 0 or self.pin_margin_s < 0:
            raise ValueError("host_bandwidth must be > 0 and pin_margin_s >= 0")
        for name in (
            "pin_margin_s",
            "offload_margin_s",
            "adaptive_pin_max_s",
            "adaptive_max_wait_s",
        ):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"EngineConfig.{name} must be a finite number >= 0, got {value!r}")
        if not 0.0 <= self.adaptive_pressure <= 1.0:
            raise ValueError(
                f"EngineConfig.adaptive_pressure must be in [0, 1], got {self.adaptive_pressure!r}"
            )
        if self.max_model_len is not None and self.max_model_len <= 0:
            raise ValueError("max_model_len must be > 0 or None")
        names = self.served_model_names
        if names is not None:
            if not names or not all(isinstance(n, str) and n for n in names):
                raise ValueError(
                    f"served_model_names must be non-empty names or None, got {names!r}"
                )
            if names[0] != self.model_name:
                raise ValueError(
                    f"served_model_names[0] must be the model_name {self.model_name!r}, "
                    f"got {names!r}"
                )
        if self.replies not in ("filler", "agent"):
            raise ValueError(f"replies must be 'filler' or 'agent', got {self.replies!r}")
        if self.scheduling not in ("fcfs", "priority"):
            raise ValueError(f"scheduling must be 'fcfs' or 'priority', got {self.scheduling!r}")
        if self.tool_wait_policy not in _KV_POLICIES:
            raise ValueError(
                f"tool_wait_policy must be one of {_KV_POLICIES}, got {self.tool_wait_policy!r}"
            )
        if self.final_policy not in _FINAL_POLICIES:
            raise ValueError(
                f"final_policy must be one of {_FINAL_POLICIES}, got {self.final_policy!r}"
            )
        if not isinstance(self.retention_directives, bool):
            raise TypeError("EngineConfig.retention_directives must be a bool")
        if self.retention_directives and self.tool_wait_policy == "resume":
            raise ValueError(
                "retention_directives and tool_wait_policy='resume' both order eviction by "
                "wake-up time; choose one"
            )
        if self.tool_wait_policy == "offload" and self.num_host_blocks == 0:
            raise ValueError("tool_wait_policy='offload' needs a host tier: set num_host_blocks")
        if not isinstance(self.cost, CostModel):
            raise TypeError("EngineConfig.cost must be a CostModel")

    def replace(self, **changes: object) -> EngineConfig:
        """A copy with the given fields changed."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @property
    def block_transfer_s(self) -> float:
        """Seconds to move one KV block between the host tier and the accelerator."""
        return self.block_size * self.kv_bytes_per_token / self.host_bandwidth


# Llama-3.1-8B (BF16) on one H100 SXM5 80GB, vLLM-like defaults. Derivation in docs/sim.md.
_H100_8B: Final = EngineConfig(
    cost=CostModel(
        step_s=6.2e-3,
        prefill_token_s=32e-6,
        decode_seq_s=120e-6,
        decode_context_token_s=51e-9,
        prefill_pair_s=1.0e-9,
    ),
    model_name="sim-llama-3.1-8b",
    block_size=16,
    num_gpu_blocks=26_624,
    kv_bytes_per_token=131_072,
    host_bandwidth=25e9,
    max_num_seqs=1024,
    max_num_batched_tokens=8192,
)

# The tiny 2-layer Llama (hidden 256, 4 KV heads x 64, bf16) on vLLM's CPU build, as
# agentrt.testing.vllm_cpu starts it: 128-token blocks, 1 GiB of KV, max_model_len 4096.
# Cost numbers fitted with python -m benchmarks twin fidelity (probe_engine + calibrate) against one
# replica whose worker runs on one core of this 2-core machine (docs/sim.md).
_CPU_TINY: Final = EngineConfig(
    cost=CostModel(
        step_s=1.04e-3,
        prefill_token_s=24.6e-6,
        decode_seq_s=378e-6,
        decode_context_token_s=0.0,
        prefill_pair_s=0.0,
    ),
    model_name="tiny-llama",
    block_size=128,
    num_gpu_blocks=4096,
    kv_bytes_per_token=2048,
    host_bandwidth=10e9,
    max_num_seqs=256,
    max_num_batched_tokens=2048,
    max_model_len=4096,
    request_overhead_s=4.6e-3,
)

PRESETS: Final[Mapping[str, EngineConfig]] = MappingProxyType(
    {"h100-8b": _H100_8B, "cpu-tiny": _CPU_TINY}
)
"""Named engine configurations: ``h100-8b`` and ``cpu-tiny`` (sources in docs/sim.md)."""


def resolve_config(config: EngineConfig | str) -> EngineConfig:
    """An :class:`EngineConfig` from itself or a preset name."""
    if isinstance(config, EngineConfig):
        return config
    try:
        return PRESETS[config]
    except KeyError:
        raise ValueError(
            f"unknown engine preset {config!r}; known presets: {', '.join(sorted(PRESETS))}"
        ) from None
