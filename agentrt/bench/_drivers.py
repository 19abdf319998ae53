"""Clients that run job plans: ``plain`` (a bare openai client) and agentrt's variants."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal, Protocol

import anyio
import httpx
import openai
from openai.types.chat import ChatCompletionMessageParam

from .._config import Endpoint, redact_userinfo
from .._ids import new_id
from .._platform import give_platform, openai_platform
from .._runtime import Runtime
from ..sim import prompt_for_blocks
from ..sim._app import ReplicaApp
from ..sim._transport import ASGIDispatchTransport
from ..telemetry import CallReport, JobReport, Journal, ToolReport
from ..telemetry._report import union_length
from ._plan import BLOCK_TOKENS, Call, Fanout, JobPlan, SessionPlan

__all__ = [
    "CLIENT_SPEC_HELP",
    "CallResult",
    "ClientSpec",
    "Declare",
    "Driver",
    "JobResult",
    "Prompts",
    "ToolResult",
    "make_driver",
    "plain_report",
]

PromptMode = Literal["sim", "text"]
Api = Literal["openai", "http"]
Declare = Literal["none", "learned", "oracle"]
_DECLARES: Final = ("none", "learned", "oracle")

_WORDS = (
    "alpha beta gamma delta table index value query error test parse build cache agent "
    "token block stream reply model tool call file line code fix run check data list"
).split()


class Prompts:
    """Renders a call's blocks as prompt text.

    ``sim``: the embedded engine's block markers (exact token counts, a few bytes each).
    ``text``: plain words, the same words for the same block id, so that a real engine's
    prefix cache sees the same sharing (token counts are then only approximate).
    """

    def __init__(self, mode: PromptMode, words_per_block: int = BLOCK_TOKENS // 2) -> None:
        self.mode = mode
        self.words_per_block = words_per_block
        """``text`` mode: words per block; tune it so a block is about 64 tokens of the
        engine's tokenizer."""
        self._cache: dict[tuple[str, int], str] = {}

    def _block_text(self, namespace: str, block: int) -> str:
        key = (namespace, block)
        text = self._cache.get(key)
        if text is None:
            rng = random.Random(f"{namespace}:{block}")
            text = " ".join(rng.choice(_WORDS) for _ in range(self.words_per_block)) + "\n"
            if len(self._cache) < 200_000:
                self._cache[key] = text
        return text

    def render(self, call: Call) -> str:
        """The prompt text of ``call``: its shared blocks, its own blocks and its tail."""
        shared, own = call.blocks[: call.shared_blocks], call.blocks[call.shared_blocks :]
        if self.mode == "sim":
            parts = []
            if shared:
                parts.append(prompt_for_blocks(list(shared), BLOCK_TOKENS, namespace="shared"))
            if own or call.tail_tokens:
                parts.append(
                    prompt_for_blocks(
                        list(own),
                        BLOCK_TOKENS,
                        call.tail_tokens,
                        namespace=call.namespace.replace("/", "_"),
                    )
                )
            return "".join(parts) or "hi"
        text = "".join(self._block_text("shared", b) for b in shared)
        text += "".join(self._block_text(call.namespace, b) for b in own)
        return text + " ".join(_WORDS[: max(1, call.tail_tokens // 2)])


@dataclass(slots=True)
class CallResult:
    latency_s: float
    ttft_s: float | None
    start_s: float = 0.0
    """When the call was made, from the job's start (the plain driver's journal)."""
    session_id: str = ""
    session_name: str | None = None
    turn: int = 0
    endpoint: str | None = None
    stream: bool = False
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    after_tool: bool = False
    """The call resumes its session after a tool wait (agentrt drivers)."""


@dataclass(slots=True)
class ToolResult:
    session_id: str
    name: str
    start_s: float
    """From the job's start."""
    duration_s: float
    expected_s: float | None = None
    """What the runtime expected when the wait began (declared or learned)."""


@dataclass(slots=True)
class JobResult:
    name: str
    kind: str
    arrival_s: float
    start_s: float
    jct_s: float
    status: str
    calls: list[CallResult] = field(default_factory=list)
    tools: list[ToolResult] = field(default_factory=list)
    sessions: int = 0
    error: str | None = None
    worker: int = 0
    """The fleet member that ran the job (``BenchConfig.fleet``; 0 without a fleet)."""


_ROUTINGS: Final = ("round_robin", "least_loaded", "session_affinity", "hash")
_ROUTING_ALIASES: Final = {
    "round-robin": "round_robin",
    "rr": "round_robin",
    "least-loaded": "least_loaded",
    "session": "session_affinity",
    "session-affinity": "session_affinity",
}
_POLICIES: Final = ("fcfs", "plas", "atlas", "mlfq", "edf")
_TRUE: Final = ("1", "true", "yes", "on")
_FALSE: Final = ("0", "false", "no", "off")

CLIENT_SPEC_HELP: Final = (
    "'plain' (a bare openai client: every call sent at once, round-robin over replicas), "
    "'plain:session' (the same, naming each call's session in the headers agent harnesses "
    "send and routers read: x-session-id, x-dynamo-session-id, x-claude-code-session-id) or "
    "'agentrt[:OPTIONS]'. OPTIONS: names joined by '+' (a routing: round_robin, "
    "least_loaded, session_affinity, hash, or the aliases round-robin, session; a policy: "
    "fcfs, plas, atlas, mlfq, edf), then optionally '@LIMIT' (per-endpoint concurrency: an "
    "int >= 1, auto, engine (Runtime's default: a cap only while an engine's /metrics "
    "show a queue; the client then polls them every 1 s) or none), then ',key=value' "
    "options: routing=, policy=, concurrency=, "
    "token_budget= (int), priority= (on/off: send each call's queue level as the engine "
    "priority; simulated replicas then schedule by priority), retention= (on/off: the "
    "simulated replicas honour retention directives, as a vLLM built from PR #38514; "
    "also allowed with defaults), load_control= (on/off: Runtime's load control, on by "
    "default; also allowed with defaults), kv_events= (on/off: the runtime reads the "
    "simulated replicas' KV-cache events, Endpoint(kv_events='auto'), in-process: exact "
    "residency for placement; also allowed with defaults), dialect= (default vllm), "
    "declare= (tool waits the sessions declare: learned, the default: each tool's wait "
    "learned online; oracle: the exact next wait; none: nothing), poll= (the engines' "
    "/metrics: none, the default but with @engine; auto, Runtime's default; or seconds), "
    "scheduling= (the simulated replicas' queue order: fcfs, or priority as vLLM's "
    "--scheduling-policy priority; they then advertise it, so Runtime's "
    "send_priority='auto' sends them priorities; default: priority with priority=on, "
    "else fcfs; also allowed with defaults), "
    "config=FILE (a settings "
    "file such as agentrt tune writes: Runtime(config=FILE) decides routing, policy, "
    "concurrency, token_budget, priorities and learned waits, so none of those options "
    "may be given with it; declare= and dialect= may). "
    "'agentrt:defaults': Runtime(urls) as a user gets it, none of those options passed, "
    "so whatever Runtime's defaults are is what is measured (no other option with it "
    "but the replicas' scheduling=, retention=, kv_events= and load_control=, e.g. "
    "agentrt:defaults,scheduling=priority). "
    "Either, then '>PEER': the client sends to one URL, a modelled router in front of the "
    "simulated replicas (agentrt sim serve --gateway list names them; agentrt then speaks "
    "the peer's dialect unless dialect= says another), e.g. plain>vllm-router, "
    "plain:session>thunderagent, agentrt:defaults>vllm-router:consistent_hash. "
    "Examples: agentrt:session, agentrt:defaults, agentrt:plas+round_robin@auto, "
    "agentrt:mlfq@16, agentrt:session+mlfq@engine, agentrt:plas+round_robin,priority=on, "
    "agentrt:routing=hash,policy=plas,concurrency=8, agentrt:config=agentrt-tuned.toml. "
    "Defaults: round_robin, fcfs, no limit."
)

ENGINE_POLL_S: Final = 1.0
"""The metrics poll interval of a client with ``concurrency="engine"`` (``@engine``):
Runtime's adaptive cap sees an engine's queue only through its polled ``/metrics``."""

_REPLICA_OPTIONS: Final = frozenset({"scheduling", "retention", "kv_events", "load_control"})
"""Spec options that describe the simulated replicas (and, for ``kv_events``, whether
the runtime reads what they publish), and load control (``load_control=off`` is the
defaults without it): ``agentrt:defaults`` takes them."""

_FILE_DECIDES: Final = ("routing", "policy", "concurrency", "token_budget", "send_priority")
"""The spec options a settings file (``config=``) sets instead."""

_RUNTIME_DEFAULTS: Final = {
    "routing": "session_affinity",
    "policy": "fcfs",
    "concurrency": "engine",
}
"""Runtime's defaults, shown by a spec that leaves them to Runtime (``config=`` where the
file is silent, ``agentrt:defaults``)."""


def _spec_error(text: str, why: str) -> ValueError:
    return ValueError(
        f"bad client {text!r}: {why}; syntax: 'plain' or "
        "'agentrt[:ROUTING+POLICY][@LIMIT][,key=value...]' (see agentrt bench --help)"
    )


def _routing_name(value: str, text: str) -> str:
    name = _ROUTING_ALIASES.get(value, value)
    if name not in _ROUTINGS:
        raise _spec_error(text, f"unknown routing {value!r}")
    return name


def _policy_name(value: str, text: str) -> str:
    if value not in _POLICIES:
        raise _spec_error(text, f"unknown policy {value!r}")
    return value


def _poll(value: str, text: str) -> float | Literal["auto"] | None:
    if value in ("none", ""):
        return None
    if value == "auto":
        return "auto"
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise _spec_error(text, f"poll must be none, auto or seconds > 0, not {value!r}")
    return seconds


def _concurrency(value: str, text: str) -> int | Literal["auto", "engine"] | None:
    if value in ("none", ""):
        return None
    if value in ("auto", "engine"):
        return "auto" if value == "auto" else "engine"
    try:
        n = int(value)
    except ValueError:
        raise _spec_error(
            text, f"concurrency must be an int >= 1, auto, engine or none, not {value!r}"
        ) from None
    if n < 1:
        raise _spec_error(text, f"concurrency must be >= 1, not {n}")
    return n


@dataclass(frozen=True, slots=True)
class ClientSpec:
    """A client to compare: ``plain``, or agentrt with a routing, an ordering policy and
    per-endpoint admission limits (see :data:`CLIENT_SPEC_HELP` for the text syntax)."""

    name: str
    kind: Literal["plain", "agentrt"]
    routing: str = "round_robin"
    dialect: str = "vllm"
    policy: str = "fcfs"
    concurrency: int | Literal["auto", "engine"] | None = None
    """``"engine"``: Runtime's adaptive cap, with the engines' metrics polled every
    :data:`ENGINE_POLL_S` seconds (without polling it never caps)."""
    token_budget: int | None = None
    send_priority: bool = False
    load_control: bool = True
    """``load_control=off``: ``Runtime(load_control=False)`` (on by default, as in
    Runtime; also allowed with ``defaults``)."""
    retention: bool = False
    """``retention=on``: this client's simulated replicas honour retention directives
    (``EngineConfig.retention_directives``), a property of the replicas, not of the
    runtime, so ``agentrt:defaults`` takes it too."""
    kv_events: bool = False
    """``kv_events=on``: every endpoint is ``Endpoint(url, kv_events="auto")``, so the
    runtime reads the simulated replicas' KV-cache events (in-process) for exact
    residency; ``agentrt:defaults`` takes it too."""
    poll: float | Literal["auto"] | None = None
    """``poll_metrics_s`` (``poll=``): None (no polls; with ``@engine``,
    :data:`ENGINE_POLL_S`), ``"auto"`` (Runtime's default) or seconds."""
    declare: Declare = "learned"
    """Tool-wait declarations: ``learned`` (the runtime learns each tool's wait, as by
    default), ``oracle`` (the exact next tool wait, declared before the call it follows;
    nothing learned), ``none`` (``learn_waits=False``, nothing declared). With
    ``config``, ``learn_waits`` is the file's: ``none`` and ``learned`` then only mean
    that nothing is declared."""
    config: str | None = None
    """A settings file (``config=FILE``): the runtime is built with
    ``Runtime(config=FILE)`` and none of the options above but ``dialect`` and
    ``declare``, so the file decides as where it is applied. The fields above then show
    what the file sets (Runtime's defaults where it is silent)."""
    defaults: bool = False
    """``agentrt:defaults``: the runtime is built as a user gets it, ``Runtime(urls)``
    with only the bench's plumbing (transport, timeout, journal, the vllm dialect), so
    what is measured is whatever Runtime's defaults are. The fields above then show
    Runtime's defaults as of this version, for display only."""

    scheduling: Literal["fcfs", "priority"] | None = None
    """``scheduling=``: the simulated replicas' queue order (``EngineConfig.scheduling``,
    as vLLM's ``--scheduling-policy``); None: ``priority`` where the client always sends
    priorities (``priority=on``), else ``fcfs``. Replicas that schedule by priority
    advertise it, so a runtime with ``send_priority="auto"`` (``agentrt:defaults``)
    sends them its calls' levels."""

    session_headers: bool = False
    """``plain:session``: the plain client names each call's session in
    :data:`SESSION_HEADERS`, as agent harnesses do (Claude Code, Dynamo's Pi adapter),
    so that a session-aware router (``dynamo:affinity``, ``thunderagent``) sees sessions."""

    gateway: str | None = None
    """``CLIENT>PEER``: the client sends to one URL, a modelled peer (a router such as
    ``vllm-router:cache_aware``, :mod:`agentrt.sim.peers`) in front of the embedded
    replicas; agentrt then speaks the peer's dialect unless ``dialect=`` says another."""

    @staticmethod
    def parse(text: str) -> ClientSpec:
        """``plain`` or ``agentrt[:OPTIONS]``, optionally ``>PEER``; a :class:`ValueError`
        says what is wrong."""
        text = text.strip()
        if ">" in text:
            return ClientSpec._behind(text)
        if text == "plain":
            return ClientSpec("plain", "plain")
        if text == "plain:session":
            return ClientSpec("plain:session", "plain", session_headers=True)
        head, sep, rest = text.partition(":")
        if head != "agentrt" or (sep and not rest):
            raise ValueError(
                f"unknown client {text!r}: 'plain', 'plain:session' or "
                "'agentrt[:ROUTING+POLICY][@LIMIT][,key=value...]' (agentrt bench --help "
                "lists the options)"
            )
        fields: dict[str, Any] = {}

        def put(key: str, value: object) -> None:
            if key in fields and fields[key] != value:
                raise _spec_error(text, f"{key} given twice")
            fields[key] = value

        parts = rest.split(",") if rest else []
        if parts and "=" not in parts[0]:
            names, at, limit = parts.pop(0).partition("@")
            for word in filter(None, (w.strip().lower() for w in names.split("+"))):
                if word == "defaults":
                    put("defaults", True)
                elif word in _POLICIES:
                    put("policy", word)
                elif _ROUTING_ALIASES.get(word, word) in _ROUTINGS:
                    put("routing", _routing_name(word, text))
                else:
                    raise _spec_error(text, f"{word!r} is neither a routing nor a policy")
            if at:
                put("concurrency", _concurrency(limit.strip().lower(), text))
        for part in parts:
            key, eq, value = (x.strip() for x in part.partition("="))
            key = key.lower().replace("-", "_")
            if not eq or not key:
                raise _spec_error(text, f"option {part!r} is not key=value")
            low = value.lower()
            if key == "routing":
                put("routing", _routing_name(low, text))
            elif key == "policy":
                put("policy", _policy_name(low, text))
            elif key in ("concurrency", "limit"):
                put("concurrency", _concurrency(low, text))
            elif key == "token_budget":
                try:
                    budget = None if low in ("none", "") else int(low)
                except ValueError:
                    raise _spec_error(text, f"token_budget must be an int, not {value!r}") from None
                if budget is not None and budget < 1:
                    raise _spec_error(text, "token_budget must be >= 1")
                put("token_budget", budget)
            elif key in ("priority", "send_priority"):
                if low not in _TRUE + _FALSE:
                    raise _spec_error(text, f"priority must be on or off, not {value!r}")
                put("send_priority", low in _TRUE)
            elif key in ("load_control", "load"):
                if low not in _TRUE + _FALSE:
                    raise _spec_error(text, f"load_control must be on or off, not {value!r}")
                put("load_control", low in _TRUE)
            elif key == "retention":
                if low not in _TRUE + _FALSE:
                    raise _spec_error(text, f"retention must be on or off, not {value!r}")
                put("retention", low in _TRUE)
            elif key == "kv_events":
                if low not in _TRUE + _FALSE:
                    raise _spec_error(text, f"kv_events must be on or off, not {value!r}")
                put("kv_events", low in _TRUE)
            elif key == "scheduling":
                if low not in ("fcfs", "priority"):
                    raise _spec_error(text, f"scheduling must be fcfs or priority, not {value!r}")
                put("scheduling", low)
            elif key in ("poll", "poll_metrics_s"):
                put("poll", _poll(low, text))
            elif key == "declare":
                if low not in _DECLARES:
                    raise _spec_error(
                        text, f"declare must be one of {', '.join(_DECLARES)}, not {value!r}"
                    )
                put("declare", low)
            elif key == "dialect":
                from ..dialects import get_dialect

                get_dialect(value)  # fails on an unknown dialect
                put("dialect", value)
            elif key == "config":
                if not value:
                    raise _spec_error(text, "config= needs a settings file's path")
                put("config", value)
            else:
                raise _spec_error(text, f"unknown option {key!r}")
        if fields.get("defaults") and len(fields.keys() - _REPLICA_OPTIONS) > 1:
            raise _spec_error(
                text,
                "defaults is Runtime as a user gets it: give no other option with it "
                "(but scheduling=, retention= and kv_events=, the replicas', and "
                "load_control=)",
            )
        if "defaults" in fields:
            fields.update(_RUNTIME_DEFAULTS)
        if "config" in fields:
            fields.update(_from_file(text, fields))
        name = text if rest else "agentrt:round-robin"
        return ClientSpec(name, "agentrt", **fields)

    @staticmethod
    def _behind(text: str) -> ClientSpec:
        from ..sim.peers import peer_dialect, peer_name

        client, _, peer = (x.strip() for x in text.partition(">"))
        if not client or not peer or ">" in peer:
            raise ValueError(f"bad client {text!r}: write CLIENT>PEER, e.g. plain>vllm-router")
        try:
            gateway = peer_name(peer)
        except ValueError as exc:
            raise ValueError(f"bad client {text!r}: {exc}") from None
        spec = ClientSpec.parse(client)
        fields: dict[str, Any] = {"name": f"{spec.name}>{gateway}", "gateway": gateway}
        if spec.kind == "agentrt" and "dialect=" not in client.replace(" ", ""):
            fields["dialect"] = peer_dialect(gateway)
        return dataclasses.replace(spec, **fields)


def _from_file(text: str, fields: dict[str, Any]) -> dict[str, Any]:
    """A ``config=FILE`` spec's fields from the file (checked now, before anything
    runs): what it sets, else Runtime's defaults."""
    both = [k for k in _FILE_DECIDES if k in fields]
    if both:
        raise _spec_error(
            text,
            f"config= sets {both[0].replace('send_', '')} from the file; give either "
            "the file or the options (declare= and dialect= may be combined with it)",
        )
    from .._settings import load_config

    try:
        settings = load_config(fields["config"])
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(f"bad client {text!r}: {exc}") from None
    if "dialect" in fields and "dialect" in settings:
        raise _spec_error(text, "dialect= given and the file sets dialect too")
    out: dict[str, Any] = {
        **{key: settings.get(key, default) for key, default in _RUNTIME_DEFAULTS.items()},
        "token_budget": settings.get("token_budget"),
        # "auto" sends priorities only to replicas that advertise a priority scheduler;
        # the bench gives those only to a client that sends them always.
        "send_priority": settings.get("send_priority") is True,
    }
    return out


class Driver(Protocol):
    async def __aenter__(self) -> Driver: ...
    async def __aexit__(self, *exc: object) -> None: ...
    async def run_job(self, plan: JobPlan, t0: float) -> JobResult: ...


def _extra(real_engine: bool) -> dict[str, Any]:
    # Random-weight models may stop early at EOS; benchmark lengths must be exact.
    return {"ignore_eos": True} if real_engine else {}


class PlainDriver:
    """Today's baseline: one bare ``openai.AsyncOpenAI`` per replica, every call sent at
    once, round-robin over replicas, no tags, no job awareness.

    The round-robin begins at replica ``start`` (0 by default). A plain fleet's workers
    (``BenchConfig.fleet``) begin theirs at independent random replicas, as independent
    client-side balancers do: K workers all starting at replica 0 would send their first
    calls to the same replicas in step."""

    def __init__(
        self,
        urls: list[str],
        transport: httpx.AsyncBaseTransport | None,
        model: str,
        prompts: Prompts,
        real_engine: bool,
        api: Api = "openai",
        journal: Path | None = None,
        start: int = 0,
        session_headers: bool = False,
    ) -> None:
        self._urls = urls
        self._api = api
        self._session_headers = session_headers
        self._journal = Journal(journal) if journal is not None else None
        self._http = httpx.AsyncClient(
            transport=transport
            or httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=None)),
            timeout=httpx.Timeout(3600.0, connect=10.0),
        )
        self._clients = [
            openai.AsyncOpenAI(
                base_url=u,
                api_key="x",
                http_client=self._http,  # type: ignore[arg-type,unused-ignore]
                max_retries=0,
            )
            for u in urls
        ]
        tag = openai_platform()  # no thread hop per first call (agentrt/_platform.py)
        for client in self._clients:
            give_platform(client, tag)
        # In virtual time a plain client's HTTP stack changes no result, only the CPU a
        # replay costs: with api="http" on the embedded engine (a replica or a gateway
        # app per URL), calls go straight to the app (the thin path, _inprocess_chat).
        self._apps: list[tuple[ReplicaApp, str]] | None = None
        if api == "http" and isinstance(transport, ASGIDispatchTransport):
            apps = [transport.replica_app(u) for u in urls]
            if all(a is not None for a in apps):
                self._apps = [a for a in apps if a is not None]
        n = len(urls)
        self._rr = itertools.cycle([(start + i) % n for i in range(n)])
        self._model = model
        self._prompts = prompts
        self._extra = _extra(real_engine)

    async def __aenter__(self) -> PlainDriver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()
        if self._journal is not None:
            self._journal.close()

    async def _session(self, plan: SessionPlan, job: JobResult, job_t0: float) -> None:
        session_id = new_id("sess")
        job.sessions += 1
        turn = 0
        for step in plan.steps:
            if isinstance(step, Fanout):
                async with anyio.create_task_group() as tg:
                    for sub in step.sessions:
                        tg.start_soon(self._session, sub, job, job_t0)
                continue
            if step.wait_s:
                start = anyio.current_time()
                await anyio.sleep(step.wait_s)
                if step.tool:
                    now = anyio.current_time()
                    job.tools.append(ToolResult(session_id, step.tool, start - job_t0, now - start))
            i = next(self._rr)
            start = anyio.current_time()
            names = {h: session_id for h in SESSION_HEADERS} if self._session_headers else None
            if self._apps is not None:
                body = _body(self._model, self._prompts, step, self._extra)
                usage = self._journal is not None
                call = await _inprocess_chat(*self._apps[i], body, step.stream, usage, names)
            elif self._api == "http":
                body = _body(self._model, self._prompts, step, self._extra)
                usage = self._journal is not None
                call = await _http_chat(self._http, self._urls[i], body, step.stream, usage, names)
            else:
                client = self._clients[i]
                usage = self._journal is not None
                call = await _call(
                    client, self._model, self._prompts, step, self._extra, usage, names
                )
            call.start_s = start - job_t0
            call.session_id, call.session_name, call.turn = session_id, plan.name, turn
            call.endpoint, call.stream = self._urls[i], step.stream
            job.calls.append(call)
            turn += 1

    async def run_job(self, plan: JobPlan, t0: float) -> JobResult:
        started_at = datetime.now(UTC)
        start = anyio.current_time()
        job = JobResult(plan.name, plan.kind, plan.arrival_s, start - t0, 0.0, "ok")
        try:
            await self._session(plan.root, job, start)
        except Exception as exc:
            job.status = f"error: {type(exc).__name__}"
            job.error = f"{type(exc).__name__}: {exc}"
        job.jct_s = anyio.current_time() - start
        if self._journal is not None:
            self._journal.write(plain_report(job, started_at=started_at, model=self._model))
        return job


def plain_report(
    job: JobResult, *, started_at: datetime, model: str | None, client: str = "plain"
) -> JobReport:
    """A :class:`JobReport` from what the plain driver measured, for the journal: the
    same fields as agentrt's where the plain client knows them (no queue, one attempt per
    call, tokens only where the reply carried usage). Like the agentrt driver's jobs it is
    named by the job's kind, with the plan's name and the client in its metadata."""
    failed = job.status != "ok"
    calls = [
        CallReport(
            call_id=new_id("call"),
            session_id=c.session_id,
            session_name=c.session_name,
            turn=c.turn,
            endpoint=c.endpoint and redact_userinfo(c.endpoint),  # no user:password@
            path="/chat/completions",
            model=model,
            stream=c.stream,
            start_s=c.start_s,
            ttft_s=c.ttft_s,
            latency_s=c.latency_s,
            prompt_tokens=c.prompt_tokens,
            completion_tokens=c.completion_tokens,
            cached_tokens=c.cached_tokens,
            attempts=1,
            http_status=200,
        )
        for c in job.calls
    ]
    tools = [
        ToolReport(session_id=w.session_id, name=w.name, start_s=w.start_s, duration_s=w.duration_s)
        for w in job.tools
    ]
    job_id = new_id("job")
    return JobReport(
        job_id=job_id,
        name=job.kind,
        program_id=job_id,
        status="error" if failed else "ok",
        error=job.error and redact_userinfo(job.error) if failed else None,
        started_at=started_at,
        jct_s=job.jct_s,
        llm_s=sum(c.latency_s for c in job.calls),
        critical_llm_s=union_length([(c.start_s, c.start_s + c.latency_s) for c in job.calls]),
        queue_s=0.0,
        tool_s=sum(w.duration_s for w in job.tools),
        calls=len(calls),
        tool_waits=len(tools),
        sessions=job.sessions,
        prompt_tokens=sum(c.prompt_tokens or 0 for c in job.calls),
        completion_tokens=sum(c.completion_tokens or 0 for c in job.calls),
        cached_tokens=sum(c.cached_tokens or 0 for c in job.calls),
        retries=0,
        metadata={"plan": job.name, "client": client},
        call_reports=calls,
        tool_reports=tools,
    )


def _body(model: str, prompts: Prompts, step: Call, extra: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompts.render(step)}],
        "max_tokens": step.output_tokens,
        **extra,
    }
    if step.stream:
        body["stream"] = True
    return body


