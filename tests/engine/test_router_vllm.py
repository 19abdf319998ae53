"""agentrt behind vllm-router (vllm-project/router 0.1.17) in front of two vLLM CPU replicas.

The router is the real one, installed by scripts/engine_setup.sh into .engine/router, and
started per test with the policy and program-scheduling settings the test names
(agentrt.testing.vllm_cpu.RouterSpec). The replicas are the ``vllm_pair`` (one core
each). Which replica served a call is read from the replicas' own request counters, one
call at a time: sessions run interleaved (turn by turn), so each is open while the
others call.
"""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

import agentrt
from agentrt.dialects import vllm_router_agentic_dialect
from agentrt.testing.vllm_cpu import (
    ROUTER_SETUP_MESSAGE,
    EngineEnv,
    ReplicaServer,
    RouterServer,
    RouterSpec,
    find_router,
    start_router,
)

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

DIALECT = "vllm-router-agentic"
_WORDS = (
    "agent tool call session prefix cache token engine queue batch priority schedule latency "
    "replica router worker block event metric stream reply prompt model search result plan"
).split()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the engine is slow on 2 cores; the unit tests cover trio


@pytest.fixture(scope="session")
def router_binary(vllm_env: EngineEnv) -> Path:
    found = find_router(vllm_env.root)
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {ROUTER_SETUP_MESSAGE}", pytrace=False)
        pytest.skip(ROUTER_SETUP_MESSAGE)
    return found


def text(words: int) -> str:
    tag = uuid.uuid4().hex
    rng = random.Random(tag)
    return tag + " " + " ".join(rng.choice(_WORDS) for _ in range(words))


@asynccontextmanager
async def routed(
    pair: Sequence[ReplicaServer], binary: Path, log_dir: Path, spec: RouterSpec
) -> AsyncIterator[RouterServer]:
    """The router in front of the pair, started and stopped off the event loop."""
    urls = [r.url for r in pair]

    def start() -> RouterServer:
        return start_router(spec, urls, binary=binary, log_dir=log_dir)

    router = await anyio.to_thread.run_sync(start)
    try:
        yield router
    finally:
        await anyio.to_thread.run_sync(router.stop)


async def served(pair: Sequence[ReplicaServer]) -> list[float]:
    """Requests each replica has finished so far."""

    def read() -> list[float]:
        return [r.metrics().get("vllm:request_success_total", 0.0) for r in pair]

    return await anyio.to_thread.run_sync(read)


async def interleaved_sessions(
    router: RouterServer, pair: Sequence[ReplicaServer], *, sessions: int, turns: int
) -> tuple[list[list[int]], agentrt.JobReport]:
    """``sessions`` sessions of one job, called turn by turn through the router with the
    router dialect; the replica index that served each call, per session."""
    where: list[list[int]] = [[] for _ in range(sessions)]
    model = pair[0].model
    async with agentrt.Runtime([router.base_url], dialect=DIALECT) as rt:
        async with rt.job("interleaved") as job, AsyncExitStack() as stack:
            opened = [await stack.enter_async_context(job.session()) for _ in range(sessions)]
            history = [[{"role": "system", "content": text(300)}] for _ in range(sessions)]
            for turn in range(turns):
                for i, session in enumerate(opened):
                    history[i].append({"role": "user", "content": f"turn {turn} " + text(20)})
                    before = await served(pair)
                    reply = await session.chat(model=model, messages=history[i], max_tokens=4)
                    after = await served(pair)
                    moved = [n for n, (a, b) in enumerate(zip(before, after, strict=True)) if b > a]
                    assert len(moved) == 1, (before, after)
                    where[i].append(moved[0])
                    content = reply.choices[0].message.content or ""  # type: ignore[union-attr]
                    history[i].append({"role": "assistant", "content": content})
    return where, job.report


