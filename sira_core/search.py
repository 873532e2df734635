"""The searcher: weighted query parts -> one BM25 call over all shards -> merged top-k, as columns.

    score(d) = sum over parts p of  weight_p * BM25(terms_p, d)

Each part's terms keep their query term frequency (a term said twice counts twice), so
`[QueryPart(original, 1.0), QueryPart(expansion, w)]` is `BM25(q_orig, d) + w * BM25(q_exp, d)`.

Results are columns end to end (`Ranking`: scores, shard, doc ordinal; doc ids read from the shards' Arrow
arrays only when asked for); `Hit` objects are made only for hits that are printed or explained.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa

from sira.core.analysis import Analyzer
from sira.core.bm25 import (IMPACT_DTYPE, CorpusStats, ShardIndex, WeightedQuery, as_doc_id_array, doc_id_buffers,
                             merge_top_k, top_k_shards)
from sira.core.defaults import SEARCH_K
from sira.core.hashing import term_id


@dataclass(frozen=True)
class QueryPart:
    """Analysed terms (with repetition) and the weight of this part of the query."""

    terms: tuple[str, ...]
    weight: float = 1.0
    name: str = "original"


@dataclass(slots=True)
class Hit:
    doc_id: str
    score: float
    shard: int
    doc_ord: int
    contributions: dict[str, float] | None = None  # filled by explain


def compile_query(parts: Sequence[QueryPart]) -> WeightedQuery:
    """Sum each term's weight over parts: weight_p x (count of the term in part p)."""
    weights: dict[str, float] = {}
    for part in parts:
        if part.weight <= 0:
            raise ValueError(f"query part {part.name!r} has weight {part.weight}; weights must be > 0")
        for t, n in Counter(part.terms).items():
            weights[t] = weights.get(t, 0.0) + part.weight * n
    terms = tuple(weights)
    return WeightedQuery(
        terms=terms,
        term_ids=np.array([term_id(t) for t in terms], dtype=np.int64),
        weights=np.array([weights[t] for t in terms], dtype=IMPACT_DTYPE),
    )


Query = str | Sequence[QueryPart] | WeightedQuery


class Ranking:
    """One query's hits, best first, as columns: `scores` (float64), `shard_pos` (index of the hit's shard in
    the searcher) and `ords` (its doc ordinal there)."""

    def __init__(self, scores: np.ndarray, shard_pos: np.ndarray, ords: np.ndarray, shards: Sequence[ShardIndex]):
        self.scores = scores
        self.shard_pos = shard_pos
        self.ords = ords
        self._shards = shards
        self._doc_ids: pa.Array | None = None

    def __len__(self) -> int:
        return len(self.scores)

    @property
    def doc_ids(self) -> pa.Array:
        """Doc ids of the hits (an Arrow string array; .to_pylist() for Python strings)."""
        if self._doc_ids is None:
            self._doc_ids = _take([s.doc_ids for s in self._shards], self.shard_pos, self.ords)
        return self._doc_ids

    def hits(self, explain: WeightedQuery | None = None) -> list[Hit]:
        """One Hit per result, for printing; with `explain`, each hit's per-term contributions to that query."""
        return [Hit(doc_id, score, self._shards[pos].shard, ord_,
                    self._shards[pos].contributions(ord_, explain) if explain is not None else None)
                for doc_id, score, pos, ord_ in zip(self.doc_ids.to_pylist(), self.scores.tolist(),
                                                    self.shard_pos.tolist(), self.ords.tolist())]


def _take(arrays: Sequence[pa.Array], which: np.ndarray, positions: np.ndarray) -> pa.Array:
    """arrays[which[i]][positions[i]] for every i, in that order: one Arrow take per array."""
    if len(arrays) == 1:
        return arrays[0].take(pa.array(positions))
    parts, where = [], []
    for i in np.unique(which):
        sel = np.flatnonzero(which == i)
        parts.append(arrays[i].take(pa.array(positions[sel])))
        where.append(sel)
    if not parts:
        return pa.array([], type=pa.large_string())
    back = np.empty(len(positions), dtype=np.int64)
    back[np.concatenate(where)] = np.arange(len(positions))
    return pa.concat_arrays(parts).take(pa.array(back))