def _result(latency_s: float, ttft_s: float | None, stream: bool, usage: Any) -> CallResult:
    """A call's result; token counts from an openai ``usage`` object or JSON dict."""
    if usage is None:
        return CallResult(latency_s, ttft_s, stream=stream)
    if isinstance(usage, dict):
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    else:
        details = getattr(usage, "prompt_tokens_details", None)
        cached = getattr(details, "cached_tokens", None) if details is not None else None
        prompt, completion = usage.prompt_tokens, usage.completion_tokens
    return CallResult(
        latency_s,
        ttft_s,
        stream=stream,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=cached,
    )


async def _http_chat(
    http: httpx.AsyncClient,
    base_url: str,
    body: dict[str, Any],
    stream: bool,
    usage: bool = False,
    headers: dict[str, str] | None = None,
) -> CallResult:
    """One chat call as raw HTTP (no openai object parsing): the bench's fast path.
    ``usage``: read the token counts (a stream asks for its usage chunk), as a client
    that keeps a journal does, so that every call of the journal has them. ``headers``:
    extra request headers."""
    url = base_url + "/chat/completions"
    start = anyio.current_time()
    ttft = None
    tokens = None
    if stream:
        if usage:
            body = {**body, "stream_options": {"include_usage": True}}
        async with http.stream("POST", url, json=body, headers=headers) as resp:
            resp.raise_for_status()
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                if ttft is None:
                    ttft = anyio.current_time() - start
                if line[5:].strip() == "[DONE]":  # "data: [DONE]" or "data:[DONE]" (SSE)
                    break
                if usage and '"usage"' in line:
                    tokens = _event_usage(line.encode()) or tokens
    else:
        resp = await http.post(url, json=body, headers=headers)
        resp.raise_for_status()
        if usage:
            tokens = resp.json().get("usage")
    return _result(anyio.current_time() - start, ttft, stream, tokens)


