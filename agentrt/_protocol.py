"""The agentrt metadata protocol: what every call carries, and how it is validated.

The spec lives in ``docs/protocol.md``. This module is its single source of truth in
code: the :class:`CallMetadata` model, the ``x-agentrt`` header (an RFC 9651 Structured
Field Values dictionary), its writer :func:`agentrt_headers`, its reader
:func:`parse_agentrt_header`, and the validation of every value that reaches it. It
depends on no HTTP library.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from typing import Any, Final, Literal, TypeAlias, TypeVar

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "HEADER",
    "MAX_HEADER_BYTES",
    "MAX_ID_BYTES",
    "MAX_SECONDS",
    "MAX_SF_INTEGER",
    "PROTOCOL_VERSION",
    "CallMetadata",
    "IdleSource",
    "agentrt_header_value",
    "agentrt_headers",
    "parse_agentrt_header",
    "validate_id",
    "validate_nonneg",
]

PROTOCOL_VERSION: Final = "2"
"""The version of the metadata protocol (docs/protocol.md) that agentrt sends."""
HEADER: Final = "x-agentrt"
"""The one header agentrt sends (lower case; HTTP header names are case-insensitive).
Names starting with ``x-agentrt-`` are reserved for agentrt too."""
MAX_ID_BYTES: Final = 128

MAX_SF_INTEGER: Final = 999_999_999_999_999
"""The largest RFC 9651 integer (15 digits); integers are clamped to +-this."""
MAX_SECONDS: Final = 999_999_999_999.999
"""The largest RFC 9651 decimal (12 + 3 digits); durations are clamped to [0, this]."""
MAX_HEADER_BYTES: Final = 2048
"""Bound on the ``x-agentrt`` value; the reader rejects longer ones. What agentrt sends
always fits: at most 923 bytes, or 1,563 when ids are made of ``"`` and ``\\`` (each is
escaped with a ``\\``); the rest is room for optional keys added later."""

IdleSource: TypeAlias = Literal["declared", "predicted"]
"""Where ``idle_expected_s`` came from: ``session.expect_idle`` (declared), or the
runtime's learned tool waits (predicted)."""

# Dictionary keys (RFC 9651 keys: lower case, digits, "_", "-", ".", "*").
K_VERSION: Final = "v"
K_CALL: Final = "call"
K_JOB: Final = "job"
K_SESSION: Final = "session"
K_PROGRAM: Final = "program"
K_PARENT: Final = "parent"
K_TURN: Final = "turn"
K_SERVICE_S: Final = "svc-s"
K_SERVICE_TOKENS: Final = "svc-tok"
K_IDLE: Final = "idle"
K_IDLE_DECLARED: Final = "idle-decl"
K_IDLE_EXPECTED: Final = "idle-exp"
K_IDLE_SOURCE: Final = "idle-src"
K_PRIORITY: Final = "prio"
K_FINAL: Final = "final"
K_DEADLINE: Final = "deadline-s"

# Printable ASCII except space-like control characters; ids go into headers verbatim.
_ID_RE: Final = re.compile(r"^[\x21-\x7e]+$")


def validate_id(value: str, what: str) -> str:
    """Check an id that will travel in a header: printable ASCII, no CR/LF, bounded."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{what} must not be empty")
    encoded = value.encode("utf-8", "surrogatepass")
    if len(encoded) > MAX_ID_BYTES:
        raise ValueError(f"{what} is {len(encoded)} bytes long; the limit is {MAX_ID_BYTES} bytes")
    if not _ID_RE.fullmatch(value):
        raise ValueError(
            f"{what} {value[:40]!r} contains a space, CR/LF, a non-printable or a non-ASCII "
            "character; ids travel in HTTP headers and must be printable ASCII"
        )
    return value


def validate_nonneg(value: float | None, what: str) -> float | None:
    """Check a duration: a finite number >= 0, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number of seconds, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


