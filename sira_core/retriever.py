"""One retrieval action as a table transform, in the manner of PyTerrier's one frame contract: (qid, query) in,
(qid, rank, doc_id, score, program) out.

A `Retriever` holds the decisions every entry point used to make on its own: the proposer and its expansion
weight w (the proposer's own default unless given), tau (the query path's DF filter), k, and whether a query's
own id may be a hit (`exclude_self`, for datasets whose queries are documents). `sira search`, `sira query` and
`sira eval` build one through sira.pipelines.serving.retrievers.open_retriever and only read its results.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sira.core.defaults import QUERY_BATCH, SEARCH_K
from sira.core.program import DEFAULT_W, RetrievalProgram
from sira.core.proposers import Proposal, TermProposer
from sira.core.query_path import QueryPath
from sira.core.search import RankedBatch

QUERIES_SCHEMA = pa.schema([("qid", pa.string()), ("query", pa.string())])
# `program`: the query's retrieval program as JSON, dictionary-encoded (stored once per query, not once per hit).
RESULTS_SCHEMA = pa.schema([("qid", pa.string()), ("rank", pa.int32()), ("doc_id", pa.string()),
                            ("score", pa.float64()), ("program", pa.dictionary(pa.int32(), pa.string()))])


@dataclass
class Retriever:
    path: QueryPath
    proposer: TermProposer | None = None
    w: float | None = None  # None: the proposer's own default
    k: int = SEARCH_K
    exclude_self: bool = False  # a query's own id is never one of its hits
    batch_size: int = QUERY_BATCH  # queries per call of the scorer

    @property
    def weight(self) -> float:
        """The expansion weight the programs record: w, else the proposer's default; a plain program (no
        proposer) has no expansion part for w to weigh and records the program's default."""
        return program_weight(self.proposer, self.w)

    def programs(self, queries: Sequence[str], must: Sequence[str] = (), exclude: Sequence[str] = (),
                 proposals: Sequence[Proposal] | None = None) -> list[RetrievalProgram]:
        """A retrieval program per query: expanded by the proposer's proposals (asked here unless given)."""
        if self.proposer is None:
            return self.path.programs(queries, None, self.weight, must=must, exclude=exclude)
        if proposals is None:
            proposals = self.proposer.propose(list(queries))
        return self.path.programs(queries, proposals, self.weight, self.proposer.name, self.proposer.version,
                                  must, exclude)

    def rank(self, qids: Sequence[str], programs: Sequence[RetrievalProgram], k: int | None = None) -> pa.Table:
        """The programs ranked, one scorer call: RESULTS_SCHEMA rows, each query's best first."""
        exclude = [(q,) for q in qids] if self.exclude_self else None
        return results_table(qids, programs, self.path.rank(programs, k or self.k, exclude))

    def __call__(self, queries: pa.Table | Mapping[str, str], k: int | None = None) -> pa.Table:
        """Every query's top k (RESULTS_SCHEMA)."""
        return self.run(queries, k)[1]

    def run(self, queries: pa.Table | Mapping[str, str], k: int | None = None,
            proposals: Sequence[Proposal] | None = None,
            on_batch: Callable[[list[str], list[RetrievalProgram], pa.Table], None] = lambda *batch: None,
            ) -> tuple[list[RetrievalProgram], pa.Table]:
        """Every query's program (in input order; a query without hits has one too) and top k. The proposer is
        asked once for the whole set (a batch job's startup is paid once) unless its `proposals` are given (one per
        query, asked beforehand under a progress bar of their own); the scorer in batches of `batch_size`, each
        handed to `on_batch` (qids, programs, results) as it is ranked: progress, a commit."""
        qids, texts = _qids_and_texts(queries)
        if proposals is None and self.proposer is not None and texts:
            proposals = self.proposer.propose(texts)
        if proposals is not None and len(proposals) != len(qids):
            raise ValueError(f"{len(qids)} queries but {len(proposals)} proposals")
        programs, parts = [], []
        for start in range(0, len(qids), self.batch_size):
            end = start + self.batch_size
            batch = self.programs(texts[start:end], proposals=None if proposals is None else proposals[start:end])
            parts.append(self.rank(qids[start:end], batch, k))
            programs += batch
            on_batch(qids[start:end], batch, parts[-1])
        return programs, pa.concat_tables(parts) if parts else RESULTS_SCHEMA.empty_table()

    def contributions(self, program: RetrievalProgram, doc_ids: Sequence[str]) -> dict[str, dict[str, float]]:
        """Why each of `doc_ids` scored for `program`: doc id -> term -> contribution."""
        return self.path.contributions(program, doc_ids)


def program_weight(proposer: TermProposer | None, w: float | None) -> float:
    """The expansion weight a program records (Retriever.weight): w, else the proposer's default; DEFAULT_W for a
    plain program."""
    if proposer is None:
        return DEFAULT_W
    return w if w is not None else proposer.default_w


def results_table(qids: Sequence[str], programs: Sequence[RetrievalProgram], ranked: RankedBatch) -> pa.Table:
    """RESULTS_SCHEMA rows of ranked queries: rank 1 is each query's best hit."""
    counts = ranked.counts()
    which = pa.array(np.repeat(np.arange(len(counts), dtype=np.int32), counts))
    starts = np.repeat(ranked.offsets[:-1], counts)
    program = pa.DictionaryArray.from_arrays(which, pa.array([p.model_dump_json() for p in programs], pa.string()))
    return pa.table({
        "qid": pc.take(pa.array(list(qids), pa.string()), which),
        "rank": pa.array(np.arange(len(starts), dtype=np.int64) - starts + 1, pa.int32()),
        "doc_id": ranked.doc_ids.cast(pa.string()),
        "score": pa.array(np.asarray(ranked.scores, np.float64), pa.float64()),
        "program": program,
    }, schema=RESULTS_SCHEMA)


def hits_by_query(results: pa.Table) -> dict[str, dict[str, float]]:
    """qid -> {doc_id: score} of a results table (what metrics and TREC run files take)."""
    out: dict[str, dict[str, float]] = {}
    for qid, doc_id, score in zip(results["qid"].to_pylist(), results["doc_id"].to_pylist(),
                                  results["score"].to_pylist()):
        out.setdefault(qid, {})[doc_id] = score
    return out


def _qids_and_texts(queries: pa.Table | Mapping[str, str]) -> tuple[list[str], list[str]]:
    if isinstance(queries, pa.Table):
        missing = {"qid", "query"} - set(queries.column_names)
        if missing:
            raise ValueError(f"a queries table needs columns qid and query; missing {sorted(missing)}")
        qids, texts = queries["qid"].cast(pa.string()).to_pylist(), queries["query"].cast(pa.string()).to_pylist()
    else:
        qids, texts = list(queries), list(queries.values())
    for qid, text in zip(qids, texts):
        if not qid or text is None or not text.strip():
            raise ValueError(f"query {qid!r}: a query needs an id and a text")
    if len(set(qids)) != len(qids):
        raise ValueError("query ids must be unique")
    return qids, texts


def as_queries_table(queries: Mapping[str, str] | Iterable[tuple[str, str]]) -> pa.Table:
    pairs = list(queries.items()) if isinstance(queries, Mapping) else list(queries)
    return pa.table({"qid": [q for q, _ in pairs], "query": [t for _, t in pairs]}, schema=QUERIES_SCHEMA)
