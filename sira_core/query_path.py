"""The one query path: queries -> proposals -> DF-validated retrieval programs -> ranked results.

`sira search`, `sira query`, `sira eval` and `sira serve` all go through QueryPath. They differ only in where the
proposals come from (a batch dataflow, one online call, none) and in the Scorer that holds the index's shards:
the in-process sira.core.search.Searcher, or shard actors queried scatter-gather (sira.pipelines.serving.shard_actors).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence


from sira.core.analysis import Analyzer
from sira.core.bm25 import WeightedQuery
from sira.core.defaults import DEFAULT_TAU
from sira.core.dfstats import DFTable
from sira.core.program import DEFAULT_W, RetrievalProgram, expansion_program
from sira.core.proposers import Proposal
from sira.core.search import RankedBatch, compile_query

Constraint = tuple[Sequence[str], Sequence[str]]  # (index terms a hit must hold, index terms it must not hold)


class Scorer(Protocol):
    """All shards of one index version, scored with its corpus-wide statistics."""

    def retrieve(self, queries: Sequence[WeightedQuery], k: int, constraints: Sequence[Constraint] | None = None,
                 exclude_doc_ids: Sequence[Iterable[str]] | None = None) -> RankedBatch:
        """Each query's top k over all shards, by (score desc, doc id asc); `exclude_doc_ids[i]`: doc ids query i
        never returns (its k hits are filled without them)."""
        ...

    def contributions(self, query: WeightedQuery, doc_ids: Sequence[str]) -> dict[str, dict[str, float]]:
        """doc id -> per-term contributions to `query`, for those of `doc_ids` the shards hold."""
        ...


@dataclass(frozen=True)
class QueryPath:
    """One index version's query path. `df_table` (the index's DFs) is needed only to validate proposals."""

    scorer: Scorer
    analyzer: Analyzer
    num_docs: int
    index_version: int | None = None
    df_table: DFTable | None = None
    tau: float = DEFAULT_TAU

    def programs(self, queries: Sequence[str], proposals: Sequence[Proposal] | None = None, w: float = DEFAULT_W,
                 proposer: str = "", prompt_version: str | None = None, must: Sequence[str] = (),
                 exclude: Sequence[str] = ()) -> list[RetrievalProgram]:
        """A retrieval program per query: the plain query, or (with one proposal per query) the query plus the
        proposed phrases that pass the query-side DF filter, weighted by w."""
        if proposals is None:
            return [RetrievalProgram.build(q, self.analyzer, w=w, must=must, exclude=exclude,
                                           index_version=self.index_version) for q in queries]
        if self.df_table is None:
            raise ValueError("validating proposals needs the index's DF table")
        if len(proposals) != len(queries):
            raise ValueError(f"{len(queries)} queries but {len(proposals)} proposals")
        return [expansion_program(q, self.analyzer, p, self.df_table.lookup, self.num_docs, self.tau, w, proposer,
                                  self.index_version, prompt_version, must, exclude)
                for q, p in zip(queries, proposals)]

    def rank(self, programs: Sequence[RetrievalProgram], k: int,
             exclude_doc_ids: Sequence[Iterable[str]] | None = None) -> RankedBatch:
        """Each program as one weighted BM25 call, the batch in one call of the scorer."""
        return self.scorer.retrieve([compile_query(p.parts()) for p in programs], k,
                                    [(p.must, p.exclude) for p in programs], exclude_doc_ids)

    def contributions(self, program: RetrievalProgram, doc_ids: Sequence[str]) -> dict[str, dict[str, float]]:
        """Why each of `doc_ids` scored for `program`: doc id -> term -> contribution (every doc id present)."""
        found = self.scorer.contributions(compile_query(program.parts()), doc_ids)
        return {d: found.get(d, {}) for d in doc_ids}
