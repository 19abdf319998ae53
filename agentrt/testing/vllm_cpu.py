"""Start, wait for and stop vLLM CPU replicas for integration tests and benchmarks.

The engine lives in its own virtual environment (vLLM pins many packages), built by
``scripts/engine_setup.sh`` into ``$AGENTRT_ENGINE_DIR`` (default ``<repo>/.engine``), with a
tiny random-weight Llama in ``models/tiny-llama``. This module only uses the standard library: it
runs the engine's python as a subprocess.

Typical use::

    from agentrt.testing.vllm_cpu import SETUP_MESSAGE, ReplicaSpec, find_engine, launch

    if find_engine() is None:
        raise SystemExit(SETUP_MESSAGE)
    with launch([ReplicaSpec(name="a", cpu_bind="0"), ReplicaSpec(name="b", cpu_bind="1")]) as rs:
        print([r.base_url for r in rs])  # http://127.0.0.1:PORT/v1

Every replica listens on 127.0.0.1 only, on a free port, logs to its own file, and runs in its own
process group, which :meth:`ReplicaServer.stop` ends (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TextIO

from ..scheduling._signals import parse_prometheus

__all__ = [
    "DEFAULT_MODEL_NAME",
    "ROUTER_POLICIES",
    "ROUTER_SETUP_MESSAGE",
    "ROUTER_VERSION",
    "SETUP_COMMAND",
    "SETUP_MESSAGE",
    "EngineEnv",
    "EngineStartError",
    "KvEventsSubscriber",
    "ReplicaServer",
    "ReplicaSpec",
    "RouterServer",
    "RouterSpec",
    "engine_dir",
    "find_engine",
    "find_router",
    "launch",
    "launch_router",
    "parse_prometheus",
    "start_replica",
    "start_replicas",
    "start_router",
]

SETUP_COMMAND = "bash scripts/engine_setup.sh"
"""The command that builds the engine environment (vLLM CPU, the tiny model, the router)."""
SETUP_MESSAGE = (
    "the vLLM CPU engine is not set up; run `"
    + SETUP_COMMAND
    + "` from the repository root (about 2 minutes and 3.5 GB in .engine/; "
    "AGENTRT_ENGINE_DIR moves it)"
)
"""What to do when the engine is missing (the message of :class:`EngineStartError`)."""
DEFAULT_MODEL_NAME = "tiny-llama"
"""The name replicas serve the tiny model under."""
STAMP_NAME = "setup.stamp"  # written by scripts/engine_setup.sh once the engine is complete
MODEL_SUBDIR = Path("models") / "tiny-llama"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class EngineStartError(RuntimeError):
    """A replica exited or did not become ready in time. The message ends with its log's tail."""


@dataclass(frozen=True)
class EngineEnv:
    """Where the engine is: the venv's python, the model folder and the engine folder."""

    python: Path
    model: Path
    root: Path


def engine_dir() -> Path:
    """``$AGENTRT_ENGINE_DIR``, else ``.engine`` in the source checkout (or the working folder)."""
    env = os.environ.get("AGENTRT_ENGINE_DIR")
    if env:
        return Path(env).expanduser().resolve()
    repo = Path(__file__).resolve().parents[2]
    if (repo / "pyproject.toml").is_file():
        return repo / ".engine"
    return Path.cwd() / ".engine"


def find_engine(root: Path | None = None) -> EngineEnv | None:
    """The engine environment if ``scripts/engine_setup.sh`` completed there, else None."""
    root = root or engine_dir()
    python = root / "venv" / "bin" / "python"
    model = root / MODEL_SUBDIR
    if not (root / STAMP_NAME).is_file():
        return None
    if not (python.exists() and os.access(python, os.X_OK)):
        return None
    if not (model / "config.json").is_file() or not (model / "tokenizer.json").is_file():
        return None
    return EngineEnv(python=python, model=model, root=root)


