"""A first turn is not placed on a stale view of the engines (issue 35, item 8): the
readings older than the base interval (none yet, or a schedule that backed off while
idle) are polled at once and the first turn waits for them. Real HTTP servers on
loopback serving vLLM's gauges and chat completions; asyncio and trio. The fleet-wide
figure (16 processes started 0.25 s apart) is python -m benchmarks fleet first-turns's."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anyio
import httpx
import pytest

from agentrt import Retry, Runtime
from tests._fake import chat_completion

FAST = Retry(attempts=1, wait_initial=0.0, wait_jitter=0.0)
MSG = [{"role": "user", "content": "hi"}]
REPLY = json.dumps(
    chat_completion(
        {"role": "assistant", "content": "ok"},
        {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    )
).encode()


class GaugeEngine:
    """Answers chat completions; serves ``running`` as vLLM's gauge at ``/metrics``."""

    def __init__(self) -> None:
        self.running = 0
        self.polls: list[float] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return None

            def do_GET(self) -> None:
                outer.polls.append(time.monotonic())
                data = (
                    f"vllm:num_requests_running {outer.running}\n"
                    "vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.1\n"
                ).encode()
                self.send_response(200)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(REPLY)))
                self.end_headers()
                self.wfile.write(REPLY)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[GaugeEngine]]:
    # The bound on a first turn's wait (0.5 s) is for engines that do not answer; a
    # busy CI machine's loopback server may take longer than that to: the tests check
    # that the first turn waits for the readings, not how fast a loaded machine is.
    monkeypatch.setattr("agentrt._upkeep.FIRST_TURN_WAIT_S", 10.0)
    pair = [GaugeEngine(), GaugeEngine()]
    yield pair
    for e in pair:
        e.close()


async def _first_turn(rt: Runtime) -> str | None:
    async with rt.job("j") as job, job.session() as s:
        await s.chat(model="m", messages=MSG)
    return job.report.call_reports[0].endpoint


@pytest.mark.anyio
async def test_a_first_turn_at_once_waits_for_the_engines_readings(
    engines: list[GaugeEngine],
) -> None:
    """Right after the runtime opens (its first polls fall at a random phase within the
    first second), a first turn still sees that one engine is busy."""
    busy, idle = engines
    busy.running = 6
    for _ in range(8):
        async with Runtime([busy.url, idle.url], retry=FAST) as rt:
            assert await _first_turn(rt) == idle.url


@pytest.mark.anyio
async def test_a_first_turn_after_an_idle_spell_polls_again(engines: list[GaugeEngine]) -> None:
    """An idle runtime's polls back off (to seconds apart); a first turn after the
    engines' load changed sees the change, not the reading of seconds ago."""
    a, b = engines
    async with Runtime([a.url, b.url], retry=FAST) as rt:
        await anyio.sleep(4.0)  # idle: the interval doubles, 1, 2, 4 s
        for busy, idle in ((a, b), (b, a), (a, b)):
            busy.running, idle.running = 6, 0
            await anyio.sleep(1.1)  # older than the base interval: stale
            assert await _first_turn(rt) == idle.url


GAUGES = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.1\n"


@pytest.mark.parametrize("metrics_s", [0.8, 1000.0], ids=["slow", "hung"])
def test_first_turns_do_not_wait_again_and_again_for_a_slow_engine(metrics_s: float) -> None:
    """One replica's ``/metrics`` answers in 0.8 s, or hangs. Each first turn used to
    start a fresh poll of it, wait 0.5 s and throw the poll away; now the first wait
    finds it slow, its poll runs to its end, and no later first turn waits for it. A
    poll in progress is joined: never two of one endpoint at once. Virtual time."""
    from agentrt.bench._clock import VirtualTimeLoop

    in_progress, most = 0, 0

    async def handle(request: httpx.Request) -> httpx.Response:
        nonlocal in_progress, most
        if request.method == "GET":
            if request.url.host != "slow.test":
                return httpx.Response(200, content=GAUGES)
            in_progress += 1
            most = max(most, in_progress)
            try:
                await anyio.sleep(metrics_s)
            finally:
                in_progress -= 1
            return httpx.Response(200, content=GAUGES)
        return httpx.Response(200, content=REPLY, headers={"content-type": "application/json"})

    waits: list[float] = []

    async def main() -> None:
        urls = ["http://fast.test/v1", "http://slow.test/v1"]
        async with Runtime(urls, transport=httpx.MockTransport(handle), retry=FAST) as rt:
            for _ in range(12):
                await anyio.sleep(1.5)  # every reading stale again
                start = anyio.current_time()
                await _first_turn(rt)
                waits.append(anyio.current_time() - start)

    anyio.run(main, backend_options={"loop_factory": VirtualTimeLoop})
    assert waits[0] <= 0.5 + 1e-6
    assert max(waits[1:]) < 0.01, waits  # not waited for again
    assert most == 1
