"""The OpenAI-compatible HTTP face of a replica: a small raw ASGI application.

Routes: ``POST /v1/chat/completions`` and ``POST /v1/completions`` (both with ``stream``),
``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus text, vLLM metric names).
Requests are read like vLLM reads them: body ``priority`` (lower first; an error unless the
replica schedules by priority) and ``session_id``, header ``X-Request-Id`` as the request id;
plus agentrt's ``x-agentrt`` header (read with ``parse_agentrt_header``): its session, its
priority (used when the body has no ``priority``) and its expected idle (the tool wait that
follows the reply, which drives the KV tool-wait policy).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import operator
import weakref
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final, Protocol

import anyio

from .._protocol import HEADER, CallMetadata, parse_agentrt_header
from ._engine import ABORTED, Engine, ReplicaStats, RequestRejected, SimRequest
from ._replies import ScriptedReply, agent_reply
from ._tokenize import Prompt, PromptError, output_text

__all__ = ["INPROCESS_EXTENSION", "ASGIApp", "ClusterApp", "ReplicaApp", "Scope"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

INPROCESS_EXTENSION: Final = "agentrt.sim.inprocess"
"""Scope extension set by the in-process transport: it cancels the app itself when the
client goes away, so the app needs no disconnect watcher."""

_CREATED_EPOCH: Final = 1_700_000_000
"""``created`` timestamps are this epoch plus the engine clock (never the wall clock)."""

_JSON_HEADERS: Final = [(b"content-type", b"application/json")]
_SSE_HEADERS: Final = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]
_ACCEPT_HEADER: Final = (b"x-agentrt-accept", b"idle-notice")
"""Advertised on generation replies: this endpoint takes tool-start notices."""
_ACCEPT_PRIORITY: Final = (b"x-agentrt-accept", b"idle-notice, priority")
"""The same from a replica that schedules by priority (``send_priority='auto'`` then
passes priorities to it)."""
_NOTICE_PATH: Final = "/v1/agentrt/idle"
"""Tool-start notices: ``POST {base URL}/agentrt/idle`` (protocol v2)."""
_NOTICE_SOURCES: Final = (None, "declared", "learned")


class _HTTPError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        kind: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind
        """The error's ``type`` (default: by status, as vLLM names them)."""
        self.code = code
        """The error's ``code`` (default: the status)."""


_ERROR_TYPES: Final = {
    400: "BadRequestError",
    404: "NotFoundError",
    405: "MethodNotAllowed",
    503: "ServiceUnavailableError",
}


def _error_body(e: _HTTPError) -> bytes:
    return json.dumps(
        {
            "error": {
                "message": e.message,
                "type": e.kind or _ERROR_TYPES.get(e.status, "InternalServerError"),
                "param": e.param,
                "code": e.code or e.status,
            }
        }
    ).encode()


NO_DIRECTIVES_HINT: Final = (
    "[agentrt sim: no CALL/ANSWER directive in the last user message, so filler text "
    'follows; see docs/sim.md, "Scripted replies"]'
)
"""The first line of a ``replies="agent"`` reply to a chat without directives."""
_HINT_HEADER: Final = (
    b"x-agentrt-sim-hint",
    b'no CALL/ANSWER directive in the last user message: filler text (docs/sim.md, "Scripted '
    b'replies")',
)


def _filler(num_tokens: int, hint: bool) -> str:
    """A reply's filler text, starting with :data:`NO_DIRECTIVES_HINT` when ``hint``
    (the same length either way: 4 characters a token)."""
    text = output_text(num_tokens)
    return (NO_DIRECTIVES_HINT + "\n" + text)[: len(text)] if hint else text


async def _send_bytes(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


class _Disconnected(Exception):
    """The client went away before its request body arrived."""


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise _Disconnected
        chunk = msg.get("body", b"")
        if chunk:
            chunks.append(chunk)
        if not msg.get("more_body", False):
            return b"".join(chunks)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


_WANTED: Final = frozenset({HEADER, "x-session-id", "x-request-id"})


def _headers_dict(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """The request headers the app reads, by lower-case name."""
    out: dict[str, str] = {}
    for k, v in headers:
        name = k.decode("latin-1").lower()
        if name in _WANTED:
            out[name] = v.decode("latin-1")
    return out


class ReplyStream(Protocol):
    """A streamed reply's chunks (an :class:`SSEStream`, or a gateway's wrapper of one)."""

    def __aiter__(self) -> ReplyStream: ...

    async def __anext__(self) -> bytes: ...

    def close(self) -> None: ...


class Reply:
    """A response: status, headers, and either the whole body or a stream of chunks."""

    __slots__ = ("body", "headers", "status", "stream")

    def __init__(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]],
        body: bytes = b"",
        stream: ReplyStream | None = None,
    ) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.stream = stream