@dataclass(frozen=True)
class ReplicaSpec:
    """Options of one replica. Defaults: FCFS, prefix caching on, 1 GiB of KV cache, eager mode.

    ``cpu_bind`` is ``VLLM_CPU_OMP_THREADS_BIND``: ``"0"`` binds the worker to core 0,
    ``"0-1"`` to both, None lets vLLM choose (all cores but one, which it reserves for the API
    server and the engine core). Give each replica of a set its own core: on a small machine a
    worker spread over every core starves the server's other processes (a 1000-token stream
    took 5.5 s instead of 1.6 s on 2 cores), and two workers on one core stall each other.
    ``num_gpu_blocks`` shrinks the KV cache to that many blocks of 128 tokens (at least
    ``max_model_len / 128``). ``kv_events`` publishes KV-cache events on an ``ipc://`` ZMQ
    endpoint (see :attr:`ReplicaServer.kv_events_endpoint`). ``per_request_metrics`` adds a
    ``metrics`` object (``queue_time_ms``, ``time_to_first_token_ms``, ...) to each response.
    ``dev_mode`` sets ``VLLM_SERVER_DEV_MODE``,
    which routes ``POST /reset_prefix_cache``. ``kv_cache_space_gib=None`` leaves
    ``VLLM_CPU_KVCACHE_SPACE`` unset, and vLLM 0.32 then wants 92% of the machine's memory.

    The caller's ``VLLM_*``, ``OMP_*``, ``KMP_*`` and ``GOMP_*`` variables are not passed on, so
    that replicas are reproducible; set what a replica needs in ``extra_env``.
    """

    name: str = "vllm"
    priority_scheduling: bool = False
    prefix_caching: bool = True
    prompt_tokens_details: bool = True
    per_request_metrics: bool = False
    num_gpu_blocks: int | None = None
    kv_cache_space_gib: int | None = 1
    kv_events: bool = False
    kv_events_topic: str = "kv-events"
    max_model_len: int = 4096
    max_num_seqs: int | None = None
    enforce_eager: bool = True
    cpu_bind: str | None = None
    dev_mode: bool = False
    served_model_name: str = DEFAULT_MODEL_NAME
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()

    def args(self) -> list[str]:
        """The server's command-line options that follow from this spec (no host, port, model)."""
        out = ["--served-model-name", self.served_model_name]
        out += ["--max-model-len", str(self.max_model_len)]
        if self.enforce_eager:
            out.append("--enforce-eager")
        out.append(
            "--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching"
        )
        if self.prompt_tokens_details:
            out.append("--enable-prompt-tokens-details")
        if self.per_request_metrics:
            out.append("--enable-per-request-metrics")
        if self.priority_scheduling:
            out += ["--scheduling-policy", "priority"]
        if self.num_gpu_blocks is not None:
            out += ["--num-gpu-blocks-override", str(self.num_gpu_blocks)]
        if self.max_num_seqs is not None:
            out += ["--max-num-seqs", str(self.max_num_seqs)]
        out += list(self.extra_args)
        return out

    def env(self) -> dict[str, str]:
        """Environment variables that follow from this spec."""
        out: dict[str, str] = {}
        if self.kv_cache_space_gib is not None:
            out["VLLM_CPU_KVCACHE_SPACE"] = str(self.kv_cache_space_gib)
        if self.cpu_bind is not None:
            out["VLLM_CPU_OMP_THREADS_BIND"] = self.cpu_bind
        if self.dev_mode:
            out["VLLM_SERVER_DEV_MODE"] = "1"
        out.update(dict(self.extra_env))
        return out


