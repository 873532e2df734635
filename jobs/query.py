"""`sira query`: bulk scoring. Queries are expanded in batches through the configured LLM backend (Ray Data,
cached in `expansions`), DF-validated into retrieval programs, scored scatter-gather against shard actors,
and written to the Delta `runs` table (programs included) and a TREC run file. Incremental and resumable:
a rerun with the same run id scores only the queries that are not in `runs` yet, on the index version the run
started on."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
from pydantic import ConfigDict, Field

from sira.pipelines.tracking.console import console, progress_bar
from sira.pipelines.enrichment.backend_config import BackendConfig
from sira.core import tables
from sira.core.defaults import DEFAULT_DEPTH, DEPTH_HELP, QUERY_BATCH, ExpansionParams


class QueryConfig(ExpansionParams):
    model_config = ConfigDict(extra="forbid")

    warehouse: str
    queries: str = Field(description="queries.jsonl[.gz] ({_id, text}), a TSV (qid<TAB>text) or a Delta table (qid, query)")
    out: Path = Field(description="TREC run file to write")
    run_id: str | None = Field(None, description="default: the run file's name without extension")
    k: int = Field(DEFAULT_DEPTH, ge=1, le=10_000, description=DEPTH_HELP)
    expand: bool = True
    backend: BackendConfig = Field(default_factory=BackendConfig,
                                   description="query-side proposer")
    task: str | None = Field(None, description="prompt task; default: the one recorded for the warehouse at ingest")
    index_version: int | None = None
    preset: str | None = None
    batch_size: int = Field(QUERY_BATCH, gt=0, description="queries per scoring round and per runs-table commit")
    ray_address: str | None = None


def run(cfg: QueryConfig) -> dict:
    from sira.pipelines.index.catalog import find_index
    from sira.pipelines.serving.query_runs import read_queries, resumed, write_trec

    run_id = cfg.run_id or cfg.out.name.split(".")[0]
    queries = read_queries(cfg.queries)
    runs_uri = tables.table_uri(cfg.warehouse, tables.RUNS)
    done, index_version = resumed(runs_uri, run_id, cfg.index_version)
    manifest = find_index(cfg.warehouse, index_version, cfg.preset)
    todo = {q: text for q, text in sorted(queries.items()) if q not in done}
    console.log(f"query run {run_id!r}: {len(todo)} queries to score, {len(done)} already in runs "
                f"(index v{manifest['index_version']}, expansion {'on' if cfg.expand else 'off'})")
    started = time.perf_counter()
    expansion = _score(cfg, run_id, todo, manifest, runs_uri) if todo else None
    write_trec(runs_uri, run_id, cfg.out)
    return {"run_id": run_id, "queries": len(queries), "scored": len(todo), "skipped": len(done),
            "index_version": manifest["index_version"], "run_file": str(cfg.out), "expansion": expansion,
            "seconds": time.perf_counter() - started}


def _score(cfg: QueryConfig, run_id: str, todo: dict[str, str], manifest: dict, runs_uri: str) -> dict | None:
    """Expand (cached) and score `todo` on the shard actors, committing each batch to the runs table; returns the
    expansion's summary."""
    from sira.pipelines.enrichment.ray_enrich import init_ray
    from sira.pipelines.serving.query_runs import commit_runs
    from sira.pipelines.serving.retrievers import CachedBatchProposer, open_retriever

    init_ray(cfg.ray_address)
    proposer, proposals, expansion = None, None, None
    if cfg.expand:  # before the shard actors start: the expansion dataflow has the machine's cores to itself
        proposer = CachedBatchProposer(cfg.warehouse, cfg.backend, cfg.task, manifest, cfg.ray_address)
        with progress_bar("expand queries", total=len(todo), unit="queries") as advance:
            proposer.on_progress = advance
            proposals = proposer.propose(list(todo.values()))
        expansion = proposer.summary
    retriever, _ = open_retriever(cfg.warehouse, manifest=manifest, scorer="actors", proposer=proposer, tau=cfg.tau,
                                  w=cfg.w, k=cfg.k, batch_size=cfg.batch_size)
    with progress_bar("score queries", total=len(todo), unit="queries") as advance:
        def commit(qids: list[str], programs: list, results: pa.Table) -> None:
            commit_runs(runs_uri, run_id, qids, todo, programs, results, manifest["index_version"])
            advance(len(qids))

        retriever.run(todo, proposals=proposals, on_batch=commit)
    return expansion


