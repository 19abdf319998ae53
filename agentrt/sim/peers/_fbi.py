"""vllm-router's ``fbi_hash``: MurmurHash64A and FurcHash (Facebook mcrouter's
``lib/fbi/hash.c``), as vllm-project/router's ``src/policies/consistent_hash.rs`` has them.

Its ``consistent_hash`` ring (160 virtual nodes per worker, ``"{url}:{i}"``) and
``sticky_least_loaded``'s rendezvous tie-break (``"{session}:{url}"``) hash with it, so the
modelled policies place a key where the real router does, given the same worker URLs.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Final

__all__ = ["fbi_hash", "murmur_hash_64a"]

_M: Final = 0xC6A4A7935BD1E995
_R: Final = 47
_MASK: Final = (1 << 64) - 1
_SEED: Final = 4193360111
_FURC_SHIFT: Final = 23
_FURC_TRIES: Final = 32
_LARGE_MODULUS: Final = (1 << 23) - 1


def murmur_hash_64a(key: bytes, seed: int = _SEED) -> int:
    """MurmurHash64A of ``key`` (64-bit, little-endian chunks)."""
    h = (seed ^ (len(key) * _M)) & _MASK
    n = len(key) - len(key) % 8
    for i in range(0, n, 8):
        k = (int.from_bytes(key[i : i + 8], "little") * _M) & _MASK
        k ^= k >> _R
        k = (k * _M) & _MASK
        h ^= k
        h = (h * _M) & _MASK
    rest = key[n:]
    if rest:
        for j in range(len(rest) - 1, -1, -1):
            h ^= rest[j] << (8 * j)
        h = (h * _M) & _MASK
    h ^= h >> _R
    h = (h * _M) & _MASK
    h ^= h >> _R
    return h


def _rehash(k: int) -> int:
    h = (_SEED ^ ((8 * _M) & _MASK)) & _MASK
    k = (k * _M) & _MASK
    k ^= k >> _R
    k = (k * _M) & _MASK
    h ^= k
    h = (h * _M) & _MASK
    h ^= h >> _R
    h = (h * _M) & _MASK
    h ^= h >> _R
    return h


def _furc_hash(key: bytes, m: int) -> int:
    if m <= 1:
        return 0
    cache: list[int] = []

    def bit(idx: int) -> int:
        ord_ = idx >> 6
        while len(cache) <= ord_:
            cache.append(murmur_hash_64a(key, _SEED) if not cache else _rehash(cache[-1]))
        return (cache[ord_] >> (idx & 0x3F)) & 1

    d = 0
    while m > (1 << d):
        d += 1
    a = d
    for _ in range(_FURC_TRIES):
        while not bit(a):
            if d == 0:
                return 0
            d -= 1
            a = d
        a += _FURC_SHIFT
        num = 1
        for _ in range(max(0, d - 1)):
            num = (num << 1) | bit(a)
            a += _FURC_SHIFT
        if num < m:
            return num
    return 0


@lru_cache(maxsize=65536)
def fbi_hash(key: str) -> int:
    """vllm-router's ``ConsistentHashPolicy::fbi_hash``: FurcHash into 23 bits, then
    MurmurHash64A of its four little-endian bytes."""
    furc = _furc_hash(key.encode(), _LARGE_MODULUS)
    return murmur_hash_64a(furc.to_bytes(4, "little"), _SEED)
