"""The embedded engine's deterministic tokenizer and its block keys.

Text is tokenized in two ways (docs/sim.md, "Tokens"):

- **plain text**: its UTF-8 bytes, cut into tokens of 4 bytes (the last one padded with NUL
  bytes), so ``count_tokens("Hello world") == 3``;
- **block markers**, text a workload writes to stand for synthetic content of an exact size
  and sharing structure:

  - ``<|b:NS:FIRST:COUNT:SIZE|>`` is ``COUNT`` blocks of ``SIZE`` tokens each, with the block
    ids ``FIRST .. FIRST+COUNT-1`` in namespace ``NS``;
  - ``<|p:NS:ID:N:SIZE|>`` is the first ``N`` tokens of block ``ID`` (a partial block).

  Token ``j`` of block ``(NS, SIZE, ID)`` is the same token wherever it appears, so two
  prompts share a prefix exactly as far as their block ids agree.

A chat prompt is the concatenation of its messages' tokens (the template adds none). The
engine cuts the token stream into KV blocks of ``block_size`` tokens; each block's identity
is its content *under the identity of the block before it* (the radix tree in ``_kv``
realises vLLM's chained block hashes). Keys are kept **run-length encoded**: a run
``(tag, start, count)`` stands for the keys ``(tag, start) .. (tag, start + count - 1)``, so a
prompt of 2000 blocks written as 3 markers costs 3 runs, not 2000 hashes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

__all__ = [
    "Prompt",
    "PromptError",
    "Run",
    "Tokenizer",
    "count_tokens",
    "output_text",
    "prompt_for_blocks",
    "runs_length",
    "slice_runs",
]

Run = tuple[Any, int, int]
"""``(tag, start, count)``: the block keys ``(tag, start + i)`` for ``i < count``."""

_MARKER_RE: Final = re.compile(r"<\|([bp]):([A-Za-z0-9_.\-]*):(\d{1,18}):(\d{1,12}):(\d{1,9})\|>")
_NS_RE: Final = re.compile(r"^[A-Za-z0-9_.\-]*$")
_TOKEN_BYTES: Final = 4


class PromptError(ValueError):
    """A request's prompt cannot be tokenized (bad marker, bad content type)."""


def _pad(data: bytes) -> bytes:
    rem = len(data) % _TOKEN_BYTES
    return data + b"\0" * (_TOKEN_BYTES - rem) if rem else data


