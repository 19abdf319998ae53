"""What the events report of a reply (``CallEnded.response_*``, ``finish_reasons``,
``tool_calls``) and of a request (``CallStarted.temperature``), read from parsed JSON."""

from __future__ import annotations

from typing import Any

import pytest

from agentrt import Runtime
from agentrt.telemetry import CallEnded, CallStarted, Event
from agentrt.telemetry._reply import MAX_ITEMS, MAX_TEXT, ReplyFacts, temperature_of
from tests._fake import MSG, FakeEngine

URL = "http://engine.test/v1"


def call(call_id: str | None, name: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "function", "function": {"arguments": "{}"}}
    if call_id is not None:
        out["id"] = call_id
    if name is not None:
        out["function"]["name"] = name
    return out


def test_a_reply_gives_its_id_model_every_finish_reason_and_first_choice_tool_calls() -> None:
    facts = ReplyFacts()
    facts.read(
        {
            "id": "chatcmpl-9",
            "model": "qwen-7b-0613",
            "choices": [
                {
                    "index": 0,
                    "message": {"tool_calls": [call("c1", "grep"), call("c2", "run")]},
                    "finish_reason": "tool_calls",
                },
                {
                    "index": 1,
                    "message": {"tool_calls": [call("c3", "other")]},
                    "finish_reason": "length",
                },
            ],
        },
        "message",
    )
    assert (facts.id, facts.model) == ("chatcmpl-9", "qwen-7b-0613")
    assert facts.finish_reasons == ["tool_calls", "length"]
    assert facts.tool_calls == [("c1", "grep"), ("c2", "run")]  # the first choice's only


def test_a_stream_names_each_tool_call_in_its_first_delta() -> None:
    facts = ReplyFacts()
    chunks: list[dict[str, Any]] = [
        {"id": "chatcmpl-s", "model": "m", "choices": [{"index": 0, "delta": {"role": "x"}}]},
        {
            "id": "chatcmpl-s",
            "model": "m",
            "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, **call("c1", "a")}]}}],
        },
        {  # the rest of that call's arguments: no id, no name
            "id": "chatcmpl-s",
            "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, **call(None, None)}]}}],
        },
        {"id": "chatcmpl-s", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"id": "chatcmpl-s", "choices": [], "usage": {"prompt_tokens": 3}},
    ]
    for chunk in chunks:
        facts.read(chunk, "delta")
    assert (facts.id, facts.model) == ("chatcmpl-s", "m")
    assert facts.finish_reasons == ["tool_calls"]
    assert facts.tool_calls == [("c1", "a")]


def test_malformed_or_oversized_parts_are_skipped() -> None:
    facts = ReplyFacts()
    facts.read({"id": 7, "model": "", "choices": "no"}, "message")
    assert (facts.id, facts.model, facts.finish_reasons, facts.tool_calls) == (None, None, [], [])
    facts.read(
        {
            "id": "x" * (MAX_TEXT + 1),
            "model": "m",
            "choices": [
                "not a dict",
                {"finish_reason": None, "message": {"tool_calls": "no"}},
            ],
        },
        "message",
    )
    assert (facts.id, facts.model, facts.finish_reasons) == (None, "m", [])
    many = [{"index": i, "finish_reason": "stop"} for i in range(MAX_ITEMS + 5)]
    many[0]["message"] = {"tool_calls": [call(f"c{i}", "t") for i in range(MAX_ITEMS + 5)]}
    facts.read({"choices": many}, "message")
    assert len(facts.finish_reasons) == MAX_ITEMS and len(facts.tool_calls) == MAX_ITEMS


def test_temperature_is_a_json_number_or_nothing() -> None:
    assert temperature_of({"temperature": 0.7}) == 0.7
    assert temperature_of({"temperature": 1}) == 1.0
    assert temperature_of({"temperature": True}) is None
    assert temperature_of({"temperature": "0.5"}) is None
    assert temperature_of({}) is None
    assert temperature_of(None) is None


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True])
async def test_call_events_carry_the_request_and_reply_fields(stream: bool) -> None:
    """Through the transport: ``CallStarted`` has the request's max_tokens, temperature and
    session name; ``CallEnded`` the reply's id, model and finish reasons, streamed or not."""
    events: list[Event] = []
    fake = FakeEngine()
    async with Runtime([URL], transport=fake.transport(), hooks=[events.append]) as rt:
        async with rt.job("j") as job, job.session("writer") as s:
            reply: Any = await s.chat(
                model="m", messages=MSG, max_tokens=7, temperature=0.25, stream=stream
            )
            if stream:
                async for _ in reply:
                    pass
            await s.chat(model="m", messages=MSG)  # neither given
    started = [e for e in events if isinstance(e, CallStarted)]
    ended = [e for e in events if isinstance(e, CallEnded)]
    assert [(e.max_tokens, e.temperature, e.session_name) for e in started] == [
        (7, 0.25, "writer"),
        (None, None, "writer"),
    ]
    for e in ended:
        assert (e.response_id, e.response_model) == ("chatcmpl-1", "m")
        assert e.finish_reasons == ("stop",) and e.tool_calls == ()
