"""A ``/metrics`` blip is not "no metrics" (issue 35, item 4): an engine whose metrics
answer 503 for a few seconds is asked again about every second, and its view is the
engine's again within a couple of seconds of its recovery, not a minute later. Real HTTP
servers on loopback serving vLLM's gauges; asyncio and trio."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anyio
import pytest

from agentrt import Runtime

GAUGES = "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.1\n"


class MetricsServer:
    """Serves vLLM's gauges at ``/metrics``; answers 503 while ``down_until`` is ahead."""

    def __init__(self) -> None:
        self.down_until = 0.0
        self.polls = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return None

            def do_GET(self) -> None:
                if self.path.endswith("/metrics"):
                    outer.polls += 1
                status = 503 if time.monotonic() < outer.down_until else 200
                data = GAUGES.encode() if status == 200 else b"unavailable"
                self.send_response(status)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers() -> Iterator[tuple[MetricsServer, MetricsServer]]:
    a, b = MetricsServer(), MetricsServer()
    yield a, b
    a.close()
    b.close()


@pytest.mark.anyio
async def test_a_metrics_blip_blinds_routing_for_about_a_second(
    servers: tuple[MetricsServer, MetricsServer],
) -> None:
    flaky, steady = servers
    flaky.down_until = time.monotonic() + 4.5  # a blip of 4.5 s from the start
    async with Runtime([f"{flaky.url}/v1", f"{steady.url}/v1"]) as rt:
        await anyio.sleep(max(0.0, flaky.down_until - time.monotonic()))
        assert rt.endpoint_loads()[0].view == "local"  # unknown while it did not answer
        assert flaky.polls >= 3  # asked about every second meanwhile
        recovered = time.monotonic()
        with anyio.fail_after(20):
            while rt.endpoint_loads()[0].view != "engine":  # noqa: ASYNC110 (a poll's effect)
                await anyio.sleep(0.05)
        took = time.monotonic() - recovered
    assert took <= 2.5, took  # today's code: 60 s after three 503s in a row
