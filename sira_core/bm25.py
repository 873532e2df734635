"""Lucene BM25 maths and the in-memory shard scorer.

A shard is a CSC-like matrix over (term row, doc ordinal): `indptr`/`doc_ords` locate a term's postings
and `impacts` holds each posting's precomputed contribution idf * tf*(k1+1)/(tf + k1*(1-b+b*dl/avgdl))
with *corpus-wide* N, avgdl and df, so a document's score does not depend on which shard holds it.
A query is a set of (term id, weight) pairs.

Scores are fixed-point sums. Each contribution w * impact is the product of two float32 values, exact in
float64; it is rounded up to a multiple of 2^-FIXED_POINT_BITS and the contributions are added as int64.
Integer addition does not depend on the order of its terms, so every evaluation order (term at a time over
all postings, or window by window with a per-shard order of terms) gives the same bits, and upper bounds
are exact integers: pruning needs no float slack to be safe. A score is returned as float64 (the integer
times 2^-32, exact below MAX_SCORE); its resolution, 2.3e-10, is far finer than float32's.

Top-k uses a total order, (score desc, doc ordinal asc). Doc ordinals follow doc-id order inside a shard, so
merging per-shard top-k by (score desc, doc id asc) equals the single-shard result exactly.

Pruning (`top_k_many`): windowed MaxScore with block-max bounds, after Lucene's MaxScoreBulkScorer. Doc
ordinals are walked in windows of WINDOW_DOCS; in each window every term's upper bound is its weight times
the largest block maximum (BLOCK_SIZE postings per block) overlapping the window. Terms whose bounds add up
to no more than the current k-th best score are non-essential: a document they alone match cannot enter the
top-k. Essential terms are scored term at a time into a window accumulator; each candidate, in ordinal order,
then probes the non-essential terms (largest bound first) only while its score plus their remaining bounds
can still beat the k-th best. Must terms are a conjunctive filter (they also move the window start forward),
exclude terms and skipped ordinals a negative one. A window whose bounds add up to no more than the k-th
best is skipped without reading a posting. `exhaustive=True` scores every posting (the reference).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

IMPACT_DTYPE = np.float32  # impacts and query weights
FIXED_POINT_BITS = 32
_FIXED_SCALE = float(2**FIXED_POINT_BITS)
MAX_SCORE = float(2 ** (53 - FIXED_POINT_BITS))  # int64 sums below 2^53 are exact in float64
BLOCK_SIZE = 128  # postings per block maximum: 1/32 byte per posting
WINDOW_DOCS = 4096  # doc ordinals per window of the pruned scorer: its accumulator (32 KiB) stays in L1/L2


def idf(num_docs: int, df: np.ndarray) -> np.ndarray:
    """Lucene idf: ln(1 + (N - df + 0.5) / (df + 0.5)); always > 0."""
    df = np.asarray(df, dtype=np.float64)
    return np.log1p((num_docs - df + 0.5) / (df + 0.5))


def saturated_tf(tf: np.ndarray, doc_len: np.ndarray, avgdl: float, k1: float, b: float) -> np.ndarray:
    """tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))."""
    tf = np.asarray(tf, dtype=np.float64)
    norm = k1 * (1.0 - b + b * np.asarray(doc_len, dtype=np.float64) / avgdl)
    return tf * (k1 + 1.0) / (tf + norm)


def block_maxima(impacts: np.ndarray) -> np.ndarray:
    """Largest impact of each run of BLOCK_SIZE postings of the flat postings array. Blocks cross term
    boundaries, so a block's maximum bounds every term it holds and no per-term offsets are stored."""
    if len(impacts) == 0:
        return np.empty(0, dtype=IMPACT_DTYPE)
    return np.maximum.reduceat(impacts, np.arange(0, len(impacts), BLOCK_SIZE)).astype(IMPACT_DTYPE, copy=False)


