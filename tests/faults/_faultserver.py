"""A fault server on real loopback sockets, scripted per request.

It speaks just enough HTTP/1.1 (keep-alive, Content-Length request bodies) on a raw anyio
TCP listener, so that a reply can misbehave at any byte: a status storm, a connection
dropped mid-stream, a stall, garbled JSON or SSE, a huge or slowly dripped body, a wrong
content type. Each request takes the next :class:`Fault` from the script (the default
when the script is empty) and the server records what it saw: every request, and when a
client went away while the server held its request open.

The server runs on its own event loop in a thread (``FaultServer.start()``), so the same
server serves async tests on asyncio and trio and the synchronous runtime alike, and a
client's cancellation never touches it.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import anyio.from_thread
from anyio.streams.buffered import BufferedByteReceiveStream

__all__ = [
    "Fault",
    "FaultServer",
    "Seen",
    "chat_completion",
    "chunk",
    "fault_server",
    "refused_url",
    "silent_listener",
]

MODEL = "fault-model"


def chat_completion(content: str = "ok", *, prompt_tokens: int = 5) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fault",
        "object": "chat.completion",
        "created": 1700000000,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": 1,
            "total_tokens": prompt_tokens + 1,
        },
    }


def chunk(content: str | None, *, finish: str | None = None) -> bytes:
    """One SSE event of a streamed chat completion."""
    delta = {} if content is None else {"content": content}
    body = {
        "id": "chatcmpl-fault",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


@dataclass
class Seen:
    """One request as the server saw it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float
    """``time.monotonic()`` when its head and body had arrived."""
    fault: str
    reused: bool = False
    """It came on a connection that had served an earlier request (kept alive)."""
    disconnected_at: float | None = None
    """When the server saw the client close the connection while it held this request
    open (a stall or a stream); None if it never did."""

    def json(self) -> Any:
        return json.loads(self.body)


Conn = anyio.abc.SocketStream
Action = Callable[["Conn", "Seen"], Awaitable[bool]]
"""Writes the reply; returns whether the connection may serve another request."""


async def _watch_close(conn: Conn, seen: Seen, until: float) -> None:
    """Hold the request open until ``until`` (monotonic), recording when the client goes
    away (reading EOF or an error from the socket)."""
    with anyio.move_on_after(max(0.0, until - time.monotonic())):
        try:
            while await conn.receive():
                pass
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        seen.disconnected_at = time.monotonic()


async def _send(conn: Conn, data: bytes, seen: Seen) -> bool:
    try:
        await conn.send(data)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        seen.disconnected_at = time.monotonic()
        return False
    return True