class RankedBatch(SequenceABC):
    """The hits of a batch of queries as flat columns: `doc_ids` (Arrow) and `scores` (float64) of every hit, query
    after query and best first within each, and `offsets` [queries + 1] (query i's hits are offsets[i]:offsets[i+1]).
    Also a sequence of one (doc ids, scores) pair per query (zero-copy slices), what a Scorer returns."""

    def __init__(self, doc_ids: pa.Array, scores: np.ndarray, offsets: np.ndarray):
        self.doc_ids, self.scores, self.offsets = doc_ids, scores, offsets

    @classmethod
    def of_grid(cls, doc_ids_of: Callable[[np.ndarray], pa.Array], ords: np.ndarray, scores: np.ndarray,
                counts: np.ndarray) -> "RankedBatch":
        """From [queries, k] grids of hits (row i holds counts[i] of them, best first); `doc_ids_of` turns the kept
        ords, row after row, into doc ids."""
        keep = np.arange(ords.shape[1]) < np.asarray(counts)[:, None]
        return cls(doc_ids_of(ords[keep]), scores[keep], np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.doc_ids.slice(lo, hi - lo), self.scores[lo:hi]

    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)


def merged_batch(arrays: Sequence[pa.Array], merged: tuple[np.ndarray, ...]) -> RankedBatch:
    """A RankedBatch from merge_top_k's (shard [q, k], ords [q, k], scores [q, k], counts [q]), the doc ids taken
    from arrays[shard][ord] in one pass over the whole batch."""
    shard_pos, ords, scores, counts = merged
    keep = np.arange(shard_pos.shape[1]) < counts[:, None]
    return RankedBatch.of_grid(lambda kept_ords: _take(arrays, shard_pos[keep], kept_ords), ords, scores, counts)


def merge_batches(batches: Sequence[RankedBatch], k: int) -> RankedBatch:
    """Merge per-shard batches (each query's hits sorted by score desc, doc id asc) into the global top-k of each
    query, exactly as one shard holding every document would rank them: one merge and one doc-id gather for the
    whole batch."""
    ids = [as_doc_id_array(b.doc_ids) for b in batches]
    width = max(1, max(int(b.counts().max(initial=0)) for b in batches))
    grids = []
    for b in batches:  # each shard's hits as a [q, width] grid: positions into its flat doc ids, and scores
        counts = b.counts()
        keep = np.arange(width) < counts[:, None]
        pos, sc = np.zeros(keep.shape, np.int32), np.zeros(keep.shape, np.float64)
        pos[keep], sc[keep] = np.arange(len(b.scores), dtype=np.int32), b.scores
        grids.append((sc, pos, counts))
    merged = merge_top_k([g[0] for g in grids], [g[1] for g in grids], [g[2] for g in grids],
                         [doc_id_buffers(i) for i in ids], k)
    return merged_batch(ids, merged)


