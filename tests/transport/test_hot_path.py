"""The transport's per-call shortcuts keep their meaning: endpoint matching on the URL's
parts, the shallow request copy with its own header list, the metadata built without
validating it again, and the clock looked up once per runtime."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anyio
import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

import agentrt._transport._outgoing
from agentrt import Endpoint, Runtime
from agentrt._httplib import encoded, http_lib, loop_clock, prepare
from agentrt._protocol import CallMetadata, parse_agentrt_header, trusted_model
from agentrt._wire import request_body
from agentrt.telemetry import CallReport
from tests._fake import MSG, FakeEngine

URL = "http://engine.test/v1"

BASES = ["http://Engine.test:80/v1", "http://engine.test/v1/sub/", "https://other.test:8443/api"]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://engine.test/v1/chat/completions", (BASES[0], "/chat/completions")),
        ("http://engine.test/v1/chat/completions?x=1", (BASES[0], "/chat/completions")),
        (
            "http://engine.test/v1/sub/chat/completions",
            ("http://engine.test/v1/sub", "/chat/completions"),
        ),
        ("http://engine.test/v1/sub", (BASES[0], "/sub")),
        ("https://other.test:8443/api/models", (BASES[2], "/models")),
        ("http://engine.test/v1x/chat/completions", None),
        ("http://engine.test:8080/v1/chat/completions", None),
        ("https://engine.test/v1/chat/completions", None),
        ("http://elsewhere.test/v1/chat/completions", None),
        ("https://other.test/api/models", None),
    ],
)
def test_match_reads_origin_and_path(url: str, expected: tuple[str, str] | None) -> None:
    core = Runtime([Endpoint(b) for b in BASES])._core
    lib = http_lib().mod
    assert core.match(lib.URL(url)) == expected
    assert core.match(httpx.URL(url)) == expected


def only(headers: httpx.Headers, name: str) -> str:
    (value,) = headers.get_list(name)
    return value


@pytest.mark.anyio
async def test_prepared_request_headers() -> None:
    fake = FakeEngine()
    async with Runtime([URL], transport=fake.transport()) as rt:
        own = openai.AsyncOpenAI(
            base_url=URL, api_key="user-key", http_client=rt.http_client(), max_retries=0
        )
        async with rt.job("j") as job, job.session(session_id="s1"):
            # agentrt's own client: its placeholder key is not sent.
            await rt.openai().chat.completions.create(model="m", messages=MSG)
            # A caller's x-agentrt is replaced, its own key kept.
            await own.chat.completions.create(
                model="m", messages=MSG, extra_headers={"X-Agentrt": "v=1", "x-mine": "1"}
            )
    plain, mine = (x.headers for x in fake.seen)
    assert "authorization" not in plain
    assert only(mine, "authorization") == "Bearer user-key"
    assert parse_agentrt_header(only(mine, "x-agentrt")).session_id == "s1"
    assert parse_agentrt_header(only(plain, "x-agentrt")).turn == 0
    assert only(mine, "x-mine") == "1"
    assert only(mine, "host") == "engine.test"


@pytest.mark.anyio
async def test_endpoint_key_replaces_the_callers_and_the_request_is_left_alone() -> None:
    fake = FakeEngine()
    eps = [Endpoint("http://a.test/v1", api_key="key-a")]
    async with Runtime(eps, transport=fake.transport(), api_key="rt-key") as rt:
        client: Any = rt.http_client()
        request = client.build_request(
            "POST",
            "http://a.test/v1/chat/completions",
            json={"model": "m", "messages": MSG},
            headers={"authorization": "Bearer user-key"},
        )
        before = list(request.headers.raw)
        async with rt.job("j") as job, job.session():
            await client.send(request)
            await client.send(request)  # the same request again: nothing of the first stays
    assert list(request.headers.raw) == before
    for seen in fake.seen:
        assert only(seen.headers, "authorization") == "Bearer key-a"
        assert only(seen.headers, "host") == "a.test"
    assert [parse_agentrt_header(only(x.headers, "x-agentrt")).turn for x in fake.seen] == [0, 1]


def _reference(content: bytes) -> Any:
    try:
        parsed = json.loads(content)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
)
space = st.text(alphabet=" \t\n\r\u00a0x", max_size=3)


@settings(max_examples=300, deadline=None)
@given(json_values, space, space, st.sampled_from(["utf-8", "utf-16", "utf-32"]))
def test_request_body_reads_what_json_loads_reads(
    value: Any, before: str, after: str, encoding: str
) -> None:
    content = (before + json.dumps(value, ensure_ascii=False) + after).encode(encoding)
    assert request_body(content) == _reference(content)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=40))
def test_request_body_of_any_bytes(content: bytes) -> None:
    assert request_body(content) == _reference(content)


def _assert_validated_alike(model: BaseModel) -> None:
    """``model`` is what validating its fields again builds, value by value, type by type."""
    checked = type(model)(**model.__dict__)
    assert model == checked
    assert model.model_dump() == checked.model_dump()
    assert model.model_fields_set == checked.model_fields_set
    assert {k: type(v) for k, v in model.__dict__.items()} == {
        k: type(v) for k, v in checked.__dict__.items()
    }


@pytest.mark.anyio
async def test_trusted_metadata_is_what_validation_would_build(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The transport builds each call's CallMetadata without validating it again: it must
    equal, field by field and type by type, the one ``CallMetadata(**fields)`` builds."""
    built: list[CallMetadata] = []

    def record(cls: type[CallMetadata], fields: dict[str, Any]) -> CallMetadata:
        built.append(trusted_model(cls, fields))
        return built[-1]

    monkeypatch.setattr(agentrt._transport._outgoing, "trusted_model", record)
    fake = FakeEngine()
    eps = [Endpoint(URL, send_priority=True)]
    async with Runtime(eps, transport=fake.transport(), policy="mlfq") as rt:
        client = rt.openai()
        async with rt.job("j") as job, job.session() as s:
            await client.chat.completions.create(model="m", messages=MSG)
            async with s.tool("search", expected_s=3):  # an int: taken as float
                pass
            s.expect_idle(2)
            await client.chat.completions.create(model="m", messages=MSG, max_tokens=True)  # type: ignore[arg-type]
            assert rt._core.waits is not None
            rt._core.waits.observe("search", 2)  # type: ignore[arg-type]
            s._tool_calls(("search",))  # as if the last reply called it: a learned wait
            await client.chat.completions.create(model="m", messages=MSG, max_tokens=7)
            async with job.session(parent=s) as child:
                await child.chat(model="m", messages=MSG, max_completion_tokens=False)  # type: ignore[arg-type]
    assert len(built) == 4
    assert built[1].idle_declared_s == 3.0 and built[1].idle_expected_source == "declared"
    assert built[2].idle_expected_source == "predicted"
    for meta in built:
        _assert_validated_alike(meta)
        assert meta.model_copy(update={"turn": 9}).turn == 9
        with pytest.raises(ValidationError):
            meta.turn = 1  # type: ignore[misc]


