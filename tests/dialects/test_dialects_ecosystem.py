"""Dialects for what engines and gateways accept in late 2026: exact fields, and the wire.

SGLang's top-level ``session_id`` and ``/close_session``, Dynamo's session-final header and
``strict_priority`` / ``speculative_prefill`` hints, LiteLLM's session header, the generic
session-header dialect, and the agent-hint field names (docs/protocol.md cites each
engine's source).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from agentrt import Retry, Runtime
from agentrt.dialects import (
    DEFAULT_AGENT_HINT_FIELDS,
    DIALECTS,
    DYNAMO,
    LITELLM,
    SGLANG,
    VLLM_AGENT_HINT,
    DialectOptions,
    Encoding,
    combine,
    dynamo_dialect,
    get_dialect,
    session_header,
    sglang_dialect,
    sglang_session_ends,
    vllm_agent_hint_dialect,
    vllm_router_session_ends,
)
from tests._fake import MSG, FakeEngine
from tests.dialects.test_dialects import FULL, make_meta

PRIO = DialectOptions(send_priority=True)
NO_PRIO = DialectOptions()
FAST = Retry(attempts=1, wait_initial=0.0, wait_jitter=0.0)
URL = "http://engine.test/v1"


def extra_headers(enc: Encoding) -> dict[str, str]:
    return {k: v for k, v in enc.headers.items() if not k.startswith("x-agentrt")}


# --------------------------------------------------------------------------- sglang


def test_sglang_session_id_is_opt_in() -> None:
    assert "session_id" not in SGLANG.encode(FULL, PRIO).body
    d = sglang_dialect(send_session_id=True)
    assert d.name == "sglang:session-id"
    enc = d.encode(FULL, NO_PRIO)
    assert extra_headers(enc) == {"x-smg-routing-key": "sess-1"}
    assert enc.body == {"session_id": "sess-1"}  # never session_params (an opened session)
    assert d.encode(FULL, PRIO).body == {"session_id": "sess-1", "priority": -3}


def test_sglang_options_by_name() -> None:
    both = get_dialect("sglang:session-id,low-priority-first")
    assert both.name == "sglang:low-priority-first,session-id"
    assert both.encode(FULL, PRIO).body == {"session_id": "sess-1", "priority": 3}
    assert get_dialect("SGLang:Session-ID").encode(FULL, NO_PRIO).body == {"session_id": "sess-1"}
    with pytest.raises(ValueError, match="the options are 'low-priority-first', 'session-id'"):
        get_dialect("sglang:session-id,sticky")
    with pytest.raises(TypeError, match="send_session_id must be a bool"):
        sglang_dialect(send_session_id=1)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_sglang_sessions_are_closed_on_every_worker() -> None:
    closed: list[tuple[str, str, Any]] = []

    def server(request: httpx.Request) -> httpx.Response:
        closed.append((request.url.host, request.url.path, json.loads(request.content)))
        return httpx.Response(200)

    fake = FakeEngine()
    workers = ["http://w0.test:30000/v1", "http://w1.test:30000/"]
    async with sglang_session_ends(workers, transport=httpx.MockTransport(server)) as ends:
        async with Runtime(
            [URL], transport=fake.transport(), retry=FAST, dialect="sglang:session-id", hooks=[ends]
        ) as rt:
            async with rt.job("j") as job:
                async with job.session(session_id="s-a") as s:
                    await s.chat(model="m", messages=MSG)
                async with job.session(session_id="s-idle"):
                    pass  # never called: nothing to close
                async with job.session(session_id="s-b") as s:
                    await s.chat(model="m", messages=MSG)
    assert [seen.body["session_id"] for seen in fake.seen] == ["s-a", "s-b"]
    closed.sort(key=lambda c: (c[2]["session_id"], c[0]))  # sent concurrently: any order
    assert closed == [
        ("w0.test", "/close_session", {"session_id": "s-a"}),
        ("w1.test", "/close_session", {"session_id": "s-a"}),
        ("w0.test", "/close_session", {"session_id": "s-b"}),
        ("w1.test", "/close_session", {"session_id": "s-b"}),
    ]


@pytest.mark.anyio
async def test_session_ends_carry_the_api_key() -> None:
    auth: list[str | None] = []

    def server(request: httpx.Request) -> httpx.Response:
        auth.append(request.headers.get("authorization"))
        return httpx.Response(200)

    fake = FakeEngine()
    mock = httpx.MockTransport(server)
    async with (
        sglang_session_ends("http://w.test", api_key="sk-close", transport=mock) as close,
        vllm_router_session_ends("http://r.test", transport=mock) as finish,
    ):
        async with Runtime(
            [URL], transport=fake.transport(), retry=FAST, dialect=SGLANG, hooks=[close, finish]
        ) as rt:
            async with rt.job("j") as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
    assert sorted(auth, key=str) == ["Bearer sk-close", None]
    with pytest.raises(ValueError, match="CR/LF"):
        async with sglang_session_ends("http://w.test", api_key="sk\r\nx-evil: 1"):
            pass


@pytest.mark.anyio
async def test_session_end_hooks_check_their_urls() -> None:
    with pytest.raises(ValueError, match="at least one URL"):
        async with sglang_session_ends([]):
            pass
    with pytest.raises(ValueError, match="http"):
        async with sglang_session_ends(["http://ok.test", "ok.test"]):
            pass
    with pytest.raises(ValueError, match="timeout_s"):
        async with vllm_router_session_ends("http://r.test", timeout_s=0):
            pass
    with pytest.raises(TypeError, match="router_url must be a str"):
        async with vllm_router_session_ends(["http://r.test"]):  # type: ignore[arg-type]
            pass


# --------------------------------------------------------------------------- dynamo


def test_dynamo_final_call_says_so() -> None:
    last = FULL.model_copy(update={"final": True})
    assert extra_headers(DYNAMO.encode(last, NO_PRIO)) == {
        "x-dynamo-session-id": "sess-1",
        "x-dynamo-parent-session-id": "sess-0",
        "x-dynamo-session-final": "true",
    }
    assert "x-dynamo-session-final" not in DYNAMO.encode(FULL, NO_PRIO).headers
    quiet = dynamo_dialect(send_final=False)
    assert "x-dynamo-session-final" not in quiet.encode(last, NO_PRIO).headers


def test_dynamo_strict_priority_and_speculative_prefill_exact_fields() -> None:
    d = dynamo_dialect(strict_priority=2, speculative_prefill=True)
    assert d.name == "dynamo"
    assert d.encode(FULL, PRIO).body == {
        "nvext": {
            "agent_hints": {
                "priority": -3,
                "strict_priority": 2,
                "osl": 256,
                "speculative_prefill": True,
            }
        }
    }
    # The session's last call has no next turn to prefill.
    last = make_meta(final=True)
    assert d.encode(last, NO_PRIO).body == {"nvext": {"agent_hints": {"strict_priority": 2}}}
    assert dynamo_dialect(strict_priority=0).encode(make_meta(), NO_PRIO).body == {
        "nvext": {"agent_hints": {"strict_priority": 0}}
    }
    # The default sends neither: older Dynamo versions refuse unknown agent_hints fields.
    assert DYNAMO.encode(make_meta(), PRIO).body == {}


@pytest.mark.parametrize("bad", [-1, 2**32, 1.5, True, "1"])
def test_dynamo_strict_priority_is_a_u32(bad: Any) -> None:
    with pytest.raises(ValueError, match="strict_priority"):
        dynamo_dialect(strict_priority=bad)


def test_dynamo_flags_are_bools() -> None:
    with pytest.raises(TypeError, match="speculative_prefill must be a bool"):
        dynamo_dialect(speculative_prefill="yes")  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_dynamo_final_on_the_wire() -> None:
    fake = FakeEngine()
    d = dynamo_dialect(strict_priority=1)
    async with Runtime([URL], transport=fake.transport(), retry=FAST, dialect=d) as rt:
        client = rt.openai()
        async with rt.job("j") as job, job.session(session_id="s1") as s:
            await s.chat(model="m", messages=MSG, max_tokens=9)
            s.expect_final()
            await client.chat.completions.create(model="m", messages=MSG)
            await s.chat(model="m", messages=MSG, final=True)
    finals = [seen.headers.get("x-dynamo-session-final") for seen in fake.seen]
    assert finals == [None, "true", "true"]
    assert fake.seen[0].body["nvext"] == {"agent_hints": {"strict_priority": 1, "osl": 9}}
    assert all(seen.headers["x-dynamo-session-id"] == "s1" for seen in fake.seen)


# --------------------------------------------------------------------------- litellm


def test_litellm_exact_fields() -> None:
    assert get_dialect("litellm") is LITELLM
    assert DIALECTS["litellm"] is LITELLM
    enc = LITELLM.encode(FULL, PRIO)
    assert extra_headers(enc) == {"x-litellm-session-id": "sess-1"}
    assert enc.body == {}
    assert "LiteLLM" in LITELLM.doc


# --------------------------------------------------------------------------- session header


def test_session_header_exact_fields() -> None:
    d = session_header("X-Session-Id")
    assert d.name == "session-header:x-session-id"
    enc = d.encode(FULL, PRIO)
    assert extra_headers(enc) == {"x-session-id": "sess-1"}
    assert enc.body == {}
    with_job = session_header("x-session-id", "X-Job-Id")
    assert with_job.name == "session-header:x-session-id,x-job-id"
    assert extra_headers(with_job.encode(FULL, NO_PRIO)) == {
        "x-session-id": "sess-1",
        "x-job-id": "job-1",
    }
    assert session_header("x-bf-session", name="bifrost").name == "bifrost"


def test_session_header_by_name() -> None:
    d = get_dialect("session-header:X-Affinity,x-job")
    assert d.name == "session-header:x-affinity,x-job"
    assert extra_headers(d.encode(FULL, NO_PRIO)) == {"x-affinity": "sess-1", "x-job": "job-1"}
    with pytest.raises(ValueError, match="at most one job header"):
        get_dialect("session-header:a,b,c")
    with pytest.raises(ValueError, match="unknown dialect"):
        get_dialect("session-header:")


@pytest.mark.parametrize(
    ("header", "job", "match"),
    [
        ("bad header", None, "not a valid HTTP header name"),
        ("x-s\r\nx-evil", None, "not a valid HTTP header name"),
        ("Authorization", None, "reserved"),
        ("x-agentrt-session", None, "reserved"),
        ("x-s", "host", "reserved"),
        ("x-s", "X-S", "must differ"),
        ("", None, "not a valid HTTP header name"),
    ],
)
def test_session_header_rejects_bad_names(header: str, job: str | None, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        session_header(header, job)


def test_session_header_combines_with_an_engine_dialect() -> None:
    both = combine(get_dialect("vllm"), session_header("x-session-id", "x-job-id"))
    enc = both.encode(FULL, NO_PRIO)
    assert enc.headers["x-session-id"] == "sess-1"  # the same value from both: sent once
    assert enc.headers["x-job-id"] == "job-1"
    assert enc.body["session_id"] == "sess-1"


@pytest.mark.anyio
async def test_session_header_through_a_runtime() -> None:
    fake = FakeEngine()
    d = get_dialect("session-header:x-session-id,x-job-id")
    async with Runtime([URL], transport=fake.transport(), retry=FAST, dialect=d) as rt:
        async with rt.job("j", job_id="job-z") as job:
            for sid in ("a", "b"):
                async with job.session(session_id=sid) as s:
                    await s.chat(model="m", messages=MSG)
    assert [(s.headers["x-session-id"], s.headers["x-job-id"]) for s in fake.seen] == [
        ("a", "job-z"),
        ("b", "job-z"),
    ]


# --------------------------------------------------------------------------- agent hint


def test_agent_hint_default_field_names_are_today_s() -> None:
    assert dict(DEFAULT_AGENT_HINT_FIELDS) == {
        "object": "agent_hint",
        "session_id": "session_id",
        "parent_session_id": "parent_session_id",
        "cache_ttl": "cache_ttl_s",
    }
    with pytest.raises(TypeError):
        DEFAULT_AGENT_HINT_FIELDS["object"] = "x"  # type: ignore[index]
    meta = make_meta(parent_session_id="p", idle_expected_s=1.0)
    assert (
        vllm_agent_hint_dialect(fields={}).encode(meta, NO_PRIO).body
        == VLLM_AGENT_HINT.encode(meta, NO_PRIO).body
    )


def test_agent_hint_renamed_fields_in_milliseconds() -> None:
    mooncake = vllm_agent_hint_dialect(fields={"cache_ttl": "cache_ttl_ms"}, ttl_unit="ms")
    meta = make_meta(parent_session_id="p", idle_expected_s=1.23456)
    assert mooncake.encode(meta, NO_PRIO).body == {
        "agent_hint": {"session_id": "sess-1", "parent_session_id": "p", "cache_ttl_ms": 3235}
    }
    assert "cache_ttl_ms" in mooncake.doc and "in ms" in mooncake.doc
    renamed = vllm_agent_hint_dialect(
        fields={"object": "session_hint", "session_id": "sid", "parent_session_id": None}
    )
    assert renamed.encode(meta, NO_PRIO).body == {
        "session_hint": {"sid": "sess-1", "cache_ttl_s": 3.235}
    }
    no_ttl = vllm_agent_hint_dialect(fields={"cache_ttl": None})
    assert no_ttl.encode(meta, NO_PRIO).body == {
        "agent_hint": {"session_id": "sess-1", "parent_session_id": "p"}
    }


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"ttl": "x"}, "unknown agent hint field 'ttl'"),
        ({"object": None}, "cannot be left out"),
        ({"session_id": None}, "cannot be left out"),
        ({"session_id": "a b"}, "must be 1 to 64"),
        ({"cache_ttl": "1st"}, "must be 1 to 64"),
        ({"cache_ttl": "session_id"}, "must differ"),
    ],
)
def test_agent_hint_rejects_bad_field_names(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        vllm_agent_hint_dialect(fields=fields)


def test_agent_hint_rejects_a_bad_unit_and_mapping() -> None:
    with pytest.raises(ValueError, match="ttl_unit"):
        vllm_agent_hint_dialect(ttl_unit="min")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="fields must be a mapping"):
        vllm_agent_hint_dialect(fields=[("cache_ttl", "x")])  # type: ignore[arg-type]
