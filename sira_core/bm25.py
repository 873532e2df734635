"""Lucene BM25 maths and the in-memory shard scorer.

A shard is a CSC-like matrix over (term row, doc ordinal): `indptr`/`doc_ords` locate a term's postings
and `impacts` holds each posting's precomputed contribution idf * tf*(k1+1)/(tf + k1*(1-b+b*dl/avgdl))
with *corpus-wide* N, avgdl and df, so a document's score does not depend on which shard holds it.
A query is a set of (term id, weight) pairs.

Scores are fixed-point sums. Each contribution w * impact is the product of two float32 values, exact in
float64; it is rounded up to a multiple of 2^-FIXED_POINT_BITS and the contributions are added as int64.
Integer addition does not depend on the order of its terms, so every evaluation order (all postings term
at a time, or lists in any order with some merged into candidates later) gives the same bits, and
upper bounds are exact integers: pruning needs no float slack to be safe. A score is returned as float64
(the integer times 2^-32, exact below MAX_SCORE); its resolution, 2.3e-10, is far finer than float32's.

Top-k uses a total order, (score desc, doc ordinal asc). Doc ordinals follow doc-id order inside a shard, so
merging per-shard top-k by (score desc, doc id asc) equals the single-shard result exactly.

Pruning (`top_k_shards`; `top_k_many` for one shard): MaxScore over all shards of a call at once, term at a
time. A term with at least TIER_MIN_POSTINGS postings in a shard is stored in two tiers (`split_tiers`, when the
shard is built; caches keep them): its postings whose impact exceeds the TIER_QUANTILE quantile of its impacts,
then the others, each in ordinal order. A query's lists are its terms' tiers in each shard; a list's bound is its
weight times its largest impact (`term_max`, `tier_max`), and a shard's rest bound is the sum of the bounds of its
lists not yet added. A hit needs at least the floor: the caller's (`floors`), raised by the k-th best partial
score of the pooled docs (every allowed doc whose partial score reached the floor; partial scores only grow, so
k of them prove that the k-th best final score is at least that much).
1. Essential phase: lists by bound per posting, highest first (rare terms and high tiers: they lift the floor
   and lower the rest bound most per posting read). A list is added in full, its new docs remembered as touched,
   while its shard's rest bound (the list included) reaches the floor: a doc none of the lists left holds could
   still reach it. Below the floor no new doc of that shard can; a list then still adds to the touched docs
   while the rest bound is at least EXTEND_FRACTION of the floor (fewer candidates: a candidate costs more than
   a posting), and the others are deferred.
2. Candidate phase, shard by shard: the touched docs whose partial score plus the deferred bounds can reach the
   floor; each deferred list, largest bound first, adds to them (a galloping merge in ordinal order when they
   are few for its list, else a scan), and the candidates the lists left cannot lift to the floor are dropped.
   Each shard's hits (exact scores) raise the floor for the shards after it.
Must / exclude terms and skipped documents are a doc mask, an exact filter applied before any document counts
towards the floor. The per-doc steps (is a doc new, is it a candidate, does it stay one) are branch-free: their
outcomes are coin tosses, and mispredicted branches had cost more than the work. The accumulator is touched at
random, so the essential phase asks for the cache line of the posting PREFETCH_DISTANCE ahead. What each step
brought on 1M documents is in docs/benchmarks.md.

Selection: the exhaustive scorer gathers hits above a threshold that rises as it goes; for k >=
HISTOGRAM_K it first guesses the threshold from every SAMPLE_STRIDE-th doc (kept when at least k hits pass
it, so none of the k best is lost), and drops hits below the histogram bucket of the k-th best before the
final partial sort, because the gathering costs more than the scoring at k = 1000. It scores the shards in
turn, each passing the k-th best so far on as the next one's floor.

Which scorer (`scorer="auto"`): pruning pays when k is small and the lists are long. On 1M synthetic documents
(bench/results/searcher_scale_1m.json and _run1.json: 4 shards, 300 scifact queries, one thread) pruning ran plain
queries (17 terms) at k=10 2.0-2.4x as fast as exhaustive scoring, queries with 30-60 pseudo-relevance-feedback
expansion terms 2.6-2.8x; at k=100 plain 1.1-1.2x and expanded 0.8-1.0x (many candidates). With few postings the
fixed work per query (its lists, their order) outweighs scoring them; with lists that cover the corpus many times
over (BEIR arguana: 94-term queries, 8 postings per document of one 8.7k-document shard) nearly every document is
touched by the essential lists and the candidates cost more than dense accumulation (arguana k=10: 4,895 q/s
pruned against 6,844 exhaustive). So "auto" prunes queries with k <= PRUNE_MAX_K whose lists hold at least
PRUNE_MIN_POSTINGS postings over all shards and at most PRUNE_MAX_POSTINGS_PER_DOC per document (1M documents:
0.6 plain, 0.9 expanded on average, 2.6 at most; with 2, auto lost 7% on expanded queries), and scores the others
exhaustively; "pruned" and "exhaustive" force one (the tests compare them).
"""

