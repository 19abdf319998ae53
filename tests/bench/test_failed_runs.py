"""A bench run that fails says so: jobs that failed are counted with their reason in one
line, a run in which every job failed exits non-zero and writes nothing, and a run that
cannot start (a server not there, a URL without its scheme, a path that is not the
OpenAI API) stops before it removes anything from ``--out``. Real servers are
``agentrt sim serve``'s app on loopback; nothing is mocked."""

from __future__ import annotations

import socket
from pathlib import Path

import anyio
import pytest

from agentrt.bench._traces import sample_dir
from agentrt.cli import main
from agentrt.sim import serve_async
from agentrt.telemetry import read_journal
from tests.sim._helpers import small_config

EMBEDDED = ["bench", "--workload", "react", "--jobs", "6", "--replicas", "1", "--no-stretch"]
EMBEDDED += ["--client", "plain", "--client", "agentrt:session", "--workers", "1"]
REAL = ["bench", "--workload", "react", "--jobs", "2", "--tool-wait", "0.01", "--no-plots"]


def _previous_run(out: Path) -> dict[str, str]:
    """``out`` as a previous run left it, and a file of the user's."""
    out.mkdir()
    files = {
        "journal-plain.jsonl": "the previous run's journal\n",
        "results.json": "{}",
        "notes.txt": "mine",
    }
    for name, text in files.items():
        (out / name).write_text(text)
    return files


def _as_left(out: Path, files: dict[str, str]) -> None:
    assert {p.name: p.read_text() for p in out.iterdir()} == files


def _refused_url() -> str:
    with socket.socket() as s:  # a port nothing listens on once this closes
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


def _one_line(err: str, *needles: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("agentrt: error: "), err
    assert "a bug" not in err and "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_a_run_with_failed_jobs_counts_them_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 300 blocks of 16 tokens: five of the six jobs grow past what the replica holds.
    out = tmp_path / "out"
    assert main([*EMBEDDED, "--gpu-blocks", "300", "--no-plots", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    [line] = [x for x in text.splitlines() if x.startswith("jobs failed: ")]
    assert line.startswith("jobs failed: plain 5 of 6, agentrt:session 5 of 6; why: ")
    assert "BadRequestError" in line and "tokens of KV cache" in line
    assert (out / "results.json").is_file()
    assert len(read_journal(out / "journal-plain.jsonl")) == 6


def test_a_run_in_which_every_job_failed_exits_non_zero_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    files = _previous_run(out)
    assert main([*EMBEDDED, "--gpu-blocks", "60", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    line = _one_line(captured.err, "every job failed (12 jobs of 2 clients): BadRequestError")
    assert f"nothing was written to {out}" in line
    # No table, no takeaway, no plot (nor matplotlib's warning of an empty legend).
    assert "Against plain" not in captured.out and "changes JCT" not in captured.out
    assert "legend" not in captured.err
    _as_left(out, files)
    # A folder that did not exist is not left behind, empty.
    assert main([*EMBEDDED, "--gpu-blocks", "60", "--out", str(tmp_path / "new")]) == 2
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    ("endpoint", "needles"),
    [
        (None, ("could not reach", "is a server running at")),
        ("127.0.0.1:8000/v1", ("needs an http:// or https:// scheme",)),
    ],
    ids=["server down", "no scheme"],
)
@pytest.mark.parametrize("model", [None, "m"])
def test_a_run_that_cannot_start_leaves_out_as_it_was(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    endpoint: str | None,
    needles: tuple[str, ...],
    model: str | None,
) -> None:
    out = tmp_path / "out"
    files = _previous_run(out)
    args = [*REAL, "--endpoint", endpoint or _refused_url(), "--out", str(out)]
    assert main(args + (["--model", model] if model else [])) == 2
    _one_line(capsys.readouterr().err, *needles)
    _as_left(out, files)


def test_bench_writes_to_its_own_folder_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not ``results/``, where a checkout keeps the project's results."""
    monkeypatch.chdir(tmp_path)
    args = ["bench", "--workload", "react", "--jobs", "2", "--replicas", "1", "--no-stretch"]
    assert main([*args, "--client", "plain", "--no-plots", "--workers", "1"]) == 0
    assert "results: agentrt-bench/results.json" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agentrt-bench"]


@pytest.mark.parametrize(
    ("workload", "asked"), [("claude-code", "60 jobs"), ("mixed-cc", "60 Claude Code jobs")]
)
def test_more_replays_than_traces_is_an_error_that_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], workload: str, asked: str
) -> None:
    args = ["bench", "--workload", workload, "--jobs", "60", "--long-share", "1.0"]
    args += ["--traces", str(sample_dir()), "--out", str(tmp_path / "out")]
    assert main(args) == 2
    _one_line(
        capsys.readouterr().err,
        f"{asked} asked for, but the package's sample",
        "holds only 40 Claude Code traces: ask for 40 or fewer",
        "agentrt traces fetch",
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # uvicorn runs on asyncio
async def test_real_servers_wrong_path_and_wrong_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("uvicorn")
    out = tmp_path / "out"
    files = _previous_run(out)
    async with anyio.create_task_group() as tg:
        config = small_config(served_model_names=("sim-test",))  # others: 404
        urls = await tg.start(serve_async, 1, "127.0.0.1", 0, config)
        base = urls.url.removesuffix("/v1")
        # A path that is not the OpenAI API: the server's own 404 is shown.
        args = [*REAL, "--endpoint", f"{base}/wrong/v1", "--out", str(out)]
        assert await anyio.to_thread.run_sync(main, args) == 2
        _one_line(capsys.readouterr().err, "/wrong/v1/models answered HTTP 404 (no route")
        _as_left(out, files)
        # A model the server does not serve: every job fails, and the run says why.
        args = [*REAL, "--endpoint", urls.url, "--model", "WRONG", "--out", str(out)]
        assert await anyio.to_thread.run_sync(main, args) == 2
        _one_line(
            capsys.readouterr().err,
            "every job failed (6 jobs of 3 clients): NotFoundError",
            "WRONG",
        )
        _as_left(out, files)
        # The same run with the right model replaces the run's own files, no other.
        args = [*REAL, "--endpoint", urls.url, "--out", str(out)]
        assert await anyio.to_thread.run_sync(main, args) == 0
        tg.cancel_scope.cancel()
    assert "jobs failed" not in capsys.readouterr().out
    assert (out / "notes.txt").read_text() == "mine"
    assert len(read_journal(out / "journal-plain.jsonl")) == 2
    assert not list(out.glob(".*"))  # no journal left half-written beside its place
