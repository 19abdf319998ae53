"""The requests waiting for admission to a replica's batch, in its scheduling order.

``scheduling='fcfs'`` (:class:`FcfsQueue`): arrival order, behind a lane of resumed turns
(requests whose session's KV was kept for them); ``'priority'`` (:class:`PriorityQueue`):
lowest priority value first, then arrival. The order also picks whom the step loop
preempts when KV blocks run out (:meth:`WaitingQueue.victim`). A request that leaves the
queue otherwise (aborted) is only counted out here and skipped when it comes up.
"""

from __future__ import annotations

import heapq
from collections import deque

from ._request import WAITING, SimRequest

__all__ = ["FcfsQueue", "PriorityQueue", "WaitingQueue", "waiting_queue"]


class WaitingQueue:
    """The waiting requests: how many, the KV blocks they need, their order."""

    __slots__ = ("_block_size", "blocks", "count")

    def __init__(self, block_size: int) -> None:
        self._block_size = block_size
        self.count = 0
        """Requests waiting."""
        self.blocks = 0
        """Blocks the queued requests need (their whole context): the queued demand."""

    def push(self, req: SimRequest, *, front: bool) -> None:
        """Queue ``req`` (``front``: a preempted request, ahead of its lane)."""
        req.status = WAITING
        self.count += 1
        req.queued_blocks = -(-(req.prompt_len + req.num_output) // self._block_size)
        self.blocks += req.queued_blocks
        self._enqueue(req, front)

    def discard(self, req: SimRequest) -> None:
        """Count out a waiting request that left (aborted); its entry is skipped later."""
        self.count -= 1
        self.blocks -= req.queued_blocks

    def pop(self) -> None:
        """Take the request :meth:`peek` answered out of the queue."""
        req = self._dequeue()
        self.count -= 1
        self.blocks -= req.queued_blocks

    def peek(self) -> SimRequest | None:  # pragma: no cover - abstract
        """The next request to admit, if any."""
        raise NotImplementedError

    def victim(self, running: list[SimRequest]) -> SimRequest:  # pragma: no cover - abstract
        """The running request to preempt first."""
        raise NotImplementedError

    def _enqueue(self, req: SimRequest, front: bool) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _dequeue(self) -> SimRequest:  # pragma: no cover - abstract
        raise NotImplementedError


class FcfsQueue(WaitingQueue):
    """Arrival order, resumed turns first; the latest admitted is preempted first."""

    __slots__ = ("_fcfs", "_lane", "_resumed")

    def __init__(self, block_size: int) -> None:
        super().__init__(block_size)
        self._fcfs: deque[SimRequest] = deque()
        self._resumed: deque[SimRequest] = deque()
        """The lane ahead of ``_fcfs``: turns whose session's KV was kept for them."""
        self._lane = self._fcfs
        """The lane :meth:`peek` last answered from."""

    def _enqueue(self, req: SimRequest, front: bool) -> None:
        q = self._resumed if req.resumed else self._fcfs
        if front:
            q.appendleft(req)
        else:
            q.append(req)

    def peek(self) -> SimRequest | None:
        for q in (self._resumed, self._fcfs):
            while q and q[0].status != WAITING:
                q.popleft()
            if q:
                self._lane = q
                return q[0]
        return None

    def _dequeue(self) -> SimRequest:
        return self._lane.popleft()

    def victim(self, running: list[SimRequest]) -> SimRequest:
        return running[-1]


class PriorityQueue(WaitingQueue):
    """Lowest priority value first, then arrival; the highest value (the latest among
    equals) is preempted first."""

    __slots__ = ("_heap",)

    def __init__(self, block_size: int) -> None:
        super().__init__(block_size)
        self._heap: list[tuple[int, float, int, SimRequest]] = []

    def _enqueue(self, req: SimRequest, front: bool) -> None:
        heapq.heappush(self._heap, (req.priority, req.arrival, req.seq, req))

    def peek(self) -> SimRequest | None:
        heap = self._heap
        while heap and heap[0][3].status != WAITING:
            heapq.heappop(heap)
        return heap[0][3] if heap else None

    def _dequeue(self) -> SimRequest:
        return heapq.heappop(self._heap)[3]

    def victim(self, running: list[SimRequest]) -> SimRequest:
        return max(running, key=lambda r: (r.priority, r.arrival))


def waiting_queue(scheduling: str, block_size: int) -> WaitingQueue:
    """The queue for an engine's ``scheduling`` (``'fcfs'`` or ``'priority'``)."""
    if scheduling == "priority":
        return PriorityQueue(block_size)
    return FcfsQueue(block_size)
