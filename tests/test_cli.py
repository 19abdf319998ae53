"""The ``agentrt`` command: help that explains itself, fast start, one-line errors."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest

from agentrt import cli
from agentrt.bench import _cli as bench_cli
from agentrt.cli import main
from agentrt.report import _cli as report_cli
from agentrt.sim import _cli as sim_cli

COMMANDS = (
    [],
    ["demo"],
    ["bench"],
    ["report"],
    ["tune"],
    ["check"],
    ["sim"],
    ["sim", "serve"],
    ["traces"],
)


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentrt", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def _help(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main([*args, "--help"])
    assert exc.value.code == 0
    return capsys.readouterr().out


def _one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("agentrt"), lines
    assert "Traceback" not in result.stderr + result.stdout
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a) or "agentrt")
def test_help_fits_80_columns_and_ends_with_examples(
    args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    text = _help(args, capsys)
    assert max(map(len, text.splitlines())) <= 80, text
    tail = text.rstrip().split("\n\n")[-1]
    assert tail.startswith("examples:\n"), text
    examples = [line.strip() for line in tail.splitlines()[1:]]
    assert examples and all(line.startswith("agentrt") for line in examples)


def _options(parser: Any) -> list[Any]:
    return [a for a in parser._actions if a.option_strings and a.dest != "help"]


def test_every_subcommand_and_option_is_described() -> None:
    parser = cli._parser()
    stack = [parser]
    seen = 0
    while stack:
        p = stack.pop()
        assert p.description, p.prog
        for action in p._actions:
            if action.option_strings and action.dest not in ("help", "version"):
                assert action.help, f"{p.prog} {action.option_strings[0]} has no help"
            choices = getattr(action, "choices", None)
            if isinstance(choices, dict):  # subparsers
                stack.extend(choices.values())
        seen += 1
    assert seen == len(COMMANDS)


def test_defaults_are_shown(capsys: pytest.CaptureFixture[str]) -> None:
    text = " ".join(_help(["bench"], capsys).split())
    assert "(default: 40)" in text  # --jobs
    assert "(default: 0)" in text  # --seed: a falsy default is still shown
    assert "(default: coding)" in text
    for name in bench_cli.WORKLOADS:
        assert name in text  # the workloads are listed
    serve = " ".join(_help(["sim", "serve"], capsys).split())
    for name in (*sim_cli.PRESETS, *sim_cli.KV_POLICIES):
        assert name in serve


def test_the_lists_in_the_help_match_the_code() -> None:
    from agentrt.bench._workloads import WORKLOADS
    from agentrt.sim import PRESETS
    from agentrt.sim._config import KVPolicy, SchedulingPolicy

    # Each list is written out in the command line of its package, which imports none of
    # what it describes (so that --help starts fast).
    assert set(bench_cli.WORKLOADS) == set(WORKLOADS)
    assert set(sim_cli.PRESETS) == set(PRESETS)
    assert sim_cli.KV_POLICIES == get_args(KVPolicy)
    assert sim_cli.SCHEDULING == get_args(SchedulingPolicy)


def test_python_dash_m_and_version() -> None:
    result = _run("--version")
    assert result.returncode == 0
    assert re.fullmatch(r"agentrt \S+\n", result.stdout)


def test_help_imports_nothing_heavy() -> None:
    # The command starts fast because --help imports none of the runtime's dependencies.
    code = (
        "import sys\n"
        "from agentrt.cli import main\n"
        "try:\n    main(['bench', '--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = {'openai', 'httpx', 'httpx2', 'pydantic', 'anyio', 'agentrt._runtime'}\n"
        "print(sorted(m for m in sys.modules if m in heavy))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_bad_option_is_one_line() -> None:
    _one_line_error(_run("bench", "--jobs", "x"), "--jobs", "agentrt bench --help")
    _one_line_error(_run("bench", "--workload", "nope"), "--workload")
    _one_line_error(_run("demo", "--nope"), "--nope")
    _one_line_error(_run("bench", "--jobs", "0"), "--jobs must be positive")
    _one_line_error(_run("sim", "serve", "--port", "70000"), "--port")


def test_missing_extra_is_one_line_naming_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['uvicorn'] = None  # as if the serve extra were not installed\n"
        "from agentrt.cli import main\n"
        "sys.exit(main(['sim', 'serve', '--port', '0']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    _one_line_error(result, "uvicorn", "pip install 'agentjct[serve]'")


def test_port_in_use_is_one_line() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = _run("sim", "serve", "--port", str(port))
    _one_line_error(result, f"port {port}", "in use", "--port")


def test_missing_journal_is_one_line(tmp_path: Path) -> None:
    _one_line_error(_run("report", str(tmp_path / "nope.jsonl")), "nope.jsonl")


def test_an_unexpected_error_is_one_line_unless_asked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(args: Any) -> int:
        raise KeyError("boom")

    monkeypatch.setattr(report_cli, "_report", broken)
    monkeypatch.delenv("AGENTRT_TRACEBACK", raising=False)
    assert main(["report", "x.jsonl"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unexpected KeyError" in err and "AGENTRT_TRACEBACK" in err
    monkeypatch.setenv("AGENTRT_TRACEBACK", "1")
    with pytest.raises(KeyError):
        main(["report", "x.jsonl"])


def test_an_unreachable_endpoint_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """agentrt's own errors (a server not there) are the user's to fix, not a bug: one
    line, its message, no traceback, even with AGENTRT_TRACEBACK unset or set."""
    import agentrt

    message = (
        "endpoint http://127.0.0.1:9/v1 failed after 3 attempt(s): ConnectError: All "
        "connection attempts failed; is a server running at http://127.0.0.1:9/v1? Check the URL"
    )

    def unreachable(args: Any) -> int:
        raise agentrt.EndpointError(message, endpoint="http://127.0.0.1:9/v1", attempts=3)

    monkeypatch.setattr(report_cli, "_report", unreachable)
    for env in ("", "1"):
        monkeypatch.setenv("AGENTRT_TRACEBACK", env)
        assert main(["report", "x.jsonl"]) == 2
        err = capsys.readouterr().err
        assert err == f"agentrt: error: {message}\n"


def test_report_help_names_the_journal_the_demo_writes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``agentrt report --help``'s first example is a file ``agentrt demo`` writes."""
    from agentrt.bench._demo import demo_config
    from agentrt.bench._runner import journal_paths

    cfg = demo_config()
    cfg.journal_dir = Path("results/demo")  # the demo's --out
    written = {str(p) for p in journal_paths(cfg)}
    examples = _help(["report"], capsys).split("examples:")[1].splitlines()
    first = next(line.split()[2] for line in examples if line.strip().startswith("agentrt"))
    assert first in written, (first, written)