class CallMetadata(BaseModel):
    """Everything one call says about who it belongs to (protocol version 2).

    Dialects map these facts onto the fields each engine or router reads.
    """

    model_config = ConfigDict(frozen=True)

    call_id: str
    job_id: str
    session_id: str
    program_id: str
    parent_session_id: str | None = None
    root_session_id: str | None = None
    """The session at the root of this session's tree of sub-agents; None without a parent."""
    session_name: str | None = None
    """The session's name, as given to ``job.session(name)`` (the agent's name)."""
    blocks_parent: bool | None = None
    """Whether the parent session waits for this sub-agent's result; None when not said."""
    turn: int
    """0-based index of this call within its session."""
    first_turn: bool
    service_s: float
    """LLM seconds the program had received before this call (attained service)."""
    service_tokens: int
    """Prompt + completion tokens the program had received before this call."""
    idle_expected_s: float | None = None
    """Idle time the session expects after this call's reply (a tool wait), if known."""
    idle_expected_source: IdleSource | None = None
    """Where ``idle_expected_s`` came from; None exactly when it is None."""
    idle_s: float | None = None
    """Actual idle time between the session's previous reply and this call."""
    idle_declared_s: float | None = None
    """What the tool waits of that idle period declared with ``expected_s`` (their sum),
    so a server can compare declared and actual idle."""
    priority: int | None = None
    """Scheduling class, lower runs first; None when priorities are not sent."""
    expected_output_tokens: int | None = None
    """``max_tokens`` / ``max_completion_tokens`` of the request, when given."""
    final: bool = False
    """The caller said this is the session's last call (``final=True``): no turn follows."""
    deadline_s: float | None = None
    """Seconds left before the job's deadline when the call was sent; None without one."""
    echo: dict[str, str] = Field(default_factory=dict)
    """Response headers the session's dialect asked to echo back (e.g. llm-d's token)."""


_M = TypeVar("_M", bound=BaseModel)
_new = object.__new__
_set = object.__setattr__


def trusted_model(cls: type[_M], fields: dict[str, Any]) -> _M:
    """A ``cls`` of ``fields`` (every field, each of its declared type, no validators on
    ``cls``) not validated again: for the models agentrt builds on every call
    (:class:`CallMetadata`, ``CallReport``) from values it checked where they entered
    (ids at job and session creation). Equal to ``cls(**fields)`` for such values, at a
    third of the cost; tests/transport/test_hot_path.py compares the two."""
    model = _new(cls)
    _set(model, "__dict__", fields)
    _set(model, "__pydantic_fields_set__", set(fields))
    _set(model, "__pydantic_extra__", None)
    _set(model, "__pydantic_private__", None)
    return model


# -- writing ------------------------------------------------------------------------------


def _sf_string(value: str) -> str:
    if '"' in value or "\\" in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{value}"'


def _sf_integer(value: int) -> str:
    if value > MAX_SF_INTEGER:
        value = MAX_SF_INTEGER
    elif value < -MAX_SF_INTEGER:
        value = -MAX_SF_INTEGER
    return str(value)


_MAX_SECONDS_TEXT: Final = "999999999999.999"


def _sf_seconds(value: float) -> str:
    """Seconds as an RFC 9651 decimal: clamped, rounded to ms, no trailing zeros."""
    if not value > 0.0:  # also NaN and -0.0
        return "0.0"
    if value >= MAX_SECONDS:
        return _MAX_SECONDS_TEXT
    text = f"{value:.3f}".rstrip("0")
    return text + "0" if text[-1] == "." else text


_IDENTITY: dict[tuple[str, str, str, str | None], str] = {}
_IDENTITY_MAX: Final = 4096


def _identity(job: str, session: str, program: str, parent: str | None) -> str:
    """The part of the value fixed for a session's lifetime, rendered once per session.

    A bounded memo (cleared when full): the ids never change within a session, so the
    transport's calls after a session's first find their prefix here."""
    key = (job, session, program, parent)
    text = _IDENTITY.get(key)
    if text is None:
        text = f"v={PROTOCOL_VERSION}, {K_JOB}={_sf_string(job)}, {K_SESSION}={_sf_string(session)}"
        if program != job:
            text += f", {K_PROGRAM}={_sf_string(program)}"
        if parent is not None:
            text += f", {K_PARENT}={_sf_string(parent)}"
        if len(_IDENTITY) >= _IDENTITY_MAX:
            _IDENTITY.clear()
        _IDENTITY[key] = text
    return text