def _json_reply(status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> Reply:
    headers = [*_JSON_HEADERS, *(extra or []), (b"content-length", str(len(body)).encode())]
    return Reply(status, headers, body)


class ReplicaApp:
    """The ASGI application of one replica.

    :meth:`respond` is the application proper (request in, :class:`Reply` out); the ASGI
    ``__call__`` adapts it to ASGI, and the in-process transport calls it directly.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._ids = itertools.count(1)
        self.kv_event_sources: list[dict[str, Any]] | None = None
        """What ``GET /kv_event_sources`` lists (where its KV-cache events are published:
        ``agentrt sim serve --kv-events-port``); None: a 404, nothing is published."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            body = await _read_body(receive)
        except _Disconnected:
            return
        if scope["method"] != "POST" or INPROCESS_EXTENSION in scope.get("extensions", {}):
            await self._serve(scope, body, send)
            return
        # Generation: cancel it if the client disconnects meanwhile.
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                while True:
                    msg = await receive()
                    if msg["type"] == "http.disconnect":
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(watch)
            try:
                await self._serve(scope, body, send)
            finally:
                tg.cancel_scope.cancel()

    wants_query = False
    """Whether :meth:`respond` takes the path with its ``?query`` (a gateway's control
    endpoints read it; a replica reads none)."""

    async def _serve(self, scope: Scope, body: bytes, send: Send) -> None:
        path: str = scope["path"]
        query = scope.get("query_string", b"")
        if self.wants_query and query:
            path = f"{path}?{query.decode('latin-1')}"
        reply = await self.respond(scope["method"], path, scope.get("headers", []), body)
        await send(
            {"type": "http.response.start", "status": reply.status, "headers": reply.headers}
        )
        stream = reply.stream
        if stream is None:
            await send({"type": "http.response.body", "body": reply.body, "more_body": False})
            return
        try:
            async for chunk in stream:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            stream.close()

    async def respond(
        self, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> Reply:
        """Answer one request. A streamed reply's chunks come from ``reply.stream``; close
        it (``stream.close()``) if it is not read to the end."""
        try:
            if path in ("/v1/chat/completions", "/v1/completions"):
                if method != "POST":
                    raise _HTTPError(405, f"{method} is not allowed on {path}")
                return await self._generate(path, headers, body)
            if path == _NOTICE_PATH:
                if method != "POST":
                    raise _HTTPError(405, f"{method} is not allowed on {path}")
                return self._idle_notice(body)
            if method != "GET":
                raise _HTTPError(405, f"{method} is not allowed on {path}")
            if path == "/health":
                return Reply(200, [(b"content-length", b"0")])
            if path == "/v1/models":
                return _json_reply(200, self._models())
            if path == "/metrics":
                text = render_metrics(self.engine).encode()
                return Reply(
                    200,
                    [
                        (b"content-type", b"text/plain; version=0.0.4; charset=utf-8"),
                        (b"content-length", str(len(text)).encode()),
                    ],
                    text,
                )
            if path == "/version":
                return _json_reply(200, b'{"version":"agentrt-sim"}')
            if path == "/kv_event_sources" and self.kv_event_sources is not None:
                return _json_reply(200, json.dumps(self.kv_event_sources).encode())
            raise _HTTPError(404, f"no route {path}")
        except _HTTPError as e:
            return _json_reply(e.status, _error_body(e))

    def _idle_notice(self, raw: bytes) -> Reply:
        """A tool-start notice: 204, 400 (bad body), 404 (unknown session), 503."""
        engine = self.engine
        body = _json_object(engine, raw, "the notice")
        v = body.get("v")
        if isinstance(v, bool) or not isinstance(v, int) or v < 2:
            raise _HTTPError(400, f"'v' must be the protocol version 2, got {v!r}", param="v")
        session = body.get("session_id")
        if not isinstance(session, str) or not session:
            raise _HTTPError(
                400, f"'session_id' must be a non-empty string, got {session!r}", param="session_id"
            )
        for name in ("job_id", "tool"):
            value = body.get(name)
            if value is not None and not isinstance(value, str):
                raise _HTTPError(400, f"{name!r} must be a string, got {value!r}", param=name)
        expected = body.get("expected_s")
        if expected is not None and (
            isinstance(expected, bool)
            or not isinstance(expected, int | float)
            or not 0 <= expected < float("inf")  # also rejects NaN
        ):
            raise _HTTPError(
                400,
                f"'expected_s' must be a number of seconds >= 0 or null, got {expected!r}",
                param="expected_s",
            )
        source = body.get("source")
        if source not in _NOTICE_SOURCES:
            raise _HTTPError(
                400,
                f"'source' must be 'declared', 'learned' or null, got {source!r}",
                param="source",
            )
        if not engine.notice_tool_wait(session, None if expected is None else float(expected)):
            raise _HTTPError(404, f"no session {session!r} on {engine.name}", param="session_id")
        return Reply(204, [])

    def _models(self) -> bytes:
        cfg = self.engine.config
        return json.dumps(
            {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": _CREATED_EPOCH,
                        "owned_by": "agentrt-sim",
                        "root": cfg.model_name,
                        "parent": None,
                        "max_model_len": cfg.max_model_len or cfg.num_gpu_blocks * cfg.block_size,
                    }
                    for name in cfg.served_model_names or (cfg.model_name,)
                ],
            }
        ).encode()

    async def _generate(self, path: str, headers: list[tuple[bytes, bytes]], raw: bytes) -> Reply:
        engine = self.engine
        entered = anyio.current_time()
        cfg = engine.config
        chat = path == "/v1/chat/completions"
        body = _json_object(engine, raw, "the body")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            model = cfg.model_name
        elif cfg.served_model_names is not None and model not in cfg.served_model_names:
            raise _HTTPError(
                404,
                f"The model `{model}` does not exist. Served: {', '.join(cfg.served_model_names)}",
                kind="invalid_request_error",
                code="model_not_found",
            )
        try:
            if chat:
                prompt = engine.tokenizer.chat(body.get("messages"))
            else:
                if "prompt" not in body:
                    raise _HTTPError(400, "'prompt' is required", param="prompt")
                prompt = engine.tokenizer.completion(body["prompt"])
        except PromptError as e:
            raise _HTTPError(400, str(e), param="messages" if chat else "prompt") from None
        max_tokens = body.get("max_completion_tokens") if chat else None
        if max_tokens is None:
            max_tokens = body.get("max_tokens")
        if max_tokens is None:
            max_tokens = cfg.default_max_tokens
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise _HTTPError(400, "max_tokens must be an integer >= 1", param="max_tokens")
        script = agent_reply(body) if chat and cfg.replies == "agent" else None
        if script is not None:
            max_tokens = min(max_tokens, script.num_tokens)
        hint = script is None and chat and cfg.replies == "agent"
        n = body.get("n", 1)
        if n not in (1, None):
            raise _HTTPError(400, "the embedded engine only supports n=1", param="n")
        hdr = _headers_dict(headers)
        meta = _agentrt_meta(hdr)
        priority = _priority(body, meta, cfg.scheduling == "priority")
        accept = _ACCEPT_PRIORITY if cfg.scheduling == "priority" else _ACCEPT_HEADER
        extra = [_HINT_HEADER] if hint else []
        session = body.get("session_id")
        if not isinstance(session, str) or not session:
            session = meta.session_id if meta is not None else hdr.get("x-session-id")
        idle = None if meta is None else meta.idle_expected_s
        final = meta is not None and meta.final
        rid = hdr.get("x-request-id") or f"sim-{engine.name}-{next(self._ids)}"
        stream = bool(body.get("stream", False))
        if cfg.request_overhead_s > 0:
            # The API server's share of a request (HTTP, parsing, tokenizing) before the
            # engine sees it.
            await anyio.sleep(cfg.request_overhead_s)
        try:
            req = engine.submit(
                prompt,
                max_tokens,
                request_id=rid,
                priority=priority,
                session=session,
                idle_expected=idle,
                stream=stream,
                final=final,
            )
        except RequestRejected as e:
            raise _HTTPError(400, str(e)) from None
        rid_header = (b"x-request-id", rid.encode("latin-1"))
        if stream:
            opts = body.get("stream_options")
            include_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
            return Reply(
                200,
                [*_SSE_HEADERS, rid_header, accept, *extra],
                stream=SSEStream(
                    engine, req, prompt, rid, model, chat, include_usage, script, hint=hint
                ),
            )
        try:
            while not req.done:
                await req.wait_output(req.num_output)
        finally:
            if not req.done:
                engine.abort(req)
        if req.status == ABORTED:  # pragma: no cover - only when the engine shuts down
            raise _HTTPError(500, "the request was aborted")
        body_out = _completion_body(req, prompt, rid, model, chat, script, hint=hint)
        return _json_reply(200, body_out, [rid_header, accept, _timing(req, entered), *extra])


