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

Pruning (`top_k_many`): MaxScore, term at a time, over ranges of doc ordinals. A hit needs at least the floor:
another shard's k-th best (passed in: the searcher scores its shards in turn), or, without one, the k-th best
of the ranges already scored (a first range of 1/FIRST_RANGE_PARTS of the docs, then ranges four times as
large). In a range, a term's bound is its weight times its largest impact (`term_max`, stored with the
shard); terms go by bound, and the smallest ones whose bounds add up to less than the floor are
non-essential: a doc none of the others holds cannot reach the floor. The essential terms are scored in
full into the accumulator; the docs they reach whose partial score plus the non-essential bounds can reach
the floor are the candidates, and the k-th best partial score raises the floor (partial scores only grow).
Each non-essential term, largest bound first, then adds to the candidates only (a galloping merge in
ordinal order when they are few for its list, else a scan), and the candidates the terms left cannot lift
to the floor are dropped. Must / exclude terms and skipped documents are a doc mask, an exact filter applied
before any document counts towards the floor. The per-doc steps (is a doc new, is it a candidate, does it stay
one, does a non-essential posting land on one) are branch-free: their outcomes are coin tosses, and mispredicted
branches had cost more than the work (on 1M documents, without them: plain k=10 1.00 against 0.82 ms a query,
expanded 2.67 against 1.81 ms; bench/searcher_scale.py's shards, alternating runs).

Selection: the exhaustive scorer gathers hits above a threshold that rises as it goes; for k >=
HISTOGRAM_K it first guesses the threshold from every SAMPLE_STRIDE-th doc (kept when at least k hits pass
it, so none of the k best is lost), and drops hits below the histogram bucket of the k-th best before the
final partial sort, because the gathering costs more than the scoring at k = 1000.

Which scorer (`scorer="auto"`): pruning pays when a few terms carry most of the bound, k is small and a floor comes
early. On 1M synthetic documents (bench/results/searcher_scale_1m.json) plain queries (17 terms) at k=10 run
1.56-1.85x as fast pruned as exhaustive (two runs); queries with 30-60 pseudo-relevance-feedback expansion terms of
similar bounds 1.01-1.23x at k=10 (0.78x at 200k), and with k in the hundreds pruning runs slower: many of their
postings are essential, and handling a candidate costs several times as much as scoring a posting. On a small shard
the fixed work per query outweighs scoring a few thousand postings (bench/query_speed.py). The smaller k, the sooner
the floor is high: on 200k synthetic documents (4 shards of 50k, plain queries of ~30k postings per shard) auto ran
2,606 q/s at k=10 with pruning from 65,536 postings, 3,031 from 16,384 and 3,184 from 8,192, while at k=64 pruning
those queries cost (2,297 against 1,934 q/s); on BEIR scifact (5k docs, one shard) 8,192 cost 5% at k=10 and 16,384
nothing. So "auto" prunes queries of at most PRUNE_MAX_TERMS terms with k <= PRUNE_MAX_K whose terms hold at least
PRUNE_MIN_POSTINGS postings in the shard (PRUNE_MIN_POSTINGS_SMALL_K for k <= SMALL_K), and scores the others
exhaustively; "pruned" and "exhaustive" force one (the tests compare them). Both use the floors of other shards when
selecting.
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
FIRST_RANGE_PARTS = 16  # without another shard's floor, the pruned scorer first scores this part of the docs
FIRST_RANGE_MIN = 4096  # ... but at least this many
HISTOGRAM_K = 128  # from this k, selection cuts by a histogram and guesses its threshold from a sample
SAMPLE_STRIDE = 16  # ... of every SAMPLE_STRIDE-th doc
PRUNE_MAX_TERMS = 32  # "auto" prunes queries with at most this many terms, ...
PRUNE_MAX_K = 64  # ... k up to this, ...
PRUNE_MIN_POSTINGS = 65_536  # ... and at least this many postings in the shard; see above
SMALL_K = 16  # ... or, for k up to this, ...
PRUNE_MIN_POSTINGS_SMALL_K = 16_384  # ... at least this many
MERGE_RATIO = 8  # a non-essential term is merged into the candidates when its list is this many times longer


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
            least = PRUNE_MIN_POSTINGS_SMALL_K if k <= SMALL_K else PRUNE_MIN_POSTINGS
            prune = (np.diff(q_ptr) <= PRUNE_MAX_TERMS) & (k <= PRUNE_MAX_K) & (postings >= least)
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
                    acc, values, spare, touched, _, hit_ords, spare_o, _ = work
                    out = _exhaustive_top_k(self.indptr, self.doc_ords, self.impacts, sub_ptr, rows[picked],
                                            weight_scale[picked], fixed_floors[group], k, self.num_docs, mask,
                                            acc, values, spare, touched, hit_ords, spare_o)
                else:
                    acc, values, spare, touched, cand, hit_ords, spare_o, marks = work
                    out = _pruned_top_k(self.indptr, self.doc_ords, self.impacts, self.term_max, self.num_docs,
                                        sub_ptr, rows[picked], weight_scale[picked], fixed_floors[group], k, mask,
                                        max(self.num_docs // FIRST_RANGE_PARTS, FIRST_RANGE_MIN), MERGE_RATIO,
                                        acc, values, spare, touched, cand, hit_ords, spare_o, marks)
            ords[group], fixed[group], counts[group] = out
        return ords, fixed * (1.0 / _FIXED_SCALE), counts

    def _work_arrays(self) -> tuple[np.ndarray, ...]:
        """Per-doc arrays the kernels reuse from query to query instead of allocating and zeroing them each
        time: acc (left zeroed), values, spare (int64); touched, cand, hit_ords, spare_o (int32); marks (a
        bitmap, left zeroed). Made on first use: a shard that is only loaded costs nothing."""
        if self._work is None:
            n = self.num_docs
            self._work = (np.zeros(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64),
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
        v = acc[docs[i]]
        if v <= heap[0]:
            continue
        # Replace the root, sift down.
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
    return heap[0]


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
def _range_candidates(indptr, doc_ords, impacts, term_max, rows, weight_scale, t0, n, d_lo, d_hi, n_docs, floor, k,
                      allowed, merge_ratio, lo_of, hi_of, bound, order, pre, acc, touched, cand, spare, marks):
    """MaxScore over the docs of ordinals [d_lo, d_hi) for one query (its terms rows[t0:t0 + n]). Returns (nc,
    floor, n_touched, dense): cand[:nc] holds every doc of the range that may score at least the returned
    (raised) floor, each with its exact score in acc; the caller resets acc, over touched[:n_touched] or,
    when dense, over the whole range."""
    filtered = allowed.size > 0
    # Each term's postings in the range, and its bound; terms by bound ascending (insertion sort: tens of terms).
    m = 0
    for e in range(n):
        i = t0 + e
        lo, hi = indptr[rows[i]], indptr[rows[i] + 1]
        if d_lo > 0:
            lo = lo + np.searchsorted(doc_ords[lo:hi], d_lo)
        if d_hi < n_docs and hi > lo:
            hi = lo + np.searchsorted(doc_ords[lo:hi], d_hi)
        if hi <= lo:
            continue
        b = _fixed(term_max[rows[i]], weight_scale[i])
        j = m
        while j > 0 and bound[j - 1] > b:
            bound[j] = bound[j - 1]
            order[j] = order[j - 1]
            lo_of[j] = lo_of[j - 1]
            hi_of[j] = hi_of[j - 1]
            j -= 1
        bound[j] = b
        order[j] = i
        lo_of[j] = lo
        hi_of[j] = hi
        m += 1
    pre[0] = 0
    for e in range(m):
        pre[e + 1] = pre[e] + bound[e]
    # Terms [0, ne) are non-essential: together they cannot lift a doc none of the others holds to the floor.
    ne = 0
    while ne < m and pre[ne + 1] < floor:
        ne += 1
    essential_postings = 0
    for e in range(ne, m):
        essential_postings += hi_of[e] - lo_of[e]
    dense = essential_postings * 4 >= d_hi - d_lo
    n_touched = 0
    for e in range(ne, m):
        w = weight_scale[order[e]]
        if dense:
            for j in range(lo_of[e], hi_of[e]):
                acc[doc_ords[j]] += _fixed(impacts[j], w)
        else:
            # Branch-free: whether a doc is new is a coin toss. Writing touched[n_touched] before knowing stays in
            # bounds: sparse means fewer postings than a quarter of the range.
            for j in range(lo_of[e], hi_of[e]):
                d = doc_ords[j]
                touched[n_touched] = d
                n_touched += acc[d] == 0
                acc[d] += _fixed(impacts[j], w)
    # Candidates: docs the essential terms reach that the others may lift to the floor (dense: in ordinal order).
    nc = 0
    need = floor - pre[ne]
    if dense:
        for d in range(d_lo, d_hi):
            cand[nc] = d
            nc += (acc[d] >= need) & (not filtered or allowed[d] != 0)
    else:
        for t in range(n_touched):
            d = touched[t]
            cand[nc] = d
            nc += (acc[d] >= need) & (not filtered or allowed[d] != 0)
    # Partial scores only grow: the k-th best of them is a floor too, and a higher floor drops candidates now.
    if nc > k:
        raised = _kth_largest(acc, cand, nc, k, spare)
        if raised > floor:
            floor = raised
            need = floor - pre[ne]
            nc = _keep_reaching(acc, cand, nc, need)
    if not dense:
        nc = _in_ordinal_order(cand, nc, marks, d_lo >> 6, ((d_hi - 1) >> 6) + 1, cand)
    # Each non-essential term, largest bound first, adds to the candidates (a galloping merge when they are few
    # for its list, else a scan where only touched docs take contributions); then the candidates the terms
    # left cannot lift to the floor are dropped.
    for e in range(ne - 1, -1, -1):
        if nc == 0:
            break
        w = weight_scale[order[e]]
        lo, hi = lo_of[e], hi_of[e]
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
    return nc, floor, n_touched, dense


@numba.njit(cache=True, nogil=True)
def _pruned_top_k(indptr, doc_ords, impacts, term_max, n_docs, q_ptr, rows, weight_scale, floors, k, allowed,
                  first_range, merge_ratio, acc, values, spare, touched, cand, hit_ords, spare_o, marks):
    n_queries = q_ptr.size - 1
    out_ords = np.zeros((n_queries, k), dtype=np.int32)
    out_fixed = np.zeros((n_queries, k), dtype=np.int64)
    counts = np.zeros(n_queries, dtype=np.int64)
    width = 1
    for q in range(n_queries):
        width = max(width, q_ptr[q + 1] - q_ptr[q])
    lo_of = np.empty(width, dtype=np.int64)
    hi_of = np.empty(width, dtype=np.int64)
    bound = np.empty(width, dtype=np.int64)
    order = np.empty(width, dtype=np.int64)
    pre = np.empty(width + 1, dtype=np.int64)
    for q in range(n_queries):
        t0 = q_ptr[q]
        n = q_ptr[q + 1] - t0
        # A hit must score at least the floor: another shard holds k hits that good (a tie may still win on
        # doc id). Without one, a first range of docs is scored to set it, and each range raises it.
        floor = max(floors[q], np.int64(1))
        d_lo = 0
        d_hi = n_docs if floors[q] > 0 else min(n_docs, max(first_range, 1))
        m = 0
        while d_lo < n_docs:
            nc, floor, n_touched, dense = _range_candidates(
                indptr, doc_ords, impacts, term_max, rows, weight_scale, t0, n, d_lo, d_hi, n_docs, floor, k,
                allowed, merge_ratio, lo_of, hi_of, bound, order, pre, acc, touched, cand, spare, marks)
            for c in range(nc):
                d = cand[c]
                if acc[d] >= floor:
                    values[m] = acc[d]
                    hit_ords[m] = d
                    m += 1
            if dense:
                acc[d_lo:d_hi] = 0
            else:
                for t in range(n_touched):
                    acc[touched[t]] = 0
            if m > k:
                m = _keep_best(values, hit_ords, m, k, spare, spare_o)
            if m == k:
                floor = max(floor, values[:m].min())
            d_lo = d_hi
            d_hi = min(n_docs, d_hi * 4)
        counts[q] = _write_best(values, hit_ords, m, k, spare, spare_o, out_fixed[q], out_ords[q])
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
