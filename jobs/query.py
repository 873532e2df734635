"""`sira query`: bulk scoring. The query file is read in chunks of `commit_every` lines (any length: two chunks at
a time are in memory); each chunk's queries are expanded through the configured proposer (Ray Data, cached in
`expansions`), DF-validated into retrieval programs and scored (by default by query workers, each mapping every
shard, sira.pipelines.serving.query_workers), and the chunk is appended to the Delta `runs` table in one commit,
its bad lines with their reason, and its hits are added to the TREC run and the Parquet run; a chunk is scored
while the next is expanded. A rerun with the same run id resumes after the last committed line, on the
index version the run started on. The config and the runs table's code are in sira.pipelines.serving.query_runs."""

from __future__ import annotations

import time
from itertools import islice

from sira.pipelines.serving.query_runs import QueryConfig
from sira.pipelines.tracking.console import console, progress_bar


def run(cfg: QueryConfig) -> dict:
    from sira.pipelines.index.catalog import find_index
    from sira.pipelines.serving.query_runs import QueryRun, chunk_scorer, iter_queries

    run_id = cfg.run_id or cfg.out.name.split(".")[0]
    query_run = QueryRun(cfg.warehouse, run_id)
    state = query_run.resume(cfg.index_version)
    manifest = find_index(cfg.warehouse, state.index_version, cfg.preset)
    console.log(f"query run {run_id!r}: from line {state.last_line + 1} of {cfg.queries} ({state.scored} queries "
                f"scored and {state.rejected} lines rejected before; index v{manifest['index_version']}, expansion "
                f"{'on' if cfg.expand else 'off'})")
    started, before = time.perf_counter(), (state.scored, state.rejected)
    proposer, scorer = chunk_scorer(cfg, manifest)
    lines = iter_queries(cfg.queries, after=state.last_line)
    chunks = iter(lambda: list(islice(lines, cfg.commit_every)), [])
    try:
        with query_run.open_outputs(cfg.out, cfg.parquet_path, f"sira-{run_id}", state) as outputs, \
                progress_bar("score queries", total=None, unit="queries") as advance:
            query_run.score_chunks(scorer, proposer, state, chunks, manifest["index_version"], advance)
    finally:
        scorer.close()  # query workers hold CPUs of the Ray cluster the job may share
    return _summary(cfg, run_id, state, before[0], outputs.counts, manifest, scorer, time.perf_counter() - started)


def _summary(cfg: QueryConfig, run_id: str, state, skipped: int, counts: dict, manifest: dict, scorer,
             seconds: float) -> dict:
    return {"run_id": run_id, "queries": counts["scored"], "scored": state.scored - skipped, "skipped": skipped,
            "rejected": counts["rejected"], "index_version": manifest["index_version"], "run_file": str(cfg.out),
            "parquet_file": str(cfg.parquet_path), "hits": counts["hits"], "expansion": state.expansion or None,
            "seconds": seconds, "seconds_by_part": {k: round(v, 3) for k, v in state.seconds.items()},
            "commit_cost": state.commit_cost(),
            "scorer": cfg.scorer, "shard_nodes": len(set(scorer.nodes)) or 1}
