"""Lucene BM25 maths and the in-memory shard scorer.

A shard is a CSC-like matrix over (term row, doc ordinal): `indptr`/`doc_ords` locate a term's postings
and `impacts` holds each posting's precomputed contribution idf * tf*(k1+1)/(tf + k1*(1-b+b*dl/avgdl))
with *corpus-wide* N, avgdl and df, so a document's score does not depend on which shard holds it.
A query is a set of (term id, weight) pairs; scoring is a weighted sum of posting slices followed by a
top-k selection with a total order (score desc, doc ordinal asc). Doc ordinals follow doc-id order inside
a shard, so merging per-shard top-k by (score desc, doc id asc) equals the single-shard result exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

SCORE_DTYPE = np.float32


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


class ShardIndex:
    """One doc shard held in memory as plain numpy arrays."""

    def __init__(
        self,
        shard: int,
        doc_ids: np.ndarray,
        doc_lens: np.ndarray,
        term_ids: np.ndarray,
        indptr: np.ndarray,
        doc_ords: np.ndarray,
        impacts: np.ndarray,
    ):
        if len(doc_ids) != len(doc_lens):
            raise ValueError("doc_ids and doc_lens differ in length")
        if len(indptr) != len(term_ids) + 1 or indptr[-1] != len(doc_ords) or len(doc_ords) != len(impacts):
            raise ValueError(f"shard {shard}: inconsistent postings arrays")
        if len(term_ids) > 1 and not np.all(term_ids[1:] > term_ids[:-1]):
            raise ValueError(f"shard {shard}: term ids must be strictly increasing")
        self.shard = shard
        self.doc_ids = doc_ids
        self.doc_lens = np.asarray(doc_lens, dtype=np.int32)
        self.term_ids = np.asarray(term_ids, dtype=np.int64)
        self.indptr = np.asarray(indptr, dtype=np.int64)
        self.doc_ords = np.asarray(doc_ords, dtype=np.int32)
        self.impacts = np.asarray(impacts, dtype=SCORE_DTYPE)
        # Scratch buffers reused by every query (one query at a time per shard object).
        self._scores = np.zeros(len(doc_ids), dtype=SCORE_DTYPE)
        self._touched = np.empty(len(doc_ids), dtype=np.int32)

    @classmethod
    def from_postings(
        cls,
        shard: int,
        doc_ids: np.ndarray,
        doc_lens: np.ndarray,
        term_ids: np.ndarray,
        dfs: np.ndarray,
        postings_offsets: np.ndarray,
        postings_ords: np.ndarray,
        postings_tfs: np.ndarray,
        stats: CorpusStats,
    ) -> "ShardIndex":
        """Build from raw postings (tf) and global stats. Rows must come sorted by term id."""
        lengths = np.diff(np.asarray(postings_offsets, dtype=np.int64))
        indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        ords = np.asarray(postings_ords, dtype=np.int32)
        posting_idf = np.repeat(idf(stats.num_docs, dfs), lengths)
        dl = np.asarray(doc_lens)[ords]
        impacts = posting_idf * saturated_tf(postings_tfs, dl, stats.avgdl, stats.k1, stats.b)
        return cls(shard, doc_ids, doc_lens, term_ids, indptr, ords, impacts.astype(SCORE_DTYPE))

    @property
    def num_docs(self) -> int:
        return len(self.doc_ids)

    @property
    def num_postings(self) -> int:
        return len(self.doc_ords)

    def rows_of(self, term_ids: np.ndarray) -> np.ndarray:
        """Row of each term id in this shard, -1 where the shard has no posting for it."""
        if len(self.term_ids) == 0:
            return np.full(len(term_ids), -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.term_ids, term_ids), len(self.term_ids) - 1)
        return np.where(self.term_ids[pos] == term_ids, pos, -1)

    def top_k(self, query: WeightedQuery, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Doc ordinals and scores of the k best documents, by (score desc, ordinal asc)."""
        if k <= 0:
            raise ValueError(f"k must be positive, got {k}")
        rows = self.rows_of(query.term_ids)
        keep = rows >= 0
        return _accumulate_top_k(
            self.indptr,
            self.doc_ords,
            self.impacts,
            rows[keep].astype(np.int64),
            query.weights[keep].astype(SCORE_DTYPE),
            k,
            self._scores,
            self._touched,
        )

    def contributions(self, doc_ord: int, query: WeightedQuery) -> dict[str, float]:
        """Per-term score contributions of one document (weight x impact), for --explain."""
        out: dict[str, float] = {}
        for term, row, w in zip(query.terms, self.rows_of(query.term_ids), query.weights):
            if row < 0:
                continue
            lo, hi = self.indptr[row], self.indptr[row + 1]
            j = lo + np.searchsorted(self.doc_ords[lo:hi], doc_ord)
            if j < hi and self.doc_ords[j] == doc_ord:
                out[term] = float(SCORE_DTYPE(w) * self.impacts[j])
        return out


@numba.njit(cache=True, nogil=True)
def _accumulate_top_k(indptr, doc_ords, impacts, rows, weights, k, scores, touched):
    # Accumulate weighted posting slices; remember which docs were touched so the reset and the
    # selection cost O(touched), not O(shard size). Impacts and weights are > 0, so 0 means untouched.
    n_touched = 0
    for i in range(rows.size):
        r = rows[i]
        w = weights[i]
        for j in range(indptr[r], indptr[r + 1]):
            d = doc_ords[j]
            if scores[d] == 0.0:
                touched[n_touched] = d
                n_touched += 1
            scores[d] += w * impacts[j]
    cand = touched[:n_touched]
    if n_touched > k:
        vals = np.empty(n_touched, dtype=scores.dtype)
        for t in range(n_touched):
            vals[t] = scores[cand[t]]
        kth = np.partition(vals, n_touched - k)[n_touched - k]
        sel = np.empty(n_touched, dtype=np.int32)
        m = 0
        for t in range(n_touched):  # keep ties at the k-th score so the ordinal tie-break is exact
            if vals[t] >= kth:
                sel[m] = cand[t]
                m += 1
        cand = sel[:m]
    cand = np.sort(cand)
    cand_scores = np.empty(cand.size, dtype=scores.dtype)
    for t in range(cand.size):
        cand_scores[t] = scores[cand[t]]
    order = np.argsort(-cand_scores, kind="mergesort")[:k]
    out_ords = cand[order].copy()
    out_scores = cand_scores[order].copy()
    for t in range(n_touched):
        scores[touched[t]] = 0.0
    return out_ords, out_scores
