"""The tool-start notice (docs/protocol.md): sent on a tool wait's start to the endpoint
that served the session's last call, only if it advertised ``idle-notice``; never blocks,
never retried, 405/501 disable it, failures are counted without leaking the API key."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import pytest

from agentrt import NoticeStatistics, Retry, Runtime
from tests._fake import MSG, FakeEngine

pytestmark = pytest.mark.anyio

URL = "http://engine.test/v1"
FAST = Retry(attempts=3, wait_initial=0.0, wait_jitter=0.0)
KEY = "sk-secret-0123456789"


@dataclass
class Server:
    """A fake engine whose replies may advertise notices; records the notices it gets."""

    accept: str | None = "idle-notice"
    status: int = 204
    block: bool = False
    fail: bool = False
    notices: list[tuple[str, httpx.Headers, dict[str, Any]]] = field(default_factory=list)
    fake: FakeEngine = field(default_factory=FakeEngine)
    released: anyio.Event = field(default_factory=anyio.Event)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/agentrt/idle"):
            self.notices.append((str(request.url), request.headers, json.loads(request.content)))
            if self.fail:
                raise httpx.ConnectError(f"refused; sent {request.headers['authorization']}")
            if self.block:
                await self.released.wait()
            return httpx.Response(self.status)
        response = await self.fake.handle(request)
        if self.accept is not None:
            response.headers["x-agentrt-accept"] = self.accept
        return response

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)


async def settle() -> None:
    """Let the background notice run (MockTransport answers without real I/O)."""
    for _ in range(5):
        await anyio.wait_all_tasks_blocked()


async def calls_and_tools(
    server: Server, *, tools: int = 1, api_key: str | None = None
) -> NoticeStatistics:
    """A call, then ``tools`` tool waits, each after a call; the notice statistics."""
    async with Runtime([URL], transport=server.transport(), retry=FAST, api_key=api_key) as rt:
        async with rt.job("j") as job, job.session() as s:
            for _ in range(tools):
                await s.chat(model="m", messages=MSG)
                async with s.tool("search", expected_s=1.0):
                    await settle()
                await settle()
        assert job.report.status == "ok"
        return rt.notice_statistics()


async def test_sent_to_an_advertising_endpoint_with_the_exact_body() -> None:
    server = Server(accept="gzip, Idle-Notice")  # a feature list; matched case-insensitively
    async with Runtime([URL], transport=server.transport(), retry=FAST, api_key=KEY) as rt:
        async with rt.job("j", job_id="job-1") as job, job.session(session_id="ses-1") as s:
            async with s.tool("search", expected_s=2.5):
                pass  # before any call: no endpoint served the session yet
            await settle()
            assert server.notices == []
            await s.chat(model="m", messages=MSG)
            async with s.tool("search", expected_s=2.5):
                await settle()
            async with s.tool("fetch"):  # learned from the wait above
                await settle()
        stats = rt.notice_statistics()
    assert [n[0] for n in server.notices] == [f"{URL}/agentrt/idle"] * 2
    _, headers, body = server.notices[0]
    assert body == {
        "v": 2,
        "session_id": "ses-1",
        "job_id": "job-1",
        "tool": "search",
        "expected_s": 2.5,
        "source": "declared",
    }
    assert headers["content-type"] == "application/json"
    assert headers["authorization"] == f"Bearer {KEY}"
    assert server.notices[1][2]["expected_s"] is None  # "fetch" was never seen
    assert server.notices[1][2]["source"] is None
    assert (stats.sent, stats.accepted, stats.failed, stats.unknown) == (2, 2, 0, 0)


async def test_learned_expectations_say_so() -> None:
    server = Server()
    async with Runtime([URL], transport=server.transport(), retry=FAST) as rt:
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
            async with s.tool("search", expected_s=1.0):
                await settle()
            async with s.tool("search"):
                await settle()
    bodies = [n[2] for n in server.notices]
    assert [b["source"] for b in bodies] == ["declared", "learned"]
    assert bodies[1]["expected_s"] is not None
    assert all("authorization" not in n[1] for n in server.notices)  # the runtime has no key


async def test_not_sent_when_not_advertised() -> None:
    server = Server(accept=None)
    assert (await calls_and_tools(server)).sent == 0
    assert server.notices == []


async def test_an_endpoint_that_stops_advertising_gets_no_more() -> None:
    server = Server()
    async with Runtime([URL], transport=server.transport(), retry=FAST) as rt:
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
            server.accept = "something-else"
            await s.chat(model="m", messages=MSG)
            async with s.tool("search", expected_s=1.0):
                await settle()
    assert server.notices == []


async def test_only_the_endpoint_that_served_the_last_call() -> None:
    seen: list[str] = []
    server = Server()

    async def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/agentrt/idle"):
            seen.append(request.url.host)
        return await server.handle(request)

    eps = ["http://a.test/v1", "http://b.test/v1"]
    async with Runtime(eps, transport=httpx.MockTransport(handle), retry=FAST) as rt:
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
            home = s.endpoint_index
            assert home is not None
            async with s.tool("search", expected_s=1.0):
                await settle()
    assert seen == [("a.test", "b.test")[home]]


async def test_a_slow_endpoint_never_delays_the_tool_and_times_out_as_a_failure() -> None:
    server = Server(block=True)
    async with Runtime([URL], transport=server.transport(), retry=FAST) as rt:
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
            start = anyio.current_time()
            async with s.tool("search", expected_s=1.0):
                entered = anyio.current_time() - start
                await anyio.sleep(1.3)  # past the notice's 1 s timeout
            assert entered < 0.2
        stats = rt.notice_statistics()
    assert (stats.sent, stats.failed) == (1, 1)
    assert stats.last_error is not None and "no answer within 1 s" in stats.last_error


async def test_a_notice_in_flight_when_the_wait_ends_is_cancelled() -> None:
    """The notice lives in the tool block's own task group: leaving the block does not
    wait for it, and a notice still unanswered then is moot (counted as failed)."""
    server = Server(block=True)
    async with Runtime([URL], transport=server.transport(), retry=FAST) as rt:
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
            async with s.tool("search", expected_s=1.0):
                await settle()  # the notice is sent and waits for its answer
                start = anyio.current_time()
            assert anyio.current_time() - start < 0.2
            await s.chat(model="m", messages=MSG)  # the session goes on
        stats = rt.notice_statistics()
    assert len(server.notices) == 1
    assert (stats.sent, stats.failed, stats.accepted) == (1, 1, 0)
    assert stats.last_error is not None and "tool wait ended before an answer" in stats.last_error
    assert job.report.status == "ok" and job.report.tool_reports[0].status == "ok"


async def test_a_tools_error_is_raised_as_it_is_with_a_notice_in_flight() -> None:
    """The notice's task group never wraps the tool's own exception in a group."""
    server = Server(block=True)
    async with Runtime([URL], transport=server.transport(), retry=FAST) as rt:
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
            with pytest.raises(ValueError, match="tool failed"):
                async with s.tool("search", expected_s=1.0):
                    await settle()
                    raise ValueError("tool failed")
            await s.chat(model="m", messages=MSG)
    assert len(server.notices) == 1
    assert job.report.status == "ok"
    assert job.report.tool_reports[0].status == "error"


async def test_a_cancelled_tool_wait_with_a_notice_in_flight_is_cancelled() -> None:
    server = Server(block=True)
    async with Runtime([URL], transport=server.transport(), retry=FAST) as rt:
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
            with anyio.move_on_after(0.05):
                async with s.tool("search", expected_s=1.0):
                    await anyio.sleep(5)
    assert job.report.status == "ok"
    assert job.report.tool_reports[0].status == "cancelled"
    assert rt.notice_statistics().failed == 1


async def test_a_single_endpoint_runtime_opens_no_task_group() -> None:
    """Without background work the runtime's block is not wrapped in a task group (whose
    cancel scope would make every call's HTTP-level scopes dearer); notices still go."""
    server = Server()
    async with Runtime([URL], transport=server.transport(), retry=FAST) as rt:
        assert rt._upkeep._tasks is None
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
            async with s.tool("search", expected_s=1.0):
                await settle()
    assert len(server.notices) == 1
    eps = ["http://a.test/v1", "http://b.test/v1"]
    async with Runtime(eps, transport=server.transport(), retry=FAST) as rt:
        assert rt._upkeep._tasks is not None  # health probes


