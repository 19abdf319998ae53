"""agentrt's loggers (docs/telemetry.md, "Logging"): silent by default; each stage logs on
its own child of ``agentrt``; ``AGENTRT_LOG`` turns on a stderr handler; no secret in
any line, whatever the level."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator

import anyio
import httpx
import openai
import pytest

import agentrt._log
import agentrt._transport._attempts
from agentrt import Endpoint, EndpointError, Retry, Runtime
from agentrt.scheduling import RoundRobin
from tests._fake import MSG, FakeEngine
from tests.faults._faultserver import Fault, fault_server, refused_url
from tests.sim._helpers import small_config

pytestmark = pytest.mark.anyio

KEY = "sk-live-0123456789abcdef"
ENDPOINT_KEY = "sk-endpoint-fedcba9876543210"
USER, PASSWORD = "alice", "pa55-w0rd-xyz"
SECRETS = (KEY, ENDPOINT_KEY, PASSWORD, f"{USER}:")
FAST = Retry(attempts=2, wait_initial=0.0, wait_max=0.0, wait_jitter=0.0)


def rendered(caplog: pytest.LogCaptureFixture) -> list[tuple[str, int, str]]:
    """(logger, level, text) of agentrt's records, each rendered as a handler would."""
    fmt = logging.Formatter(agentrt._log.LOG_FORMAT)
    return [
        (r.name, r.levelno, fmt.format(r)) for r in caplog.records if r.name.startswith("agentrt")
    ]


def assert_no_secret(records: list[tuple[str, int, str]]) -> None:
    for _, _, text in records:
        for secret in SECRETS:
            assert secret not in text, text
        assert "Bearer" not in text and "authorization" not in text.lower(), text


def test_silent_unless_configured() -> None:
    root = logging.getLogger("agentrt")
    assert any(isinstance(h, logging.NullHandler) for h in root.handlers)
    for name in ("transport", "routing", "health", "hooks", "journal", "notices"):
        child = logging.getLogger(f"agentrt.{name}")
        assert child.handlers == [] and child.propagate  # records go up to "agentrt"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the sim server runs on uvicorn
