"""Helpers shared by the simulator's tests."""

from __future__ import annotations

from typing import Any

import httpx
from trio.testing import MockClock

from agentrt.sim import CostModel, EngineConfig


def virtual_backend() -> tuple[str, dict[str, Any]]:
    """trio with a fresh virtual clock."""
    return ("trio", {"clock": MockClock(autojump_threshold=0)})


FAST = CostModel(
    step_s=1e-3,
    prefill_token_s=1e-6,
    decode_seq_s=1e-5,
    decode_context_token_s=0.0,
    prefill_pair_s=0.0,
)
"""A cost model quick enough for wall-clock tests."""


def small_config(**changes: Any) -> EngineConfig:
    """A small engine: 16-token blocks, the FAST cost model, 1000 blocks."""
    base = EngineConfig(cost=FAST, block_size=16, num_gpu_blocks=1000, model_name="sim-test")
    return base.replace(**changes)


def chat_body(content: str = "hi", **fields: Any) -> dict[str, Any]:
    """A chat completion request's body: model ``m``, one user message, then ``fields``."""
    return {"model": "m", "messages": [{"role": "user", "content": content}], **fields}


async def chat(
    http: httpx.AsyncClient,
    url: str,
    content: str,
    max_tokens: int = 4,
    *,
    headers: dict[str, str] | None = None,
    **body: Any,
) -> dict[str, Any]:
    """POST one chat completion and return the JSON body (asserts 200)."""
    r = await http.post(
        url + "/chat/completions",
        json=chat_body(content, max_tokens=max_tokens, **body),
        headers=headers or {},
    )
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def cached(doc: dict[str, Any]) -> int:
    """``usage.prompt_tokens_details.cached_tokens`` of a response."""
    return int(doc["usage"]["prompt_tokens_details"]["cached_tokens"])
