"""The x-agentrt header (protocol version 2): writer, reader, round trips and bounds."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrt._protocol import (
    HEADER,
    MAX_HEADER_BYTES,
    MAX_SECONDS,
    MAX_SF_INTEGER,
    PROTOCOL_VERSION,
    CallMetadata,
    agentrt_header_value,
    agentrt_headers,
    parse_agentrt_header,
)

BASE = 'v=2, job="j1", session="s1", call="c1", turn=3, svc-s=1.25, svc-tok=812'


def meta(**overrides: Any) -> CallMetadata:
    fields: dict[str, Any] = {
        "call_id": "c1",
        "job_id": "j1",
        "session_id": "s1",
        "program_id": "j1",
        "turn": 3,
        "first_turn": False,
        "service_s": 1.25,
        "service_tokens": 812,
    }
    fields.update(overrides)
    return CallMetadata(**fields)


# --------------------------------------------------------------------------- writing


def test_one_header_with_the_example_value() -> None:
    m = meta(idle_s=4.1, idle_expected_s=5.0, idle_expected_source="declared")
    assert PROTOCOL_VERSION == "2"
    assert agentrt_headers(m) == {
        HEADER: BASE + ", idle=4.1, idle-exp=5.0, idle-src=declared",
    }


def test_optional_keys_and_derived_ones() -> None:
    assert agentrt_header_value(meta()) == BASE  # program == job and first-turn: derived
    full = meta(
        program_id="p1",
        parent_session_id="s0",
        idle_s=0.0,
        idle_declared_s=2.5,
        idle_expected_s=7.0,
        idle_expected_source="predicted",
        priority=-4,
    )
    assert agentrt_header_value(full) == (
        'v=2, job="j1", session="s1", program="p1", parent="s0", call="c1", turn=3, '
        "svc-s=1.25, svc-tok=812, idle=0.0, idle-decl=2.5, idle-exp=7.0, idle-src=predicted, "
        "prio=-4"
    )


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0.0"),
        (-0.0, "0.0"),
        (-3.0, "0.0"),
        (math.nan, "0.0"),
        (0.0004, "0.0"),
        (0.0005, "0.001"),
        (1.0, "1.0"),
        (10.0, "10.0"),
        (1.2345, "1.234"),
        (12.3, "12.3"),
        (1e12, "999999999999.999"),
        (math.inf, "999999999999.999"),
    ],
)
def test_seconds_are_sf_decimals(seconds: float, text: str) -> None:
    assert agentrt_header_value(meta(service_s=seconds)) == BASE.replace("1.25", text)


def test_integers_are_clamped_to_the_sf_range() -> None:
    value = agentrt_header_value(meta(priority=10**20, service_tokens=10**16))
    assert "svc-tok=999999999999999" in value and value.endswith("prio=999999999999999")
    assert agentrt_header_value(meta(priority=-(10**20))).endswith("prio=-999999999999999")


def test_ids_are_escaped_sf_strings() -> None:
    value = agentrt_header_value(meta(call_id='a"b\\c'))
    assert 'call="a\\"b\\\\c"' in value
    assert parse_agentrt_header(value).call_id == 'a"b\\c'


def test_size_bound() -> None:
    worst = meta(
        call_id='"' * 128,
        job_id='"' * 128,
        session_id='"' * 128,
        program_id="\\" * 128,
        parent_session_id='"' * 128,
        turn=MAX_SF_INTEGER,
        service_s=MAX_SECONDS,
        service_tokens=MAX_SF_INTEGER,
        idle_s=MAX_SECONDS,
        idle_declared_s=MAX_SECONDS,
        idle_expected_s=MAX_SECONDS,
        idle_expected_source="predicted",
        priority=-MAX_SF_INTEGER,
        final=True,
        deadline_s=MAX_SECONDS,
    )
    assert len(agentrt_header_value(worst)) == 1563 <= MAX_HEADER_BYTES
    plain = worst.model_copy(
        update={k: c * 128 for k, c in (("call_id", "a"), ("job_id", "b"), ("session_id", "c"))}
        | {"program_id": "d" * 128, "parent_session_id": "e" * 128}
    )
    assert len(agentrt_header_value(plain)) == 923 <= 1024
    assert parse_agentrt_header(agentrt_header_value(worst)) == worst


# --------------------------------------------------------------------------- reading

ids = st.text(alphabet=st.sampled_from('"\\abz09-_:;=,()*'), min_size=1, max_size=128) | st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=128
)
seconds = st.none() | st.floats(min_value=0.0, max_value=1e14) | st.sampled_from([0.0, 1e-4])


@st.composite
def metadata(draw: st.DrawFn) -> CallMetadata:
    turn = draw(st.integers(min_value=0, max_value=2**64))
    expected = draw(seconds)
    job = draw(ids)
    return CallMetadata(
        call_id=draw(ids),
        job_id=job,
        session_id=draw(ids),
        program_id=draw(st.just(job) | ids),
        parent_session_id=draw(st.none() | ids),
        turn=turn,
        first_turn=turn == 0,
        service_s=draw(st.floats(min_value=0.0, max_value=1e14)),
        service_tokens=draw(st.integers(min_value=0, max_value=2**64)),
        idle_expected_s=expected,
        idle_expected_source=None
        if expected is None
        else draw(st.none() | st.sampled_from(["declared", "predicted"])),
        idle_s=draw(seconds),
        idle_declared_s=draw(seconds),
        priority=draw(st.none() | st.integers(min_value=-(2**70), max_value=2**70)),
        final=draw(st.booleans()),
        deadline_s=draw(seconds),
    )


def _close(read: float | None, sent: float | None) -> bool:
    if sent is None:
        return read is None
    return read is not None and math.isclose(read, min(sent, MAX_SECONDS), abs_tol=5.001e-4)


def _clamp(value: int | None) -> int | None:
    return None if value is None else max(-MAX_SF_INTEGER, min(MAX_SF_INTEGER, value))


@settings(max_examples=300, deadline=None)
@given(metadata())
def test_round_trip(sent: CallMetadata) -> None:
    value = agentrt_header_value(sent)
    assert re.fullmatch(r"[\x20-\x7e]+", value) and len(value) <= MAX_HEADER_BYTES
    read = parse_agentrt_header(value)
    same = (
        "call_id",
        "job_id",
        "session_id",
        "program_id",
        "parent_session_id",
        "first_turn",
        "idle_expected_source",
        "final",
    )
    for name in same:
        assert getattr(read, name) == getattr(sent, name), name
    assert read.turn == _clamp(sent.turn)
    assert read.service_tokens == _clamp(sent.service_tokens)
    assert read.priority == _clamp(sent.priority)
    for name in ("service_s", "idle_s", "idle_declared_s", "idle_expected_s", "deadline_s"):
        assert _close(getattr(read, name), getattr(sent, name)), name
    assert read.echo == {} and read.expected_output_tokens is None
    # What was read writes back to the same text.
    assert agentrt_header_value(read) == value


@pytest.mark.parametrize(
    "value",
    [
        "  " + BASE + "  ",
        BASE.replace(", ", ","),
        BASE.replace(", ", " ,\t "),
        BASE.replace("turn=3", "turn=3;unit=calls;x"),
        BASE + ", svc-s=1.250",  # a repeated key: the last one wins; trailing zeros
        BASE + ', zz=(1 "a" tok ?0);p=1, flag, b=:aGk=:, d=@1700000000, t=a/b:c, n=-1.5',
        BASE + ', ds=%"caf%c3%a9", *star=1, x.y_z-1="q"',
    ],
)
def test_reader_is_tolerant(value: str) -> None:
    read = parse_agentrt_header(value)
    assert (read.call_id, read.job_id, read.session_id, read.program_id) == ("c1", "j1", "s1", "j1")
    assert (read.turn, read.first_turn, read.service_s, read.service_tokens) == (
        3,
        False,
        1.25,
        812,
    )
    assert read.idle_s is None and read.priority is None


def test_reader_defaults_and_sources() -> None:
    read = parse_agentrt_header(
        BASE.replace("turn=3", "turn=0") + ", idle-exp=2, idle-src=predicted"
    )
    assert read.first_turn and read.idle_expected_s == 2.0
    assert read.idle_expected_source == "predicted"
    assert parse_agentrt_header(BASE + ", idle-exp=2.5").idle_expected_source is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "'v' is missing"),
        ('v=1, job="j"', "'v' is 1"),
        (BASE.replace("v=2", "v=2.0"), "'v' is 2.0"),
        (BASE.replace("v=2", 'v="2"'), "'v' is '2'"),
        (BASE.replace('call="c1", ', ""), "'call' is missing"),
        (BASE.replace('job="j1"', "job=j1"), "'job' must be a string"),
        (BASE.replace('session="s1"', 'session="s 1"'), "'session'"),
        (BASE.replace('session="s1"', 'session=""'), "'session' must not be empty"),
        (BASE.replace('call="c1"', f'call="{"c" * 129}"'), "'call' is 129 bytes"),
        (BASE + ", parent=?1", "'parent' must be a string"),
        (BASE.replace("turn=3", "turn=-1"), "'turn' must be an integer >= 0"),
        (BASE.replace("turn=3", "turn=3.0"), "'turn' must be an integer"),
        (BASE.replace("turn=3", "turn"), "'turn' must be an integer"),
        (BASE.replace("svc-tok=812", "svc-tok=812.5"), "'svc-tok' must be an integer"),
        (BASE.replace("svc-s=1.25", "svc-s=-1.25"), "'svc-s' must be a number of seconds"),
        (BASE.replace("svc-s=1.25", 'svc-s="1.25"'), "'svc-s' must be a number of seconds"),
        (BASE + ", idle=x", "'idle' must be a number of seconds"),
        (BASE + ", idle-decl=?0", "'idle-decl' must be a number of seconds"),
        (BASE + ", prio=1.5", "'prio' must be an integer"),
        (BASE + ", idle-src=declared", "'idle-src' is sent without 'idle-exp'"),
        (BASE + ", idle-exp=1, idle-src=learned", "'idle-src' must be the token"),
        (BASE + ', idle-exp=1, idle-src="declared"', "'idle-src' must be the token"),
        (BASE + ",", "trailing ','"),
        (BASE + " x=1", "expected ','"),
        (BASE + ", Upper=1", "expected a key"),
        (BASE + ", x=1.2345", "fraction digits"),
        (BASE + ", x=1234567890123456", "at most 15 digits"),
        (BASE + ', x="a\\b"', "bad string"),
        (BASE + ', x="open', "bad string"),
        (BASE + ", x=", "missing value"),
        (BASE + ", x=?2", "bad boolean"),
        (BASE + ", x=:!!:", "bad byte sequence"),
        (BASE + ', x="é"', "non-ASCII"),
        (BASE + ", x=" + "1" * MAX_HEADER_BYTES, "the limit is 2048"),
    ],
)
def test_reader_rejects_with_the_bad_key(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_agentrt_header(value)


def test_reader_wants_a_str() -> None:
    with pytest.raises(TypeError):
        parse_agentrt_header(b"v=2")  # type: ignore[arg-type]


def test_plain_dictionary_reads_as_the_parser_does() -> None:
    """The regular-expression reader of common dictionaries gives what the full parser
    gives, or leaves the value to it (random members, valid and not)."""
    import random

    from agentrt._protocol import _Parser, _plain_dictionary, _SfError, _Token

    rng = random.Random(7)
    items = [
        "1",
        "-12",
        "0",
        "123456789012345",
        "1234567890123456",
        "1.5",
        "-0.25",
        "1.",
        "1.2345",
        '"abc"',
        '"a b,c"',
        '"a\\"b"',
        '""',
        "tok",
        "*t:/x",
        "?0",
        "?1",
        "?2",
        ":YWJj:",
        "(1 2)",
        "x;p=1",
        "1;q",
        "-",
        "a-b",
        '%"x"',
    ]
    keys = ["a", "job", "t0", "*k", "a.b-c_d", "A", "9x"]
    seps = [",", ", ", " ,", "\t,\t", ",,", " ", ""]
    for _ in range(4000):
        parts = []
        for _ in range(rng.randint(0, 4)):
            key = rng.choice(keys)
            parts.append(key if rng.random() < 0.15 else f"{key}={rng.choice(items)}")
            parts.append(rng.choice(seps))
        text = rng.choice(["", " ", "  "]) + "".join(parts[:-1] if parts else [])
        text += rng.choice(["", " ", "\t", ","])
        fast = _plain_dictionary(text)
        try:
            full: dict[str, object] | None = _Parser(text).dictionary()
        except _SfError:
            full = None
        if fast is not None:
            assert full is not None, text
            assert fast == full, text
            assert [type(v) for v in fast.values()] == [type(v) for v in full.values()], text
            assert all(
                isinstance(a, _Token) == isinstance(b, _Token)
                for a, b in zip(fast.values(), full.values(), strict=True)
            )
