"""Shared by the tune tests: a small journal recorded on the embedded cluster."""

from __future__ import annotations

from pathlib import Path

from agentrt.bench import BenchConfig, run_bench


def record_journal(
    tmp: Path, workload: str, jobs: int, client: str = "agentrt:session", replicas: int = 2
) -> Path:
    """Runs ``jobs`` jobs of ``workload`` (0.5 jobs/s, seed 4) through ``client`` on
    ``replicas`` embedded replicas in virtual time; returns the journal it wrote in
    ``tmp``."""
    cfg = BenchConfig(
        workload=workload,
        jobs=jobs,
        rate=0.5,
        seed=4,
        replicas=replicas,
        clients=(client,),
        stretch=False,
        api="http",
        journal_dir=tmp,
    )
    run_bench(cfg, workers=1)
    (path,) = tmp.glob("journal-*.jsonl")
    return path