def _loop_clock_reads() -> tuple[float, float, float]:
    clock = loop_clock()
    return anyio.current_time(), clock(), anyio.current_time()


@pytest.mark.anyio
async def test_call_clock_reads_what_anyio_reads(anyio_backend: str) -> None:
    """The clock a call looks up once is the one ``anyio.current_time()`` reads."""
    before, read, after = _loop_clock_reads()
    assert before <= read <= after
    if anyio_backend == "asyncio":
        assert loop_clock() == asyncio.get_running_loop().time
    else:  # trio's clock itself: read from any thread, as asyncio's loop's time is
        import trio

        assert loop_clock() == trio.lowlevel.current_clock().current_time


@pytest.mark.anyio
async def test_a_runtime_reads_its_loops_clock(anyio_backend: str) -> None:
    """The clock is looked up once, when the runtime opens, in the loop it lives in."""
    rt = Runtime(["http://engine.test/v1"])
    assert rt._core.clock is anyio.current_time  # before it opens: always right
    async with rt:
        if anyio_backend == "asyncio":
            assert rt._core.clock == asyncio.get_running_loop().time
        else:
            import trio

            assert rt._core.clock == trio.lowlevel.current_clock().current_time


def test_call_clock_on_virtual_clocks() -> None:
    """Virtual time (trio's MockClock, an asyncio loop with its own ``time``) reads the
    same through the call's clock as through anyio."""
    import trio.testing

    async def reads() -> list[float]:
        clock = loop_clock()
        out = [clock(), anyio.current_time()]
        await anyio.sleep(5)
        return [*out, clock(), anyio.current_time()]

    t = anyio.run(
        reads,
        backend="trio",
        backend_options={"clock": trio.testing.MockClock(autojump_threshold=0)},
    )
    assert t[0] == t[1] and t[2] == t[3] and t[2] - t[0] == 5.0

    class Frozen(asyncio.SelectorEventLoop):
        def time(self) -> float:
            return 1234.5

    async def frozen() -> list[float]:
        return [loop_clock()(), anyio.current_time()]

    loop = Frozen()
    try:
        assert loop.run_until_complete(frozen()) == [1234.5, 1234.5]
    finally:
        loop.close()


