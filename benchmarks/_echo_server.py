"""A minimal OpenAI-compatible server for the overhead benchmark.

It answers every ``POST .../chat/completions`` at once with the same small
``ChatCompletion`` (usage included), and 404 to anything else. Two implementations:

- ``uvicorn``: a raw ASGI app under uvicorn (h11), i.e. a real HTTP server stack;
- ``raw``: a bare asyncio protocol speaking just enough HTTP/1.1 (keep-alive,
  Content-Length bodies). It costs the server far less CPU per request, so the client's
  own cost is a larger share of each call's wall time (a stricter test of overhead).

``--fail-pct P`` answers P % of the chat completions (drawn per request) with a 503 error
instead (the load benchmark's flaky server).

Run as ``python benchmarks/_echo_server.py --impl uvicorn``: it binds 127.0.0.1 on a free
port, prints ``PORT <n>`` on stdout once it accepts connections, and serves until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import socket
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

COMPLETION: bytes = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "bench",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": 12,
            "completion_tokens": 1,
            "total_tokens": 13,
            "prompt_tokens_details": {"cached_tokens": 8},
        },
    },
    separators=(",", ":"),
).encode()
NOT_FOUND: bytes = b'{"error":{"message":"not found","type":"invalid_request_error"}}'

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_OK_HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", str(len(COMPLETION)).encode()),
]
_NOT_FOUND_HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", str(len(NOT_FOUND)).encode()),
]


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    """The raw ASGI app (no framework): drain the body, answer the fixed completion."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    if scope["method"] == "POST" and scope["path"].endswith("/chat/completions"):
        if FAIL_FRACTION and random.random() < FAIL_FRACTION:
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": _UNAVAILABLE})
            return
        await send({"type": "http.response.start", "status": 200, "headers": _OK_HEADERS})
        await send({"type": "http.response.body", "body": COMPLETION})
    else:
        await send({"type": "http.response.start", "status": 404, "headers": _NOT_FOUND_HEADERS})
        await send({"type": "http.response.body", "body": NOT_FOUND})


_RAW_OK = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    b"content-length: " + str(len(COMPLETION)).encode() + b"\r\n\r\n" + COMPLETION
)
_RAW_NOT_FOUND = (
    b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\n"
    b"content-length: " + str(len(NOT_FOUND)).encode() + b"\r\n\r\n" + NOT_FOUND
)
_RAW_BAD = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_UNAVAILABLE: bytes = b'{"error":{"message":"injected failure","type":"server_error"}}'
_RAW_UNAVAILABLE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"content-length: " + str(len(_UNAVAILABLE)).encode() + b"\r\n\r\n" + _UNAVAILABLE
)
_FAILED_ONCE: set[str] = set()
"""The call ids under ``ALTERNATE_PREFIX`` answered 503 once, not yet 200."""
FAIL_FRACTION: float = 0.0
"""The share of chat completions answered 503 (``--fail-pct``), drawn per request."""
ALTERNATE_PREFIX: Final = "/alternate/"
"""Chat completions under this path prefix (the raw server's) are answered 503 the first
time their call id (``call="..."`` in the ``x-agentrt`` header, the same on each attempt of
a call) is seen, and 200 the second: an agentrt client that retries makes exactly two
attempts per call, whatever connection each goes on (``cost instructions``'s retried
call)."""
_CALL_ID = re.compile(r'call="([^"]+)"')


class _RawHTTP(asyncio.Protocol):
    """Just enough HTTP/1.1: pipelined keep-alive requests with Content-Length bodies."""

    def __init__(self) -> None:
        self._buf = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        assert self._transport is not None
        self._buf += data
        while True:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self._buf[:end].decode("latin-1")
            request_line, _, header_text = head.partition("\r\n")
            length = 0
            call = ""
            for line in header_text.split("\r\n"):
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    length = int(value)
                elif name == "x-agentrt":
                    found = _CALL_ID.search(value)
                    call = found.group(1) if found else ""
                elif name == "transfer-encoding":
                    self._transport.write(_RAW_BAD)
                    self._transport.close()
                    return
            total = end + 4 + length
            if len(self._buf) < total:
                return
            self._buf = self._buf[total:]
            parts = request_line.split(" ")
            ok = len(parts) == 3 and parts[0] == "POST"
            ok = ok and parts[1].split("?")[0].endswith("/chat/completions")
            if ok and parts[1].startswith(ALTERNATE_PREFIX):
                failed = call not in _FAILED_ONCE
                if failed:
                    _FAILED_ONCE.add(call)
                else:
                    _FAILED_ONCE.discard(call)
                self._transport.write(_RAW_UNAVAILABLE if failed else _RAW_OK)
            elif ok and FAIL_FRACTION and random.random() < FAIL_FRACTION:
                self._transport.write(_RAW_UNAVAILABLE)
            else:
                self._transport.write(_RAW_OK if ok else _RAW_NOT_FOUND)


def _bind() -> socket.socket:
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets that say TCP,
    # and without it uvicorn's separate head and body writes meet Nagle + delayed ACK
    # (40 ms per reply).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def _announce(sock: socket.socket) -> None:
    print(f"PORT {sock.getsockname()[1]}", flush=True)


async def _serve_raw(sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_RawHTTP, sock=sock, backlog=1024)
    _announce(sock)
    async with server:
        await server.serve_forever()


async def _serve_uvicorn(sock: socket.socket) -> None:
    import uvicorn

    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        http="h11",
        loop="asyncio",
        backlog=1024,
        # Never close idle keep-alive connections: a client pool reusing one that the
        # server is closing at that moment fails the call (no retries in the benchmark).
        timeout_keep_alive=3600,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            await task
            return
        await asyncio.sleep(0.01)
    _announce(sock)
    await task


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--impl", choices=("uvicorn", "raw"), default="uvicorn")
    parser.add_argument("--cpu", type=int, default=None, help="pin the server to this CPU")
    parser.add_argument(
        "--fail-pct", type=float, default=0.0, help="answer this %% of chat completions 503"
    )
    args = parser.parse_args(argv)
    global FAIL_FRACTION
    FAIL_FRACTION = args.fail_pct / 100.0
    if args.cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu})
    sock = _bind()
    serve = _serve_raw if args.impl == "raw" else _serve_uvicorn
    try:
        asyncio.run(serve(sock))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