def agentrt_header_value(meta: CallMetadata) -> str:
    """The ``x-agentrt`` value of one call: an RFC 9651 dictionary (docs/protocol.md)."""
    # On every call's path: the common cases are inlined (plain ids, in-range integers).
    call = meta.call_id
    if '"' in call or "\\" in call:
        call = _sf_string(call)[1:-1]
    turn, tokens = meta.turn, meta.service_tokens
    text = (
        f"{_identity(meta.job_id, meta.session_id, meta.program_id, meta.parent_session_id)}"
        f', {K_CALL}="{call}"'
        f", {K_TURN}={turn if 0 <= turn <= MAX_SF_INTEGER else _sf_integer(turn)}"
        f", {K_SERVICE_S}={_sf_seconds(meta.service_s)}"
        f", {K_SERVICE_TOKENS}={tokens if 0 <= tokens <= MAX_SF_INTEGER else _sf_integer(tokens)}"
    )
    if meta.idle_s is not None:
        text += f", {K_IDLE}={_sf_seconds(meta.idle_s)}"
    if meta.idle_declared_s is not None:
        text += f", {K_IDLE_DECLARED}={_sf_seconds(meta.idle_declared_s)}"
    if meta.idle_expected_s is not None:
        text += f", {K_IDLE_EXPECTED}={_sf_seconds(meta.idle_expected_s)}"
        if meta.idle_expected_source is not None:
            text += f", {K_IDLE_SOURCE}={meta.idle_expected_source}"
    if meta.priority is not None:
        text += f", {K_PRIORITY}={_sf_integer(meta.priority)}"
    if meta.final:
        text += f", {K_FINAL}"
    if meta.deadline_s is not None:
        text += f", {K_DEADLINE}={_sf_seconds(meta.deadline_s)}"
    return text


def agentrt_headers(meta: CallMetadata) -> dict[str, str]:
    """agentrt's own header for one call: the ``generic`` dialect, sent by every dialect."""
    return {HEADER: agentrt_header_value(meta)}


# -- reading ------------------------------------------------------------------------------


class _Token(str):
    """An RFC 9651 token (a bare word), told apart from a string."""

    __slots__ = ()


class _SfError(ValueError):
    pass


_KEY_RE: Final = re.compile(r"[a-z*][a-z0-9_\-.*]*")
_NUMBER_RE: Final = re.compile(r"-?[0-9]+(?:\.[0-9]*)?")
_TOKEN_RE: Final = re.compile(r"[A-Za-z*][!#$%&'*+\-.^_`|~0-9A-Za-z:/]*")
_BYTES_RE: Final = re.compile(r":([A-Za-z0-9+/=]*):")
_STRING_RE: Final = re.compile(r'"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"')
_UNESCAPE_RE: Final = re.compile(r"\\(.)")
_FAST_MEMBER_RE: Final = re.compile(
    r"([a-z*][a-z0-9_\-.*]*)(?:=(?:(-?[0-9]{1,12}\.[0-9]{1,3})|(-?[0-9]{1,15})"
    r'|"([\x20\x21\x23-\x5b\x5d-\x7e]*)"'
    r"|([A-Za-z*][!#$%&'*+\-.^_`|~0-9A-Za-z:/]*)|\?([01])))?"
)
_FAST_SEP_RE: Final = re.compile(r"[ \t]*(?:(,)[ \t]*)?")