@pytest.mark.parametrize(
    "spec",
    [
        RouterSpec(policy="consistent_hash"),
        RouterSpec(policy="kv_aware", kv_affinity_ttl_s=300),
    ],
    ids=["consistent_hash", "kv_aware-affinity"],
)
async def test_sessions_stick_to_one_replica_and_hit_its_cache(
    vllm_pair: list[ReplicaServer], router_binary: Path, tmp_path: Path, spec: RouterSpec
) -> None:
    """Each agentrt session keeps its replica through the router, and its later turns find
    their prefix there: more cached prompt tokens than the same sessions spread by the
    router's round_robin."""
    async with routed(vllm_pair, router_binary, tmp_path, spec) as router:
        sticky, sticky_report = await interleaved_sessions(router, vllm_pair, sessions=3, turns=4)
    async with routed(vllm_pair, router_binary, tmp_path, RouterSpec("round_robin")) as rr:
        spread, spread_report = await interleaved_sessions(rr, vllm_pair, sessions=3, turns=4)
    assert all(len(set(calls)) == 1 for calls in sticky), sticky
    assert any(len(set(calls)) == 2 for calls in spread), spread
    assert sticky_report.status == "ok" and spread_report.status == "ok"
    assert (sticky_report.cache_hit_rate or 0.0) > (spread_report.cache_hit_rate or 0.0)
    # Every turn after a session's first reuses at least its system prompt's blocks.
    later = [c for c in sticky_report.call_reports if c.turn > 0]
    assert all((c.cached_tokens or 0) >= 128 for c in later), [c.cached_tokens for c in later]


LONG = 256
"""Output tokens of the stream held in flight while the router is asked about it."""


async def settled(router: RouterServer, session_id: str) -> dict[str, Any]:
    """The session's program once the router has finished its last request (the reply's
    end reaches the client a moment before the router books it)."""
    with anyio.fail_after(10):
        while True:
            program = (await anyio.to_thread.run_sync(router.programs))[session_id]
            if program["in_flight_requests"] == 0:
                return program
            await anyio.sleep(0.05)


def _view(program: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "task_id",
        "session_id",
        "agent_id",
        "agent_role",
        "parent_program_id",
        "root_program_id",
        "blocks_parent",
        "expected_resume",
    )
    return {k: program.get(k) for k in keys}


async def test_program_scheduling_sees_agentrt_programs(
    vllm_pair: list[ReplicaServer], router_binary: Path, tmp_path: Path
) -> None:
    """With program scheduling on, the router knows each session as a program of the job's
    task with its parent and root; a declared tool wait holds the program's slot for the
    wait (kv_retention_ttl_seconds), an undeclared one does not; a streamed call's usage
    reaches the router and agentrt's report; a call marked final ends the program at the router."""
    model = vllm_pair[0].model
    spec = RouterSpec(policy="consistent_hash", program_scheduling=True)
    async with routed(vllm_pair, router_binary, tmp_path, spec) as router:
        programs = router.programs
        async with agentrt.Runtime([router.base_url], dialect=DIALECT) as rt:
            async with rt.job("programs", deadline_s=600) as job, job.session("planner") as lead:
                messages = [{"role": "user", "content": text(200)}]
                lead.expect_idle(5.0)  # a tool wait after this reply: TTL 5 + 2 s margin
                # The state asked about must hold while the router is asked: the reply
                # cannot end before LONG tokens (ignore_eos, min_tokens), and the router
                # is asked at its first chunk, LONG - 1 tokens before it can end (a reply
                # of 24 tokens had ended on a busy machine before the question came).
                stream = await lead.chat(
                    model=model,
                    messages=messages,
                    max_tokens=LONG,
                    stream=True,
                    extra_body={"ignore_eos": True, "min_tokens": LONG},
                )
                in_flight: dict[str, Any] = {}
                async for _ in stream:  # type: ignore[union-attr]
                    if not in_flight:
                        in_flight = (await anyio.to_thread.run_sync(programs))[lead.id]
                held = await settled(router, lead.id)
                async with job.session("worker", parent=lead, blocks_parent=False) as sub:
                    await sub.chat(model=model, messages=messages, max_tokens=4)
                    seen = await anyio.to_thread.run_sync(programs)
                    await sub.chat(model=model, messages=messages, max_tokens=4, final=True)
                    after_last = await anyio.to_thread.run_sync(programs)
        diagnostics = await anyio.to_thread.run_sync(router.diagnostics)

    assert _view(seen[lead.id]) == {
        "task_id": job.id,
        "session_id": lead.id,
        "agent_id": "planner",
        "agent_role": "lead",
        "parent_program_id": None,
        "root_program_id": lead.id,
        "blocks_parent": False,
        "expected_resume": True,
    }
    assert _view(seen[sub.id]) == {
        "task_id": job.id,
        "session_id": sub.id,
        "agent_id": "worker",
        "agent_role": "subagent",
        "parent_program_id": lead.id,
        "root_program_id": lead.id,
        "blocks_parent": False,  # as said (the router's default for a sub-agent is true)
        "expected_resume": True,
    }
    # In flight: the request's hints as sent.
    assert in_flight["in_flight_requests"] == 1
    assert in_flight["expected_output_tokens"] == LONG
    # (deadline_seconds, what is left of the job's 600 s, is accepted with the call; the
    # diagnostics show a request's deadline only while it waits in the router's pool.)
    # After the reply, the declared wait holds the slot (acting, TTL armed to 7 s) ...
    assert held["state"] == "active" and held["status"] == "acting"
    assert 2.0 < (held["ttl_remaining_seconds"] or 0.0) <= 7.0
    # ... a sub-agent that declared nothing gets the router's fitted TTL (0 s while the
    # router has too few samples to fit one): paused at once, or soon.
    sub_ttl = seen[sub.id]["ttl_remaining_seconds"]
    assert seen[sub.id]["state"] == "paused" or sub_ttl is None or sub_ttl < 2.0
    # The final call (expected_resume false) ended the sub-agent's program; the lead lives.
    assert sub.id not in after_last and lead.id in after_last
    # The stream was counted: by agentrt (usage asked on the caller's behalf) and by the
    # router, which saw the usage in the stream.
    streamed = job.report.call_reports[0]
    assert streamed.completion_tokens == LONG  # min_tokens held it to the end
    assert streamed.prompt_tokens is not None and streamed.prompt_tokens > 0
    assert held["last_output_actual_tokens"] == streamed.completion_tokens
    assert sum(r["rolling"]["request_samples"] for r in diagnostics["ranks"]) >= 1


