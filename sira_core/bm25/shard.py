"""One doc shard as plain arrays (ShardIndex), and how its postings are stored.

A shard is a CSC-like matrix over (term row, doc ordinal): `indptr`/`doc_ords` locate a term's postings and
`impacts` holds each posting's contribution (sira.core.bm25.formulas). Doc ordinals follow doc-id order. A term
with at least TIER_MIN_POSTINGS postings in the shard is stored in two tiers (`split_tiers`, when the shard is
built; caches keep them): its postings whose impact exceeds the TIER_QUANTILE quantile of its impacts, then the
others, each in ordinal order; the pruned scorer bounds each tier by its own largest impact (`term_max`,
`tier_max`). `top_k` and `top_k_many` score through sira.core.bm25.top_k.

TIER_MIN_POSTINGS and TIER_QUANTILE are read here at call time: set them on this module, not on the package.
"""

from __future__ import annotations

import threading
from typing import Iterable, Sequence

import numba
import numpy as np
import pyarrow.compute as pc

from sira.core.bm25.doc_ids import as_doc_id_array, doc_id_buffers, doc_ids_from_buffers
from sira.core.bm25.formulas import IMPACT_DTYPE, CorpusStats, WeightedQuery, _impacts, idf
from sira.core.bm25.top_k import top_k_shards

ROW_SAMPLE = 64  # rows_of searches every ROW_SAMPLE-th term id first (a small array that stays in cache)
TIER_MIN_POSTINGS = 4096  # a term with at least this many postings in a shard is stored in two tiers: ...
TIER_QUANTILE = 0.9  # ... the postings whose impact exceeds this quantile of its impacts, then the others


def term_maxima(indptr: np.ndarray, impacts: np.ndarray) -> np.ndarray:
    """Largest impact of each term (0 for a term without postings): the pruned scorer's upper bounds."""
    out = np.zeros(len(indptr) - 1, dtype=IMPACT_DTYPE)
    held = np.flatnonzero(np.diff(indptr) > 0)
    if len(held):
        out[held] = np.maximum.reduceat(impacts, indptr[held])
    return out


def split_tiers(indptr: np.ndarray, doc_ords: np.ndarray, impacts: np.ndarray, min_postings: int | None = None,
                quantile: float | None = None, in_place: bool = False
                ) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, ...]]:
    """Store each term with at least `min_postings` postings (TIER_MIN_POSTINGS) in two tiers, each in ordinal
    order: first its postings whose impact exceeds the `quantile` (TIER_QUANTILE) of its impacts, then the
    others. Returns (doc_ords, impacts, (tier_rows, tier_split, tier_max)): the rows split, where each one's low
    tier begins, and the low tier's largest impact (term_max stays the high tier's). Scores do not change: a
    list's order does not matter to a sum, and the pruned scorer bounds the low tier by its own maximum.
    `in_place`: reorder the given arrays (the caller's own, writeable) instead of copies."""
    min_postings = TIER_MIN_POSTINGS if min_postings is None else min_postings
    quantile = TIER_QUANTILE if quantile is None else quantile
    long_rows = np.flatnonzero(np.diff(indptr) >= max(min_postings, 2)).astype(np.int64)
    if not len(long_rows):
        return doc_ords, impacts, (np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, IMPACT_DTYPE))
    if not in_place:
        doc_ords, impacts = np.array(doc_ords, dtype=np.int32), np.array(impacts, dtype=IMPACT_DTYPE)
    split = np.empty(len(long_rows), np.int64)
    low_max = np.empty(len(long_rows), IMPACT_DTYPE)
    kept = _split_tiers(indptr, doc_ords, impacts, long_rows, quantile, split, low_max)
    return doc_ords, impacts, (long_rows[kept], split[kept], low_max[kept])


def _read_only(a: np.ndarray) -> np.ndarray:
    """One array type for numba (memory-mapped caches are read-only), so each kernel compiles once."""
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


