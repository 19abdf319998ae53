"""`agentrt sim serve`: the embedded engine served on loopback in wall-clock time."""

from __future__ import annotations

import anyio
import httpx
import pytest

import agentrt
from agentrt.sim import serve_async

pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # uvicorn runs on asyncio


async def test_served_replicas_answer_agentrt_over_loopback() -> None:
    async with anyio.create_task_group() as tg:
        urls = await tg.start(serve_async, 2, "127.0.0.1", 0, "h100-8b")
        assert len(urls) == 2 and all(u.startswith("http://127.0.0.1:") for u in urls)
        async with agentrt.Runtime(list(urls), dialect="vllm") as rt:
            async with rt.job("served") as job, job.session() as s:
                for _ in range(2):
                    await s.chat(
                        model="m",
                        messages=[{"role": "user", "content": "x " * 200}],
                        max_tokens=4,
                    )
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(urls[0].removesuffix("/v1") + "/metrics")).text
        tg.cancel_scope.cancel()
    assert job.report.status == "ok" and job.report.calls == 2
    assert (job.report.call_reports[1].cached_tokens or 0) > 0
    assert "vllm:prefix_cache_hits" in metrics
