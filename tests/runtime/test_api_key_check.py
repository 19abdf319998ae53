"""An API key that cannot go in an HTTP header is refused when the runtime is built,
with an error that says what is wrong and never shows the key (issue 16)."""

from __future__ import annotations

import pytest

from agentrt import Endpoint, Runtime, SyncRuntime
from tests._fake import MSG, FakeEngine

URL = "http://engine.test/v1"
SECRET = "sk-s3cret-ключ"


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        (SECRET, "non-ASCII"),
        ("sk-abc\x00def", "control character"),
        ("sk-abc\ndef", "CR/LF"),
        ("sk-abc\u00a0", "non-ASCII"),
        (" sk-abc", "whitespace"),
    ],
)
def test_a_header_unsafe_key_is_refused_without_echoing_it(key: str, problem: str) -> None:
    for build in (
        lambda: Runtime([URL], api_key=key),
        lambda: Runtime([Endpoint(URL, api_key=key)]),
        lambda: SyncRuntime([URL], api_key=key),
    ):
        with pytest.raises(ValueError, match=problem) as info:
            build()
        assert key.strip() not in str(info.value)
        assert "sk-abc" not in str(info.value) and "s3cret" not in str(info.value)


def test_a_key_that_is_not_a_str_is_refused() -> None:
    with pytest.raises(TypeError, match="api_key must be a str"):
        Runtime([URL], api_key=b"sk-abc")  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_a_header_safe_key_is_sent() -> None:
    fake = FakeEngine()
    key = "sk-proj_AZ09-._~+/= x"
    async with Runtime([URL], api_key=key, transport=fake.transport()) as rt:
        await rt.openai().chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
    assert fake.seen[0].headers["authorization"] == f"Bearer {key}"
