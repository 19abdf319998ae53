"""Session ends as a router sees them (issue 35, items 3, 5 and 6): bounded as a whole
and sent concurrently against a router whose ``/finish_session`` hangs, naming the
session the wire named (the caller's own id where the caller set it), and sent through
the runtime's transport (never a client of their own that reads ``HTTP_PROXY``). Real
HTTP servers on loopback (a router, a proxy), asyncio and trio."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anyio
import pytest

from agentrt import Retry, Runtime
from agentrt.dialects._session_ends import MAX_CONCURRENT_ENDS
from tests._fake import MSG, FakeEngine, chat_completion

FAST = Retry(attempts=1, wait_initial=0.0, wait_jitter=0.0)
REPLY = chat_completion(
    {"role": "assistant", "content": "ok"},
    {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
)


class Server:
    """A loopback HTTP server in threads of its own: it answers chat completions,
    records every request (method, path with query, body) and, with ``hang``, holds
    ``/finish_session`` until it stops."""

    def __init__(self, *, hang: bool = False, status: int = 200) -> None:
        self.seen: list[tuple[str, str, bytes]] = []
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return None

            def do_POST(self) -> None:
                size = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(size)
                outer.seen.append(("POST", self.path, body))
                if hang and self.path.startswith("/finish_session"):
                    outer.release.wait(60)
                    return
                data = json.dumps(REPLY).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                outer.seen.append(("GET", self.path, b""))
                self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def paths(self, prefix: str) -> list[str]:
        return [p for _, p, _ in self.seen if p.startswith(prefix)]

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def hanging_router() -> Iterator[Server]:
    server = Server(hang=True)
    yield server
    server.close()


@pytest.mark.anyio
async def test_ends_against_a_hanging_router_are_bounded_as_a_whole(
    hanging_router: Server,
) -> None:
    """50 sessions end while the router's /finish_session hangs: every end is posted
    at once (none waits for another), and the runtime's block is left within the ends'
    bound (5 s after it ends), not 5 s per session."""
    n = 50
    assert n <= MAX_CONCURRENT_ENDS
    with anyio.fail_after(30):  # today's code: 250 s
        async with Runtime(
            f"{hanging_router.url}/v1", dialect="vllm-router-agentic", retry=FAST
        ) as rt:
            async with rt.job("j") as job:
                for i in range(n):
                    async with job.session(session_id=f"s{i}") as s:
                        await s.chat(model="m", messages=MSG)
            closing = time.monotonic()
        took = time.monotonic() - closing
    assert took <= 5.0 + 1.5, took
    ends = hanging_router.paths("/finish_session")
    assert sorted(ends) == sorted(f"/finish_session?session_id=s{i}" for i in range(n))


def test_ends_to_several_endpoints_are_bounded_together() -> None:
    """Three endpoints whose /finish_session hangs, each with ends pending at the exit:
    the block is left within the ends' bound of its exit (5 s), not 5 s per endpoint
    (15 s). 140 ends each: more than go out at once. Virtual time."""
    import httpx

    from agentrt.bench._clock import VirtualTimeLoop

    engine = FakeEngine()
    ends: dict[str, int] = {}

    async def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/finish_session":
            host = request.url.host
            ends[host] = ends.get(host, 0) + 1
            await anyio.sleep(1000)  # hangs
        return await engine.handle(request)

    took = 0.0

    async def main() -> None:
        nonlocal took
        urls = [f"http://router{i}.test/v1" for i in range(3)]
        async with Runtime(
            urls,
            transport=httpx.MockTransport(handle),
            dialect="vllm-router-agentic",
            retry=FAST,
            routing="round_robin",
        ) as rt:
            async with rt.job("j") as job:
                for i in range(420):
                    async with job.session(session_id=f"s{i}") as s:
                        await s.chat(model="m", messages=MSG)
            closing = anyio.current_time()
        took = anyio.current_time() - closing

    anyio.run(main, backend_options={"loop_factory": VirtualTimeLoop})
    # Each router got at least as many as go out at once (they hang): ends were pending
    # at the exit for every one.
    assert sorted(ends) == [f"router{i}.test" for i in range(3)]
    assert min(ends.values()) >= MAX_CONCURRENT_ENDS
    assert 4.0 <= took <= 5.0 + 0.01, took


@pytest.mark.anyio
async def test_ends_name_the_session_the_caller_put_on_the_wire() -> None:
    """The caller's own ``x-session-id`` (vllm-router-agentic) or body ``session_id``
    (SGLang) wins on the wire; the session's end names that id, the one the server
    counts, not agentrt's."""
    router = FakeEngine()
    async with Runtime(
        "http://router.test/v1",
        transport=router.transport(),
        retry=FAST,
        dialect="vllm-router-agentic",
    ) as rt:
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG, extra_headers={"x-session-id": "mine-1"})
            agentrt_id = s.id
    chat, end = router.seen
    assert chat.headers["x-session-id"] == "mine-1"
    assert end.url == "http://router.test/finish_session?session_id=mine-1", agentrt_id

    sglang = FakeEngine()
    async with Runtime(
        "http://worker.test/v1",
        transport=sglang.transport(),
        retry=FAST,
        dialect="sglang:session-id,close-session",
    ) as rt:
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG, extra_body={"session_id": "mine-2"})
    chat, close = sglang.seen
    assert chat.body["session_id"] == "mine-2"
    assert close.url == "http://worker.test/close_session"
    assert close.body == {"session_id": "mine-2"}


@pytest.mark.anyio
async def test_ends_go_through_the_runtimes_transport_not_http_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``HTTP_PROXY`` set, the runtime's calls go straight to the router (its
    transport reads no environment); its session ends must go the same way, not to the
    proxy (which here answers 502 to everything and records what reached it)."""
    router, proxy = Server(), Server(status=502)
    try:
        for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("http_proxy", proxy.url)
        async with Runtime(f"{router.url}/v1", dialect="vllm-router-agentic", retry=FAST) as rt:
            async with rt.job("j") as job, job.session(session_id="via-transport") as s:
                await s.chat(model="m", messages=MSG)
        assert router.paths("/finish_session") == ["/finish_session?session_id=via-transport"]
        assert proxy.seen == []
    finally:
        router.close()
        proxy.close()
