"""Lucene BM25 maths and the in-memory shard scorer.

A shard is a CSC-like matrix over (term row, doc ordinal): `indptr`/`doc_ords` locate a term's postings
and `impacts` holds each posting's precomputed contribution idf * tf*(k1+1)/(tf + k1*(1-b+b*dl/avgdl))
with *corpus-wide* N, avgdl and df, so a document's score does not depend on which shard holds it.
A query is a set of (term id, weight) pairs.

Scores are fixed-point sums. Each contribution w * impact is the product of two float32 values, exact in
float64; it is rounded up to a multiple of 2^-FIXED_POINT_BITS and the contributions are added as int64.
Integer addition does not depend on the order of its terms, so every evaluation order (all postings term
at a time, or a per-shard order of terms with some merged into candidates later) gives the same bits, and
upper bounds are exact integers: pruning needs no float slack to be safe. A score is returned as float64
(the integer times 2^-32, exact below MAX_SCORE); its resolution, 2.3e-10, is far finer than float32's.

Top-k uses a total order, (score desc, doc ordinal asc). Doc ordinals follow doc-id order inside a shard, so
merging per-shard top-k by (score desc, doc id asc) equals the single-shard result exactly.

Pruning (`top_k_many`): MaxScore, term at a time. A term's upper bound is its weight times its largest impact
(`term_max`, stored with the shard). Terms are taken by bound, largest first. Phase A scores them in full
into a per-shard accumulator while the bounds of the terms left add up to at least the floor, the score a
hit needs: past that point a document none of the phase-A terms holds cannot reach the top k. Phase B merges
each remaining term into the candidates (documents phase A touched that can still reach the floor), in
ordinal order, stepping over blocks of postings no candidate falls in, and drops after each term the
candidates the terms left cannot lift to the floor. The floor comes from another shard's k-th best (passed
in: the searcher scores its shards in turn), from the exact scores of the k most promising documents once
the first terms are in (k <= SEED_K), or from the k-th best partial score of recently touched documents
(partial scores only grow). Must / exclude terms and skipped documents are a doc mask, an exact filter
applied before any document counts towards the floor.

Which scorer (`scorer="auto"`): pruning pays when a few terms carry most of the bound and k is small. Measured
on 1M synthetic documents (bench/results/searcher_scale_1m.json): plain queries (17 terms) at k=10 run 1.09x
as fast pruned as exhaustive; queries with 30-60 pseudo-relevance-feedback expansion terms of similar bounds,
or k in the hundreds, 0.3-0.8x, because no early switch to phase B is possible and the candidates are too
dense to step over postings. On a small shard pruning costs more than it saves: its fixed work per query
(ordering the terms, seeding the floor) outweighs scoring a few thousand postings, and on scifact (5,183
documents, a median of about 4,000 postings per query) the pruned scorer ran several times slower than the exhaustive
one (bench/query_speed.py). So "auto" prunes queries of at most PRUNE_MAX_TERMS terms with
k <= SEED_K whose terms hold at least PRUNE_MIN_POSTINGS postings in the shard, and scores the others
exhaustively; "pruned" and "exhaustive" force one (the tests compare them). Both use the floors of other
shards when selecting.
"""

from __future__ import annotations

