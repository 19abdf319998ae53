"""agentrt's loggers: ``agentrt`` and one child per stage, silent unless configured.

============================  =========  ==============================================
logger                        level      what
============================  =========  ==============================================
``agentrt.transport``         DEBUG      each attempt of a call: endpoint, outcome, time
``agentrt.transport``         WARNING    a call whose attempts ran out (its last error)
``agentrt.routing``           INFO       a session moved to another replica, and why
``agentrt.health``            INFO       an endpoint marked down, or readmitted
``agentrt.hooks``             WARNING    a hook raised on an event (rate-limited)
``agentrt.journal``           WARNING    job reports the journal lost (rate-limited)
``agentrt.notices``           DEBUG      a tool-start notice that failed
============================  =========  ==============================================

``agentrt`` has a :class:`logging.NullHandler`, so nothing is printed unless the
application configures logging, or ``AGENTRT_LOG=debug`` / ``info`` is set in the
environment (as ``OPENAI_LOG`` does for openai): that adds one stderr handler to
``agentrt`` at that level. Any other value is ignored with a ``RuntimeWarning``.
No line carries a secret: endpoint URLs are kept without their userinfo
(:class:`~agentrt.Endpoint`), no header is logged, and error texts pass through
:func:`redact` (docs/telemetry.md, "Logging").
"""

from __future__ import annotations

import base64
import logging
import os
import sys
import warnings
from typing import Final

from ._config import redact_userinfo

__all__: list[str] = []

LOG_ENV: Final = "AGENTRT_LOG"
"""The environment variable that turns on a stderr handler (``debug`` or ``info``)."""

LOG_FORMAT: Final = "[%(asctime)s - %(name)s - %(levelname)s] %(message)s"
"""The stderr handler's format (openai's, less the line number)."""

_LEVELS: Final = {"debug": logging.DEBUG, "info": logging.INFO}

logger = logging.getLogger("agentrt")
logger.addHandler(logging.NullHandler())
transport_log = logging.getLogger("agentrt.transport")
routing_log = logging.getLogger("agentrt.routing")
health_log = logging.getLogger("agentrt.health")
hooks_log = logging.getLogger("agentrt.hooks")
journal_log = logging.getLogger("agentrt.journal")
notices_log = logging.getLogger("agentrt.notices")

_console: logging.Handler | None = None
"""The stderr handler ``AGENTRT_LOG`` added, if any."""


MIN_SECRET_CHARS: Final = 4
"""Secrets shorter than this are not looked for in texts (they would match anywhere)."""


def secret_forms(*secrets: str | None) -> tuple[str, ...]:
    """Every form in which ``secrets`` (API keys, passwords, ``user:password`` pairs)
    travel: as they are and base64-encoded (HTTP Basic auth), longest first."""
    forms: set[str] = set()
    for secret in secrets:
        if secret and len(secret) >= MIN_SECRET_CHARS:
            forms.add(secret)
            forms.add(base64.b64encode(secret.encode()).decode())
    return tuple(sorted(forms, key=len, reverse=True))


def credential_forms(authorization: str | None) -> tuple[str, ...]:
    """The secret forms of an ``Authorization`` header's value: a bearer token, or a
    Basic pair (encoded, and decoded: ``user:password`` and the password)."""
    if not authorization:
        return ()
    scheme, _, credential = authorization.strip().partition(" ")
    credential = credential.strip()
    if scheme.lower() != "basic":
        return secret_forms(credential)
    try:
        pair = base64.b64decode(credential, validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return secret_forms(credential)
    return secret_forms(pair, pair.partition(":")[2])


def scrub(text: str, forms: tuple[str, ...]) -> str:
    """``text`` without userinfo in its URLs and without any of ``forms`` (from
    :func:`secret_forms`)."""
    text = redact_userinfo(text)
    for form in forms:
        if form in text:
            text = text.replace(form, "***")
    return text


def scrub_bytes(data: bytes, forms: tuple[str, ...]) -> bytes:
    """``data`` (an error reply's body) without any of ``forms``."""
    for form in forms:
        raw = form.encode()
        if raw in data:
            data = data.replace(raw, b"***")
    return data


def redact(text: str, *secrets: str | None) -> str:
    """``text`` without userinfo in its URLs and without any of ``secrets`` (API keys,
    passwords, ``user:password`` pairs), as they are or base64-encoded."""
    return scrub(text, secret_forms(*secrets))


def configure(value: str | None) -> logging.Handler | None:
    """Apply an ``AGENTRT_LOG`` value: ``debug`` or ``info`` (any case) puts one stderr
    handler on the ``agentrt`` logger, at that level; an empty value or None does
    nothing; anything else is ignored with a ``RuntimeWarning``. Called once, when
    agentrt's runtime is first imported; calling it again replaces the handler."""
    global _console
    if value is None or not value.strip():
        return None
    level = _LEVELS.get(value.strip().lower())
    if level is None:
        warnings.warn(
            f"{LOG_ENV}={value!r} is ignored: use 'debug' or 'info'", RuntimeWarning, stacklevel=2
        )
        return None
    if _console is not None:
        logger.removeHandler(_console)
    _console = logging.StreamHandler(sys.stderr)
    _console.setFormatter(logging.Formatter(LOG_FORMAT))
    logger.addHandler(_console)
    logger.setLevel(level)
    return _console


configure(os.environ.get(LOG_ENV))
