"""``agentrt tune --endpoint``: the twin's engine fitted to a probe of a live server (the
embedded engine served on loopback, in wall-clock time)."""

from __future__ import annotations

import anyio
import pytest

from agentrt.sim import PRESETS, serve_async
from agentrt.tune._fit import from_probe

pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # uvicorn runs on asyncio


async def test_a_probe_fits_the_served_engines_costs() -> None:
    served = PRESETS["cpu-tiny"]
    async with anyio.create_task_group() as tg:
        urls = await tg.start(serve_async, 1, "127.0.0.1", 0, served)
        engine, fit = await anyio.to_thread.run_sync(from_probe, urls[0], PRESETS["h100-8b"])
        tg.cancel_scope.cancel()
    assert fit.source == "probe"
    # The h100 preset's limits, the served engine's costs: a decode step of one sequence
    # (step + per sequence) near cpu-tiny's 1.4 ms, not h100-8b's 6.3 ms.
    assert engine.max_num_batched_tokens == PRESETS["h100-8b"].max_num_batched_tokens
    want = served.cost.step_s + served.cost.decode_seq_s
    got = engine.cost.step_s + engine.cost.decode_seq_s
    assert got == pytest.approx(want, rel=0.5)
    assert fit.decode_scale < 0.5


def test_a_probe_of_no_server_says_what_to_do() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    with pytest.raises(ValueError) as info:
        from_probe(url, PRESETS["h100-8b"])
    assert str(info.value).startswith(f"probing {url} failed: ConnectError")
    assert f"is a server running at {url}? Check --endpoint" in str(info.value)