@dataclass(kw_only=True)
class _Server:
    """A server process of the tests' own, in a process group of its own on loopback."""

    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    startup_s: float | None = None
    _log_file: TextIO | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def is_alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.log_path, lines)

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, str]:
        """GET ``url + path``; returns (status, body). Connection errors raise ``OSError``."""
        return _http("GET", self.url + path, timeout=timeout)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``timeout`` s. Idempotent."""
        if self.process.returncode is None or _group_alive(self.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                self.process.poll()
                if self.process.returncode is not None and not _group_alive(self.pid):
                    break
                time.sleep(0.05)
            else:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pid, signal.SIGKILL)
        self._reap(10.0)

    def _reap(self, timeout: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout)
        # Children re-parented to init are reaped by it; give them a moment to go.
        deadline = time.monotonic() + timeout
        while _group_alive(self.pid) and time.monotonic() < deadline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
            time.sleep(0.1)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


@dataclass(kw_only=True)
class ReplicaServer(_Server):
    """One running server. ``base_url`` ends in ``/v1``; ``url`` is the server's root."""

    spec: ReplicaSpec
    kv_events_endpoint: str | None = None
    _ipc_dir: Path | None = field(default=None, repr=False)

    @property
    def model(self) -> str:
        return self.spec.served_model_name

    @property
    def name(self) -> str:
        return self.spec.name

    def metrics(self) -> dict[str, float]:
        """``/metrics`` parsed: each sample name's value summed over its label sets."""
        status, body = self.get("/metrics")
        if status != 200:
            raise RuntimeError(f"{self.url}/metrics answered {status}")
        return parse_prometheus(body)

    def reset_prefix_cache(self) -> None:
        """Empty the prefix cache. Needs ``ReplicaSpec(dev_mode=True)``."""
        status, body = _http("POST", self.url + "/reset_prefix_cache", timeout=30.0)
        if status != 200:
            raise RuntimeError(f"reset_prefix_cache answered {status}: {body[:200]}")

    def memory_bytes(self) -> int:
        """Proportional set size (PSS) of the replica's processes, RSS where PSS is unreadable."""
        total = 0
        for pid in _group_pids(self.pid):
            total += _pss_bytes(pid)
        return total

    def kill(self) -> None:
        """SIGKILL the whole replica at once, as a crash would (for failure tests)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        self._reap(10.0)

    def _reap(self, timeout: float) -> None:
        super()._reap(timeout)
        if self._ipc_dir is not None:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)
            self._ipc_dir = None


def _http(method: str, url: str, *, timeout: float, body: bytes | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, method=method, data=body)
    try:
        with _NO_PROXY.open(req, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        with exc:
            return int(exc.code), exc.read().decode("utf-8", "replace")


def _tail(path: Path, lines: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(text.splitlines()[-lines:])


def _group_pids(pgid: int) -> list[int]:
    pids: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the command name, which is in parentheses and may hold spaces.
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            pids.append(int(entry.name))
    return pids


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies still count for killpg; only live members matter.
    return bool(_group_pids(pgid))


def _pss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _engine_environ(engine: EngineEnv, spec: ReplicaSpec) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
        and not k.startswith(("VLLM_", "OMP_", "KMP_", "GOMP_"))
    }
    cache = engine.root / "cache"
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HOME": str(cache / "hf"),
            "VLLM_CACHE_ROOT": str(cache / "vllm"),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_LOGGING_COLOR": "0",
            "NO_COLOR": "1",
            "PYTHONUNBUFFERED": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    env.update(spec.env())
    return env


def _spawn(spec: ReplicaSpec, engine: EngineEnv, log_dir: Path, port: int) -> ReplicaServer:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{spec.name}-{port}.log"
    cmd = [
        str(engine.python),
        "-m",
        SERVER_MODULE,
        "--model",
        str(engine.model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *spec.args(),
    ]
    ipc_dir: Path | None = None
    endpoint: str | None = None
    if spec.kv_events:
        # A tcp://127.0.0.1:P endpoint makes vLLM's publisher connect, not bind; ipc:// binds,
        # stays on this machine and needs no port.
        ipc_dir = Path(tempfile.mkdtemp(prefix="agentrt-kv-"))
        endpoint = f"ipc://{ipc_dir}/events.sock"
        config = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": endpoint,
            "topic": spec.kv_events_topic,
        }
        cmd += ["--kv-events-config", json.dumps(config)]
    log_file = log_path.open("w", encoding="utf-8")
    log_file.write("$ " + " ".join(cmd) + "\n")
    log_file.flush()
    try:
        process = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=_engine_environ(engine, spec),
            cwd=str(engine.root),
            start_new_session=True,
        )
    except BaseException:
        log_file.close()
        if ipc_dir is not None:
            shutil.rmtree(ipc_dir, ignore_errors=True)
        raise
    return ReplicaServer(
        spec=spec,
        port=port,
        process=process,
        log_path=log_path,
        kv_events_endpoint=endpoint,
        _log_file=log_file,
        _ipc_dir=ipc_dir,
    )


def _ready(replica: ReplicaServer) -> bool:
    try:
        status, _ = replica.get("/health", timeout=2.0)
        if status != 200:
            return False
        status, body = replica.get("/v1/models", timeout=5.0)
    except (OSError, TimeoutError):
        return False
    return status == 200 and replica.model in body


def _wait_ready(replicas: Sequence[ReplicaServer], timeout: float, started: float) -> None:
    pending = list(replicas)
    deadline = started + timeout
    while pending:
        for r in list(pending):
            if not r.is_alive():
                raise EngineStartError(
                    f"vLLM replica {r.name!r} (pid {r.pid}, port {r.port}) exited with code "
                    f"{r.process.returncode} before it was ready; log {r.log_path}:\n"
                    + r.log_tail()
                )
            if _ready(r):
                r.startup_s = time.monotonic() - started
                pending.remove(r)
        if not pending:
            return
        if time.monotonic() > deadline:
            r = pending[0]
            raise EngineStartError(
                f"vLLM replica {r.name!r} (pid {r.pid}, port {r.port}) was not ready after "
                f"{timeout:.0f} s; log {r.log_path}:\n" + r.log_tail()
            )
        time.sleep(0.5)


def _default_log_dir(engine: EngineEnv) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return engine.root / "logs" / f"{stamp}-{os.getpid()}"


def _start_many(
    specs: Sequence[ReplicaSpec],
    engine: EngineEnv,
    log_dir: Path,
    ready_timeout: float,
) -> list[ReplicaServer]:
    started = time.monotonic()
    replicas: list[ReplicaServer] = []
    try:
        for spec in specs:
            replicas.append(_spawn(spec, engine, log_dir, _free_port()))
        _wait_ready(replicas, ready_timeout, started)
    except BaseException:
        for r in replicas:
            r.stop()
        raise
    return replicas


def start_replicas(
    specs: Sequence[ReplicaSpec],
    *,
    engine: EngineEnv | None = None,
    log_dir: Path | None = None,
    ready_timeout: float = 300.0,
) -> list[ReplicaServer]:
    """Start the replicas together and wait until all serve. The caller stops them.

    If one fails to start, all are stopped and :class:`EngineStartError` is raised.
    """
    return _start(specs, engine=engine, log_dir=log_dir, ready_timeout=ready_timeout)


def start_replica(
    spec: ReplicaSpec | None = None,
    *,
    engine: EngineEnv | None = None,
    log_dir: Path | None = None,
    ready_timeout: float = 300.0,
) -> ReplicaServer:
    """Start one replica and wait until it serves. The caller must call
    :meth:`ReplicaServer.stop`."""
    return _start(
        [spec or ReplicaSpec()], engine=engine, log_dir=log_dir, ready_timeout=ready_timeout
    )[0]


def _start(
    specs: Sequence[ReplicaSpec],
    *,
    engine: EngineEnv | None,
    log_dir: Path | None,
    ready_timeout: float,
    attempts: int = 2,
) -> list[ReplicaServer]:
    env = engine or find_engine()
    if env is None:
        raise EngineStartError(SETUP_MESSAGE)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"replica names must differ: {names}")
    folder = log_dir or _default_log_dir(env)
    for attempt in range(attempts):
        try:
            return _start_many(specs, env, folder, ready_timeout)
        except EngineStartError as exc:
            # Another process may have taken the free port between our probe and the bind.
            if attempt + 1 < attempts and "address already in use" in str(exc).lower():
                continue
            raise
    raise AssertionError("unreachable")


@contextlib.contextmanager
def launch(
    specs: Sequence[ReplicaSpec],
    *,
    engine: EngineEnv | None = None,
    log_dir: Path | None = None,
    ready_timeout: float = 300.0,
) -> Iterator[list[ReplicaServer]]:
    """Start the replicas together, wait until all serve, yield them, stop them all on exit.

    ``engine`` defaults to :func:`find_engine`; without one, :class:`EngineStartError` carries
    :data:`SETUP_MESSAGE`. Logs go to ``log_dir`` (default ``<engine>/logs/<time>-<pid>/``), one
    ``<name>-<port>.log`` per replica; they are kept after the replicas stop.
    """
    replicas = _start(specs, engine=engine, log_dir=log_dir, ready_timeout=ready_timeout)
    try:
        yield replicas
    finally:
        for r in replicas:
            r.stop()


_SUBSCRIBER = r"""
import json, os, sys, time
import msgspec, zmq

