"""Hashes that Spark and Python must agree on, computed by one Python library (mmh3) on both sides.

Spark's built-in `hash` is not standard MurmurHash3, so it is never used for these keys.

Term ids: a unigram's id is MurmurHash3 x64_128 (first half, signed) of its UTF-8 text; an n-gram's id
(unigrams joined by NGRAM_SEPARATOR, which no unigram contains) is a left fold of its unigrams' ids through
a 64-bit mixer. The fold lets the index build compute the ids of millions of n-grams with a few vectorised
numpy operations (`combine_term_ids`) instead of hashing each n-gram's string, and `term_id` gives the same
id from the string at query time. Collisions are checked at index time (the term dictionary).
"""

from __future__ import annotations

from functools import lru_cache

import mmh3
import numpy as np

_SHARD_SEED = 0x5151A
_TERM_SEED = 0
NGRAM_SEPARATOR = " "
# Bumped whenever term ids or shard assignment change: an index built under another scheme is refused.
TERM_ID_SCHEME = 2

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_OFFSET = 0x632BE59BD9B4E019
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def shard_of(doc_id: str, num_shards: int) -> int:
    """Stable doc shard: MurmurHash3 x86_32 (unsigned) of the UTF-8 doc id, mod the number of shards."""
    return doc_hash(doc_id) % num_shards


def doc_hash(doc_id: str) -> int:
    """The unsigned 32-bit hash a doc's shard is taken from (kept with each doc's analysis)."""
    return mmh3.hash(doc_id, _SHARD_SEED, signed=False)


def unigram_id(token: str) -> int:
    return mmh3.hash64(token, _TERM_SEED, signed=True)[0]


def _combine(left: int, right: int) -> int:
    """One fold step on unsigned 64-bit ints: splitmix64's finaliser over (left * golden + right + offset)."""
    z = (left * _GOLDEN + right + _OFFSET) & _MASK
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK
    return z ^ (z >> 31)


@lru_cache(maxsize=1 << 17)  # queries repeat their terms: a bulk run hashes each once (about 20 MB when full)
def term_id(term: str) -> int:
    """Signed 64-bit id of an index term (a unigram, or an n-gram of unigrams joined by NGRAM_SEPARATOR)."""
    if NGRAM_SEPARATOR not in term:
        return unigram_id(term)
    parts = term.split(NGRAM_SEPARATOR)
    h = unigram_id(parts[0]) & _MASK
    for part in parts[1:]:
        h = _combine(h, unigram_id(part) & _MASK)
    return h - (1 << 64) if h >= 1 << 63 else h


def combine_term_ids(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Vectorised fold step: the ids of n-grams `left + SEP + right` from the ids of their two parts (int64
    arrays; `left` may itself be an n-gram's id). Equals `term_id` on the joined strings."""
    with np.errstate(over="ignore"):
        z = left.view(np.uint64) * np.uint64(_GOLDEN) + right.view(np.uint64) + np.uint64(_OFFSET)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
        z = z ^ (z >> np.uint64(31))
    return z.view(np.int64)
