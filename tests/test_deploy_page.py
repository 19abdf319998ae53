"""docs/deploy.md works as written: its Python block runs against two ``sim serve``
replicas (only its URLS and MODEL lines changed, to theirs), reads each replica's KV
capacity from the engine, and journals it; its ``agentrt check`` output is what the
command prints against them (the port aside)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import anyio
import pytest

from agentrt.cli import main
from agentrt.sim import PRESETS, serve_async

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
URLS_LINE = (
    'URLS = ["http://10.0.1.1:8000/v1", "http://10.0.1.2:8000/v1", "http://10.0.1.3:8000/v1"]'
)
MODEL_LINE = 'MODEL = "meta-llama/Llama-3.1-8B-Instruct"'


def _block(language: str) -> str:
    found = re.findall(rf"^```{language}\n(.*?)^```$", PAGE, flags=re.M | re.S)
    assert found, language
    return str(found[0])


def test_the_page_is_linked_from_the_readme_and_the_site() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "(docs/deploy.md)" in readme.split("## Example")[0]  # near the top
    assert "deploy.md" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert PAGE.startswith("# ") and PAGE.split("\n", 2)[2].startswith("```python")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # uvicorn runs on asyncio
async def test_the_code_and_the_check_run_against_sim_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")
    code = _block("python")
    assert code.count(URLS_LINE) == code.count(MODEL_LINE) == 1
    preset = PRESETS["h100-8b"]
    async with anyio.create_task_group() as tg:
        urls = await tg.start(serve_async, 2, "127.0.0.1", 0, preset)
        ours = code.replace(URLS_LINE, f"URLS = {list(urls)!r}")
        ours = ours.replace(MODEL_LINE, f"MODEL = {preset.model_name!r}")
        run = await anyio.run_process([sys.executable, "-c", ours], cwd=tmp_path, check=False)
        status = await anyio.to_thread.run_sync(main, ["check", *urls])
        tg.cancel_scope.cancel()
    assert run.returncode == 0, run.stderr.decode()
    out = run.stdout.decode().splitlines()
    kv = preset.num_gpu_blocks * preset.block_size
    for url, line in zip(urls, out, strict=False):
        printed_url, capacity, source, *_ = line.split()
        assert (printed_url, float(capacity), source) == (url, kv, "engine"), out  # /metrics
    assert re.match(r"job fix-bug \(job-[0-9a-f]+\): ok", out[len(urls)]), out
    (job,) = [json.loads(line) for line in (tmp_path / "agentrt.jsonl").read_text().splitlines()]
    assert job["runtime"]["kv_capacity"] == [kv, kv]
    assert job["runtime"]["load_view"] == "engine"

    assert status == 0
    port = urls.url.split(":")[2].split("/")[0]
    printed = " ".join(capsys.readouterr().out.replace(f":{port}/", ":8000/").split())
    assert printed == " ".join(_block("text").split())
