"""One request inside a simulated replica: its progress, its place in the KV cache and
the event the HTTP layer waits on. The engine (``_engine``) moves it through the states
below; the waiting queue (``_waiting``) orders it while it waits."""

from __future__ import annotations

from typing import Any, Final

import anyio

from ._kv import Node
from ._tokenize import Prompt

__all__ = ["ABORTED", "FINISHED", "RUNNING", "WAITING", "RequestRejected", "SimRequest"]

WAITING: Final = 0
RUNNING: Final = 1
FINISHED: Final = 2
ABORTED: Final = 3


class RequestRejected(ValueError):
    """The engine refuses a request (too long for the model or the KV cache)."""


class SimRequest:
    """One request inside the engine; the HTTP layer waits on it."""

    __slots__ = (
        "_event",
        "anonymous",
        "arrival",
        "cached_tokens",
        "deepest",
        "final",
        "finish_time",
        "first_token_time",
        "host_cached_tokens",
        "idle_expected",
        "insert_blocked",
        "max_tokens",
        "notified",
        "notify_every",
        "num_computed",
        "num_output",
        "priority",
        "private",
        "prompt",
        "prompt_blocks",
        "prompt_len",
        "queued_blocks",
        "request_id",
        "resumed",
        "scheduled",
        "seq",
        "session",
        "status",
        "stream",
        "tree_blocks",
    )

    def __init__(
        self,
        prompt: Prompt,
        max_tokens: int,
        *,
        request_id: str,
        priority: int,
        session: Any,
        idle_expected: float | None,
        stream: bool,
        stream_interval: int,
        arrival: float,
        seq: int,
        final: bool = False,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_len = prompt.num_tokens
        self.prompt_blocks = prompt.num_full_blocks
        self.max_tokens = max_tokens
        self.priority = priority
        self.session = session
        self.anonymous = False
        """No session was given: the request is its own session, never remembered."""
        self.queued_blocks = 0
        """Blocks this request counts for in the queued demand while it waits."""
        self.resumed = False
        """Its session's KV was kept (pinned) for it: FCFS admits it ahead of the queue."""
        self.idle_expected = idle_expected
        self.final = final
        """The caller declared this its session's last call (``final`` in ``x-agentrt``)."""
        self.stream = stream
        self.notify_every = stream_interval if stream else max_tokens
        self.arrival = arrival
        self.seq = seq
        self.status = WAITING
        self.num_computed = 0
        self.num_output = 0
        self.notified = 0
        self.deepest: Node | None = None
        self.tree_blocks = 0
        self.private = 0
        self.insert_blocked = False
        self.scheduled = False
        self.cached_tokens = 0
        self.host_cached_tokens = 0
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        self._event: anyio.Event | None = None

    @property
    def done(self) -> bool:
        """Finished or aborted."""
        return self.status >= FINISHED

    async def wait_output(self, seen: int) -> int:
        """Wait until more than ``seen`` tokens are out (or the request ended); the count."""
        while self.num_output <= seen and self.status < FINISHED:
            ev = self._event
            if ev is None:
                ev = self._event = anyio.Event()
            await ev.wait()
        return self.num_output

    def _notify(self) -> None:
        self.notified = self.num_output
        ev = self._event
        if ev is not None:
            self._event = None
            ev.set()