def as_doc_id_array(doc_ids) -> pa.LargeStringArray:
    """Doc ids as one Arrow large_string array (offsets + UTF-8 bytes: no Python object per document)."""
    if isinstance(doc_ids, pa.ChunkedArray):
        doc_ids = doc_ids.combine_chunks()
    if not isinstance(doc_ids, pa.Array):
        doc_ids = pa.array(doc_ids, type=pa.large_string())
    if doc_ids.type != pa.large_string():
        doc_ids = doc_ids.cast(pa.large_string())
    if doc_ids.null_count:
        raise ValueError("doc ids must not be null")
    return doc_ids


def doc_id_buffers(doc_ids: pa.LargeStringArray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64 [n + 1] from 0, UTF-8 bytes uint8) of a large_string array, e.g. to write it to disk."""
    n = len(doc_ids)
    _, offsets_buf, data_buf = doc_ids.buffers()
    if offsets_buf is None:  # an empty array may come without buffers
        return np.zeros(1, dtype=np.int64), np.empty(0, dtype=np.uint8)
    offsets = np.frombuffer(offsets_buf, dtype=np.int64)[doc_ids.offset : doc_ids.offset + n + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8)[offsets[0] : offsets[-1]] if data_buf is not None else \
        np.empty(0, dtype=np.uint8)
    return (offsets - offsets[0] if offsets[0] else offsets), data


def doc_ids_from_buffers(offsets: np.ndarray, data: np.ndarray) -> pa.LargeStringArray:
    """The inverse of doc_id_buffers, zero-copy (the arrays may be memory maps)."""
    return pa.LargeStringArray.from_buffers(len(offsets) - 1, pa.py_buffer(offsets), pa.py_buffer(data))


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


def _read_only(a: np.ndarray) -> np.ndarray:
    """One array type for numba (memory-mapped caches are read-only), so each kernel compiles once."""
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


class ShardIndex:
    """One doc shard as plain arrays (in memory, or memory-mapped from pipelines.shard_cache)."""

    def __init__(
        self,
        shard: int,
        doc_ids,
        doc_lens: np.ndarray,
        term_ids: np.ndarray,
        indptr: np.ndarray,
        doc_ords: np.ndarray,
        impacts: np.ndarray,
        block_max: np.ndarray | None = None,
    ):
        """`doc_ids`: anything pyarrow takes as strings (list, numpy object array, Arrow array), sorted; doc
        ordinal i is doc_ids[i]. `impacts`: > 0, as BM25 contributions are. `block_max`:
        block_maxima(impacts), computed here when not given."""
        doc_ids = as_doc_id_array(doc_ids)
        if len(doc_ids) != len(doc_lens):
            raise ValueError(f"shard {shard}: doc_ids and doc_lens differ in length")
        if len(indptr) != len(term_ids) + 1 or indptr[-1] != len(doc_ords) or len(doc_ords) != len(impacts):
            raise ValueError(f"shard {shard}: inconsistent postings arrays")
        if len(term_ids) > 1 and not np.all(term_ids[1:] > term_ids[:-1]):
            raise ValueError(f"shard {shard}: term ids must be strictly increasing")
        if len(doc_ids) > 1 and not pc.all(pc.less(doc_ids[:-1], doc_ids[1:])).as_py():
            raise ValueError(f"shard {shard}: doc ids must be unique and sorted (doc ordinals follow doc-id order)")
        self.shard = shard
        self.doc_ids = doc_ids
        self.doc_id_offsets, self.doc_id_data = map(_read_only, doc_id_buffers(doc_ids))  # views, for merge_top_k
        self.doc_lens = _read_only(np.asarray(doc_lens, dtype=np.int32))
        self.term_ids = _read_only(np.asarray(term_ids, dtype=np.int64))
        self.indptr = _read_only(np.asarray(indptr, dtype=np.int64))
        self.doc_ords = _read_only(np.asarray(doc_ords, dtype=np.int32))
        self.impacts = _read_only(np.asarray(impacts, dtype=IMPACT_DTYPE))
        block_max = block_maxima(self.impacts) if block_max is None else np.asarray(block_max, dtype=IMPACT_DTYPE)
        if len(block_max) != -(-len(self.impacts) // BLOCK_SIZE):
            raise ValueError(f"shard {shard}: {len(block_max)} block maxima for {len(self.impacts)} postings")
        self.block_max = _read_only(block_max)
        self.max_impact = float(self.block_max.max()) if len(self.block_max) else 0.0

    @classmethod
    def from_postings(
        cls,
        shard: int,
        doc_ids,
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
        return cls(shard, doc_ids, doc_lens, term_ids, indptr, ords, impacts.astype(IMPACT_DTYPE))

    @property
    def num_docs(self) -> int:
        return len(self.doc_ids)

    @property
    def num_postings(self) -> int:
        return len(self.doc_ords)

    def arrays(self) -> dict[str, np.ndarray]:
        """Every array of the shard by name (what a cache stores; doc ids as offsets + bytes)."""
        return {"doc_id_offsets": self.doc_id_offsets, "doc_id_data": self.doc_id_data, "doc_lens": self.doc_lens,
                "term_ids": self.term_ids, "indptr": self.indptr, "doc_ords": self.doc_ords,
                "impacts": self.impacts, "block_max": self.block_max}

    @classmethod
    def from_arrays(cls, shard: int, arrays: dict[str, np.ndarray]) -> "ShardIndex":
        """The inverse of arrays(), without copying them."""
        return cls(shard, doc_ids_from_buffers(arrays["doc_id_offsets"], arrays["doc_id_data"]), arrays["doc_lens"],
                   arrays["term_ids"], arrays["indptr"], arrays["doc_ords"], arrays["impacts"], arrays["block_max"])

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays().values())

    def rows_of(self, term_ids: np.ndarray) -> np.ndarray:
        """Row of each term id in this shard, -1 where the shard has no posting for it."""
        term_ids = np.asarray(term_ids, dtype=np.int64)
        if len(self.term_ids) == 0:
            return np.full(len(term_ids), -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.term_ids, term_ids), len(self.term_ids) - 1)
        return np.where(self.term_ids[pos] == term_ids, pos, -1)

    def ords_of(self, doc_ids: Iterable[str]) -> np.ndarray:
        """Sorted ordinals of those of `doc_ids` this shard holds (binary search: doc ids are sorted)."""
        found = set()
        for doc_id in doc_ids:
            lo, hi = 0, self.num_docs
            while lo < hi:
                mid = (lo + hi) // 2
                if self.doc_ids[mid].as_py() < doc_id:
                    lo = mid + 1
                else:
                    hi = mid
            if lo < self.num_docs and self.doc_ids[lo].as_py() == doc_id:
                found.add(lo)
        return np.array(sorted(found), dtype=np.int32)

    def top_k(self, query: WeightedQuery, k: int, must: Sequence[int] = (), exclude: Sequence[int] = (),
              exhaustive: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Doc ordinals and scores of the k best documents, by (score desc, ordinal asc)."""
        ords, scores, counts = self.top_k_many([query], k, [(must, exclude)], exhaustive=exhaustive)
        return ords[0, : counts[0]], scores[0, : counts[0]]

    def top_k_many(
        self,
        queries: Sequence[WeightedQuery],
        k: int,
        constraints: Sequence[tuple[Sequence[int], Sequence[int]]] | None = None,
        skip_ords: Sequence[np.ndarray] | None = None,
        exhaustive: bool = False,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Score a batch of queries in one compiled call: (ords [q, k] int32, scores [q, k] float64, hit
        counts [q]), each row best first. constraints[i] = (must term ids, exclude term ids): a hit holds every
        must term and no exclude term. skip_ords[i]: sorted ordinals query i must not return (excluded doc ids).
        Pruned and exhaustive scoring return the same ordinals and the same scores."""
        if k <= 0:
            raise ValueError(f"k must be positive, got {k}")
        k = min(k, max(self.num_docs, 1))
        constraints = constraints or [((), ())] * len(queries)
        term_ptr, all_ids = _ragged([q.term_ids for q in queries])
        all_weights = np.concatenate([q.weights for q in queries] + [np.empty(0, IMPACT_DTYPE)])
        query_of_term = np.repeat(np.arange(len(queries)), np.diff(term_ptr))
        rows = self.rows_of(all_ids)
        keep = rows >= 0
        must_ptr, must_rows = _ragged([must for must, _ in constraints])
        must_rows = self.rows_of(must_rows)
        # A must term this shard lacks: no document of this shard qualifies, so the query scores nothing here.
        impossible = np.zeros(len(queries), dtype=bool)
        impossible[np.repeat(np.arange(len(queries)), np.diff(must_ptr))[must_rows < 0]] = True
        keep &= ~impossible[query_of_term]
        q_ptr = _kept_ptr(term_ptr, keep)
        rows, weights = rows[keep], all_weights[keep].astype(np.float64)
        heaviest = np.zeros(len(queries))
        np.add.at(heaviest, query_of_term[keep], weights)
        if np.any(heaviest * self.max_impact >= MAX_SCORE / 2):
            raise ValueError(f"query weights too large: scores would exceed {MAX_SCORE / 2:g}")
        weight_scale = weights * _FIXED_SCALE
        skip_ords = skip_ords or [np.empty(0, np.int32)] * len(queries)
        if exhaustive:
            out = self._top_k_exhaustive(q_ptr, rows, weight_scale, k, constraints, skip_ords)
        else:
            exclude_ptr, exclude_rows = _ragged([exclude for _, exclude in constraints])
            exclude_rows = self.rows_of(exclude_rows)
            held = exclude_rows >= 0  # an exclude term the shard lacks excludes nothing here
            out = _pruned_top_k(
                self.indptr, self.doc_ords, self.impacts, self.block_max, self.num_docs, q_ptr, rows, weight_scale,
                must_ptr, must_rows, _kept_ptr(exclude_ptr, held), exclude_rows[held], *_ragged(skip_ords), k,
                BLOCK_SIZE, WINDOW_DOCS)
        ords, fixed, counts = out
        return ords, fixed * (1.0 / _FIXED_SCALE), counts

    def _top_k_exhaustive(self, q_ptr, rows, weight_scale, k, constraints, skip_ords):
        """Every posting of every term: unconstrained queries share one compiled call, constrained ones are
        scored one by one under their doc mask."""
        n = len(q_ptr) - 1
        ords = np.zeros((n, k), dtype=np.int32)
        fixed = np.zeros((n, k), dtype=np.int64)
        counts = np.zeros(n, dtype=np.int64)
        masks = [self.constraint_mask(must, exclude, skip) for (must, exclude), skip in zip(constraints, skip_ords)]
        groups = [[i for i in range(n) if masks[i] is None]] + [[i] for i in range(n) if masks[i] is not None]
        for group in groups:
            if not group:
                continue
            sub_ptr = np.concatenate([[0], np.cumsum([q_ptr[i + 1] - q_ptr[i] for i in group])]).astype(np.int64)
            picked = np.concatenate([np.arange(q_ptr[i], q_ptr[i + 1]) for i in group]).astype(np.int64)
            mask = masks[group[0]] if masks[group[0]] is not None else np.empty(0, np.uint8)
            o, f, c = _exhaustive_top_k(self.indptr, self.doc_ords, self.impacts, sub_ptr, rows[picked],
                                        weight_scale[picked], k, self.num_docs, mask)
            ords[group], fixed[group], counts[group] = o, f, c
        return ords, fixed, counts

    def docs_with_term(self, term_id_: int) -> np.ndarray:
        """Doc ordinals holding a term (sorted)."""
        row = self.rows_of(np.array([term_id_], dtype=np.int64))[0]
        return self.doc_ords[self.indptr[row] : self.indptr[row + 1]] if row >= 0 else np.empty(0, np.int32)

    def constraint_mask(self, must: Sequence[int], exclude: Sequence[int],
                        skip: np.ndarray | None = None) -> np.ndarray | None:
        """0/1 mask of docs holding every `must` term id, no `exclude` term id and not in `skip` (None: no
        constraint). The exhaustive scorer's filter; the pruned one walks the postings instead."""
        if not len(must) and not len(exclude) and (skip is None or not len(skip)):
            return None
        mask = np.ones(self.num_docs, dtype=np.uint8)
        for tid in must:
            keep = np.zeros(self.num_docs, dtype=np.uint8)
            keep[self.docs_with_term(tid)] = 1
            mask &= keep
        for tid in exclude:
            mask[self.docs_with_term(tid)] = 0
        if skip is not None:
            mask[np.asarray(skip, dtype=np.int64)] = 0
        return mask

    def contributions(self, doc_ord: int, query: WeightedQuery) -> dict[str, float]:
        """Per-term contributions of one document, weight x impact (exact in float64), for --explain. They add
        up to the score up to the fixed-point rounding (at most 2^-32 per term)."""
        out: dict[str, float] = {}
        for term, row, w in zip(query.terms, self.rows_of(query.term_ids), query.weights):
            if row < 0:
                continue
            lo, hi = self.indptr[row], self.indptr[row + 1]
            j = lo + np.searchsorted(self.doc_ords[lo:hi], doc_ord)
            if j < hi and self.doc_ords[j] == doc_ord:
                out[term] = float(w) * float(self.impacts[j])
        return out


def merge_top_k(scores: Sequence[np.ndarray], ords: Sequence[np.ndarray], counts: Sequence[np.ndarray],
                doc_ids: Sequence[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, ...]:
    """Merge per-shard top-k of a query batch into the global top-k, by (score desc, doc id asc): what one
    shard holding every document would return. Shard s gives scores[s] [q, >= counts] (float64), ords[s]
    (int32, same shape) and counts[s] [q], each row sorted by (score desc, ordinal asc), and its doc ids as
    (offsets, UTF-8 bytes) (ShardIndex.doc_id_offsets / doc_id_data): ordinal order is doc-id order inside
    a shard, so doc ids are compared only for equal scores from different shards (bytewise, as UTF-8 orders
    code points). Returns (shard [q, k] int64, ords [q, k] int32, scores [q, k] float64, hit counts [q])."""
    return _merge_top_k(tuple(scores), tuple(ords), tuple(counts), tuple(o for o, _ in doc_ids),
                        tuple(d for _, d in doc_ids), k)


def _ragged(parts: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(ptr, flat) of a list of int sequences: part i is flat[ptr[i]:ptr[i + 1]]."""
    ptr = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in parts], out=ptr[1:])
    flat = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts if len(p)] + [np.empty(0, np.int64)])
    return ptr, flat


def _kept_ptr(ptr: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """ptr of a ragged array (see _ragged) once the entries where `keep` is False are dropped."""
    owner = np.repeat(np.arange(len(ptr) - 1), np.diff(ptr))
    kept = np.zeros(len(ptr), dtype=np.int64)
    np.cumsum(np.bincount(owner[keep], minlength=len(ptr) - 1), out=kept[1:])
    return kept


# ---------------------------------------------------------------------------------------------------------
# Kernels. A score is an int64 sum of ceil(impact * weight * 2^32) (see the module docstring).
# ---------------------------------------------------------------------------------------------------------


@numba.njit(cache=True, nogil=True, inline="always")
def _fixed(impact, weight_scale):
    # float32 impact x (float32 weight * 2^32): both factors have 24-bit mantissas, so the float64 product
    # is exact and the rounding up is the only rounding.
    return np.int64(math.ceil(np.float64(impact) * weight_scale))


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


@numba.njit(cache=True, nogil=True)
def _heap_drain(heap_s, heap_o, size, out_s, out_o):
    """Pop worst-first into the tail: the output is best first."""
    while size > 0:
        out_s[size - 1] = heap_s[0]
        out_o[size - 1] = heap_o[0]
        size -= 1
        heap_s[0] = heap_s[size]
        heap_o[0] = heap_o[size]
        _sift_down(heap_s, heap_o, 0, size)


@numba.njit(cache=True, nogil=True)
def _exhaustive_top_k(indptr, doc_ords, impacts, q_ptr, rows, weight_scale, k, n_docs, allowed):
    n_queries = q_ptr.size - 1
    filtered = allowed.size > 0  # a 0/1 mask over doc ordinals (constraints); empty: every doc may rank
    out_ords = np.zeros((n_queries, k), dtype=np.int32)
    out_fixed = np.zeros((n_queries, k), dtype=np.int64)
    counts = np.zeros(n_queries, dtype=np.int64)
    heap_s = np.empty(k, dtype=np.int64)
    heap_o = np.empty(k, dtype=np.int32)
    acc = np.zeros(n_docs, dtype=np.int64)
    touched = np.empty(n_docs, dtype=np.int32)
    for q in range(n_queries):
        n_postings = 0
        for i in range(q_ptr[q], q_ptr[q + 1]):
            n_postings += indptr[rows[i] + 1] - indptr[rows[i]]
        size = 0
        if n_postings * 4 < n_docs:
            # Few postings: remember touched docs so accumulation, selection and reset cost O(postings).
            # Every contribution is >= 1, so a zero sum means "not touched yet".
            n_touched = 0
            for i in range(q_ptr[q], q_ptr[q + 1]):
                r = rows[i]
                w = weight_scale[i]
                for j in range(indptr[r], indptr[r + 1]):
                    d = doc_ords[j]
                    if acc[d] == 0:
                        touched[n_touched] = d
                        n_touched += 1
                    acc[d] += _fixed(impacts[j], w)
            for t in range(n_touched):
                d = touched[t]
                s = acc[d]
                acc[d] = 0
                if filtered and allowed[d] == 0:
                    continue
                if size < k or s >= heap_s[0]:  # a strictly lower score can never enter a full heap
                    size = _heap_offer(heap_s, heap_o, size, k, s, d)
        else:
            # Many postings: accumulate, then one scan in ordinal order, where an equal score never beats the
            # root of a full heap.
            for i in range(q_ptr[q], q_ptr[q + 1]):
                r = rows[i]
                w = weight_scale[i]
                for j in range(indptr[r], indptr[r + 1]):
                    acc[doc_ords[j]] += _fixed(impacts[j], w)
            threshold = np.int64(0)
            for d in range(n_docs):
                s = acc[d]
                if s > threshold and (not filtered or allowed[d] != 0):
                    size = _heap_offer(heap_s, heap_o, size, k, s, d)
                    if size == k:
                        threshold = heap_s[0]
            acc[:] = 0
        counts[q] = size
        _heap_drain(heap_s, heap_o, size, out_fixed[q], out_ords[q])
    return out_ords, out_fixed, counts


@numba.njit(cache=True, nogil=True)
def _gallop(values, lo, hi, target):
    """First position in [lo, hi) whose value is >= target (values sorted): exponential then binary search,
    so a cursor that moves forward a little pays a little."""
    if lo >= hi or values[lo] >= target:
        return lo
    below = lo  # values[below] < target
    step = 1
    probe = lo + 1
    while probe < hi and values[probe] < target:
        below = probe
        step <<= 1
        probe = below + step
    top = min(probe, hi)
    lo = below + 1
    while lo < top:
        mid = (lo + top) >> 1
        if values[mid] < target:
            lo = mid + 1
        else:
            top = mid
    return lo


@numba.njit(cache=True, nogil=True)
def _pruned_top_k(indptr, doc_ords, impacts, block_max, n_docs, q_ptr, rows, weight_scale,
                  must_ptr, must_rows, exclude_ptr, exclude_rows, skip_ptr, skip_ords, k, block, window):
    n_queries = q_ptr.size - 1
    out_ords = np.zeros((n_queries, k), dtype=np.int32)
    out_fixed = np.zeros((n_queries, k), dtype=np.int64)
    counts = np.zeros(n_queries, dtype=np.int64)
    width = 1
    for q in range(n_queries):
        width = max(width, q_ptr[q + 1] - q_ptr[q], must_ptr[q + 1] - must_ptr[q],
                    exclude_ptr[q + 1] - exclude_ptr[q])
    pos = np.empty(width, dtype=np.int64)  # per term: cursor into its postings
    end = np.empty(width, dtype=np.int64)
    bound = np.empty(width, dtype=np.int64)  # per term: upper bound of its contribution in this window
    order = np.empty(width, dtype=np.int64)  # terms present in the window, by bound ascending
    prefix = np.empty(width, dtype=np.int64)  # prefix[e]: sum of bounds of order[0..e] (non-essential terms)
    must_pos = np.empty(width, dtype=np.int64)
    must_end = np.empty(width, dtype=np.int64)
    excl_pos = np.empty(width, dtype=np.int64)
    excl_end = np.empty(width, dtype=np.int64)
    heap_s = np.empty(k, dtype=np.int64)
    heap_o = np.empty(k, dtype=np.int32)
    acc = np.zeros(window, dtype=np.int64)
    cand = np.empty(window, dtype=np.int32)
    for q in range(n_queries):
        t0 = q_ptr[q]
        n = q_ptr[q + 1] - t0
        if n == 0:
            continue
        for i in range(n):
            pos[i] = indptr[rows[t0 + i]]
            end[i] = indptr[rows[t0 + i] + 1]
        n_must = must_ptr[q + 1] - must_ptr[q]
        for i in range(n_must):
            must_pos[i] = indptr[must_rows[must_ptr[q] + i]]
            must_end[i] = indptr[must_rows[must_ptr[q] + i] + 1]
        n_excl = exclude_ptr[q + 1] - exclude_ptr[q]
        for i in range(n_excl):
            excl_pos[i] = indptr[exclude_rows[exclude_ptr[q] + i]]
            excl_end[i] = indptr[exclude_rows[exclude_ptr[q] + i] + 1]
        skip_pos = skip_ptr[q]
        skip_end = skip_ptr[q + 1]
        size = 0
        theta = np.int64(0)  # a new hit must score above theta: 0 until the heap is full, then its root
        start = 0
        while start < n_docs:
            # The window starts at the first doc at or after `start` that some term holds and every must
            # term may hold.
            first = n_docs
            for i in range(n):
                p = _gallop(doc_ords, pos[i], end[i], start)
                pos[i] = p
                if p < end[i] and doc_ords[p] < first:
                    first = doc_ords[p]
            if first >= n_docs:
                break
            later = first
            for i in range(n_must):
                p = _gallop(doc_ords, must_pos[i], must_end[i], first)
                must_pos[i] = p
                later = max(later, doc_ords[p] if p < must_end[i] else n_docs)
            if later > first:
                start = later
                continue
            stop = min(first + window, n_docs)
            # Per-term bounds over the window: the largest block maximum among the blocks its postings in the
            # window fall into.
            m = 0
            total = np.int64(0)
            for i in range(n):
                p = pos[i]
                if p >= end[i] or doc_ords[p] >= stop:
                    continue
                top = block_max[p // block]
                nxt = (p // block + 1) * block
                while nxt < end[i] and doc_ords[nxt] < stop:
                    top = max(top, block_max[nxt // block])
                    nxt += block
                bound[i] = _fixed(top, weight_scale[t0 + i])
                total += bound[i]
                j = m  # insertion sort by bound ascending (a query has tens of terms)
                while j > 0 and bound[order[j - 1]] > bound[i]:
                    order[j] = order[j - 1]
                    j -= 1
                order[j] = i
                m += 1
            if total <= theta:
                start = stop
                continue
            n_lazy = 0  # non-essential terms: order[0:n_lazy]
            run = np.int64(0)
            while n_lazy < m and run + bound[order[n_lazy]] <= theta:
                run += bound[order[n_lazy]]
                prefix[n_lazy] = run
                n_lazy += 1
            # Essential terms, term at a time, into the window accumulator.
            n_cand = 0
            for e in range(n_lazy, m):
                i = order[e]
                w = weight_scale[t0 + i]
                j = pos[i]
                while j < end[i]:
                    d = doc_ords[j]
                    if d >= stop:
                        break
                    slot = d - first
                    if acc[slot] == 0:
                        cand[n_cand] = slot
                        n_cand += 1
                    acc[slot] += _fixed(impacts[j], w)
                    j += 1
                pos[i] = j
            # Candidates in ordinal order, so that a score equal to the root's never beats it.
            if n_cand * 16 < stop - first:
                cand[:n_cand].sort()
            else:
                n_cand = 0
                for slot in range(stop - first):
                    if acc[slot] != 0:
                        cand[n_cand] = slot
                        n_cand += 1
            lazy_total = prefix[n_lazy - 1] if n_lazy > 0 else np.int64(0)
            for c in range(n_cand):
                slot = cand[c]
                s = acc[slot]
                acc[slot] = 0
                if s + lazy_total <= theta:
                    continue
                d = first + slot
                ok = True
                for i in range(n_must):
                    p = _gallop(doc_ords, must_pos[i], must_end[i], d)
                    must_pos[i] = p
                    if p >= must_end[i] or doc_ords[p] != d:
                        ok = False
                        break
                if not ok:
                    continue
                for i in range(n_excl):
                    p = _gallop(doc_ords, excl_pos[i], excl_end[i], d)
                    excl_pos[i] = p
                    if p < excl_end[i] and doc_ords[p] == d:
                        ok = False
                        break
                if not ok:
                    continue
                if skip_pos < skip_end:
                    skip_pos = _gallop(skip_ords, skip_pos, skip_end, d)
                    if skip_pos < skip_end and skip_ords[skip_pos] == d:
                        continue
                e = n_lazy - 1
                while e >= 0:
                    if s + prefix[e] <= theta:
                        break
                    i = order[e]
                    p = _gallop(doc_ords, pos[i], end[i], d)
                    pos[i] = p
                    if p < end[i] and doc_ords[p] == d:
                        s += _fixed(impacts[p], weight_scale[t0 + i])
                    e -= 1
                if e >= 0 or s <= theta:
                    continue
                size = _heap_offer(heap_s, heap_o, size, k, s, np.int32(d))
                if size == k:
                    theta = heap_s[0]
            start = stop
        counts[q] = size
        _heap_drain(heap_s, heap_o, size, out_fixed[q], out_ords[q])
    return out_ords, out_fixed, counts


@numba.njit(cache=True, nogil=True, inline="always")
def _id_less(off_a, data_a, i, off_b, data_b, j):
    """Is doc id i of shard a before doc id j of shard b (bytewise)?"""
    a0, a1, b0, b1 = off_a[i], off_a[i + 1], off_b[j], off_b[j + 1]
    for t in range(min(a1 - a0, b1 - b0)):
        if data_a[a0 + t] != data_b[b0 + t]:
            return data_a[a0 + t] < data_b[b0 + t]
    return a1 - a0 < b1 - b0


@numba.njit(cache=True, nogil=True)
def _merge_top_k(scores, ords, counts, id_offsets, id_data, k):
    n_shards = len(scores)
    n_queries = counts[0].size
    out_shard = np.zeros((n_queries, k), dtype=np.int64)
    out_ords = np.zeros((n_queries, k), dtype=np.int32)
    out_scores = np.zeros((n_queries, k), dtype=np.float64)
    out_counts = np.zeros(n_queries, dtype=np.int64)
    head = np.zeros(n_shards, dtype=np.int64)
    for q in range(n_queries):
        head[:] = 0
        n = 0
        while n < k:
            best = -1
            best_score = 0.0
            best_ord = 0
            for s in range(n_shards):
                h = head[s]
                if h >= counts[s][q]:
                    continue
                score = scores[s][q, h]
                ord_ = ords[s][q, h]
                if best < 0 or score > best_score or (score == best_score and _id_less(
                        id_offsets[s], id_data[s], ord_, id_offsets[best], id_data[best], best_ord)):
                    best, best_score, best_ord = s, score, ord_
            if best < 0:
                break
            out_shard[q, n] = best
            out_ords[q, n] = best_ord
            out_scores[q, n] = best_score
            head[best] += 1
            n += 1
        out_counts[q] = n
    return out_shard, out_ords, out_scores, out_counts
