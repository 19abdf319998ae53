"""Runtime(config=...) and AGENTRT_CONFIG: a TOML file of Runtime keyword arguments
fills in what the caller did not pass; bad files fail before any request; the file
``agentrt tune`` writes loads back as the settings it names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentrt import Retry, Runtime, SyncRuntime
from agentrt._settings import CONFIG_ENV, CONFIG_KEYS, load_config
from agentrt.scheduling import GradientLimit
from tests._fake import chat_completion

URL = "http://engine.test/v1"
MSG = [{"role": "user", "content": "hi"}]


class Counting:
    """A transport that answers every chat call and counts the requests it saw."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        return httpx.Response(
            200,
            json=chat_completion({"role": "assistant", "content": "ok"}, usage),
        )

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)


def write(tmp: Path, text: str, name: str = "tuned.toml") -> Path:
    path = tmp / name
    path.write_text(text)
    return path


TUNED = """
# agentrt tune: the best settings found, as Runtime keyword arguments
routing = "least_loaded"
policy = "mlfq"
concurrency = "auto"
send_priority = false
learn_waits = false
"""


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CONFIG_ENV, raising=False)


def settings(rt: Runtime) -> dict[str, Any]:
    assert rt._core.settings is not None
    return rt._core.settings


def test_the_file_sets_the_arguments_not_passed(tmp_path: Path) -> None:
    rt = Runtime([URL, "http://engine2.test/v1"], config=write(tmp_path, TUNED))
    s = settings(rt)
    assert (s["routing"], s["policy"], s["concurrency"]) == ("least_loaded", "mlfq", "auto")
    assert s["send_priority"] is False and s["learn_waits"] is False
    assert rt._core.router.name == "least_loaded"
    assert rt._core.waits is None  # learn_waits = false took effect
    assert all(isinstance(e.admission.limit, GradientLimit) for e in rt._core.endpoints)
    assert type(rt._core.endpoints[0].admission.policy).__name__ == "MLFQ"


def test_explicit_arguments_win_over_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, TUNED)
    rt = Runtime([URL], config=str(path), policy="plas", concurrency=8, learn_waits=True)
    s = settings(rt)
    assert (s["policy"], s["concurrency"], s["learn_waits"]) == ("plas", 8, True)
    assert s["routing"] == "least_loaded"  # not passed: the file's
    assert rt.admission_statistics()[0].limit == 8
    # An explicit argument equal to Runtime's default still wins (not the file's value).
    rt = Runtime([URL], config=path, routing="session_affinity")
    assert settings(rt)["routing"] == "session_affinity"


