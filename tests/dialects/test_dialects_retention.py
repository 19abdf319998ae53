"""Retention directives in each dialect that has them (issue 34, item 2; issue 36's
llm-d ``x-session-type`` and OpenAI's ``prompt_cache_options``). Exact fields; the
upstream file and commit behind each are in docs/protocol.md ("Retention directives")."""

from __future__ import annotations

import pytest

from agentrt import Retry, Runtime
from agentrt.dialects import DialectOptions, get_dialect, llmd_dialect, vllm_dialect
from agentrt.dialects._retention import retention_window, wake_priority
from tests._fake import MSG, FakeEngine
from tests.dialects.test_dialects import FULL, extra_headers, make_meta

NO_PRIO = DialectOptions()
FAST = Retry(attempts=1, wait_initial=0.0, wait_jitter=0.0)
URL = "http://engine.test/v1"
LAST = make_meta(final=True)
UNKNOWN = make_meta()  # no expected idle, not final: no directive


# -------------------------------------------------------------------------- the window


@pytest.mark.parametrize(
    ("window", "priority"), [(0.0, 80), (10.0, 80), (10.5, 70), (60.0, 70), (61, 60), (301, 50)]
)
def test_wake_priority_keeps_the_session_waking_soonest_hardest(
    window: float, priority: int
) -> None:
    assert wake_priority(window) == priority


def test_window_is_idle_plus_margin_bounded_and_none_when_unknown_or_final() -> None:
    assert retention_window(FULL, 2.0, 600.0) == 4.0
    assert retention_window(make_meta(idle_expected_s=7200.0), 2.0, 600.0) == 600.0
    assert retention_window(make_meta(idle_expected_s=1.23456), 0.0, 600.0) == 1.235
    assert retention_window(UNKNOWN, 2.0, 600.0) is None
    assert retention_window(FULL.model_copy(update={"final": True}), 2.0, 600.0) is None
    with pytest.raises(ValueError):
        vllm_dialect(retention=True, retention_margin_s=-1.0)


# -------------------------------------------------------------------------- vLLM PR #38514


def test_vllm_retention_exact_fields() -> None:
    d = get_dialect("vllm:retention")
    assert d.name == "vllm:retention"
    assert d.encode(FULL, NO_PRIO).body == {
        "session_id": "sess-1",
        "retention_directives": [{"start": 0, "end": None, "priority": 80, "duration": 4.0}],
        "retention_scope": "sess-1",
    }
    assert d.encode(LAST, NO_PRIO).body == {
        "session_id": "sess-1",
        "retention_directives": [{"start": 0, "end": None, "priority": 0}],
        "retention_scope": "sess-1",
    }
    assert d.encode(UNKNOWN, NO_PRIO).body == {"session_id": "sess-1"}
    # off by default: released vLLM does not read them
    assert "retention_directives" not in get_dialect("vllm").encode(FULL, NO_PRIO).body


# -------------------------------------------------------------------------- llm-d


def test_llmd_session_type_on_every_call() -> None:
    lead = get_dialect("llm-d").encode(UNKNOWN, NO_PRIO)
    sub = get_dialect("llm-d:session-id").encode(FULL, NO_PRIO)
    assert extra_headers(lead)["x-session-type"] == "agentic"
    assert extra_headers(sub)["x-session-type"] == "agentic-subagent"
    assert lead.body == {} and sub.body == {}


def test_llmd_retention_exact_fields() -> None:
    d = get_dialect("llm-d:session-id,retention")
    assert d.name == "llm-d:session-id,retention"
    enc = d.encode(FULL, NO_PRIO)
    assert extra_headers(enc) == {
        "x-llm-d-inference-fairness-id": "job-1",
        "x-session-type": "agentic-subagent",
        "x-session-id": "sess-1",
        "x-session-token": "sess-1",
    }
    assert enc.body == {
        "retention_directives": [{"start": 0, "end": None, "priority": 80, "duration": 4.0}],
        "retention_scope": "sess-1",
    }
    assert get_dialect("llm-d:retention").encode(LAST, NO_PRIO).body == {
        "retention_directives": [{"start": 0, "end": None, "priority": 0}],
        "retention_scope": "sess-1",
    }
    assert get_dialect("llm-d:retention").encode(UNKNOWN, NO_PRIO).body == {}
    assert llmd_dialect(retention=True).name == "llm-d:retention"
    assert get_dialect("llm-d:echo=x-pod,retention").echo_headers == ("x-pod",)


