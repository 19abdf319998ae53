"""Pure unit tests for the dialects: the exact headers and body fields each one produces."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrt._protocol import CallMetadata, agentrt_headers, parse_agentrt_header, validate_id
from agentrt.dialects import (
    DIALECTS,
    DYNAMO,
    GENERIC,
    LLMD,
    OPENAI,
    SGLANG,
    VLLM,
    VLLM_AGENT_HINT,
    VLLM_ROUTER,
    Dialect,
    DialectOptions,
    Encoding,
    combine,
    dynamo_priority,
    get_dialect,
    register_dialect,
    resolve_dialect,
    sglang_dialect,
    sglang_priority,
    vllm_agent_hint_dialect,
    vllm_dialect,
    vllm_router_dialect,
)

PRIO = DialectOptions(send_priority=True)
NO_PRIO = DialectOptions()
TOKEN = "ZGVmYXVsdC92bGxtLTA="  # base64("default/vllm-0"), as llm-d sets it


def make_meta(**overrides: Any) -> CallMetadata:
    fields: dict[str, Any] = {
        "call_id": "call-1",
        "job_id": "job-1",
        "session_id": "sess-1",
        "program_id": "job-1",
        "turn": 2,
        "first_turn": False,
        "service_s": 1.5,
        "service_tokens": 1234,
    }
    fields.update(overrides)
    for key in ("call_id", "job_id", "session_id", "program_id", "parent_session_id"):
        if fields.get(key) is not None:
            validate_id(fields[key], key)
    return CallMetadata(**fields)


FULL = make_meta(
    parent_session_id="sess-0",
    idle_expected_s=2.0,
    idle_expected_source="declared",
    idle_s=0.25,
    priority=3,
    expected_output_tokens=256,
)

AGENTRT_FULL = {
    "x-agentrt": 'v=2, job="job-1", session="sess-1", parent="sess-0", call="call-1", turn=2, '
    "svc-s=1.5, svc-tok=1234, idle=0.25, idle-exp=2.0, idle-src=declared, prio=3"
}


def extra_headers(enc: Encoding) -> dict[str, str]:
    """The headers a dialect adds on top of agentrt's own."""
    return {k: v for k, v in enc.headers.items() if not k.startswith("x-agentrt")}


def agentrt_only(enc: Encoding) -> dict[str, str]:
    """agentrt's own header(s) of an encoding."""
    return {k: v for k, v in enc.headers.items() if k.startswith("x-agentrt")}


# --------------------------------------------------------------------------- registry


def test_registry_names() -> None:
    assert set(DIALECTS) == {
        "generic",
        "vllm",
        "vllm-router",
        "vllm-router-agentic",
        "vllm-agent-hint",
        "sglang",
        "dynamo",
        "llm-d",
        "openai",
        "litellm",
    }
    for name, dialect in DIALECTS.items():
        assert dialect.name == name
        assert get_dialect(name) is dialect
        assert dialect.doc


def test_registry_is_read_only() -> None:
    with pytest.raises(TypeError):
        DIALECTS["mine"] = GENERIC  # type: ignore[index]


def test_get_dialect_is_case_and_space_insensitive() -> None:
    assert get_dialect(" VLLM ") is VLLM
    assert get_dialect("LLM-D") is LLMD


def test_unknown_dialect_lists_known_names() -> None:
    with pytest.raises(ValueError, match="unknown dialect 'tgi'") as info:
        get_dialect("tgi")
    for name in DIALECTS:
        assert name in str(info.value)


def test_dialect_name_must_be_str() -> None:
    with pytest.raises(TypeError):
        get_dialect(3)  # type: ignore[arg-type]


