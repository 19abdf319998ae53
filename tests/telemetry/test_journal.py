"""The journal: one flushed JSON line per finished job; read back line by line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrt import Runtime
from agentrt.telemetry import JobReport
from agentrt.telemetry._journal import JournalWarning, read_journal
from tests._fake import MSG, FakeEngine

URL = "http://engine.test/v1"


@pytest.mark.anyio
async def test_each_finished_job_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    async with Runtime([URL], transport=FakeEngine().transport(), journal=path) as rt:
        for i in range(3):
            async with rt.job(f"job-{i}") as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
            # flushed as soon as the job ends, before the runtime closes
            assert len(path.read_text().splitlines()) == i + 1
        with pytest.raises(RuntimeError):
            async with rt.job("failing"):
                raise RuntimeError("boom")
    reports = read_journal(path)
    assert [r.name for r in reports] == ["job-0", "job-1", "job-2", "failing"]
    assert reports[-1].status == "error"
    assert reports[0].call_reports[0].completion_tokens == 5
    assert reports[0] == JobReport.model_validate(json.loads(path.read_text().splitlines()[0]))


def test_a_corrupt_line_is_named_and_skipped(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    good = JobReport(
        job_id="j1",
        name="n",
        program_id="j1",
        status="ok",
        started_at="2026-01-01T00:00:00Z",  # type: ignore[arg-type]
        jct_s=1.0,
        llm_s=0.5,
        critical_llm_s=0.5,
        queue_s=0.0,
        tool_s=0.0,
        calls=1,
        tool_waits=0,
        sessions=1,
        prompt_tokens=1,
        completion_tokens=1,
        cached_tokens=0,
        retries=0,
    ).model_dump_json()
    path.write_text(good + "\n" + '{"job_id": "cut sh' + "\n\n" + good + "\n")
    with pytest.warns(JournalWarning, match=r"runs.jsonl:2: not a valid job report"):
        reports = read_journal(path)
    assert len(reports) == 2


def test_a_bad_journal_path_fails_when_the_runtime_is_built(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        Runtime([URL], journal=tmp_path)


CRASHER = """
import sys, anyio, agentrt
from tests._fake import MSG, FakeEngine

async def main() -> None:
    async with agentrt.Runtime(["http://engine.test/v1"], transport=FakeEngine().transport(),
                               journal=sys.argv[1]) as rt:
        for i in range(1000000):
            async with rt.job(f"job-{i}") as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
                await anyio.sleep(0.001)

anyio.run(main)
"""


def test_a_process_killed_mid_job_leaves_a_readable_journal(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", CRASHER, str(path)], cwd=root)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if path.exists() and len(path.read_bytes().splitlines()) >= 20:
                break
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    reports = read_journal(path)  # no warning: every line written is whole
    assert len(reports) >= 20
    assert [r.name for r in reports] == [f"job-{i}" for i in range(len(reports))]
