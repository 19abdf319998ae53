"""What tune reads and says (issue 35, items 1 and 9): a journal written with Runtime's
defaults over several endpoints was recorded with the engine cap (polled, since
``poll_metrics_s="auto"`` polls several endpoints), not without one; one window is low
confidence, as tune's own refusal and docs/tune.md say."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrt import Retry, Runtime
from agentrt.tune._command import _confidence
from agentrt.tune._search import Score, Setting
from agentrt.tune._workload import load
from tests._fake import MSG, FakeEngine

FAST = Retry(attempts=1, wait_initial=0.0, wait_jitter=0.0)


@pytest.mark.anyio
async def test_a_journal_of_runtime_defaults_over_endpoints_reads_as_polled(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.jsonl"
    fake = FakeEngine()
    urls = ["http://a.test/v1", "http://b.test/v1"]
    async with Runtime(urls, transport=fake.transport(), retry=FAST, journal=path) as rt:
        for j in range(4):
            async with rt.job(f"j{j}") as job, job.session() as s:
                await s.chat(model="m", messages=MSG)
    observed = load([path])
    assert observed.recorded_known
    recorded = Setting.of(observed.recorded)
    assert recorded == Setting()  # Runtime's defaults: concurrency="engine", polled
    assert recorded.concurrency == "engine"
    assert "@none" not in recorded.label()


def _score(setting: Setting, samples: list[float]) -> Score:
    mean = sum(samples) / len(samples)
    return Score(setting, {}, {}, 1.0, 1.0, mean, 0.0, samples)


def test_one_window_is_low_confidence() -> None:
    recorded = Setting()
    other = Setting(policy="plas")
    ranked = [_score(other, [0.976]), _score(recorded, [1.0])]
    assert _confidence(ranked, recorded) == "low"
    # Several windows, a clear margin every time: high, as before.
    many = [_score(other, [0.90, 0.91, 0.90]), _score(recorded, [1.0, 1.0, 1.0])]
    assert _confidence(many, recorded) == "high"


def test_progress_counts_replays_and_speaks_when_not_a_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """(issue 35, item 14) Not a terminal: a line now and then and one at the end, in
    replays, and the count ends where the replays did (not at 57/66)."""
    from agentrt.tune._command import _Progress

    with _Progress(66, bar=False, lines=True, every_s=0.0) as progress:
        for _ in range(30):
            progress.tick()
        progress.retotal(57)
        for _ in range(27):
            progress.tick()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 58
    assert lines[0].startswith("tune: 1/66 replays")
    assert lines[-2].startswith("tune: 57/57 replays")
    assert lines[-1].startswith("tune: 57/57 replays") and lines[-1].endswith(", done")
    assert not any("jobs" in line for line in lines)