from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import dataclass
from typing import Iterable, Sequence

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

IMPACT_DTYPE = np.float32  # impacts and query weights
FIXED_POINT_BITS = 32
_FIXED_SCALE = float(2**FIXED_POINT_BITS)
MAX_SCORE = float(2 ** (53 - FIXED_POINT_BITS))  # int64 sums below 2^53 are exact in float64
HISTOGRAM_K = 128  # from this k, selection cuts by a histogram and guesses its threshold from a sample
SAMPLE_STRIDE = 16  # ... of every SAMPLE_STRIDE-th doc
ROW_SAMPLE = 64  # rows_of searches every ROW_SAMPLE-th term id first (a small array that stays in cache)
TIER_MIN_POSTINGS = 4096  # a term with at least this many postings in a shard is stored in two tiers: ...
TIER_QUANTILE = 0.9  # ... the postings whose impact exceeds this quantile of its impacts, then the others
PRUNE_MAX_K = 64  # "auto" prunes queries with k up to this ...
PRUNE_MIN_POSTINGS = 65_536  # ... whose lists hold at least this many postings over all shards, ...
PRUNE_MAX_POSTINGS_PER_DOC = 4  # ... and at most this many per document; see above
EXTEND_FRACTION = 0.8  # after the switch, lists go on adding to touched docs while the rest bound >= this x floor
POOL_CAPACITY = 1024  # docs at or above the floor the pruned scorer keeps to raise it
PREFETCH_DISTANCE = 16  # postings ahead whose accumulator line the essential phase asks for
MERGE_RATIO = 8  # a deferred list is merged into the candidates (galloping) when it is this many times longer


def idf(num_docs: int, df: np.ndarray) -> np.ndarray:
    """Lucene idf: ln(1 + (N - df + 0.5) / (df + 0.5)); always > 0."""
    df = np.asarray(df, dtype=np.float64)
    return np.log1p((num_docs - df + 0.5) / (df + 0.5))


