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
from pipelines.llm_backends import BackendConfig
from pipelines.query_expansion import expand_queries
from pipelines.shard_loader import IndexNotFound, find_index, load_df_table, load_searcher
from sira_core import tables
from sira_core.datasets import resolve_dataset
from sira_core.dfstats import query_side_filter
from sira_core.enrichment import task_for_dataset
from sira_core.program import RetrievalProgram
from sira_core.metrics import DEFAULT_METRICS, evaluate_run, write_trec_run


QUERY_BATCH = 256


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dataset: str = Field(description="beir:NAME or a folder in BEIR format")
    preset: str = "sira"
    split: str = "test"
    variant: Literal["bm25", "doc", "query", "sira"] = Field(
        "bm25", description="bm25: plain; doc: corpus-side enrichment; query: query-side expansion over the plain "
                            "index; sira: both sides")
    warehouse: str | None = Field(None, description="default: warehouses/<dataset name>")
    shards: int = Field(4, ge=1)
    tau: float = Field(0.05, gt=0, le=1)
    depth: int = Field(1000, ge=100, description="hits kept per query (the TREC run depth)")
    spark_master: str = "local[*]"
    w: float = Field(0.5, ge=0, description="weight of the expansion part")
    task: str | None = Field(None, description="prompt task; default: chosen from the dataset name")
    backend: BackendConfig = Field(default_factory=BackendConfig, description="query-side proposer")
    ray_address: str | None = None

    @property
    def enriched(self) -> bool:
        return self.variant in ("doc", "sira")

    @property
    def expanded(self) -> bool:
        return self.variant in ("query", "sira")

    def warehouse_path(self, dataset_name: str) -> str:
        return self.warehouse or str(Path("warehouses") / dataset_name)


def ensure_index(dataset_spec: str, warehouse: str, preset: str, shards: int, spark_master: str,
                 enriched: bool = False, tau: float = 0.05) -> dict:
    """The newest index of `preset` built from the current docs (and enrichment) tables; ingests and
    indexes what is missing or stale."""
    docs_version = table_version(tables.table_uri(warehouse, tables.DOCS))
    if docs_version is None:
        console.log(f"warehouse {warehouse} has no docs table: ingesting {dataset_spec}")
        summary = ingest_job.run(ingest_job.IngestConfig(source=dataset_spec, warehouse=warehouse))
        console.log(f"ingest: read {summary['read']}, kept {summary['kept']}, rejected {summary['rejected']}")
        docs_version = summary["docs_table_version"]
    enrichment_version = None
    if enriched:
        enrichment_version = table_version(tables.table_uri(warehouse, tables.ENRICHMENT))
        if enrichment_version is None:
            raise FileNotFoundError(f"warehouse {warehouse} has no enrichment table; run `sira enrich` first")
    try:
        manifest = find_index(warehouse, preset=preset, enriched=enriched)
        fresh = manifest["docs_table_version"] == docs_version and (
            not enriched or (manifest["enrichment_table_version"] == enrichment_version and manifest["tau"] == tau))
        if fresh:
            return manifest
        console.log(f"index v{manifest['index_version']} is stale (built from other docs/enrichment versions or tau)")
    except IndexNotFound:
        console.log(f"no {preset} index {'with' if enriched else 'without'} enrichment in {warehouse}: building one")
    index_job.run(index_job.IndexConfig(warehouse=warehouse, preset=preset, shards=shards, spark_master=spark_master,
                                        enrichment=enriched, tau=tau))
    return find_index(warehouse, preset=preset, enriched=enriched)


class Programs(dict):
    """qid -> RetrievalProgram, with the expansion job's summary."""

    summary: dict | None = None


def build_programs(cfg: EvalConfig, dataset_name: str, warehouse: str, searcher, manifest: dict,
                   queries: dict[str, str]) -> Programs:
    """One retrieval program per query: the plain query, or (query / sira variants) the query plus its
    DF-validated expected-response sketch."""
    programs = Programs()
    if not cfg.expanded:
        for qid, text in queries.items():
            programs[qid] = RetrievalProgram.build(text, searcher.analyzer, index_version=manifest["index_version"])
        return programs
    task = cfg.task or task_for_dataset(dataset_name)
    with progress_bar("expand queries", total=len(queries), unit="queries") as advance:
        phrases, summary = expand_queries(warehouse, queries, task, cfg.backend, cfg.ray_address, on_progress=advance)
    df_table = load_df_table(warehouse, manifest)
    for qid, text in queries.items():
        decisions = query_side_filter(phrases[qid], searcher.analyzer, df_table.lookup, manifest["num_docs"], cfg.tau)
        programs[qid] = RetrievalProgram.build(text, searcher.analyzer, decisions, w=cfg.w, proposer=summary["model"],
                                               index_version=manifest["index_version"],
                                               prompt_version=summary["prompt_version"])
    kept = sum(e.kept for p in programs.values() for e in p.expansions)
    programs.summary = {**summary, "phrases_proposed": sum(len(p) for p in phrases.values()), "phrases_kept": kept}
    return programs


def run(cfg: EvalConfig) -> dict:
    dataset = resolve_dataset(cfg.dataset)
    warehouse = cfg.warehouse_path(dataset.name)
    queries = dataset.queries(cfg.split)
    qrels = dataset.qrels(cfg.split)
    manifest = ensure_index(cfg.dataset, warehouse, cfg.preset, cfg.shards, cfg.spark_master,
                            enriched=cfg.enriched, tau=cfg.tau)
    searcher, manifest = load_searcher(warehouse, manifest["index_version"])
    programs = build_programs(cfg, dataset.name, warehouse, searcher, manifest, queries)

    run_hits: dict[str, dict[str, float]] = {}
    started = time.perf_counter()
    qids = list(queries)
    with progress_bar(f"{dataset.name}/{cfg.split} queries", total=len(qids), unit="queries") as advance:
        for start in range(0, len(qids), QUERY_BATCH):
            batch = qids[start : start + QUERY_BATCH]
            exclude = [(q,) if dataset.queries_are_documents else () for q in batch]
            ranked = searcher.search_many([programs[q].parts() for q in batch], k=cfg.depth, exclude_doc_ids=exclude)
            for qid, hits in zip(batch, ranked):
                run_hits[qid] = {h.doc_id: h.score for h in hits}
            advance(len(batch))
    seconds = time.perf_counter() - started

    tag = f"sira-{cfg.preset}-{cfg.variant}"
    run_path = Path(warehouse) / "runs" / f"{dataset.name}-{cfg.split}-{cfg.preset}-{cfg.variant}.trec"
    write_trec_run(run_hits, run_path, tag)
    programs_path = run_path.with_suffix(".programs.jsonl")
    programs_path.write_text("".join(programs[q].model_dump_json() + "\n" for q in qids), encoding="utf-8")
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
        "programs_file": str(programs_path),
        "expansion": getattr(programs, "summary", None),
        "queries_per_second": len(queries) / seconds if seconds > 0 else None,
    }
