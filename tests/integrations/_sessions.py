"""A transport that records the session of each chat request, read from its ``x-agentrt``
header as a server reads it."""

from __future__ import annotations

import httpx

from agentrt._protocol import parse_agentrt_header


class SessionRecorder(httpx.AsyncBaseTransport):
    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.sessions: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/chat/completions"):
            self.sessions.append(parse_agentrt_header(request.headers["x-agentrt"]).session_id)
        return await self.inner.handle_async_request(request)
