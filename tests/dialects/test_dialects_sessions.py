"""Session identity and session ends across dialects (issue 28): SGLang's radix-session
close, Dynamo's configurable session header, llm-d's ``session_id_header`` affinity, the
vLLM RFC #52113 ``agent_hint`` shape, and session ids no router confuses by prefix.
Exact fields; docs/protocol.md cites the upstream file behind each."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from agentrt import Retry, Runtime
from agentrt._protocol import MAX_ID_BYTES
from agentrt.dialects import (
    CLOSE_SESSION,
    DYNAMO,
    FINISH_SESSION,
    LLMD,
    DialectOptions,
    SessionEnd,
    combine,
    dynamo_dialect,
    get_dialect,
    llmd_dialect,
    sglang_dialect,
    vllm_agent_hint_dialect,
)
from tests._fake import MSG, FakeEngine
from tests.dialects.test_dialects import FULL, extra_headers, make_meta

NO_PRIO = DialectOptions()
FAST = Retry(attempts=1, wait_initial=0.0, wait_jitter=0.0)
URL = "http://engine.test/v1"


# --------------------------------------------------------------------- sglang: close


def test_sglang_close_session_is_an_option_of_session_id() -> None:
    d = get_dialect("sglang:session-id,close-session")
    assert d.name == "sglang:session-id,close-session"
    assert d.session_ends == (CLOSE_SESSION,)
    assert CLOSE_SESSION == SessionEnd("/close_session", json_key="session_id")
    assert CLOSE_SESSION.send_kwargs("s-1") == {"json": {"session_id": "s-1"}}
    assert d.encode(FULL, NO_PRIO).body == {"session_id": "sess-1"}
    assert sglang_dialect(send_session_id=True).session_ends == ()  # off by default
    with pytest.raises(ValueError, match="needs send_session_id=True"):
        sglang_dialect(close_session=True)
    with pytest.raises(ValueError, match="needs send_session_id=True"):
        get_dialect("sglang:close-session")
    with pytest.raises(TypeError, match="close_session must be a bool"):
        sglang_dialect(send_session_id=True, close_session="yes")  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_sglang_sessions_are_closed_by_the_runtime() -> None:
    fake = FakeEngine()
    dialect = "sglang:session-id,close-session"
    async with Runtime([URL], transport=fake.transport(), retry=FAST, dialect=dialect) as rt:
        async with rt.job("j") as job:
            async with job.session(session_id="worked") as s:
                await s.chat(model="m", messages=MSG)
            async with job.session(session_id="idle"):
                pass  # sent nothing: nothing to close
    chat, close = fake.seen
    assert chat.body["session_id"] == "worked"
    assert close.url == "http://engine.test/close_session"  # the root, less /v1
    assert close.body == {"session_id": "worked"}


# ------------------------------------------------------------------ dynamo: header key


def test_dynamo_session_header_key() -> None:
    d = dynamo_dialect(session_header="X-Session-ID")
    assert d.name == "dynamo:x-session-id"
    assert extra_headers(d.encode(FULL, NO_PRIO)) == {
        "x-dynamo-session-id": "sess-1",  # the agent context reads this one
        "x-session-id": "sess-1",  # --router-session-header-key X-Session-ID: affinity
        "x-dynamo-parent-session-id": "sess-0",
    }
    by_name = get_dialect("dynamo:X-Correlation-ID")
    assert extra_headers(by_name.encode(make_meta(), NO_PRIO)) == {
        "x-dynamo-session-id": "sess-1",
        "x-correlation-id": "sess-1",
    }
    same = dynamo_dialect(session_header="X-Dynamo-Session-ID")
    assert same.name == "dynamo"
    assert extra_headers(same.encode(FULL, NO_PRIO)) == extra_headers(DYNAMO.encode(FULL, NO_PRIO))


@pytest.mark.parametrize(
    ("header", "match"),
    [
        ("x session", "not a valid HTTP header name"),
        ("x-id\r\nx-evil", "not a valid HTTP header name"),
        ("authorization", "reserved"),
        ("x-dynamo-parent-session-id", "one of Dynamo's own headers"),
        ("x" * 300, "not a valid HTTP header name"),
    ],
)
def test_dynamo_session_header_is_checked(header: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        dynamo_dialect(session_header=header)


def test_dynamo_never_sends_session_control() -> None:
    for meta in (FULL, make_meta(final=True), make_meta(turn=0, first_turn=True)):
        for d in (DYNAMO, dynamo_dialect(speculative_prefill=True, strict_priority=1)):
            body = d.encode(meta, DialectOptions(send_priority=True)).body
            assert "session_control" not in body.get("nvext", {})
            assert set(body) <= {"nvext"} and set(body.get("nvext", {})) <= {"agent_hints"}


# --------------------------------------------------------------- llm-d: session id header


def test_llmd_session_id_header_mode() -> None:
    d = get_dialect("llm-d:session-id")
    assert d.name == "llm-d:session-id" and d.echo_headers == ()
    first = make_meta(turn=0, first_turn=True, program_id="prog-1")
    assert extra_headers(d.encode(first, NO_PRIO)) == {
        "x-llm-d-inference-fairness-id": "prog-1",
        "x-session-type": "agentic",
        # from the first call: the session_id strategy's default source (filter and
        # scorer), and the first releases' default headerName
        "x-session-id": "sess-1",
        "x-session-token": "sess-1",
    }
    custom = get_dialect("llm-d:session-id=X-Session-ID")
    assert custom.name == "llm-d:session-id=x-session-id"
    later = make_meta(echo={"x-session-token": "cG9kLTE="})  # an echo is not resent
    assert extra_headers(custom.encode(later, NO_PRIO)) == {
        "x-llm-d-inference-fairness-id": "job-1",
        "x-session-type": "agentic",
        "x-session-id": "sess-1",
    }
    assert llmd_dialect(session_affinity="session_id_header").name == "llm-d:session-id"
    assert llmd_dialect(session_affinity="session_id").name == "llm-d:session-id"
    only = get_dialect("llm-d:session-id=x-session-id")  # that one header only
    assert extra_headers(only.encode(first, NO_PRIO)) == {
        "x-llm-d-inference-fairness-id": "prog-1",
        "x-session-type": "agentic",
        "x-session-id": "sess-1",
    }


def test_llmd_default_mode_is_unchanged() -> None:
    assert get_dialect("llm-d") is LLMD
    assert LLMD.echo_headers == ("x-session-token",)
    echo = make_meta(echo={"x-session-token": "cG9kLTE="})
    assert extra_headers(LLMD.encode(echo, NO_PRIO)) == {
        "x-llm-d-inference-fairness-id": "job-1",
        "x-session-type": "agentic",
        "x-session-token": "cG9kLTE=",
    }
    assert "x-session-token" not in extra_headers(LLMD.encode(make_meta(), NO_PRIO))
    other = get_dialect("llm-d:echo=x-llm-d-pod")
    assert other.echo_headers == ("x-llm-d-pod",)


@pytest.mark.parametrize(
    ("option", "match"),
    [
        ("llm-d:sticky", "unknown option"),
        ("llm-d:echo", "unknown option"),
        ("llm-d:session-id=x-llm-d-inference-fairness-id", "fairness header"),
        ("llm-d:session-id=host", "reserved"),
    ],
)
def test_llmd_options_are_checked(option: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        get_dialect(option)
    with pytest.raises(ValueError, match="session_affinity must be"):
        llmd_dialect(session_affinity="cookie")  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_llmd_session_id_on_the_wire() -> None:
    fake = FakeEngine()
    async with Runtime(
        [URL], transport=fake.transport(), retry=FAST, dialect="llm-d:session-id"
    ) as rt:
        async with rt.job("j") as job, job.session(session_id="conv-7") as s:
            await s.chat(model="m", messages=MSG)
            await s.chat(model="m", messages=MSG)
    assert [seen.headers["x-session-token"] for seen in fake.seen] == ["conv-7", "conv-7"]
    assert [seen.headers["x-session-id"] for seen in fake.seen] == ["conv-7", "conv-7"]


# ------------------------------------------------------------- vLLM RFC #52113 agent_hint


def test_agent_hint_rfc_shape_exact_fields() -> None:
    d = get_dialect("vllm-agent-hint:rfc")
    assert d.name == "vllm-agent-hint:rfc"
    assert d.encode(FULL, NO_PRIO).body == {
        "agent_hint": {
            "session_id": "sess-1",
            "parent_session_id": "sess-0",
            "cache_control": {"type": "ephemeral", "ttl": 4.0},  # 2 s idle + 2 s margin
        }
    }
    last = FULL.model_copy(update={"final": True})
    assert d.encode(last, NO_PRIO).body == {
        "agent_hint": {
            "session_id": "sess-1",
            "parent_session_id": "sess-0",
            # the release: evict the whole request context (no block range)
            "context_management": {"manage_request": True, "edits": [{"type": "evict"}]},
        }
    }
    assert d.encode(make_meta(), NO_PRIO).body == {"agent_hint": {"session_id": "sess-1"}}
    keep = get_dialect("vllm-agent-hint:rfc,no-release")
    assert keep.encode(last, NO_PRIO).body == {
        "agent_hint": {"session_id": "sess-1", "parent_session_id": "sess-0"}
    }


def test_agent_hint_rfc_ttl_is_bounded_and_options_checked() -> None:
    d = vllm_agent_hint_dialect(shape="rfc", max_ttl_s=1e6)
    hint = d.encode(make_meta(idle_expected_s=1e5), NO_PRIO).body["agent_hint"]
    assert hint["cache_control"]["ttl"] == 3600.0  # the RFC's le=3600
    with pytest.raises(ValueError, match="shape='flat' only"):
        vllm_agent_hint_dialect(shape="rfc", ttl_unit="ms")
    with pytest.raises(ValueError, match="shape='flat' only"):
        vllm_agent_hint_dialect(shape="rfc", fields={"cache_ttl": "ttl_ms"})
    with pytest.raises(ValueError, match="shape must be"):
        vllm_agent_hint_dialect(shape="nested")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="release_on_final must be a bool"):
        vllm_agent_hint_dialect(shape="rfc", release_on_final=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="takes no option"):
        get_dialect("vllm-agent-hint:nested")


# ----------------------------------------------------------------------- session ends


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"path": "finish"}, "must start with '/'"),
        ({"path": "/a b", "param": "id"}, "must start with '/'"),
        ({"path": "/x"}, "exactly one of"),
        ({"path": "/x", "param": "id", "json_key": "id"}, "exactly one of"),
        ({"path": "/x", "param": "id\r\n"}, "not a name"),
    ],
)
def test_a_session_end_is_checked(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SessionEnd(**kwargs)


def test_combined_dialects_keep_every_end_once() -> None:
    both = combine(
        get_dialect("vllm-router-agentic"), get_dialect("sglang:session-id,close-session")
    )
    assert both.session_ends == (FINISH_SESSION, CLOSE_SESSION)


# ------------------------------------------------------------------------ session ids


@pytest.mark.anyio
async def test_generated_session_ids_are_fixed_width() -> None:
    """``ses-`` and 16 hex digits: no generated id is a prefix of another (vllm-router#219:
    ``session-1`` matched ``session-12`` by prefix), and each fits a header."""
    fake = FakeEngine()
    async with Runtime([URL], transport=fake.transport(), retry=FAST) as rt:
        async with rt.job("j") as job:
            ids = []
            for _ in range(200):
                async with job.session() as s:
                    ids.append(s.id)
    assert {len(i) for i in ids} == {20}
    assert all(i.startswith("ses-") and int(i[4:], 16) >= 0 for i in ids)
    assert not [a for a in ids for b in ids if a != b and b.startswith(a)]


@pytest.mark.anyio
@pytest.mark.parametrize("bad", ["s\r\nx-evil: 1", "s\n", "s 1", "é", "x" * (MAX_ID_BYTES + 1), ""])
async def test_caller_session_ids_are_checked_before_any_header(bad: str) -> None:
    fake = FakeEngine()
    async with Runtime([URL], transport=fake.transport(), retry=FAST, dialect="dynamo") as rt:
        async with rt.job("j") as job:
            with pytest.raises(ValueError):
                async with job.session(session_id=bad):
                    pass
    assert fake.seen == []


def test_wire_forms_round_trip_as_json() -> None:
    d = get_dialect("vllm-agent-hint:rfc")
    body = d.encode(FULL.model_copy(update={"final": True}), NO_PRIO).body
    assert json.loads(json.dumps(body)) == body
    assert isinstance(httpx.Request("POST", URL, json=body).content, bytes)
