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
from typing import Sequence

import numba
import numpy as np

SCORE_DTYPE = np.float32
_NO_MASK = np.empty(0, dtype=np.uint8)


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
        ords, scores, counts = self.top_k_many([query], k)
        return ords[0, : counts[0]], scores[0, : counts[0]]

    def top_k_many(
        self, queries: Sequence[WeightedQuery], k: int, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Score a batch of queries in one compiled call: (ords [q, k], scores [q, k], hit counts [q]).
        `allowed` (uint8 over doc ordinals) restricts every query of the batch to the docs marked 1."""
        if k <= 0:
            raise ValueError(f"k must be positive, got {k}")
        k = min(k, max(self.num_docs, 1))
        lengths = np.fromiter((len(q.term_ids) for q in queries), dtype=np.int64, count=len(queries))
        all_ids = np.concatenate([q.term_ids for q in queries] + [np.empty(0, np.int64)])
        all_weights = np.concatenate([q.weights for q in queries] + [np.empty(0, SCORE_DTYPE)])
        rows = self.rows_of(all_ids)
        found = rows >= 0
        # Per-query offsets after dropping the terms this shard lacks.
        query_of_term = np.repeat(np.arange(len(queries)), lengths)
        kept_per_query = np.bincount(query_of_term[found], minlength=len(queries))
        q_ptr = np.concatenate([[0], np.cumsum(kept_per_query)]).astype(np.int64)
        return _score_top_k_batch(self.indptr, self.doc_ords, self.impacts, q_ptr, rows[found].astype(np.int64),
                                  all_weights[found].astype(SCORE_DTYPE), k, self._scores, self._touched,
                                  _NO_MASK if allowed is None else allowed.astype(np.uint8, copy=False))

    def top_k_constrained(
        self, queries: Sequence[WeightedQuery], k: int,
        constraints: Sequence[tuple[Sequence[int], Sequence[int]]] | None = None,
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """(ords, scores) per query. constraints[i] = (must term ids, exclude term ids): unconstrained queries
        share one compiled call, constrained ones are scored one by one under their doc mask."""
        constraints = constraints or [((), ())] * len(queries)
        out: list = [None] * len(queries)
        free = [i for i, (must, exclude) in enumerate(constraints) if not must and not exclude]
        if free:
            ords, scores, counts = self.top_k_many([queries[i] for i in free], k)
            for row, i in enumerate(free):
                out[i] = (ords[row, : counts[row]], scores[row, : counts[row]])
        for i, (must, exclude) in enumerate(constraints):
            if must or exclude:
                ords, scores, counts = self.top_k_many([queries[i]], k, self.constraint_mask(must, exclude))
                out[i] = (ords[0, : counts[0]], scores[0, : counts[0]])
        return out

    def docs_with_term(self, term_id_: int) -> np.ndarray:
        """Doc ordinals holding a term (sorted)."""
        row = self.rows_of(np.array([term_id_], dtype=np.int64))[0]
        return self.doc_ords[self.indptr[row] : self.indptr[row + 1]] if row >= 0 else np.empty(0, np.int32)

    def constraint_mask(self, must: Sequence[int], exclude: Sequence[int]) -> np.ndarray | None:
        """0/1 mask of docs holding every `must` term id and no `exclude` term id (None: no constraint)."""
        if not must and not exclude:
            return None
        mask = np.ones(self.num_docs, dtype=np.uint8)
        for tid in must:
            keep = np.zeros(self.num_docs, dtype=np.uint8)
            keep[self.docs_with_term(tid)] = 1
            mask &= keep
        for tid in exclude:
            mask[self.docs_with_term(tid)] = 0
        return mask

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


@numba.njit(cache=True, nogil=True, inline="always")
def _worse(score_a, ord_a, score_b, ord_b):
    """Is hit a ranked below hit b under (score desc, ordinal asc)?"""
    return score_a < score_b or (score_a == score_b and ord_a > ord_b)


@numba.njit(cache=True, nogil=True)
def _heap_offer(heap_s, heap_o, size, k, s, o):
    """Keep the k best hits in a binary heap whose root is the worst kept hit; returns the new size."""
    if size < k:
        i = size
        size += 1
        heap_s[i] = s
        heap_o[i] = o
        while i > 0:  # sift up
            parent = (i - 1) // 2
            if _worse(heap_s[i], heap_o[i], heap_s[parent], heap_o[parent]):
                heap_s[i], heap_s[parent] = heap_s[parent], heap_s[i]
                heap_o[i], heap_o[parent] = heap_o[parent], heap_o[i]
                i = parent
            else:
                break
        return size
    if not _worse(heap_s[0], heap_o[0], s, o):
        return size
    heap_s[0] = s
    heap_o[0] = o
    _sift_down(heap_s, heap_o, 0, size)
    return size


@numba.njit(cache=True, nogil=True)
def _sift_down(heap_s, heap_o, i, size):
    while True:
        left = 2 * i + 1
        if left >= size:
            return
        child = left
        right = left + 1
        if right < size and _worse(heap_s[right], heap_o[right], heap_s[left], heap_o[left]):
            child = right
        if _worse(heap_s[child], heap_o[child], heap_s[i], heap_o[i]):
            heap_s[i], heap_s[child] = heap_s[child], heap_s[i]
            heap_o[i], heap_o[child] = heap_o[child], heap_o[i]
            i = child
        else:
            return


_HEAP_MAX_K = 64


@numba.njit(cache=True, nogil=True)
def _select_large_k(scores, k, out_ords, out_scores, cand_s, cand_o, allowed):
    """Top-k of a dense score array for large k: gather (branch-free), partition for the k-th score, keep
    everything above it plus the lowest ordinals tied with it, then one sort of packed (score, ordinal) keys."""
    m = 0
    filtered = allowed.size > 0
    for d in range(scores.size):
        cand_s[m] = scores[d]
        cand_o[m] = d
        m += scores[d] > 0.0 and (not filtered or allowed[d] != 0)
    if m == 0:
        return 0
    n = min(k, m)
    kth = np.partition(cand_s[:m], m - n)[m - n]
    above = 0
    for t in range(m):
        above += cand_s[t] > kth
    ties_needed = n - above
    # Positive float32 scores order like their bit patterns, so one uint64 key (inverted score bits, ordinal)
    # sorts by (score desc, ordinal asc) with a plain sort.
    keys = np.empty(n, dtype=np.uint64)
    bits = cand_s[:m].view(np.uint32)
    j = 0
    for t in range(m):  # ordinal order: the first tied candidates are the ones the total order keeps
        s = cand_s[t]
        if s > kth or (s == kth and ties_needed > 0):
            if s == kth:
                ties_needed -= 1
            keys[j] = (np.uint64(0xFFFFFFFF - bits[t]) << np.uint64(32)) | np.uint64(cand_o[t])
            j += 1
    keys = np.sort(keys)
    for t in range(n):
        o = np.int32(keys[t] & np.uint64(0xFFFFFFFF))
        out_ords[t] = o
        out_scores[t] = scores[o]
    return n


@numba.njit(cache=True, nogil=True)
def _score_top_k_batch(indptr, doc_ords, impacts, q_ptr, rows, weights, k, scores, touched, allowed):
    n_queries = q_ptr.size - 1
    n_docs = scores.size
    filtered = allowed.size > 0  # a 0/1 mask over doc ordinals (constraints); empty: every doc may rank
    out_ords = np.zeros((n_queries, k), dtype=np.int32)
    out_scores = np.zeros((n_queries, k), dtype=scores.dtype)
    counts = np.zeros(n_queries, dtype=np.int64)
    heap_s = np.empty(k, dtype=scores.dtype)
    heap_o = np.empty(k, dtype=np.int32)
    cand_s = np.empty(n_docs, dtype=scores.dtype)
    cand_o = np.empty(n_docs, dtype=np.int32)
    for q in range(n_queries):
        n_postings = 0
        for i in range(q_ptr[q], q_ptr[q + 1]):
            n_postings += indptr[rows[i] + 1] - indptr[rows[i]]
        size = 0
        if n_postings * 4 < n_docs:
            # Few postings: remember touched docs so accumulation, selection and reset cost O(postings).
            # Impacts and weights are > 0, so a zero score means "not touched yet".
            n_touched = 0
            for i in range(q_ptr[q], q_ptr[q + 1]):
                r = rows[i]
                w = weights[i]
                for j in range(indptr[r], indptr[r + 1]):
                    d = doc_ords[j]
                    if scores[d] == 0.0:
                        touched[n_touched] = d
                        n_touched += 1
                    scores[d] += w * impacts[j]
            for t in range(n_touched):
                d = touched[t]
                s = scores[d]
                scores[d] = 0.0
                if filtered and allowed[d] == 0:
                    continue
                if size < k or s >= heap_s[0]:  # a strictly lower score can never enter a full heap
                    size = _heap_offer(heap_s, heap_o, size, k, s, d)
        else:
            # Many postings: branch-free accumulation and one scan in ordinal order.
            for i in range(q_ptr[q], q_ptr[q + 1]):
                r = rows[i]
                w = weights[i]
                for j in range(indptr[r], indptr[r + 1]):
                    scores[doc_ords[j]] += w * impacts[j]
            if k <= _HEAP_MAX_K:
                # Rarely true once the heap is full, so the branch predicts well; in ordinal order an equal
                # score never beats the root. Zeroing is one fill afterwards.
                threshold = scores.dtype.type(0.0)
                for d in range(n_docs):
                    s = scores[d]
                    if s > threshold and (not filtered or allowed[d] != 0):
                        size = _heap_offer(heap_s, heap_o, size, k, s, d)
                        if size == k:
                            threshold = heap_s[0]
            else:
                counts[q] = _select_large_k(scores, k, out_ords[q], out_scores[q], cand_s, cand_o, allowed)
                scores[:] = 0.0
                continue
            scores[:] = 0.0
        counts[q] = size
        # Pop worst-first into the tail: the output is best-first.
        while size > 0:
            out_scores[q, size - 1] = heap_s[0]
            out_ords[q, size - 1] = heap_o[0]
            size -= 1
            heap_s[0] = heap_s[size]
            heap_o[0] = heap_o[size]
            _sift_down(heap_s, heap_o, 0, size)
    return out_ords, out_scores, counts
