"""SyncRuntime: the same shape for code that is not async."""

from __future__ import annotations

import inspect
from typing import Any

import anyio
import pytest

import agentrt
from agentrt._protocol import parse_agentrt_header
from tests._fake import MSG, FakeEngine

URL = "http://engine.test/v1"


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_sync_runtime_jobs_sessions_tools(backend: str) -> None:
    fake = FakeEngine()
    with agentrt.SyncRuntime([URL], transport=fake.transport(), backend=backend) as rt:
        with rt.job("sync-job") as job:
            with job.session("main") as s:
                reply = s.chat(model="m", messages=MSG)
                assert reply.choices[0].message.content == "hello"  # type: ignore[union-attr]
                with s.tool("grep", expected_s=1.0):
                    pass
                chunks = list(s.chat(model="m", messages=MSG, stream=True))  # type: ignore[arg-type]
                assert len(chunks) >= 4
            # A synchronous openai client inside a session is tagged too.
            with job.session(session_id="sync-ses"):
                rt.openai().chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
    rep = job.report
    assert rep.status == "ok" and rep.calls == 3 and rep.tool_waits == 1
    m1, m2 = (parse_agentrt_header(x.headers["x-agentrt"]) for x in fake.seen[1:3])
    assert m1.turn == 1
    assert m1.idle_declared_s == 1.0
    assert m2.session_id == "sync-ses"
    assert rep.call_reports[1].ttft_s is not None


def test_sync_deadline() -> None:
    fake = FakeEngine(delay_s=5.0)
    with agentrt.SyncRuntime([URL], transport=fake.transport()) as rt:
        with pytest.raises(TimeoutError), rt.job("late", deadline_s=0.05) as job:
            with job.session() as s:
                s.chat(model="m", messages=MSG)
    assert job.report.status == "deadline"


def test_sync_runtime_validates_before_starting() -> None:
    with pytest.raises(ValueError, match="at least one endpoint"):
        agentrt.SyncRuntime([])


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_sync_openai_calls_in_a_job_outside_a_session_join_its_default_session(
    backend: str,
) -> None:
    fake = FakeEngine()
    with agentrt.SyncRuntime([URL], transport=fake.transport(), backend=backend) as rt:
        client = rt.openai()
        with rt.job("openai-user") as job:
            client.chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
            client.chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
        client.chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
    report = job.report
    assert report.calls == 2 and report.sessions == 1
    (default,) = report.session_reports
    assert default.name == "default"
    metas = [parse_agentrt_header(x.headers["x-agentrt"]) for x in fake.seen]
    assert [(m.job_id, m.session_id, m.turn) for m in metas[:2]] == [
        (job.id, default.session_id, 0),
        (job.id, default.session_id, 1),
    ]
    assert [r.name for r in rt.reports()] == ["openai-user", "call"]


def test_sync_misuse_is_refused_clearly() -> None:
    """``async with`` on a SyncRuntime's blocks says to use ``with``; a job inside a job is
    refused naming the outer one; an absurd expected wait is refused before any request."""
    fake = FakeEngine()
    with agentrt.SyncRuntime([URL], transport=fake.transport()) as rt:

        async def wrong() -> None:
            async with rt.job("j"):  # type: ignore[attr-defined]
                pass  # pragma: no cover

        with pytest.raises(TypeError, match=r"with rt\.job\(") as info:
            anyio.run(wrong)
        assert "async with" in str(info.value) and "agentrt.Runtime" in str(info.value)
        with rt.job("outer") as outer:
            with pytest.raises(agentrt.AgentrtError, match="inside job 'outer'"):
                with rt.job("inner"):
                    pass  # pragma: no cover
            with outer.session("s") as s:
                with pytest.raises(ValueError, match="expected_s"):
                    with s.tool("t", expected_s=1e12):
                        pass  # pragma: no cover
                with pytest.raises(ValueError, match="expected idle"):
                    s.expect_idle(1e12)
        with rt.job("after"):
            pass
    assert [r.name for r in rt.reports()] == ["outer", "after"]
    assert outer.report.status == "ok" and fake.seen == []