class Searcher:
    """All shards of one index version, scored with shared corpus-wide statistics."""

    def __init__(self, shards: Sequence[ShardIndex], stats: CorpusStats, analyzer: Analyzer):
        if not shards:
            raise ValueError("a searcher needs at least one shard")
        self.shards = list(shards)
        self.stats = stats
        self.analyzer = analyzer

    @property
    def num_docs(self) -> int:
        return sum(s.num_docs for s in self.shards)

    def parts_for_text(self, text: str, weight: float = 1.0, name: str = "original") -> QueryPart:
        return QueryPart(tuple(self.analyzer.terms(text)), weight, name)

    def compile(self, query: Query) -> WeightedQuery:
        if isinstance(query, WeightedQuery):
            return query
        return compile_query([self.parts_for_text(query)] if isinstance(query, str) else list(query))

    def rank_many(
        self,
        queries: Sequence[Query],
        k: int = SEARCH_K,
        exclude_doc_ids: Sequence[Iterable[str]] | None = None,
        constraints: Sequence[tuple[Sequence[str], Sequence[str]]] | None = None,
        scorer: str = "auto",
        as_rankings: bool = True,
    ) -> list[Ranking] | RankedBatch:
        """Rank a batch of queries (texts, query parts or compiled queries); each shard scores the batch in
        one compiled call. `constraints[i]` = (must terms, exclude terms): index terms a hit must / must not
        hold. `exclude_doc_ids[i]`: doc ids query i never returns (the k hits are filled without them).
        `scorer`: "auto", "pruned" or "exhaustive" (sira.core.bm25), all with the same results. `as_rankings`
        False: one RankedBatch for the whole batch instead (its doc ids gathered at once)."""
        compiled = [self.compile(q) for q in queries]
        ids = [([term_id(t) for t in must], [term_id(t) for t in exclude]) for must, exclude in constraints] \
            if constraints is not None else None
        skips = [[shard.ords_of(e) for e in exclude_doc_ids] for shard in self.shards] \
            if exclude_doc_ids is not None else None
        per_shard = top_k_shards(self.shards, compiled, k, ids, skips, scorer)
        if len(per_shard) == 1:
            merged = (np.zeros_like(per_shard[0][0], dtype=np.int64), *per_shard[0])
        else:
            merged = merge_top_k([s for _, s, _ in per_shard], [o for o, _, _ in per_shard],
                                 [c for _, _, c in per_shard],
                                 [(shard.doc_id_offsets, shard.doc_id_data) for shard in self.shards], k)
        shard_pos, ords, scores, counts = merged
        return [Ranking(scores[q, : counts[q]], shard_pos[q, : counts[q]], ords[q, : counts[q]], self.shards)
                for q in range(len(compiled))] if as_rankings else merged_batch([s.doc_ids for s in self.shards],
                                                                                merged)

    def retrieve(self, queries: Sequence[WeightedQuery], k: int,
                 constraints: Sequence[tuple[Sequence[str], Sequence[str]]] | None = None,
                 exclude_doc_ids: Sequence[Iterable[str]] | None = None) -> list[tuple[pa.Array, np.ndarray]]:
        """The Scorer of sira.core.query_path: each query's (doc ids, scores), as one RankedBatch."""
        return self.rank_many(queries, k, exclude_doc_ids, constraints, as_rankings=False)

    def contributions(self, query: WeightedQuery, doc_ids: Sequence[str]) -> dict[str, dict[str, float]]:
        """doc id -> per-term contributions to `query`, for those of `doc_ids` the shards hold."""
        return {shard.doc_ids[int(o)].as_py(): shard.contributions(int(o), query)
                for shard in self.shards for o in shard.ords_of(doc_ids)}

    def search(
        self,
        query,
        k: int = SEARCH_K,
        exclude_doc_ids: Iterable[str] = (),
        explain: bool = False,
        must_terms: Sequence[str] = (),
        exclude_terms: Sequence[str] = (),
    ) -> list[Hit]:
        """The hits of one query (a text, query parts, a compiled query or a RetrievalProgram with its constraints)
        as objects, for printing and notebooks; `explain` adds per-term contributions. Batches go through
        `rank_many` (or sira.core.retriever.Retriever), whose results are arrays."""
        if hasattr(query, "parts") and hasattr(query, "must"):  # a RetrievalProgram (sira.core.program)
            query, must_terms, exclude_terms = query.parts(), query.must, query.exclude
        compiled = self.compile(query)
        ranking = self.rank_many([compiled], k, [exclude_doc_ids], [(must_terms, exclude_terms)])[0]
        return ranking.hits(compiled if explain else None)