def _timing(req: SimRequest, entered: float) -> tuple[bytes, bytes]:
    """A ``Server-Timing`` header (W3C) for a finished request, in milliseconds: ``app``
    from the parsed request to the reply (the server's share of the latency, engine
    included), ``ttft`` from the engine's arrival to its first token (queue and prefill),
    ``engine`` from arrival to finish (both on the engine clock: wall time when served)."""
    now = anyio.current_time()
    first = req.first_token_time if req.first_token_time is not None else now
    done = req.finish_time if req.finish_time is not None else now
    ttft = max(0.0, first - req.arrival)
    value = (
        f"app;dur={(now - entered) * 1e3:.3f}, ttft;dur={ttft * 1e3:.3f}, "
        f"engine;dur={(done - req.arrival) * 1e3:.3f}"
    )
    return (b"server-timing", value.encode())


def _json_object(engine: Engine, raw: bytes, what: str) -> dict[str, Any]:
    """A request's JSON object body (503 while the engine is not running, 400 if bad)."""
    if not engine.started:
        raise _HTTPError(503, f"the engine of {engine.name} is not running")
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise _HTTPError(400, f"invalid JSON body: {e}") from None
    if not isinstance(body, dict):
        raise _HTTPError(400, f"{what} must be a JSON object")
    return body


