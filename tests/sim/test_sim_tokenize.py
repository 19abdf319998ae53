"""The simulator's tokenizer: exact token counts and block structure from block markers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrt.sim import count_tokens, output_text, prompt_for_blocks
from agentrt.sim._kv import KVCache
from agentrt.sim._tokenize import PromptError, Tokenizer, runs_length, slice_runs


def test_plain_text_is_four_bytes_per_token() -> None:
    assert count_tokens("") == 0
    assert count_tokens("abcd") == 1
    assert count_tokens("Hello world") == 3
    assert count_tokens("é") == 1  # two UTF-8 bytes


def test_prompt_for_blocks_compresses_runs() -> None:
    text = prompt_for_blocks([1, 2, 3, 7, 8], 64, tail_tokens=5, namespace="s1")
    assert text == "<|b:s1:1:3:64|><|b:s1:7:2:64|><|p:s1:9:5:64|>"
    assert count_tokens(text) == 5 * 64 + 5
    assert prompt_for_blocks(range(10, 20)) == "<|b::10:10:64|>"
    assert prompt_for_blocks([], tail_tokens=3) == "<|p::0:3:64|>"
    assert prompt_for_blocks([4], tail_tokens=3, tail_id=99) == "<|b::4:1:64|><|p::99:3:64|>"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"namespace": "a b"}, "namespace"),
        ({"tail_tokens": 64}, "tail_tokens"),
        ({"block_size": 0}, "block_size"),
    ],
)
def test_prompt_for_blocks_rejects_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        prompt_for_blocks([1], **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=">= 0"):
        prompt_for_blocks([-1])


@pytest.mark.parametrize("bs", [16, 64, 128, 48])
def test_blocks_tokenize_exactly(bs: int) -> None:
    tok = Tokenizer(bs)
    ids = [*range(100, 130), 500, 501, 9]
    p = tok.chat([{"role": "user", "content": prompt_for_blocks(ids, 64, tail_tokens=40)}])
    assert p.num_tokens == len(ids) * 64 + 40
    assert runs_length(p.runs) == p.num_tokens // bs
    if 64 % bs == 0:  # run-length keys: a few runs, however many blocks
        assert len(p.runs) == 3  # the tail continues the run of block 9


def test_messages_concatenate_without_template_tokens() -> None:
    tok = Tokenizer(16)
    one = tok.chat([{"role": "user", "content": prompt_for_blocks(range(4), 64)}])
    two = tok.chat(
        [
            {"role": "system", "content": prompt_for_blocks(range(2), 64)},
            {
                "role": "user",
                "content": [{"type": "text", "text": prompt_for_blocks(range(2, 4), 64)}],
            },
        ]
    )
    assert one.runs == two.runs


def test_completion_prompts() -> None:
    tok = Tokenizer(4)
    assert tok.completion("abcdefgh").num_tokens == 2
    assert tok.completion(["abcd"]).num_tokens == 1
    p = tok.completion(list(range(10)))
    assert p.num_tokens == 10 and runs_length(p.runs) == 2
    for bad in ([], [1.5], [[1], [2]], {"a": 1}):
        with pytest.raises(PromptError):
            tok.completion(bad)
    with pytest.raises(PromptError):
        tok.chat([])
    with pytest.raises(PromptError):
        tok.chat([{"role": "user", "content": 3}])


def test_output_text_has_the_requested_tokens() -> None:
    for n in (1, 7, 100, 9000, 20000):
        assert count_tokens(output_text(n)) == n
    assert output_text(5) == output_text(9)[:20]


def test_reply_blocks_match_a_resent_reply() -> None:
    """A chat that sends the reply back hits the reply's blocks (same token stream)."""
    tok = Tokenizer(16)
    first = [{"role": "user", "content": "x" * 100}]
    p = tok.chat(first)
    cont = p.continuation_runs(50)
    again = tok.chat([*first, {"role": "assistant", "content": output_text(50)}])
    assert again.runs[: len(p.runs)] == p.runs
    assert again.runs[len(p.runs) :][: len(cont)] == cont


def test_slice_runs() -> None:
    runs = [("a", 0, 5), ("b", 10, 3)]
    assert slice_runs(runs, 0, 8) == runs
    assert slice_runs(runs, 2, 7) == [("a", 2, 3), ("b", 10, 2)]
    assert slice_runs(runs, 6, 8) == [("b", 11, 2)]
    assert slice_runs(runs, 3, 3) == []


def _shared_blocks(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@given(
    a=st.lists(st.integers(0, 40), max_size=30),
    b=st.lists(st.integers(0, 40), max_size=30),
    tail_a=st.integers(0, 63),
    bs=st.sampled_from([16, 32, 64, 128]),
)
def test_prefix_sharing_follows_block_ids(a: list[int], b: list[int], tail_a: int, bs: int) -> None:
    """Two prompts share cached blocks exactly as far as their leading block ids agree."""
    tok = Tokenizer(bs)
    pa = tok.chat([{"role": "user", "content": prompt_for_blocks(a, 64, tail_a)}])
    pb = tok.chat([{"role": "user", "content": prompt_for_blocks(b, 64)}])
    assert pa.num_tokens == 64 * len(a) + tail_a
    kv = KVCache(10_000, 0, False)
    m = kv.match(pa.runs, 10_000)
    kv.admit(m, runs_length(pa.runs), "s", 0.0)
    node = kv.insert(kv.root, pa.runs, runs_length(pa.runs), "s", 0.0) if pa.runs else None
    hit = kv.match(pb.runs, 10_000).blocks
    shared = _shared_blocks(a, b)
    expected = min(64 * shared, 64 * len(b)) // bs
    next_id = a[-1] + 1 if a else 0
    if shared == len(a) and len(b) > len(a) and b[len(a)] == next_id and 64 % bs == 0:
        expected += tail_a // bs  # a's tail is the head of block next_id, which b holds
    assert hit == expected
    kv.release(node, kv.private, 1.0)
    kv.check()