@pytest.mark.parametrize(
    "option", ["llm-d:retention=1", "llm-d:retention,retention", "llm-d:session-id,echo=x-a"]
)
def test_llmd_retention_options_are_checked(option: str) -> None:
    with pytest.raises(ValueError):
        get_dialect(option)


# -------------------------------------------------------------------------- Dynamo


def test_dynamo_cache_control_exact_fields() -> None:
    d = get_dialect("dynamo:cache-control")
    assert d.name == "dynamo:cache-control"
    assert d.encode(make_meta(idle_expected_s=2.5), NO_PRIO).body == {
        "nvext": {"cache_control": {"type": "ephemeral", "ttl": "5s"}}  # 4.5 s, rounded up
    }
    assert d.encode(FULL, NO_PRIO).body == {
        "nvext": {"agent_hints": {"osl": 256}, "cache_control": {"type": "ephemeral", "ttl": "4s"}}
    }
    assert d.encode(LAST, NO_PRIO).body == {}  # the last call: no pin
    assert d.encode(UNKNOWN, NO_PRIO).body == {}
    assert "nvext" not in get_dialect("dynamo").encode(make_meta(idle_expected_s=3.0), NO_PRIO).body
    both = get_dialect("dynamo:x-sticky,cache-control")
    assert both.name == "dynamo:x-sticky,cache-control"
    assert extra_headers(both.encode(FULL, NO_PRIO))["x-sticky"] == "sess-1"
    with pytest.raises(ValueError, match="dynamo"):
        get_dialect("dynamo:a,b")


# -------------------------------------------------------------------------- OpenAI


def test_openai_prompt_cache_options_exact_fields() -> None:
    d = get_dialect("openai:cache-options")
    assert d.encode(FULL, NO_PRIO).body == {
        "prompt_cache_key": "sess-1",
        "prompt_cache_options": {"ttl": "30m"},
    }
    assert d.encode(LAST, NO_PRIO).body == {"prompt_cache_key": "sess-1"}
    plain = get_dialect("openai").encode(FULL, NO_PRIO).body
    assert plain == {"prompt_cache_key": "sess-1"}
    assert "prompt_cache_retention" not in plain  # deprecated; never sent


# -------------------------------------------------------------------------- on the wire


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("dialect", "field"),
    [
        ("vllm:retention", "retention_directives"),
        ("llm-d:retention", "retention_directives"),
        ("dynamo:cache-control", "nvext"),
    ],
)
async def test_directives_on_the_wire(dialect: str, field: str) -> None:
    """Through the runtime: a declared idle gives the next call a directive, the call
    marked final a release (vLLM, llm-d) or nothing (Dynamo)."""
    fake = FakeEngine()
    async with Runtime([URL], transport=fake.transport(), retry=FAST, dialect=dialect) as rt:
        async with rt.job("j") as job, job.session(session_id="conv-7") as s:
            await s.chat(model="m", messages=MSG)
            s.expect_idle(30.0)
            await s.chat(model="m", messages=MSG)
            await s.chat(model="m", messages=MSG, final=True)
    bodies = [seen.body for seen in fake.seen]
    assert "retention_directives" not in bodies[0] and "nvext" not in bodies[0]
    if field == "nvext":
        assert bodies[1]["nvext"]["cache_control"] == {"type": "ephemeral", "ttl": "32s"}
        assert "cache_control" not in bodies[2].get("nvext", {})
    else:
        assert bodies[1]["retention_directives"] == [
            {"start": 0, "end": None, "priority": 70, "duration": 32.0}
        ]
        assert bodies[1]["retention_scope"] == "conv-7"
        assert bodies[2]["retention_directives"] == [{"start": 0, "end": None, "priority": 0}]
    if dialect.startswith("llm-d"):
        assert {seen.headers["x-session-type"] for seen in fake.seen} == {"agentic"}
