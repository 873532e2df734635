"""`sira query`: bulk scoring. Queries are expanded in batches through the configured LLM backend (Ray Data,
cached in `expansions`), DF-validated into retrieval programs, scored scatter-gather against shard actors,
and written to the Delta `runs` table (programs included) and a TREC run file. Incremental and resumable:
a rerun with the same run id scores only the queries that are not in `runs` yet, on the index version the run
started on."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from pydantic import ConfigDict, Field

from sira.pipelines.tracking.console import console, progress_bar
from sira.pipelines.storage.delta_io import read_table, table_exists, write_table
from sira.pipelines.enrichment.backend_config import BackendConfig
from sira.core import tables
from sira.core.datasets import iter_lines
from sira.core.defaults import ExpansionParams
from sira.core.metrics import write_trec_run
from sira.core.retriever import hits_by_query


class QueryConfig(ExpansionParams):
    model_config = ConfigDict(extra="forbid")

    warehouse: str
    queries: str = Field(description="queries.jsonl[.gz] ({_id, text}), a TSV (qid<TAB>text) or a Delta table (qid, query)")
    out: Path = Field(description="TREC run file to write")
    run_id: str | None = Field(None, description="default: the run file's name without extension")
    k: int = Field(1000, ge=1, le=10_000)
    expand: bool = True
    backend: BackendConfig = Field(default_factory=lambda: BackendConfig(backend="encoder"),
                                   description="query-side proposer")
    task: str | None = Field(None, description="prompt task; default: the one recorded for the warehouse at ingest")
    index_version: int | None = None
    preset: str | None = None
    batch_size: int = Field(256, gt=0, description="queries per scoring round and per runs-table commit")
    ray_address: str | None = None


def read_queries(spec: str) -> dict[str, str]:
    path = Path(spec)
    if path.is_dir() and DeltaTable.is_deltatable(spec):
        t = read_table(spec, columns=["qid", "query"])
        return dict(zip(t["qid"].to_pylist(), t["query"].to_pylist()))
    if not path.exists():
        raise FileNotFoundError(f"queries {spec!r} not found (expected .jsonl[.gz], .tsv or a Delta table)")
    out: dict[str, str] = {}
    for n, line in iter_lines(path):
        text = line.decode("utf-8")
        if path.name.endswith((".tsv", ".tsv.gz")):
            qid, sep, query = text.partition("\t")
            if not sep:
                raise ValueError(f"{path}:{n}: expected qid<TAB>text")
        else:
            obj = json.loads(text)
            qid, query = str(obj.get("_id", obj.get("qid", ""))), obj.get("text", obj.get("query", ""))
        if not qid or not query.strip():
            raise ValueError(f"{path}:{n}: query without id or text")
        out[qid] = query
    return out


def run(cfg: QueryConfig) -> dict:
    from sira.pipelines.index.catalog import find_index

    run_id = cfg.run_id or cfg.out.name.split(".")[0]
    queries = read_queries(cfg.queries)
    runs_uri = tables.table_uri(cfg.warehouse, tables.RUNS)
    done, index_version = _resumed(runs_uri, run_id, cfg.index_version)
    manifest = find_index(cfg.warehouse, index_version, cfg.preset)
    todo = {q: text for q, text in sorted(queries.items()) if q not in done}
    console.log(f"query run {run_id!r}: {len(todo)} queries to score, {len(done)} already in runs "
                f"(index v{manifest['index_version']}, expansion {'on' if cfg.expand else 'off'})")
    started = time.perf_counter()
    expansion = _score(cfg, run_id, todo, manifest, runs_uri) if todo else None
    _write_trec(runs_uri, run_id, cfg.out)
    return {"run_id": run_id, "queries": len(queries), "scored": len(todo), "skipped": len(done),
            "index_version": manifest["index_version"], "run_file": str(cfg.out), "expansion": expansion,
            "seconds": time.perf_counter() - started}


def _resumed(runs_uri: str, run_id: str, index_version: int | None) -> tuple[set[str], int | None]:
    """The queries of run `run_id` already in the runs table, and the index version the run scores on: a resumed
    run finishes on the index its committed queries were scored on (a version published in between, the nightly
    build, would otherwise mix two indexes in one run)."""
    if not table_exists(runs_uri):
        return set(), index_version
    t = read_table(runs_uri, columns=["run_id", "qid", "index_version"])
    t = t.filter(pc.equal(t["run_id"], run_id))
    scored_on = set(t["index_version"].to_pylist())
    if index_version is None and scored_on:
        index_version = max(scored_on)
    elif scored_on - {index_version}:
        on = ", ".join(f"v{v}" for v in sorted(scored_on))
        raise ValueError(f"run {run_id!r} has queries scored on index {on}, not v{index_version}: "
                         "resume it on its own version or start a new run id")
    return set(t["qid"].to_pylist()), index_version


def _score(cfg: QueryConfig, run_id: str, todo: dict[str, str], manifest: dict, runs_uri: str) -> dict | None:
    """Expand (cached) and score `todo` on the shard actors, committing each batch to the runs table; returns the
    expansion's summary."""
    from sira.pipelines.enrichment.ray_enrich import init_ray
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
            _commit_runs(runs_uri, run_id, qids, todo, programs, results, manifest["index_version"])
            advance(len(qids))

        retriever.run(todo, proposals=proposals, on_batch=commit)
    return expansion


def _write_trec(runs_uri: str, run_id: str, out: Path) -> None:
    """The run's TREC file, from every query of it in the runs table (those scored before a resume included)."""
    rows = read_table(runs_uri, columns=["run_id", "qid", "doc_ids", "scores"]) if table_exists(runs_uri) else \
        pa.Table.from_pylist([], schema=tables.RUNS_SCHEMA)
    rows = rows.filter(pc.equal(rows["run_id"], run_id))
    run_hits = {q: dict(zip(ids, scores)) for q, ids, scores in
                zip(rows["qid"].to_pylist(), rows["doc_ids"].to_pylist(), rows["scores"].to_pylist())}
    write_trec_run({q: run_hits[q] for q in sorted(run_hits)}, out, f"sira-{run_id}")


def _commit_runs(uri, run_id, qids, texts, programs, results: pa.Table, index_version) -> None:
    now = datetime.now(timezone.utc)
    hits = hits_by_query(results)  # each query's hits best first
    rows = pa.Table.from_pylist([
        {"run_id": run_id, "qid": q, "query": texts[q], "program": p.model_dump_json(),
         "doc_ids": list(hits.get(q, {})), "scores": list(hits.get(q, {}).values()), "index_version": index_version,
         "created_at": now}
        for q, p in zip(qids, programs)], schema=tables.RUNS_SCHEMA)
    # An append, not a MERGE: a MERGE reads the table it merges into, so each commit cost more as the run grew. The
    # rows are new by construction: the queries of this run not in the table yet (`_resumed`), each batch once.
    write_table(uri, rows)
