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
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import anyio

from .._ids import seeded

__all__ = ["VirtualTimeLoop", "every", "next_wakes"]

MAX_JUMP = 24 * 3600.0
"""asyncio's longest select timeout: the clock never jumps further in one go."""


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
        # Ids and routing salts from a seeded source while the loop lives, so that a
        # replay (routing ties broken by them included) is the same on every run.
        ids = seeded(0)
        ids.__enter__()
        self._ids: AbstractContextManager[None] | None = ids

    def close(self) -> None:
        """As asyncio's; ids come from ``os.urandom`` again."""
        super().close()
        ids, self._ids = self._ids, None
        if ids is not None:
            ids.__exit__(None, None, None)

    def time(self) -> float:
        """The virtual clock's time, in seconds."""
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        """Moves the virtual clock ``seconds`` forward."""
        self._virtual_now += seconds

    def quiet_until(self) -> float | None:
        """The time of the next scheduled timer when nothing can run before it (no callback
        ready, no worker thread, no I/O but the loop's own wake-up pipe); None when
        something may run now, or when no timer is scheduled.

        Until then the clock jumps and no callback runs, so nothing can change: a periodic
        sampler can take every sample due before that time at once (see
        :func:`next_wakes`) instead of waking the loop for each."""
        if self._ready or self.threads_running:  # type: ignore[attr-defined]
            return None
        if len(self._selector.get_map()) > 1:  # type: ignore[attr-defined]
            return None
        heap: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[attr-defined]
        if not heap:
            return None
        head = heap[0]
        if not head.cancelled():
            return head.when()
        live = [h.when() for h in heap if not h.cancelled()]
        return min(live) if live else None

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


def next_wakes(now: float, interval: float, before: float) -> tuple[list[float], float]:
    """The times a task that sleeps ``interval`` seconds after each wake-up (starting at
    ``now``) wakes up at on :class:`VirtualTimeLoop`, while nothing else runs: the wakes
    strictly earlier than ``before`` less a microsecond, and the first one after them.

    The clock moves as the loop moves it: a sleep is due at ``now + interval`` and the loop
    advances its clock by the difference, so every float here is the one the loop itself
    would compute (a wake within a microsecond of ``before`` is left to the loop, whose
    order for timers due together is its own)."""
    wakes: list[float] = []
    if not 0 < interval <= MAX_JUMP:
        return wakes, now + interval
    limit = before - 1e-6
    when = now + interval
    while when < limit:
        step = when - now
        if not step > 0:
            break
        now += step
        wakes.append(now)
        when = now + interval
    return wakes, when


async def every(interval: float, tick: Callable[[int], None]) -> None:
    """Call ``tick`` now and every ``interval`` seconds after it, until cancelled: the same
    ticks at the same times as ``while True: tick(1); await anyio.sleep(interval)``.

    On :class:`VirtualTimeLoop`, the ticks due before anything else can run are taken in
    one call, ``tick(n)`` standing for ``n`` ticks (nothing can change between them), so a
    sampler costs one wake-up per event of the run, not one per interval of virtual time."""
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:  # not on asyncio
        loop = None
    if not isinstance(loop, VirtualTimeLoop):
        while True:
            tick(1)
            await anyio.sleep(interval)
    while True:
        now = loop.time()
        until = loop.quiet_until()
        if until is None:
            n, when = 1, now + interval
        else:
            wakes, when = next_wakes(now, interval, until)
            n = 1 + len(wakes)
        tick(n)
        fut: asyncio.Future[None] = loop.create_future()
        handle = loop.call_at(when, _wake, fut)
        try:
            await fut
        finally:
            handle.cancel()


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
