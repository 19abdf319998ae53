"""The engine infrastructure itself, against real vLLM CPU replicas, with plain httpx and openai.

These tests do not use agentrt's runtime: they pin down what the engine does with the fields
agentrt sends (priority, session id) and what it reports back (cached prompt tokens, metrics,
KV events), so that agentrt's own engine tests build on known ground.
"""

from __future__ import annotations

import json
import random
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from agentrt.testing.vllm_cpu import KvEventsSubscriber, ReplicaServer

pytestmark = pytest.mark.engine

BLOCK = 128  # vLLM's CPU block size, in tokens
_WORDS = (
    "agent tool call session prefix cache token engine queue batch priority schedule latency "
    "replica router worker block event metric stream reply prompt model search result plan"
).split()


def long_text(words: int, *, tag: str | None = None) -> str:
    """Text of about ``1.3 * words`` tokens that starts with a unique tag, so no cache holds it."""
    tag = tag or uuid.uuid4().hex
    rng = random.Random(tag)
    return tag + " " + " ".join(rng.choice(_WORDS) for _ in range(words))


_client: httpx.Client | None = None


@pytest.fixture(scope="module", autouse=True)
def _http_client() -> Iterator[None]:
    # One client for all threads: creating clients (SSL contexts) in several threads at once
    # holds them up for seconds here.
    global _client
    with httpx.Client(timeout=120, trust_env=False) as client:
        _client = client
        yield
    _client = None


def http() -> httpx.Client:
    assert _client is not None
    return _client


def chat_body(
    replica: ReplicaServer, content: str, max_tokens: int = 8, **extra: Any
) -> dict[str, Any]:
    return {
        "model": replica.model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "ignore_eos": True,  # random weights may emit EOS; make lengths exact
        **extra,
    }


def post(
    replica: ReplicaServer, path: str, body: dict[str, Any], *, root: bool = False, **kw: Any
) -> dict[str, Any]:
    """POST to ``base_url + path`` (``url + path`` with ``root``); asserts a 200."""
    resp = http().post(
        (replica.url if root else replica.base_url) + path, json=body, timeout=120, **kw
    )
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