def test_sync_runtime_takes_runtimes_keyword_arguments_typed_alike() -> None:
    """SyncRuntime's ``**kwargs`` are typed by a TypedDict of Runtime's keyword arguments
    (so that ``mypy --strict`` catches a misspelt one: tests/typed/wrong.py): the two
    list the same names with the same types."""
    from agentrt._sync import _RuntimeOptions

    params = list(inspect.signature(agentrt.Runtime.__init__).parameters.values())[2:]
    assert all(p.kind is p.KEYWORD_ONLY for p in params)
    options = {
        name: getattr(ann, "__forward_arg__", ann)
        for name, ann in _RuntimeOptions.__annotations__.items()
    }
    assert options == {p.name: p.annotation for p in params}
    with pytest.raises(TypeError, match="concurency"):
        agentrt.SyncRuntime([URL], concurency=4)  # type: ignore[call-arg]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_sync_sessions_stop_counting_at_their_endpoint_when_they_end(backend: str) -> None:
    fake = FakeEngine()
    closed: list[str] = []
    hook = lambda e: closed.append(type(e).__name__)  # noqa: E731
    with agentrt.SyncRuntime(
        [URL], transport=fake.transport(), backend=backend, hooks=[hook]
    ) as rt:
        for i in range(10):
            with rt.job(f"j{i}") as job, job.session("main") as s:
                s.chat(model="m", messages=MSG)
                assert [load.sessions for load in rt.endpoint_loads()] == [1]
        assert [load.sessions for load in rt.endpoint_loads()] == [0]
        assert closed.count("SessionClosed") == 10


def test_sync_runtime_checks_its_arguments_without_building_a_runtime(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sync_runtime = agentrt.SyncRuntime  # imported before Runtime is patched
    built: list[object] = []
    init = agentrt.Runtime.__init__

    def counted(self: agentrt.Runtime, *args: Any, **kwargs: Any) -> None:
        built.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(agentrt.Runtime, "__init__", counted)
    srt = sync_runtime([URL, "http://engine2.test/v1"], routing="hash")
    assert built == []
    assert repr(srt) == (
        "<agentrt.SyncRuntime endpoints=['http://engine.test/v1', "
        "'http://engine2.test/v1'] routing='hash' backend='asyncio' not entered>"
    )
    with pytest.raises(ValueError, match="keep_reports"):
        sync_runtime([URL], keep_reports=-1)
    with pytest.raises(TypeError, match="learn_waits"):
        sync_runtime([URL], learn_waits=1)  # type: ignore[arg-type]
    assert built == []


def test_a_sync_job_emits_the_events_of_an_async_one() -> None:
    # The same job, written sync and async, tells its hooks the same events in the same
    # order (a sync session once emitted no SessionOpened: its agent span was missing).
    def job_events(sync: bool) -> list[str]:
        seen: list[str] = []
        hooks = [lambda e: seen.append(type(e).__name__)]
        fake = FakeEngine()
        if sync:
            with agentrt.SyncRuntime([URL], transport=fake.transport(), hooks=hooks) as rt:
                with rt.job("j") as job, job.session("main") as s:
                    s.chat(model="m", messages=MSG)
                    with s.tool("grep", expected_s=1.0):
                        pass
            return seen

        async def main() -> None:
            async with agentrt.Runtime([URL], transport=fake.transport(), hooks=hooks) as rt:
                async with rt.job("j") as job, job.session("main") as s:
                    await s.chat(model="m", messages=MSG)
                    async with s.tool("grep", expected_s=1.0):
                        pass

        anyio.run(main)
        return seen

    expected = job_events(sync=False)
    assert expected[:2] == ["JobStarted", "SessionOpened"]
    assert job_events(sync=True) == expected
