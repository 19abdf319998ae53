"""The adapters' shared mechanism: start/end callbacks drive jobs, sessions and tool
waits without blocks, with the blocks' reports, statuses and events."""

from __future__ import annotations

import anyio
import anyio.to_thread
import pytest

from agentrt import Runtime
from agentrt._protocol import parse_agentrt_header
from agentrt.integrations import Bridge, bind, unbind
from agentrt.telemetry import Event, JobEnded, SessionClosed, SessionOpened, ToolEnded
from tests._fake import MSG, FakeEngine

pytestmark = pytest.mark.anyio

URL = "http://engine.test/v1"


async def test_callbacks_make_a_job_with_sessions_and_tool_waits() -> None:
    fake = FakeEngine()
    events: list[Event] = []
    async with Runtime([URL], transport=fake.transport(), hooks=[events.append]) as rt:
        client = rt.openai()
        bridge = Bridge(rt)
        job = bridge.start_job("run-1", "run", metadata={"k": "v"})
        assert job is not None and bridge.job("run-1") is job
        main = bridge.start_session("a", "run-1", "main")
        sub = bridge.start_session("b", "run-1", "sub", parent=main)
        assert main is not None and sub is not None and sub.parent_id == main.id
        for session in (main, sub, main):
            binding = bind(session)
            try:
                await client.chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
            finally:
                unbind(binding)
        bridge.start_tool("t1", "a", "search")
        await anyio.sleep(0.05)
        bridge.end_tool("t1")
        bridge.start_tool("t2", "b", "fetch")  # left open: the job's end ends it
        bridge.end_session("b")
        assert sub._closed and bridge.session("b") is None
        report = bridge.end_job("run-1")
        assert report is not None and job.report is report
        assert bridge.end_job("run-1") is None
    assert report.status == "ok" and report.name == "run" and report.metadata == {"k": "v"}
    assert report.calls == 3 and report.sessions == 2 and report.tool_waits == 2
    assert [c.session_id for c in report.call_reports] == [main.id, sub.id, main.id]
    assert [(t.name, t.status) for t in report.tool_reports] == [
        ("search", "ok"),
        ("fetch", "cancelled"),
    ]
    assert report.tool_reports[0].duration_s == pytest.approx(0.05, abs=0.04)
    metas = [parse_agentrt_header(s.headers["x-agentrt"]) for s in fake.seen]
    assert [m.session_id for m in metas] == [main.id, sub.id, main.id]
    assert {m.job_id for m in metas} == {job.id}
    assert metas[1].parent_session_id == main.id
    kinds = [type(e) for e in events if isinstance(e, SessionOpened | SessionClosed | JobEnded)]
    assert kinds.count(SessionOpened) == 2 and kinds.count(SessionClosed) == 2
    assert kinds[-1] is JobEnded
    assert sum(isinstance(e, ToolEnded) for e in events) == 2


async def test_an_error_or_a_cancellation_is_the_jobs_terminal_status() -> None:
    async with Runtime([URL], transport=FakeEngine().transport()) as rt:
        bridge = Bridge(rt)
        bridge.start_job(1, "failing")
        bridge.start_session(2, 1, "main")
        bridge.start_tool(3, 2, "boom")
        failed = bridge.end_job(1, RuntimeError("tool broke"))
        bridge.start_job(4, "cancelled")
        cancelled = None
        with anyio.CancelScope() as scope:
            scope.cancel()
            try:
                await anyio.sleep(1)
            except anyio.get_cancelled_exc_class() as exc:
                cancelled = bridge.end_job(4, exc)
                raise
    assert failed is not None and failed.status == "error"
    assert failed.error == "RuntimeError: tool broke"
    assert failed.tool_reports[0].status == "error"
    assert cancelled is not None and cancelled.status == "cancelled"


async def test_a_closed_runtime_takes_no_job_and_unknown_keys_are_ignored() -> None:
    async with Runtime([URL], transport=FakeEngine().transport()) as rt:
        bridge = Bridge(rt)
        assert bridge.start_session("s", "nojob", "x") is None
        bridge.start_tool("t", "s", "x")
        bridge.end_tool("t")
        bridge.end_session("s")
        bridge.start_job("j", "j")
        with pytest.raises(ValueError, match="already open"):
            bridge.start_job("j", "j")
        bridge.end_job("j")
    assert not bridge.active and bridge.start_job("k", "late") is None


async def test_no_job_starts_outside_the_runtimes_loop_thread() -> None:
    # A framework's synchronous entry point runs its callbacks in a loop of its own (in
    # another thread): the bridge starts no job there, so its calls are implicit jobs.
    async with Runtime([URL], transport=FakeEngine().transport()) as rt:
        bridge = Bridge(rt)
        assert bridge.active

        def elsewhere() -> object:
            return (bridge.active, bridge.start_job("other-thread", "run"))

        assert await anyio.to_thread.run_sync(elsewhere) == (False, None)
        assert bridge.start_job("here", "run") is not None
        # a worker thread of the loop reaches it through call_in_loop
        assert await anyio.to_thread.run_sync(bridge.call_in_loop, bridge.job, "here")
        bridge.start_session("s", "here", "main")
        bridge.start_tool("t", "s", "flaky")
        bridge.end_tool("t", status="error")  # a failure reported without its exception
        report = bridge.end_job("here")
    assert report is not None and report.status == "ok"
    assert [(t.name, t.status) for t in report.tool_reports] == [("flaky", "error")]
    with pytest.raises(TypeError, match="Runtime or SyncRuntime"):
        Bridge(object())  # type: ignore[arg-type]
