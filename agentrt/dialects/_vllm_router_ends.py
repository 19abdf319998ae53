"""Telling vllm-router that a session ended: ``POST /finish_session?session_id=ID``.

vllm-router's ``sticky_least_loaded`` policy counts the sessions bound to each worker and
sends a new session to the worker with the fewest; a session it is never told of holds
its count for two hours (vllm-router 0.1.17, ``src/policies/sticky_least_loaded.rs``;
``src/server.rs``, ``finish_session``). :func:`vllm_router_session_ends` is a runtime hook
that posts the end of every session that made a call through the router, from a task of
its own, so the hook itself stays cheap on the call path.

The request is not a dialect field (dialects are pure functions of one call); it is the
one thing agentrt knows only after a session's last call.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:  # imported when used: agentrt.dialects stays cheap to import
    import httpx

    from ..telemetry._events import Event, Hook

__all__ = ["vllm_router_session_ends"]

_MAX_TRACKED: Final = 100_000
"""Sessions remembered as having called (a bound; cleared when full)."""


@asynccontextmanager
async def vllm_router_session_ends(
    router_url: str,
    *,
    timeout_s: float = 5.0,
    transport: httpx.AsyncBaseTransport | None = None,
) -> AsyncIterator[Hook]:
    """A hook that tells the router at ``router_url`` (its root, no ``/v1``) when each
    agentrt session that called it ends. Give it to the runtime, inside this block::

        async with vllm_router_session_ends("http://router:30000") as ends:
            async with Runtime("http://router:30000/v1", dialect="vllm-router-agentic",
                               hooks=[ends]) as rt:
                ...

    Ends still pending when the block exits are sent before it returns. A failed post is
    dropped (the router then expires the session itself). Async runtimes only: the hook
    must run on this block's event loop.
    """
    import anyio
    import httpx

    from ..telemetry._events import CallSent, SessionClosed

    root = router_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    if not root.startswith(("http://", "https://")):
        raise ValueError(f"router_url must be an http(s) URL, got {router_url!r}")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a finite number > 0, got {timeout_s!r}")
    send, receive = anyio.create_memory_object_stream[str](max_buffer_size=math.inf)
    called: set[str] = set()

    def hook(event: Event) -> None:
        if isinstance(event, CallSent):
            if len(called) >= _MAX_TRACKED:
                called.clear()
            called.add(event.session_id)
        elif isinstance(event, SessionClosed) and event.session_id in called:
            called.discard(event.session_id)
            send.send_nowait(event.session_id)

    async def post_ends() -> None:
        async with httpx.AsyncClient(timeout=timeout_s, transport=transport) as http, receive:
            async for session_id in receive:
                try:
                    await http.post(f"{root}/finish_session", params={"session_id": session_id})
                except httpx.HTTPError:
                    continue

    async with anyio.create_task_group() as tg:
        tg.start_soon(post_ends)
        try:
            yield hook
        finally:
            send.close()
