"""Runtime, jobs, sessions and tool waits over a fake OpenAI-compatible server."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import httpx
import pytest

import agentrt
from agentrt import Endpoint, Retry, Runtime
from agentrt._protocol import CallMetadata, parse_agentrt_header
from agentrt.telemetry import CallEnded, Event
from tests._fake import MSG, FakeEngine, Seen

pytestmark = pytest.mark.anyio

URL = "http://engine.test/v1"
FAST = Retry(attempts=3, wait_initial=0.0, wait_jitter=0.0)


def meta(seen: Seen) -> CallMetadata:
    """The agentrt metadata a request carried, read as a server reads it."""
    return parse_agentrt_header(seen.headers["x-agentrt"])


def rt_for(fake: FakeEngine, **kwargs: object) -> Runtime:
    kwargs.setdefault("retry", FAST)
    return Runtime([URL], transport=fake.transport(), **kwargs)  # type: ignore[arg-type]


async def test_chat_tags_turns_and_reports() -> None:
    fake = FakeEngine(prompt_tokens=100, completion_tokens=7, cached_tokens=64)
    async with rt_for(fake) as rt:
        async with rt.job("fix-bug", job_id="job-1") as job:
            async with job.session("main", session_id="ses-1") as s:
                reply = await s.chat(model="m", messages=MSG, max_tokens=7)
                assert reply.choices[0].message.content == "hello"
                await s.chat(model="m", messages=MSG)
    h0, m0, m1 = fake.seen[0].headers, meta(fake.seen[0]), meta(fake.seen[1])
    assert fake.seen[0].url == f"{URL}/chat/completions"
    assert [k for k in h0 if k.startswith("x-agentrt")] == ["x-agentrt"]
    assert h0["x-agentrt"].startswith("v=2, ")
    assert m0.job_id == "job-1"
    assert m0.session_id == "ses-1"
    assert m0.program_id == "job-1"
    assert (m0.turn, m0.first_turn) == (0, True)
    assert (m1.turn, m1.first_turn) == (1, False)
    assert m0.call_id != m1.call_id
    assert m0.idle_s is None and m1.idle_s is not None
    assert m0.parent_session_id is None
    assert m0.priority is None
    # The generic dialect adds nothing to the body.
    assert set(fake.seen[0].body) == {"model", "messages", "max_tokens"}

    rep = job.report
    assert rep.status == "ok" and rep.calls == 2 and rep.sessions == 1
    assert rep.prompt_tokens == 200 and rep.completion_tokens == 14 and rep.cached_tokens == 128
    assert rep.cache_hit_rate == pytest.approx(0.64)
    c0 = rep.call_reports[0]
    assert (c0.session_id, c0.turn, c0.endpoint, c0.attempts) == ("ses-1", 0, URL, 1)
    assert c0.status == "ok" and c0.latency_s is not None and c0.latency_s >= 0
    assert rep.jct_s >= rep.critical_llm_s >= 0
    assert rt.reports()[-1].job_id == "job-1"


async def test_attained_service_accumulates_per_program() -> None:
    fake = FakeEngine(prompt_tokens=10, completion_tokens=5, delay_s=0.01)
    async with rt_for(fake) as rt:
        async with rt.job("a", program_id="prog") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
            await s.chat(model="m", messages=MSG)
        async with rt.job("b", program_id="other") as job2, job2.session() as s2:
            await s2.chat(model="m", messages=MSG)
    h = [meta(x) for x in fake.seen]
    assert h[0].service_tokens == 0
    assert h[0].service_s == 0.0
    assert h[1].service_tokens == 15
    assert h[1].service_s >= 0.009
    assert h[1].program_id == "prog"
    # Another program starts from zero.
    assert h[2].service_tokens == 0


async def test_tool_wait_idle_declared_and_measured() -> None:
    fake = FakeEngine()
    async with rt_for(fake) as rt:
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
            async with s.tool("pytest", expected_s=2.5):
                assert s.idle
                await anyio.sleep(0.05)
            assert not s.idle
            s.expect_idle(4.0)
            await s.chat(model="m", messages=MSG)
            await s.chat(model="m", messages=MSG)
    h1, h2 = meta(fake.seen[1]), meta(fake.seen[2])
    assert h1.idle_s is not None and h1.idle_s >= 0.05
    assert h1.idle_declared_s == 2.5
    assert (h1.idle_expected_s, h1.idle_expected_source) == (4.0, "declared")
    # Declarations are consumed by the next call.
    assert h2.idle_declared_s is None and h2.idle_expected_s is None
    assert h2.idle_expected_source is None
    rep = job.report
    assert rep.tool_waits == 1
    (t,) = rep.tool_reports
    assert t.name == "pytest" and t.expected_s == 2.5 and t.duration_s >= 0.05
    assert rep.tool_s == pytest.approx(t.duration_s)
    assert rep.jct_s >= rep.tool_s + rep.critical_llm_s - 1e-9


async def test_parent_session_and_concurrent_sessions() -> None:
    fake = FakeEngine(delay_s=0.02)
    async with rt_for(fake) as rt:
        async with rt.job("fan") as job, job.session("planner") as planner:
            await planner.chat(model="m", messages=MSG)

            async def sub(i: int) -> None:
                async with job.session(f"sub{i}", parent=planner) as s:
                    await s.chat(model="m", messages=MSG)

            async with anyio.create_task_group() as tg:
                for i in range(4):
                    tg.start_soon(sub, i)
    subs = [meta(x) for x in fake.seen if meta(x).parent_session_id]
    assert len(subs) == 4
    assert {x.parent_session_id for x in subs} == {planner.id}
    rep = job.report
    assert rep.sessions == 5 and rep.calls == 5
    # Four concurrent 20 ms calls: their sum exceeds the time on the critical path.
    assert rep.llm_s > rep.critical_llm_s
    assert rep.jct_s >= rep.critical_llm_s


async def test_two_hundred_concurrent_sessions_keep_metadata_apart() -> None:
    fake = FakeEngine(delay_s=0.001)
    turns = 3
    async with rt_for(fake) as rt:
        async with rt.job("many") as job:
            client = rt.openai()

            async def worker(i: int) -> None:
                async with job.session(session_id=f"s{i}"):
                    for _ in range(turns):
                        # rt.openai() calls find their session through contextvars.
                        await client.chat.completions.create(
                            model="m", messages=[{"role": "user", "content": f"s{i}"}]
                        )
                        await anyio.lowlevel.checkpoint()

            async with anyio.create_task_group() as tg:
                for i in range(200):
                    tg.start_soon(worker, i)
    assert len(fake.seen) == 200 * turns
    by_session: dict[str, list[int]] = {}
    for seen in fake.seen:
        m = meta(seen)
        # The prompt says which session sent it: the header must agree.
        assert seen.body["messages"][0]["content"] == m.session_id
        by_session.setdefault(m.session_id, []).append(m.turn)
    assert len(by_session) == 200
    assert all(sorted(t) == list(range(turns)) for t in by_session.values())
    assert job.report.calls == 600 and job.report.sessions == 200


async def test_openai_client_outside_a_session_gets_an_implicit_job() -> None:
    fake = FakeEngine()
    async with rt_for(fake) as rt:
        client = rt.openai()
        await client.chat.completions.create(model="m", messages=MSG)
        (rep,) = rt.reports()
        assert rep.name == "call" and rep.calls == 1 and rep.status == "ok"
        assert meta(fake.seen[0]).job_id == rep.job_id


async def test_openai_calls_in_a_job_outside_a_session_join_its_default_session() -> None:
    """The first thing an openai user writes: ``rt.openai()`` calls inside ``rt.job()``
    but in no ``job.session()``. They are the turns of the job's ``default`` session
    (opened at the first such call), so they count in the job and keep to one replica."""
    fake = FakeEngine()
    urls = ["http://a.test/v1", "http://b.test/v1", "http://c.test/v1"]
    async with Runtime(urls, transport=fake.transport(), otel=False, retry=FAST) as rt:
        async with rt.job("openai-user") as job:
            client = rt.openai()
            await client.chat.completions.create(model="m", messages=MSG)
            stream = await client.chat.completions.create(model="m", messages=MSG, stream=True)
            async for _ in stream:
                pass
            async with job.session("named"):
                await client.chat.completions.create(model="m", messages=MSG)
            async with anyio.create_task_group() as tg:  # tasks of the block, too
                tg.start_soon(lambda: client.chat.completions.create(model="m", messages=MSG))
        await client.chat.completions.create(model="m", messages=MSG)  # no job: its own
    report = job.report
    assert report.status == "ok" and report.calls == 4 and report.sessions == 2
    default, named = report.session_reports
    assert (default.name, named.name) == ("default", "named")
    assert [c.session_id == default.session_id for c in report.call_reports] == [
        True,
        True,
        False,
        True,
    ]
    metas = [meta(seen) for seen in fake.seen]
    assert [m.job_id for m in metas[:4]] == [job.id] * 4
    assert [m.turn for m in metas if m.session_id == default.session_id] == [0, 1, 2]
    # Routed with affinity: the default session's turns stay on one replica.
    hosts = {
        seen.url.split("/")[2]
        for seen, m in zip(fake.seen, metas, strict=True)
        if m.session_id == default.session_id
    }
    assert len(hosts) == 1
    # Outside any job a call is still its own one-call job.
    assert [r.name for r in rt.reports()] == ["openai-user", "call"]
    assert metas[4].job_id == rt.reports()[1].job_id


async def test_streaming_records_ttft_and_usage() -> None:
    fake = FakeEngine(prompt_tokens=30, completion_tokens=3, cached_tokens=16)
    async with rt_for(fake) as rt:
        async with rt.job("s") as job, job.session() as s:
            stream = await s.chat(
                model="m", messages=MSG, stream=True, stream_options={"include_usage": True}
            )
            text = ""
            async for chunk in stream:  # type: ignore[union-attr]
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
            assert text == "abc"
    (c,) = job.report.call_reports
    assert c.stream and c.status == "ok"
    assert c.ttft_s is not None and c.latency_s is not None and c.ttft_s <= c.latency_s
    assert (c.prompt_tokens, c.completion_tokens, c.cached_tokens) == (30, 3, 16)


async def test_completions_api() -> None:
    fake = FakeEngine()
    async with rt_for(fake) as rt:
        async with rt.job("c") as job, job.session() as s:
            out = await s.complete(model="m", prompt="hello", max_tokens=3)
            assert out.choices[0].text == "hi"  # type: ignore[union-attr]
    assert fake.seen[0].url == f"{URL}/completions"
    assert job.report.call_reports[0].path == "/completions"


async def test_retries_5xx_and_429_then_succeeds() -> None:
    fake = FakeEngine()
    fake.script = [
        lambda r: httpx.Response(503, json={"error": "busy"}),
        lambda r: httpx.Response(429, headers={"retry-after": "0"}, json={"error": "slow"}),
    ]
    async with rt_for(fake) as rt:
        async with rt.job("r") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
    (c,) = job.report.call_reports
    assert c.attempts == 3 and c.status == "ok" and c.http_status == 200
    assert job.report.retries == 2
    # One idempotent call: every attempt carries the same call id.
    assert len({meta(x).call_id for x in fake.seen}) == 1


async def test_retry_after_is_honoured_and_capped() -> None:
    fake = FakeEngine()
    fake.script = [lambda r: httpx.Response(429, headers={"retry-after": "0.2"})]
    retry = Retry(attempts=2, wait_initial=0.0, wait_jitter=0.0, retry_after_max=0.1)
    async with rt_for(fake, retry=retry) as rt:
        async with rt.job("r") as job, job.session() as s:
            t0 = anyio.current_time()
            await s.chat(model="m", messages=MSG)
            waited = anyio.current_time() - t0
    assert 0.09 <= waited < 0.19  # capped at retry_after_max
    assert job.report.call_reports[0].attempts == 2


async def test_non_retryable_status_is_not_retried() -> None:
    import openai

    fake = FakeEngine()
    fake.script = [lambda r: httpx.Response(400, json={"error": {"message": "bad"}})]
    async with rt_for(fake) as rt:
        with pytest.raises(openai.BadRequestError):
            async with rt.job("r") as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
    assert len(fake.seen) == 1
    assert job.report.status == "error"
    assert job.report.call_reports[0].status == "error"


async def test_exhausted_retries_return_the_servers_error() -> None:
    import openai

    fake = FakeEngine()
    fake.script = [lambda r: httpx.Response(503, json={"error": "x"})] * 3
    async with rt_for(fake) as rt:
        with pytest.raises(openai.InternalServerError):
            async with rt.job("r") as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
    assert len(fake.seen) == 3
    assert job.report.call_reports[0].attempts == 3


async def test_unreachable_endpoint_names_it() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async with Runtime([URL], transport=httpx.MockTransport(refuse), retry=FAST) as rt:
        with pytest.raises(agentrt.EndpointError, match=r"engine\.test") as info:
            async with rt.job("r") as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
    assert info.value.endpoint == URL and info.value.attempts == 3
    assert job.report.status == "error"
    assert "engine.test" in (job.report.call_reports[0].error or "")


async def test_non_openai_reply_names_the_endpoint() -> None:
    def html(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/html"}, content=b"<html>")

    async with Runtime([URL], transport=httpx.MockTransport(html), retry=FAST) as rt:
        with pytest.raises(agentrt.EndpointError, match="OpenAI-compatible"):
            async with rt.job("r") as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
    assert job.report.status == "error"


class _Subclassed(agentrt.EndpointError):
    pass


@pytest.mark.parametrize("error", [agentrt.EndpointError, _Subclassed])
async def test_an_endpoint_error_of_the_inner_transport_ends_the_call(
    error: type[agentrt.EndpointError],
) -> None:
    """A wrapped transport that raises agentrt's own EndpointError (another runtime's
    transport, say): the call ends, once, with status error; the caller sees that error."""

    class Inner(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            raise error("inner endpoint failed", endpoint="http://inner.test/v1")

    events: list[Event] = []
    async with Runtime([URL], transport=Inner(), retry=FAST, hooks=[events.append]) as rt:
        with pytest.raises(error, match="inner endpoint failed") as info:
            async with rt.job("r") as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
    assert type(info.value) is error
    (call,) = job.report.call_reports
    assert call.status == "error" and call.attempts == 1
    assert "inner endpoint failed" in (call.error or "")
    ended = [e for e in events if isinstance(e, CallEnded)]
    assert len(ended) == 1 and ended[0].report.status == "error"
    assert job.report.status == "error"


async def test_connection_error_fails_over_to_another_endpoint() -> None:
    calls: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.host)
        if request.url.host == "a.test":
            raise httpx.ConnectError("refused", request=request)
        return await FakeEngine().handle(request)

    eps = ["http://a.test/v1", "http://b.test/v1"]
    async with Runtime(eps, transport=httpx.MockTransport(handler), retry=FAST) as rt:
        async with rt.job("r") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
            await s.chat(model="m", messages=MSG)
    assert calls[-1] == "b.test"
    assert job.report.call_reports[-1].endpoint == "http://b.test/v1"
    assert job.report.status == "ok"


async def test_cancelling_a_job_mid_call_closes_the_request() -> None:
    started = anyio.Event()
    closed = anyio.Event()

    async def hang(request: httpx.Request) -> httpx.Response:
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            closed.set()
        raise AssertionError("unreachable")

    job_ref: list[agentrt.Job] = []
    async with Runtime([URL], transport=httpx.MockTransport(hang), retry=FAST) as rt:

        async def run() -> None:
            async with rt.job("slow") as job, job.session() as s:
                job_ref.append(job)
                await s.chat(model="m", messages=MSG)

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await started.wait()
            tg.cancel_scope.cancel()
    assert closed.is_set()
    rep = job_ref[0].report
    assert rep.status == "cancelled"
    assert rep.call_reports[0].status == "cancelled"
    assert rt.reports()[-1].status == "cancelled"


async def test_deadline_ends_the_job_with_status_deadline() -> None:
    fake = FakeEngine(delay_s=5.0)
    async with rt_for(fake) as rt:
        with pytest.raises(TimeoutError):
            async with rt.job("late", deadline_s=0.05) as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
    assert job.report.status == "deadline"
    assert job.report.jct_s < 1.0
    assert job.report.call_reports[0].status == "cancelled"


async def test_error_in_job_body_is_reported() -> None:
    fake = FakeEngine()
    async with rt_for(fake) as rt:
        with pytest.raises(KeyError):
            async with rt.job("boom") as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
                raise KeyError("tool broke")
    assert job.report.status == "error" and "tool broke" in (job.report.error or "")
    assert job.report.calls == 1


async def test_session_after_job_ended_is_an_error() -> None:
    fake = FakeEngine()
    async with rt_for(fake) as rt:
        async with rt.job("j") as job, job.session() as s:
            pass
        with pytest.raises(agentrt.JobClosedError):
            await s.chat(model="m", messages=MSG)
        with pytest.raises(agentrt.JobClosedError):
            async with s.tool("x"):
                pass
        async with rt.job("k") as job2:
            async with job2.session() as s2:
                pass
            with pytest.raises(agentrt.SessionClosedError):
                await s2.chat(model="m", messages=MSG)
    assert fake.seen == []


@pytest.mark.parametrize(
    "bad",
    ["a\r\nb", "a b", "x" * 129, "", "naïve", "tab\there"],
)
async def test_bad_ids_are_rejected_before_any_request(bad: str) -> None:
    fake = FakeEngine()
    async with rt_for(fake) as rt:
        with pytest.raises(ValueError, match="job_id"):
            async with rt.job("j", job_id=bad):
                pass
        async with rt.job("j") as job:
            with pytest.raises(ValueError, match="session_id"):
                async with job.session(session_id=bad):
                    pass
    assert fake.seen == []


async def test_bad_tool_input_is_rejected() -> None:
    fake = FakeEngine()
    async with rt_for(fake) as rt:
        async with rt.job("j") as job, job.session() as s:
            with pytest.raises(ValueError, match="expected_s"):
                async with s.tool("t", expected_s=-1):
                    pass
            with pytest.raises(ValueError, match="expected_s"):
                async with s.tool("t", expected_s=float("nan")):
                    pass
            with pytest.raises(ValueError, match="tool name"):
                async with s.tool("bad\nname"):
                    pass
            with pytest.raises(ValueError):
                s.expect_idle(-3)
            # An absurd expectation (a typo's 1e12 s) is refused too, before any request.
            for absurd in (1e12, 86_400.5, float("inf")):
                with pytest.raises(ValueError, match="expected_s"):
                    async with s.tool("t", expected_s=absurd):
                        pass
                with pytest.raises(ValueError, match="expected idle"):
                    s.expect_idle(absurd)
            async with s.tool("t", expected_s=86_400):  # a day is still a wait
                pass
    assert fake.seen == []


async def test_a_job_block_without_async_says_to_use_async_with() -> None:
    async with rt_for(FakeEngine()) as rt:
        with pytest.raises(TypeError, match=r"async with rt\.job\(") as info:
            with rt.job("j"):  # type: ignore[attr-defined]
                pass  # pragma: no cover
        assert "SyncRuntime" in str(info.value)
        async with rt.job("j") as job:
            with pytest.raises(TypeError, match=r"async with job\.session\("):
                with job.session("s"):  # type: ignore[attr-defined]
                    pass  # pragma: no cover
            async with job.session("s") as s:
                with pytest.raises(TypeError, match=r"async with s\.tool\("):
                    with s.tool("t"):  # type: ignore[attr-defined]
                        pass  # pragma: no cover
    assert rt.reports()[-1].job_id == job.id and len(rt.reports()) == 1


async def test_a_job_inside_a_job_is_refused_naming_the_outer_job() -> None:
    """Jobs do not nest (a job is the unit whose completion time the user waits for;
    its parts are sessions): an inner ``rt.job`` is refused before it starts, naming
    the outer job; a job after the outer one ended, or in another runtime, is not."""
    fake = FakeEngine()
    async with rt_for(fake) as rt, rt_for(fake) as other:
        async with rt.job("outer") as outer:
            with pytest.raises(agentrt.AgentrtError, match="inside job 'outer'") as info:
                async with rt.job("inner"):
                    pass  # pragma: no cover
            assert outer.id in str(info.value) and "session" in str(info.value)

            async def in_a_task() -> None:  # a task of the block carries the job too
                async with rt.job("inner"):
                    pass  # pragma: no cover

            with pytest.raises(ExceptionGroup) as group:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(in_a_task)
            assert group.group_contains(agentrt.AgentrtError, match="inside job 'outer'")
            async with other.job("elsewhere") as elsewhere:
                pass
        async with rt.job("after"):
            pass
    assert [r.name for r in rt.reports()] == ["outer", "after"]
    assert outer.report.status == "ok" and elsewhere.report.status == "ok"


def test_bad_endpoints_are_rejected() -> None:
    with pytest.raises(ValueError, match="at least one endpoint"):
        Runtime([])
    with pytest.raises(ValueError, match="scheme"):
        Runtime(["127.0.0.1:8000/v1"])
    with pytest.raises(ValueError, match="scheme"):
        Endpoint("ftp://x/v1")
    with pytest.raises(ValueError, match="twice"):
        Runtime([URL, URL + "/"])
    with pytest.raises(ValueError, match="dialect"):
        Runtime([URL], dialect="no-such-engine")
    with pytest.raises(ValueError, match="routing"):
        Runtime([URL], routing="random-ish")
    with pytest.raises(ValueError, match="weight"):
        Endpoint(URL, weight=0)


async def test_api_key_is_sent_but_never_shown() -> None:
    fake = FakeEngine()
    secret = "sk-very-secret-123"
    eps = [Endpoint(URL, api_key=secret)]
    async with Runtime(eps, transport=fake.transport(), retry=FAST) as rt:
        assert secret not in repr(rt) and secret not in repr(rt.endpoints)
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
    assert fake.seen[0].headers["authorization"] == f"Bearer {secret}"
    assert secret not in job.report.model_dump_json()


async def test_no_key_sends_no_authorization() -> None:
    fake = FakeEngine()
    async with rt_for(fake) as rt:
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
    assert "authorization" not in fake.seen[0].headers


async def test_session_affinity_and_round_robin() -> None:
    fake = FakeEngine()
    eps = ["http://a.test/v1", "http://b.test/v1"]
    async with Runtime(eps, transport=fake.transport(), retry=FAST) as rt:
        async with rt.job("j") as job:
            async with job.session() as s1, job.session() as s2:
                for _ in range(3):
                    await s1.chat(model="m", messages=MSG)
                    await s2.chat(model="m", messages=MSG)
    hosts = {}
    for seen in fake.seen:
        hosts.setdefault(meta(seen).session_id, set()).add(httpx.URL(seen.url).host)
    assert all(len(h) == 1 for h in hosts.values())  # each session stays on one replica

    fake2 = FakeEngine()
    async with Runtime(eps, transport=fake2.transport(), routing="round-robin") as rt:
        async with rt.job("j") as job, job.session() as s:
            for _ in range(4):
                await s.chat(model="m", messages=MSG)
    hosts2 = [httpx.URL(x.url).host for x in fake2.seen]  # in turn, from a random start
    assert hosts2 in (["a.test", "b.test"] * 2, ["b.test", "a.test"] * 2)


async def test_http_client_for_frameworks_is_tagged() -> None:
    import openai

    fake = FakeEngine()
    async with rt_for(fake) as rt:
        client = openai.AsyncOpenAI(
            base_url=URL, api_key="x", http_client=rt.http_client(), max_retries=0
        )
        async with rt.job("j") as job, job.session(session_id="fw"):
            await client.chat.completions.create(model="m", messages=MSG)
        await client.close()
        # Closing a framework's client leaves the runtime usable.
        async with rt.job("j2") as job2, job2.session() as s:
            await s.chat(model="m", messages=MSG)
    assert meta(fake.seen[0]).session_id == "fw"
    assert job.report.calls == 1


async def test_runtime_must_be_entered() -> None:
    rt = Runtime([URL])
    with pytest.raises(agentrt.AgentrtError, match="async with"):
        async with rt.job("j"):
            pass


async def test_dialects_on_the_wire_through_the_runtime() -> None:
    fake = FakeEngine()
    fake.script = [
        lambda r: httpx.Response(
            200,
            headers={"x-session-token": "cG9kLTE="},
            json={
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "a"},
                        "finish_reason": "stop",
                    }
                ],
            },
        )
    ]
    eps = [Endpoint(URL, dialect=["vllm", "llm-d"])]
    async with Runtime(eps, transport=fake.transport(), send_priority=True, retry=FAST) as rt:
        async with rt.job("j") as job, job.session(session_id="s-1") as s:
            await s.chat(model="m", messages=MSG, extra_body={"priority": 7})
            await s.chat(model="m", messages=MSG)
    first, second = fake.seen
    assert first.body["session_id"] == "s-1"
    assert first.body["priority"] == 7  # the caller's own value wins
    assert second.body["priority"] == 0  # PLAS level of a program with little service
    assert first.headers["x-session-id"] == "s-1"
    assert first.headers["x-request-id"] == meta(first).call_id
    assert "x-session-token" not in first.headers
    assert second.headers["x-session-token"] == "cG9kLTE="  # llm-d: echoed back
    assert job.report.call_reports[1].priority == 0


async def test_priority_is_not_sent_unless_enabled() -> None:
    fake = FakeEngine()
    async with Runtime([URL], dialect="vllm", transport=fake.transport()) as rt:
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
    assert "priority" not in fake.seen[0].body
    assert meta(fake.seen[0]).priority is None


async def test_refused_connection_on_loopback_names_the_endpoint() -> None:
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    async with Runtime([url], retry=Retry(attempts=2, wait_initial=0, wait_jitter=0)) as rt:
        with pytest.raises(agentrt.EndpointError, match=f"127.0.0.1:{port}"):
            async with rt.job("j") as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
    assert job.report.status == "error" and job.report.call_reports[0].attempts == 2


async def test_openai_client_options_are_checked() -> None:
    fake = FakeEngine()
    async with rt_for(fake) as rt:
        with pytest.raises(ValueError, match="retries"):
            rt.openai(max_retries=2)
        with pytest.raises(ValueError, match="HTTP client"):
            rt.openai(http_client=httpx.AsyncClient())
        client = rt.openai(max_retries=0, timeout=5.0)
        assert client.max_retries == 0


async def test_endpoint_with_explicit_default_port_and_query_is_matched() -> None:
    fake = FakeEngine()
    async with Runtime(["http://Engine.test:80/v1"], transport=fake.transport()) as rt:
        client = rt.openai(default_query={"api-version": "1"})
        async with rt.job("j") as job, job.session():
            await client.chat.completions.create(model="m", messages=MSG)
    assert job.report.calls == 1
    assert meta(fake.seen[0]).turn == 0
    assert "api-version=1" in fake.seen[0].url


# -- the HTTP library: httpx2 under openai 3.x, the transport's own library otherwise ------


def _openai_major() -> int:
    from importlib.metadata import version

    return int(version("openai").split(".")[0])


def _httpx2_native() -> bool:
    try:
        import httpx2  # noqa: F401
    except ImportError:
        return False
    return _openai_major() >= 3


needs_httpx2 = pytest.mark.skipif(
    not _httpx2_native(), reason="httpx2 with openai >= 3 is not installed"
)


@needs_httpx2
async def test_without_transport_clients_are_httpx2_under_openai_3() -> None:
    import httpx2

    async with Runtime([URL]) as rt:
        http = rt.http_client()
        assert isinstance(http, httpx2.AsyncClient)
        assert isinstance(rt._inner, httpx2.AsyncHTTPTransport)
        assert isinstance(rt.openai()._client, httpx2.AsyncClient)
        await http.aclose()


async def test_without_httpx2_or_openai_3_clients_are_legacy_httpx(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agentrt import _httplib

    monkeypatch.setattr(_httplib, "_openai_major", lambda: 2)
    async with Runtime([URL]) as rt:
        assert type(rt.http_client()) is httpx.AsyncClient
    monkeypatch.setattr(_httplib, "_openai_major", lambda: 3)
    monkeypatch.setattr(_httplib, "_httpx2", lambda: None)
    async with Runtime([URL]) as rt:
        assert type(rt.http_client()) is httpx.AsyncClient


async def test_a_legacy_transport_keeps_legacy_httpx_clients() -> None:
    fake = FakeEngine()
    async with rt_for(fake) as rt:
        assert type(rt.http_client()) is httpx.AsyncClient
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
            stream = await s.chat(model="m", messages=MSG, stream=True)
            async for _ in stream:
                pass
    assert job.report.status == "ok" and job.report.calls == 2


@needs_httpx2
async def test_an_httpx2_transport_gets_httpx2_clients() -> None:
    import httpx2

    fake = FakeEngine(prompt_tokens=10, completion_tokens=2, cached_tokens=4)

    async def handle(request: httpx2.Request) -> httpx2.Response:
        legacy = httpx.Request(
            request.method, str(request.url), headers=request.headers.raw, content=request.content
        )
        reply = await fake.handle(legacy)
        return httpx2.Response(
            reply.status_code, headers=reply.headers.raw, content=await reply.aread()
        )

    async with Runtime([URL], transport=httpx2.MockTransport(handle), retry=FAST) as rt:
        assert isinstance(rt.http_client(), httpx2.AsyncClient)
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
    assert job.report.status == "ok" and job.report.call_reports[0].cached_tokens == 4


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # uvicorn runs on asyncio
async def test_served_sim_over_loopback_without_transport() -> None:
    pytest.importorskip("uvicorn")
    from agentrt.sim import serve_async

    prompt = [{"role": "user", "content": "x " * 200}]
    async with anyio.create_task_group() as tg:
        urls = await tg.start(serve_async, 1, "127.0.0.1", 0, "h100-8b")
        async with Runtime(list(urls)) as rt:
            if _httpx2_native():
                import httpx2

                assert isinstance(rt.http_client(), httpx2.AsyncClient)
            async with rt.job("served") as job, job.session() as s:
                for _ in range(2):
                    reply = await s.chat(model="m", messages=prompt, max_tokens=4)
                    assert reply.choices[0].message.content
                stream = await s.chat(
                    model="m",
                    messages=prompt,
                    max_tokens=4,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                chunks = [c async for c in stream]
                assert chunks
            implicit = await rt.openai().chat.completions.create(
                model="m", messages=prompt, max_tokens=2
            )
            assert implicit.usage is not None
        tg.cancel_scope.cancel()
    report = job.report
    assert report.status == "ok" and report.calls == 3
    assert all(c.status == "ok" and c.endpoint == urls[0] for c in report.call_reports)
    assert (report.call_reports[1].cached_tokens or 0) > 0
    assert report.call_reports[2].ttft_s is not None
    assert report.call_reports[2].prompt_tokens
    assert rt.reports()[-1].status == "ok"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # uvicorn runs on asyncio
async def test_served_sim_through_sync_runtime_without_transport() -> None:
    pytest.importorskip("uvicorn")
    from agentrt.sim import serve_async

    prompt = [{"role": "user", "content": "x " * 200}]

    def run(url: str) -> tuple[agentrt.JobReport, type, list[str]]:
        with agentrt.SyncRuntime([url]) as srt:
            with srt.job("sync") as job, job.session() as s:
                for _ in range(2):
                    s.chat(model="m", messages=prompt, max_tokens=4)
                text = [
                    c.choices[0].delta.content or ""
                    for c in s.chat(model="m", messages=prompt, max_tokens=4, stream=True)
                    if c.choices
                ]
            client = srt.openai()
            client.chat.completions.create(model="m", messages=prompt, max_tokens=2)
            cls = type(client._client)
        return job.report, cls, text

    async with anyio.create_task_group() as tg:
        urls = await tg.start(serve_async, 1, "127.0.0.1", 0, "h100-8b")
        report, cls, text = await anyio.to_thread.run_sync(run, urls[0])
        tg.cancel_scope.cancel()
    assert report.status == "ok" and report.calls == 3
    assert (report.call_reports[1].cached_tokens or 0) > 0
    assert "".join(text)
    if _httpx2_native():
        import httpx2

        assert issubclass(cls, httpx2.Client)
    else:
        assert issubclass(cls, httpx.Client)


@pytest.mark.parametrize("other", ["asyncio", "trio"])
async def test_a_second_event_loop_is_refused_up_front(other: str) -> None:
    """A Runtime lives in the event loop that entered it: used from another loop (another
    thread's ``asyncio.run`` or ``trio.run``), each way in is refused before anything is
    sent or counted, with an error that says what to do; the owning loop goes on."""
    fake = FakeEngine()
    async with rt_for(fake, otel=False) as rt:
        client = rt.openai()
        async with rt.job("own") as own, own.session("s") as s:
            await s.chat(model="m", messages=MSG)

            async def job() -> None:
                async with rt.job("elsewhere"):
                    pass  # pragma: no cover

            async def openai_call() -> None:
                await client.chat.completions.create(model="m", messages=MSG)

            async def session_call() -> None:
                await s.chat(model="m", messages=MSG)

            errors: list[BaseException] = []
            for use in (job, openai_call, session_call):

                def run(use: object = use) -> None:
                    try:
                        anyio.run(use, backend=other)  # type: ignore[arg-type]
                    except BaseException as exc:
                        errors.append(exc)

                await anyio.to_thread.run_sync(run)
            assert len(errors) == 3, errors
            for exc in errors:
                assert isinstance(exc, agentrt.AgentrtError), repr(exc)
                message = str(exc)
                assert "another event loop" in message and "SyncRuntime" in message
            assert len(fake.seen) == 1 and own.report.calls == 1
            assert [r.name for r in rt.reports()] == []  # no implicit job either
            await s.chat(model="m", messages=MSG)  # the owning loop is unharmed
    assert own.report.status == "ok" and own.report.calls == 2


@pytest.mark.anyio
async def test_endpoint_loads_before_entering_and_from_a_thread() -> None:
    """``rt.endpoint_loads()`` needs no running event loop: before the runtime is
    entered, and from a thread of the caller's while it runs (under trio too: it used to
    raise ``NoEventLoopError`` in both)."""
    urls = ["http://a.test/v1", "http://b.test/v1"]
    rt = Runtime(
        [Endpoint(urls[0], kv_capacity=8_000), urls[1]],
        transport=FakeEngine().transport(),
        poll_metrics_s=None,
    )
    before = await anyio.to_thread.run_sync(rt.endpoint_loads)  # no loop in that thread
    assert [(load.kv_capacity, load.kv_demand) for load in before] == [(8_000, 0.0), (None, 0.0)]
    async with rt:
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
            during = await anyio.to_thread.run_sync(rt.endpoint_loads)
    assert sum(load.sessions for load in during) == 1
    assert sum(load.kv_demand or 0.0 for load in during) == 15  # the session's context
    assert [load.kv_demand for load in rt.endpoint_loads()] == [0.0, 0.0]  # it ended
