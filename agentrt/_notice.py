"""The tool-start notice: tell the replica holding a session's KV that it is idle now.

An endpoint that accepts notices says so in its replies (``x-agentrt-accept: idle-notice``).
When a session starts a tool wait, the runtime posts ``{endpoint}/agentrt/idle`` to the
endpoint that served the session's last call, in a task of its own while the wait lasts
(``session.tool``'s block; a framework adapter's waits use the runtime's task group where it
has one): never awaited by the agent, never retried, 1 s timeout, cancelled if the wait ends
first, failures counted. docs/protocol.md, "Tool-start notice", is the specification.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

import anyio
import anyio.abc

from ._log import notices_log

if TYPE_CHECKING:
    import httpx

    from ._config import Endpoint

__all__ = ["NoticeStatistics"]

ACCEPT_HEADER: Final = "x-agentrt-accept"
NOTICE_FEATURE: Final = "idle-notice"
NOTICE_PATH: Final = "/agentrt/idle"
NOTICE_TIMEOUT_S: Final = 1.0
_DISABLING_STATUS: Final = frozenset({405, 501})
_MAX_ERROR: Final = 200


_ACCEPT_KEY: Final = ACCEPT_HEADER.encode()
_LOWER = operator.itemgetter(1)


def accept_header(headers: Any) -> str | None:
    """A reply's ``x-agentrt-accept`` value. Scans the headers' raw list where the library
    keeps one (httpx and httpx2 do): ``Headers.get`` raises and catches a ``KeyError``
    when the header is absent, 0.7 µs against 0.1 µs, on every reply."""
    raw = getattr(headers, "_list", None)
    if not isinstance(raw, list):
        value: str | None = headers.get(ACCEPT_HEADER)
        return value
    names = list(map(_LOWER, raw))  # C-level scans: no Python loop on every reply
    if _ACCEPT_KEY in names:
        return bytes(raw[names.index(_ACCEPT_KEY)][2]).decode("latin-1")
    return None


def accepts_notice(value: str | None) -> bool:
    """Whether an ``x-agentrt-accept`` value lists ``idle-notice`` (case-insensitive)."""
    if not value:
        return False
    return any(part.strip().lower() == NOTICE_FEATURE for part in value.split(","))


@dataclass(frozen=True, slots=True)
class NoticeStatistics:
    """A snapshot of the tool-start notices a runtime sent (``rt.notice_statistics()``)."""

    sent: int
    """Notices posted (each once: never retried)."""
    accepted: int
    """Answered 2xx."""
    unknown: int
    """Answered 404: the server does not know the session (harmless)."""
    failed: int
    """Anything else: another status, a connection error, no answer within 1 s or before
    the tool wait ended."""
    disabled: tuple[str, ...]
    """Endpoints that answered 405 or 501 and get no more notices."""
    last_error: str | None
    """The last failure, for diagnosis (the API key is never in it)."""
    skipped: int = 0
    """Not sent: a framework adapter's tool wait on a runtime with no task group to carry
    the notice (one endpoint, no metrics polling); ``session.tool`` always can."""


SendNotice = Callable[[], Coroutine[Any, Any, None]]
"""Posts one notice when awaited (never raises)."""


class NoticeTarget(Protocol):
    """The endpoint a notice goes to, as the runtime keeps it (``_state._EndpointState``)."""

    endpoint: Endpoint
    authorization: bytes | None
    """The ``Authorization`` header its calls carry (a notice carries it too)."""
    notices: bool
    """It takes notices (cleared when it refuses one with 405 or 501)."""
    notices_off: bool
    """It refused one: no more are sent, whatever it advertises."""


class Notices:
    """Builds a runtime's notices and counts them; the caller runs each in a task."""

    def __init__(self, mod: Any, inner: httpx.AsyncBaseTransport) -> None:
        self._mod = mod
        """The HTTP library (``httpx`` or ``httpx2``) whose requests ``inner`` takes."""
        self._inner = inner
        self._post_status: Any = getattr(inner, "post_status", None)
        """A transport that serves simulated engines in this process (``agentrt.sim``'s)
        takes a notice without HTTP request and response objects; None elsewhere."""
        self.open = False
        """True while the runtime is open: nothing is sent before or after."""
        self.tasks: anyio.abc.TaskGroup | None = None
        """The runtime's task group while it has one (for waits without a block)."""
        self.sent = 0
        self.skipped = 0
        self.accepted = 0
        self.unknown = 0
        self.failed = 0
        self.last_error: str | None = None
        self._disabled: list[str] = []

    def statistics(self) -> NoticeStatistics:
        return NoticeStatistics(
            self.sent,
            self.accepted,
            self.unknown,
            self.failed,
            tuple(self._disabled),
            self.last_error,
            self.skipped,
        )

    def spawn(self, send: SendNotice) -> None:
        """Run ``send`` on the runtime's task group, if it has one (else count it as
        skipped): for tool waits without a block of their own."""
        if self.tasks is None:
            self.skipped += 1
            return
        self.tasks.start_soon(send)

    def prepare(
        self,
        ep: NoticeTarget,
        key: str | None,
        *,
        session_id: str,
        job_id: str,
        tool: str,
        expected_s: float | None,
        source: Literal["declared", "learned"] | None,
    ) -> SendNotice | None:
        """The notice to post to ``ep`` (None once the runtime is closed). The caller runs
        it in a task that ends no later than the tool wait."""
        if not self.open:
            return None
        body = {
            "v": 2,
            "session_id": session_id,
            "job_id": job_id,
            "tool": tool,
            "expected_s": expected_s,
            "source": source,
        }
        content = json.dumps(body, separators=(",", ":")).encode()

        async def send() -> None:
            await self._send(ep, key, content)

        return send

    async def _send(self, ep: NoticeTarget, key: str | None, content: bytes) -> None:
        self.sent += 1  # counted where it starts: a skipped one never does
        mod: Any = self._mod
        url = ep.endpoint.url + NOTICE_PATH
        headers = [("content-type", "application/json")]
        if ep.authorization is not None:  # the endpoint's key or credentials, as its calls
            headers.append(("authorization", ep.authorization.decode()))
        timeout = dict.fromkeys(("connect", "read", "write", "pool"), NOTICE_TIMEOUT_S)
        status: int | None = None
        error: str | None = None
        with anyio.move_on_after(NOTICE_TIMEOUT_S) as scope:
            try:
                direct = self._post_status
                if direct is not None:
                    raw = [(k.encode(), v.encode()) for k, v in headers]
                    raw.append((b"content-length", str(len(content)).encode()))
                    status = await direct(url, raw, content)
                if status is None:
                    request = mod.Request(
                        "POST",
                        url,
                        headers=headers,
                        content=content,
                        extensions={"timeout": timeout},
                    )
                    response = await self._inner.handle_async_request(request)
                    try:
                        await response.aread()
                    finally:
                        await response.aclose()
                    status = response.status_code
            except anyio.get_cancelled_exc_class():
                if not scope.cancel_called:  # the tool wait ended first (not the timeout)
                    self._failed(url, key, "the tool wait ended before an answer")
                raise
            except Exception as exc:  # counted, never raised: the agent must not notice
                error = f"{type(exc).__name__}: {exc}"
        if scope.cancelled_caught:
            error = f"no answer within {NOTICE_TIMEOUT_S:g} s"
        if status is not None and 200 <= status < 300:
            self.accepted += 1
            return
        if status == 404:
            self.unknown += 1
            return
        if status is not None:
            error = f"HTTP {status}"
            if status in _DISABLING_STATUS and ep.notices:
                ep.notices = False
                ep.notices_off = True
                self._disabled.append(ep.endpoint.url)
        self._failed(url, key, error)

    def _failed(self, url: str, key: str | None, error: str | None) -> None:
        self.failed += 1
        message = f"POST {url}: {error}"
        if key:
            message = message.replace(key, "***")
        self.last_error = message[:_MAX_ERROR]
        notices_log.debug("tool-start notice failed: %s", self.last_error)