def test_a_runtime_table_and_the_values_that_map_to_objects(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[runtime]
dialect = ["vllm", "generic"]
concurrency = "none"
token_budget = 4096
poll_metrics_s = 0.5
timeout_s = 30
keep_reports = 7

[runtime.retry]
attempts = 5
wait_max = 2.0
""",
    )
    got = load_config(path)
    assert got["concurrency"] is None  # TOML has no null: "none"
    assert got["retry"] == Retry(attempts=5, wait_max=2.0)
    assert got["dialect"] == ("vllm", "generic")
    rt = Runtime([URL], config=path)
    assert rt._core.retry == Retry(attempts=5, wait_max=2.0)
    assert rt.admission_statistics()[0].limit is None
    assert settings(rt)["token_budget"] == 4096
    assert rt._timeout.read == 30
    assert rt._reports.maxlen == 7


def test_the_environment_variable_names_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CONFIG_ENV, str(write(tmp_path, TUNED)))
    assert settings(Runtime([URL]))["policy"] == "mlfq"
    assert settings(Runtime([URL], policy="fcfs"))["policy"] == "fcfs"  # explicit wins
    other = write(tmp_path, 'policy = "plas"\n', "other.toml")
    s = settings(Runtime([URL], config=other))  # config= wins over the variable
    assert s["policy"] == "plas" and s["routing"] == "session_affinity"  # one file only
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "gone.toml"))
    with pytest.raises(FileNotFoundError, match=rf"gone\.toml.*\${CONFIG_ENV}"):
        Runtime([URL])


def test_sync_runtime_takes_config(tmp_path: Path) -> None:
    fake = Counting()
    path = write(tmp_path, TUNED)
    with SyncRuntime([URL], config=path, transport=fake.transport()) as srt:
        srt.openai().chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
        assert settings(srt.runtime)["policy"] == "mlfq"
    assert len(fake.requests) == 1


BAD = [
    ("routing = ", "not valid TOML"),
    ('polcy = "mlfq"\n', "unknown key 'polcy'; valid keys: " + ", ".join(CONFIG_KEYS)),
    ('policy = "fastest"\n', "policy: unknown scheduling policy 'fastest'"),
    ('routing = "nearest"\n', "routing: unknown routing 'nearest'"),
    ('concurrency = "fast"\n', "concurrency must be an int >= 1"),
    ("concurrency = 0\n", "concurrency must be an int >= 1"),
    ("send_priority = 1\n", 'send_priority must be true, false or "auto"'),
    ('learn_waits = "yes"\n', "learn_waits must be true or false"),
    ("timeout_s = -1\n", "timeout_s must be a number of seconds > 0"),
    ("[retry]\nattempts = 0\n", "retry.attempts must be an int >= 1"),
    ("[retry]\ntries = 2\n", "unknown key retry.tries; valid: attempts"),
    ('api_key = "sk-secret"\n', "api_key cannot be set in a settings file"),
    ('dialect = "klingon"\n', "dialect: "),
    ('policy = "plas"\n[runtime]\nrouting = "hash"\n', "either at the top level or in"),
]


@pytest.mark.parametrize(("text", "message"), BAD, ids=[m[:24] for _, m in BAD])
def test_bad_files_fail_before_any_request(tmp_path: Path, text: str, message: str) -> None:
    fake = Counting()
    path = write(tmp_path, text)
    with pytest.raises((ValueError, TypeError)) as info:
        Runtime([URL], config=path, transport=fake.transport())
    assert message in str(info.value)
    assert str(path) in str(info.value)  # names the file
    assert "sk-secret" not in str(info.value)
    assert fake.requests == []


def test_a_missing_file_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="agentrt tune"):
        Runtime([URL], config=tmp_path / "nope.toml")
    with pytest.raises(TypeError, match="config must be a file path"):
        Runtime([URL], config=3)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_the_journal_records_the_applied_settings(tmp_path: Path) -> None:
    fake = Counting()
    journal = tmp_path / "runs.jsonl"
    path = write(tmp_path, TUNED + f'journal = "{journal}"\n')
    async with Runtime([URL], config=path, transport=fake.transport()) as rt:
        async with rt.job("j") as job, job.session() as s:
            await s.chat(model="m", messages=MSG)
    line = json.loads(journal.read_text().splitlines()[0])
    assert line["runtime"]["policy"] == "mlfq" and line["runtime"]["routing"] == "least_loaded"
    assert job.report.status == "ok"


def test_the_file_tune_writes_loads_back(tmp_path: Path) -> None:
    """Round trip: a journal recorded with a settings file, tuned (on the embedded
    cluster, in virtual time), and the tuned file applied."""
    from agentrt.cli import main
    from agentrt.tune._search import Setting
    from tests.tune._helpers import record_journal

    journal = record_journal(tmp_path, "react", 6)
    out = tmp_path / "tuned.toml"
    args = ["tune", str(journal), "--out", str(out), "--sample", "4", "--seeds", "1"]
    assert main([*args, "--workers", "1", "--top", "1"]) == 0
    written = load_config(out)
    rt = Runtime([URL, "http://engine2.test/v1"], config=out)
    applied = settings(rt)
    for key, value in written.items():
        assert applied[key] == value, key
    # tune reads the applied runtime's settings back as the setting it wrote.
    expected = Setting.of({"concurrency": None, **written})
    assert Setting.of(applied) == expected
