"""Load signals: parsing vLLM's Prometheus /metrics page, never raising on bad input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrt.scheduling import EngineSignals, parse_vllm_metrics
from agentrt.scheduling._signals import parse_prometheus

# Shaped like vLLM 0.10's page (V1 engine), trimmed; two models behind one server.
VLLM_PAGE = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12345.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 3.0
vllm:num_requests_running{engine="0",model_name="llama"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen"} 7.0
vllm:num_requests_waiting{engine="0",model_name="llama"} 0.0
# HELP vllm:kv_cache_usage_perc KV-Cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="qwen"} 0.25
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.5
vllm:prefix_cache_hits_total{engine="0",model_name="qwen"} 1024.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="qwen"} 17.0
"""


def test_parses_a_vllm_page_summing_label_sets() -> None:
    assert parse_vllm_metrics(VLLM_PAGE) == EngineSignals(running=5, waiting=7, kv_usage=0.5)


def test_older_vllm_cache_metric_name() -> None:
    page = (
        'vllm:num_requests_running{model_name="m"} 1\n'
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.75\n'
    )
    assert parse_vllm_metrics(page) == EngineSignals(running=1, waiting=None, kv_usage=0.75)
    both = page + 'vllm:kv_cache_usage_perc{model_name="m"} 0.1\n'
    assert parse_vllm_metrics(both).kv_usage == 0.1  # the current name wins


@pytest.mark.anyio
async def test_the_simulator_page_parses() -> None:
    from agentrt.sim import Cluster  # the embedded engine renders vLLM's names

    cluster = Cluster(1)
    signals = parse_vllm_metrics(cluster.replicas[0].metrics_text())
    assert signals == EngineSignals(running=0, waiting=0, kv_usage=0.0)


def test_missing_or_bad_input_gives_nones() -> None:
    nothing = EngineSignals(None, None, None)
    assert parse_vllm_metrics("") == nothing
    assert parse_vllm_metrics("<html>502 Bad Gateway</html>") == nothing
    assert parse_vllm_metrics(b"vllm:num_requests_running 3") == nothing  # type: ignore[arg-type]
    assert parse_vllm_metrics(None) == nothing  # type: ignore[arg-type]
    page = (
        "vllm:num_requests_running NaN\n"
        "vllm:num_requests_waiting +Inf\n"
        "vllm:kv_cache_usage_perc x\n"
    )
    assert parse_vllm_metrics(page) == nothing


def test_tolerates_odd_lines() -> None:
    page = (
        "  vllm:num_requests_running 4 1700000000000\n"  # indented, with a timestamp
        'vllm:num_requests_waiting{path="/a}b",note="say \\"hi\\""} 2\n'  # } and \" in labels
        "vllm:num_requests_waiting{broken 9\n"  # unterminated labels: skipped
        "vllm:kv_cache_usage_perc 1.7\n"  # clamped to 1
        "# EOF\n"
    )
    assert parse_vllm_metrics(page) == EngineSignals(running=4, waiting=2, kv_usage=1.0)
    assert parse_prometheus(page)["vllm:num_requests_waiting"] == 2.0


@settings(deadline=None, max_examples=200)
@given(st.text(max_size=300) | st.lists(st.sampled_from(VLLM_PAGE.splitlines())).map("\n".join))
def test_never_raises(text: str) -> None:
    signals = parse_vllm_metrics(text)
    assert signals.kv_usage is None or 0.0 <= signals.kv_usage <= 1.0
    assert signals.running is None or signals.running >= 0
    parse_prometheus(text)


def test_only_exact_names_on_their_own_lines_count() -> None:
    """The one-scan parser: a longer name that starts with a wanted one, a name inside a
    label value or a comment, CRLF lines, indentation and a quoted '}' in a label."""
    page = (
        "vllm:num_requests_running_total 99\r\n"
        "# vllm:num_requests_running 50\r\n"
        'other{note="vllm:num_requests_waiting 40"} 1\r\n'
        '  vllm:num_requests_running{model_name="a}b"} 2\r\n'
        "vllm:num_requests_waiting 3 1700000000000\r\n"
        "vllm:kv_cache_usage_perc NaN\r\n"
    )
    assert parse_vllm_metrics(page) == EngineSignals(running=2, waiting=3, kv_usage=None)
    assert parse_vllm_metrics(page) == _slow(page)


def _slow(text: str) -> EngineSignals:
    """The line-by-line reading (parse_prometheus's) of the same page."""
    from agentrt.scheduling._signals import _samples

    samples = _samples(text)
    run, wait = samples.get("vllm:num_requests_running"), samples.get("vllm:num_requests_waiting")
    kv = samples.get("vllm:kv_cache_usage_perc") or samples.get("vllm:gpu_cache_usage_perc")
    return EngineSignals(
        running=None if run is None else round(sum(run)),
        waiting=None if wait is None else round(sum(wait)),
        kv_usage=None if kv is None else min(max(max(kv), 0.0), 1.0),
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "vllm:num_requests_running",
                "vllm:num_requests_waiting",
                "vllm:kv_cache_usage_perc",
                "vllm:gpu_cache_usage_perc",
                "vllm:num_requests_running_x",
                "# vllm:num_requests_waiting",
                "python_gc",
            ]
        ).flatmap(
            lambda name: st.tuples(
                st.just(name),
                st.sampled_from(["", '{m="x"}', '{m="}"}']),
                st.sampled_from(["0", "1", "2.5", "0.3", "x", "+Inf"]),
            )
        ),
        max_size=12,
    )
)
def test_the_scan_reads_what_the_line_parser_reads(lines: list[tuple[str, str, str]]) -> None:
    page = "".join(f"{n}{lab} {v}\n" for n, lab, v in lines)
    assert parse_vllm_metrics(page) == _slow(page)