async def test_calls_through_a_live_server_log_each_stage_and_no_secret(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A session whose first replica refuses connections: the attempt there, the replica
    marked down, the attempt on the live replica (the embedded sim server on loopback),
    all at DEBUG and none with a key or a password in it. A first turn that fails over is
    still a first turn, not a move (issue 35): no move is logged."""
    from agentrt.sim import serve_async

    caplog.set_level(logging.DEBUG, logger="agentrt")
    dead = refused_url().replace("://", f"://{USER}:{PASSWORD}@", 1)
    async with anyio.create_task_group() as tg:
        (live,) = await tg.start(serve_async, 1, "127.0.0.1", 0, small_config())
        endpoints = [Endpoint(dead), Endpoint(live, api_key=ENDPOINT_KEY)]
        rr = RoundRobin(start=0)  # the dead one first
        # No metrics polls: a refused poll would mark the dead one down before the call.
        async with Runtime(
            endpoints, api_key=KEY, routing=rr, retry=FAST, poll_metrics_s=None
        ) as rt:
            async with rt.job("j") as job, job.session("s") as s:
                await s.chat(model="m", messages=MSG, max_tokens=4)
                await s.chat(model="m", messages=MSG, max_tokens=4)
        tg.cancel_scope.cancel()
    assert job.report.calls == 2 and job.report.session_moves == 0
    records = rendered(caplog)
    assert_no_secret(records)
    by_logger: dict[str, list[str]] = {}
    for name, level, text in records:
        by_logger.setdefault(f"{name} {logging.getLevelName(level)}", []).append(text)
    attempts = by_logger["agentrt.transport DEBUG"]
    assert len(attempts) == 3  # refused, then 200, then 200 on the same replica
    assert "attempt 1 of 2" in attempts[0] and "ConnectError" in attempts[0]
    assert "attempt 2 of 2" in attempts[1] and "HTTP 200" in attempts[1]
    assert all(live in a for a in attempts[1:]) and "/chat/completions" in attempts[1]
    (down,) = by_logger["agentrt.health INFO"]
    assert "marked down (no connection)" in down and "127.0.0.1" in down
    assert "agentrt.routing INFO" not in by_logger


async def test_a_call_out_of_attempts_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="agentrt")
    url = refused_url()
    async with Runtime([Endpoint(url, api_key=ENDPOINT_KEY)], retry=FAST) as rt:
        # openai 3 passes agentrt's EndpointError through; openai 2 wraps it.
        with pytest.raises((EndpointError, openai.APIConnectionError)):
            await rt.openai().chat.completions.create(model="m", messages=MSG)
        with fault_server(Fault.status(503)) as server:
            async with Runtime([server.url], api_key=KEY, retry=FAST) as rt2:
                async with rt2.job("j") as job, job.session() as s:
                    with pytest.raises(openai.InternalServerError):
                        await s.chat(model="m", messages=MSG)
    records = rendered(caplog)
    assert_no_secret(records)
    warnings = [text for name, level, text in records if level == logging.WARNING]
    assert len(warnings) == 2
    assert "failed after 2 attempt(s)" in warnings[0] and url in warnings[0]
    assert "HTTP 503 on the last of 2 attempt(s)" in warnings[1]
    assert all(" - agentrt.transport - WARNING] call call-" in w for w in warnings)


async def test_a_hook_that_raises_is_a_warning_of_agentrt_hooks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="agentrt")

    def broken(event: object) -> None:
        raise RuntimeError("boom")

    engine = FakeEngine()
    with pytest.warns(RuntimeWarning, match="'agentrt.hooks' logger"):
        async with Runtime(
            ["http://engine.test/v1"], transport=engine.transport(), hooks=[broken]
        ) as rt:
            async with rt.job("j") as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
    hooks = [r for r in caplog.records if r.name == "agentrt.hooks"]
    assert hooks and "agentrt hooks raised on events" in hooks[0].getMessage()
    assert hooks[0].levelno == logging.WARNING


async def test_attempts_are_not_even_formatted_when_debug_is_off(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hot path pays one ``isEnabledFor`` per attempt when DEBUG is off."""
    made: list[str] = []
    monkeypatch.setattr(
        agentrt._transport._attempts.Attempts,
        "_log_attempt",
        lambda self, ep, outcome: made.append(outcome),
    )
    engine = FakeEngine()
    for level in (logging.INFO, logging.DEBUG):
        caplog.set_level(level, logger="agentrt")
        async with Runtime(["http://engine.test/v1"], transport=engine.transport()) as rt:
            async with rt.job("j") as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
        if level == logging.INFO:
            assert made == []
    assert made == ["HTTP 200"]


# -- AGENTRT_LOG --------------------------------------------------------------------------

SCRIPT = """
import logging
import agentrt._log
logging.getLogger("agentrt.transport").debug("a debug line")
logging.getLogger("agentrt.routing").info("an info line")
logging.getLogger("agentrt.hooks").warning("a warning line")
"""


def run_with(value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "AGENTRT_LOG"}
    if value is not None:
        env["AGENTRT_LOG"] = value
    done = subprocess.run(
        [sys.executable, "-W", "default", "-c", SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout == ""
    return done.stderr


@pytest.fixture(scope="module")
def outputs() -> Iterator[dict[str | None, str]]:
    yield {v: run_with(v) for v in (None, "debug", "INFO", "verbose")}


def test_agentrt_log_debug_prints_every_level(outputs: dict[str | None, str]) -> None:
    lines = outputs["debug"].splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("[") and lines[0].endswith(
        " - agentrt.transport - DEBUG] a debug line"
    )
    assert lines[1].endswith(" - agentrt.routing - INFO] an info line")
    assert lines[2].endswith(" - agentrt.hooks - WARNING] a warning line")


def test_agentrt_log_info_leaves_out_debug(outputs: dict[str | None, str]) -> None:
    lines = outputs["INFO"].splitlines()
    assert [line.rsplit("] ", 1)[1] for line in lines] == ["an info line", "a warning line"]


def test_without_agentrt_log_nothing_is_printed(outputs: dict[str | None, str]) -> None:
    # Python's last-resort handler prints warnings with no handler configured; the
    # NullHandler on "agentrt" keeps even those quiet, as a library should.
    assert outputs[None] == ""


def test_an_unknown_agentrt_log_value_is_ignored_with_a_warning(
    outputs: dict[str | None, str],
) -> None:
    err = outputs["verbose"]
    assert "RuntimeWarning: AGENTRT_LOG='verbose' is ignored: use 'debug' or 'info'" in err
    assert "line" not in err.replace("AGENTRT_LOG", "")  # no record printed


def test_configure_replaces_its_handler() -> None:
    root = logging.getLogger("agentrt")
    before, level = list(root.handlers), root.level
    try:
        first = agentrt._log.configure("info")
        second = agentrt._log.configure("debug")
        assert first is not None and second is not None
        assert first not in root.handlers and second in root.handlers
        assert root.level == logging.DEBUG
        assert agentrt._log.configure("") is None and agentrt._log.configure(None) is None
    finally:
        for h in list(root.handlers):
            if h not in before:
                root.removeHandler(h)
        root.setLevel(level)
        agentrt._log._console = None


async def test_an_endpoint_readmitted_by_a_probe_is_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="agentrt")
    engine = FakeEngine()
    refusing = True

    async def handle(request: httpx.Request) -> httpx.Response:
        if request.url.host == "a.test" and refusing:
            raise httpx.ConnectError("connection refused")
        return await engine.handle(request)

    urls = ["http://a.test/v1", "http://b.test/v1"]
    transport = httpx.MockTransport(handle)
    async with Runtime(urls, transport=transport, routing="round_robin", retry=FAST) as rt:
        health = rt._core.endpoints[0].health
        health.probe_interval_s = 0.01  # due at once; the prober wakes every 2 s
        async with rt.job("j") as job, job.session() as s:
            for _ in range(2):  # round-robin from a random start: one of them tries a
                await s.chat(model="m", messages=MSG)
        assert not health.healthy
        refusing = False
        for _ in range(400):  # up to 20 s: the prober's next wake-up, on a busy machine
            if health.healthy:
                break
            await anyio.sleep(0.05)
    lines = [(r.name, r.getMessage()) for r in caplog.records if r.name == "agentrt.health"]
    assert lines == [
        (
            "agentrt.health",
            f"endpoint {urls[0]} marked down (no connection); probed every 0.01 s until it answers",
        ),
        ("agentrt.health", f"endpoint {urls[0]} answered a probe: readmitted"),
    ]