@pytest.mark.anyio
async def test_trusted_call_reports_are_what_validation_would_build() -> None:
    """A job's CallReports are built without validating them again: each must equal, type
    by type, the one ``CallReport(**fields)`` builds (a JSON ``true`` token count is 1)."""
    fake = FakeEngine(prompt_tokens=True)
    fake.script.append(lambda _: None)
    fake.script.append(lambda _: httpx.Response(400, json={"error": {"message": "bad"}}))
    eps = [Endpoint(URL, send_priority=True)]
    async with Runtime(eps, transport=fake.transport(), policy="mlfq") as rt:
        client = rt.openai()
        async with rt.job("j") as job, job.session("named") as s:
            await client.chat.completions.create(model="m", messages=MSG)
            with pytest.raises(openai.BadRequestError):
                await client.chat.completions.create(model="m", messages=MSG)
            stream = await s.chat(
                model="m", messages=MSG, stream=True, stream_options={"include_usage": True}
            )
            async for _ in stream:
                pass
    reports = job.report.call_reports
    assert [r.status for r in reports] == ["ok", "error", "ok"]
    assert all(type(r) is CallReport for r in reports)
    assert reports[0].prompt_tokens == 1 and reports[0].priority is not None
    assert reports[2].ttft_s is not None and reports[2].completion_tokens == 5
    for report in reports:
        _assert_validated_alike(report)


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [("content-type", "application/json")],
        [("Content-Encoding", "gzip")],
        [("x-a", "1"), ("content-encoding", "br"), ("x-b", "2")],
        [("x-content-encoding", "gzip"), ("content-encodings", "x")],
    ],
)
def test_encoded_reads_what_in_reads(headers: list[tuple[str, str]]) -> None:
    for lib in {httpx, http_lib().mod}:
        h = lib.Headers(headers)
        assert encoded(h) is ("content-encoding" in h)
    assert encoded(dict(headers)) is ("content-encoding" in dict(headers))  # no raw list


_NAMES = st.sampled_from(
    [b"authorization", b"x-agentrt", b"content-length", b"host", b"x-a", b"x-stainless-os"]
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(_NAMES, st.sampled_from([b"Bearer agentrt-no-key", b"Bearer user", b"1"])),
        max_size=12,
    ),
    st.booleans(),
    st.booleans(),
)
def test_prepared_headers_are_the_callers_filtered_then_agentrts(
    caller: list[tuple[bytes, bytes]], with_key: bool, with_body: bool
) -> None:
    """The C-level header merge keeps what a plain filter keeps: the caller's headers in
    order, less the names agentrt sets and less its placeholder key, then agentrt's."""
    lib = http_lib()
    rt = Runtime([URL], api_key="rt-key" if with_key else None)
    placeholder = f"Bearer {rt._core.placeholder_key}".encode()
    request = lib.mod.Request("POST", URL + "/chat/completions", headers=caller, content=b"{}")
    before = list(request.headers.raw)
    add = {"x-agentrt": "v=2", "x-b": "2"}
    content = b'{"a":1}' if with_body else None
    auth = b"Bearer rt-key" if with_key else None
    out = prepare(lib, request, request.url, add, auth, content, placeholder)
    new = [(b"x-agentrt", b"v=2"), (b"x-b", b"2")]
    if with_key:
        new.append((b"authorization", b"Bearer rt-key"))
    if with_body:
        new.append((b"content-length", b"7"))
    names = {k for k, _ in new}
    kept = [
        (k, v)
        for k, v in request.headers.raw
        if k.lower() not in names
        and not (k.lower() == b"authorization" and v == b"Bearer agentrt-no-key")
    ]
    assert list(out.headers.raw) == kept + new
    assert list(request.headers.raw) == before  # the caller's request is left alone
