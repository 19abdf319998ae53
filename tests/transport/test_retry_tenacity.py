"""agentrt.Retry in tenacity's terms: its keywords build tenacity's strategies, tenacity's
own ``stop``/``wait``/``retry`` are taken, evaluated only after a failed attempt; Retry-After,
the events and the health rules keep working (issue 36, item 4)."""

from __future__ import annotations

import subprocess
import sys

import anyio
import httpx
import pytest
import tenacity

import agentrt
from agentrt import AttemptError, Retry, Runtime
from agentrt.telemetry import AttemptFailed, Event
from tests._fake import MSG, FakeEngine

pytestmark = pytest.mark.anyio

URL = "http://engine.test/v1"


def status(code: int, **headers: str) -> object:
    return lambda r: httpx.Response(code, headers=headers, json={"error": {"message": "x"}})


def rt_for(fake: FakeEngine, retry: Retry, **kwargs: object) -> Runtime:
    return Runtime([URL], transport=fake.transport(), retry=retry, **kwargs)  # type: ignore[arg-type]


def test_the_keywords_build_tenacitys_strategies() -> None:
    stop, wait, retry = Retry(
        attempts=4, wait_initial=0.5, wait_max=3.0, wait_jitter=0.0
    ).strategies()
    assert isinstance(stop, tenacity.stop_after_attempt) and stop.max_attempt_number == 4
    assert isinstance(wait, tenacity.wait_exponential)
    assert (wait.multiplier, wait.max) == (0.5, 3.0)
    assert isinstance(retry, tenacity.retry_if_exception_type)
    _, jittered, _ = Retry(wait_jitter=0.25).strategies()
    assert isinstance(jittered, tenacity.wait_combine)
    # Built once per Retry (the loop reads them on each failed call).
    r = Retry()
    assert r.strategies() is r.strategies()
    # Given strategies are kept as they are.
    mine = tenacity.stop_after_delay(5)
    assert Retry(stop=mine).strategies()[0] is mine


