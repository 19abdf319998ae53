"""The README works verbatim: its Python blocks run, as written, against the server it
tells the reader to start (``agentrt sim serve``), on loopback. Only the port in the URL
is changed (to a free one); nothing else."""

from __future__ import annotations

import inspect
import re
import shlex
import sys
from pathlib import Path

import anyio
import httpx
import pytest

from agentrt.sim import PRESETS, serve, serve_async
from agentrt.sim._serve import served_urls

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
_DEFAULTS = inspect.signature(serve).parameters
SERVED = served_urls(_DEFAULTS["host"].default, _DEFAULTS["port"].default, 1)
"""What ``agentrt sim serve`` serves with its defaults."""
DEFAULT_PORT = _DEFAULTS["port"].default
SERVED_MODEL = PRESETS[_DEFAULTS["preset"].default].model_name


def blocks(language: str) -> list[str]:
    """The README's fenced code blocks in ``language``, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```$", README, flags=re.M | re.S)


def commands() -> list[list[str]]:
    """Every command of the README's bash blocks, as words, comments dropped."""
    out = []
    for block in blocks("bash"):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words:
                out.append(words)
    return out


def test_the_first_lines_install_and_run_the_demo_then_the_tests() -> None:
    first = blocks("bash")[0].splitlines()
    assert len(first) == 4
    venv, install, tests, quick = (shlex.split(line, comments=True) for line in first)
    assert venv[:3] == ["python3", "-m", "venv"] and "Python 3.11 or newer" in first[0]
    assert install[:3] == ["pip", "install", "-e"] and "agentrt demo" in " ".join(install)
    extras = re.fullmatch(r"\.\[(.*)\]", install[3])
    assert extras is not None and "serve" in extras.group(1).split(",")  # for sim serve
    assert "agentrt sim serve" in first[1]
    assert tests == ["bash", "scripts/test.sh"]  # everything, as CI runs it
    assert quick == ["bash", "scripts/test.sh", "--quick"]


def test_the_test_script_has_the_modes_the_readme_names() -> None:
    script = (ROOT / "scripts" / "test.sh").read_text(encoding="utf-8")
    assert "--quick) MODE=quick ;;" in script
    # The arguments reach every pytest pass; none is skipped because some were given.
    assert script.count('"${PYTEST_ARGS[@]}"') >= 3 and "$# -eq 0" not in script
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "exec bash scripts/test.sh </dev/null" in ci  # CI: the full mode


def test_the_readme_names_the_server_its_examples_need_and_links_existing_docs() -> None:
    serve_commands = [c for c in commands() if c[:3] == ["agentrt", "sim", "serve"]]
    assert serve_commands == [["agentrt", "sim", "serve", "--replies", "agent"]]
    python = [c for c in commands() if c[0] == "python"]
    assert python == [["python", "examples/react_agent.py"]]
    assert (ROOT / python[0][1]).is_file()
    links = re.findall(r"\]\((docs/[^)#]+)\)", README)
    assert "docs/sim.md" in links
    assert all((ROOT / link).is_file() for link in links)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # uvicorn runs on asyncio
async def test_python_blocks_run_against_sim_serve(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn")
    code = blocks("python")
    assert code, "the README has a Python example"
    assert all(SERVED.url in block for block in code)
    models = {m for block in code for m in re.findall(r'model="([^"]+)"', block)}
    assert models == {SERVED_MODEL}
    # what the README's command serves: --replies agent on the default preset
    preset = PRESETS[_DEFAULTS["preset"].default].replace(replies="agent")
    async with anyio.create_task_group() as tg:
        urls = await tg.start(serve_async, 1, "127.0.0.1", 0, preset)
        port = int(urls.url.rsplit(":", 1)[1].split("/")[0])
        async with httpx.AsyncClient() as http:
            served = (await http.get(urls.url + "/models")).json()["data"][0]["id"]
        assert served == SERVED_MODEL
        runs = []
        for block in code:
            moved = block.replace(SERVED.url, SERVED.url.replace(f":{DEFAULT_PORT}/", f":{port}/"))
            assert moved.replace(f":{port}/", f":{DEFAULT_PORT}/") == block  # only the port changed
            runs.append(
                await anyio.run_process([sys.executable, "-c", moved], cwd=tmp_path, check=False)
            )
        tg.cancel_scope.cancel()
    for run in runs:
        assert run.returncode == 0, run.stderr.decode()
    out = runs[0].stdout.decode()
    # print(job.report): the job's summary
    assert re.match(r"job fix-bug \(job-[0-9a-f]+\): ok\n", out), out
    assert re.search(r"calls +2 in 1 session, 1 tool wait\n", out), out
    duration = r"([\d.]+ m?s)"
    split = re.search(rf"JCT +{duration}: LLM {duration}, tools {duration}", out)
    assert split, out

    def seconds(text: str) -> float:
        value, unit = text.split()
        return float(value) / (1000 if unit == "ms" else 1)

    jct, llm, tools = (seconds(x) for x in split.groups())
    assert tools >= 0.1 and llm > 0 and jct >= tools  # two real calls and the tool wait
    assert max(map(len, out.splitlines())) <= 80
