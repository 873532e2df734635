"""Hashes that Spark and Python must agree on, computed by one Python library (mmh3) on both sides.

Spark's built-in `hash` is not standard MurmurHash3, so it is never used for these keys.
"""

from __future__ import annotations

import mmh3

_SHARD_SEED = 0x5151A
_TERM_SEED = 0


def shard_of(doc_id: str, num_shards: int) -> int:
    """Stable doc shard: MurmurHash3 x86_32 (unsigned) of the UTF-8 doc id, mod the number of shards."""
    return mmh3.hash(doc_id, _SHARD_SEED, signed=False) % num_shards


def term_id(term: str) -> int:
    """Signed 64-bit term id (MurmurHash3 x64_128, first half). Collisions are checked at index time."""
    return mmh3.hash64(term, _TERM_SEED, signed=True)[0]