endpoint, topic = sys.argv[1], sys.argv[2]
ctx = zmq.Context()
sock = ctx.socket(zmq.SUB)
sock.connect(endpoint)
sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
time.sleep(0.3)  # let the subscription reach the publisher
print(json.dumps({"ready": True}), flush=True)
parent = os.getppid()

def plain(x):
    if isinstance(x, bytes):
        return x.hex()
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    return x

while True:
    if not sock.poll(1000):
        if os.getppid() != parent:  # whoever started us is gone
            break
        continue
    frames = sock.recv_multipart()
    seq = int.from_bytes(frames[1], "big") if len(frames) >= 3 else None
    batch = msgspec.msgpack.decode(frames[-1])
    ts, events = batch[0], batch[1]
    for ev in events:
        print(json.dumps({"seq": seq, "ts": ts, "event": plain(ev)}), flush=True)
"""


class KvEventsSubscriber:
    """Collects a replica's KV-cache events (``ReplicaSpec(kv_events=True)``).

    pyzmq and msgspec live in the engine's venv, so a small subscriber runs there and prints one
    JSON line per event; a thread here collects them. Each event is a dict such as
    ``{"type": "BlockStored", "block_hashes": [...], "token_ids": [...], "session_id": "s1"}``
    (bytes hex-encoded; fields at their default omitted). Use as a context manager.
    """

    def __init__(self, replica: ReplicaServer, *, engine: EngineEnv | None = None) -> None:
        if replica.kv_events_endpoint is None:
            raise ValueError(f"replica {replica.name!r} was started without kv_events=True")
        env = engine or find_engine()
        if env is None:
            raise EngineStartError(SETUP_MESSAGE)
        self._cmd = [
            str(env.python),
            "-c",
            _SUBSCRIBER,
            replica.kv_events_endpoint,
            replica.spec.kv_events_topic,
        ]
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Condition()
        self._ready = False
        self._proc: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None
        self._stderr: IO[str] | None = None

    def __enter__(self) -> KvEventsSubscriber:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, timeout: float = 30.0) -> None:
        """Starts the subscriber and waits up to ``timeout`` seconds until it listens;
        raises :class:`RuntimeError` with its error output when it does not."""
        self._stderr = tempfile.TemporaryFile(mode="w+", encoding="utf-8")
        self._proc = subprocess.Popen(
            self._cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            start_new_session=True,
        )
        self._thread = threading.Thread(target=self._read, name="kv-events", daemon=True)
        self._thread.start()
        with self._lock:
            self._lock.wait_for(lambda: self._ready or not self._running(), timeout)
            ready = self._ready
        if not ready:
            err = self.close()
            raise RuntimeError(f"KV events subscriber did not start: {err[-2000:]}")

    def _running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _read(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        for line in proc.stdout:
            try:
                item = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                if item.get("ready"):
                    self._ready = True
                else:
                    event = item.get("event")
                    if isinstance(event, dict):
                        event["_seq"] = item.get("seq")
                        self._events.append(event)
                self._lock.notify_all()
        with self._lock:
            self._lock.notify_all()

    @property
    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._events)

    def wait_for(
        self, predicate: Callable[[Mapping[str, Any]], bool], timeout: float = 10.0
    ) -> list[dict[str, Any]]:
        """Wait until an event satisfies ``predicate``; return all such events ([] on timeout)."""

        def matching() -> list[dict[str, Any]]:
            return [e for e in self._events if predicate(e)]

        with self._lock:
            self._lock.wait_for(lambda: bool(matching()) or not self._running(), timeout)
            return matching()

    def close(self) -> str:
        """Stop the subscriber; returns what it wrote to stderr. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        if proc is not None and proc.stdout is not None:
            proc.stdout.close()
        err = ""
        if self._stderr is not None:
            self._stderr.seek(0)
            err = self._stderr.read()
            self._stderr.close()
            self._stderr = None
        return err