class _Parser:
    """RFC 9651 section 4.2, for a Dictionary: every type is parsed (so unknown keys of
    any type can be skipped), values of known keys are checked by the caller."""

    __slots__ = ("pos", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, what: str) -> _SfError:
        return _SfError(f"{what} at character {self.pos}")

    def skip(self, chars: str) -> None:
        text, pos = self.text, self.pos
        while pos < len(text) and text[pos] in chars:
            pos += 1
        self.pos = pos

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def dictionary(self) -> dict[str, object]:
        out: dict[str, object] = {}
        self.skip(" ")
        while self.pos < len(self.text):
            key = self.key()
            if self.peek() == "=":
                self.pos += 1
                value = self.inner_list() if self.peek() == "(" else self.bare_item()
            else:
                value = True
            self.parameters()
            out[key] = value  # a repeated key: the last one wins (RFC 9651)
            self.skip(" \t")
            if self.pos >= len(self.text):
                break
            if self.peek() != ",":
                raise self.fail("expected ',' between members")
            self.pos += 1
            self.skip(" \t")
            if self.pos >= len(self.text):
                raise self.fail("trailing ','")
        return out

    def key(self) -> str:
        m = _KEY_RE.match(self.text, self.pos)
        if m is None:
            raise self.fail("expected a key (lower case letter or '*' first)")
        self.pos = m.end()
        return m.group()

    def parameters(self) -> None:
        while self.peek() == ";":
            self.pos += 1
            self.skip(" ")
            self.key()
            if self.peek() == "=":
                self.pos += 1
                self.bare_item()

    def inner_list(self) -> list[object]:
        self.pos += 1  # "("
        items: list[object] = []
        while True:
            self.skip(" ")
            if self.peek() == ")":
                self.pos += 1
                return items
            items.append(self.bare_item())
            self.parameters()
            if self.peek() not in (" ", ")"):
                raise self.fail("expected ' ' or ')' in an inner list")

    def bare_item(self) -> object:
        c = self.peek()
        text = self.text
        if c == "-" or (c.isdigit() and c.isascii()):
            return self.number()
        if c == '"':
            m = _STRING_RE.match(text, self.pos)
            if m is None:
                raise self.fail("bad string (unescaped '\"' or '\\', or a non-printable)")
            self.pos = m.end()
            return _UNESCAPE_RE.sub(r"\1", m.group(1))
        if c == "*" or (c.isalpha() and c.isascii()):
            m = _TOKEN_RE.match(text, self.pos)
            assert m is not None  # the first character matches
            self.pos = m.end()
            return _Token(m.group())
        if c == ":":
            m = _BYTES_RE.match(text, self.pos)
            if m is None:
                raise self.fail("bad byte sequence")
            self.pos = m.end()
            try:
                return base64.b64decode(m.group(1), validate=True)
            except binascii.Error:
                raise self.fail("bad base64 in a byte sequence") from None
        if c == "?":
            value = text[self.pos + 1 : self.pos + 2]
            if value not in ("0", "1"):
                raise self.fail("bad boolean")
            self.pos += 2
            return value == "1"
        if c == "@":
            self.pos += 1
            seconds = self.number()
            if not isinstance(seconds, int):
                raise self.fail("a date must be an integer")
            return ("date", seconds)
        if c == "%":
            return self.display_string()
        raise self.fail(f"unexpected {c!r}" if c else "missing value")

    def number(self) -> int | float:
        m = _NUMBER_RE.match(self.text, self.pos)
        if m is None:
            raise self.fail("expected a digit")
        digits = m.group().lstrip("-")
        whole, dot, frac = digits.partition(".")
        if dot:
            if len(whole) > 12 or not 1 <= len(frac) <= 3:
                raise self.fail("a decimal has at most 12 integer and 1 to 3 fraction digits")
        elif len(whole) > 15:
            raise self.fail("an integer has at most 15 digits")
        self.pos = m.end()
        return float(m.group()) if dot else int(m.group())

    def display_string(self) -> str:
        if self.text[self.pos + 1 : self.pos + 2] != '"':
            raise self.fail("bad display string")
        self.pos += 2
        out = bytearray()
        text = self.text
        while self.pos < len(text):
            c = text[self.pos]
            self.pos += 1
            if c == '"':
                try:
                    return out.decode("utf-8")
                except UnicodeDecodeError:
                    raise self.fail("bad UTF-8 in a display string") from None
            if c == "%":
                hexa = text[self.pos : self.pos + 2]
                if not re.fullmatch(r"[0-9a-f]{2}", hexa):
                    raise self.fail("bad %-escape in a display string")
                out.append(int(hexa, 16))
                self.pos += 2
            elif " " <= c <= "~":
                out.append(ord(c))
            else:
                raise self.fail("bad character in a display string")
        raise self.fail("unterminated display string")


def _sf_dictionary(value: str) -> dict[str, object]:
    try:
        value.encode("ascii")
    except UnicodeEncodeError:
        raise _SfError("a non-ASCII character") from None
    fast = _plain_dictionary(value)
    if fast is not None:
        return fast
    parser = _Parser(value)
    return parser.dictionary()


def _plain_dictionary(text: str) -> dict[str, object] | None:
    """The common dictionary (members of integers, decimals, strings without escapes,
    tokens and booleans; no parameters, inner lists or byte sequences) as
    :meth:`_Parser.dictionary` reads it, a regular expression per member instead of a
    character at a time; None for anything else (the parser then reads it, or says what
    is wrong)."""
    out: dict[str, object] = {}
    pos, end = len(text) - len(text.lstrip(" ")), len(text)
    member, sep = _FAST_MEMBER_RE.match, _FAST_SEP_RE.match
    while pos < end:
        m = member(text, pos)
        if m is None:
            return None
        key, dec, num, string, token, boolean = m.groups()
        if dec is not None:
            value: object = float(dec)
        elif num is not None:
            value = int(num)
        elif string is not None:
            value = string
        elif token is not None:
            value = _Token(token)
        elif boolean is not None:
            value = boolean == "1"
        elif m.end() - m.start() == len(key):
            value = True
        else:  # pragma: no cover - the pattern matches a key alone or key=item
            return None
        out[key] = value
        s = sep(text, m.end())
        assert s is not None  # matches the empty string
        pos = s.end()
        if pos >= end:
            return out if s.group(1) is None else None  # a trailing ',': the parser says
        if s.group(1) is None:
            return None  # not a ',' between members: the parser says what is wrong
    return out