import math
import threading
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
SKIP_BLOCK = 128  # postings a phase-B merge steps over at once when no candidate falls among them
SEED_K = 64  # up to this k, the pruned scorer scores its k most promising docs exactly to set its floor
PRUNE_MAX_TERMS = 32  # "auto" prunes queries with at most this many terms (and k <= SEED_K); see above
PRUNE_MIN_POSTINGS = 32_768  # ... and at least this many postings in the shard; see above
MERGE_RATIO = 8  # phase B merges a term into the candidates when its list is this many times longer, else scans


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
    """One doc shard as plain arrays (in memory, or memory-mapped from sira.pipelines.shard_cache)."""

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
    ):
        """`doc_ids`: anything pyarrow takes as strings (list, numpy object array, Arrow array), sorted; doc
        ordinal i is doc_ids[i]. `impacts`: > 0, as BM25 contributions are. `term_max`:
        term_maxima(indptr, impacts), computed here when not given."""
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
        term_max = term_maxima(self.indptr, self.impacts) if term_max is None else \
            np.asarray(term_max, dtype=IMPACT_DTYPE)
        if len(term_max) != len(self.term_ids):
            raise ValueError(f"shard {shard}: {len(term_max)} term maxima for {len(self.term_ids)} terms")
        self.term_max = _read_only(term_max)
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
                "impacts": self.impacts, "term_max": self.term_max}

    @classmethod
    def from_arrays(cls, shard: int, arrays: dict[str, np.ndarray]) -> "ShardIndex":
        """The inverse of arrays(), without copying them."""
        return cls(shard, doc_ids_from_buffers(arrays["doc_id_offsets"], arrays["doc_id_data"]), arrays["doc_lens"],
                   arrays["term_ids"], arrays["indptr"], arrays["doc_ords"], arrays["impacts"], arrays["term_max"])

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
        if k <= 0:
            raise ValueError(f"k must be positive, got {k}")
        if scorer not in ("auto", "pruned", "exhaustive"):
            raise ValueError(f"scorer must be auto, pruned or exhaustive, got {scorer!r}")
        k = min(k, max(self.num_docs, 1))
        term_ptr, all_ids = _ragged([q.term_ids for q in queries])
        all_weights = np.concatenate([q.weights for q in queries] + [np.empty(0, IMPACT_DTYPE)])
        query_of_term = np.repeat(np.arange(len(queries)), np.diff(term_ptr))
        rows = self.rows_of(all_ids)
        keep = rows >= 0
        q_ptr = _kept_ptr(term_ptr, keep)
        rows, weights = rows[keep], all_weights[keep].astype(np.float64)
        heaviest = np.bincount(query_of_term[keep], weights=weights, minlength=len(queries))
        if np.any(heaviest * self.max_impact >= MAX_SCORE / 2):
            raise ValueError(f"query weights too large: scores would exceed {MAX_SCORE / 2:g}")
        weight_scale = weights * _FIXED_SCALE
        fixed_floors = np.zeros(len(queries), dtype=np.int64) if floors is None else \
            np.round(np.asarray(floors, dtype=np.float64) * _FIXED_SCALE).astype(np.int64)
        constraints = constraints or [((), ())] * len(queries)
        skip_ords = skip_ords or [None] * len(queries)
        masks = [self.constraint_mask(must, exclude, skip) for (must, exclude), skip in zip(constraints, skip_ords)]
        if scorer == "auto":
            postings = np.bincount(query_of_term[keep], weights=self.indptr[rows + 1] - self.indptr[rows],
                                   minlength=len(queries))
            prune = (np.diff(q_ptr) <= PRUNE_MAX_TERMS) & (k <= SEED_K) & (postings >= PRUNE_MIN_POSTINGS)
        else:
            prune = np.full(len(queries), scorer == "pruned")
        ords = np.zeros((len(queries), k), dtype=np.int32)
        fixed = np.zeros((len(queries), k), dtype=np.int64)
        counts = np.zeros(len(queries), dtype=np.int64)
        # Unconstrained queries share one compiled call per scorer; a constrained one is scored alone under its
        # doc mask.
        constrained = np.fromiter((m is not None for m in masks), dtype=bool, count=len(masks))
        groups = [np.flatnonzero(~constrained & prune), np.flatnonzero(~constrained & ~prune)] + \
            [np.array([i]) for i in np.flatnonzero(constrained)]
        for group in (g for g in groups if len(g)):
            # The group's query terms, in order: a ragged slice of the batch (numpy, not a Python loop per query).
            lengths = q_ptr[group + 1] - q_ptr[group]
            sub_ptr = np.zeros(len(group) + 1, dtype=np.int64)
            np.cumsum(lengths, out=sub_ptr[1:])
            picked = np.repeat(q_ptr[group] - sub_ptr[:-1], lengths) + np.arange(sub_ptr[-1], dtype=np.int64)
            mask = masks[group[0]] if masks[group[0]] is not None else np.empty(0, np.uint8)
            with self._lock:  # the kernels share this shard's work arrays
                work = self._work_arrays()
                if not prune[group[0]]:
                    acc, _, values, spare, touched, _, hit_ords, spare_o, _ = work
                    out = _exhaustive_top_k(self.indptr, self.doc_ords, self.impacts, sub_ptr, rows[picked],
                                            weight_scale[picked], fixed_floors[group], k, self.num_docs, mask,
                                            acc, values, spare, touched, hit_ords, spare_o)
                else:
                    out = _pruned_top_k(self.indptr, self.doc_ords, self.impacts, self.term_max, self.num_docs,
                                        sub_ptr, rows[picked], weight_scale[picked], fixed_floors[group], k, mask,
                                        SKIP_BLOCK, SEED_K, MERGE_RATIO, *work)
            ords[group], fixed[group], counts[group] = out
        return ords, fixed * (1.0 / _FIXED_SCALE), counts

    def _work_arrays(self) -> tuple[np.ndarray, ...]:
        """Per-doc arrays the kernels reuse from query to query instead of allocating and zeroing them each
        time: acc, gains (left zeroed), values, spare (int64); touched, cand, cand_ords, spare_o (int32);
        marks (a bitmap, left zeroed). Made on first use: a shard that is only loaded costs nothing."""
        if self._work is None:
            n = self.num_docs
            self._work = (np.zeros(n, np.int64), np.zeros(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64),
                          np.empty(n, np.int32), np.empty(n, np.int32), np.empty(n, np.int32), np.empty(n, np.int32),
                          np.zeros(n // 64 + 1, np.uint64))
        return self._work

    def docs_with_term(self, term_id_: int) -> np.ndarray:
        """Doc ordinals holding a term (sorted)."""
        row = self.rows_of(np.array([term_id_], dtype=np.int64))[0]
        return self.doc_ords[self.indptr[row] : self.indptr[row + 1]] if row >= 0 else np.empty(0, np.int32)

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


@numba.njit(cache=True, nogil=True)
def _keep_best(buf_s, buf_o, m, k, scratch_s, scratch_o):
    """Keep the k best of the m hits in buf[:m] (score desc, ordinal asc; given in any order) in buf[:k].
    Returns how many are kept; when that is k, buf_s[:k].min() is the k-th best score."""
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
    # Equal scores come out of the sort in any order: each run of them is put in ordinal order.
    start = 0
    for i in range(1, n + 1):
        if i == n or out_s[i] != out_s[start]:
            if i - start > 1:
                out_o[start:i].sort()
            start = i
    return n


@numba.njit(cache=True, nogil=True)
def _exhaustive_top_k(indptr, doc_ords, impacts, q_ptr, rows, weight_scale, floors, k, n_docs, allowed, acc,
                      values, spare, touched, hit_ords, spare_o):
    n_queries = q_ptr.size - 1
    filtered = allowed.size > 0  # a 0/1 mask over doc ordinals (constraints); empty: every doc may rank
    out_ords = np.zeros((n_queries, k), dtype=np.int32)
    out_fixed = np.zeros((n_queries, k), dtype=np.int64)
    counts = np.zeros(n_queries, dtype=np.int64)
    cap = min(2 * k + 64, n_docs)  # hits the ordinal-order scan gathers before only the k best are kept
    for q in range(n_queries):
        n_postings = 0
        for i in range(q_ptr[q], q_ptr[q + 1]):
            n_postings += indptr[rows[i] + 1] - indptr[rows[i]]
        m = 0
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
                if s >= floors[q] and (not filtered or allowed[d] != 0):
                    values[m] = s
                    hit_ords[m] = d
                    m += 1
        else:
            # Many postings: accumulate, then one scan in ordinal order, where an equal score never beats the
            # k-th best. (Gathering inline here: a helper call per hit costs 3x as much.)
            for i in range(q_ptr[q], q_ptr[q + 1]):
                r = rows[i]
                w = weight_scale[i]
                for j in range(indptr[r], indptr[r + 1]):
                    acc[doc_ords[j]] += _fixed(impacts[j], w)
            theta = max(floors[q] - 1, np.int64(0))  # a hit needs more than theta
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
def _in_ordinal_order(docs, n, marks, out):
    """docs[:n] (distinct ordinals) sorted into out, through a bitmap over the shard: O(n + n_docs / 64)."""
    for i in range(n):
        d = docs[i]
        marks[d >> 6] |= np.uint64(1) << np.uint64(d & 63)
    m = 0
    for wi in range(marks.size):
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
def _merge_gains(doc_ords, impacts, p, hi, w, docs, nd, gains, block):
    """gains[c] += the contribution of postings [p, hi) (one term, weight scale w) to docs[c], for docs[:nd]
    in ordinal order: one walk, stepping over the blocks of `block` postings that end before the next doc."""
    c = 0
    while c < nd and p < hi:
        d = docs[c]
        if doc_ords[p] < d:
            end = min((p // block + 1) * block, hi)
            while end < hi and doc_ords[end - 1] < d:
                p = end
                end = min(end + block, hi)
            p = _gallop(doc_ords, p, end, d)
            if p >= hi:
                break
        if doc_ords[p] == d:
            gains[c] += _fixed(impacts[p], w)
            p += 1
        c += 1


@numba.njit(cache=True, nogil=True)
def _estimate_floor(doc_ords, impacts, indptr, rows, weight_scale, order, done, n, acc, touched, n_touched,
                    allowed, k, seed_k, block, values, docs, gains):
    """A score k allowed docs are known to reach: the k-th best partial score (partial scores only grow);
    for k <= seed_k, the k-th of those docs' exact scores (terms order[done:n] merged in), much closer to the
    final k-th best. 0 when fewer than k allowed docs are touched."""
    filtered = allowed.size > 0
    m = 0
    for t in range(n_touched):
        d = touched[t]
        if not filtered or allowed[d] != 0:
            values[m] = acc[d]
            m += 1
    if m < k:
        return np.int64(0)
    kth = np.partition(values[:m], m - k)[m - k]
    if k > seed_k:
        return kth
    nd = 0
    for t in range(n_touched):
        d = touched[t]
        if nd < k and acc[d] >= kth and (not filtered or allowed[d] != 0):
            docs[nd] = d
            nd += 1
    docs[:nd].sort()
    for e in range(done, n):
        _merge_gains(doc_ords, impacts, indptr[rows[order[e]]], indptr[rows[order[e]] + 1], weight_scale[order[e]],
                     docs, nd, gains, block)
    lowest = np.int64(2**62)
    for c in range(nd):
        lowest = min(lowest, acc[docs[c]] + gains[c])
        gains[c] = 0
    return lowest


@numba.njit(cache=True, nogil=True)
def _pruned_top_k(indptr, doc_ords, impacts, term_max, n_docs, q_ptr, rows, weight_scale, floors, k, allowed,
                  block, seed_k, merge_ratio, acc, gains, values, spare, touched, cand, cand_ords, spare_o, marks):
    n_queries = q_ptr.size - 1
    filtered = allowed.size > 0  # a 0/1 mask over doc ordinals (constraints); empty: every doc may rank
    out_ords = np.zeros((n_queries, k), dtype=np.int32)
    out_fixed = np.zeros((n_queries, k), dtype=np.int64)
    counts = np.zeros(n_queries, dtype=np.int64)
    width = 1
    for q in range(n_queries):
        width = max(width, q_ptr[q + 1] - q_ptr[q])
    bound = np.empty(width, dtype=np.int64)  # per term: weight x its largest impact
    order = np.empty(width, dtype=np.int64)  # term indexes (into rows), by bound descending
    rest = np.empty(width + 1, dtype=np.int64)  # rest[i]: sum of the bounds of order[i:]
    for q in range(n_queries):
        t0 = q_ptr[q]
        n = q_ptr[q + 1] - t0
        if n == 0:
            continue
        for e in range(n):
            i = t0 + e
            bound[e] = _fixed(term_max[rows[i]], weight_scale[i])
            j = e  # insertion sort, bound descending (a query has tens of terms)
            while j > 0 and bound[order[j - 1] - t0] < bound[e]:
                order[j] = order[j - 1]
                j -= 1
            order[j] = i
        rest[n] = 0
        for e in range(n - 1, -1, -1):
            rest[e] = rest[e + 1] + bound[order[e] - t0]
        # A hit must score at least `floor`: another shard already holds k hits that good (ties may still win
        # on doc id), or k docs of this one are known to score that much.
        floor = max(floors[q], np.int64(1))
        # Phase A: terms in full, while a doc none of them holds could still reach the floor.
        n_touched = 0
        done = 0
        processed = np.int64(0)
        estimated_at = np.int64(-1)
        while done < n and rest[done] >= floor:
            i = order[done]
            lo, hi = indptr[rows[i]], indptr[rows[i] + 1]
            # Before a list longer than what is touched so far, raise the floor (cost O(touched), so at most
            # the cost of the list it may save; and at most O(log) times per query).
            if n_touched >= k and hi - lo >= n_touched and processed > 2 * estimated_at:
                estimated_at = processed
                floor = max(floor, _estimate_floor(doc_ords, impacts, indptr, rows, weight_scale, order, done, n,
                                                   acc, touched, n_touched, allowed, k, seed_k, block, values,
                                                   cand, gains))
                if rest[done] < floor:
                    break
            w = weight_scale[i]
            for j in range(lo, hi):
                d = doc_ords[j]
                if acc[d] == 0:
                    touched[n_touched] = d
                    n_touched += 1
                acc[d] += _fixed(impacts[j], w)
            processed += hi - lo
            done += 1
        # Candidates: touched docs that may still reach the floor.
        nc = 0
        for t in range(n_touched):
            d = touched[t]
            if acc[d] + rest[done] >= floor and (not filtered or allowed[d] != 0):
                cand[nc] = d
                nc += 1
        # Phase B: each remaining term adds to the candidates: by a merge in ordinal order that steps over blocks
        # of postings no candidate falls in when the candidates are few for the list, else by one scan of the
        # list (only docs phase A touched take contributions; the dead among them are harmless). Then the
        # candidates the terms left cannot lift to the floor are dropped.
        in_order = False
        for step in range(done, n):
            i = order[step]
            w = weight_scale[i]
            lo, hi = indptr[rows[i]], indptr[rows[i] + 1]
            if hi - lo > merge_ratio * nc:
                if not in_order:
                    nc = _in_ordinal_order(cand, nc, marks, cand)
                    in_order = True
                _merge_gains(doc_ords, impacts, lo, hi, w, cand, nc, gains, block)
                for c in range(nc):
                    acc[cand[c]] += gains[c]
                    gains[c] = 0
            else:
                for j in range(lo, hi):
                    d = doc_ords[j]
                    if acc[d] != 0:
                        acc[d] += _fixed(impacts[j], w)
            kept = 0
            for c in range(nc):
                d = cand[c]
                if acc[d] + rest[step + 1] >= floor:
                    cand[kept] = d
                    kept += 1
            nc = kept
        for c in range(nc):
            values[c] = acc[cand[c]]
            cand_ords[c] = cand[c]
        counts[q] = _write_best(values, cand_ords, nc, k, spare, spare_o, out_fixed[q], out_ords[q])
        for t in range(n_touched):
            acc[touched[t]] = 0
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
