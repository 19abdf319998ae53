"""Virtual time on asyncio: an event loop whose clock jumps to the next timer when idle.

Like trio's ``MockClock(autojump_threshold=0)``, but with no extra dependency: when no
callback is ready and no I/O is pending, the loop's clock advances straight to the next
scheduled timer instead of sleeping. Everything that reads time through
``anyio.current_time()`` (agentrt, the embedded engine, the workloads) then runs in
virtual time, and results do not depend on how fast this machine is.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any

__all__ = ["VirtualTimeLoop"]


class _JumpingSelector(selectors.DefaultSelector):
    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if self.loop is not None and self.loop.threads_running:
            # A worker thread (openai asks for the platform once) finishes in real time:
            # wait for it without moving the clock.
            return super().select(0.05 if timeout is None else min(timeout, 0.05))
        events = super().select(0)
        if events or timeout is None or timeout <= 0 or self.loop is None:
            if not events and timeout is None:
                # Nothing scheduled and nothing ready: real I/O (if any) may still come.
                return super().select(0.05)
            return events
        self.loop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio event loop on a virtual clock (use with ``anyio.run(..., backend_options=
    {"loop_factory": VirtualTimeLoop})``)."""

    def __init__(self) -> None:
        selector = _JumpingSelector()
        super().__init__(selector)
        selector.loop = self
        self._virtual_now = 0.0

    def time(self) -> float:
        """The virtual clock's time, in seconds."""
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        """Moves the virtual clock ``seconds`` forward."""
        self._virtual_now += seconds

    threads_running = 0

    def run_in_executor(  # type: ignore[override]
        self, executor: Any, func: Any, *args: Any
    ) -> asyncio.Future[Any]:
        """As asyncio's, and counts the threads running, so that the clock does not
        jump while one runs (:meth:`quiet_until`)."""
        future = super().run_in_executor(executor, func, *args)
        self.threads_running += 1

        def done(_: object) -> None:
            self.threads_running -= 1

        future.add_done_callback(done)
        return future
