"""The routers' newest agent fields (issue 36), exact: vllm-router's canonical
``expected_output_length`` beside its alias, llm-d's ``x-session-id`` for the
session-affinity filter, the SGLang gateway's ``X-SMG-Priority`` classes, Dynamo's switch
for the parent-session header. docs/protocol.md cites the source and commit of each."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentrt import CallMetadata, Retry, Runtime
from agentrt.dialects import (
    DYNAMO,
    SGLANG,
    VLLM_ROUTER_AGENTIC,
    DialectOptions,
    dynamo_dialect,
    get_dialect,
    sglang_dialect,
)
from agentrt.dialects._sglang import SMG_PRIORITY_CLASSES, smg_priority_class
from tests._fake import MSG, FakeEngine
from tests.dialects.test_dialects import FULL, extra_headers, make_meta

PRIO = DialectOptions(send_priority=True)
NO_PRIO = DialectOptions()
URL = "http://engine.test/v1"


# ------------------------------------------------------------------- vllm-router


def context(meta: CallMetadata) -> dict[str, Any]:
    body = VLLM_ROUTER_AGENTIC.encode(meta, NO_PRIO).body
    ctx: dict[str, Any] = json.loads(body["vllm_xargs"]["agentic_context"])
    return ctx


def test_vllm_router_sends_the_canonical_expected_output_length_and_its_alias() -> None:
    """src/program_scheduling/identity.rs reads the first of
    ["expected_output_length", "expected_output_tokens"]: both carry max_tokens."""
    ctx = json.loads(
        VLLM_ROUTER_AGENTIC.encode(FULL, NO_PRIO).body["vllm_xargs"]["agentic_context"]
    )
    assert (ctx["expected_output_length"], ctx["expected_output_tokens"]) == (256, 256)
    # The canonical name comes first in the object, as the router's lookup order.
    keys = list(ctx)
    assert keys.index("expected_output_length") < keys.index("expected_output_tokens")
    none = make_meta(expected_output_tokens=None)
    ctx = json.loads(
        VLLM_ROUTER_AGENTIC.encode(none, NO_PRIO).body["vllm_xargs"]["agentic_context"]
    )
    assert "expected_output_length" not in ctx and "expected_output_tokens" not in ctx


# ------------------------------------------------------------------------- llm-d


def test_llmd_session_id_reads_x_session_id_by_default() -> None:
    """pkg/epp/framework/plugins/scheduling/util/sessionaffinity/session_id.go:
    DefaultSessionIDHeader = "x-session-id" (filter and scorer, strategy session_id)."""
    d = get_dialect("llm-d:session-id")
    assert extra_headers(d.encode(make_meta(program_id="p"), NO_PRIO)) == {
        "x-llm-d-inference-fairness-id": "p",
        "x-session-type": "agentic",
        "x-session-id": "sess-1",
        "x-session-token": "sess-1",
    }
    assert d.echo_headers == ()


# ------------------------------------------------------------------- SGLang gateway


@pytest.mark.parametrize(
    ("level", "klass"),
    [(0, "interactive"), (1, "default"), (2, "bulk"), (5, "bulk"), (-1, "interactive")],
)
def test_smg_priority_class_by_queue_level(level: int, klass: str) -> None:
    assert smg_priority_class(level) == klass
    enc = SGLANG.encode(make_meta(priority=level), PRIO)
    assert extra_headers(enc) == {"x-smg-routing-key": "sess-1", "x-smg-priority": klass}


def test_smg_priority_only_with_send_priority_and_never_system_by_default() -> None:
    assert extra_headers(SGLANG.encode(FULL, NO_PRIO)) == {"x-smg-routing-key": "sess-1"}
    assert "system" not in SMG_PRIORITY_CLASSES  # the gateway's own control traffic
    assert set(SMG_PRIORITY_CLASSES) <= {"system", "interactive", "default", "bulk"}


def test_smg_priority_classes_can_be_mapped_otherwise() -> None:
    d = sglang_dialect(priority_classes=("default", "bulk"))
    assert d.encode(make_meta(priority=0), PRIO).headers["x-smg-priority"] == "default"
    assert d.encode(make_meta(priority=7), PRIO).headers["x-smg-priority"] == "bulk"
    for bad in ((), ("urgent",), ["bulk"]):
        with pytest.raises(ValueError, match="priority_classes"):
            sglang_dialect(priority_classes=bad)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_smg_priority_on_the_wire_follows_the_policys_levels() -> None:
    """PLAS: a program's first call is level 0 (interactive); send_priority sends it."""
    fake = FakeEngine()
    retry = Retry(attempts=1)
    async with Runtime(
        [URL], transport=fake.transport(), retry=retry, dialect="sglang", send_priority=True
    ) as rt:
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
    (seen,) = fake.seen
    assert seen.headers["x-smg-priority"] == "interactive"
    assert seen.headers["x-smg-routing-key"] == seen.body.get("session_id", s.id)


# ------------------------------------------------------------------------- Dynamo


def test_dynamo_parent_header_switch() -> None:
    assert extra_headers(DYNAMO.encode(FULL, NO_PRIO)) == {
        "x-dynamo-session-id": "sess-1",
        "x-dynamo-parent-session-id": "sess-0",
    }
    for d in (dynamo_dialect(send_parent=False), get_dialect("dynamo:no-parent")):
        assert d.name == "dynamo:no-parent"
        assert extra_headers(d.encode(FULL, NO_PRIO)) == {"x-dynamo-session-id": "sess-1"}
    both = get_dialect("dynamo:x-session,no-parent")
    assert both.name == "dynamo:x-session,no-parent"
    assert extra_headers(both.encode(FULL, NO_PRIO)) == {
        "x-dynamo-session-id": "sess-1",
        "x-session": "sess-1",
    }
    assert get_dialect("dynamo:x-session").name == "dynamo:x-session"
    with pytest.raises(ValueError, match="at most one session header"):
        get_dialect("dynamo:a,b")
    with pytest.raises(TypeError, match="send_parent"):
        dynamo_dialect(send_parent="no")  # type: ignore[arg-type]