# -- vllm-router in front of the replicas ---------------------------------------------------

ROUTER_VERSION = "0.1.17"
"""The pinned ``vllm-router`` (vllm-project/router) that ``scripts/engine_setup.sh`` installs."""
ROUTER_SUBDIR = Path("router")
ROUTER_STAMP_NAME = ".agentrt-router-stamp"
ROUTER_SETUP_MESSAGE = (
    f"vllm-router {ROUTER_VERSION} is not set up; run `"
    + SETUP_COMMAND
    + "` from the repository root (it installs the router into .engine/router)"
)
"""What to do when vllm-router is missing."""
ROUTER_POLICIES = (
    "random",
    "round_robin",
    "cache_aware",
    "kv_aware",
    "power_of_two",
    "consistent_hash",
    "sticky_least_loaded",
)
"""The routing policies of vllm-router that :class:`RouterSpec` accepts."""


def find_router(root: Path | None = None) -> Path | None:
    """The ``vllm-router`` launcher if ``scripts/engine_setup.sh`` installed it, else None."""
    folder = (root or engine_dir()) / ROUTER_SUBDIR
    binary = folder / "bin" / "vllm-router"
    try:
        stamp = (folder / ROUTER_STAMP_NAME).read_text().strip()
    except OSError:
        return None
    if stamp != ROUTER_VERSION or not os.access(binary, os.X_OK):
        return None
    return binary


