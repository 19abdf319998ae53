"""openai's platform tag, found once per process and handed to the clients agentrt builds.

An ``AsyncOpenAI`` client finds its platform tag (its ``X-Stainless-OS`` header) in a
worker thread on its first request, and again on every request sent before that thread
returns: a burst of N first calls makes N thread hops (40 at a time, anyio's default). In
virtual time (trio's ``MockClock``) the clock jumps while they run, so the burst reaches
the engine spread over seconds, in an order the threads decide, and a replay does not
repeat. agentrt finds the tag once per process, in the constructor of a runtime (or a
bench driver), where the HTTP pool's SSL context is built too, and sets it on each client
it builds. No thread: a hop would let the virtual clock jump as well, by a different
amount in the first runtime of a process than in the next.
"""

from __future__ import annotations

from functools import cache
from typing import Any


@cache
def openai_platform() -> Any:
    """openai's platform tag (None if this openai has no probe). The first call reads
    the platform (about 3 ms: ``platform.platform()``, ``/etc/os-release``); later ones
    return it."""
    try:
        from openai._base_client import get_platform
    except ImportError:  # pragma: no cover - a future openai without it
        return None
    return get_platform()


def give_platform(client: object, tag: Any) -> None:
    """Set ``tag`` on an openai client that has not found its own (else leave it)."""
    if tag is not None and getattr(client, "_platform", tag) is None:
        client._platform = tag  # type: ignore[attr-defined]
