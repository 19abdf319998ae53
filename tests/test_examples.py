"""The examples run as advertised: the ReAct agent's tool loop against the embedded engine
(in process, and as a script against ``agentrt sim serve --replies agent`` on loopback)."""

from __future__ import annotations

import importlib.util
import inspect
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import anyio
import httpx
import pytest

import agentrt
from agentrt.sim import PRESETS, Cluster, serve, serve_async
from agentrt.sim._serve import served_urls

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[1]
AGENT_REPLIES = PRESETS["h100-8b"].replace(replies="agent")
"""What ``agentrt sim serve --replies agent`` serves."""


def load(name: str) -> ModuleType:
    examples = str(ROOT / "examples")
    if examples not in sys.path:  # as running ``python examples/<name>.py`` does
        sys.path.insert(0, examples)
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


async def test_react_agent_runs_a_tool_loop_on_the_embedded_engine() -> None:
    react = load("react_agent")
    async with Cluster(1, AGENT_REPLIES) as cluster:
        seen: list[httpx.Request] = []
        inner = cluster.transport()

        class Recording(httpx.AsyncBaseTransport):
            async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
                seen.append(request)
                return await inner.handle_async_request(request)

        async with agentrt.Runtime(cluster.base_urls, transport=Recording()) as rt:
            answer, report = await react.run_agent(
                rt, "sim-llama-3.1-8b", react.QUESTION, max_steps=8
            )
    assert report.status == "ok"
    # three steps that call tools (the third calls two at once), then the answer
    assert report.calls == 4 and report.tool_waits == 4
    assert [t.name for t in report.tool_reports] == [
        "calculator",
        "word_count",
        "calculator",
        "word_count",
    ]
    assert answer == "17 * 23 = 391; the word counts are in the tool results above."
    bodies = [
        httpx.Response(200, content=r.content).json()
        for r in seen
        if r.url.path.endswith("/chat/completions")
    ]
    assert len(bodies) == 4
    assert all(b["tools"] == react.TOOLS for b in bodies)
    last = bodies[-1]["messages"]
    results = [m["content"] for m in last if m["role"] == "tool"]
    assert results[0] == "391" and results[2] == "782"  # the calculator's real results
    calls = [m for m in last if m["role"] == "assistant"]
    assert [len(m["tool_calls"]) for m in calls] == [1, 1, 2]
    assert report.jct_s >= report.critical_llm_s


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # uvicorn runs on asyncio
async def test_react_agent_script_against_sim_serve(tmp_path: Path) -> None:
    """The script as a user runs it: its defaults are ``sim serve``'s (only the port
    differs here), it writes the report only where ``--report`` says."""
    pytest.importorskip("uvicorn")
    react = load("react_agent")
    defaults = react.arg_parser("x", "q").parse_args([])
    params = inspect.signature(serve).parameters
    default_urls = served_urls(params["host"].default, params["port"].default, 1)
    assert defaults.base_url == default_urls.url
    assert defaults.model == PRESETS[params["preset"].default].model_name
    async with anyio.create_task_group() as tg:
        urls = await tg.start(serve_async, 1, "127.0.0.1", 0, AGENT_REPLIES)
        run = await anyio.run_process(
            [
                sys.executable,
                str(ROOT / "examples" / "react_agent.py"),
                "--base-url",
                urls.url,
                "--report",
                "out/report.json",
            ],
            cwd=tmp_path,
            check=False,
        )
        tg.cancel_scope.cancel()
    out = run.stdout.decode()
    assert run.returncode == 0, out + run.stderr.decode()
    assert '[step 0] calculator({"expression": "17 * 23"}) -> 391' in out
    assert "[step 2] calculator" in out and "[step 3] answer" in out
    assert "status=ok" in out and "calls=4 tool_waits=4" in out
    folder = anyio.Path(tmp_path)
    written = sorted([p.relative_to(folder).as_posix() async for p in folder.rglob("*")])
    assert written == ["out", "out/report.json"]
    report = agentrt.JobReport.model_validate_json(await (folder / "out/report.json").read_text())
    assert report.calls == 4 and report.tool_waits == 4


def test_calculator_is_arithmetic_only() -> None:
    react = load("react_agent")
    assert react.calculator("2 ** 10 - 24") == "1000"
    assert react.calculator("__import__('os')").startswith("error")