async def test_streams_through_the_router_are_counted(
    vllm_pair: list[ReplicaServer], router_binary: Path, tmp_path: Path
) -> None:
    """Streamed calls through the router (program scheduling on, which does not ask for
    usage itself) reach agentrt's report with the tokens the replicas counted."""
    model = vllm_pair[0].model

    def tokens() -> tuple[float, float]:
        m = [r.metrics() for r in vllm_pair]
        return (
            sum(x.get("vllm:prompt_tokens_total", 0.0) for x in m),
            sum(x.get("vllm:generation_tokens_total", 0.0) for x in m),
        )

    spec = RouterSpec(policy="consistent_hash", program_scheduling=True)
    async with routed(vllm_pair, router_binary, tmp_path, spec) as router:
        before = await anyio.to_thread.run_sync(tokens)
        async with agentrt.Runtime([router.base_url], dialect=DIALECT) as rt:
            async with rt.job("streams") as job, job.session() as s:
                messages = [{"role": "user", "content": text(100)}]
                for _ in range(3):
                    stream = await s.chat(model=model, messages=messages, max_tokens=8, stream=True)
                    chunks = [c async for c in stream]  # type: ignore[union-attr]
                    assert chunks and all(c.usage is None for c in chunks)  # not asked
        after = await anyio.to_thread.run_sync(tokens)
    rep = job.report
    assert rep.calls == 3 and all(c.http_status == 200 for c in rep.call_reports)
    assert rep.prompt_tokens == after[0] - before[0]
    assert rep.completion_tokens == after[1] - before[1]
    assert rep.cached_tokens > 0  # the second and third calls repeat the first's prompt


async def test_sticky_least_loaded_releases_a_finished_session(
    vllm_pair: list[ReplicaServer], router_binary: Path, tmp_path: Path
) -> None:
    """``sticky_least_loaded`` puts a new session on the replica with the fewest sessions;
    the ``vllm-router-agentic`` dialect tells it when a session ended (``POST
    /finish_session``, by default), which frees that replica for the next new session; a
    runtime with ``finish_session=False`` leaves its sessions counted."""
    model = vllm_pair[0].model
    where: dict[str, int] = {}

    async def call(s: agentrt.Session) -> None:
        before = await served(vllm_pair)
        await s.chat(model=model, messages=[{"role": "user", "content": s.id}], max_tokens=2)
        after = await served(vllm_pair)
        where[s.id] = next(i for i in range(2) if after[i] > before[i])

    spec = RouterSpec(policy="sticky_least_loaded")
    async with routed(vllm_pair, router_binary, tmp_path, spec) as router:
        silent = vllm_router_agentic_dialect(finish_session=False)
        async with agentrt.Runtime([router.base_url], dialect=silent) as plain_rt:
            async with plain_rt.job("others") as others:
                async with agentrt.Runtime([router.base_url], dialect=DIALECT) as rt:
                    async with rt.job("ends") as job, job.session(session_id="a") as a:
                        await call(a)
                        async with others.session(session_id="b") as b:
                            await call(b)  # the other replica: a's has one session
                # a has ended, and its runtime's posts are all sent when its block exits;
                # b ended unannounced, so its replica still counts it.
                async with others.session(session_id="c") as c:
                    await call(c)
    assert where["a"] != where["b"]
    assert where["c"] == where["a"]