def _event_usage(line: bytes) -> dict[str, Any] | None:
    """The ``usage`` of one SSE ``data:`` line, if it carries one."""
    if not line.startswith(b"data:") or b'"usage"' not in line:
        return None
    event = json.loads(line[5:])
    found = event.get("usage") if isinstance(event, dict) else None
    return found if isinstance(found, dict) else None


_INPROCESS_HEADERS: Final = [(b"content-type", b"application/json")]

SESSION_HEADERS: Final = ("x-session-id", "x-dynamo-session-id", "x-claude-code-session-id")
"""The headers a ``plain:session`` client names its session in: vLLM's and llm-d's,
Dynamo's (its agent context), and the one Claude Code sends (llm-d's agent identity)."""


async def _inprocess_chat(
    app: ReplicaApp,
    base_path: str,
    body: dict[str, Any],
    stream: bool,
    usage: bool = False,
    headers: dict[str, str] | None = None,
) -> CallResult:
    """:func:`_http_chat` without the HTTP client: the same request handed to the
    embedded replica's (or gateway's) app and its reply read as sent (the same bytes, the
    same error on an error status, TTFT at the first event)."""
    path = base_path + "/chat/completions"
    if stream and usage:
        body = {**body, "stream_options": {"include_usage": True}}
    data = json.dumps(body).encode()
    start = anyio.current_time()
    ttft = None
    tokens = None
    sent = _INPROCESS_HEADERS
    if headers:
        sent = sent + [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    reply = await app.respond("POST", path, sent, data)
    chunks = reply.stream
    if reply.status >= 400:
        if chunks is not None:
            chunks.close()
        request = httpx.Request("POST", "http://inprocess" + path)
        response = httpx.Response(reply.status, content=reply.body, request=request)
        response.raise_for_status()
    if chunks is not None:
        try:
            async for chunk in chunks:
                if ttft is None and b"data:" in chunk:
                    ttft = anyio.current_time() - start
                if usage and b'"usage"' in chunk:
                    for line in chunk.split(b"\n"):
                        tokens = _event_usage(line) or tokens
                if b"[DONE]" in chunk:
                    break
        finally:
            chunks.close()
    elif usage:
        tokens = json.loads(reply.body).get("usage")
    return _result(anyio.current_time() - start, ttft, stream, tokens)


async def _call(
    client: openai.AsyncOpenAI,
    model: str,
    prompts: Prompts,
    step: Call,
    extra: dict[str, Any],
    usage: bool = False,
    headers: dict[str, str] | None = None,
) -> CallResult:
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": prompts.render(step)}]
    start = anyio.current_time()
    ttft = None
    if step.stream:
        stream = await client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=step.output_tokens,
            stream=True,
            extra_body={**extra, "stream_options": {"include_usage": True}} if usage else extra,
            extra_headers=headers,
        )
        tokens = None
        async for chunk in stream:
            if ttft is None:
                ttft = anyio.current_time() - start
            tokens = chunk.usage or tokens
        return _result(anyio.current_time() - start, ttft, True, tokens)
    reply = await client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=step.output_tokens,
        extra_body=extra,
        extra_headers=headers,
    )
    return _result(anyio.current_time() - start, None, False, reply.usage)