def wait_until(cond: Callable[[], bool], timeout: float = 10.0, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


# --- chat and completions ---------------------------------------------------------------------


def test_chat_completion(vllm_engine: ReplicaServer) -> None:
    request_id = f"raw-{uuid.uuid4().hex[:12]}"
    data = post(
        vllm_engine,
        "/chat/completions",
        chat_body(vllm_engine, "Say hello.", max_tokens=12),
        headers={"X-Request-Id": request_id},
    )
    assert data["object"] == "chat.completion"
    assert data["model"] == vllm_engine.model
    assert request_id in data["id"]  # X-Request-Id becomes the response id
    choice = data["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] == "length"
    usage = data["usage"]
    assert usage["completion_tokens"] == 12
    assert usage["prompt_tokens"] > 5
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0


def test_chat_completion_streaming_with_openai(vllm_engine: ReplicaServer) -> None:
    with openai.OpenAI(base_url=vllm_engine.base_url, api_key="unused", max_retries=0) as client:
        stream = client.chat.completions.create(
            model=vllm_engine.model,
            messages=[{"role": "user", "content": "Count to ten."}],
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        deltas: list[str] = []
        usage = None
        finish = None
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                if choice.delta.content:
                    deltas.append(choice.delta.content)
                finish = choice.finish_reason or finish
    assert len(deltas) >= 2, deltas
    assert "".join(deltas).strip()
    assert finish == "length"
    assert usage is not None and usage.completion_tokens == 16


def test_completion(vllm_engine: ReplicaServer) -> None:
    data = post(
        vllm_engine,
        "/completions",
        {"model": vllm_engine.model, "prompt": "def main():", "max_tokens": 10, "ignore_eos": True},
    )
    assert data["object"] == "text_completion"
    assert isinstance(data["choices"][0]["text"], str)
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 10


def test_completion_streaming_sse(vllm_engine: ReplicaServer) -> None:
    body = {
        "model": vllm_engine.model,
        "prompt": "import os\n",
        "max_tokens": 10,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events: list[str] = []
    with http().stream("POST", vllm_engine.base_url + "/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: ") :])
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text_chunks = [c for c in chunks if c["choices"]]
    assert len(text_chunks) >= 2
    assert text_chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 10


# --- prefix cache: usage and /metrics --------------------------------------------------------


def test_second_turn_reports_cached_prompt_tokens(vllm_engine: ReplicaServer) -> None:
    before = vllm_engine.metrics()
    first_user = long_text(900)
    turn1 = post(vllm_engine, "/chat/completions", chat_body(vllm_engine, first_user, 16))
    p1 = turn1["usage"]["prompt_tokens"]
    assert p1 > 4 * BLOCK
    assert turn1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0

    reply = turn1["choices"][0]["message"]["content"]
    body = chat_body(vllm_engine, "", 16)
    body["messages"] = [
        {"role": "user", "content": first_user},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "And then?"},
    ]
    turn2 = post(vllm_engine, "/chat/completions", body)
    cached = int(turn2["usage"]["prompt_tokens_details"]["cached_tokens"])
    # Every full block of turn 1's prompt but the one the reply's text may re-tokenize.
    assert cached % BLOCK == 0
    assert cached >= (p1 // BLOCK - 1) * BLOCK, (cached, p1)
    assert cached < turn2["usage"]["prompt_tokens"]

    def counted() -> bool:
        after = vllm_engine.metrics()
        hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
        served = (
            after["vllm:prompt_tokens_cached_total"] - before["vllm:prompt_tokens_cached_total"]
        )
        return hits >= cached and served >= cached

    assert wait_until(counted), "prefix-cache hits did not show in /metrics"


def test_metrics_has_cache_and_queue_series(vllm_engine: ReplicaServer) -> None:
    status, text = vllm_engine.get("/metrics")
    assert status == 200
    for name in (
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_cached_total",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_preemptions_total",
        "vllm:kv_cache_usage_perc",
        "vllm:cache_config_info",
    ):
        assert re.search(rf"^{re.escape(name)}\{{", text, re.M), name
    info = re.search(r"^vllm:cache_config_info\{(.*)\}", text, re.M)
    assert info is not None
    assert f'block_size="{BLOCK}"' in info.group(1)
    assert 'enable_prefix_caching="True"' in info.group(1)


# --- priority ---------------------------------------------------------------------------------


def test_priority_accepted_without_priority_scheduling(vllm_engine: ReplicaServer) -> None:
    # vLLM's docs call a non-zero priority an error under FCFS; the CPU build 0.32 accepts it.
    data = post(vllm_engine, "/chat/completions", chat_body(vllm_engine, "hi", 4, priority=7))
    assert data["usage"]["completion_tokens"] == 4


def test_priority_scheduling_runs_lower_value_first(vllm_priority_engine: ReplicaServer) -> None:
    """With one sequence at a time, a later request with a lower priority value overtakes.

    A long request holds the only slot while three low-priority requests and then a
    high-priority one queue; closing the long request's connection aborts it. On 2 cores the
    API server is slow to take new requests while the engine decodes (its engine core and worker
    busy-poll shared memory), so the set-up is tried again if the queue did not form in time.
    """
    r = vllm_priority_engine
    order = [("low-1", 10), ("low-2", 10), ("low-3", 10), ("high", -10)]
    attempts: list[list[tuple[float, float, float]]] = []
    for _ in range(3):
        queue_ms, seen = _priority_round(r, order)
        if queue_ms is not None:
            break
        attempts.append(seen)
    else:
        pytest.fail(f"the requests never all waited behind the blocker: {attempts}")
    # Sent last, "high" waited least: it ran first when the blocker went.
    lows = [queue_ms[name] for name, _ in order if name.startswith("low")]
    assert queue_ms["high"] < min(lows), queue_ms


def _priority_round(
    r: ReplicaServer, order: list[tuple[str, int]]
) -> tuple[dict[str, float] | None, list[tuple[float, float, float]]]:
    """One round; returns each request's server-side queue time, or None if no queue formed."""
    queue_ms: dict[str, float] = {}
    errors: list[BaseException] = []
    seen: list[tuple[float, float, float]] = []
    t0 = time.monotonic()

    def call(name: str, priority: int) -> None:
        try:
            data = post(r, "/chat/completions", chat_body(r, name, 64, priority=priority))
            # Server-side queue time (--enable-per-request-metrics): client-side clocks jitter
            # by more than a request's run time on a busy 2-core machine.
            queue_ms[name] = float(data["metrics"]["queue_time_ms"])
        except BaseException as exc:
            errors.append(exc)

    def gauges() -> tuple[float, float]:
        m = r.metrics()
        g = m["vllm:num_requests_running"], m["vllm:num_requests_waiting"]
        if not seen or seen[-1][1:] != g:
            seen.append((round(time.monotonic() - t0, 2), *g))
        return g

    max_tokens = r.spec.max_model_len - 64
    body = json.dumps(chat_body(r, "block", max_tokens, priority=0)).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{r.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    threads: list[threading.Thread] = []
    with socket.create_connection(("127.0.0.1", r.port), timeout=60) as blocker:
        blocker.sendall(head.encode() + body)
        # Poll gently: each /metrics render costs the API server's busy event loop.
        started = wait_until(lambda: gauges() == (1, 0), timeout=30, step=0.1)
        for name, prio in order:
            t = threading.Thread(target=call, args=(name, prio))
            t.start()
            threads.append(t)
            time.sleep(0.05)
        queued = started and wait_until(lambda: gauges() == (1, len(order)), timeout=60, step=0.25)
    # Leaving the block closed the connection, which aborts the blocker if it still runs.
    for t in threads:
        t.join(120)
    assert not errors, errors
    return (queue_ms if queued else None), seen


# --- session id in KV events -----------------------------------------------------------------


@pytest.mark.parametrize("how", ["body", "header", "none"])
def test_session_id_shows_in_kv_events(vllm_engine: ReplicaServer, how: str) -> None:
    session = f"sess-{how}-{uuid.uuid4().hex[:8]}"
    content = long_text(400)
    body = chat_body(vllm_engine, content, 2)
    headers: dict[str, str] = {}
    if how == "body":
        body["session_id"] = session
    elif how == "header":
        headers["X-Session-ID"] = session
    with KvEventsSubscriber(vllm_engine) as sub:
        post(vllm_engine, "/chat/completions", body, headers=headers)
        # Our request's first block holds the prompt's unique tag.
        tokenized = post(
            vllm_engine,
            "/tokenize",
            {"model": vllm_engine.model, "messages": body["messages"]},
            root=True,
        )
        first_block = tokenized["tokens"][:BLOCK]
        ours = sub.wait_for(
            lambda e: e.get("type") == "BlockStored" and e["token_ids"][:BLOCK] == first_block,
            timeout=10,
        )
    assert ours, f"no BlockStored event for our request; got {sub.events!r:.1000}"
    expected = None if how == "none" else session
    assert {e.get("session_id") for e in ours} == {expected}


def test_reused_blocks_reported_for_new_session_only_in_full_mode(
    vllm_engine: ReplicaServer,
) -> None:
    # One output token, whose KV is never computed, and a prompt that does not end on a block
    # boundary: every block s2 needs is one s1 stored. With two output tokens a prompt 126
    # or 127 tokens past a boundary had its last block completed by them, and on random
    # weights even greedy decoding picked another token now and then (near-tied logits;
    # prefill from the cache computes them differently), so s2 stored a block (CI flakes).
    content = long_text(400)
    while True:
        tokens = post(
            vllm_engine,
            "/tokenize",
            {"model": vllm_engine.model, "messages": [{"role": "user", "content": content}]},
            root=True,
        )["tokens"]
        if len(tokens) % BLOCK not in (0, BLOCK - 1):
            break
        content += " word"
    with KvEventsSubscriber(vllm_engine) as sub:
        body = chat_body(vllm_engine, content, 1, session_id="s1")
        post(vllm_engine, "/chat/completions", body)
        assert sub.wait_for(lambda e: e.get("session_id") == "s1")
        # Another session reuses the cached blocks: by default no event says so...
        body = chat_body(vllm_engine, content, 1, session_id="s2")
        post(vllm_engine, "/chat/completions", body)
        assert not sub.wait_for(lambda e: e.get("session_id") == "s2", timeout=2)
        # ...unless the request asks for the full report.
        body = chat_body(
            vllm_engine, content, 2, session_id="s3", vllm_xargs={"kv_cache_report_mode": "full"}
        )
        data = post(vllm_engine, "/chat/completions", body)
        assert data["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        assert sub.wait_for(lambda e: e.get("session_id") == "s3")


# --- two replicas -----------------------------------------------------------------------------


def test_pair_runs_on_separate_cores_with_small_kv_cache(vllm_pair: list[ReplicaServer]) -> None:
    assert len(vllm_pair) == 2
    assert vllm_pair[0].port != vllm_pair[1].port
    for core, replica in enumerate(vllm_pair):
        assert replica.base_url.startswith("http://127.0.0.1:")
        assert f"local_rank=0, core ids=[{core}]" in replica.log_path.read_text()
        status, text = replica.get("/metrics")
        assert status == 200
        assert f'num_gpu_blocks="{replica.spec.num_gpu_blocks}"' in text
        data = post(replica, "/chat/completions", chat_body(replica, "hi", 4))
        assert data["usage"]["completion_tokens"] == 4


def test_small_kv_cache_evicts(vllm_pair: list[ReplicaServer]) -> None:
    r = vllm_pair[0]
    words = 1500  # about 2000 tokens: 15 of the replica's 64 blocks
    a = long_text(words)
    post(r, "/chat/completions", chat_body(r, a, 1))
    again = post(r, "/chat/completions", chat_body(r, a, 1))
    cached_again = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached_again >= 10 * BLOCK
    for _ in range(5):  # 75 blocks of other prompts push A out
        post(r, "/chat/completions", chat_body(r, long_text(words), 1))
    after = post(r, "/chat/completions", chat_body(r, a, 1))
    assert after["usage"]["prompt_tokens_details"]["cached_tokens"] < cached_again