def _req(fields: dict[str, object], key: str) -> object:
    if key not in fields:
        raise ValueError(f"{HEADER}: key {key!r} is missing")
    return fields[key]


def _id_of(value: object, key: str) -> str:
    if not isinstance(value, str) or isinstance(value, _Token):
        raise ValueError(f"{HEADER}: key {key!r} must be a string, got {value!r}")
    return validate_id(value, f"{HEADER}: key {key!r}")


def _int_of(value: object, key: str, low: int = -MAX_SF_INTEGER) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        bound = f" >= {low}" if low > -MAX_SF_INTEGER else ""
        raise ValueError(f"{HEADER}: key {key!r} must be an integer{bound}, got {value!r}")
    return value


def _seconds_of(value: object, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{HEADER}: key {key!r} must be a number of seconds >= 0, got {value!r}")
    return float(value)


def parse_agentrt_header(value: str) -> CallMetadata:
    """Read an ``x-agentrt`` value (version 2) into :class:`CallMetadata`.

    Strict: the value must be an RFC 9651 dictionary with ``v=2`` and every required key
    of the right type; a ``ValueError`` names the first bad key. Unknown keys, and
    parameters on any member, are ignored. ``program_id`` defaults to the job,
    ``first_turn`` is ``turn == 0``; ``echo`` and ``expected_output_tokens`` are not sent.
    """
    if not isinstance(value, str):
        raise TypeError(f"{HEADER} value must be a str, got {type(value).__name__}")
    if len(value) > MAX_HEADER_BYTES:
        raise ValueError(
            f"{HEADER} value is {len(value)} bytes long; the limit is {MAX_HEADER_BYTES}"
        )
    try:
        fields = _sf_dictionary(value)
    except _SfError as exc:
        raise ValueError(f"{HEADER} value is not an RFC 9651 dictionary: {exc}") from None
    version = _req(fields, K_VERSION)
    if (
        not isinstance(version, int)
        or isinstance(version, bool)
        or str(version) != PROTOCOL_VERSION
    ):
        raise ValueError(
            f"{HEADER}: key 'v' is {version!r}; this reader reads version {PROTOCOL_VERSION}"
        )
    job = _id_of(_req(fields, K_JOB), K_JOB)
    turn = _int_of(_req(fields, K_TURN), K_TURN, 0)
    get = fields.get
    program, parent = get(K_PROGRAM), get(K_PARENT)
    idle, declared = get(K_IDLE), get(K_IDLE_DECLARED)
    expected, source, priority = get(K_IDLE_EXPECTED), get(K_IDLE_SOURCE), get(K_PRIORITY)
    final, deadline = get(K_FINAL, False), get(K_DEADLINE)
    if not isinstance(final, bool):
        raise ValueError(f"{HEADER}: key {K_FINAL!r} must be a boolean, got {final!r}")
    source_of: IdleSource | None = None
    if source is not None:
        if expected is None:
            raise ValueError(f"{HEADER}: key {K_IDLE_SOURCE!r} is sent without {K_IDLE_EXPECTED!r}")
        if not isinstance(source, _Token) or source not in ("declared", "predicted"):
            raise ValueError(
                f"{HEADER}: key {K_IDLE_SOURCE!r} must be the token declared or predicted, "
                f"got {source!r}"
            )
        source_of = "declared" if source == "declared" else "predicted"
    return CallMetadata(
        call_id=_id_of(_req(fields, K_CALL), K_CALL),
        job_id=job,
        session_id=_id_of(_req(fields, K_SESSION), K_SESSION),
        program_id=job if program is None else _id_of(program, K_PROGRAM),
        parent_session_id=None if parent is None else _id_of(parent, K_PARENT),
        turn=turn,
        first_turn=turn == 0,
        service_s=_seconds_of(_req(fields, K_SERVICE_S), K_SERVICE_S),
        service_tokens=_int_of(_req(fields, K_SERVICE_TOKENS), K_SERVICE_TOKENS, 0),
        idle_expected_s=None if expected is None else _seconds_of(expected, K_IDLE_EXPECTED),
        idle_expected_source=source_of,
        idle_s=None if idle is None else _seconds_of(idle, K_IDLE),
        idle_declared_s=None if declared is None else _seconds_of(declared, K_IDLE_DECLARED),
        priority=None if priority is None else _int_of(priority, K_PRIORITY),
        final=final,
        deadline_s=None if deadline is None else _seconds_of(deadline, K_DEADLINE),
    )
