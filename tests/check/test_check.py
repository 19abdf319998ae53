"""``agentrt check``: what each URL of a deployment answers, and what a runtime does
with it. Against the embedded engine over HTTP (``sim serve``: no mock), and through
``httpx.MockTransport`` for the servers that cannot run here (vLLM's, SGLang's and
Dynamo's metric names, an OpenAI or LiteLLM reply's headers, a key refused)."""

from __future__ import annotations

import inspect
import socket
from collections.abc import Callable

import anyio
import httpx
import pytest

from agentrt import Endpoint, Runtime
from agentrt.check._probe import EndpointCheck, check_endpoints, lines, plan
from agentrt.cli import main
from agentrt.sim import PRESETS, serve_async

DEFAULTS = {name: p.default for name, p in inspect.signature(Runtime).parameters.items()}

VLLM_PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 3.0
vllm:num_requests_waiting{engine="0",model_name="llama"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.25
vllm:cache_config_info{block_size="16",num_gpu_blocks="8192",engine="0"} 1.0
"""

SGLANG_PAGE = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="llama"} 2.0
sglang:num_queue_reqs{model_name="llama"} 0.0
sglang:token_usage{model_name="llama"} 0.28
sglang:max_total_num_tokens{model_name="llama"} 161721.0
"""

DYNAMO_PAGE = """\
dynamo_frontend_requests_total{model="llama"} 12.0
dynamo_frontend_inflight_requests{model="llama"} 1.0
"""


def _flat(out: list[str]) -> str:
    """The report's lines as one text, its wrapping undone."""
    return " ".join(" ".join(out).split())


def _server(
    metrics: str | None,
    *,
    owned_by: str = "someone",
    headers: dict[str, str] | None = None,
    key: str | None = None,
    metrics_at: str = "/metrics",
) -> Callable[[httpx.Request], httpx.Response]:
    """A server under ``/v1`` with model ``llama``: its metrics page at ``metrics_at``
    (None: 404), asking for ``key`` if given."""

    def handle(request: httpx.Request) -> httpx.Response:
        if key is not None and request.headers.get("authorization") != f"Bearer {key}":
            return httpx.Response(401, json={"error": {"message": "Invalid API key"}})
        if request.url.path.endswith("/v1/models"):
            data = [{"id": "llama", "object": "model", "owned_by": owned_by}]
            return httpx.Response(200, json={"object": "list", "data": data}, headers=headers)
        if request.url.path == metrics_at and metrics is not None:
            return httpx.Response(200, text=metrics)
        return httpx.Response(404, json={"detail": "Not Found"})

    return handle


async def _check(
    handler: Callable[[httpx.Request], httpx.Response],
    url: str = "http://gpu-0:8000/v1",
    **options: str,
) -> EndpointCheck:
    (got,) = await check_endpoints(
        [Endpoint(url)], transport=httpx.MockTransport(handler), **options
    )
    return got


@pytest.mark.anyio
async def test_a_vllm_server_is_told_by_its_metric_names_and_its_kv_capacity_read() -> None:
    got = await _check(_server(VLLM_PAGE))
    assert got.usable and got.models == ("llama",)
    assert (got.dialect, got.evidence) == ("vllm", "vllm:* metrics")
    assert got.metrics == "http://gpu-0:8000/metrics"
    assert got.load  # running, waiting and KV use: what the runtime's polls read
    assert got.kv_tokens == 8192 * 16  # vllm:cache_config_info, as the runtime reads it


@pytest.mark.anyio
async def test_an_sglang_server_shows_its_kv_pool_as_a_setting_to_give() -> None:
    got = await _check(_server(SGLANG_PAGE))
    assert got.usable and (got.dialect, got.evidence) == ("sglang", "sglang:* metrics")
    # the runtime reads vLLM's gauges only: no load and no capacity read from it...
    assert not got.load and got.kv_tokens is None
    # ...but the page states the pool, so the check says what to pass
    assert got.kv_hint == 161721
    text = _flat(lines([got, got], plan([got, got], DEFAULTS)))
    assert "Endpoint(url, kv_capacity=161721)" in text
    assert "engine load on 0 of 2, KV placement on 0 of 2" in text
    assert "dialect='sglang'" in text


@pytest.mark.anyio
async def test_other_servers_are_told_by_metric_names_owners_and_headers() -> None:
    dynamo = await _check(_server(DYNAMO_PAGE))
    assert (dynamo.dialect, dynamo.evidence) == ("dynamo", "dynamo_* metrics")
    owned = await _check(_server(None, owned_by="vllm"))
    assert (owned.dialect, owned.evidence) == ("vllm", "owned_by vllm")
    assert owned.metrics is None and owned.metrics_note == "no /metrics (HTTP 404: 'Not Found')"
    openai = await _check(_server(None, headers={"openai-version": "2020-10-01"}))
    assert openai.dialect == "openai"
    litellm = await _check(_server(None, headers={"x-litellm-version": "1.91.0"}))
    assert litellm.dialect == "litellm"
    plain = await _check(_server(None))
    assert (plain.dialect, plain.usable) == ("generic", True)


@pytest.mark.anyio
async def test_metrics_are_looked_for_where_the_runtime_polls_them() -> None:
    # beside a path-prefixed API first (as sim serve's replicas serve it), then at the
    # origin: the runtime's metrics_candidates
    beside = await _check(_server(VLLM_PAGE, metrics_at="/gw/metrics"), "http://h:1/gw/v1")
    assert beside.metrics == "http://h:1/gw/metrics" and beside.kv_tokens == 8192 * 16
    origin = await _check(_server(VLLM_PAGE), "http://h:1/gw/v1")
    assert origin.metrics == "http://h:1/metrics" and origin.load


@pytest.mark.anyio
async def test_a_key_is_asked_for_and_sent_when_given() -> None:
    refused = await _check(_server(VLLM_PAGE, key="sk-right"))
    assert refused.problem == "HTTP 401 on GET /models: it needs a key: --api-key-env VAR"
    wrong = await _check(_server(VLLM_PAGE, key="sk-right"), api_key="sk-wrong")
    assert wrong.problem == "HTTP 401 on GET /models: the key was refused"
    right = await _check(_server(VLLM_PAGE, key="sk-right"), api_key="sk-right")
    assert right.usable and right.kv_tokens == 8192 * 16  # metrics asked with the key too


@pytest.mark.anyio
async def test_a_reply_that_is_no_model_list_or_lacks_the_model_is_unusable() -> None:
    def text(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>hello</html>", headers={"content-type": "text/html"})

    got = await _check(text)
    assert got.problem == "GET /models answered, but not with an OpenAI model list"
    missing = await _check(_server(VLLM_PAGE), model="gpt-oss")
    assert missing.problem == "does not serve model 'gpt-oss'" and missing.models == ("llama",)
    served = await _check(_server(VLLM_PAGE), model="llama")
    assert served.usable


def _closed_port() -> int:
    with socket.socket() as sock:  # a port nothing listens on once this closes
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # uvicorn runs on asyncio
async def test_check_against_sim_serve(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")
    preset = PRESETS["h100-8b"]
    async with anyio.create_task_group() as tg:
        urls = await tg.start(serve_async, 2, "127.0.0.1", 0, preset)
        replicas = list(urls)
        origin = urls.url.removesuffix("/v1")
        down = f"http://127.0.0.1:{_closed_port()}/v1"

        def run(*args: str) -> tuple[int, list[str]]:
            status = main(["check", *args])
            return status, capsys.readouterr().out.splitlines()

        good = await anyio.to_thread.run_sync(run, *replicas)
        front = await anyio.to_thread.run_sync(run, urls.url)
        bad = await anyio.to_thread.run_sync(
            run, replicas[0], f"{origin}/wrong/v1", down, f"{origin}/replica-0"
        )
        model = await anyio.to_thread.run_sync(run, replicas[0], "--model", "nope")
        tg.cancel_scope.cancel()

    status, out = good
    assert status == 0, out
    assert max(map(len, out)) <= 80, out
    text = _flat(out)
    kv = preset.num_gpu_blocks * preset.block_size
    for url in replicas:
        assert f"ok {url}: vllm (vllm:* metrics, agentrt sim)" in text
    assert text.count(f"KV {kv:,} tok; KV placement on; engine load polled") == 2
    assert "With Runtime([...2 URLs], dialect='vllm') and its defaults:" in text
    assert "over 2 replicas" in text
    assert "engine load on 2 of 2, KV placement on 2 of 2" in text

    status, out = front  # one URL, a round-robin front door whose metrics are per replica
    assert status == 0, out
    text = _flat(out)
    assert "KV unknown; no /metrics (HTTP 404: 'metrics are per replica:" in text
    assert "routing none: one replica" in text

    status, out = bad
    assert status == 1, out
    assert max(map(len, out)) <= 80, out
    entries = _flat(out).split("FAIL ")
    assert entries[1].startswith(f"{origin}/wrong/v1: HTTP 404 on GET /models: no OpenAI API")
    assert "it says 'no route /wrong/v1/models" in entries[1]
    assert entries[2].startswith(f"{down}: connection refused: is the server running")
    assert "(most servers serve it under /v1)" in entries[3]
    assert out[-1] == "3 of 4 URLs unusable: fix them or leave them out"

    status, out = model
    assert status == 1 and "does not serve model 'nope'" in _flat(out)


def test_bad_input_is_one_line_before_anything_is_sent(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENTRT_TEST_NO_KEY", raising=False)
    cases = {
        ("127.0.0.1:8000/v1",): "needs an http:// or https:// scheme",
        ("http://a:1/v1", "http://a:1/v1/"): "http://a:1/v1 is listed twice",
        ("http://a:1/v1", "--api-key-env", "AGENTRT_TEST_NO_KEY"): "is not set or empty",
        ("http://a:1/v1", "--timeout", "0"): "--timeout must be positive",
    }
    for args, needle in cases.items():
        assert main(["check", *args]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith("agentrt: error: "), err
        assert needle in err[0], err