def _completion_body(
    req: SimRequest,
    prompt: Prompt,
    rid: str,
    model: str,
    chat: bool,
    script: ScriptedReply | None = None,
    *,
    hint: bool = False,
) -> bytes:
    created = _CREATED_EPOCH + int(anyio.current_time())
    usage = _usage(req, prompt)
    choice: dict[str, Any] = {"index": 0}
    finish = "length"
    if script is not None:
        choice["message"] = script.message()
        finish = script.finish_reason
    elif chat:
        text = _filler(req.max_tokens, hint)
        choice["message"] = {"role": "assistant", "content": text, "tool_calls": []}
    else:
        choice["text"] = output_text(req.max_tokens)
    choice.update({"logprobs": None, "finish_reason": finish, "stop_reason": None})
    doc = {
        "id": f"chatcmpl-{rid}" if chat else f"cmpl-{rid}",
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage,
    }
    return json.dumps(doc).encode()


class SSEStream:
    """The chunks of a streamed reply, made as the engine produces tokens.

    An async iterator of ``bytes`` (server-sent events in OpenAI's chunk format);
    :meth:`close` aborts the request if it has not finished.
    """

    def __init__(
        self,
        engine: Engine,
        req: SimRequest,
        prompt: Prompt,
        rid: str,
        model: str,
        chat: bool,
        include_usage: bool,
        script: ScriptedReply | None = None,
        *,
        hint: bool = False,
    ) -> None:
        self._engine = engine
        self._script = script
        self._req = req
        self._prompt = prompt
        self._rid = rid
        self._model = model
        self._chat = chat
        self._usage_tail = ',"usage":null' if include_usage else ""
        self._include_usage = include_usage
        self._seen = 0
        self._finished = False
        self._created = _CREATED_EPOCH + int(anyio.current_time())
        ident = json.dumps(("chatcmpl-" if chat else "cmpl-") + rid)
        kind = "chat.completion.chunk" if chat else "text_completion"
        field = "delta" if chat else "text"
        self._head = (
            f'data: {{"id":{ident},"object":"{kind}","created":{self._created},'
            f'"model":{json.dumps(model)},"choices":[{{"index":0,"{field}":'
        )
        self._text = _filler(req.max_tokens, hint) if script is None else script.content

    def __aiter__(self) -> SSEStream:
        return self

    async def __anext__(self) -> bytes:
        if self._finished:
            raise StopAsyncIteration
        req = self._req
        seen = self._seen
        try:
            count = await req.wait_output(seen)
        except BaseException:
            self.close()
            raise
        if req.status == ABORTED or count <= seen:
            self._finished = True
            raise StopAsyncIteration
        piece = json.dumps(self._text[seen * 4 : count * 4])
        last = count >= req.max_tokens
        script = self._script
        finish = "null"
        if last:
            finish = '"length"' if script is None else json.dumps(script.finish_reason)
        calls = script.tool_calls if script is not None and last else ()
        if calls:
            finish = "null"  # the tool calls come first, then the finish chunk
        head = self._head
        tail = self._usage_tail
        parts: list[str] = []
        if self._chat:
            if seen == 0:
                parts.append(
                    f'{head}{{"role":"assistant","content":""}},"logprobs":null,'
                    f'"finish_reason":null}}]{tail}}}\n\n'
                )
            parts.append(
                f'{head}{{"content":{piece}}},"logprobs":null,"finish_reason":{finish}'
                f"}}]{tail}}}\n\n"
            )
            for i, c in enumerate(calls):  # one chunk per tool call, as OpenAI streams them
                delta = {
                    "index": i,
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                parts.append(
                    f'{head}{{"tool_calls":[{json.dumps(delta)}]}},"logprobs":null,'
                    f'"finish_reason":null}}]{tail}}}\n\n'
                )
            if calls:
                parts.append(
                    f'{head}{{}},"logprobs":null,"finish_reason":"tool_calls"}}]{tail}}}\n\n'
                )
        else:
            parts.append(
                f'{head}{piece},"logprobs":null,"finish_reason":{finish},'
                f'"stop_reason":null}}]{tail}}}\n\n'
            )
        if last:
            if self._include_usage:
                usage_doc: dict[str, Any] = {
                    "id": ("chatcmpl-" if self._chat else "cmpl-") + self._rid,
                    "object": "chat.completion.chunk" if self._chat else "text_completion",
                    "created": self._created,
                    "model": self._model,
                    "choices": [],
                    "usage": _usage(req, self._prompt),
                }
                parts.append(f"data: {json.dumps(usage_doc)}\n\n")
            parts.append("data: [DONE]\n\n")
            self._finished = True
        self._seen = count
        return "".join(parts).encode()

    def close(self) -> None:
        """Stop the stream; the request is aborted unless it already finished."""
        self._finished = True
        if not self._req.done:
            self._engine.abort(self._req)


def _usage(req: SimRequest, prompt: Prompt) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt.num_tokens,
        "completion_tokens": req.max_tokens,
        "total_tokens": prompt.num_tokens + req.max_tokens,
        "prompt_tokens_details": {"cached_tokens": req.cached_tokens},
    }