class _Direct:
    """:func:`_http_chat` through ``rt.http_client()``'s transport without the client:
    the request an ``httpx.AsyncClient`` builds (its default headers, the runtime's
    timeouts, the JSON body), handed to agentrt's transport, the reply read to its last
    event. For virtual-time replays, where the client's CPU changes no result."""

    def __init__(self, rt: Runtime, base_url: str) -> None:
        client = rt.http_client()  # only for its defaults: never sends
        self._mod: Any = rt._lib.mod  # httpx2 or httpx, as the runtime's client
        self._transport = rt._http_transport()
        self._url = self._mod.URL(base_url + "/chat/completions")
        self._headers = [
            (k, v) for k, v in client.headers.raw if k.lower() not in (b"content-length",)
        ]
        self._extensions = {"timeout": client.timeout.as_dict()}

    async def chat(self, body: dict[str, Any], stream: bool) -> None:
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        content = data.encode()
        headers = [
            *self._headers,
            (b"Content-Length", str(len(content)).encode()),
            (b"Content-Type", b"application/json"),
        ]
        request = self._mod.Request(
            "POST", self._url, headers=headers, content=content, extensions=self._extensions
        )
        response = await self._transport.handle_async_request(request)
        response.request = request
        try:
            response.raise_for_status()
            if stream:
                async for chunk in response.aiter_bytes():
                    if b"[DONE]" in chunk:
                        break
            else:
                await response.aread()
        finally:
            await response.aclose()


