"""`sira query`: bulk scoring. The query file is read in chunks of `commit_every` lines (any length: a chunk at a
time is in memory); each chunk's queries are expanded through the configured proposer (Ray Data, cached in
`expansions`), DF-validated into retrieval programs and scored scatter-gather against shard actors, and the chunk
is appended to the Delta `runs` table in one commit, its bad lines with their reason. Then the TREC run and the
Parquet run are written from the table. A rerun with the same run id resumes after the last committed line, on the
index version the run started on."""

from __future__ import annotations

import time
from itertools import islice
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field

from sira.pipelines.tracking.console import console, progress_bar
from sira.pipelines.enrichment.backend_config import BackendConfig
from sira.core.defaults import DEFAULT_DEPTH, DEPTH_HELP, QUERY_BATCH, QUERY_COMMIT_LINES, ExpansionParams


class QueryConfig(ExpansionParams):
    model_config = ConfigDict(extra="forbid")

    warehouse: str
    queries: str = Field(description="queries.jsonl[.gz] ({_id, text}), a TSV (qid<TAB>text) or a Delta table (qid, query)")
    out: Path = Field(description="TREC run file to write")
    parquet: Path | None = Field(None, description="Parquet run to write (qid, doc_id, rank, score, program_id); "
                                                   "default: the TREC file's path with .parquet")
    run_id: str | None = Field(None, description="default: the run file's name without extension")
    k: int = Field(DEFAULT_DEPTH, ge=1, le=10_000, description=DEPTH_HELP)
    expand: bool = True
    backend: BackendConfig = Field(default_factory=BackendConfig,
                                   description="query-side proposer")
    task: str | None = Field(None, description="prompt task; default: the one recorded for the warehouse at ingest")
    index_version: int | None = None
    preset: str | None = None
    batch_size: int = Field(QUERY_BATCH, gt=0, description="queries per scoring round")
    commit_every: int = Field(QUERY_COMMIT_LINES, gt=0, description="query-file lines per chunk: expanded together "
                                                                    "and committed to the runs table at once")
    scorer: Literal["actors", "local"] = Field(
        "actors", description="actors: the shards held by Ray actors, scored scatter-gather (any number of nodes); "
                              "local: the shards memory-mapped in this process, one thread (no Ray for plain "
                              "queries; faster at k <= 100 on one machine, bench/results/scoring_threads_200k.json)")
    ray_address: str | None = None

    @property
    def parquet_path(self) -> Path:
        return self.parquet or self.out.with_suffix(".parquet")


def run(cfg: QueryConfig) -> dict:
    from sira.pipelines.index.catalog import find_index
    from sira.pipelines.serving.query_runs import QueryRun, iter_queries

    run_id = cfg.run_id or cfg.out.name.split(".")[0]
    query_run = QueryRun(cfg.warehouse, run_id)
    state = query_run.resume(cfg.index_version)
    manifest = find_index(cfg.warehouse, state.index_version, cfg.preset)
    console.log(f"query run {run_id!r}: from line {state.last_line + 1} of {cfg.queries} ({state.scored} queries "
                f"scored and {state.rejected} lines rejected before; index v{manifest['index_version']}, expansion "
                f"{'on' if cfg.expand else 'off'})")
    started, before = time.perf_counter(), (state.scored, state.rejected)
    retriever, expansion, parts = _retriever(cfg, manifest), {}, dict.fromkeys(("expansion", "scoring", "commits"), 0.0)
    lines = iter_queries(cfg.queries, after=state.last_line)
    with progress_bar("score queries", total=None, unit="queries") as advance:
        while chunk := list(islice(lines, cfg.commit_every)):
            _score_chunk(retriever, query_run, state, chunk, manifest["index_version"], expansion, parts, advance)
    outputs_started = time.perf_counter()
    counts = query_run.write_outputs(cfg.out, cfg.parquet_path, f"sira-{run_id}")
    parts["outputs"] = time.perf_counter() - outputs_started
    return {"run_id": run_id, "queries": counts["scored"], "scored": state.scored - before[0],
            "skipped": before[0], "rejected": counts["rejected"], "index_version": manifest["index_version"],
            "run_file": str(cfg.out), "parquet_file": str(cfg.parquet_path), "hits": counts["hits"],
            "expansion": expansion or None, "seconds": time.perf_counter() - started,
            "seconds_by_part": {k: round(v, 3) for k, v in parts.items()}}


def _retriever(cfg: QueryConfig, manifest: dict):
    """The scorer (shard actors on the job's Ray, or the shards in this process) and the cached expansion dataflow
    in front of it when expanding."""
    from sira.pipelines.enrichment.ray_enrich import init_ray
    from sira.pipelines.serving.retrievers import CachedBatchProposer, open_retriever

    if cfg.scorer == "actors" or cfg.expand:  # the expansion dataflow runs on Ray too
        init_ray(cfg.ray_address)
    proposer = CachedBatchProposer(cfg.warehouse, cfg.backend, cfg.task, manifest, cfg.ray_address) \
        if cfg.expand else None
    retriever, _ = open_retriever(cfg.warehouse, manifest=manifest, scorer=cfg.scorer, proposer=proposer, tau=cfg.tau,
                                  w=cfg.w, k=cfg.k, batch_size=cfg.batch_size)
    return retriever


def _score_chunk(retriever, query_run, state, chunk: list, index_version: int, expansion: dict, parts: dict,
                 advance) -> None:
    """Score one chunk's good lines (a repeated query id is rejected: the run keeps its first line) and commit the
    chunk's rows; `expansion` adds up the proposer's counters, `parts` the seconds of each part."""
    from dataclasses import replace

    lines = []
    for q in chunk:
        if q.error is None and q.qid in state.seen:
            q = replace(q, error="repeated query id (its first line is scored)")
        elif q.error is None:
            state.seen.add(q.qid)
        lines.append(q)
    todo = {q.qid: q.text for q in lines if q.error is None}
    t = time.perf_counter()
    proposals = retriever.proposer.propose(list(todo.values())) if retriever.proposer is not None and todo else None
    for key, value in ((retriever.proposer.summary or {}) if proposals is not None else {}).items():
        expansion[key] = expansion.get(key, 0) + value if isinstance(value, (int, float)) else value
    parts["expansion"] += time.perf_counter() - t
    t = time.perf_counter()
    programs, results = retriever.run(todo, proposals=proposals, on_batch=lambda qids, *_: advance(len(qids)))
    parts["scoring"] += time.perf_counter() - t
    t = time.perf_counter()
    query_run.commit(lines, dict(zip(todo, programs)), results, index_version)
    parts["commits"] += time.perf_counter() - t
    state.last_line = chunk[-1].line
    state.scored += len(todo)
    state.rejected += len(lines) - len(todo)