def _agentrt_meta(headers: dict[str, str]) -> CallMetadata | None:
    raw = headers.get(HEADER)
    if raw is None:
        return None
    try:
        return parse_agentrt_header(raw)
    except ValueError as exc:
        raise _HTTPError(400, str(exc)) from None


def _priority(body: dict[str, Any], meta: CallMetadata | None, enabled: bool) -> int:
    value = body.get("priority")
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _HTTPError(400, "priority must be an integer", param="priority")
        if value != 0 and not enabled:
            raise _HTTPError(
                400,
                "Got priority != 0 but this replica does not schedule by priority "
                "(EngineConfig(scheduling='priority'))",
                param="priority",
            )
        return value
    return 0 if meta is None or meta.priority is None else meta.priority


# ---------------------------------------------------------------- metrics


_METRIC_HEADS: dict[tuple[str, str, str], str] = {}
"""A sample's HELP and TYPE lines and its name and labels, by (name, extra labels,
labels): a page is rendered per poll, every second by every polling process."""


_STATS_BUT_CLOCK: Final = operator.attrgetter(
    *(f.name for f in dataclasses.fields(ReplicaStats) if f.name != "time_s")
)
_PAGES: weakref.WeakKeyDictionary[Engine, tuple[tuple[Any, ...], str]] = weakref.WeakKeyDictionary()
"""Each engine's last page but its clock, with the counters it was made from: an idle
or unchanged replica polled again answers the same text (a fleet polls every second)."""


def render_metrics(engine: Engine) -> str:
    """The replica's ``/metrics`` page: Prometheus text with vLLM's metric names."""
    s = engine.stats()
    labels = f'{{engine="0",model_name="{engine.config.model_name}"}}'
    key = (_STATS_BUT_CLOCK(s), labels)
    last = _PAGES.get(engine)
    if last is not None and last[0] == key:
        page = last[1]
    else:
        page = _render(engine, s, labels)
        _PAGES[engine] = (key, page)
    head = _metric_head("agentrt_sim:clock_seconds", "gauge", "The engine clock.", "", labels)
    return f"{page}{head}{float(s.time_s)!r}\n"