def test_react_agent_help_gives_its_whole_first_paragraph() -> None:
    script = ROOT / "examples" / "react_agent.py"
    result = subprocess.run(
        [sys.executable, str(script), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    doc = script.read_text().split('"""')[1]
    first = " ".join(doc.split("\n\n")[0].split())
    assert first.endswith("reads their results, and answers.")
    assert first in text


def _refused_url() -> str:
    import socket

    with socket.socket() as s:  # a port nothing listens on once this closes
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


async def _example(*args: str) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "AGENTRT_TRACEBACK"}
    script = str(ROOT / "examples" / "react_agent.py")
    return await anyio.run_process([sys.executable, script, *args], check=False, env=env)


def _one_line(run: subprocess.CompletedProcess[bytes], *needles: str) -> None:
    err = run.stderr.decode()
    assert run.returncode == 1, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("react_agent.py: error: "), err
    for needle in needles:
        assert needle in err, err


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # uvicorn runs on asyncio
async def test_the_example_ends_a_wrong_url_model_or_server_in_one_line() -> None:
    """Not a chained traceback of 40 to 121 lines with the good line at its end."""
    pytest.importorskip("uvicorn")
    url = _refused_url()
    down = await _example("--base-url", url)
    _one_line(down, "EndpointError: endpoint", f"is a server running at {url}?")
    no_scheme = await _example("--base-url", "127.0.0.1:8000/v1")
    _one_line(no_scheme, "ValueError: endpoint URL", "needs an http:// or https:// scheme")
    assert "AGENTRT_TRACEBACK" not in no_scheme.stderr.decode()  # agentrt's own: no bug
    async with anyio.create_task_group() as tg:
        served = AGENT_REPLIES.replace(served_model_names=(AGENT_REPLIES.model_name,))
        urls = await tg.start(serve_async, 1, "127.0.0.1", 0, served)  # others: 404
        wrong_model = await _example("--base-url", urls.url, "--model", "WRONG")
        wrong_path = await _example("--base-url", urls.url.replace("/v1", "/wrong/v1"))
        tg.cancel_scope.cancel()
    _one_line(wrong_model, "NotFoundError: Error code: 404", "WRONG")
    _one_line(wrong_path, "NotFoundError: Error code: 404", "/wrong/v1")


def test_every_example_ends_its_errors_in_one_line() -> None:
    """Each script runs its main inside ``one_line_errors`` (frameworks' wrapped errors
    are unwrapped to agentrt's or the server's own)."""
    for script in sorted((ROOT / "examples").glob("*_agent.py")):
        tail = script.read_text().split('if __name__ == "__main__":')[1]
        assert tail.lstrip().startswith("with one_line_errors():"), script.name


def test_the_one_line_is_the_servers_own_error_inside_a_frameworks() -> None:
    load("react_agent")
    from _shared import error_line  # type: ignore[import-not-found]

    url = "http://127.0.0.1:9/v1"
    inner = agentrt.EndpointError(f"endpoint {url} failed: is a server running?", endpoint=url)
    try:
        try:
            raise inner
        except agentrt.EndpointError as exc:
            raise RuntimeError("the framework's wrapper") from exc
    except RuntimeError as wrapped:
        group = ExceptionGroup("task group", [wrapped])
    assert error_line(group) == f"EndpointError: endpoint {url} failed: is a server running?"
    assert error_line(KeyError("x")).endswith("(AGENTRT_TRACEBACK=1 shows the traceback)")


async def test_the_adapter_example_maps_its_toy_framework_onto_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/integrations.md's "Write an adapter" example, on the embedded engine: the
    top run is a job, each agent's run a session (the helper's under its caller's), each
    model request a turn of it, each tool call a tool wait in the session that called."""
    example = load("custom_adapter_agent")
    (tmp_path / "README.md").write_text("one two three four\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)  # its word_count reads README.md
    async with Cluster(1, AGENT_REPLIES) as cluster:
        async with agentrt.Runtime(cluster.base_urls, transport=cluster.transport()) as rt:
            answer, report = await example.run_agent(rt, AGENT_REPLIES.model_name, example.QUESTION)
    assert answer == "391; the researcher counted the words."
    assert report.status == "ok" and report.name == "assistant"
    assert report.calls == 5 and report.sessions == 2 and len(rt.reports()) == 1
    assistant, researcher = report.session_reports
    assert (assistant.name, assistant.parent_id) == ("assistant", None)
    assert (researcher.name, researcher.parent_id) == ("researcher", assistant.session_id)
    assert [(c.session_name, c.turn) for c in report.call_reports] == [
        ("assistant", 0),
        ("assistant", 1),
        ("researcher", 0),
        ("researcher", 1),
        ("assistant", 2),
    ]
    assert [(t.name, t.session_id, t.status) for t in report.tool_reports] == [
        ("calculator", assistant.session_id, "ok"),
        ("word_count", researcher.session_id, "ok"),
        ("ask_researcher", assistant.session_id, "ok"),
    ]


async def test_the_adapter_example_ends_every_job_with_its_terminal_status() -> None:
    """A run that raises ends its job ``error`` (its tool wait too); a cancelled one
    ``cancelled``, with the wait still open then ended by the job."""
    example = load("custom_adapter_agent")

    def explode() -> str:
        """Fail."""
        raise RuntimeError("the tool broke")

    async def hang() -> str:
        """Never return."""
        await anyio.sleep_forever()
        return ""

    async with Cluster(1, AGENT_REPLIES) as cluster:
        async with agentrt.Runtime(cluster.base_urls, transport=cluster.transport()) as rt:
            llm = example.model(rt, AGENT_REPLIES.model_name)
            callbacks = [example.instrument(rt)]
            fragile = example.ToyAgent("fragile", llm, [explode], callbacks)
            with pytest.raises(RuntimeError, match="the tool broke"):
                await fragile.run("CALL explode {}\nANSWER never")
            patient = example.ToyAgent("patient", llm, [hang], callbacks)
            with anyio.move_on_after(0.3):
                await patient.run("CALL hang {}\nANSWER never")
    failed, cancelled = rt.reports()
    assert (failed.name, failed.status) == ("fragile", "error")
    assert failed.error == "RuntimeError: the tool broke"
    assert [(t.name, t.status) for t in failed.tool_reports] == [("explode", "error")]
    assert (cancelled.name, cancelled.status) == ("patient", "cancelled")
    assert [(t.name, t.status) for t in cancelled.tool_reports] == [("hang", "cancelled")]
    assert failed.calls == cancelled.calls == 1


def test_the_adapter_in_the_docs_is_the_examples() -> None:
    """docs/integrations.md shows the example's adapter as it runs in the tests above."""
    page = (ROOT / "docs" / "integrations.md").read_text(encoding="utf-8")
    section = page.split("## Write an adapter", 1)[1]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    source = (ROOT / "examples" / "custom_adapter_agent.py").read_text(encoding="utf-8")
    chunks = [c.strip("\n") for c in block.split("\n\n\n")]
    assert len(chunks) >= 4 and "class AgentrtCallbacks(Callbacks):" in block
    for chunk in chunks:
        assert chunk in source, chunk
