"""Shared by the tune tests: a small journal recorded on the embedded cluster."""

from __future__ import annotations

from pathlib import Path

from agentrt.bench import BenchConfig, run_bench
from agentrt.bench._fleet import FleetAssign


def record_journal(
    tmp: Path,
    workload: str,
    jobs: int,
    client: str = "agentrt:session",
    replicas: int = 2,
    fleet: int = 1,
    fleet_assign: FleetAssign = "round_robin",
) -> Path:
    """Runs ``jobs`` jobs of ``workload`` (0.5 jobs/s, seed 4) through ``client`` on
    ``replicas`` embedded replicas in virtual time (as a fleet of ``fleet`` runtimes, all
    writing the one journal); returns the journal it wrote in ``tmp``."""
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
        fleet=fleet,
        fleet_assign=fleet_assign,
    )
    run_bench(cfg, workers=1)
    (path,) = tmp.glob("journal-*.jsonl")
    return path