def saturated_tf(tf: np.ndarray, doc_len: np.ndarray, avgdl: float, k1: float, b: float) -> np.ndarray:
    """tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))."""
    tf = np.asarray(tf, dtype=np.float64)
    norm = k1 * (1.0 - b + b * np.asarray(doc_len, dtype=np.float64) / avgdl)
    return tf * (k1 + 1.0) / (tf + norm)


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

    @property
    def num_postings(self) -> int:
        return len(self.doc_ords)

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
        scorer: "auto", "pruned" or "exhaustive" (module docstring); all return the same ordinals and scores."""
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


def top_k_shards(
    shards: Sequence[ShardIndex],
    queries: Sequence[WeightedQuery],
    k: int,
    constraints: Sequence[tuple[Sequence[int], Sequence[int]]] | None = None,
    skip_ords: Sequence[Sequence[np.ndarray]] | None = None,
    scorer: str = "auto",
    floors: np.ndarray | None = None,
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """ShardIndex.top_k_many over several shards of one index at once: per shard (ords [q, k] int32, scores
    [q, k] float64, hit counts [q]), which merge_top_k turns into the top k of them all. skip_ords[s][i]: the
    ordinals of shard s query i must not return. The pruned scorer handles all shards in one call, with one floor
    per query; the exhaustive one scores the shards in turn, each passing the k-th best so far on as a floor."""
    if k <= 0:
        raise ValueError(f"k must be positive, got {k}")
    if scorer not in ("auto", "pruned", "exhaustive"):
        raise ValueError(f"scorer must be auto, pruned or exhaustive, got {scorer!r}")
    n_queries, n_shards = len(queries), len(shards)
    total_docs = sum(s.num_docs for s in shards)
    k = min(k, max(total_docs, 1))
    term_ptr, all_ids = _ragged([q.term_ids for q in queries])
    all_weights = np.concatenate([q.weights for q in queries] + [np.empty(0, IMPACT_DTYPE)])
    rows = np.stack([s.rows_of(all_ids) for s in shards]) if n_shards else np.empty((0, len(all_ids)), np.int64)
    keep = np.any(rows >= 0, axis=0)
    q_ptr = _kept_ptr(term_ptr, keep)
    rows, weights = np.ascontiguousarray(rows[:, keep]), all_weights[keep].astype(np.float64)
    query_of_term = np.repeat(np.arange(n_queries), np.diff(q_ptr))
    heaviest = np.bincount(query_of_term, weights=weights, minlength=n_queries)
    if np.any(heaviest * max((s.max_impact for s in shards), default=0.0) >= MAX_SCORE / 2):
        raise ValueError(f"query weights too large: scores would exceed {MAX_SCORE / 2:g}")
    weight_scale = weights * _FIXED_SCALE
    fixed_floors = np.zeros(n_queries, dtype=np.int64) if floors is None else \
        np.round(np.asarray(floors, dtype=np.float64) * _FIXED_SCALE).astype(np.int64)
    # A constrained query (must / exclude terms, skipped docs) gets a doc mask per shard; the others none.
    constrained = np.zeros(n_queries, dtype=bool)
    if constraints is not None:
        constrained |= np.fromiter((bool(len(must) or len(exclude)) for must, exclude in constraints), bool,
                                   count=n_queries)
    for per_query in skip_ords or ():
        constrained |= np.fromiter((skip is not None and len(skip) > 0 for skip in per_query), bool, count=n_queries)
    empty_mask = np.empty(0, np.uint8)
    masks = {int(i): tuple(
        s.constraint_mask(*(constraints[i] if constraints is not None else ((), ())),
                          None if skip_ords is None else skip_ords[si][i]) for si, s in enumerate(shards))
        for i in np.flatnonzero(constrained)}
    if scorer == "auto":
        postings = np.zeros(n_queries)
        for s, shard_rows in zip(shards, rows):
            held = shard_rows >= 0
            postings += np.bincount(query_of_term[held], minlength=n_queries,
                                    weights=s.indptr[shard_rows[held] + 1] - s.indptr[shard_rows[held]])
        prune = (k <= PRUNE_MAX_K) & (postings >= PRUNE_MIN_POSTINGS) & \
            (postings <= PRUNE_MAX_POSTINGS_PER_DOC * total_docs)
    else:
        prune = np.full(n_queries, scorer == "pruned")
    ords = np.zeros((n_shards, n_queries, k), dtype=np.int32)
    fixed = np.zeros((n_shards, n_queries, k), dtype=np.int64)
    counts = np.zeros((n_shards, n_queries), dtype=np.int64)
    # Unconstrained queries share one compiled call per scorer; a constrained one is scored alone under its
    # doc masks.
    groups = [np.flatnonzero(~constrained & prune), np.flatnonzero(~constrained & ~prune)] + \
        [np.array([i]) for i in np.flatnonzero(constrained)]
    with contextlib.ExitStack() as held:
        for shard in sorted(shards, key=id):  # the kernels use the shards' work arrays; one order, no deadlock
            held.enter_context(shard._lock)
        works = [s._work_arrays() for s in shards]
        for group in (g for g in groups if len(g)):
            # The group's query terms, in order: a ragged slice of the batch (numpy, not a Python loop per query).
            lengths = q_ptr[group + 1] - q_ptr[group]
            sub_ptr = np.zeros(len(group) + 1, dtype=np.int64)
            np.cumsum(lengths, out=sub_ptr[1:])
            picked = np.repeat(q_ptr[group] - sub_ptr[:-1], lengths) + np.arange(sub_ptr[-1], dtype=np.int64)
            group_masks = tuple(m if m is not None else empty_mask for m in masks[int(group[0])]) \
                if constrained[group[0]] else (empty_mask,) * n_shards
            if prune[group[0]]:
                out = _pruned_top_k(
                    *(tuple(getattr(s, name) for s in shards) for name in (
                        "indptr", "doc_ords", "impacts", "term_max", "tier_rows", "tier_split", "tier_max")),
                    np.array([s.num_docs for s in shards], np.int64), sub_ptr, np.ascontiguousarray(rows[:, picked]),
                    weight_scale[picked], fixed_floors[group], k, group_masks, MERGE_RATIO, EXTEND_FRACTION,
                    POOL_CAPACITY, *zip(*works))  # each work array, as a tuple over the shards
                for si in range(n_shards):
                    ords[si, group], fixed[si, group], counts[si, group] = out[0][si], out[1][si], out[2][si]
                continue
            group_floors = fixed_floors[group]
            for si, s in enumerate(shards):
                acc, values, spare, touched, _, hit_ords, spare_o, _, _ = works[si]
                k_s = min(k, max(s.num_docs, 1))
                o, f, c = _exhaustive_top_k(s.indptr, s.doc_ords, s.impacts, sub_ptr, rows[si, picked],
                                            weight_scale[picked], group_floors, k_s, s.num_docs, group_masks[si],
                                            acc, values, spare, touched, hit_ords, spare_o)
                ords[si, group, :k_s], fixed[si, group, :k_s], counts[si, group] = o, f, c
                # The k-th best score so far: a later shard need not return hits below it (ties still may win on
                # doc id), which lets it skip most of its gathering.
                so_far = fixed[: si + 1, group].transpose(1, 0, 2).reshape(len(group), -1)
                full = counts[: si + 1, group].sum(axis=0) >= k
                if np.any(full):
                    kth = -np.partition(-so_far, k - 1, axis=1)[:, k - 1]
                    group_floors = np.where(full, np.maximum(group_floors, kth), group_floors)
    return [(ords[si], fixed[si] * (1.0 / _FIXED_SCALE), counts[si]) for si in range(n_shards)]


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


@numba.njit(cache=True, nogil=True)
def _drop_below_histogram_bucket(buf_s, buf_o, m, k):
    """Drop from buf[:m] the hits below the histogram bucket that holds the k-th best score, keeping at least k
    (and every hit that ties with or beats the k-th best): two passes over buf, where np.partition (what
    _keep_best finishes with) costs several times as much per value. Returns how many are kept."""
    lo = buf_s[0]
    hi = buf_s[0]
    for i in range(1, m):
        lo = min(lo, buf_s[i])
        hi = max(hi, buf_s[i])
    if lo == hi:
        return m
    n_buckets = 1024
    scale = (n_buckets - 1) / np.float64(hi - lo)  # a monotone bucket of each score: equal scores share one
    hist = np.zeros(n_buckets, dtype=np.int64)
    for i in range(m):
        hist[np.int64((buf_s[i] - lo) * scale)] += 1
    above = 0
    b = n_buckets - 1
    while b > 0:
        above += hist[b]
        if above >= k:
            break
        b -= 1
    kept = 0
    for i in range(m):
        if np.int64((buf_s[i] - lo) * scale) >= b:
            buf_s[kept] = buf_s[i]
            buf_o[kept] = buf_o[i]
            kept += 1
    return kept


@numba.njit(cache=True, nogil=True)
def _keep_best(buf_s, buf_o, m, k, scratch_s, scratch_o):
    """Keep the k best of the m hits in buf[:m] (score desc, ordinal asc; given in any order) in buf[:k].
    Returns how many are kept; when that is k, buf_s[:k].min() is the k-th best score."""
    if m <= k:
        return m
    if k >= HISTOGRAM_K and m > 2 * k:
        m = _drop_below_histogram_bucket(buf_s, buf_o, m, k)
        if m <= k:
            return m
    scratch_s[:m] = buf_s[:m]
    kth = np.partition(scratch_s[:m], m - k)[m - k]
    above = 0
    ties = 0
    for i in range(m):
        if buf_s[i] > kth:
            above += 1
        elif buf_s[i] == kth:
            scratch_o[ties] = buf_o[i]
            ties += 1
    need = k - above  # of the hits tied at kth, the `need` lowest ordinals stay
    last_ord = np.partition(scratch_o[:ties], need - 1)[need - 1] if need < ties else np.int32(2**31 - 1)
    kept = 0
    for i in range(m):
        if buf_s[i] > kth or (buf_s[i] == kth and buf_o[i] <= last_ord):
            buf_s[kept] = buf_s[i]
            buf_o[kept] = buf_o[i]
            kept += 1
    return kept


@numba.njit(cache=True, nogil=True)
def _write_best(buf_s, buf_o, m, k, scratch_s, scratch_o, out_s, out_o):
    """The k best of buf[:m] into out, best first; returns how many."""
    n = _keep_best(buf_s, buf_o, m, k, scratch_s, scratch_o)
    by_score = np.argsort(-buf_s[:n])
    for i in range(n):
        out_s[i] = buf_s[by_score[i]]
        out_o[i] = buf_o[by_score[i]]
    # Equal scores come out of the sort in any order: each run of them is put in ordinal order, by an insertion
    # sort over the whole output (a sort call per run costs more than the sort by score).
    for i in range(1, n):
        o = out_o[i]
        j = i
        while j > 0 and out_s[j - 1] == out_s[i] and out_o[j - 1] > o:
            out_o[j] = out_o[j - 1]
            j -= 1
        out_o[j] = o
    return n


@numba.njit(cache=True, nogil=True)
def _gather_from_sample(acc, n_docs, k, theta, filtered, allowed, values, hit_ords):
    """Hits of acc[:n_docs] above a guessed threshold into values / hit_ords, acc untouched: the threshold is
    the score about 2k / SAMPLE_STRIDE of every SAMPLE_STRIDE-th doc beat, so about 2k docs pass. Returns how
    many passed (0 when the sample is too thin to guess)."""
    rank = 2 * k // SAMPLE_STRIDE
    ns = 0
    for d in range(0, n_docs, SAMPLE_STRIDE):
        if acc[d] > theta and (not filtered or allowed[d] != 0):
            hit_ords[ns] = d
            ns += 1
    if rank < 1 or ns < rank:
        return 0
    guess = max(_kth_largest(acc, hit_ords, ns, rank, values) - 1, theta)
    m = 0
    for d in range(n_docs):
        s = acc[d]
        if s > guess and (not filtered or allowed[d] != 0):
            values[m] = s
            hit_ords[m] = d
            m += 1
    return m


@numba.njit(cache=True, nogil=True)
def _exhaustive_top_k(indptr, doc_ords, impacts, q_ptr, rows, weight_scale, floors, k, n_docs, allowed, acc,
                      values, spare, touched, hit_ords, spare_o):
    n_queries = q_ptr.size - 1
    filtered = allowed.size > 0  # a 0/1 mask over doc ordinals (constraints); empty: every doc may rank
    out_ords = np.zeros((n_queries, k), dtype=np.int32)
    out_fixed = np.zeros((n_queries, k), dtype=np.int64)
    counts = np.zeros(n_queries, dtype=np.int64)
    cap = min(8 * k + 64, n_docs)  # hits the ordinal-order scan gathers before only the k best are kept
    for q in range(n_queries):
        n_postings = 0
        for i in range(q_ptr[q], q_ptr[q + 1]):
            if rows[i] >= 0:  # -1: a term this shard lacks (another shard of the call holds it)
                n_postings += indptr[rows[i] + 1] - indptr[rows[i]]
        m = 0
        if n_postings * 4 < n_docs:
            # Few postings: remember touched docs so accumulation, selection and reset cost O(postings).
            # Every contribution is >= 1, so a zero sum means "not touched yet".
            n_touched = 0
            for i in range(q_ptr[q], q_ptr[q + 1]):
                r = rows[i]
                if r < 0:
                    continue
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
                if s >= floors[q] and (not filtered or allowed[d] != 0):
                    values[m] = s
                    hit_ords[m] = d
                    m += 1
        else:
            # Many postings: accumulate, then one scan in ordinal order, where an equal score never beats the
            # k-th best. (Gathering inline here: a helper call per hit costs 3x as much.)
            for i in range(q_ptr[q], q_ptr[q + 1]):
                r = rows[i]
                if r < 0:
                    continue
                w = weight_scale[i]
                for j in range(indptr[r], indptr[r + 1]):
                    acc[doc_ords[j]] += _fixed(impacts[j], w)
            theta = max(floors[q] - 1, np.int64(0))  # a hit needs more than theta
            if k >= HISTOGRAM_K:
                # A large k gathers many hits before theta rises. Guess a theta that about 2k hits pass from
                # every SAMPLE_STRIDE-th doc, gather at it without resetting acc, and keep the result if at
                # least k passed (then the k best all did); else gather again from the true theta.
                m = _gather_from_sample(acc, n_docs, k, theta, filtered, allowed, values, hit_ords)
                if m >= k:
                    acc[:] = 0
                    counts[q] = _write_best(values, hit_ords, m, k, spare, spare_o, out_fixed[q], out_ords[q])
                    continue
                m = 0
            for d in range(n_docs):
                s = acc[d]
                acc[d] = 0
                if s > theta and (not filtered or allowed[d] != 0):
                    values[m] = s
                    hit_ords[m] = d
                    m += 1
                    if m == cap:
                        m = _keep_best(values, hit_ords, m, k, spare, spare_o)
                        theta = values[:m].min()
        counts[q] = _write_best(values, hit_ords, m, k, spare, spare_o, out_fixed[q], out_ords[q])
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


# de Bruijn sequence for the index of the lowest set bit of a uint64 (numba has no count-trailing-zeros).
_DEBRUIJN = np.uint64(0x03F79D71B4CB0A89)
_DEBRUIJN_INDEX = np.array([0, 1, 48, 2, 57, 49, 28, 3, 61, 58, 50, 42, 38, 29, 17, 4, 62, 55, 59, 36, 53, 51, 43,
                            22, 45, 39, 33, 30, 24, 18, 12, 5, 63, 47, 56, 27, 60, 41, 37, 16, 54, 35, 52, 21, 44,
                            32, 23, 11, 46, 26, 40, 15, 34, 20, 31, 10, 25, 14, 19, 9, 13, 8, 7, 6], dtype=np.int64)


@numba.njit(cache=True, nogil=True)
def _in_ordinal_order(docs, n, marks, w_lo, w_hi, out):
    """docs[:n] (distinct ordinals, all in words [w_lo, w_hi) of the bitmap) sorted into out, through the
    bitmap: O(n + (w_hi - w_lo)), far cheaper than a sort."""
    for i in range(n):
        d = docs[i]
        marks[d >> 6] |= np.uint64(1) << np.uint64(d & 63)
    m = 0
    for wi in range(w_lo, w_hi):
        word = marks[wi]
        if word == 0:
            continue
        marks[wi] = 0
        while word != 0:
            low = word & (~word + np.uint64(1))
            out[m] = wi * 64 + _DEBRUIJN_INDEX[(low * _DEBRUIJN) >> np.uint64(58)]
            m += 1
            word ^= low
    return m


@numba.njit(cache=True, nogil=True)
def _kth_largest(acc, docs, n, k, heap):
    """The k-th largest of acc[docs[:n]] (n >= k), through a min-heap of k values: most values lose to its root
    at one comparison, so this costs about n comparisons for a small k (np.partition copies and shuffles)."""
    for i in range(k):
        heap[i] = acc[docs[i]]
    heap[:k].sort()  # a sorted array is a min-heap
    for i in range(k, n):
        _offer(heap, k, acc[docs[i]])
    return heap[0]


@numba.njit(cache=True, nogil=True, inline="always")
def _offer(heap, k, v):
    """Put v into the min-heap heap[:k] when it beats the root: replace the root, sift down."""
    if v <= heap[0]:
        return
    j = 0
    while True:
        c = 2 * j + 1
        if c >= k:
            break
        if c + 1 < k and heap[c + 1] < heap[c]:
            c += 1
        if heap[c] >= v:
            break
        heap[j] = heap[c]
        j = c
    heap[j] = v


@numba.njit(cache=True, nogil=True, inline="always")
def _keep_reaching(acc, cand, nc, need):
    """Keep the candidates whose partial score reaches `need`, in order, branch-free; returns how many."""
    kept = 0
    for c in range(nc):
        d = cand[c]
        cand[kept] = d
        kept += acc[d] >= need
    return kept


@numba.njit(cache=True, nogil=True)
def _impacts(indptr, term_idf, ords, tfs, norm, k1_plus_1, out):
    for row in range(len(indptr) - 1):
        w = term_idf[row]
        for p in range(indptr[row], indptr[row + 1]):
            tf = np.float64(tfs[p])
            out[p] = w * (tf * k1_plus_1 / (tf + norm[ords[p]]))


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


@intrinsic
def _prefetch(typingctx, array, index):
    """Ask the CPU for the cache line of array[index] (llvm.prefetch for writing): the accumulator of a pruned
    query is touched at random, and asking PREFETCH_DISTANCE postings ahead overlaps those misses."""
    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        ary = context.make_array(array_type)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, array_type, ary, [args[1]], wraparound=False,
                                       boundscheck=False)
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0i8")
        builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 1), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()
    return types.void(array, index), codegen


@numba.njit(cache=True, nogil=True)
def _pool_kth(accs, pool_s, pool_d, n_pool, k, heap):
    """The k-th largest current partial score of the pooled docs (n_pool >= k; a min-heap, as _kth_largest)."""
    for i in range(k):
        heap[i] = accs[pool_s[i]][pool_d[i]]
    heap[:k].sort()
    for i in range(k, n_pool):
        _offer(heap, k, accs[pool_s[i]][pool_d[i]])
    return heap[0]


@numba.njit(cache=True, nogil=True)
def _pool_keep(accs, pooled_t, pool_s, pool_d, n_pool, floor, most):
    """Keep the pooled docs whose partial score reaches the floor, at most `most` of them (ties at the floor may
    be more; any k of the pooled docs give a floor); the others may come back later."""
    kept = 0
    for p in range(n_pool):
        s, d = pool_s[p], pool_d[p]
        if accs[s][d] >= floor and kept < most:
            pool_s[kept] = s
            pool_d[kept] = d
            kept += 1
        else:
            pooled_t[s][d >> 6] &= ~(np.uint64(1) << np.uint64(d & 63))
    return kept


@numba.njit(cache=True, nogil=True)
def _pruned_top_k(indptrs, doc_ords_t, impacts_t, term_max_t, tier_rows_t, tier_split_t, tier_max_t, n_docs_t,
                  q_ptr, rows, weight_scale, floors, k, masks, merge_ratio, extend_fraction, pool_capacity, accs,
                  values_t, spares, toucheds, cands, hit_ords_t, spare_os, marks_t, pooled_t):
    """MaxScore over all shards at once (module docstring, "Pruning"). rows[s, i]: the row of term i in shard s
    (-1: none). Returns per shard (ords [S, q, k] int32, fixed scores [S, q, k] int64, counts [S, q]), each row
    best first, for merge_top_k."""
    n_shards = len(indptrs)
    n_queries = q_ptr.size - 1
    out_ords = np.zeros((n_shards, n_queries, k), dtype=np.int32)
    out_fixed = np.zeros((n_shards, n_queries, k), dtype=np.int64)
    counts = np.zeros((n_shards, n_queries), dtype=np.int64)
    width = 1
    for q in range(n_queries):
        width = max(width, 2 * n_shards * (q_ptr[q + 1] - q_ptr[q]))
    l_shard = np.empty(width, np.int64)
    l_lo = np.empty(width, np.int64)
    l_hi = np.empty(width, np.int64)
    l_w = np.empty(width, np.float64)
    l_bound = np.empty(width, np.int64)
    l_key = np.empty(width, np.float64)
    l_deferred = np.zeros(width, np.bool_)
    deferred = np.empty(width, np.int64)
    pre = np.empty(width + 1, np.int64)
    rest = np.zeros(n_shards, np.int64)  # per shard: the bounds of its lists not yet added
    n_touched = np.zeros(n_shards, np.int64)
    capacity = max(pool_capacity, 2 * k)
    pool_s = np.empty(capacity, np.int64)
    pool_d = np.empty(capacity, np.int32)
    heap = np.empty(k, np.int64)
    best = np.empty(n_shards * k, np.int64)
    for q in range(n_queries):
        # The query's lists: per shard, one per term it holds, or two for a term stored in tiers.
        n = 0
        rest[:] = 0
        for s in range(n_shards):
            indptr, tier_rows = indptrs[s], tier_rows_t[s]
            for i in range(q_ptr[q], q_ptr[q + 1]):
                r = rows[s, i]
                if r < 0:
                    continue
                w = weight_scale[i]
                lo, hi = indptr[r], indptr[r + 1]
                t = np.searchsorted(tier_rows, r)
                mid = tier_split_t[s][t] if t < tier_rows.size and tier_rows[t] == r else hi
                for part in range(2):
                    a, b = (lo, mid) if part == 0 else (mid, hi)
                    if b <= a:
                        continue
                    top = term_max_t[s][r] if part == 0 else tier_max_t[s][t]
                    l_shard[n], l_lo[n], l_hi[n], l_w[n] = s, a, b, w
                    l_bound[n] = _fixed(top, w)
                    l_key[n] = -np.float64(l_bound[n]) / (b - a)
                    l_deferred[n] = False
                    rest[s] += l_bound[n]
                    n += 1
        # Essential phase: lists by bound per posting, highest first (they lift the floor and lower the rest
        # bound most per posting). A list is added in full while its shard's rest bound (this list included)
        # reaches the floor: a doc none of them holds could still reach it. Below the floor, no new doc can: the
        # list is added to the docs already touched while the rest bound is still >= extend_fraction x floor
        # (fewer candidates), else deferred to the candidate phase. The floor: the k-th best partial score of
        # the pooled docs (every allowed doc whose partial score reached the floor), which only grows.
        order = np.argsort(l_key[:n])
        floor = max(floors[q], np.int64(1))
        n_pool = 0
        n_touched[:] = 0
        for x in range(n):
            li = order[x]
            s = l_shard[li]
            acc, doc_ords, impacts = accs[s], doc_ords_t[s], impacts_t[s]
            w, lo, hi = l_w[li], l_lo[li], l_hi[li]
            if rest[s] < floor:
                if np.float64(rest[s]) < extend_fraction * np.float64(floor):
                    l_deferred[li] = True
                    continue
                for j in range(lo, hi):
                    if j + PREFETCH_DISTANCE < hi:
                        _prefetch(acc, doc_ords[j + PREFETCH_DISTANCE])
                    d = doc_ords[j]
                    acc[d] += _fixed(impacts[j], w) * (acc[d] != 0)
                rest[s] -= l_bound[li]
                continue
            touched, pooled, mask = toucheds[s], pooled_t[s], masks[s]
            filtered = mask.size > 0
            m = n_touched[s]
            for j in range(lo, hi):
                if j + PREFETCH_DISTANCE < hi:
                    _prefetch(acc, doc_ords[j + PREFETCH_DISTANCE])
                d = doc_ords[j]
                touched[m] = d  # branch-free: whether a doc is new is a coin toss (touched holds n_docs + 1)
                v = acc[d]
                m += v == 0
                v += _fixed(impacts[j], w)
                acc[d] = v
                if v >= floor and (not filtered or mask[d] != 0):
                    bit = np.uint64(1) << np.uint64(d & 63)
                    if pooled[d >> 6] & bit == 0:
                        pooled[d >> 6] |= bit
                        pool_s[n_pool] = s
                        pool_d[n_pool] = d
                        n_pool += 1
                        if n_pool == capacity:
                            floor = max(floor, _pool_kth(accs, pool_s, pool_d, n_pool, k, heap))
                            n_pool = _pool_keep(accs, pooled_t, pool_s, pool_d, n_pool, floor, capacity // 2)
            n_touched[s] = m
            rest[s] -= l_bound[li]
            if n_pool >= k:
                floor = max(floor, _pool_kth(accs, pool_s, pool_d, n_pool, k, heap))
                n_pool = _pool_keep(accs, pooled_t, pool_s, pool_d, n_pool, floor, capacity // 2)
        for p in range(n_pool):
            pooled_t[pool_s[p]][pool_d[p] >> 6] = 0
        # Candidate phase, shard by shard: the touched docs the deferred lists may lift to the floor.
        n_best = 0
        for s in range(n_shards):
            acc, doc_ords, impacts, mask = accs[s], doc_ords_t[s], impacts_t[s], masks[s]
            touched, cand, values, hit_ords = toucheds[s], cands[s], values_t[s], hit_ords_t[s]
            filtered = mask.size > 0
            # Deferred lists of this shard by bound ascending; pre[e]: the bounds of the first e.
            nd = 0
            for x in range(n):
                li = order[x]
                if l_shard[li] == s and l_deferred[li]:
                    j = nd
                    while j > 0 and l_bound[deferred[j - 1]] > l_bound[li]:
                        deferred[j] = deferred[j - 1]
                        j -= 1
                    deferred[j] = li
                    nd += 1
            pre[0] = 0
            for e in range(nd):
                pre[e + 1] = pre[e] + l_bound[deferred[e]]
            need = floor - pre[nd]
            nc = 0
            for t in range(n_touched[s]):
                d = touched[t]
                cand[nc] = d
                nc += (acc[d] >= need) & (not filtered or mask[d] != 0)
            # Partial scores only grow: the k-th best of them is a floor too.
            if nc > k:
                raised = _kth_largest(acc, cand, nc, k, spares[s])
                if raised > floor:
                    floor = raised
                    nc = _keep_reaching(acc, cand, nc, floor - pre[nd])
            if nd > 0 and nc > 0:
                nc = _in_ordinal_order(cand, nc, marks_t[s], 0, ((n_docs_t[s] - 1) >> 6) + 1, cand)
            # Each deferred list, largest bound first, adds to the candidates (a galloping merge when they are
            # few for its list, else a scan where only touched docs take contributions); then the candidates the
            # lists left cannot lift to the floor are dropped.
            for e in range(nd - 1, -1, -1):
                if nc == 0:
                    break
                li = deferred[e]
                w, lo, hi = l_w[li], l_lo[li], l_hi[li]
                if hi - lo > merge_ratio * nc:
                    p = lo
                    for c in range(nc):
                        d = cand[c]
                        p = _gallop(doc_ords, p, hi, d)
                        if p >= hi:
                            break
                        if doc_ords[p] == d:
                            acc[d] += _fixed(impacts[p], w)
                            p += 1
                else:
                    for j in range(lo, hi):
                        d = doc_ords[j]
                        acc[d] += _fixed(impacts[j], w) * (acc[d] != 0)
                nc = _keep_reaching(acc, cand, nc, floor - pre[e])
            m = 0
            for c in range(nc):
                d = cand[c]
                if acc[d] >= floor:
                    values[m] = acc[d]
                    hit_ords[m] = d
                    m += 1
            for t in range(n_touched[s]):
                acc[touched[t]] = 0
            got = _write_best(values, hit_ords, m, k, spares[s], spare_os[s], out_fixed[s, q], out_ords[s, q])
            counts[s, q] = got
            # The hits so far are exact scores: the k-th best of them is a floor for the shards after.
            best[n_best : n_best + got] = out_fixed[s, q, :got]
            n_best += got
            if n_best >= k:
                floor = max(floor, np.partition(best[:n_best], n_best - k)[n_best - k])
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