def count_tokens(text: str) -> int:
    """Tokens of one message's text under the embedded engine's tokenizer."""
    total = 0
    pos = 0
    for m in _MARKER_RE.finditer(text):
        total += -(-len(text[pos : m.start()].encode()) // _TOKEN_BYTES)
        kind, _ns, _a, b, size = m.groups()
        total += int(b) * int(size) if kind == "b" else int(b)
        pos = m.end()
    total += -(-len(text[pos:].encode()) // _TOKEN_BYTES)
    return total


def prompt_for_blocks(
    block_ids: Iterable[int],
    block_size: int = 64,
    tail_tokens: int = 0,
    *,
    namespace: str = "",
    tail_id: int | None = None,
) -> str:
    """Prompt text that tokenizes to exactly the given blocks, then ``tail_tokens`` more.

    Consecutive ids are written as one marker, so a prompt of thousands of blocks stays a few
    dozen bytes. ``tail_tokens`` (< ``block_size``) are the first tokens of block
    ``tail_id`` (default: the last id + 1, which is what the next turn of a growing
    conversation usually names). Prompts built with the same ``namespace`` share a cached
    prefix exactly as long as their leading block ids agree; concatenating two results
    (e.g. a shared system prompt in one namespace, then a session's own blocks) keeps that.
    """
    if not _NS_RE.match(namespace):
        raise ValueError(f"namespace {namespace!r} may only hold letters, digits, '_', '.', '-'")
    if block_size <= 0:
        raise ValueError("block_size must be > 0")
    if not 0 <= tail_tokens < block_size:
        raise ValueError(f"tail_tokens must be in [0, block_size), got {tail_tokens}")
    ids = block_ids if isinstance(block_ids, list | range) else list(block_ids)
    parts = [f"<|b:{namespace}:{first}:{count}:{block_size}|>" for first, count in _id_runs(ids)]
    last: int | None = ids[-1] if len(ids) else None
    if tail_tokens:
        tid = tail_id if tail_id is not None else (0 if last is None else last + 1)
        parts.append(f"<|p:{namespace}:{tid}:{tail_tokens}:{block_size}|>")
    return "".join(parts)


def _id_runs(ids: list[int] | range) -> list[tuple[int, int]]:
    """Maximal runs of consecutive ids as ``(first, count)``.

    Each run's end is found by galloping and bisection on ``ids[j] - ids[i] == j - i`` and
    then verified with one C-level list comparison, so a list made of a few long runs costs a
    few dozen Python operations, not one per id.
    """
    if isinstance(ids, range):
        if ids.step == 1:
            if len(ids) and ids.start < 0:
                raise ValueError(f"block ids must be >= 0, got {ids.start}")
            return [(ids.start, len(ids))] if len(ids) else []
        ids = list(ids)
    out: list[tuple[int, int]] = []
    n = len(ids)
    i = 0
    while i < n:
        v = ids[i]
        if v < 0:
            raise ValueError(f"block ids must be >= 0, got {v}")
        lo = 0  # ids[i + lo] == v + lo holds
        step = 1
        while i + step < n and ids[i + step] - v == step:
            lo = step
            step *= 2
        hi = min(step, n - i)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ids[i + mid] - v == mid:
                lo = mid
            else:
                hi = mid
        k = lo + 1
        if k > 2 and ids[i : i + k] != list(range(v, v + k)):
            k = 1  # ids not monotonic here: walk this run one by one
            while i + k < n and ids[i + k] == v + k:
                k += 1
        out.append((v, k))
        i += k
    return out


_WORDS: Final = tuple(
    f"{c1}{c2}{c3} " for c1 in "bdfgklmnprstvz" for c2 in "aeiou" for c3 in "lnrstx"
)
_OUT_CACHE: list[str] = []


def output_text(num_tokens: int) -> str:
    """The deterministic text of a reply of ``num_tokens`` tokens (4-byte words)."""
    if not _OUT_CACHE:
        n = len(_WORDS)
        _OUT_CACHE.append("".join(_WORDS[(i * 37 + i // n) % n] for i in range(8192)))
    base = _OUT_CACHE[0]
    need = num_tokens * _TOKEN_BYTES
    if need <= len(base):
        return base[:need]
    reps = need // len(base) + 1
    return (base * reps)[:need]


# ---------------------------------------------------------------- block cutting


class _Cutter:
    """Cuts a token stream (given as segments) into block-key runs."""

    __slots__ = ("bs", "cur", "ntok", "pos", "runs")

    def __init__(self, bs: int) -> None:
        self.bs = bs
        self.runs: list[Run] = []
        self.cur: list[Any] = []
        self.pos = 0
        self.ntok = 0

    def fork(self) -> _Cutter:
        """A cutter continuing from this one's partial block, with no runs yet."""
        c = _Cutter(self.bs)
        c.cur = list(self.cur)
        c.pos = self.pos
        c.ntok = self.ntok
        return c

    def _emit(self, tag: Any, start: int, count: int) -> None:
        runs = self.runs
        if runs:
            t, s, n = runs[-1]
            if t == tag and s + n == start and tag[0] == "r":
                runs[-1] = (t, s, n + count)
                return
        runs.append((tag, start, count))

    def _add(self, piece: Any, ntokens: int) -> None:
        cur = self.cur
        if cur:
            last = cur[-1]
            if isinstance(piece, bytes) and isinstance(last, bytes):
                cur[-1] = last + piece
            elif piece[0] == "t" and not isinstance(last, bytes) and last[0] == "t":
                cur[-1] = ("t", last[1] + piece[1])
            elif (
                piece[0] == "m"
                and not isinstance(last, bytes)
                and last[0] == "m"
                and last[1:4] == piece[1:4]
                and last[4] + last[5] == piece[4]
            ):
                cur[-1] = (*last[:5], last[5] + piece[5])
            else:
                cur.append(piece)
        else:
            cur.append(piece)
        self.pos += ntokens
        if self.pos == self.bs:
            self._emit(("x", tuple(cur)), 0, 1)
            self.cur = []
            self.pos = 0

    def marker_run(self, ns: str, size: int, first: int, count: int) -> None:
        self.ntok += size * count
        bs = self.bs
        if self.pos == 0 and size % bs == 0:
            f = size // bs
            self._emit(("r", ns, size), first * f, count * f)
            return
        for i in range(count):
            self._marker_piece(ns, size, first + i, 0, size)

    def marker_part(self, ns: str, size: int, bid: int, n: int) -> None:
        self.ntok += n
        self._marker_piece(ns, size, bid, 0, n)

    def _marker_piece(self, ns: str, size: int, bid: int, a: int, k: int) -> None:
        bs = self.bs
        while k > 0:
            if self.pos == 0 and k >= bs and size % bs == 0 and a % bs == 0:
                nb = k // bs
                self._emit(("r", ns, size), bid * (size // bs) + a // bs, nb)
                a += nb * bs
                k -= nb * bs
                continue
            take = min(k, bs - self.pos)
            self._add(("m", ns, size, bid, a, take), take)
            a += take
            k -= take

    def text(self, data: bytes) -> None:
        """Plain text already padded to whole tokens."""
        ntokens = len(data) // _TOKEN_BYTES
        self.ntok += ntokens
        bs = self.bs
        i = 0
        if self.pos:
            take = min(ntokens, bs - self.pos)
            self._add(data[: take * _TOKEN_BYTES], take)
            i = take
        bb = bs * _TOKEN_BYTES
        full = (ntokens - i) // bs
        if full:
            b0 = i * _TOKEN_BYTES
            self.runs.extend(
                [(("x", (data[o : o + bb],)), 0, 1) for o in range(b0, b0 + full * bb, bb)]
            )
            i += full * bs
        if i < ntokens:
            self._add(data[i * _TOKEN_BYTES :], ntokens - i)

    def ids(self, ids: tuple[int, ...]) -> None:
        ntokens = len(ids)
        self.ntok += ntokens
        bs = self.bs
        i = 0
        if self.pos:
            take = min(ntokens, bs - self.pos)
            self._add(("t", ids[:take]), take)
            i = take
        while ntokens - i >= bs:
            self._emit(("x", (("t", ids[i : i + bs]),)), 0, 1)
            i += bs
        if i < ntokens:
            self._add(("t", ids[i:]), ntokens - i)

    def feed_text(self, text: str) -> None:
        """One message's text: plain text and markers."""
        if "<|" not in text:
            if text:
                self.text(_pad(text.encode()))
            return
        parts = _MARKER_RE.split(text)
        # [text, kind, ns, a, b, size, text, kind, ...]
        for i in range(0, len(parts), 6):
            chunk = parts[i]
            if chunk:
                self.text(_pad(chunk.encode()))
            if i + 5 < len(parts):
                kind, ns, a, b, size = parts[i + 1 : i + 6]
                ia, ib, isz = int(a), int(b), int(size)
                if isz <= 0:
                    raise PromptError(f"block marker with size 0: {text[:80]!r}")
                if kind == "b":
                    if ib:
                        self.marker_run(ns, isz, ia, ib)
                elif ib > isz:
                    raise PromptError("partial block marker longer than its block (N > SIZE)")
                elif ib:
                    self.marker_part(ns, isz, ia, ib)


class Prompt:
    """A tokenized prompt: its length, the key runs of its full blocks, and the state needed
    to continue the token stream with the reply (for caching the reply's blocks)."""

    __slots__ = ("_cutter", "num_tokens", "runs")

    def __init__(self, cutter: _Cutter) -> None:
        self._cutter = cutter
        self.num_tokens = cutter.ntok
        self.runs: list[Run] = cutter.runs

    @property
    def num_full_blocks(self) -> int:
        return self.num_tokens // self._cutter.bs

    def continuation_runs(self, output_tokens: int) -> list[Run]:
        """Key runs of the full blocks that follow the prompt's once ``output_tokens`` of
        the deterministic reply are appended (the blocks a multi-turn chat sends back)."""
        c = self._cutter.fork()
        if output_tokens > 0:
            c.text(output_text(output_tokens).encode())
        return c.runs


class Tokenizer:
    """Tokenizes request bodies for an engine with ``block_size``-token KV blocks."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size

    def chat(self, messages: Any) -> Prompt:
        """A ``/v1/chat/completions`` ``messages`` list."""
        if not isinstance(messages, list) or not messages:
            raise PromptError("'messages' must be a non-empty list")
        c = _Cutter(self.block_size)
        for msg in messages:
            if not isinstance(msg, Mapping):
                raise PromptError("each message must be an object")
            content = msg.get("content")
            if isinstance(content, str):
                c.feed_text(content)
            elif isinstance(content, list):
                for part in content:
                    if isinstance(part, Mapping) and part.get("type") == "text":
                        text = part.get("text")
                        if isinstance(text, str):
                            c.feed_text(text)
            elif content is not None:
                raise PromptError("message 'content' must be a string, a list of parts or null")
            calls = msg.get("tool_calls")
            if isinstance(calls, list):
                for call in calls:
                    fn = call.get("function") if isinstance(call, Mapping) else None
                    if isinstance(fn, Mapping):
                        c.feed_text(str(fn.get("name", "")) + str(fn.get("arguments", "")))
        return Prompt(c)

    def completion(self, prompt: Any) -> Prompt:
        """A ``/v1/completions`` ``prompt``: a string, token ids, or a one-element list."""
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        c = _Cutter(self.block_size)
        if isinstance(prompt, str):
            c.feed_text(prompt)
        elif isinstance(prompt, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            if prompt:
                c.ids(tuple(prompt))
        else:
            raise PromptError(
                "'prompt' must be a string or a list of token ids (batched prompts are not "
                "supported by the embedded engine)"
            )
        if c.ntok == 0:
            raise PromptError("the prompt is empty")
        return Prompt(c)


# ---------------------------------------------------------------- run helpers


def runs_length(runs: Sequence[Run]) -> int:
    """Blocks in a run list."""
    return sum(r[2] for r in runs)


def slice_runs(runs: Sequence[Run], a: int, b: int) -> list[Run]:
    """The runs covering blocks ``[a, b)``."""
    if len(runs) == 1:
        tag, start, count = runs[0]
        hi = min(b, count)
        return [(tag, start + a, hi - a)] if hi > a else []
    out: list[Run] = []
    if b <= a:
        return out
    pos = 0
    for tag, start, count in runs:
        end = pos + count
        if end <= a:
            pos = end
            continue
        if pos >= b:
            break
        lo = max(a, pos)
        hi = min(b, end)
        out.append((tag, start + (lo - pos), hi - lo))
        pos = end
    return out