def _metric_head(name: str, kind: str, help_text: str, extra: str, labels: str) -> str:
    key = (name, extra, labels)
    head = _METRIC_HEADS.get(key)
    if head is None:  # the same few dozen per model: made once
        lab = labels if not extra else labels[:-1] + "," + extra + "}"
        head = f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n{name}{lab} "
        if len(_METRIC_HEADS) < 4096:
            _METRIC_HEADS[key] = head
    return head


def _render(engine: Engine, s: ReplicaStats, labels: str) -> str:
    """The page of :func:`render_metrics` but its last line (the clock)."""
    out: list[str] = []

    def metric(name: str, kind: str, help_text: str, value: float, extra: str = "") -> None:
        out.append(f"{_metric_head(name, kind, help_text, extra, labels)}{float(value)!r}\n")

    metric(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        s.running,
    )
    metric(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        s.waiting,
    )
    cfg = engine.config
    metric(
        "vllm:cache_config_info",
        "gauge",
        "Information of the LLMEngine CacheConfig.",
        1,
        f'block_size="{cfg.block_size}",num_gpu_blocks="{cfg.num_gpu_blocks}",'
        f'num_cpu_blocks="{cfg.num_host_blocks}",enable_prefix_caching="True"',
    )
    metric(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        s.kv_usage,
    )
    metric(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
        s.prefix_cache_queries,
    )
    metric(
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
        s.prefix_cache_hits,
    )
    metric(
        "vllm:external_prefix_cache_hits_total",
        "counter",
        "Prefix cache hits in the host-memory tier, in tokens.",
        s.host_cache_hits,
    )
    _host_tier_metrics(metric, out, labels, s)
    metric(
        "vllm:num_preemptions_total", "counter", "Cumulative number of preemptions.", s.preemptions
    )
    metric(
        "vllm:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        s.prompt_tokens,
    )
    metric(
        "vllm:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        s.generation_tokens,
    )
    metric(
        "vllm:request_success_total",
        "counter",
        "Count of successfully processed requests.",
        s.requests_finished,
        'finished_reason="length"',
    )
    metric("agentrt_sim:steps_total", "counter", "Engine steps run.", s.steps)
    metric(
        "agentrt_sim:busy_seconds_total", "counter", "Simulated seconds spent in steps.", s.busy_s
    )
    return "".join(out)


def _host_tier_metrics(
    metric: Callable[..., None], out: list[str], labels: str, s: ReplicaStats
) -> None:
    """Host-tier traffic, prefetches, tool-wait decisions and final calls (``agentrt_sim:``
    counters)."""
    for name, help_text, value in (
        ("host_blocks_out_total", "KV blocks written to the host tier.", s.offloaded_blocks),
        ("host_blocks_in_total", "KV blocks loaded back at admission.", s.loaded_blocks),
        ("host_blocks_prefetched_total", "KV blocks prefetched back.", s.prefetched_blocks),
        ("host_bytes_out_total", "Bytes written to the host tier.", s.host_bytes_out),
        ("host_bytes_in_total", "Bytes read back from the host tier.", s.host_bytes_in),
        ("idle_notices_total", "Tool-start notices accepted.", s.idle_notices),
        ("final_calls_total", "Finished calls declared their session's last.", s.final_calls),
        (
            "final_blocks_dropped_total",
            "KV blocks freed when a session's last call finished.",
            s.final_blocks_dropped,
        ),
        (
            "directives_retained_total",
            "Retention directives (expected idle) applied to a session's blocks.",
            s.directives_retained,
        ),
        (
            "directives_ended_total",
            "Directives that a session ended: its blocks are evicted first.",
            s.directives_ended,
        ),
    ):
        metric(f"agentrt_sim:{name}", "counter", help_text, value)
    pending = s.prefetches - s.prefetches_useful - s.prefetches_wasted
    families = (
        (
            "agentrt_sim:prefetches_total",
            "Prefetches by outcome (skipped: not started).",
            "outcome",
            (
                ("useful", s.prefetches_useful),
                ("wasted", s.prefetches_wasted),
                ("pending", pending),
                ("skipped", s.prefetches_skipped),
            ),
        ),
        (
            "agentrt_sim:tool_wait_decisions_total",
            "Tool-wait KV decisions by action.",
            "action",
            (
                ("pin", s.tool_waits_pinned),
                ("offload", s.tool_waits_offloaded),
                ("drop", s.tool_waits_dropped),
                ("lru", s.tool_waits_lru),
                ("resume", s.tool_waits_resume),
                ("fallback", s.tool_wait_fallbacks),
            ),
        ),
    )
    for name, help_text, key, values in families:
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} counter\n")
        for label, value in values:
            out.append(f'{name}{labels[:-1]},{key}="{label}"}} {float(value)!r}\n')