def _head(status: int, headers: dict[str, str], length: int | None) -> bytes:
    reason = {200: "OK", 429: "Too Many Requests", 500: "Internal Server Error"}.get(
        status, "Status"
    )
    lines = [f"HTTP/1.1 {status} {reason}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if length is not None:
        lines.append(f"content-length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


@dataclass(frozen=True)
class Fault:
    """What the server does with one request: ``name`` for the record, ``action`` does it.
    Build one with the class methods."""

    name: str
    action: Action

    @classmethod
    def ok(cls, content: str = "ok", **headers: str) -> Fault:
        return cls.json(200, chat_completion(content), name="ok", **headers)

    @classmethod
    def json(cls, status: int, body: Any, *, name: str | None = None, **headers: str) -> Fault:
        data = json.dumps(body).encode()
        return cls.raw_reply(status, data, "application/json", name=name or f"{status}", **headers)

    @classmethod
    def status(cls, status: int, **headers: str) -> Fault:
        """An error reply with an OpenAI-style error body; headers as keyword arguments
        (``retry_after="1"`` sends ``retry-after: 1``)."""
        body = {"error": {"message": f"injected {status}", "type": "server_error"}}
        return cls.json(status, body, name=f"{status}", **headers)

    @classmethod
    def raw_reply(
        cls,
        status: int,
        body: bytes,
        content_type: str,
        *,
        name: str | None = None,
        **headers: str,
    ) -> Fault:
        """A complete reply with exactly this body and content type."""
        hdrs = {"content-type": content_type}
        hdrs.update({k.replace("_", "-"): v for k, v in headers.items()})
        data = _head(status, hdrs, len(body)) + body

        async def action(conn: Conn, seen: Seen) -> bool:
            return await _send(conn, data, seen)

        return cls(name or f"raw {status}", action)

    @classmethod
    def drop(cls) -> Fault:
        """Close the connection without a reply."""

        async def action(conn: Conn, seen: Seen) -> bool:
            return False

        return cls("drop", action)

    @classmethod
    def reset(cls) -> Fault:
        """Reset the connection (TCP RST: the client reads ``ECONNRESET``), no reply."""

        async def action(conn: Conn, seen: Seen) -> bool:
            raw = conn.extra(anyio.abc.SocketAttribute.raw_socket)
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False

        return cls("reset", action)

    @classmethod
    def stall(cls, seconds: float = 60.0) -> Fault:
        """Answer nothing, holding the request open for ``seconds`` or until the client
        goes away (recorded)."""

        async def action(conn: Conn, seen: Seen) -> bool:
            await _watch_close(conn, seen, time.monotonic() + seconds)
            return False

        return cls("stall", action)

    @classmethod
    def stream(
        cls,
        events: list[bytes],
        *,
        interval: float = 0.0,
        done: bool = True,
        then_stall: float = 0.0,
        content_type: str = "text/event-stream",
    ) -> Fault:
        """A streamed reply (chunked): ``events`` with ``interval`` s between them, then
        ``data: [DONE]`` and the end of the body (``done``), or the connection dropped
        there (not ``done``), after holding it open ``then_stall`` s."""

        async def action(conn: Conn, seen: Seen) -> bool:
            head = _head(200, {"content-type": content_type, "transfer-encoding": "chunked"}, None)
            if not await _send(conn, head, seen):
                return False
            for i, event in enumerate(events):
                if i and interval:
                    await anyio.sleep(interval)
                frame = b"%x\r\n%s\r\n" % (len(event), event)
                if not await _send(conn, frame, seen):
                    return False
            if then_stall:
                await _watch_close(conn, seen, time.monotonic() + then_stall)
                if seen.disconnected_at is not None:
                    return False
            if not done:
                return False
            tail = b"data: [DONE]\n\n"
            return await _send(conn, b"%x\r\n%s\r\n0\r\n\r\n" % (len(tail), tail), seen)

        return cls("stream" if done else "stream-dropped", action)

    @classmethod
    def drip(cls, body: bytes, *, pieces: int, interval: float) -> Fault:
        """A 200 JSON reply whose body arrives in ``pieces`` parts ``interval`` s apart."""

        async def action(conn: Conn, seen: Seen) -> bool:
            if not await _send(
                conn, _head(200, {"content-type": "application/json"}, len(body)), seen
            ):
                return False
            step = max(1, -(-len(body) // pieces))
            for i in range(0, len(body), step):
                if i:
                    await anyio.sleep(interval)
                if not await _send(conn, body[i : i + step], seen):
                    return False
            return True

        return cls("drip", action)


class FaultServer:
    """The fault server. ``script`` holds the faults for the next requests, in order;
    ``default`` serves a request when it is empty."""

    def __init__(self, default: Fault | None = None) -> None:
        self.default = default or Fault.ok()
        self.script: deque[Fault] = deque()
        self.seen: list[Seen] = []
        self.connections = 0
        self._lock = threading.Lock()
        self.url = ""
        self.port = 0

    def push(self, *faults: Fault) -> None:
        with self._lock:
            self.script.extend(faults)

    def _next(self) -> Fault:
        with self._lock:
            return self.script.popleft() if self.script else self.default

    @property
    def chat_requests(self) -> list[Seen]:
        return [s for s in self.seen if s.path.endswith("/chat/completions")]

    def wait_disconnect(self, seen: Seen, timeout: float) -> float | None:
        """Block until the server saw ``seen``'s client go away (or ``timeout`` s);
        returns when it did."""
        end = time.monotonic() + timeout
        while seen.disconnected_at is None and time.monotonic() < end:
            time.sleep(0.01)
        return seen.disconnected_at

    async def _handle(self, conn: Conn) -> None:
        self.connections += 1
        reader = BufferedByteReceiveStream(conn)
        served = 0
        async with conn:
            while True:
                try:
                    head = await reader.receive_until(b"\r\n\r\n", 65536)
                except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError):
                    return
                request_line, *lines = head.decode("latin-1").split("\r\n")
                method, path, _ = request_line.split(" ", 2)
                headers: dict[str, str] = {}
                for line in lines:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length", "0"))
                try:
                    body = await reader.receive_exactly(length) if length else b""
                except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError):
                    return
                if not path.endswith("/chat/completions") and not path.endswith("/completions"):
                    # Health probes and /metrics polls: a plain 404, not scripted.
                    fault = Fault.json(404, {"error": {"message": "not found"}})
                else:
                    fault = self._next()
                seen = Seen(method, path, headers, body, time.monotonic(), fault.name, served > 0)
                served += 1
                self.seen.append(seen)
                try:
                    again = await fault.action(conn, seen)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    again = False
                if not again:
                    return

    async def _serve(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        self.url = f"http://127.0.0.1:{self.port}/v1"
        async with listener:
            task_status.started()
            await listener.serve(self._handle)


@contextmanager
def fault_server(default: Fault | None = None) -> Iterator[FaultServer]:
    """A :class:`FaultServer` running on its own event loop in a thread."""
    server = FaultServer(default)
    with anyio.from_thread.start_blocking_portal("asyncio") as portal:
        future, _ = portal.start_task(server._serve)
        try:
            yield server
        finally:
            future.cancel()


@contextmanager
def silent_listener() -> Iterator[str]:
    """A listener that never accepts: connections complete in the kernel's backlog and
    requests are sent into it, but nothing is ever read or answered."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        sock.close()


def refused_url() -> str:
    """The URL of a port nothing listens on (connections are refused)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/v1"
