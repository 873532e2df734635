"""`sira eval`: ingest and index whatever the warehouse lacks, run a split's queries, compute metrics."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from jobs import index as index_job
from jobs import ingest as ingest_job
from jobs.progress import console, progress_bar
from pipelines.delta_io import table_version
from pipelines.shard_loader import IndexNotFound, find_index, load_searcher
from sira_core import tables
from sira_core.datasets import resolve_dataset
from sira_core.metrics import DEFAULT_METRICS, evaluate_run, write_trec_run


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dataset: str = Field(description="beir:NAME or a folder in BEIR format")
    preset: str = "sira"
    split: str = "test"
    variant: Literal["bm25"] = "bm25"
    warehouse: str | None = Field(None, description="default: warehouses/<dataset name>")
    shards: int = Field(4, ge=1)
    depth: int = Field(1000, ge=100, description="hits kept per query (the TREC run depth)")
    spark_master: str = "local[*]"

    def warehouse_path(self, dataset_name: str) -> str:
        return self.warehouse or str(Path("warehouses") / dataset_name)


def ensure_index(dataset_spec: str, warehouse: str, preset: str, shards: int, spark_master: str) -> dict:
    """The newest index of `preset` built from the current docs table; ingest / index when missing."""
    docs_version = table_version(tables.table_uri(warehouse, tables.DOCS))
    if docs_version is None:
        console.log(f"warehouse {warehouse} has no docs table: ingesting {dataset_spec}")
        summary = ingest_job.run(ingest_job.IngestConfig(source=dataset_spec, warehouse=warehouse))
        console.log(f"ingest: read {summary['read']}, kept {summary['kept']}, rejected {summary['rejected']}")
        docs_version = summary["docs_table_version"]
    try:
        manifest = find_index(warehouse, preset=preset)
        if manifest["docs_table_version"] == docs_version:
            return manifest
        console.log(f"index v{manifest['index_version']} was built from docs v{manifest['docs_table_version']}, "
                    f"docs are now v{docs_version}: rebuilding")
    except IndexNotFound:
        console.log(f"no {preset} index in {warehouse}: building one")
    index_job.run(index_job.IndexConfig(warehouse=warehouse, preset=preset, shards=shards, spark_master=spark_master))
    return find_index(warehouse, preset=preset)


def run(cfg: EvalConfig) -> dict:
    dataset = resolve_dataset(cfg.dataset)
    warehouse = cfg.warehouse_path(dataset.name)
    queries = dataset.queries(cfg.split)
    qrels = dataset.qrels(cfg.split)
    manifest = ensure_index(cfg.dataset, warehouse, cfg.preset, cfg.shards, cfg.spark_master)
    searcher, manifest = load_searcher(warehouse, manifest["index_version"])

    run_hits: dict[str, dict[str, float]] = {}
    started = time.perf_counter()
    with progress_bar(f"{dataset.name}/{cfg.split} queries", total=len(queries), unit="queries") as advance:
        for qid, text in queries.items():
            exclude = (qid,) if dataset.queries_are_documents else ()
            run_hits[qid] = {h.doc_id: h.score for h in searcher.search(text, k=cfg.depth, exclude_doc_ids=exclude)}
            advance(1)
    seconds = time.perf_counter() - started

    tag = f"sira-{cfg.preset}-{cfg.variant}"
    run_path = Path(warehouse) / "runs" / f"{dataset.name}-{cfg.split}-{cfg.preset}-{cfg.variant}.trec"
    write_trec_run(run_hits, run_path, tag)
    return {
        "dataset": dataset.name,
        "split": cfg.split,
        "preset": cfg.preset,
        "variant": cfg.variant,
        "num_queries": len(queries),
        "metrics": evaluate_run(qrels, run_hits, DEFAULT_METRICS),
        "index_version": manifest["index_version"],
        "warehouse": warehouse,
        "run_file": str(run_path),
        "queries_per_second": len(queries) / seconds if seconds > 0 else None,
    }