# ---------------------------------------------------------------- several replicas on one port


class ClusterApp:
    """Serves several replicas under one origin.

    - ``/replica-i/...``: replica ``i`` itself (its ``/v1`` API, ``/metrics``, ``/health``);
    - ``/v1/...``: the front door, a plain load balancer over all replicas: each request
      goes to the next replica in turn (round-robin per request, like nginx's default
      upstream), with no session affinity; with one replica it is that replica. A
      tool-start notice (``POST /v1/agentrt/idle``) goes to the replica that holds its
      session. ``/metrics`` at the root is the replica's with one replica, and a 404
      naming the per-replica pages with several (their counters are per engine);
    - ``GET /`` and ``GET /health``: a JSON listing of what is served.
    """

    def __init__(self, apps: dict[str, ASGIApp], front: ReplicaApp | None = None) -> None:
        self.apps = apps
        self.front = front
        """A gateway answering the front door (``/v1``, its control endpoints) instead of
        the round-robin balancer (``agentrt sim serve --gateway``)."""
        self._order = tuple(apps.values())
        self._turn = itertools.cycle(range(len(self._order)))

    def listing(self) -> dict[str, Any]:
        """What ``GET /`` answers: the front door, its balancing, the replicas' paths."""
        balancing = "round-robin per request" if len(self._order) > 1 else None
        policy = getattr(self.front, "policy", None)
        if policy is not None:
            balancing = f"gateway {policy.name}"
        return {
            "openai": "/v1",
            "balancing": balancing,
            "replicas": [f"/{n}/v1" for n in self.apps],
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        name, sep, rest = path.lstrip("/").partition("/")
        app = self.apps.get(name)
        if app is not None:
            child = dict(scope)
            child["path"] = "/" + rest if sep else "/"
            child["raw_path"] = child["path"].encode()
            child["root_path"] = scope.get("root_path", "") + "/" + name
            await app(child, receive, send)
            return
        front = self.front
        if front is not None and (name == "v1" or scope.get("method") == "POST"):
            await front(scope, receive, send)
            return
        if name == "v1" or (path in ("/metrics", "/kv_event_sources") and len(self._order) == 1):
            if len(self._order) == 1:
                await self._order[0](scope, receive, send)
            elif path == _NOTICE_PATH:
                await self._notice(scope, receive, send)
            else:
                await self._order[next(self._turn)](scope, receive, send)
            return
        if path in ("/", "/health"):
            body = json.dumps(self.listing()).encode()
            await _send_bytes(send, 200, body, _JSON_HEADERS)
            return
        where = ", ".join(f"/{n}{path}" for n in self.apps)
        message = (
            f"no route {path}; the OpenAI API is at /v1 (round-robin over the replicas) "
            f"and at /replica-<i>/v1"
            if path != "/metrics"
            else f"metrics are per replica: {where}"
        )
        await _send_bytes(send, 404, _error_body(_HTTPError(404, message)), _JSON_HEADERS)

    async def _notice(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A tool-start notice at the front door: to the replica that knows its session
        (the first answer other than 404), else the last 404."""
        try:
            body = await _read_body(receive)
        except _Disconnected:
            return
        headers = scope.get("headers", [])
        reply = None
        for app in self._order:
            if not isinstance(app, ReplicaApp):  # pragma: no cover - replicas only
                continue
            reply = await app.respond(scope["method"], scope["path"], headers, body)
            if reply.status != 404:
                break
        if reply is None:  # pragma: no cover - replicas only
            reply = _json_reply(404, _error_body(_HTTPError(404, "no replica takes notices")))
        await send(
            {"type": "http.response.start", "status": reply.status, "headers": reply.headers}
        )
        await send({"type": "http.response.body", "body": reply.body, "more_body": False})