class ShardIndex:
    """One doc shard as plain arrays (in memory, or memory-mapped from sira.pipelines.serving.shard_cache)."""

    def __init__(
        self,
        shard: int,
        doc_ids,
        doc_lens: np.ndarray,
        term_ids: np.ndarray,
        indptr: np.ndarray,
        doc_ords: np.ndarray,
        impacts: np.ndarray,
        term_max: np.ndarray | None = None,
        tiers: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
        owned: bool = False,
    ):
        """`doc_ids`: anything pyarrow takes as strings (list, numpy object array, Arrow array), sorted; doc
        ordinal i is doc_ids[i]. `doc_ords`: ascending within each term's postings. `impacts`: > 0, as BM25
        contributions are. `term_max`: term_maxima(indptr, impacts), computed here when not given. `tiers`:
        (tier_rows, tier_split, tier_max) as arrays() gives them, with doc_ords and impacts already in tier order;
        when not given, the terms with at least TIER_MIN_POSTINGS postings are split here (split_tiers), in place
        when `owned` (doc_ords and impacts are writeable arrays made for this shard alone, not copied again)."""
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
        doc_ords = np.asarray(doc_ords, dtype=np.int32)
        impacts = np.asarray(impacts, dtype=IMPACT_DTYPE)
        term_max = term_maxima(self.indptr, impacts) if term_max is None else np.asarray(term_max, dtype=IMPACT_DTYPE)
        if len(term_max) != len(self.term_ids):
            raise ValueError(f"shard {shard}: {len(term_max)} term maxima for {len(self.term_ids)} terms")
        if tiers is None:
            doc_ords, impacts, tiers = split_tiers(self.indptr, doc_ords, impacts, in_place=owned and
                                                   doc_ords.flags.writeable and impacts.flags.writeable)
        tier_rows, tier_split, tier_max = (np.asarray(tiers[0], np.int64), np.asarray(tiers[1], np.int64),
                                           np.asarray(tiers[2], IMPACT_DTYPE))
        if not len(tier_rows) == len(tier_split) == len(tier_max) or (len(tier_rows) and (
                tier_rows[0] < 0 or tier_rows[-1] >= len(self.term_ids) or np.any(np.diff(tier_rows) <= 0)
                or np.any(tier_split <= self.indptr[tier_rows]) or np.any(tier_split >= self.indptr[tier_rows + 1]))):
            raise ValueError(f"shard {shard}: inconsistent tiers")
        self.doc_ords = _read_only(doc_ords)
        self.impacts = _read_only(impacts)
        self.term_max = _read_only(term_max)
        self.tier_rows, self.tier_split, self.tier_max = map(_read_only, (tier_rows, tier_split, tier_max))
        # Every ROW_SAMPLE-th term id: rows_of searches this first, then one run of the full array.
        self._row_sample = np.ascontiguousarray(self.term_ids[::ROW_SAMPLE])
        self.max_impact = float(self.term_max.max()) if len(self.term_max) else 0.0
        self._lock = threading.Lock()
        self._work: tuple[np.ndarray, ...] | None = None

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
        # idf x saturated_tf in one pass, the length norm once per document: the same float64 operations in the
        # same order as those two functions (the same bits), without a temporary array per operation.
        norm = stats.k1 * (1.0 - stats.b + stats.b * np.asarray(doc_lens, dtype=np.float64) / stats.avgdl)
        impacts = np.empty(len(ords), IMPACT_DTYPE)
        _impacts(indptr, idf(stats.num_docs, dfs), ords, np.asarray(postings_tfs), norm, stats.k1 + 1.0, impacts)
        return cls(shard, doc_ids, doc_lens, term_ids, indptr, ords, impacts)

    @property
    def num_docs(self) -> int:
        return len(self.doc_ids)

    def arrays(self) -> dict[str, np.ndarray]:
        """Every array of the shard by name (what a cache stores; doc ids as offsets + bytes)."""
        return {"doc_id_offsets": self.doc_id_offsets, "doc_id_data": self.doc_id_data, "doc_lens": self.doc_lens,
                "term_ids": self.term_ids, "indptr": self.indptr, "doc_ords": self.doc_ords,
                "impacts": self.impacts, "term_max": self.term_max, "tier_rows": self.tier_rows,
                "tier_split": self.tier_split, "tier_max": self.tier_max}

    @classmethod
    def from_arrays(cls, shard: int, arrays: dict[str, np.ndarray]) -> "ShardIndex":
        """The inverse of arrays(), without copying them."""
        return cls(shard, doc_ids_from_buffers(arrays["doc_id_offsets"], arrays["doc_id_data"]), arrays["doc_lens"],
                   arrays["term_ids"], arrays["indptr"], arrays["doc_ords"], arrays["impacts"], arrays["term_max"],
                   (arrays["tier_rows"], arrays["tier_split"], arrays["tier_max"]))

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays().values())

    def rows_of(self, term_ids: np.ndarray) -> np.ndarray:
        """Row of each term id in this shard, -1 where the shard has no posting for it."""
        term_ids = np.asarray(term_ids, dtype=np.int64)
        out = np.full(len(term_ids), -1, dtype=np.int64)
        _rows_of(self.term_ids, self._row_sample, ROW_SAMPLE, term_ids, out)
        return out

    def segments(self, row: int) -> list[tuple[int, int]]:
        """The posting ranges of a row, each in ordinal order: one, or two for a term stored in tiers."""
        lo, hi = int(self.indptr[row]), int(self.indptr[row + 1])
        t = int(np.searchsorted(self.tier_rows, row))
        if t < len(self.tier_rows) and self.tier_rows[t] == row:
            return [(lo, int(self.tier_split[t])), (int(self.tier_split[t]), hi)]
        return [(lo, hi)]

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
              scorer: str = "auto") -> tuple[np.ndarray, np.ndarray]:
        """Doc ordinals and scores of the k best documents, by (score desc, ordinal asc)."""
        ords, scores, counts = self.top_k_many([query], k, [(must, exclude)], scorer=scorer)
        return ords[0, : counts[0]], scores[0, : counts[0]]

    def top_k_many(
        self,
        queries: Sequence[WeightedQuery],
        k: int,
        constraints: Sequence[tuple[Sequence[int], Sequence[int]]] | None = None,
        skip_ords: Sequence[np.ndarray] | None = None,
        scorer: str = "auto",
        floors: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Score a batch of queries: (ords [q, k] int32, scores [q, k] float64, hit counts [q]), each row best
        first. constraints[i] = (must term ids, exclude term ids): a hit holds every must term and no exclude
        term. skip_ords[i]: ordinals query i must not return (excluded doc ids). floors[i]: query i needs no
        hit scoring below it (another shard already has k hits that good), so fewer than k may come back.
        scorer: "auto", "pruned" or "exhaustive" (sira.core.bm25.top_k); all return the same ordinals and scores."""
        return top_k_shards([self], queries, k, constraints, None if skip_ords is None else [skip_ords], scorer,
                            floors)[0]

    def _work_arrays(self) -> tuple[np.ndarray, ...]:
        """Per-doc arrays the kernels reuse from query to query instead of allocating and zeroing them each
        time: acc (left zeroed), values, spare (int64); touched, cand (n + 1: the pruned scorer writes one past
        the docs it counts), hit_ords, spare_o (int32); marks, pooled (bitmaps, left zeroed). Made on first use:
        a shard that is only loaded costs nothing."""
        if self._work is None:
            n = self.num_docs
            self._work = (np.zeros(n, np.int64), np.empty(n + 1, np.int64), np.empty(n + 1, np.int64),
                          np.empty(n + 1, np.int32), np.empty(n + 1, np.int32), np.empty(n + 1, np.int32),
                          np.empty(n + 1, np.int32), np.zeros(n // 64 + 1, np.uint64), np.zeros(n // 64 + 1, np.uint64))
        return self._work

    def docs_with_term(self, term_id_: int) -> np.ndarray:
        """Doc ordinals holding a term (sorted)."""
        row = self.rows_of(np.array([term_id_], dtype=np.int64))[0]
        if row < 0:
            return np.empty(0, np.int32)
        parts = [self.doc_ords[lo:hi] for lo, hi in self.segments(row)]
        return parts[0] if len(parts) == 1 else np.sort(np.concatenate(parts))

    def constraint_mask(self, must: Sequence[int], exclude: Sequence[int],
                        skip: np.ndarray | None = None) -> np.ndarray | None:
        """0/1 mask of docs holding every `must` term id, no `exclude` term id and not in `skip` (None: no
        constraint)."""
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
            for lo, hi in self.segments(row):
                j = lo + np.searchsorted(self.doc_ords[lo:hi], doc_ord)
                if j < hi and self.doc_ords[j] == doc_ord:
                    out[term] = float(w) * float(self.impacts[j])
        return out


@numba.njit(cache=True, nogil=True)
def _split_tiers(indptr, doc_ords, impacts, rows, quantile, split, low_max):
    """split_tiers in place over doc_ords / impacts (copies); returns the indices of `rows` that were split (a row
    whose impacts are all equal to its quantile stays one list)."""
    longest = 0
    for r in rows:
        longest = max(longest, indptr[r + 1] - indptr[r])
    ords_buf = np.empty(longest, np.int32)
    imps_buf = np.empty(longest, impacts.dtype)
    kept = np.empty(rows.size, np.int64)
    n_kept = 0
    for i in range(rows.size):
        lo, hi = indptr[rows[i]], indptr[rows[i] + 1]
        n = hi - lo
        pos = min(np.int64(n * quantile), n - 1)
        cut = np.partition(impacts[lo:hi], pos)[pos]
        n_high = 0
        for j in range(lo, hi):
            n_high += impacts[j] > cut
        if n_high == 0:
            continue
        ords_buf[:n] = doc_ords[lo:hi]
        imps_buf[:n] = impacts[lo:hi]
        a, b = lo, lo + n_high
        top = impacts.dtype.type(0)
        for j in range(n):
            if imps_buf[j] > cut:
                doc_ords[a] = ords_buf[j]
                impacts[a] = imps_buf[j]
                a += 1
            else:
                doc_ords[b] = ords_buf[j]
                impacts[b] = imps_buf[j]
                top = max(top, imps_buf[j])
                b += 1
        split[i] = lo + n_high
        low_max[i] = top
        kept[n_kept] = i
        n_kept += 1
    return kept[:n_kept]


@numba.njit(cache=True, nogil=True)
def _rows_of(term_ids, sample, stride, ids, out):
    """out[i] = the row of ids[i] in term_ids (sorted), or stays -1: a search of `sample` (every stride-th term
    id, small enough to stay in cache), then of one run of stride term ids: two or three cache misses where a
    search of the whole array takes twenty."""
    for i in range(ids.size):
        t = ids[i]
        b = np.searchsorted(sample, t, side="right") - 1
        if b < 0:
            continue
        lo = b * stride
        hi = min(lo + stride, term_ids.size)
        p = lo + np.searchsorted(term_ids[lo:hi], t)
        if p < hi and term_ids[p] == t:
            out[i] = p
