"""The ``vllm-router-agentic`` dialect: exact fields, and what reaches the wire.

vllm-router 0.1.17 reads ``vllm_xargs.agentic_context`` (an object, or the same as a
JSON string); see agentrt/dialects/_vllm_router_agentic.py and docs/protocol.md.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

import agentrt
from agentrt import Retry, Runtime
from agentrt._protocol import CallMetadata, parse_agentrt_header
from agentrt.dialects import (
    DEFAULT_ROUTER_TTL_MARGIN_S,
    FINISH_SESSION,
    VLLM_ROUTER_AGENTIC,
    DialectOptions,
    Encoding,
    combine,
    get_dialect,
    vllm_router_agentic_dialect,
    vllm_router_session_ends,
)
from tests._fake import MSG, FakeEngine
from tests.dialects.test_dialects import FULL, make_meta

PRIO = DialectOptions(send_priority=True)
NO_PRIO = DialectOptions()


def context(enc: Encoding) -> dict[str, Any]:
    """The agentic_context object, decoded as the router decodes its string form."""
    assert set(enc.body) == {"vllm_xargs"}
    assert set(enc.body["vllm_xargs"]) == {"agentic_context"}
    raw = enc.body["vllm_xargs"]["agentic_context"]
    assert isinstance(raw, str)  # vLLM takes only str, int, float, list values in vllm_xargs
    assert len(raw.encode()) <= 16 * 1024  # the router's bound on the string form
    decoded = json.loads(raw)
    assert isinstance(decoded, dict)
    return decoded


def test_registered_by_name() -> None:
    assert get_dialect("vllm-router-agentic") is VLLM_ROUTER_AGENTIC
    assert get_dialect(" VLLM-Router-Agentic ") is VLLM_ROUTER_AGENTIC
    assert VLLM_ROUTER_AGENTIC.echo_headers == ()
    assert "agentic_context" in VLLM_ROUTER_AGENTIC.doc


def test_exact_fields_of_a_sub_agent_call() -> None:
    enc = VLLM_ROUTER_AGENTIC.encode(FULL, PRIO)
    assert {k: v for k, v in enc.headers.items() if k != "x-agentrt"} == {"x-session-id": "sess-1"}
    assert parse_agentrt_header(enc.headers["x-agentrt"]).session_id == "sess-1"
    assert context(enc) == {
        "program_id": "sess-1",
        "task_id": "job-1",
        "session_id": "sess-1",
        "agent_id": "sess-1",
        "agent_role": "subagent",
        "parent_program_id": "sess-0",
        "expected_resume": True,
        "step_id": 2,
        "request_id": "call-1",  # the call's id, the same on each of its attempts
        # no spawn_reason: the sub-agent has no name
        "kv_retention_ttl_seconds": 2.0 + DEFAULT_ROUTER_TTL_MARGIN_S,
        "expected_output_length": 256,
        "expected_output_tokens": 256,
        "priority": -3,  # agentrt: lower first; the router: larger first
    }


def test_exact_fields_of_a_named_blocking_sub_agent_s_last_call() -> None:
    meta = FULL.model_copy(
        update={
            "session_name": "researcher",
            "root_session_id": "sess-root",
            "blocks_parent": False,
            "final": True,
            "deadline_s": 12.34567,
        }
    )
    assert context(VLLM_ROUTER_AGENTIC.encode(meta, NO_PRIO)) == {
        "program_id": "sess-1",
        "task_id": "job-1",
        "session_id": "sess-1",
        "agent_id": "researcher",
        "agent_role": "subagent",
        "parent_program_id": "sess-0",
        "root_program_id": "sess-root",
        "blocks_parent": False,
        "expected_resume": False,  # the router ends the program after this reply
        "step_id": 2,
        "request_id": "call-1",
        "spawn_reason": "researcher",  # the sub-agent's kind: its session's name
        # no kv_retention_ttl_seconds: nothing follows the last call
        "deadline_seconds": 12.346,
        "expected_output_length": 256,
        "expected_output_tokens": 256,
    }


def test_a_lead_sends_no_sub_agent_fields() -> None:
    meta = make_meta(session_name="lead", root_session_id="x", blocks_parent=True)
    ctx = context(VLLM_ROUTER_AGENTIC.encode(meta, NO_PRIO))
    assert ctx["agent_role"] == "lead"
    assert ctx["agent_id"] == "lead"
    assert not {"parent_program_id", "root_program_id", "blocks_parent", "spawn_reason"} & set(ctx)


def test_exact_fields_of_a_lead_first_call() -> None:
    enc = VLLM_ROUTER_AGENTIC.encode(make_meta(turn=0, first_turn=True), NO_PRIO)
    assert context(enc) == {
        "program_id": "sess-1",
        "task_id": "job-1",
        "session_id": "sess-1",
        "agent_id": "sess-1",
        "agent_role": "lead",
        "expected_resume": True,
        "step_id": 0,
        "request_id": "call-1",
    }


def test_priority_only_with_send_priority() -> None:
    assert "priority" not in context(VLLM_ROUTER_AGENTIC.encode(FULL, NO_PRIO))
    assert "priority" not in context(VLLM_ROUTER_AGENTIC.encode(make_meta(), PRIO))
    low = context(VLLM_ROUTER_AGENTIC.encode(make_meta(priority=-(2**70)), PRIO))
    assert low["priority"] == 2**63 - 1  # bounded to the router's i64


def test_predicted_idle_is_sent_too() -> None:
    meta = make_meta(idle_expected_s=0.0, idle_expected_source="predicted")
    assert context(VLLM_ROUTER_AGENTIC.encode(meta, NO_PRIO))["kv_retention_ttl_seconds"] == 2.0


def test_ttl_margin_bound_and_rounding() -> None:
    d = vllm_router_agentic_dialect(ttl_margin_s=0.5, max_ttl_s=60.0)
    assert d.name == "vllm-router-agentic"
    ttl = context(d.encode(make_meta(idle_expected_s=1.23456), NO_PRIO))
    assert ttl["kv_retention_ttl_seconds"] == 1.735
    capped = context(d.encode(make_meta(idle_expected_s=1e9), NO_PRIO))
    assert capped["kv_retention_ttl_seconds"] == 60.0


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_rejects_bad_options(bad: float) -> None:
    with pytest.raises(ValueError):
        vllm_router_agentic_dialect(ttl_margin_s=bad)
    with pytest.raises(ValueError):
        vllm_router_agentic_dialect(max_ttl_s=bad)


def test_a_session_that_names_itself_as_parent_is_a_lead() -> None:
    # The router rejects parent_program_id == program_id (identity.rs); agentrt sends none.
    ctx = context(VLLM_ROUTER_AGENTIC.encode(make_meta(parent_session_id="sess-1"), NO_PRIO))
    assert ctx["agent_role"] == "lead"
    assert "parent_program_id" not in ctx


def test_composes_with_vllm() -> None:
    both = combine(get_dialect("vllm"), VLLM_ROUTER_AGENTIC)
    enc = both.encode(FULL, NO_PRIO)
    assert enc.headers["x-session-id"] == "sess-1"
    assert enc.headers["x-request-id"] == "call-1"
    assert enc.body["session_id"] == "sess-1"
    assert json.loads(enc.body["vllm_xargs"]["agentic_context"])["program_id"] == "sess-1"


def test_encode_is_pure() -> None:
    meta: CallMetadata = FULL
    before = meta.model_dump()
    first = VLLM_ROUTER_AGENTIC.encode(meta, PRIO)
    first.body["vllm_xargs"]["x"] = 1
    assert "x" not in VLLM_ROUTER_AGENTIC.encode(meta, PRIO).body["vllm_xargs"]
    assert meta.model_dump() == before


# ------------------------------------------------------------------- through a runtime

URL = "http://router.test/v1"
DIALECT = "vllm-router-agentic"
FAST = Retry(attempts=1, wait_initial=0.0, wait_jitter=0.0)


@pytest.mark.anyio
async def test_on_the_wire_through_a_runtime() -> None:
    fake = FakeEngine()
    async with Runtime(
        [URL], transport=fake.transport(), retry=FAST, dialect="vllm-router-agentic"
    ) as rt:
        client = rt.openai()
        async with rt.job("j", job_id="job-a", deadline_s=600.0) as job:
            async with job.session("planner", session_id="lead-a") as lead:
                await lead.chat(model="m", messages=MSG, max_tokens=7)
                lead.expect_idle(3.0)
                await lead.chat(model="m", messages=MSG)
                async with job.session(
                    "coder", session_id="sub-a", parent=lead, blocks_parent=True
                ) as sub:
                    await client.chat.completions.create(model="m", messages=MSG)
                    async with job.session(session_id="sub-b", parent=sub) as subsub:
                        subsub.expect_final()
                        await subsub.chat(model="m", messages=MSG)
                    await sub.chat(model="m", messages=MSG, final=True)
                await lead.chat(model="m", messages=MSG)  # after the sub-agent's end
    calls = [s for s in fake.seen if "/finish_session" not in s.url]
    # Each session's end reached the router, in the order the sessions ended.
    assert [s.url for s in fake.seen if "/finish_session" in s.url] == [
        f"http://router.test/finish_session?session_id={sid}"
        for sid in ("sub-b", "sub-a", "lead-a")
    ]
    ctxs = [json.loads(s.body["vllm_xargs"]["agentic_context"]) for s in calls]
    assert [c.pop("request_id") for c in ctxs] == [c.call_id for c in job.report.call_reports]
    assert [s.headers["x-session-id"] for s in calls] == [
        "lead-a",
        "lead-a",
        "sub-a",
        "sub-b",
        "sub-a",
        "lead-a",
    ]
    deadlines = [c.pop("deadline_seconds") for c in ctxs]
    assert all(0 < d <= 600.0 for d in deadlines)
    assert deadlines == sorted(deadlines, reverse=True)  # what is left of the job's 600 s
    assert ctxs[0] == {
        "program_id": "lead-a",
        "task_id": "job-a",
        "session_id": "lead-a",
        "agent_id": "planner",
        "agent_role": "lead",
        "expected_resume": True,
        "step_id": 0,
        "expected_output_length": 7,
        "expected_output_tokens": 7,
    }
    assert ctxs[1]["step_id"] == 1
    assert ctxs[1]["kv_retention_ttl_seconds"] == 3.0 + DEFAULT_ROUTER_TTL_MARGIN_S
    assert "expected_output_tokens" not in ctxs[1]
    assert "expected_output_length" not in ctxs[1]
    assert ctxs[2] == {
        "program_id": "sub-a",
        "task_id": "job-a",
        "session_id": "sub-a",
        "agent_id": "coder",
        "agent_role": "subagent",
        "parent_program_id": "lead-a",
        "root_program_id": "lead-a",
        "blocks_parent": True,
        "expected_resume": True,
        "step_id": 0,
        "spawn_reason": "coder",
    }
    assert ctxs[3] == {
        "program_id": "sub-b",
        "task_id": "job-a",
        "session_id": "sub-b",
        "agent_id": "sub-b",  # no name: the session id
        "agent_role": "subagent",
        "parent_program_id": "sub-a",
        "root_program_id": "lead-a",  # the root of the tree, not the parent
        "expected_resume": False,  # expect_final()
        "step_id": 0,
    }
    assert ctxs[4] == {**ctxs[2], "expected_resume": False, "step_id": 1}  # final=True
    # The declaration is consumed by the call it was made for.
    assert ctxs[5]["expected_resume"] is True
    assert ctxs[5]["step_id"] == 2


@pytest.mark.anyio
async def test_final_is_checked_before_any_request() -> None:
    fake = FakeEngine()
    async with Runtime([URL], transport=fake.transport(), retry=FAST, dialect=DIALECT) as rt:
        async with rt.job("j") as job, job.session() as s:
            with pytest.raises(TypeError, match="final must be a bool"):
                await s.chat(model="m", messages=MSG, final="yes")  # type: ignore[call-overload]
            with pytest.raises(ValueError, match="without a parent"):
                async with job.session(blocks_parent=True):
                    pass
            with pytest.raises(TypeError, match="blocks_parent must be a bool"):
                async with job.session(parent=s, blocks_parent=1):  # type: ignore[arg-type]
                    pass
    assert fake.seen == []


# ------------------------------------------------------------- session ends at the router


@pytest.mark.anyio
async def test_finish_session_is_the_dialect_s_default() -> None:
    """Only sessions that called, only to the endpoint they called (its root, with its
    Authorization), once each; none with ``finish_session=False``."""
    router, plain = FakeEngine(), FakeEngine()

    async def both(request: httpx.Request) -> httpx.Response:
        fake = router if request.url.host == "router.test" else plain
        return await fake.handle(request)

    endpoints = [
        agentrt.Endpoint(URL, api_key="sk-router"),
        agentrt.Endpoint("http://plain.test/v1", dialect="vllm"),
    ]
    async with Runtime(
        endpoints, transport=httpx.MockTransport(both), retry=FAST, dialect=DIALECT
    ) as rt:
        async with rt.job("j") as job:
            async with job.session(session_id="called") as s:
                await s.chat(model="m", messages=MSG)
                await s.chat(model="m", messages=MSG)
            async with job.session(session_id="silent"):
                pass
    ends = [s for s in router.seen if s.url.endswith("/finish_session?session_id=called")]
    calls = [s for s in (*router.seen, *plain.seen) if "/chat/" in s.url]
    assert len(calls) == 2
    if all(s.url.startswith("http://router.test") for s in calls):
        assert len(ends) == 1 and ends[0].headers["authorization"] == "Bearer sk-router"
    assert not [s for s in plain.seen if "finish_session" in s.url]  # plain vllm: none
    assert not [s for s in router.seen if "silent" in s.url]

    off = FakeEngine()
    dialect = vllm_router_agentic_dialect(finish_session=False)
    assert dialect.session_ends == ()
    async with Runtime([URL], transport=off.transport(), retry=FAST, dialect=dialect) as rt:
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
    assert [s.url for s in off.seen] == ["http://router.test/v1/chat/completions"]


def test_finish_session_option_is_checked() -> None:
    with pytest.raises(TypeError, match="finish_session must be a bool"):
        vllm_router_agentic_dialect(finish_session=1)  # type: ignore[arg-type]
    assert VLLM_ROUTER_AGENTIC.session_ends == (FINISH_SESSION,)
    assert FINISH_SESSION.send_kwargs("s-1") == {"params": {"session_id": "s-1"}}
    # combine() keeps the ends of each dialect, once.
    both = combine(VLLM_ROUTER_AGENTIC, get_dialect("vllm"), VLLM_ROUTER_AGENTIC)
    assert both.session_ends == (FINISH_SESSION,)


@pytest.mark.anyio
async def test_session_ends_are_posted_to_the_router() -> None:
    posted: list[tuple[str, str]] = []

    def router(request: httpx.Request) -> httpx.Response:
        posted.append((request.url.path, request.url.params["session_id"]))
        return httpx.Response(200, json={"status": "ok"})

    fake = FakeEngine()
    async with vllm_router_session_ends(
        "http://router.test/v1", transport=httpx.MockTransport(router)
    ) as ends:
        async with Runtime(
            [URL], transport=fake.transport(), retry=FAST, dialect=DIALECT, hooks=[ends]
        ) as rt:
            async with rt.job("j") as job:
                async with job.session(session_id="called") as s:
                    await s.chat(model="m", messages=MSG)
                async with job.session(session_id="silent"):
                    pass  # never called the router: nothing to release
                async with job.session(session_id="later") as s:
                    await s.chat(model="m", messages=MSG)
    # Every end is sent by the time the block exits, in the order the sessions closed.
    assert posted == [("/finish_session", "called"), ("/finish_session", "later")]


@pytest.mark.anyio
async def test_session_ends_survive_a_failing_router() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    fake = FakeEngine()
    async with vllm_router_session_ends(
        "http://router.test", transport=httpx.MockTransport(down)
    ) as ends:
        async with Runtime(
            [URL], transport=fake.transport(), retry=FAST, dialect=DIALECT, hooks=[ends]
        ) as rt:
            async with rt.job("j") as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
    assert job.report.status == "ok"


@pytest.mark.anyio
@pytest.mark.parametrize("url", ["router.test", "ftp://router.test"])
async def test_session_ends_reject_a_bad_url(url: str) -> None:
    with pytest.raises(ValueError, match="http"):
        async with vllm_router_session_ends(url):
            pass


def test_sync_sessions_say_the_same() -> None:
    fake = FakeEngine()
    with agentrt.SyncRuntime([URL], transport=fake.transport(), dialect=DIALECT) as rt:
        with rt.job("j", deadline_s=60) as job, job.session("lead") as lead:
            with job.session("sub", parent=lead, blocks_parent=True) as sub:
                sub.chat(model="m", messages=MSG, final=True)
                sub.expect_final()
                sub.complete(model="m", prompt="p")
    *calls, end = fake.seen
    assert end.url == f"http://router.test/finish_session?session_id={sub.id}"  # sync too
    first, second = (json.loads(s.body["vllm_xargs"]["agentic_context"]) for s in calls)
    for ctx in (first, second):
        assert ctx["agent_id"] == "sub" and ctx["blocks_parent"] is True
        assert ctx["expected_resume"] is False and 0 < ctx["deadline_seconds"] <= 60
    header = parse_agentrt_header(fake.seen[0].headers["x-agentrt"])
    assert header.final and header.deadline_s is not None
