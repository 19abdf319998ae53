"""No silent loss (issue 16): a job's metadata that its journal line could not carry is
refused when the job opens; every finished job is either written to the journal or
counted as lost (``rt.journal_statistics()``, Prometheus, OpenTelemetry) and logged on
the ``agentrt`` logger, rate-limited; every event a hook fails on is counted."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

import agentrt
from agentrt import Runtime, SyncRuntime
from agentrt.telemetry import Event, read_journal
from agentrt.telemetry._journal import RateLimitedLog
from tests._fake import MSG, FakeEngine

URL = "http://engine.test/v1"
FULL = "/dev/full"  # every write fails with ENOSPC: a full disk, for real
needs_dev_full = pytest.mark.skipif(not os.path.exists(FULL), reason="needs /dev/full")


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("metadata", "key"),
    [
        ({"ok": 1, "thing": object()}, "thing"),
        ({"blob": b"\xff\xfe"}, "blob"),
        ({"nested": {"a": [1, object()]}}, "nested"),
    ],
)
async def test_metadata_that_cannot_be_journaled_is_refused_before_any_request(
    metadata: dict[str, object], key: str, tmp_path: Path
) -> None:
    fake = FakeEngine()
    async with Runtime([URL], transport=fake.transport(), journal=tmp_path / "j") as rt:
        with pytest.raises(TypeError, match=f"job metadata {key!r}"):
            async with rt.job("j", metadata=metadata) as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
        # A job with good metadata is journaled with it.
        async with rt.job("k", metadata={"run": 3, "tags": ["a"], "b": b"ok"}) as job:
            pass
    assert fake.seen == []
    (line,) = read_journal(tmp_path / "j")
    assert line.job_id == job.id and line.metadata == {"run": 3, "tags": ["a"], "b": "ok"}


def test_metadata_keys_must_be_str_and_sync_jobs_check_too() -> None:
    with SyncRuntime([URL], transport=FakeEngine().transport()) as rt:
        with pytest.raises(TypeError, match="keys must be str"):
            with rt.job("j", metadata={1: "x"}):  # type: ignore[dict-item]
                pass
        with pytest.raises(TypeError, match="job metadata 'o'"):
            with rt.job("j", metadata={"o": object()}):
                pass


BAD_NAME = os.fsdecode(b"run-\xff.json")  # a file name that is not UTF-8: a lone surrogate


@pytest.mark.anyio
async def test_names_that_are_not_utf8_are_refused_before_any_request(tmp_path: Path) -> None:
    """A job, session or tool name holding a lone surrogate would lose the job's journal
    line and break every later Prometheus export: each is refused where it is given."""
    from prometheus_client import generate_latest

    registry = CollectorRegistry()
    fake = FakeEngine()
    async with Runtime(
        [URL], transport=fake.transport(), journal=tmp_path / "j", prometheus=registry
    ) as rt:
        with pytest.raises(ValueError, match=r"job name 'run-.*lone surrogate"):
            async with rt.job(BAD_NAME) as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
        with pytest.raises(ValueError, match=r"session name .*not valid UTF-8"):
            async with rt.job("ok") as job, job.session(BAD_NAME) as s:
                await s.chat(model="m", messages=MSG)
        with pytest.raises(ValueError, match=r"tool name .*not valid UTF-8"):
            async with rt.job("ok") as job, job.session("a") as s:
                async with s.tool(BAD_NAME):
                    pass
        with pytest.raises(ValueError, match=r"job metadata key .*not valid UTF-8"):
            async with rt.job("ok", metadata={BAD_NAME: 1}):
                pass
        async with rt.job("good") as job, job.session("a") as s:
            await s.chat(model="m", messages=MSG)
            async with s.tool("read"):
                pass
        stats = rt.journal_statistics()
    assert len(fake.seen) == 1  # only the good job's call went out
    assert (stats.written, stats.lost) == (3, 0)  # the jobs that opened: "ok", "ok", "good"
    assert "good" in [r.name for r in read_journal(tmp_path / "j")]
    assert b'job_name="good"' in generate_latest(registry)  # the registry still exports


@needs_dev_full
@pytest.mark.anyio
async def test_a_full_disk_is_counted_logged_and_exported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    caplog.set_level(logging.WARNING, logger="agentrt")
    async with Runtime(
        [URL], transport=FakeEngine().transport(), journal=FULL, prometheus=registry
    ) as rt:
        for i in range(5):
            async with rt.job(f"j{i}") as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
        stats = rt.journal_statistics()
    assert (stats.written, stats.lost) == (0, 5)
    assert stats.last_error is not None and "No space left" in stats.last_error
    assert job.id in stats.last_error
    assert registry.get_sample_value("agentrt_journal_lines_total", {"outcome": "lost"}) == 5
    assert not registry.get_sample_value("agentrt_journal_lines_total", {"outcome": "written"})
    # Logged: the first loss at once, the rest counted into later records (here the one
    # the journal's close flushes); the counts add up to every loss.
    records = [r.getMessage() for r in caplog.records if r.name == "agentrt.journal"]
    assert 1 <= len(records) < 5
    assert sum(int(re.search(r": (\d+) more", m).group(1)) for m in records) == 5  # type: ignore[union-attr]
    with pytest.raises(dataclasses_frozen()):
        stats.lost = 0  # type: ignore[misc]


def dataclasses_frozen() -> type[Exception]:
    import dataclasses

    return dataclasses.FrozenInstanceError


@pytest.mark.anyio
async def test_written_lines_are_counted_and_short_writes_completed(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    path = tmp_path / "j.jsonl"
    async with Runtime(
        [URL], transport=FakeEngine().transport(), journal=path, prometheus=registry
    ) as rt:
        journal = rt._journal
        assert journal is not None and journal._file is not None
        real = journal._file

        class Dribble:  # an unbuffered file that takes 7 bytes per write() call
            def write(self, data: memoryview) -> int:
                return real.write(data[:7])

            def close(self) -> None:
                real.close()

        journal._file = Dribble()  # type: ignore[assignment]
        for i in range(3):
            async with rt.job(f"j{i}") as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
        stats = rt.journal_statistics()
    assert (stats.written, stats.lost, stats.hook_errors) == (3, 0, 0)
    assert [r.name for r in read_journal(path)] == ["j0", "j1", "j2"]
    assert registry.get_sample_value("agentrt_journal_lines_total", {"outcome": "written"}) == 3


@pytest.mark.anyio
async def test_a_write_that_takes_nothing_is_a_loss_and_the_next_line_stays_whole(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.jsonl"
    async with Runtime([URL], transport=FakeEngine().transport(), journal=path) as rt:
        journal = rt._journal
        assert journal is not None and journal._file is not None
        real = journal._file
        calls = 0

        class HalfThenNothing:  # part of the first line goes out, then write() takes 0
            def write(self, data: memoryview) -> int:
                nonlocal calls
                calls += 1
                return real.write(data[:10]) if calls == 1 else 0

            def close(self) -> None:
                real.close()

        journal._file = HalfThenNothing()  # type: ignore[assignment]
        async with rt.job("lost"):
            pass
        journal._file = real
        async with rt.job("kept"):
            pass
        stats = rt.journal_statistics()
    assert (stats.written, stats.lost) == (1, 1)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert [r.name for r in read_journal(path)] == ["kept"]


@pytest.mark.anyio
async def test_a_job_that_ends_after_the_runtime_closed_is_counted_lost(tmp_path: Path) -> None:
    rt = Runtime([URL], transport=FakeEngine().transport(), journal=tmp_path / "j")
    with pytest.raises(agentrt.AgentrtError, match="still running"):
        async with rt:
            job = rt._open_job("late")  # as a framework adapter opens its runs
    rt._close_job(job)  # the framework ends the run late
    stats = rt.journal_statistics()
    assert (stats.written, stats.lost) == (0, 1)
    assert "closed" in (stats.last_error or "")


@pytest.mark.anyio
async def test_a_failing_hook_is_counted_on_every_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen = 0

    def broken(event: Event) -> None:
        nonlocal seen
        seen += 1
        raise RuntimeError("exporter down")

    caplog.set_level(logging.WARNING, logger="agentrt")
    with pytest.warns(RuntimeWarning, match="exporter down") as warned:
        async with Runtime([URL], transport=FakeEngine().transport(), hooks=[broken]) as rt:
            for _ in range(3):
                async with rt.job("j") as job, job.session() as s:
                    await s.chat(model="m", messages=MSG)
            stats = rt.journal_statistics()
    assert len(warned) == 1  # warned once...
    assert stats.hook_errors == seen > 10  # ...counted every time
    assert "exporter down" in (stats.last_error or "")
    assert any("agentrt hooks raised" in r.getMessage() for r in caplog.records)


def test_rate_limited_log_counts_every_occurrence(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="agentrt")
    log = RateLimitedLog("things failed", interval_s=3600)
    for i in range(100):
        log(f"#{i}")
    log.flush()
    records = [r.getMessage() for r in caplog.records]
    assert len(records) == 2
    assert records[0].startswith("things failed: 1 more (1 in all); last: #0")
    assert records[1].startswith("things failed: 99 more (100 in all)")


def test_journal_statistics_is_public() -> None:
    assert agentrt.JournalStatistics.__name__ == "JournalStatistics"
    assert "JournalStatistics" in agentrt.__all__


@needs_dev_full
def test_the_opentelemetry_counter_counts_lost_lines() -> None:
    """In a process of its own: the global meter provider can be set once."""
    script = textwrap.dedent(
        f"""
        import anyio, json
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from agentrt import Runtime
        from tests._fake import FakeEngine

        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

        async def main():
            async with Runtime(["{URL}"], transport=FakeEngine().transport(),
                               journal="{FULL}") as rt:
                for _ in range(2):
                    async with rt.job("j"):
                        pass

        anyio.run(main)
        out = {{}}
        for rm in reader.get_metrics_data().resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == "agentrt.journal.lines":
                        for p in m.data.data_points:
                            out[p.attributes["agentrt.journal.outcome"]] = p.value
        print(json.dumps(out))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[2],
        check=True,
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"lost": 2}