def test_parameterized_names() -> None:
    d = get_dialect("vllm-router:X-User-Id")
    assert d.name == "vllm-router:x-user-id"
    assert extra_headers(d.encode(make_meta(), NO_PRIO)) == {"x-user-id": "sess-1"}
    assert get_dialect("vllm-router:x-session-id").name == "vllm-router"
    low = get_dialect("sglang:low-priority-first")
    assert low.name == "sglang:low-priority-first"
    assert low.encode(make_meta(priority=4), PRIO).body == {"priority": 4}


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("vllm:foo", "takes no option"),
        ("sglang:foo", "unknown option 'foo'"),
        ("vllm-router:bad header", "not a valid HTTP header name"),
        ("nope:x", "unknown dialect"),
        ("vllm-router:", "unknown dialect"),
    ],
)
def test_bad_parameterized_names(name: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        get_dialect(name)


def test_register_dialect() -> None:
    from agentrt import dialects as mod

    mine = Dialect(name="Mine", encode=GENERIC.encode, doc="test")
    try:
        register_dialect(mine)
        assert get_dialect("mine") is mine
        with pytest.raises(ValueError, match="already registered"):
            register_dialect(mine)
        register_dialect(mine, replace=True)
    finally:
        mod._REGISTRY.pop("mine", None)
    with pytest.raises(ValueError):
        register_dialect(Dialect(name="a+b", encode=GENERIC.encode))
    with pytest.raises(ValueError):
        register_dialect(Dialect(name="a:b", encode=GENERIC.encode))
    with pytest.raises(TypeError):
        register_dialect("vllm")  # type: ignore[arg-type]
    assert "mine" not in DIALECTS


def test_dialects_are_frozen() -> None:
    with pytest.raises(AttributeError):
        VLLM.name = "other"  # type: ignore[misc]


# --------------------------------------------------------------------------- every dialect


@pytest.mark.parametrize("name", sorted(DIALECTS))
@pytest.mark.parametrize("options", [NO_PRIO, PRIO])
def test_every_dialect_sends_agentrt_headers(name: str, options: DialectOptions) -> None:
    enc = get_dialect(name).encode(FULL, options)
    assert agentrt_only(enc) == AGENTRT_FULL
    read = parse_agentrt_header(enc.headers["x-agentrt"])
    assert read == FULL.model_copy(update={"expected_output_tokens": None})


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_header_names_and_values_are_safe(name: str) -> None:
    meta = make_meta(
        parent_session_id="sess-0",
        priority=-7,
        expected_output_tokens=9,
        echo={"x-session-token": TOKEN},
    )
    for options in (NO_PRIO, PRIO):
        enc = get_dialect(name).encode(meta, options)
        for key, value in enc.headers.items():
            assert key == key.lower()
            assert re.fullmatch(r"[!#$%&'*+\-.^_`|~0-9a-z]+", key)
            assert isinstance(value, str)
            assert "\r" not in value and "\n" not in value
            assert re.fullmatch(r"[\x20-\x7e]+", value)
            assert len(value.encode()) <= 1024


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_encode_is_pure(name: str) -> None:
    dialect = get_dialect(name)
    meta = make_meta(priority=1, expected_output_tokens=5, echo={"x-session-token": TOKEN})
    before = meta.model_dump()
    first = dialect.encode(meta, PRIO)
    first.headers["x-mutated"] = "1"
    first.body["mutated"] = True
    second = dialect.encode(meta, PRIO)
    assert "x-mutated" not in second.headers
    assert "mutated" not in second.body
    assert meta.model_dump() == before


@settings(max_examples=60, deadline=None)
@given(
    st.text(
        alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=128
    ),
    st.integers(min_value=-(2**70), max_value=2**70),
)
def test_any_valid_id_and_priority_encode_safely(ident: str, priority: int) -> None:
    meta = make_meta(session_id=ident, call_id=ident, parent_session_id=ident, priority=priority)
    for dialect in DIALECTS.values():
        enc = dialect.encode(meta, PRIO)
        for value in enc.headers.values():
            assert re.fullmatch(r"[\x20-\x7e]+", value)
        prio = enc.body.get("priority")
        if prio is not None:
            assert -(2**63) <= prio < 2**63


# --------------------------------------------------------------------------- generic


def test_generic_is_agentrt_headers_only() -> None:
    enc = GENERIC.encode(FULL, PRIO)
    assert enc.headers == AGENTRT_FULL
    assert enc.body == {}
    assert GENERIC.echo_headers == ()


def test_generic_first_turn_minimal() -> None:
    meta = make_meta(turn=0, first_turn=True, service_s=0.0, service_tokens=0)
    enc = GENERIC.encode(meta, PRIO)
    assert enc.headers == agentrt_headers(meta)
    # No program (it is the job), parent, idle, idle-decl, idle-exp, idle-src or prio key.
    assert enc.headers == {
        "x-agentrt": 'v=2, job="job-1", session="sess-1", call="call-1", turn=0, '
        "svc-s=0.0, svc-tok=0"
    }
    read = parse_agentrt_header(enc.headers["x-agentrt"])
    assert (read.turn, read.first_turn) == (0, True)
    assert read.parent_session_id is None and read.priority is None
    assert read.idle_s is None and read.idle_expected_s is None


# --------------------------------------------------------------------------- vllm


def test_vllm_exact_fields() -> None:
    enc = VLLM.encode(FULL, NO_PRIO)
    assert extra_headers(enc) == {"x-session-id": "sess-1", "x-request-id": "call-1"}
    assert enc.body == {"session_id": "sess-1"}


def test_vllm_priority_only_when_enabled() -> None:
    assert "priority" not in VLLM.encode(FULL, NO_PRIO).body
    assert VLLM.encode(FULL, PRIO).body == {"session_id": "sess-1", "priority": 3}
    # lower runs first in both agentrt and vLLM: sent as is, negatives included
    assert VLLM.encode(make_meta(priority=-2), PRIO).body["priority"] == -2
    # no priority in the metadata: nothing sent even when enabled
    assert "priority" not in VLLM.encode(make_meta(), PRIO).body


def test_vllm_priority_bounded_to_int64() -> None:
    assert VLLM.encode(make_meta(priority=2**70), PRIO).body["priority"] == 2**63 - 1
    assert VLLM.encode(make_meta(priority=-(2**70)), PRIO).body["priority"] == -(2**63)


def test_vllm_without_request_id() -> None:
    enc = vllm_dialect(send_request_id=False).encode(FULL, NO_PRIO)
    assert extra_headers(enc) == {"x-session-id": "sess-1"}


# --------------------------------------------------------------------------- vllm-agent-hint


def test_vllm_agent_hint_exact_fields() -> None:
    enc = VLLM_AGENT_HINT.encode(FULL, PRIO)
    assert VLLM_AGENT_HINT.name == "vllm-agent-hint"
    assert extra_headers(enc) == {}
    # idle_expected_s=2.0 plus the default 2 s margin
    assert enc.body == {
        "agent_hint": {"session_id": "sess-1", "parent_session_id": "sess-0", "cache_ttl_s": 4.0}
    }
    assert VLLM_AGENT_HINT.echo_headers == ()
    assert "experimental" in VLLM_AGENT_HINT.doc


def test_vllm_agent_hint_leaves_unknown_fields_out() -> None:
    enc = VLLM_AGENT_HINT.encode(make_meta(), PRIO)
    assert enc.body == {"agent_hint": {"session_id": "sess-1"}}
    # idle 0 is known: the margin alone
    assert VLLM_AGENT_HINT.encode(make_meta(idle_expected_s=0.0), NO_PRIO).body == {
        "agent_hint": {"session_id": "sess-1", "cache_ttl_s": 2.0}
    }


def test_vllm_agent_hint_ttl_margin_bound_and_rounding() -> None:
    d = vllm_agent_hint_dialect(ttl_margin_s=0.5, max_ttl_s=60.0)
    ttl = d.encode(make_meta(idle_expected_s=1.23456), NO_PRIO).body["agent_hint"]["cache_ttl_s"]
    assert ttl == 1.735
    capped = d.encode(make_meta(idle_expected_s=1e9), NO_PRIO).body["agent_hint"]
    assert capped["cache_ttl_s"] == 60.0
    assert VLLM_AGENT_HINT.encode(make_meta(idle_expected_s=1e9), NO_PRIO).body["agent_hint"][
        "cache_ttl_s"
    ] == pytest.approx(3600.0)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_vllm_agent_hint_rejects_bad_options(bad: float) -> None:
    with pytest.raises(ValueError, match="ttl_margin_s"):
        vllm_agent_hint_dialect(ttl_margin_s=bad)
    with pytest.raises(ValueError, match="max_ttl_s"):
        vllm_agent_hint_dialect(max_ttl_s=bad)
    with pytest.raises(TypeError):
        vllm_agent_hint_dialect(ttl_margin_s="2")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        vllm_agent_hint_dialect(max_ttl_s=None)  # type: ignore[arg-type]


def test_vllm_agent_hint_composes_with_vllm() -> None:
    for d in (resolve_dialect(["vllm", "vllm-agent-hint"]), combine(VLLM, VLLM_AGENT_HINT)):
        assert d.name == "vllm+vllm-agent-hint"
        enc = d.encode(FULL, PRIO)
        assert extra_headers(enc) == {"x-session-id": "sess-1", "x-request-id": "call-1"}
        assert enc.body == {
            "session_id": "sess-1",
            "priority": 3,
            "agent_hint": {
                "session_id": "sess-1",
                "parent_session_id": "sess-0",
                "cache_ttl_s": 4.0,
            },
        }


# --------------------------------------------------------------------------- vllm-router


def test_vllm_router_default_header() -> None:
    enc = VLLM_ROUTER.encode(FULL, PRIO)
    assert extra_headers(enc) == {"x-session-id": "sess-1"}
    assert enc.body == {}
    assert VLLM_ROUTER.name == "vllm-router"


def test_vllm_router_custom_header() -> None:
    d = vllm_router_dialect("X-User-ID")
    assert d.name == "vllm-router:x-user-id"
    enc = d.encode(FULL, PRIO)
    assert extra_headers(enc) == {"x-user-id": "sess-1"}
    assert enc.body == {}


@pytest.mark.parametrize(
    "header",
    [
        "",
        "x-session id",
        "x-session-id\r\nx-evil: 1",
        "x-session-id\n",
        "x-session:id",
        "x" * 65,
        "authorization",
        "Content-Type",
        "Host",
        "x-agentrt-session-id",
        "x-agentrt",
        "X-Agentrt",
        "x-séssion",
    ],
)
def test_vllm_router_rejects_bad_header_names(header: str) -> None:
    with pytest.raises(ValueError):
        vllm_router_dialect(header)


def test_vllm_router_header_name_type() -> None:
    with pytest.raises(TypeError):
        vllm_router_dialect(None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- sglang


def test_sglang_exact_fields() -> None:
    enc = SGLANG.encode(FULL, NO_PRIO)
    assert extra_headers(enc) == {"x-smg-routing-key": "sess-1"}
    assert enc.body == {}


def test_sglang_priority_only_when_enabled_and_negated() -> None:
    assert SGLANG.encode(FULL, PRIO).body == {"priority": -3}
    assert SGLANG.encode(make_meta(priority=-5), PRIO).body == {"priority": 5}
    assert SGLANG.encode(make_meta(priority=0), PRIO).body == {"priority": 0}
    assert "priority" not in SGLANG.encode(make_meta(), PRIO).body


def test_sglang_low_priority_first_sends_as_is() -> None:
    d = sglang_dialect(low_priority_values_first=True)
    assert d.encode(FULL, PRIO).body == {"priority": 3}
    assert d.encode(FULL, NO_PRIO).body == {}


def test_sglang_never_sends_session_fields() -> None:
    for options in (NO_PRIO, PRIO):
        body = SGLANG.encode(FULL, options).body
        assert "session_id" not in body
        assert "session_params" not in body


def test_sglang_priority_mapping_bounds() -> None:
    assert sglang_priority(2**40) == -(2**31) + 1
    assert sglang_priority(-(2**40)) == 2**31 - 1
    assert sglang_priority(2**40, low_priority_values_first=True) == 2**31 - 1


# --------------------------------------------------------------------------- dynamo


def test_dynamo_exact_fields() -> None:
    enc = DYNAMO.encode(FULL, PRIO)
    assert extra_headers(enc) == {
        "x-dynamo-session-id": "sess-1",
        "x-dynamo-parent-session-id": "sess-0",
    }
    assert enc.body == {"nvext": {"agent_hints": {"priority": -3, "osl": 256}}}


def test_dynamo_parent_only_when_set() -> None:
    enc = DYNAMO.encode(make_meta(), NO_PRIO)
    assert extra_headers(enc) == {"x-dynamo-session-id": "sess-1"}
    assert enc.body == {}


def test_dynamo_priority_only_when_enabled() -> None:
    assert DYNAMO.encode(FULL, NO_PRIO).body == {"nvext": {"agent_hints": {"osl": 256}}}
    assert DYNAMO.encode(make_meta(priority=1), NO_PRIO).body == {}
    assert DYNAMO.encode(make_meta(priority=1), PRIO).body == {
        "nvext": {"agent_hints": {"priority": -1}}
    }


@pytest.mark.parametrize(
    ("agentrt", "dynamo"),
    [
        (0, 0),
        (1, -1),
        (10, -10),
        (-5, 5),
        (2**40, -(2**31) + 1),
        (-(2**40), 2**31 - 1),
    ],
)
def test_dynamo_priority_mapping(agentrt: int, dynamo: int) -> None:
    assert dynamo_priority(agentrt) == dynamo


def test_dynamo_priority_preserves_order() -> None:
    # agentrt: lower runs first; Dynamo: higher is more important
    assert dynamo_priority(0) > dynamo_priority(1) > dynamo_priority(2)


def test_dynamo_osl() -> None:
    assert DYNAMO.encode(make_meta(expected_output_tokens=0), NO_PRIO).body == {
        "nvext": {"agent_hints": {"osl": 0}}
    }
    assert DYNAMO.encode(make_meta(expected_output_tokens=2**40), NO_PRIO).body == {
        "nvext": {"agent_hints": {"osl": 2**32 - 1}}
    }
    assert DYNAMO.encode(make_meta(expected_output_tokens=-1), NO_PRIO).body == {}


# --------------------------------------------------------------------------- llm-d


def test_llmd_asks_for_the_session_token() -> None:
    assert LLMD.echo_headers == ("x-session-token",)


FAIRNESS = {"x-llm-d-inference-fairness-id": "job-1", "x-session-type": "agentic"}


def test_llmd_first_call_has_no_token() -> None:
    enc = LLMD.encode(make_meta(turn=0, first_turn=True), PRIO)
    assert extra_headers(enc) == FAIRNESS
    assert enc.body == {}


def test_llmd_echoes_the_token() -> None:
    enc = LLMD.encode(make_meta(echo={"x-session-token": TOKEN}), PRIO)
    assert extra_headers(enc) == {**FAIRNESS, "x-session-token": TOKEN}
    assert enc.body == {}


def test_llmd_echo_key_is_case_insensitive() -> None:
    enc = LLMD.encode(make_meta(echo={"X-Session-Token": TOKEN}), NO_PRIO)
    assert extra_headers(enc) == {**FAIRNESS, "x-session-token": TOKEN}


def test_llmd_echoes_only_its_header() -> None:
    enc = LLMD.encode(make_meta(echo={"x-session-token": TOKEN, "set-cookie": "a=b"}), NO_PRIO)
    assert extra_headers(enc) == {**FAIRNESS, "x-session-token": TOKEN}


def test_llmd_fairness_id_is_the_program() -> None:
    """llm-d's flow control queues by x-llm-d-inference-fairness-id: agentrt names the
    program, so two sessions of one program share a queue and two programs do not."""
    one = LLMD.encode(make_meta(session_id="sess-a", program_id="prog-1"), NO_PRIO)
    two = LLMD.encode(make_meta(session_id="sess-b", program_id="prog-1"), NO_PRIO)
    other = LLMD.encode(make_meta(session_id="sess-a", program_id="prog-2"), NO_PRIO)
    assert one.headers["x-llm-d-inference-fairness-id"] == "prog-1"
    assert two.headers["x-llm-d-inference-fairness-id"] == "prog-1"
    assert other.headers["x-llm-d-inference-fairness-id"] == "prog-2"


@pytest.mark.parametrize(
    "bad",
    ["abc\r\nx-evil: 1", "abc\n", "\tabc", "", " ", "tök", "a" * 1025, "a\x00b"],
)
def test_llmd_drops_unsafe_echo_values(bad: str) -> None:
    enc = LLMD.encode(make_meta(echo={"x-session-token": bad}), NO_PRIO)
    assert "x-session-token" not in enc.headers


# --------------------------------------------------------------------------- openai


def test_openai_exact_fields() -> None:
    enc = OPENAI.encode(FULL, PRIO)
    assert extra_headers(enc) == {}
    assert enc.body == {"prompt_cache_key": "sess-1"}


# --------------------------------------------------------------------------- combine


def _fixed(name: str, headers: dict[str, str], body: dict[str, Any]) -> Dialect:
    def encode(meta: CallMetadata, options: DialectOptions) -> Encoding:
        return Encoding(headers=dict(headers), body=body)

    return Dialect(name=name, encode=encode, doc=f"{name} doc")


def test_combine_merges_headers_and_body() -> None:
    d = combine(VLLM, VLLM_ROUTER, DYNAMO, LLMD)
    assert d.name == "vllm+vllm-router+dynamo+llm-d"
    assert d.echo_headers == ("x-session-token",)
    enc = d.encode(make_meta(**{**FULL.model_dump(), "echo": {"x-session-token": TOKEN}}), PRIO)
    assert extra_headers(enc) == {
        "x-session-id": "sess-1",
        "x-request-id": "call-1",
        "x-dynamo-session-id": "sess-1",
        "x-dynamo-parent-session-id": "sess-0",
        "x-session-token": TOKEN,
        "x-llm-d-inference-fairness-id": "job-1",
        "x-session-type": "agentic-subagent",
    }
    assert enc.body == {
        "session_id": "sess-1",
        "priority": 3,
        "nvext": {"agent_hints": {"priority": -3, "osl": 256}},
    }
    assert agentrt_only(enc) == AGENTRT_FULL


def test_combine_merges_nested_body_key_by_key() -> None:
    a = _fixed("a", {}, {"nvext": {"agent_hints": {"osl": 5}}, "x": 1})
    b = _fixed("b", {}, {"nvext": {"agent_hints": {"priority": 2}, "other": True}, "x": 1})
    enc = combine(a, b).encode(make_meta(), NO_PRIO)
    assert enc.body == {
        "nvext": {"agent_hints": {"osl": 5, "priority": 2}, "other": True},
        "x": 1,
    }


def test_combine_does_not_alias_part_bodies() -> None:
    shared: dict[str, Any] = {"nvext": {"agent_hints": {"osl": 5}}}
    a = _fixed("a", {}, shared)
    b = _fixed("b", {}, {"nvext": {"agent_hints": {"priority": 2}}})
    combine(a, b).encode(make_meta(), NO_PRIO)
    assert shared == {"nvext": {"agent_hints": {"osl": 5}}}


def test_combine_same_header_any_case_is_sent_once() -> None:
    a = _fixed("a", {"X-Session-ID": "s"}, {})
    b = _fixed("b", {"x-session-id": "s"}, {})
    enc = combine(a, b).encode(make_meta(), NO_PRIO)
    assert enc.headers == {"x-session-id": "s"}


def test_combine_conflicting_header_raises() -> None:
    a = _fixed("a", {"x-k": "1"}, {})
    b = _fixed("b", {"X-K": "2"}, {})
    with pytest.raises(ValueError, match="'a' and 'b' both set header 'x-k'"):
        combine(a, b).encode(make_meta(), NO_PRIO)


def test_combine_conflicting_body_raises() -> None:
    # vLLM's priority (lower first) and SGLang's (negated) cannot share one body
    with pytest.raises(ValueError, match="'vllm' and 'sglang' both set body field 'priority'"):
        combine(VLLM, SGLANG).encode(FULL, PRIO)
    # without priority the two combine fine
    enc = combine(VLLM, SGLANG).encode(FULL, NO_PRIO)
    assert enc.body == {"session_id": "sess-1"}


def test_combine_conflicting_nested_body_raises() -> None:
    a = _fixed("a", {}, {"nvext": {"agent_hints": {"osl": 5}}})
    b = _fixed("b", {}, {"nvext": {"agent_hints": {"osl": 6}}})
    with pytest.raises(ValueError, match=re.escape("nvext.agent_hints.osl")):
        combine(a, b).encode(make_meta(), NO_PRIO)


def test_combine_edge_cases() -> None:
    assert combine(VLLM) is VLLM
    assert combine(VLLM, name="mine").name == "mine"
    with pytest.raises(ValueError):
        combine()
    with pytest.raises(TypeError):
        combine("vllm")  # type: ignore[arg-type]


def test_combine_echo_headers_union_in_order() -> None:
    a = Dialect(name="a", encode=GENERIC.encode, echo_headers=("X-A", "x-b"))
    b = Dialect(name="b", encode=GENERIC.encode, echo_headers=("x-b", "x-c"))
    assert combine(a, b).echo_headers == ("x-a", "x-b", "x-c")


def test_resolve_dialect() -> None:
    assert resolve_dialect("vllm") is VLLM
    assert resolve_dialect(DYNAMO) is DYNAMO
    assert resolve_dialect(("vllm",)) is VLLM
    both = resolve_dialect(["vllm", VLLM_ROUTER])
    assert both.name == "vllm+vllm-router"
    assert resolve_dialect(("dynamo", "llm-d")).echo_headers == ("x-session-token",)
    with pytest.raises(ValueError):
        resolve_dialect(())
    with pytest.raises(ValueError, match="unknown dialect"):
        resolve_dialect(["vllm", "nope"])
    with pytest.raises(TypeError):
        resolve_dialect(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        resolve_dialect(["vllm", 3])  # type: ignore[list-item]
