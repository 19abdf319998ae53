"""The engine priority on the wire (issue 34): with ``policy="plas"`` the job's
attained-service level, sent only to endpoints that take priorities (``send_priority="auto"``:
those whose replies advertise ``x-agentrt-accept: priority``); under the default FCFS,
level 0 (measured at steady state: sending attained service under FCFS did not help,
docs/benchmarks/steady.md)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from trio.testing import MockClock

from agentrt import Endpoint, Retry, Runtime
from agentrt._protocol import parse_agentrt_header
from agentrt.scheduling import plas_priority
from tests._fake import FakeEngine

pytestmark = pytest.mark.anyio

ACCEPTS = "http://accepts.test/v1"
PLAIN = "http://plain.test/v1"
MSG = [{"role": "user", "content": "hi"}]
CALL_S = 3.0
"""Each reply's latency (virtual time): the service a call adds to its job."""


@pytest.fixture
def anyio_backend() -> Any:
    return ("trio", {"clock": MockClock(autojump_threshold=0)})


class _Engines(FakeEngine):
    """Two engines: ``accepts.test`` advertises ``x-agentrt-accept: priority`` (it
    schedules by priority), ``plain.test`` advertises nothing."""

    async def handle(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle(request)
        if "accepts.test" in str(request.url):
            response.headers["x-agentrt-accept"] = "priority"
        return response


def _priorities(fake: FakeEngine, host: str) -> list[tuple[object, int | None]]:
    """(body ``priority``, the ``x-agentrt`` header's priority) of each call to ``host``."""
    return [
        (s.body.get("priority", "absent"), parse_agentrt_header(s.headers["x-agentrt"]).priority)
        for s in fake.seen
        if host in s.url
    ]


async def _long_then_short(policy: str) -> tuple[_Engines, list[Any]]:
    """A long job (12 calls of 3 s) then a short one (1 call), round robin over an
    endpoint that advertises priority scheduling and one that does not."""
    fake = _Engines(delay_s=CALL_S)
    async with Runtime(
        [ACCEPTS, PLAIN],
        dialect="vllm",
        routing="round_robin",
        policy=policy,
        transport=fake.transport(),
        retry=Retry(attempts=1),
        poll_metrics_s=None,
    ) as rt:
        async with rt.job("long") as job, job.session() as s:
            for _ in range(12):
                await s.chat(model="m", messages=MSG)
        async with rt.job("short") as job2, job2.session() as s2:
            await s2.chat(model="m", messages=MSG)
    return fake, job.report.call_reports + job2.report.call_reports


async def test_plas_sends_the_attained_level_only_where_accepted() -> None:
    """``policy="plas"`` (the opt-in): once an endpoint advertised priority scheduling,
    each call to it carries its job's attained-service level; the endpoint that did not
    ask gets no priority at all."""
    fake, calls = await _long_then_short("plas")
    assert len(calls) == 13 and len(fake.seen) == 13  # one after the other, in order
    assert {c.endpoint for c in calls} == {ACCEPTS, PLAIN}  # round robin: both
    to_accepts = _priorities(fake, "accepts.test")
    to_plain = _priorities(fake, "plain.test")
    assert to_plain and all(p == ("absent", None) for p in to_plain)
    # The first call there learns that accepts.test takes priorities (from its reply);
    # each later one carries its job's level: the long job's k-th call after 3k s of
    # service, the short job's first call at 0.
    expected = [
        plas_priority(CALL_S * k) for k, c in enumerate(calls[:12]) if c.endpoint == ACCEPTS
    ]
    if calls[12].endpoint == ACCEPTS:
        expected.append(0)
    assert to_accepts[0] == ("absent", None)
    assert [p for p, _ in to_accepts[1:]] == expected[1:]
    assert all(body == header for body, header in to_accepts[1:])
    assert max(expected) == 3  # 30 s of service by the long job's last call
    assert [c.priority for c in calls if c.endpoint == PLAIN] == [None] * len(to_plain)


async def test_defaults_send_level_zero_where_accepted() -> None:
    """Runtime's default FCFS has one level: an accepting endpoint gets 0 on every call
    (nothing reordered), the other none."""
    fake, _ = await _long_then_short("fcfs")
    sent = [p for p, _ in _priorities(fake, "accepts.test")]
    assert len(sent) >= 6 and sent == ["absent"] + [0] * (len(sent) - 1)
    assert all(p == ("absent", None) for p in _priorities(fake, "plain.test"))


async def _four_calls(fake: FakeEngine, endpoint: str | Endpoint, **kwargs: Any) -> list[Any]:
    """The ``priority`` body field (None: absent) of a PLAS job's four calls to one
    endpoint."""
    async with Runtime(
        [endpoint],
        dialect="vllm",
        policy="plas",
        transport=fake.transport(),
        retry=Retry(attempts=1),
        **kwargs,
    ) as rt:
        async with rt.job("j") as job, job.session() as s:
            for _ in range(4):
                await s.chat(model="m", messages=MSG)
    return [seen.body.get("priority") for seen in fake.seen]


async def test_no_priority_without_acceptance_or_when_off() -> None:
    assert await _four_calls(FakeEngine(delay_s=CALL_S), PLAIN) == [None] * 4
    off = Endpoint(ACCEPTS, send_priority=False)
    assert await _four_calls(_Engines(delay_s=CALL_S), off) == [None] * 4


async def test_send_priority_true_sends_the_level_to_every_endpoint() -> None:
    sent = await _four_calls(FakeEngine(delay_s=CALL_S), PLAIN, send_priority=True)
    assert sent == [0, 1, 2, 2]
