"""A first turn whose attempt failed is still a first turn (issue 35, item 2): a
caller-given id goes to the next replica in its agreed (rendezvous) order, as a process
that already knew the replica was down sends it, and the call is not reported as a
session move (nothing of the session was anywhere)."""

from __future__ import annotations

import anyio
import httpx
import pytest

from agentrt import Retry, Runtime
from agentrt.scheduling._routing import EndpointLoad, _rendezvous
from tests._fake import MSG, FakeEngine

URLS = [f"http://r{i}.test/v1" for i in range(4)]
RETRY = Retry(attempts=3, wait_initial=0.0, wait_jitter=0.0)


@pytest.mark.anyio
async def test_a_failed_first_attempt_fails_over_in_the_agreed_order() -> None:
    names, idle = [u.encode() for u in URLS], [EndpointLoad() for _ in URLS]
    for n in range(12):
        sid = f"agreed-{n}"
        order = [URLS[i] for i in _rendezvous(sid, names, idle)]
        dead = order[0].split("/v1")[0]
        fake = FakeEngine()

        def refuse(request: httpx.Request, dead: str = dead) -> httpx.Response | None:
            if str(request.url).startswith(dead):
                raise httpx.ConnectError("refused", request=request)
            return None

        async def handler(request: httpx.Request, fake: FakeEngine = fake) -> httpx.Response:
            refuse(request)
            return await fake.handle(request)

        transport = httpx.MockTransport(handler)
        # No polls: a poll refused would mark the replica down before the first attempt.
        async with Runtime(URLS, transport=transport, retry=RETRY, poll_metrics_s=None) as rt:
            async with rt.job("j") as job, job.session(session_id=sid) as s:
                await s.chat(model="m", messages=MSG)
        call = job.report.call_reports[0]
        assert call.endpoint == order[1], (sid, call.endpoint, order)
        assert not call.moved
        assert job.report.session_moves == 0


def test_a_replica_refusing_its_metrics_poll_is_down_before_any_call() -> None:
    """A replica that refuses connections is found by its metrics poll: it is marked down
    then, as a refused attempt would mark it, and no new session pays a failed attempt on
    it (it used to stay up until a call failed there). Virtual time."""
    from agentrt.bench._clock import VirtualTimeLoop

    fake = FakeEngine()
    refused: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "r3.test":
            refused.append(request.method)
            raise httpx.ConnectError("refused", request=request)
        return await fake.handle(request)

    async def main() -> None:
        async with Runtime(URLS, transport=httpx.MockTransport(handler), retry=RETRY) as rt:
            await anyio.sleep(1.5)  # every replica polled once
            assert [load.healthy for load in rt.endpoint_loads()] == [True, True, True, False]
            assert rt._core.endpoints[3].health.statistics().downs == 1
            for _ in range(8):
                async with rt.job("j") as job, job.session() as s:
                    await s.chat(model="m", messages=MSG)
                assert job.report.call_reports[0].attempts == 1

    anyio.run(main, backend_options={"loop_factory": VirtualTimeLoop})
    assert refused and "POST" not in refused  # polled and probed, never sent a call
