"""A tiny OpenAI-compatible fake for wire-format unit tests (httpx.MockTransport)."""

from __future__ import annotations

import importlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx


def _http_libs() -> list[Any]:
    out = [importlib.import_module("httpx")]
    try:  # httpx2 comes with openai 3; with openai 2 only httpx is there
        out.append(importlib.import_module("httpx2"))
    except ImportError:
        pass
    return out


HTTP_LIBS = _http_libs()
"""The HTTP libraries a runtime may speak (legacy httpx, and httpx2 where installed), for
tests parametrized over both."""


def chat_completion(
    message: dict[str, Any],
    usage: dict[str, Any],
    *,
    model: str = "m",
    finish_reason: str = "stop",
) -> dict[str, Any]:
    """A ``chat.completion`` object with one choice, ``message``."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": usage,
    }


def sse_event(obj: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``obj``."""
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


@dataclass
class Seen:
    url: str
    headers: httpx.Headers
    body: dict[str, Any]


@dataclass
class FakeEngine:
    """Answers chat and completion requests; records what it saw."""

    delay_s: float = 0.0
    prompt_tokens: int = 10
    completion_tokens: int = 5
    cached_tokens: int = 0
    seen: list[Seen] = field(default_factory=list)
    metrics_polls: int = 0
    script: list[Callable[[httpx.Request], httpx.Response | None]] = field(default_factory=list)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path.endswith("/metrics"):
            # A runtime with several endpoints polls them (at a random moment): not a
            # call, so not in ``seen``; a fake engine serves no metrics.
            self.metrics_polls += 1
            return httpx.Response(404, text="Not Found")
        body = json.loads(request.content) if request.content else {}
        self.seen.append(Seen(str(request.url), request.headers, body))
        if self.script:
            step = self.script.pop(0)
            out = step(request)
            if out is not None:
                return out
        if self.delay_s:
            await anyio.sleep(self.delay_s)
        usage = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }
        if request.url.path.endswith("/completions") and "chat" not in request.url.path:
            return httpx.Response(
                200,
                json={
                    "id": "cmpl-1",
                    "object": "text_completion",
                    "created": 0,
                    "model": body.get("model", "m"),
                    "choices": [{"index": 0, "text": "hi", "finish_reason": "length"}],
                    "usage": usage,
                },
            )
        if body.get("stream"):
            return httpx.Response(
                200,
                headers={"content-type": "text/event-stream"},
                content=self._sse(body, usage),
            )
        return httpx.Response(
            200,
            json=chat_completion(
                {"role": "assistant", "content": "hello"}, usage, model=body.get("model", "m")
            ),
        )

    async def _sse(self, body: dict[str, Any], usage: dict[str, Any]) -> AsyncIterator[bytes]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            obj = {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": body.get("model", "m"),
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return sse_event(obj)

        yield chunk({"role": "assistant", "content": ""})
        for word in ("a", "b", "c"):
            await anyio.sleep(0.001)
            yield chunk({"content": word})
        yield chunk({}, "stop")
        if (body.get("stream_options") or {}).get("include_usage"):
            obj = {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "m",
                "choices": [],
                "usage": usage,
            }
            yield sse_event(obj)
        yield b"data: [DONE]\n\n"


MSG = [{"role": "user", "content": "hi"}]
