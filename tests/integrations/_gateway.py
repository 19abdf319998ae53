"""Running a real gateway (LiteLLM's proxy, SGLang's router) in front of sim replicas.

The gateways are installed by ``scripts/engine_setup.sh``, each in a venv of its own under
``.engine/`` with a stamp holding its version. The replicas are an embedded simulator
(``agentrt sim serve``) whose replies name the replica that wrote them
(``chatcmpl-sim-replica-<i>-<n>``), so a test can tell where each call went. Without a
gateway installed the tests skip with the setup command, except under ``CI=true``, where
they fail.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import anyio
import httpx
import pytest

from agentrt import Runtime
from agentrt.sim._config import resolve_config
from agentrt.testing.vllm_cpu import SETUP_COMMAND, engine_dir

READY_TIMEOUT_S = 240.0
"""A gateway imports for 10-40 s on a busy 2-core machine."""
SESSIONS = 6
TURNS = 4
_REPLICA_OF_ID = re.compile(r"chatcmpl-sim-replica-(\d+)-\d+")


def find_installed(subdir: str, binary: str, version: str) -> Path:
    """``.engine/<subdir>/bin/<binary>`` if engine_setup.sh installed ``version`` there.

    Otherwise the test skips with the setup command, or fails under ``CI=true``."""
    folder = engine_dir() / subdir
    path = folder / "bin" / binary
    try:
        stamp = (folder / f".agentrt-{subdir}-stamp").read_text().strip()
    except OSError:
        stamp = None
    if stamp == version and os.access(path, os.X_OK):
        return path
    message = f"{subdir} {version} is not set up; run `{SETUP_COMMAND}`"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@contextmanager
def running(
    command: Sequence[str],
    log: Path,
    ready_url: str,
    what: str,
    env: dict[str, str] | None = None,
) -> Iterator[None]:
    """Run ``command`` (its own process group, output to ``log``) until ``ready_url``
    answers 200; stop it (SIGTERM, then SIGKILL) when the block exits."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            list(command), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                tail = log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{what} exited with {proc.returncode}:\n{tail}")
            try:
                if httpx.get(ready_url, timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{what} not ready after {READY_TIMEOUT_S:.0f} s:\n{tail}")
            time.sleep(0.5)
        yield
    finally:
        _stop(proc)


@contextmanager
def sim_replicas(folder: Path, replicas: int = 2) -> Iterator[str]:
    """``agentrt sim serve --replicas N``; yields their origin (``/replica-<i>`` under it)."""
    port = free_port()
    origin = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "agentrt", "sim", "serve", f"--replicas={replicas}"]
    # The preset's model name, and "m", the name the gateway tests send.
    served = [resolve_config("h100-8b").model_name, "m"]
    command += [f"--port={port}", "--served-model-name", *served]
    ready = f"{origin}/replica-{replicas - 1}/health"
    with running(command, folder / "sim.log", ready, "the simulator"):
        yield origin


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without Python paths (a gateway has a venv of its own)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.pop("VIRTUAL_ENV", None)
    env.update(extra)
    return env


async def replicas_by_session(
    url: str, dialect: str, *, api_key: str | None = None
) -> dict[str, list[int]]:
    """Run SESSIONS sessions of TURNS calls at once through ``url``; the replica of each
    call, by session id."""
    seen: dict[str, list[int]] = {}
    async with Runtime(url, dialect=dialect, api_key=api_key) as rt:

        async def session(index: int) -> None:
            # Letters, digits and '-' only: LiteLLM reads some headers only with such values.
            sid = re.sub(r"[^a-z0-9]+", "-", f"{dialect}-{index}")
            async with job.session(f"agent-{index}", session_id=sid) as s:
                history = [{"role": "user", "content": f"task {index}: " + "step " * 50}]
                for _ in range(TURNS):
                    reply = await s.chat(model="m", messages=history, max_tokens=4)
                    found = _REPLICA_OF_ID.fullmatch(reply.id)
                    assert found is not None, reply.id
                    seen.setdefault(s.id, []).append(int(found.group(1)))
                    history += [
                        {"role": "assistant", "content": reply.choices[0].message.content or ""},
                        {"role": "user", "content": "go on"},
                    ]

        async with rt.job("gateway-affinity") as job, anyio.create_task_group() as tg:
            for index in range(SESSIONS):
                tg.start_soon(session, index)
    assert job.report.status == "ok"
    assert len(seen) == SESSIONS
    assert all(len(calls) == TURNS for calls in seen.values())
    return seen


def sticky(seen: dict[str, list[int]]) -> bool:
    """Every session's calls went to one replica."""
    return all(len(set(calls)) == 1 for calls in seen.values())
