"""The lines under `agentrt bench`'s table: each client against the first, and what to try
where no client differs (a real run on the embedded cluster, in virtual time)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agentrt.bench._runner import BenchConfig, BenchResult, run_bench
from agentrt.bench._takeaway import failures, takeaway
from agentrt.cli import main


@pytest.fixture(scope="module")
def result() -> BenchResult:
    return run_bench(
        BenchConfig(
            workload="coding",
            jobs=6,
            replicas=2,
            clients=("plain", "agentrt:round-robin", "agentrt:session"),
            stretch=False,
        )
    )


def test_each_client_is_set_against_the_first_and_the_one_that_matters_named(
    result: BenchResult,
) -> None:
    lines = takeaway(result, 80)
    text = "\n".join(lines)
    assert lines[0] == "Against plain (below 1.00x: lower, faster):"
    assert "  agentrt:round-robin: JCT mean" in text and "  agentrt:session: JCT mean" in text
    plain, session = result.clients[0], result.clients[2]
    ratio = session.jct["mean"] / plain.jct["mean"]
    assert ratio < 0.9  # session routing shows on coding jobs, even six of them
    assert f"agentrt:session: JCT mean {ratio:.2f}x" in text
    assert "agentrt:session changes JCT the most here" in text
    assert all(len(line) <= 80 for line in text.splitlines())


def test_where_no_client_differs_it_says_which_settings_would(result: BenchResult) -> None:
    plain = result.clients[0]
    same = replace(result, clients=[plain, replace(result.clients[1], jct=dict(plain.jct))])
    text = " ".join(takeaway(same, 100))
    assert "No client is more than 5% from plain" in text
    assert "--workload coding" in text and "--rate" in text
    assert takeaway(replace(result, clients=[plain])) == []


def test_bench_defaults_to_the_coding_workload(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentrt import cli

    args = cli._parser().parse_args(["bench"])
    assert args.workload == "coding" and args.clients is None
    assert main is cli.main


def test_a_client_with_no_job_done_is_named_by_no_claim(result: BenchResult) -> None:
    """A client whose every job failed has no JCT: it is not 'the one that changes JCT
    the most' (its JCTs are NaN), and with the first client failed nothing is compared."""
    plain, rr, session = result.clients
    rows = [
        {**row, "status": "error: NotFoundError", "error": "NotFoundError: no"}
        for row in rr.job_rows
    ]
    nan = {k: float("nan") for k in rr.jct}
    broken = replace(rr, failed=rr.jobs, jct=nan, job_rows=rows)
    text = " ".join(takeaway(replace(result, clients=[plain, broken, session]), 100))
    assert "agentrt:round-robin" not in text
    assert "agentrt:session changes JCT the most here" in text
    assert takeaway(replace(result, clients=[replace(plain, failed=plain.jobs), rr])) == []
    line = failures(replace(result, clients=[plain, broken, session]))
    assert (
        line == f"jobs failed: agentrt:round-robin {rr.jobs} of {rr.jobs}; why: NotFoundError: no"
    )
    assert failures(result) is None