@pytest.mark.parametrize("endpoints", [1, 2])
async def test_a_framework_adapter_wait_uses_the_runtime_task_group(endpoints: int) -> None:
    """A wait with no block of its own (agentrt.integrations) sends its notice on the
    runtime's task group; a runtime without one counts it as skipped."""
    from agentrt.integrations import Bridge

    server = Server()
    eps = ["http://a.test/v1", "http://b.test/v1"][:endpoints]
    async with Runtime(eps, transport=server.transport(), retry=FAST) as rt:
        bridge = Bridge(rt)
        job = bridge.start_job("run", "agent")
        assert job is not None
        session = bridge.start_session("llm", "run", "agent")
        assert session is not None
        await session.chat(model="m", messages=MSG)
        bridge.start_tool("t1", "llm", "search", expected_s=1.0)
        await settle()
        bridge.end_tool("t1")
        bridge.end_job("run")
        stats = rt.notice_statistics()
    if endpoints == 1:
        assert server.notices == []
        assert (stats.sent, stats.skipped) == (0, 1)
    else:
        assert len(server.notices) == 1
        assert (stats.sent, stats.accepted, stats.skipped) == (1, 1, 0)


@pytest.mark.parametrize("status", [500, 503, 429])
async def test_never_retried(status: int) -> None:
    server = Server(status=status)
    stats = await calls_and_tools(server)
    assert len(server.notices) == 1
    assert (stats.sent, stats.failed, stats.disabled) == (1, 1, ())
    assert stats.last_error == f"POST {URL}/agentrt/idle: HTTP {status}"


