"""A first turn whose attempt failed is still a first turn (issue 35, item 2): a
caller-given id goes to the next replica in its agreed (rendezvous) order, as a process
that already knew the replica was down sends it, and the call is not reported as a
session move (nothing of the session was anywhere)."""

from __future__ import annotations

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
        async with Runtime(URLS, transport=transport, retry=RETRY) as rt:
            async with rt.job("j") as job, job.session(session_id=sid) as s:
                await s.chat(model="m", messages=MSG)
        call = job.report.call_reports[0]
        assert call.endpoint == order[1], (sid, call.endpoint, order)
        assert not call.moved
        assert job.report.session_moves == 0