def test_strategies_that_are_not_callables_are_refused() -> None:
    with pytest.raises(TypeError, match=r"Retry\.stop must be a tenacity stop strategy"):
        Retry(stop=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Retry\.wait must be"):
        Retry(wait="fast")  # type: ignore[arg-type]


def test_import_agentrt_and_a_runtime_do_not_import_tenacity() -> None:
    """tenacity is imported at a call's first failed attempt, not before."""
    code = (
        "import sys, agentrt; agentrt.Runtime(['http://x/v1'], retry=agentrt.Retry(attempts=5));"
        "print('tenacity' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


async def test_a_first_attempt_that_succeeds_never_reads_the_strategies() -> None:
    def boom(state: tenacity.RetryCallState) -> bool:
        raise AssertionError("a strategy read on a successful call")

    fake = FakeEngine()
    async with rt_for(fake, Retry(stop=boom, wait=boom, retry=boom)) as rt:
        async with rt.job("ok") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
    assert job.report.call_reports[0].attempts == 1


async def test_tenacitys_stop_after_attempt_replaces_attempts() -> None:
    fake = FakeEngine()
    fake.script = [status(503)] * 4
    retry = Retry(attempts=2, stop=tenacity.stop_after_attempt(5), wait=tenacity.wait_none())
    async with rt_for(fake, retry) as rt:
        async with rt.job("r") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
    (c,) = job.report.call_reports
    assert c.attempts == 5 and c.status == "ok" and len(fake.seen) == 5


async def test_a_retry_strategy_sees_the_attempt_error_and_narrows() -> None:
    """A 409 is not retried when the strategy says so; the strategy sees agentrt's
    AttemptError (status, endpoint) in the failed attempt's outcome."""
    import openai

    seen: list[AttemptError] = []

    def not_conflicts(exc: BaseException) -> bool:
        assert isinstance(exc, AttemptError)
        seen.append(exc)
        return exc.status != 409

    fake = FakeEngine()
    fake.script = [status(503), status(409), status(503)]
    retry = Retry(
        attempts=5, wait=tenacity.wait_none(), retry=tenacity.retry_if_exception(not_conflicts)
    )
    async with rt_for(fake, retry) as rt:
        with pytest.raises(openai.ConflictError):
            async with rt.job("r") as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
    assert [(e.status, e.endpoint, e.error) for e in seen] == [(503, URL, None), (409, URL, None)]
    assert len(fake.seen) == 2 and job.report.call_reports[0].attempts == 2


async def test_a_transport_error_is_an_attempt_error_with_the_librarys_error() -> None:
    seen: list[AttemptError] = []

    def keep(exc: BaseException) -> bool:
        assert isinstance(exc, AttemptError)
        seen.append(exc)
        return True

    def drop(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    fake = FakeEngine()
    fake.script = [drop]
    retry = Retry(wait=tenacity.wait_none(), retry=tenacity.retry_if_exception(keep))
    async with rt_for(fake, retry) as rt:
        async with rt.job("r") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
    (e,) = seen
    assert e.status is None and isinstance(e.error, httpx.ReadTimeout) and e.endpoint == URL
    assert job.report.call_reports[0].attempts == 2


async def test_a_stop_after_delay_runs_on_the_calls_clock_and_the_wait_on_tenacitys() -> None:
    """wait_fixed(0.05) between attempts, stop once 0.12 s have passed since the call
    started: attempts at about 0, 0.05, 0.10, 0.15 s, the last one failing past the stop."""
    import openai

    fake = FakeEngine()
    fake.script = [status(500)] * 10
    retry = Retry(stop=tenacity.stop_after_delay(0.12), wait=tenacity.wait_fixed(0.05))
    async with rt_for(fake, retry) as rt:
        with pytest.raises(openai.InternalServerError):
            async with rt.job("r") as job, job.session() as s:
                t0 = anyio.current_time()
                await s.chat(model="m", messages=MSG)
    waited = anyio.current_time() - t0
    assert 3 <= len(fake.seen) <= 4
    assert 0.1 <= waited < 1.0


async def test_retry_after_still_sets_the_least_wait_under_a_given_wait() -> None:
    fake = FakeEngine()
    fake.script = [status(429, **{"retry-after": "0.2"})]
    retry = Retry(wait=tenacity.wait_none(), retry_after_max=0.1)
    async with rt_for(fake, retry) as rt:
        async with rt.job("r") as job, job.session() as s:
            t0 = anyio.current_time()
            await s.chat(model="m", messages=MSG)
            waited = anyio.current_time() - t0
    assert 0.09 <= waited < 0.19  # the Retry-After, capped at retry_after_max
    assert job.report.call_reports[0].attempts == 2


async def test_attempt_failed_events_say_whether_the_strategies_retry() -> None:
    import openai

    events: list[Event] = []
    fake = FakeEngine()
    fake.script = [status(503), status(502), status(503)]
    retry = Retry(stop=tenacity.stop_after_attempt(2), wait=tenacity.wait_none())
    async with rt_for(fake, retry, hooks=[events.append]) as rt:
        with pytest.raises(openai.InternalServerError):
            async with rt.job("r") as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
    failed = [e for e in events if isinstance(e, AttemptFailed)]
    assert [(e.attempt, e.error, e.will_retry) for e in failed] == [
        (1, "HTTP 503", True),
        (2, "HTTP 502", False),
    ]
    assert job.report.call_reports[0].status == "error"


async def test_the_default_retry_backs_off_as_before() -> None:
    """The keywords' strategies wait ``wait_initial * 2**(n-1)`` up to ``wait_max``: 0.05
    then 0.1 s (no jitter)."""
    fake = FakeEngine()
    fake.script = [status(503), status(503)]
    retry = Retry(attempts=3, wait_initial=0.05, wait_max=1.0, wait_jitter=0.0)
    async with rt_for(fake, retry) as rt:
        async with rt.job("r") as job, job.session() as s:
            t0 = anyio.current_time()
            await s.chat(model="m", messages=MSG)
            waited = anyio.current_time() - t0
    assert 0.15 <= waited < 0.6
    assert job.report.call_reports[0].attempts == 3


async def test_an_smg_preempted_503_is_retried_and_not_held_against_health() -> None:
    """SGLang's gateway (smg) answers a request it preempted for a higher priority class
    with 503, ``X-SMG-Preempted: true`` and ``Retry-After: 1``: retried after that wait,
    and the replica is not marked down however many come."""
    fake = FakeEngine()
    fake.script = [status(503, **{"x-smg-preempted": "true", "retry-after": "0.05"})] * 4
    retry = Retry(attempts=5, wait_initial=0.0, wait_jitter=0.0)
    other = "http://other.test/v1"
    async with Runtime([URL, other], transport=fake.transport(), retry=retry) as rt:
        async with rt.job("r") as job, job.session() as s:
            t0 = anyio.current_time()
            await s.chat(model="m", messages=MSG)
            waited = anyio.current_time() - t0
        healthy = [ep.health.healthy for ep in rt._core.endpoints]
    assert waited >= 0.2  # four waits of the Retry-After
    (c,) = job.report.call_reports
    assert c.attempts == 5 and not c.moved  # all five at the session's one replica
    assert healthy == [True, True]


async def test_a_plain_503_still_counts_against_health() -> None:
    fake = FakeEngine()
    fake.script = [status(503)] * 4
    retry = Retry(attempts=5, wait_initial=0.0, wait_jitter=0.0)
    other = "http://other.test/v1"
    async with Runtime([URL, other], transport=fake.transport(), retry=retry) as rt:
        async with rt.job("r") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
        healthy = [ep.health.healthy for ep in rt._core.endpoints]
    # The replica it was placed on went down (four 503s) and the call went to the other; a
    # first turn that fails over is still a first turn, not a move (issue 35).
    ended = job.report.call_reports[0].endpoint
    assert healthy == [url == ended for url in (URL, other)]
    assert not job.report.call_reports[0].moved


def test_attempt_error_is_public() -> None:
    assert agentrt.AttemptError.__module__ == "agentrt"
    assert issubclass(AttemptError, agentrt.AgentrtError)
