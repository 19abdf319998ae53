"""A server that echoes the caller's credentials in its error replies (OpenAI does:
``401 Incorrect API key provided: sk-...``) puts them in nothing agentrt stores or raises:
the job's and calls' errors, ``repr(report)``, the journal, the hook events, the
exception the caller catches and the logs. Keys go as they are; credentials written in a
URL (``http://user:pass@host``) go as HTTP Basic auth, in base64."""

from __future__ import annotations

import base64
import logging
from pathlib import Path
from typing import Any

import openai
import pytest
from _faultserver import MODEL, Conn, Fault, FaultServer, Seen, fault_server

import agentrt
from agentrt.telemetry import Event

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

KEY = "sk-proj-Abc123SECRETkeyXYZ"
USER, PASSWORD = "alice", "pa55-w0rd-SECRET"
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]


def echo_401() -> Fault:
    """A 401 whose message quotes the Authorization header's credential, as OpenAI's
    does for a wrong key (and some proxies do for Basic auth)."""

    async def action(conn: Conn, seen: Seen) -> bool:
        credential = seen.headers.get("authorization", "").split(" ", 1)[-1]
        body = {
            "error": {
                "message": f"Incorrect API key provided: {credential}. You can find your "
                "API key at https://platform.openai.com/account/api-keys.",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_api_key",
            }
        }
        return await Fault.json(401, body).action(conn, seen)

    return Fault("echo 401", action)


@pytest.fixture
def server() -> Any:
    with fault_server(echo_401()) as srv:
        yield srv


def secrets_of(server: FaultServer) -> list[str]:
    """The credentials the server saw, in every form they travelled."""
    pair = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    seen = [s.headers["authorization"].split(" ", 1)[-1] for s in server.chat_requests]
    assert seen and set(seen) <= {KEY, pair}
    return [KEY, PASSWORD, pair]


async def run(
    server: FaultServer, how: str, url: str, tmp_path: Path, **kwargs: Any
) -> dict[str, str]:
    journal = tmp_path / "journal.jsonl"
    events: list[Event] = []
    caught: BaseException | None = None
    async with agentrt.Runtime(
        [url], otel=False, journal=journal, hooks=[events.append], **kwargs
    ) as rt:
        try:
            async with rt.job("secret") as job, job.session("s") as s:
                if how == "session.chat":
                    await s.chat(model=MODEL, messages=MESSAGES)
                else:
                    await rt.openai().chat.completions.create(model=MODEL, messages=MESSAGES)
        except openai.AuthenticationError as exc:
            caught = exc
    assert isinstance(caught, openai.AuthenticationError)
    report = job.report
    assert report.status == "error" and report.error is not None
    assert "Incorrect API key provided" in report.error  # the server's words are kept
    (call,) = report.call_reports
    assert call.http_status == 401
    return {
        "exception": f"{caught} {caught!r} {caught.body!r} {caught.response.text}",
        "report.error": report.error,
        "repr(report)": repr(report),
        "str(report)": str(report),
        "json": report.model_dump_json(),
        "journal": journal.read_text(),
        "events": "".join(repr(e) for e in events),
    }


def check(outputs: dict[str, str], secrets: list[str]) -> None:
    for name, text in outputs.items():
        assert text, name
        for secret in secrets:
            assert secret not in text, f"{secret!r} shows in {name}: {text[:400]}"


@pytest.mark.parametrize("how", ["session.chat", "rt.openai()"])
async def test_a_key_echoed_in_a_401_is_stored_nowhere(
    server: FaultServer, how: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="agentrt"):
        outputs = await run(server, how, server.url, tmp_path, api_key=KEY)
    outputs["logs"] = caplog.text or "-"
    check(outputs, secrets_of(server))


@pytest.mark.parametrize("how", ["session.chat", "rt.openai()"])
async def test_basic_auth_echoed_in_a_401_is_stored_nowhere(
    server: FaultServer, how: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = server.url.replace("://", f"://{USER}:{PASSWORD}@", 1)
    with caplog.at_level(logging.DEBUG, logger="agentrt"):
        outputs = await run(server, how, url, tmp_path)
    outputs["logs"] = caplog.text or "-"
    check(outputs, secrets_of(server))


async def test_the_client_own_key_is_redacted_too(server: FaultServer, tmp_path: Path) -> None:
    """``rt.openai(api_key=...)`` on a runtime without one: the key the request carried."""
    journal = tmp_path / "journal.jsonl"
    async with agentrt.Runtime([server.url], otel=False, journal=journal) as rt:
        client = rt.openai(api_key=KEY)
        with pytest.raises(openai.AuthenticationError) as info:
            async with rt.job("secret") as job, job.session():
                await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    [seen] = server.chat_requests
    assert seen.headers["authorization"] == f"Bearer {KEY}"
    check({"exception": str(info.value), "journal": journal.read_text()}, [KEY])