@dataclass(frozen=True)
class RouterSpec:
    """Options of one ``vllm-router`` (vllm-project/router) in front of some replicas.

    ``policy`` is its ``--policy`` (default ``cache_aware``, the router's own default).
    ``program_scheduling`` turns on ``--enable-program-scheduling``, with
    ``program_config`` as its ``--program-scheduling-config-json`` when given (e.g.
    ``{"program_scheduling_enable_key": "auto"}``). ``kv_affinity_ttl_s`` is
    ``--kv-aware-session-affinity-ttl-secs`` (``kv_aware`` binds a session to a worker
    for that long after its last request). Retries are off unless ``retries`` is set:
    agentrt retries, and a test should see the replica's answer.
    """

    policy: str = "cache_aware"
    program_scheduling: bool = False
    program_config: tuple[tuple[str, Any], ...] = ()
    kv_affinity_ttl_s: int | None = None
    retries: bool = False
    log_level: str = "info"
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()

    def args(self) -> list[str]:
        """The command-line options that follow from this spec (no host, ports, workers)."""
        if self.policy not in ROUTER_POLICIES:
            raise ValueError(f"unknown router policy {self.policy!r}; one of {ROUTER_POLICIES}")
        out = ["--policy", self.policy, "--log-level", self.log_level]
        if self.program_scheduling:
            out.append("--enable-program-scheduling")
            if self.program_config:
                out += ["--program-scheduling-config-json", json.dumps(dict(self.program_config))]
        elif self.program_config:
            raise ValueError("program_config needs program_scheduling=True")
        if self.kv_affinity_ttl_s is not None:
            out += ["--kv-aware-session-affinity-ttl-secs", str(self.kv_affinity_ttl_s)]
        if not self.retries:
            out.append("--disable-retries")
        # Workers are checked every second while the router starts (the default is 30 s).
        out += ["--worker-startup-check-interval", "1", "--worker-startup-timeout-secs", "120"]
        out += list(self.extra_args)
        return out


@dataclass(kw_only=True)
class RouterServer(_Server):
    """One running ``vllm-router``. ``base_url`` ends in ``/v1``; ``url`` is its root."""

    spec: RouterSpec
    metrics_port: int
    worker_urls: tuple[str, ...]

    def diagnostics(self) -> dict[str, Any]:
        """``GET /scheduling/diagnostics`` (program scheduling on), parsed."""
        status, body = self.get("/scheduling/diagnostics")
        if status != 200:
            raise RuntimeError(f"{self.url}/scheduling/diagnostics answered {status}: {body[:200]}")
        data = json.loads(body)
        if not isinstance(data, dict):
            raise RuntimeError("scheduling diagnostics are not a JSON object")
        return data

    def metrics_text(self) -> str:
        """The router's own Prometheus page (``--prometheus-port``), as text."""
        status, body = _http("GET", f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10.0)
        if status != 200:
            raise RuntimeError(f"the router's /metrics answered {status}: {body[:200]}")
        return body

    def programs(self) -> dict[str, dict[str, Any]]:
        """The programs the scheduler knows, by ``session_id`` (else ``program``), all ranks."""
        out: dict[str, dict[str, Any]] = {}
        for rank in self.diagnostics().get("ranks", []):
            for program in rank.get("programs", []):
                out[str(program.get("session_id") or program.get("program"))] = program
        return out

    def finish_session(self, session_id: str) -> None:
        """``POST /finish_session?session_id=...`` (releases a ``sticky_least_loaded`` session)."""
        query = urllib.parse.urlencode({"session_id": session_id})
        status, body = _http("POST", f"{self.url}/finish_session?{query}", timeout=10.0, body=b"")
        if status != 200:
            raise RuntimeError(f"finish_session answered {status}: {body[:200]}")


def _router_environ(spec: RouterSpec) -> dict[str, str]:
    # The router reaches its workers on loopback: no proxy may stand in between.
    env = {
        k: v
        for k, v in os.environ.items()
        if k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
        and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP", "RUST_LOG")
    }
    env.update({"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"})
    env.update({"NO_COLOR": "1", "PYTHONUNBUFFERED": "1"})
    env.update(dict(spec.extra_env))
    return env


