"""A router object given to the Runtime hashes caller-given ids by endpoint URL, as one
given by name does (issue 35, item 7): two workers listing the same replicas in another
order agree on every id. ``make_router("session_affinity", overload=1.5)`` is the only way
to tune ``overload``; it hashed by position."""

from __future__ import annotations

import pytest

from agentrt import Retry, Runtime
from agentrt.scheduling import HashAffinity, make_router
from tests._fake import MSG, FakeEngine

URLS = [f"http://r{i}.test/v1" for i in range(4)]
FAST = Retry(attempts=1, wait_initial=0.0, wait_jitter=0.0)
IDS = [f"conv-{i}" for i in range(24)]


async def _placed(urls: list[str], routing: object) -> dict[str, str]:
    fake = FakeEngine()
    async with Runtime(urls, transport=fake.transport(), retry=FAST, routing=routing) as rt:  # type: ignore[arg-type]
        async with rt.job("j") as job:
            for sid in IDS:
                async with job.session(session_id=sid) as s:
                    await s.chat(model="m", messages=MSG)
    chats = [seen for seen in fake.seen if seen.url.endswith("/chat/completions")]
    return {sid: seen.url.split("/v1")[0] for sid, seen in zip(IDS, chats, strict=True)}


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["session_affinity", "hash"])
async def test_a_router_object_agrees_with_one_by_name_in_any_order(name: str) -> None:
    by_name = await _placed(URLS, name)
    forward = await _placed(URLS, make_router(name))
    backward = await _placed(URLS[::-1], make_router(name))
    assert forward == by_name
    assert backward == by_name
    assert len(set(by_name.values())) > 1  # the ids spread: the check can fail


def test_a_router_named_for_other_endpoints_is_refused() -> None:
    with pytest.raises(ValueError, match="was built for endpoints"):
        Runtime(URLS, routing=HashAffinity(endpoints=["http://elsewhere/v1"] * 1))