class AgentrtDriver:
    """agentrt: jobs, sessions and tool waits, tagged and routed by the runtime."""

    def __init__(
        self,
        spec: ClientSpec,
        urls: list[str],
        transport: httpx.AsyncBaseTransport | None,
        model: str,
        prompts: Prompts,
        real_engine: bool,
        api: Api = "openai",
        journal: Path | None = None,
    ) -> None:
        self._api = api
        self._url = urls[0]
        self._transport = transport
        self._direct: _Direct | None = None
        self._name = spec.name
        self._declare = spec.declare
        self._http: httpx.AsyncClient | None = None
        self._resumed: dict[str, set[tuple[str, int]]] = {}
        """Per job id: the (session id, turn) of calls that follow a tool wait."""
        common: dict[str, Any] = {
            "transport": transport,
            "timeout_s": 3600.0,
            "keep_reports": 0,
            "journal": journal,
        }
        self._ends: Any = None
        if spec.gateway == "vllm-router:sticky_least_loaded":
            # As its users run it: each session's end releases it at the router.
            from ..dialects import vllm_router_session_ends

            self._ends = vllm_router_session_ends(urls[0], transport=transport)
        self._common = common
        self._spec = spec
        self._urls = urls
        self._rt = self._runtime(())
        self._model = model
        self._prompts = prompts
        self._extra = _extra(real_engine)

    def _runtime(self, hooks: Sequence[Any]) -> Runtime:
        spec = self._spec
        urls: list[Any] = list(self._urls)
        if spec.kv_events:
            urls = [Endpoint(u, kv_events="auto") for u in urls]
        common = {**self._common, **({"hooks": tuple(hooks)} if hooks else {})}
        if spec.config is not None:
            # As where the file is applied: the file's settings, Runtime's defaults
            # where it is silent (the bench's dialect unless it names one).
            from .._settings import load_config

            if "dialect" not in load_config(spec.config):
                common["dialect"] = spec.dialect
            return Runtime(urls, config=spec.config, **common)
        if not spec.load_control:
            common["load_control"] = False
        if spec.defaults:
            # As a user gets it: nothing but the bench's plumbing and dialect.
            return Runtime(urls, dialect=spec.dialect, **common)
        poll = spec.poll
        if poll is None and spec.concurrency == "engine":
            poll = ENGINE_POLL_S
        return Runtime(
            urls,
            routing=spec.routing,
            dialect=spec.dialect,
            policy=spec.policy,
            concurrency=spec.concurrency,
            token_budget=spec.token_budget,
            send_priority=spec.send_priority,
            poll_metrics_s=poll,
            learn_waits=spec.declare == "learned",
            **common,
        )

    @property
    def runtime(self) -> Runtime:
        """The runtime the jobs run on (the bench's view sampler reads its router)."""
        return self._rt

    async def __aenter__(self) -> AgentrtDriver:
        if self._ends is not None:
            self._rt = self._runtime([await self._ends.__aenter__()])
        await self._rt.__aenter__()
        self._http = self._rt.http_client()
        if self._api == "http" and isinstance(self._transport, ASGIDispatchTransport):
            # Virtual time: the requests go to agentrt's transport directly (its routing,
            # admission, tagging and reports as in production; no HTTP client above it).
            self._direct = _Direct(self._rt, self._url)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None:
            await self._http.aclose()
        await self._rt.__aexit__(None, None, None)
        if self._ends is not None:
            await self._ends.__aexit__(None, None, None)

    async def _session(self, job: Any, plan: SessionPlan, parent: Any) -> None:
        oracle = self._declare == "oracle"
        resumed = self._resumed.setdefault(job.id, set())
        # A fan-out's sessions block their parent (it waits for the task group).
        blocks = None if parent is None else True
        async with job.session(plan.name, parent=parent, blocks_parent=blocks) as s:
            steps = plan.steps
            last = max((i for i, step in enumerate(steps) if isinstance(step, Call)), default=-1)
            for i, step in enumerate(steps):
                if isinstance(step, Fanout):
                    async with anyio.create_task_group() as tg:
                        for sub in step.sessions:
                            tg.start_soon(self._session, job, sub, s)
                    continue
                if step.wait_s:
                    if step.tool:
                        expected = step.wait_s if oracle else None
                        async with s.tool(step.tool, expected_s=expected):
                            await anyio.sleep(step.wait_s)
                        resumed.add((s.id, s.turns))
                    else:
                        await anyio.sleep(step.wait_s)
                if oracle:
                    # The exact tool wait that follows this call (none: a think time, a
                    # fan-out or the end; an undeclared session keeps today's LRU).
                    after = steps[i + 1] if i + 1 < len(steps) else None
                    if isinstance(after, Call) and after.tool and after.wait_s:
                        s.expect_idle(after.wait_s)
                    if i == last:  # the session's last call: servers may end it there
                        s.expect_final()
                if self._api == "http":
                    # rt.http_client() requests inside a session are that session's turns.
                    assert self._http is not None
                    body = _body(self._model, self._prompts, step, self._extra)
                    if step.stream:  # the usage chunk gives the report its cached tokens
                        body["stream_options"] = {"include_usage": True}
                    if self._direct is not None:
                        await self._direct.chat(body, step.stream)
                    else:
                        await _http_chat(self._http, self._url, body, step.stream)
                    continue
                messages = [{"role": "user", "content": self._prompts.render(step)}]
                if step.stream:
                    stream = await s.chat(
                        model=self._model,
                        messages=messages,
                        max_tokens=step.output_tokens,
                        stream=True,
                        stream_options={"include_usage": True},
                        extra_body=self._extra,
                    )
                    async for _ in stream:
                        pass
                else:
                    await s.chat(
                        model=self._model,
                        messages=messages,
                        max_tokens=step.output_tokens,
                        extra_body=self._extra,
                    )

    async def run_job(self, plan: JobPlan, t0: float) -> JobResult:
        start = anyio.current_time()
        status = "ok"
        error = None
        try:
            # Named by kind, so that reports and metrics group jobs of a kind together.
            metadata = {"plan": plan.name, "client": self._name}
            async with self._rt.job(plan.kind, metadata=metadata) as job:
                await self._session(job, plan.root, None)
        except Exception as exc:
            status = f"error: {type(exc).__name__}"
            error = redact_userinfo(f"{type(exc).__name__}: {exc}")
        rep = job.report
        resumed = self._resumed.pop(job.id, set())
        calls = [
            CallResult(
                c.latency_s or 0.0,
                c.ttft_s,
                start_s=c.start_s,
                session_id=c.session_id,
                session_name=c.session_name,
                turn=c.turn,
                endpoint=c.endpoint,
                stream=c.stream,
                prompt_tokens=c.prompt_tokens,
                completion_tokens=c.completion_tokens,
                cached_tokens=c.cached_tokens,
                after_tool=(c.session_id, c.turn) in resumed,
            )
            for c in rep.call_reports
        ]
        tools = [
            ToolResult(w.session_id, w.name, w.start_s, w.duration_s, w.expected_s)
            for w in rep.tool_reports
        ]
        return JobResult(
            plan.name,
            plan.kind,
            plan.arrival_s,
            start - t0,
            rep.jct_s,
            status,
            calls,
            tools,
            error=error,
        )


def make_driver(
    spec: ClientSpec,
    urls: list[str],
    transport: httpx.AsyncBaseTransport | None,
    model: str,
    prompts: Prompts,
    real_engine: bool,
    api: Api = "openai",
    journal: Path | None = None,
    *,
    start: int = 0,
) -> Driver:
    """A driver for ``spec``. ``api="openai"`` calls through the openai client (what agent
    code does); ``api="http"`` posts the same JSON through an HTTP client (agentrt's
    ``rt.http_client()``), skipping openai's per-call object parsing, for large replays.
    ``journal``: a JSON-lines file that receives one :class:`JobReport` per job (agentrt's
    own journal; for ``plain``, reports built from what the driver measured).
    ``start``: the replica a plain client's round-robin begins at (agentrt routes by its
    own router)."""
    if api not in ("openai", "http"):
        raise ValueError(f"api must be 'openai' or 'http', got {api!r}")
    if spec.kind == "plain":
        return PlainDriver(
            urls,
            transport,
            model,
            prompts,
            real_engine,
            api,
            journal,
            start,
            session_headers=spec.session_headers,
        )
    return AgentrtDriver(spec, urls, transport, model, prompts, real_engine, api, journal)
