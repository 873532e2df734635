"""`sira query`: bulk scoring. The query file is read in chunks of `commit_every` lines (any length: a chunk at a
time is in memory); each chunk's queries are expanded through the configured proposer (Ray Data, cached in
`expansions`), DF-validated into retrieval programs and scored scatter-gather against shard actors, and the chunk
is appended to the Delta `runs` table in one commit, its bad lines with their reason. Then the TREC run and the
Parquet run are written from the table. A rerun with the same run id resumes after the last committed line, on the
index version the run started on. The config and the runs table's code are in sira.pipelines.serving.query_runs."""

from __future__ import annotations

import time
from itertools import islice

from sira.pipelines.serving.query_runs import QueryConfig
from sira.pipelines.tracking.console import console, progress_bar


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
    started, before, retriever = time.perf_counter(), (state.scored, state.rejected), _retriever(cfg, manifest)
    lines = iter_queries(cfg.queries, after=state.last_line)
    with progress_bar("score queries", total=None, unit="queries") as advance:
        while chunk := list(islice(lines, cfg.commit_every)):
            query_run.score_chunk(retriever, state, chunk, manifest["index_version"], advance)
    outputs_started = time.perf_counter()
    counts = query_run.write_outputs(cfg.out, cfg.parquet_path, f"sira-{run_id}")
    parts = {**state.seconds, "outputs": time.perf_counter() - outputs_started}
    return {"run_id": run_id, "queries": counts["scored"], "scored": state.scored - before[0],
            "skipped": before[0], "rejected": counts["rejected"], "index_version": manifest["index_version"],
            "run_file": str(cfg.out), "parquet_file": str(cfg.parquet_path), "hits": counts["hits"],
            "expansion": state.expansion or None, "seconds": time.perf_counter() - started,
            "seconds_by_part": {k: round(v, 3) for k, v in parts.items()},
            "shard_nodes": len(set(getattr(retriever.path.scorer, "nodes", ()))) or 1}


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