def test_sim_serve_passes_the_engine_options(monkeypatch: pytest.MonkeyPatch) -> None:
    import agentrt.sim
    from agentrt.sim import ServedURLs

    seen: dict[str, Any] = {}

    def fake_serve(replicas: int, host: str, port: int, config: Any, **kw: Any) -> None:
        seen.update(replicas=replicas, host=host, port=port, config=config)
        assert kw["log_level"] == "warning"
        kw["on_ready"](ServedURLs("http://127.0.0.1:1/v1", ("http://127.0.0.1:1/replica-0/v1",)))

    monkeypatch.setattr(agentrt.sim, "serve", fake_serve)
    args = ["sim", "serve", "--replicas", "2", "--port", "0", "--replies", "agent"]
    args += ["--gpu-blocks", "512", "--host-blocks", "1024", "--tool-wait-policy", "offload"]
    args += ["--scheduling", "priority", "--preset", "cpu-tiny"]
    assert main(args) == 0
    config = seen["config"]
    assert (seen["replicas"], seen["port"]) == (2, 0)
    assert (config.num_gpu_blocks, config.num_host_blocks) == (512, 1024)
    assert (config.tool_wait_policy, config.scheduling, config.replies) == (
        "offload",
        "priority",
        "agent",
    )
    assert config.model_name == "tiny-llama"  # the preset's
    assert config.served_model_names == ("tiny-llama",)  # and no other name is answered
    assert main([*args, "--served-model-name", "mine", "alias"]) == 0
    assert seen["config"].model_name == "mine"
    assert seen["config"].served_model_names == ("mine", "alias")


def test_sim_serve_prints_the_urls_it_serves() -> None:
    args = [sys.executable, "-m", "agentrt", "sim", "serve", "--port", "0", "--replicas", "2"]
    with subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
    ) as proc:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(4)]
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert lines[0].startswith("serving")
    urls = [line.split()[0] for line in lines[1:]]
    assert urls[0].endswith("/v1") and "/replica-" not in urls[0]
    assert [u.rsplit("/", 2)[-2] for u in urls[1:]] == ["replica-0", "replica-1"]
    assert max(map(len, lines)) <= 81
    assert "Traceback" not in err


def test_bench_against_a_server_that_is_not_there_says_what_to_do() -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on once this closes
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    result = _run("bench", "--endpoint", url, "--jobs", "1")
    _one_line_error(result, f"could not reach {url}", f"is a server running at {url}?")
    assert "a bug" not in result.stderr