def start_router(
    spec: RouterSpec,
    worker_urls: Sequence[str],
    *,
    binary: Path | None = None,
    log_dir: Path | None = None,
    ready_timeout: float = 60.0,
) -> RouterServer:
    """Start ``vllm-router`` in front of ``worker_urls`` and wait until it routes to all of them.

    A worker URL is a server's root (``http://127.0.0.1:8000``, no ``/v1``): the router
    appends ``/v1/chat/completions``, ``/health`` and ``/metrics`` to it, so a path prefix
    works too (``agentrt sim serve``'s ``http://HOST:PORT/replica-0``). The caller must
    call :meth:`RouterServer.stop`; :func:`launch_router` does.
    """
    exe = binary or find_router()
    if exe is None:
        raise EngineStartError(ROUTER_SETUP_MESSAGE)
    workers = tuple(u.rstrip("/") for u in worker_urls)
    if not workers:
        raise ValueError("a router needs at least one worker URL")
    bad = [u for u in workers if u.endswith("/v1")]
    if bad:
        raise ValueError(f"worker URLs are server roots, without /v1: {bad}")
    args = spec.args()
    folder = log_dir or (engine_dir() / "logs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    folder.mkdir(parents=True, exist_ok=True)
    for attempt in range(2):
        port, metrics_port = _free_port(), _free_port()
        log_path = folder / f"router-{spec.policy}-{port}.log"
        cmd = [
            str(exe),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(metrics_port),
            "--worker-urls",
            *workers,
            *args,
        ]
        log_file = log_path.open("w", encoding="utf-8")
        log_file.write("$ " + " ".join(cmd) + "\n")
        log_file.flush()
        started = time.monotonic()
        try:
            process = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=_router_environ(spec),
                start_new_session=True,
            )
        except BaseException:
            log_file.close()
            raise
        router = RouterServer(
            spec=spec,
            port=port,
            metrics_port=metrics_port,
            worker_urls=workers,
            process=process,
            log_path=log_path,
            _log_file=log_file,
        )
        try:
            _wait_router(router, ready_timeout, started)
        except EngineStartError as exc:
            router.stop()
            if attempt == 0 and "address already in use" in str(exc).lower():
                continue  # another process took a free port between the probe and the bind
            raise
        except BaseException:
            router.stop()
            raise
        return router
    raise AssertionError("unreachable")


def _wait_router(router: RouterServer, timeout: float, started: float) -> None:
    deadline = started + timeout
    while True:
        if not router.is_alive():
            raise EngineStartError(
                f"vllm-router (pid {router.pid}, port {router.port}) exited with code "
                f"{router.process.returncode} before it was ready; log {router.log_path}:\n"
                + router.log_tail()
            )
        try:
            status, body = router.get("/readiness", timeout=2.0)
        except (OSError, TimeoutError):
            status, body = 0, ""
        if status == 200:
            with contextlib.suppress(ValueError):
                ready = json.loads(body)
                if ready.get("healthy_workers") == len(router.worker_urls):
                    router.startup_s = time.monotonic() - started
                    return
        if time.monotonic() > deadline:
            raise EngineStartError(
                f"vllm-router (pid {router.pid}, port {router.port}) was not ready after "
                f"{timeout:.0f} s; log {router.log_path}:\n" + router.log_tail()
            )
        time.sleep(0.1)


@contextlib.contextmanager
def launch_router(
    spec: RouterSpec,
    worker_urls: Sequence[str],
    *,
    binary: Path | None = None,
    log_dir: Path | None = None,
    ready_timeout: float = 60.0,
) -> Iterator[RouterServer]:
    """:func:`start_router`, stopped when the block ends."""
    router = start_router(
        spec, worker_urls, binary=binary, log_dir=log_dir, ready_timeout=ready_timeout
    )
    try:
        yield router
    finally:
        router.stop()


_RENAMED: dict[str, str] = {"Replica": "ReplicaServer", "Router": "RouterServer"}
"""Names of 0.2.0, renamed so that each names one thing (``agentrt.sim.Replica`` is a
simulated replica, ``agentrt.scheduling.Router`` the routing protocol)."""


def __getattr__(name: str) -> Any:
    new = _RENAMED.get(name)
    if new is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import warnings

    warnings.warn(
        f"agentrt.testing.vllm_cpu.{name} is now {new}; the old name goes in 0.4",
        DeprecationWarning,
        stacklevel=2,
    )
    return globals()[new]
