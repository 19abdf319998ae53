"""Telling a server that agentrt sessions ended: one request per session, after its block.

Some servers keep per-session state that only the client can release: vllm-router's
``sticky_least_loaded`` counts sessions per worker (``POST /finish_session``), and an
SGLang server with ``--enable-session-radix-cache`` keeps a session's KV referenced until
``POST /close_session``. The request is not a dialect field (dialects are pure functions of
one call); it is the one thing agentrt knows only after a session's last call.

:func:`session_ends` is the mechanism both use: a runtime hook that remembers which
sessions made a call and, when such a session closes, sends the server's end request from
a task of its own, so the hook itself stays cheap on the call path.
:func:`vllm_router_session_ends` and :func:`sglang_session_ends` fill in each server's
request.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any, Final

from ._base import SessionEnd

if TYPE_CHECKING:  # imported when used: agentrt.dialects stays cheap to import
    import httpx

    from ..telemetry._events import Event, Hook

__all__ = [
    "CLOSE_SESSION",
    "FINISH_SESSION",
    "open_session_ends",
    "sglang_session_ends",
    "vllm_router_session_ends",
]

_MAX_TRACKED: Final = 100_000
"""Sessions remembered as having called (a bound; cleared when full)."""


def _roots(urls: str | Sequence[str], what: str) -> tuple[str, ...]:
    items = [urls] if isinstance(urls, str) else list(urls)
    if not items:
        raise ValueError(f"{what} needs at least one URL")
    roots: list[str] = []
    for url in items:
        if not isinstance(url, str):
            raise TypeError(f"{what} URLs must be str, got {type(url).__name__}")
        root = url.rstrip("/")
        if root.endswith("/v1"):
            root = root[: -len("/v1")]
        if not root.startswith(("http://", "https://")):
            raise ValueError(f"{what} URL must be an http(s) URL, got {url!r}")
        roots.append(root)
    return tuple(roots)


MAX_CONCURRENT_ENDS: Final = 64
"""Session-end requests in flight at once, per hook."""


@asynccontextmanager
async def session_ends(
    urls: str | Sequence[str],
    request: SessionEnd,
    *,
    what: str,
    timeout_s: float,
    api_key: str | None,
    transport: object | None,
    authorization: str | None = None,
    endpoint: str | None = None,
    exit_at: list[float] | None = None,
) -> AsyncIterator[Hook]:
    """A hook that sends ``request`` to every root of ``urls`` when a session that made a
    call closes (with ``Authorization: Bearer <api_key>`` when given, else
    ``authorization`` as it is). With ``endpoint``, only sessions that sent a call to that
    endpoint URL count. The session is named as its calls named it on the wire
    (``CallSent.wire_session_id``: the caller's own id where the caller set it, else
    agentrt's). The requests go through ``transport`` (an ``httpx`` or ``httpx2`` async
    transport, lent: not closed here; None: a default one of this block's), at most
    :data:`MAX_CONCURRENT_ENDS` at once, each bounded by ``timeout_s``; ends still
    pending when the block exits are sent before it returns, all of them within
    ``timeout_s`` of the exit (what is not answered by then is dropped, as is a failed
    request: the server then expires the session itself). ``exit_at``: where several
    such blocks are left one after another (the runtime's, one per endpoint), the time
    their exit began (its one element, once set): the bound counts from then, so that
    all of them are done within ``timeout_s`` of it, not ``timeout_s`` each."""
    import anyio

    from .._config import check_api_key
    from .._httplib import http_lib
    from ..telemetry._events import CallSent, SessionClosed

    roots = _roots(urls, what)
    headers = {} if api_key is None else {"authorization": f"Bearer {check_api_key(api_key)}"}
    if api_key is None and authorization is not None:
        headers["authorization"] = authorization
    if not (isinstance(timeout_s, int | float) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a finite number > 0, got {timeout_s!r}")
    lib = http_lib(transport)
    mod = lib.mod
    own = transport is None
    inner: Any = mod.AsyncHTTPTransport() if own else transport
    timeouts = {"connect": timeout_s, "read": timeout_s, "write": timeout_s, "pool": timeout_s}
    send, receive = anyio.create_memory_object_stream[str](max_buffer_size=math.inf)
    called: dict[str, str] = {}  # agentrt's session id -> the id its calls carried

    def hook(event: Event) -> None:
        if isinstance(event, CallSent):
            if endpoint is not None and event.endpoint != endpoint:
                return
            if len(called) >= _MAX_TRACKED:
                called.clear()
            called[event.session_id] = event.wire_session_id or event.session_id
        elif isinstance(event, SessionClosed):
            wire = called.pop(event.session_id, None)
            if wire is not None:
                send.send_nowait(wire)

    async def post(url: str, session_id: str, limiter: anyio.CapacityLimiter) -> None:
        async with limiter:
            with anyio.move_on_after(timeout_s):
                try:
                    message = mod.Request(
                        "POST",
                        url,
                        headers=headers,
                        extensions={"timeout": timeouts},
                        **request.send_kwargs(session_id),
                    )
                    response = await inner.handle_async_request(message)
                    try:
                        await response.aread()
                    finally:
                        await response.aclose()
                except Exception:  # any failure: the runtime's block must not fail on it
                    return

    async def post_ends(scope: anyio.CancelScope) -> None:
        limiter = anyio.CapacityLimiter(MAX_CONCURRENT_ENDS)
        with scope:
            async with receive, anyio.create_task_group() as posts:
                async for session_id in receive:
                    for root in roots:
                        posts.start_soon(post, f"{root}{request.path}", session_id, limiter)

    scope = anyio.CancelScope()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(post_ends, scope)
            try:
                yield hook
            finally:
                send.close()
                # What is pending goes out now, all of it within timeout_s (of the exit
                # of them all, when they are left together).
                scope.deadline = (exit_at[0] if exit_at else anyio.current_time()) + timeout_s
    finally:
        if own:
            with anyio.CancelScope(shield=True):
                await inner.aclose()


FINISH_SESSION: Final = SessionEnd("/finish_session", param="session_id")
"""vllm-router's end of a ``sticky_least_loaded`` session:
``POST /finish_session?session_id=ID``."""
CLOSE_SESSION: Final = SessionEnd("/close_session", json_key="session_id")
"""SGLang's session close: ``POST /close_session`` with ``{"session_id": ID}``."""


def vllm_router_session_ends(
    router_url: str,
    *,
    timeout_s: float = 5.0,
    api_key: str | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> AbstractAsyncContextManager[Hook]:
    """A hook that tells the vllm-router at ``router_url`` (its root; a trailing ``/v1``
    is dropped) when each agentrt session that called it ends
    (``POST /finish_session?session_id=ID``). Use it as an async context manager and give
    the hook to the runtime, inside the block::

        async with vllm_router_session_ends("http://router:30000") as ends:
            async with Runtime("http://router:30000/v1", dialect="vllm-router-agentic",
                               hooks=[ends]) as rt:
                ...

    vllm-router's ``sticky_least_loaded`` policy counts the sessions bound to each worker
    and sends a new session to the worker with the fewest; a session it is never told of
    holds its count for two hours (vllm-router 0.1.17, ``src/policies/sticky_least_loaded.rs``;
    ``src/server.rs``, ``finish_session``). Ends still pending when the block exits are
    sent before it returns; a failed post is dropped. ``api_key``, for a router started
    with one, goes in ``Authorization: Bearer``. Async runtimes only: the hook must run on
    this block's event loop.
    """
    if not isinstance(router_url, str):
        raise TypeError(f"router_url must be a str, got {type(router_url).__name__}")
    return session_ends(
        router_url,
        FINISH_SESSION,
        what="router_url",
        timeout_s=timeout_s,
        api_key=api_key,
        transport=transport,
    )


def sglang_session_ends(
    server_urls: str | Sequence[str],
    *,
    timeout_s: float = 5.0,
    api_key: str | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> AbstractAsyncContextManager[Hook]:
    """A hook that closes each agentrt session on the SGLang server(s) at ``server_urls``
    when the session's block ends (``POST /close_session`` with ``{"session_id": ID}``).

    Use it with ``sglang_dialect(send_session_id=True)`` against servers started with
    ``--enable-session-radix-cache`` (SGLang 0.5.15 or later): each session's KV stays
    referenced (evicted after unreferenced KV) until it is closed. Behind the Model Gateway,
    list every worker's URL: a worker that never saw the session ignores the close.
    ``api_key``, for servers started with ``--api-key``, goes in ``Authorization: Bearer``.
    Use it as an async context manager, as :func:`vllm_router_session_ends`.
    """
    return session_ends(
        server_urls,
        CLOSE_SESSION,
        what="server_urls",
        timeout_s=timeout_s,
        api_key=api_key,
        transport=transport,
    )


async def open_session_ends(
    endpoints: Sequence[tuple[str, tuple[SessionEnd, ...], bytes | None]],
    transport: object,
    timeout_s: float = 5.0,
) -> tuple[AsyncExitStack, list[Hook]]:
    """The runtime's session ends: for each ``(endpoint URL, its dialect's session ends,
    its Authorization header)``, a hook per end that sends it to that endpoint's root for
    the sessions whose calls went there. The stack closes them (sending what is pending,
    all within ``timeout_s`` of its close, however many endpoints). ``transport`` is the
    runtime's own (lent, not closed): the ends go out as its calls do, with its proxy and
    TLS settings."""
    import anyio

    lent = transport
    stack = AsyncExitStack()
    hooks: list[Hook] = []
    exit_at: list[float] = []
    try:
        for url, ends, authorization in endpoints:
            auth = authorization.decode("latin-1") if authorization is not None else None
            for end in ends:
                hook = await stack.enter_async_context(
                    session_ends(
                        url,
                        end,
                        what="endpoint",
                        timeout_s=timeout_s,
                        api_key=None,
                        transport=lent,
                        authorization=auth,
                        endpoint=url,
                        exit_at=exit_at,
                    )
                )
                hooks.append(hook)
    except BaseException:
        await stack.aclose()
        raise
    # Left first (last in): the time the exit began, from which every bound counts.
    stack.callback(lambda: exit_at.append(anyio.current_time()))
    return stack, hooks
