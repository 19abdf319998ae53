"""How the transport classifies and retries what goes wrong on the wire (issue 25, items 4
and 5), on real loopback sockets (the fault server), on asyncio and trio, through
``session.chat``, ``rt.openai()`` and ``SyncRuntime``:

- a kept-alive connection the server had closed (its next request dropped or reset
  before any reply) is resent at once on a fresh connection, in the same attempt: no
  failure counted, no retry spent, no session moved;
- only a failed connect marks an endpoint down at once and sends the retry elsewhere; a
  read timeout or a connection dropped after connecting counts one failure toward the
  health threshold and retries where the session is (docs/routing.md, "Endpoint health");
- openai's client never retries on top of agentrt: the requests on the wire are the
  attempts agentrt's policy allows, whatever the client's ``max_retries``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Any

import anyio
import openai
import pytest
from _faultserver import MODEL, Fault, FaultServer, fault_server, refused_url

import agentrt
from agentrt.scheduling import EndpointLoad, RouteKey
from agentrt.telemetry import AttemptFailed, Event, SessionMoved

pytestmark = pytest.mark.timeout(30)

FAST = agentrt.Retry(attempts=3, wait_initial=0.01, wait_max=0.05, wait_jitter=0.0)
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]


class FirstAllowed:
    """Routes every call to the first endpoint the fallback order allows (deterministic:
    endpoint 0 unless it is avoided or down)."""

    name = "first"

    def choose(self, loads: Sequence[EndpointLoad], key: RouteKey, avoid: Collection[int]) -> int:
        for tier in (
            [i for i, e in enumerate(loads) if e.healthy and i not in avoid],
            [i for i in range(len(loads)) if i not in avoid],
        ):
            if tier:
                return tier[0]
        return 0

    def served(self, index: int, key: RouteKey) -> None:
        pass


class Events:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type[Event]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


def dropped_when_reused() -> Fault:
    """A reply on a new connection; on a kept-alive one, the connection closed unanswered
    (a server that closes idle connections just as the client reuses them)."""
    ok = Fault.ok()

    async def action(conn: Any, seen: Any) -> bool:
        return False if seen.reused else await ok.action(conn, seen)

    return Fault("dropped-when-reused", action)


@pytest.fixture
def servers() -> Any:
    with fault_server() as a, fault_server() as b:
        yield a, b


def kwargs(**given: Any) -> dict[str, Any]:
    """A test runtime's keyword arguments: fast retries, no metrics polls (their GETs
    would share the connections), endpoint 0 first unless said otherwise."""
    return {"retry": FAST, "otel": False, "poll_metrics_s": None, "routing": FirstAllowed()} | given


async def two_calls(rt: agentrt.Runtime, via: str, name: str) -> agentrt.Job:
    """A job of one session making two calls, through ``session.chat`` or ``rt.openai()``."""
    async with rt.job(name) as job, job.session("s") as s:
        for _ in range(2):
            if via == "session.chat":
                await s.chat(model=MODEL, messages=MESSAGES)
            else:
                await rt.openai().chat.completions.create(model=MODEL, messages=MESSAGES)
    return job


def health(rt: agentrt.Runtime | agentrt.SyncRuntime, i: int) -> Any:
    core = rt.runtime._core if isinstance(rt, agentrt.SyncRuntime) else rt._core
    return core.endpoints[i].health.statistics()


# -- item 4: a stale kept-alive connection is resent, not counted --------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("fault", ["drop", "reset"])
@pytest.mark.parametrize("via", ["session.chat", "rt.openai()"])
async def test_a_stale_kept_alive_connection_is_resent_on_a_fresh_one(
    servers: tuple[FaultServer, FaultServer], fault: str, via: str
) -> None:
    """The session's second call reuses the first one's connection, which the server
    closes on it (no reply: RemoteProtocolError, or a reset: ReadError): agentrt resends
    it at once on a new connection. The call is ok in one attempt, on the session's
    replica; nothing failed, the endpoint is healthy with no failure counted."""
    stale = Fault.drop() if fault == "drop" else Fault.reset()
    for srv in servers:
        srv.push(Fault.ok(), stale)
    events = Events()
    async with agentrt.Runtime(
        [s.url for s in servers], **kwargs(routing="session_affinity", hooks=[events])
    ) as rt:
        job = await two_calls(rt, via, "stale")
        stats = [health(rt, 0), health(rt, 1)]
    report = job.report
    assert report.status == "ok"
    first, second = report.call_reports
    assert (second.status, second.attempts, second.moved) == ("ok", 1, False)
    assert second.endpoint == first.endpoint
    used = next(s for s in servers if s.url == first.endpoint)
    other = next(s for s in servers if s is not used)
    assert [s.fault for s in used.chat_requests] == ["ok", stale.name, "ok"]
    assert [s.reused for s in used.chat_requests] == [False, True, False]
    assert used.connections == 2 and other.chat_requests == []
    assert events.of(AttemptFailed) == [] and events.of(SessionMoved) == []
    assert [(h.healthy, h.failures, h.downs) for h in stats] == [(True, 0, 0)] * 2
    assert report.session_moves == 0 and report.retries == 0


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_sync_runtime_resends_a_stale_connection_too(
    servers: tuple[FaultServer, FaultServer], backend: str
) -> None:
    a, b = servers
    a.push(Fault.ok(), Fault.drop())
    with agentrt.SyncRuntime([a.url, b.url], **kwargs(backend=backend)) as rt:
        with rt.job("stale") as job, job.session("s") as s:
            s.chat(model=MODEL, messages=MESSAGES)
            rt.openai().chat.completions.create(model=MODEL, messages=MESSAGES)
        stats = health(rt, 0)
    assert [(c.status, c.attempts, c.moved) for c in job.report.call_reports] == [
        ("ok", 1, False),
        ("ok", 1, False),
    ]
    assert len(a.chat_requests) == 3 and b.chat_requests == []
    assert (stats.healthy, stats.failures, stats.downs) == (True, 0, 0)


@pytest.mark.anyio
async def test_the_callers_own_trace_callback_still_sees_every_event(
    servers: tuple[FaultServer, FaultServer],
) -> None:
    """agentrt tells kept-alive connections by httpcore's ``trace`` extension; a caller's
    own ``trace`` gets every event as without agentrt, and its request's extensions are
    left as they were."""
    a, _ = servers
    a.push(Fault.ok(), Fault.drop())
    seen: list[str] = []

    async def trace(name: str, info: dict[str, Any]) -> None:
        seen.append(name)

    extensions: dict[str, Any] = {"trace": trace}
    async with agentrt.Runtime([a.url], **kwargs()) as rt:
        client = rt.http_client()
        async with rt.job("traced") as job, job.session("s"):
            for _ in range(2):
                reply = await client.post(
                    a.url + "/chat/completions",
                    json={"model": MODEL, "messages": MESSAGES},
                    extensions=extensions,
                )
                assert reply.status_code == 200
    assert extensions == {"trace": trace}
    assert seen.count("connection.connect_tcp.started") == 2  # the first, and the resend
    assert seen.count("http11.send_request_headers.started") == 3
    assert seen.count("http11.receive_response_body.complete") == 2
    assert [c.attempts for c in job.report.call_reports] == [1, 1]


@pytest.mark.anyio
async def test_a_fresh_connection_dropped_is_a_failure_not_a_down(
    servers: tuple[FaultServer, FaultServer],
) -> None:
    """A connection made for the call and then closed without a reply is the endpoint's
    failure: counted toward the threshold, retried where the session is (no failover,
    which only a failed connect makes), the endpoint still up."""
    a, b = servers
    a.push(Fault.drop())
    events = Events()
    async with agentrt.Runtime([a.url, b.url], **kwargs(hooks=[events])) as rt:
        async with rt.job("fresh") as job, job.session("s") as s:
            await s.chat(model=MODEL, messages=MESSAGES)
        stats = health(rt, 0)
    (call,) = job.report.call_reports
    assert (call.status, call.attempts, call.endpoint) == ("ok", 2, a.url)
    assert [s.fault for s in a.chat_requests] == ["drop", "ok"] and b.chat_requests == []
    assert (stats.healthy, stats.downs) == (True, 0)
    (failed,) = events.of(AttemptFailed)
    assert "RemoteProtocolError" in failed.error and failed.will_retry


@pytest.mark.anyio
async def test_read_timeouts_count_toward_the_threshold(
    servers: tuple[FaultServer, FaultServer],
) -> None:
    """A slow reply (a read timeout) is one failure: a session's call is retried on its
    replica and the replica stays up; only the third failure in a row (within the
    window) marks it down, as docs/routing.md says."""
    a, b = servers
    a.push(Fault.stall(2.0))
    retry = agentrt.Retry(attempts=2, wait_initial=0.01, wait_max=0.05, wait_jitter=0.0)
    async with agentrt.Runtime([a.url, b.url], **kwargs(retry=retry, timeout_s=0.3)) as rt:
        async with rt.job("slow") as job, job.session("s") as s:
            await s.chat(model=MODEL, messages=MESSAGES)  # a timeout, then ok on a
            after_one = health(rt, 0)
            a.push(Fault.stall(2.0), Fault.stall(2.0))
            with pytest.raises(agentrt.EndpointError):
                await s.chat(model=MODEL, messages=MESSAGES)  # two timeouts: 2 failures
            after_two = health(rt, 0)
            a.push(Fault.stall(2.0))
            await s.chat(model=MODEL, messages=MESSAGES)  # the third: down, then to b
        after_three = health(rt, 0)
    one, two, three = job.report.call_reports
    assert (one.status, one.attempts, one.endpoint, one.moved) == ("ok", 2, a.url, False)
    assert (after_one.healthy, after_one.downs) == (True, 0)
    assert (two.status, two.attempts, two.endpoint, two.moved) == ("error", 2, a.url, False)
    assert (after_two.healthy, after_two.failures, after_two.downs) == (True, 2, 0)
    assert (three.status, three.attempts, three.endpoint, three.moved) == ("ok", 2, b.url, True)
    assert (after_three.healthy, after_three.downs) == (False, 1)


@pytest.mark.anyio
async def test_a_failed_connect_still_marks_down_at_once_and_fails_over(
    servers: tuple[FaultServer, FaultServer],
) -> None:
    a, _ = servers
    refused = refused_url()
    async with agentrt.Runtime([refused, a.url], **kwargs()) as rt:
        async with rt.job("refused") as job, job.session("s") as s:
            await s.chat(model=MODEL, messages=MESSAGES)
        stats = health(rt, 0)
    (call,) = job.report.call_reports
    assert (call.status, call.attempts, call.endpoint) == ("ok", 2, a.url)
    assert (stats.healthy, stats.downs) == (False, 1)


@pytest.mark.anyio
async def test_many_stale_connections_on_two_replicas_move_nothing(
    servers: tuple[FaultServer, FaultServer],
) -> None:
    """Sub-agents in parallel on two replicas whose every second request on a connection
    is dropped (a server closing kept-alive connections as they are reused): every job
    ends ok, no endpoint goes down, no session moves, no attempt fails."""
    for srv in servers:
        srv.default = dropped_when_reused()
    events = Events()
    async with agentrt.Runtime(
        [s.url for s in servers], **kwargs(routing="session_affinity", hooks=[events])
    ) as rt:

        async def one(i: int) -> None:
            async with rt.job(f"j{i}") as job, job.session("root") as root:
                await root.chat(model=MODEL, messages=MESSAGES)

                async def child(c: int) -> None:
                    async with job.session(f"sub{c}", parent=root, blocks_parent=True) as s:
                        for _ in range(2):
                            await s.chat(model=MODEL, messages=MESSAGES)

                async with anyio.create_task_group() as tg:
                    for c in range(2):
                        tg.start_soon(child, c)
                await root.chat(model=MODEL, messages=MESSAGES, final=True)

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(one, i)
        stats = [health(rt, 0), health(rt, 1)]
        reports = rt.reports()
    assert len(reports) == 20 and all(r.status == "ok" for r in reports)
    assert sum(r.session_moves for r in reports) == 0
    failed = events.of(AttemptFailed)
    assert failed == [] and events.of(SessionMoved) == []
    assert [h.downs for h in stats] == [0, 0]
    calls = [c for r in reports for c in r.call_reports]
    seen = [s for srv in servers for s in srv.chat_requests]
    drops = [s for s in seen if s.reused]
    assert drops  # the pools did reuse connections (and each such request was dropped)
    assert sum(c.attempts for c in calls) == len(seen) - len(drops)


# -- item 5: openai's client never retries on top of agentrt -------------------------------------


TWO = agentrt.Retry(attempts=2, wait_initial=0.01, wait_max=0.02, wait_jitter=0.0)


def _openai_retries_allowed(client: Any, max_retries: int) -> Any:
    """``client`` with openai's own retries at ``max_retries`` (for a fast test: openai's
    backoff made instant)."""
    client.max_retries = max_retries
    return client


@pytest.mark.anyio
async def test_with_options_max_retries_is_refused(
    servers: tuple[FaultServer, FaultServer],
) -> None:
    a, _ = servers
    async with agentrt.Runtime([a.url], retry=TWO, otel=False) as rt:
        client = rt.openai()
        for build in (
            lambda: client.with_options(max_retries=3),
            lambda: client.copy(max_retries=1),
        ):
            with pytest.raises(ValueError, match="agentrt owns retries"):
                build()
        same = client.with_options(max_retries=0, timeout=5.0)
        assert same.max_retries == 0
        await same.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert len(a.chat_requests) == 1


def test_the_sync_clients_with_options_max_retries_is_refused(
    servers: tuple[FaultServer, FaultServer],
) -> None:
    a, _ = servers
    with agentrt.SyncRuntime([a.url], retry=TWO, otel=False) as rt:
        client = rt.openai()
        with pytest.raises(ValueError, match="agentrt owns retries"):
            client.with_options(max_retries=3)
        with pytest.raises(ValueError, match="agentrt owns retries"):
            client.copy(max_retries=2)


@pytest.mark.anyio
@pytest.mark.parametrize("route", ["attribute", "own client", "request options"])
async def test_openai_retries_never_stack_on_agentrts(
    servers: tuple[FaultServer, FaultServer], route: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 503 storm: the requests on the wire are the 2 attempts agentrt's policy allows,
    one call in the report, however the openai client was given retries of its own
    (``client.max_retries = 3``; an ``AsyncOpenAI`` of the caller's on
    ``rt.http_client()``; ``options={"max_retries": 3}`` on a request)."""
    a, _ = servers
    a.default = Fault.status(503)
    # openai's own backoff (0.5 s and up) made instant, should it retry.
    monkeypatch.setattr(openai.AsyncOpenAI, "_calculate_retry_timeout", lambda *a, **k: 0.0)
    async with agentrt.Runtime([a.url], retry=TWO, otel=False) as rt:
        async with rt.job("storm") as job, job.session("s"):
            if route == "attribute":
                client = _openai_retries_allowed(rt.openai(), 3)
            else:
                client = openai.AsyncOpenAI(
                    base_url=a.url, api_key="k", http_client=rt.http_client(), max_retries=3
                )
            with pytest.raises(openai.InternalServerError):
                if route == "request options":
                    await client.post(
                        "/chat/completions",
                        body={"model": MODEL, "messages": MESSAGES},
                        cast_to=openai.types.chat.ChatCompletion,
                        options={"max_retries": 3},
                    )
                else:
                    await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert len(a.chat_requests) == 2
    (call,) = job.report.call_reports
    assert (call.status, call.attempts, call.turn, call.http_status) == ("error", 2, 0, 503)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_sync_clients_retries_never_stack_either(
    servers: tuple[FaultServer, FaultServer], backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _ = servers
    a.default = Fault.status(503)
    monkeypatch.setattr(openai.OpenAI, "_calculate_retry_timeout", lambda *a, **k: 0.0)
    with agentrt.SyncRuntime([a.url], retry=TWO, otel=False, backend=backend) as rt:
        with rt.job("storm") as job, job.session("s"):
            own = openai.OpenAI(
                base_url=a.url, api_key="k", http_client=rt.http_client(), max_retries=3
            )
            with pytest.raises(openai.InternalServerError):
                own.chat.completions.create(model=MODEL, messages=MESSAGES)
            with pytest.raises(openai.InternalServerError):
                _openai_retries_allowed(rt.openai(), 3).chat.completions.create(
                    model=MODEL, messages=MESSAGES
                )
    assert len(a.chat_requests) == 4
    assert [(c.attempts, c.turn) for c in job.report.call_reports] == [(2, 0), (2, 1)]


# -- item 10: backoff is not attained service ----------------------------------------------------


def _service_s(seen: Any) -> float:
    found = re.search(r"(?:^|, )svc-s=([0-9.]+)", seen.headers["x-agentrt"])
    assert found is not None
    return float(found.group(1))


@pytest.mark.anyio
@pytest.mark.parametrize("via", ["session.chat", "rt.openai()"])
async def test_backoff_after_a_503_is_not_attained_service(
    servers: tuple[FaultServer, FaultServer], via: str
) -> None:
    """A call that slept 0.6 s in backoff (the 503's retry-after-ms) was served for a
    few milliseconds: the program's next call says so in ``svc-s`` (which PLAS orders
    by: a program is not demoted for the 503s it met)."""
    a, _ = servers
    a.push(Fault.status(503, retry_after_ms="600"))
    retry = agentrt.Retry(attempts=2, wait_initial=0.01, wait_max=0.01, wait_jitter=0.0)
    async with agentrt.Runtime([a.url], **kwargs(retry=retry)) as rt:
        job = await two_calls(rt, via, "backoff")
    first, _ = job.report.call_reports
    assert first.attempts == 2 and first.latency_s >= 0.6  # the caller did wait
    requests = a.chat_requests
    assert [_service_s(r) for r in requests[:2]] == [0.0, 0.0]  # both attempts of call 1
    assert _service_s(requests[2]) < 0.3 < first.latency_s - first.queue_s


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_sync_runtimes_backoff_is_not_service_either(
    servers: tuple[FaultServer, FaultServer], backend: str
) -> None:
    a, _ = servers
    a.push(Fault.status(429, retry_after_ms="600"))
    retry = agentrt.Retry(attempts=2, wait_initial=0.01, wait_max=0.01, wait_jitter=0.0)
    with agentrt.SyncRuntime([a.url], **kwargs(retry=retry, backend=backend)) as rt:
        with rt.job("backoff") as job, job.session("s") as s:
            s.chat(model=MODEL, messages=MESSAGES)
            s.chat(model=MODEL, messages=MESSAGES)
    assert job.report.call_reports[0].latency_s >= 0.6
    assert _service_s(a.chat_requests[2]) < 0.3
