"""Lucene BM25 maths and fixed-point scores: the impact of a posting, the query, the score's number format.

A posting's impact is its precomputed contribution idf * tf*(k1+1)/(tf + k1*(1-b+b*dl/avgdl)), with *corpus-wide*
N, avgdl and df, so a document's score does not depend on which shard holds it. A query is a set of (term id,
weight) pairs.

Scores are fixed-point sums. Each contribution w * impact is the product of two float32 values, exact in
float64; it is rounded up to a multiple of 2^-FIXED_POINT_BITS and the contributions are added as int64.
Integer addition does not depend on the order of its terms, so every evaluation order (all postings term
at a time, or lists in any order with some merged into candidates later) gives the same bits, and
upper bounds are exact integers: pruning needs no float slack to be safe. A score is returned as float64
(the integer times 2^-32, exact below MAX_SCORE); its resolution, 2.3e-10, is far finer than float32's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np

IMPACT_DTYPE = np.float32  # impacts and query weights
FIXED_POINT_BITS = 32
_FIXED_SCALE = float(2**FIXED_POINT_BITS)
MAX_SCORE = float(2 ** (53 - FIXED_POINT_BITS))  # int64 sums below 2^53 are exact in float64


def idf(num_docs: int, df: np.ndarray) -> np.ndarray:
    """Lucene idf: ln(1 + (N - df + 0.5) / (df + 0.5)); always > 0."""
    df = np.asarray(df, dtype=np.float64)
    return np.log1p((num_docs - df + 0.5) / (df + 0.5))


def saturated_tf(tf: np.ndarray, doc_len: np.ndarray, avgdl: float, k1: float, b: float) -> np.ndarray:
    """tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))."""
    tf = np.asarray(tf, dtype=np.float64)
    norm = k1 * (1.0 - b + b * np.asarray(doc_len, dtype=np.float64) / avgdl)
    return tf * (k1 + 1.0) / (tf + norm)


@dataclass(frozen=True)
class CorpusStats:
    """Corpus-wide statistics every shard scores with."""

    num_docs: int
    avgdl: float
    k1: float
    b: float


@dataclass(frozen=True)
class WeightedQuery:
    """Unique query terms with their summed weights (query term frequency x part weight)."""

    terms: tuple[str, ...]
    term_ids: np.ndarray  # int64, aligned with terms
    weights: np.ndarray  # float32 > 0, aligned with terms

    def __post_init__(self):
        if len(self.terms) != len(self.term_ids) or len(self.terms) != len(self.weights):
            raise ValueError("terms, term_ids and weights must have the same length")
        if len(self.weights) and not np.all(self.weights > 0):
            raise ValueError(f"query weights must be > 0, got {self.weights.tolist()}")


@numba.njit(cache=True, nogil=True, inline="always")
def _fixed(impact, weight_scale):
    # float32 impact x (float32 weight * 2^32): both factors have 24-bit mantissas, so the float64 product
    # is exact and the rounding up is the only rounding.
    return np.int64(math.ceil(np.float64(impact) * weight_scale))


@numba.njit(cache=True, nogil=True)
def _impacts(indptr, term_idf, ords, tfs, norm, k1_plus_1, out):
    """out[p]: the impact of posting p, idf x saturated_tf with the length norm of its document given (`norm`):
    the float64 operations of those two functions in their order, so the same bits."""
    for row in range(len(indptr) - 1):
        w = term_idf[row]
        for p in range(indptr[row], indptr[row + 1]):
            tf = np.float64(tfs[p])
            out[p] = w * (tf * k1_plus_1 / (tf + norm[ords[p]]))