async def test_404_is_harmless() -> None:
    server = Server(status=404)
    stats = await calls_and_tools(server, tools=2)
    assert len(server.notices) == 2  # still sent
    assert (stats.sent, stats.unknown, stats.failed) == (2, 2, 0)


@pytest.mark.parametrize("status", [405, 501])
async def test_405_or_501_disables_the_endpoint(status: int) -> None:
    server = Server(status=status)
    stats = await calls_and_tools(server, tools=2)  # its replies still advertise
    assert len(server.notices) == 1
    assert stats.disabled == (URL,) and stats.failed == 1


async def test_a_failure_is_counted_not_raised_and_never_shows_the_key() -> None:
    server = Server(fail=True)
    stats = await calls_and_tools(server, api_key=KEY)
    assert server.notices[0][1]["authorization"] == f"Bearer {KEY}"  # it was sent
    assert stats.failed == 1
    assert stats.last_error is not None and "ConnectError" in stats.last_error
    assert KEY not in stats.last_error and "***" in stats.last_error


async def test_nothing_is_sent_after_close() -> None:
    server = Server()
    rt = Runtime([URL], transport=server.transport(), retry=FAST)
    async with rt:
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
            async with s.tool("search", expected_s=1.0):
                await settle()
    late = rt._core.tool_started(job.id, s.id, s.endpoint_index, "late", 1.0, "declared")
    assert late is None  # a late tool start
    assert len(server.notices) == 1
    assert rt.notice_statistics().sent == 1


def test_the_advertisement_is_read_from_any_headers() -> None:
    from agentrt._notice import accept_header, accepts_notice

    candidates: list[Any] = [
        httpx.Headers({"X-Agentrt-Accept": "gzip, IDLE-NOTICE"}),
        {"x-agentrt-accept": "gzip, IDLE-NOTICE"},  # no raw list: Mapping.get
    ]
    try:  # httpx2 comes with openai 3.x only
        import httpx2
    except ImportError:
        pass
    else:
        candidates.append(httpx2.Headers({"X-Agentrt-Accept": "gzip, IDLE-NOTICE"}))
    for headers in candidates:
        value = accept_header(headers)
        assert value == "gzip, IDLE-NOTICE"
        assert accepts_notice(value)
    assert accept_header(httpx.Headers({"content-type": "a"})) is None
    assert not accepts_notice(None) and not accepts_notice("idle-notices, notice")


async def test_end_to_end_on_the_embedded_engine() -> None:
    """The embedded engine advertises notices and counts the ones it accepts; one for a
    session it never served is a 404, counted as unknown."""
    from agentrt.sim import PRESETS, Cluster

    config = PRESETS["h100-8b"].replace(tool_wait_policy="pin")
    async with Cluster(2, config) as cluster:
        async with Runtime(cluster.base_urls, transport=cluster.transport(), retry=FAST) as rt:
            async with rt.job("j") as job, job.session() as s:
                await s.chat(model="m", messages=MSG, max_tokens=4)
                home = s.endpoint_index
                assert home is not None
                async with s.tool("search", expected_s=5.0):
                    await anyio.sleep(0.05)
                async with s.tool("fetch"):
                    await anyio.sleep(0.05)
                await s.chat(model="m", messages=MSG, max_tokens=4)
                s.endpoint_index = 1 - home  # as if it had moved: the other never saw it
                rt._core.endpoints[1 - home].notices = True
                async with s.tool("search", expected_s=5.0):
                    await anyio.sleep(0.05)
            stats = rt.notice_statistics()
        replicas = cluster.stats()
    assert (stats.sent, stats.accepted, stats.unknown, stats.failed) == (3, 2, 1, 0)
    assert replicas[home].idle_notices == 2
    assert replicas[1 - home].idle_notices == 0
