"""tune's loop on two real vLLM CPU replicas (issue 19): a journal recorded with Runtime's
defaults, ``agentrt tune`` on it (the cpu-tiny engine fitted to the journal), and the
settings file it writes applied with ``Runtime(config=...)`` to fresh jobs.

Small on purpose (a few three-turn jobs with short tool waits): it checks that the loop
runs end to end on the real engine, not which settings win; python -m benchmarks tune vllm
measures that.
"""

from __future__ import annotations

import random
import tomllib
import uuid
from pathlib import Path

import anyio
import pytest

import agentrt
from agentrt.cli import main
from agentrt.telemetry import read_journal
from agentrt.testing.vllm_cpu import ReplicaServer
from agentrt.tune._search import Setting
from agentrt.tune._workload import runtime_defaults

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

JOBS = 4
TURNS = 3
KEYS = {"routing", "policy", "concurrency", "send_priority", "learn_waits"}
_WORDS = "agent tool call session prefix cache token engine queue batch reply prompt".split()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the engine is slow on 2 cores; the unit tests cover trio


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


async def run_jobs(rt: agentrt.Runtime, model: str, tag: str) -> None:
    """JOBS tool loops, staggered: each turn's prompt extends the last (a shared system
    prompt, the task, then a tool result per turn)."""
    system = "You are a coding agent. " + words(random.Random(0), 300)

    async def one(i: int) -> None:
        rng = random.Random(f"{tag}-{i}")
        await anyio.sleep(0.3 * i)
        async with rt.job("react") as job, job.session("agent") as s:
            prompt = f"{system}\n{tag} task {i}: {words(rng, 60)}"
            for turn in range(TURNS):
                if turn:
                    async with s.tool("grep"):
                        await anyio.sleep(0.2)
                    prompt += "\n" + words(rng, 40)
                resp = await s.chat(
                    model=model,
                    messages=[{"role": "user", "content": prompt}],
                    max_tokens=16,
                    extra_body={"ignore_eos": True},  # random weights: exact lengths
                )
                prompt += "\n" + (resp.choices[0].message.content or "")

    async with anyio.create_task_group() as tg:
        for i in range(JOBS):
            tg.start_soon(one, i)


async def test_record_tune_apply_on_two_replicas(
    vllm_pair: list[ReplicaServer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    urls = [r.base_url for r in vllm_pair]
    model = vllm_pair[0].model
    tag = uuid.uuid4().hex[:12]  # fresh prompts: no prefix cached by an earlier test

    # 1. record with Runtime's defaults
    recorded = tmp_path / "recorded.jsonl"
    async with agentrt.Runtime(urls, dialect="vllm", journal=recorded) as rt:
        await run_jobs(rt, model, f"rec{tag}")
    reports = read_journal(recorded)
    assert len(reports) == JOBS and all(r.status == "ok" for r in reports)
    # One replica or both: new sessions sharing the system prompt go to the replica that
    # holds it while it carries no more than the mean load plus one call, and 4 small
    # staggered jobs may all fit there (a CI run saw it once; docs/routing.md).
    used = {c.endpoint for r in reports for c in r.call_reports}
    assert used and used <= set(urls)
    assert reports[0].runtime is not None
    assert reports[0].runtime["concurrency"] == "engine"  # the default, as recorded

    # 2. tune on the journal (cpu-tiny fitted to its latencies)
    out = tmp_path / "tuned.toml"
    args = ["tune", str(recorded), "--out", str(out), "--preset", "cpu-tiny"]
    args += ["--sample", "3", "--seeds", "1", "--top", "1", "--workers", "1"]
    code = await anyio.to_thread.run_sync(main, args)
    text = capsys.readouterr().out
    assert code == 0, text
    # Runtime's defaults over two endpoints: polled, so the "engine" cap is live (a journal
    # records the endpoints and poll_metrics_s="auto"; tune reads them, issue 35)
    polled = {**runtime_defaults(), "endpoints": len(urls), "poll_metrics_s": "auto"}
    defaults = Setting.of(polled).label()
    assert f"recorded with: {defaults}" in text, text  # Runtime's defaults, from the journal
    assert f"{defaults}*" in text, text  # and marked in the ranked table
    settings = tomllib.loads(out.read_text())
    assert KEYS <= set(settings) <= {*KEYS, "poll_metrics_s"}, settings

    # 3. apply to fresh jobs
    applied = tmp_path / "applied.jsonl"
    async with agentrt.Runtime(urls, dialect="vllm", journal=applied, config=out) as rt:
        await run_jobs(rt, model, f"app{tag}")
    reports = read_journal(applied)
    assert len(reports) == JOBS
    assert all(r.status == "ok" and r.calls == TURNS for r in reports)
    assert reports[0].runtime is not None
    for key in KEYS:  # the runtime ran with the file's settings
        want = None if settings[key] == "none" else settings[key]
        assert reports[0].runtime[key] == want, (key, reports[0].runtime)
