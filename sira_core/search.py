"""The searcher: weighted query parts -> one BM25 call over all shards -> merged top-k.

    score(d) = sum over parts p of  weight_p * BM25(terms_p, d)

Each part's terms keep their query term frequency (a term said twice counts twice), so
`[QueryPart(original, 1.0), QueryPart(expansion, w)]` is `BM25(q_orig, d) + w * BM25(q_exp, d)`.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from sira_core.analysis import Analyzer
from sira_core.bm25 import SCORE_DTYPE, CorpusStats, ShardIndex, WeightedQuery
from sira_core.hashing import term_id


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
        weights=np.array([weights[t] for t in terms], dtype=SCORE_DTYPE),
    )


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

    def search(
        self,
        query: str | Sequence[QueryPart],
        k: int = 10,
        exclude_doc_ids: Iterable[str] = (),
        explain: bool = False,
        must_terms: Sequence[str] = (),
        exclude_terms: Sequence[str] = (),
    ) -> list[Hit]:
        return self.search_many([query], k, [exclude_doc_ids], explain, [(must_terms, exclude_terms)])[0]

    def run_program(self, program, k: int = 10, exclude_doc_ids: Iterable[str] = (), explain: bool = False) -> list[Hit]:
        """One call of the searcher for a RetrievalProgram (sira_core.program)."""
        return self.search(program.parts(), k, exclude_doc_ids, explain, program.must, program.exclude)

    def search_many(
        self,
        queries: Sequence[str | Sequence[QueryPart]],
        k: int = 10,
        exclude_doc_ids: Sequence[Iterable[str]] | None = None,
        explain: bool = False,
        constraints: Sequence[tuple[Sequence[str], Sequence[str]]] | None = None,
    ) -> list[list[Hit]]:
        """Rank a batch of queries; each shard scores the unconstrained ones in one compiled call.
        `constraints[i]` = (must terms, exclude terms): index terms a hit must / must not hold."""
        compiled = [compile_query([self.parts_for_text(q)] if isinstance(q, str) else list(q)) for q in queries]
        excluded = [set(e) for e in exclude_doc_ids] if exclude_doc_ids is not None else [set()] * len(queries)
        constraints = constraints or [((), ())] * len(queries)
        depth = k + max((len(e) for e in excluded), default=0)
        ids = [([term_id(t) for t in must], [term_id(t) for t in exclude]) for must, exclude in constraints]
        per_query: dict[int, list] = {i: [] for i in range(len(queries))}
        for shard in self.shards:
            for i, (ords, scores) in enumerate(shard.top_k_constrained(compiled, depth, ids)):
                per_query[i].append((shard, ords, scores))
        return [self._merge(per_query[i], compiled[i], excluded[i], k, explain) for i in range(len(queries))]

    @staticmethod
    def _merge(per_shard, wq: WeightedQuery, excluded: set, k: int, explain: bool) -> list[Hit]:
        candidates = [
            zip((-s for s in scores.tolist()), shard.doc_ids[ords].tolist(), itertools.repeat(shard), ords.tolist())
            for shard, ords, scores in per_shard
        ]
        merged = candidates[0] if len(candidates) == 1 else heapq.merge(*candidates)
        hits: list[Hit] = []
        for neg_score, doc_id, shard, ord_ in merged:
            if doc_id in excluded:
                continue
            hits.append(Hit(doc_id, -neg_score, shard.shard, ord_, shard.contributions(ord_, wq) if explain else None))
            if len(hits) == k:
                break
        return hits


def merge_ranked(ranked_lists: Sequence[tuple[Sequence[str], Sequence[float]]], k: int,
                 excluded: Iterable[str] = ()) -> list[tuple[str, float]]:
    """Merge per-shard rankings (each sorted by score desc, doc id asc) into the global top-k, exactly as
    one shard holding every document would rank them."""
    skip = set(excluded)
    streams = [zip((-s for s in scores), doc_ids) for doc_ids, scores in ranked_lists]
    out: list[tuple[str, float]] = []
    for neg_score, doc_id in heapq.merge(*streams):
        if doc_id not in skip:
            out.append((doc_id, -neg_score))
            if len(out) == k:
                break
    return out
