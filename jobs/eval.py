"""`sira eval`: ingest and index whatever the warehouse lacks, run a split's queries, compute metrics."""

from __future__ import annotations

import re
import time
from pathlib import Path

from pydantic import ConfigDict, Field, model_validator

from sira.pipelines.tracking.console import console, progress_bar
from sira.pipelines.enrichment.backend_config import BackendConfig
from sira.pipelines.enrichment.rerank import RerankConfig
from sira.core.defaults import EvaluationParams, default_warehouse
from sira.core.variants import BASELINE_VARIANT, RERANK_VARIANT, VariantName, help_text, variant



class EvalConfig(EvaluationParams):
    model_config = ConfigDict(extra="forbid")

    dataset: str = Field(description="beir:NAME or a folder in BEIR format")
    split: str = "test"
    variant: VariantName = Field(BASELINE_VARIANT, description=help_text())
    warehouse: str | None = Field(None, description="default: warehouses/<dataset name>")
    task: str | None = Field(None, description="prompt task; default: chosen from the dataset name")
    backend: BackendConfig = Field(default_factory=BackendConfig,
                                   description="query-side proposer")
    doc_backend: BackendConfig | None = Field(
        None, description="corpus-side proposer, run incrementally before indexing; None: index the warehouse's "
                          "enrichment as it stands (the encoder proposer when there is none)")
    ray_address: str | None = None
    rerank: RerankConfig | None = Field(None, description="sira+rerank: the LLM reranker (required there, "
                                                          "refused elsewhere)")

    @model_validator(mode="after")
    def _rerank_only_with_its_variant(self) -> "EvalConfig":
        if self.variant == RERANK_VARIANT and self.rerank is None:
            raise ValueError(f"variant {RERANK_VARIANT} needs a reranker: --rerank-backend openai|local")
        if self.variant != RERANK_VARIANT and self.rerank is not None:
            raise ValueError(f"rerank settings apply only to variant {RERANK_VARIANT}, not {self.variant}")
        return self

    @property
    def first_stage(self) -> str:
        """The single-call variant that retrieves (sira+rerank reranks what sira retrieves)."""
        return variant(self.variant).first_stage

    @property
    def enriched(self) -> bool:
        return variant(self.variant).enriched_index

    @property
    def expanded(self) -> bool:
        return variant(self.variant).expanded_queries

    def warehouse_path(self, dataset_name: str) -> str:
        return self.warehouse or default_warehouse(dataset_name)


def run(cfg: EvalConfig, manifest: dict | None = None) -> dict:
    """`manifest`: the index to search, when a composite job has brought it up to date already; None: whatever the
    warehouse lacks is ingested, enriched and indexed first."""
    from sira.pipelines.tracking.runs import RUNS_FOLDER, write_run, write_run_info
    from sira.core.datasets import resolve_dataset

    dataset = resolve_dataset(cfg.dataset)
    warehouse, queries, qrels = cfg.warehouse_path(dataset.name), dataset.queries(cfg.split), dataset.qrels(cfg.split)
    retriever, manifest = _retriever(cfg, warehouse, manifest, dataset.queries_are_documents)
    programs, run_hits, expansion, rerank_summary, seconds = retrieve(cfg, retriever, f"{dataset.name}/{cfg.split}",
                                                                      queries, warehouse)
    run_path = Path(warehouse) / RUNS_FOLDER / f"{_run_name(cfg, dataset.name, manifest)}.trec"
    programs_path = write_run(run_path, run_hits, programs, f"sira-{cfg.preset}-{cfg.variant}")
    summary = {
        "dataset": dataset.name, "split": cfg.split, "preset": cfg.preset, "variant": cfg.variant,
        "num_queries": len(queries), "metrics": _metrics(dataset, cfg.split, qrels, warehouse, run_hits),
        "index_version": manifest["index_version"], "warehouse": warehouse, "run_file": str(run_path),
        "programs_file": str(programs_path), "expansion": expansion, "rerank": rerank_summary,
        "queries_per_second": len(queries) / seconds if seconds > 0 else None,
    }
    # What the run is, beside it: `sira serve`'s compare view lists and compares the runs of a warehouse.
    summary["info_file"] = str(write_run_info(run_path, summary, cfg.dataset, list(queries)))
    return summary


def _retriever(cfg: EvalConfig, warehouse: str, manifest: dict | None, queries_are_documents: bool):
    """The variant's index (built first when `manifest` is None and the warehouse lacks it) and its proposer."""
    from sira.pipelines.index.freshness import ensure_index
    from sira.pipelines.serving.retrievers import CachedBatchProposer, open_retriever

    if manifest is None:
        manifest = ensure_index(cfg.dataset, warehouse, cfg.preset, cfg.shards, cfg.spark_master,
                                enriched=cfg.enriched, tau=cfg.tau, doc_backend=cfg.doc_backend, task=cfg.task,
                                log=console.log, progress=progress_bar)
    proposer = (lambda m: CachedBatchProposer(warehouse, cfg.backend, cfg.task, m, cfg.ray_address)) \
        if cfg.expanded else None
    # A dataset whose queries are documents: a query's own document is never among its hits.
    return open_retriever(warehouse, manifest=manifest, proposer=proposer, tau=cfg.tau, w=cfg.w, k=cfg.depth,
                          exclude_self=queries_are_documents)


def retrieve(cfg: EvalConfig, retriever, name: str, queries: dict[str, str], warehouse: str) -> tuple:
    """The split's queries through the retriever (their proposals first, under a bar of their own), then the
    reranker when the variant has one: (programs in query order, qid -> {doc_id: score}, the expansion's summary,
    the reranker's, seconds from ranking to the end)."""
    from sira.pipelines.enrichment.rerank import rerank_run
    from sira.core.retriever import hits_by_query

    proposals = None
    if retriever.proposer is not None:
        with progress_bar("expand queries", total=len(queries), unit="queries") as advance:
            retriever.proposer.on_progress = advance
            proposals = retriever.proposer.propose(list(queries.values()))
    started = time.perf_counter()
    with progress_bar(f"{name} queries", total=len(queries), unit="queries") as advance:
        programs, results = retriever.run(queries, proposals=proposals, on_batch=lambda batch, *_: advance(len(batch)))
    run_hits = {q: {} for q in queries} | hits_by_query(results)
    expansion = None if proposals is None else {
        **retriever.proposer.summary, "phrases_proposed": sum(len(p.phrases) for p in proposals),
        "phrases_kept": sum(e.kept for p in programs for e in p.expansions)}
    rerank_summary = None
    if cfg.rerank is not None:
        with progress_bar("rerank judgments", total=None, unit="judgments") as advance:
            run_hits, rerank_summary = rerank_run(warehouse, queries, run_hits, cfg.rerank, on_progress=advance)
    return programs, run_hits, expansion, rerank_summary, time.perf_counter() - started


def _metrics(dataset, split: str, qrels: dict, warehouse: str, run_hits: dict) -> dict[str, float]:
    from sira.pipelines.tracking.runs import answer_coverage_of
    from sira.core.metrics import DEFAULT_METRICS, evaluate_run

    metrics = evaluate_run(qrels, run_hits, DEFAULT_METRICS)
    answers = dataset.answers(split)
    if answers:  # datasets that carry gold answers: does the answer string appear in the top-k passages?
        metrics.update(answer_coverage_of(warehouse, run_hits, answers))
    return metrics


def _run_name(cfg: EvalConfig, dataset_name: str, manifest: dict) -> str:
    """dataset-split-preset-variant, then what made the run differ from its peers: the enriched index version (the
    corpus-side proposer is part of it) and the query-side model, so runs of two proposers do not overwrite each
    other."""
    parts = [dataset_name, cfg.split, cfg.preset, cfg.variant]
    if cfg.enriched:
        parts.append(f"index{manifest['index_version']}")
    if cfg.expanded:
        parts.append(re.sub(r"[^A-Za-z0-9._-]+", "_", cfg.backend.model_id()))
    return "-".join(parts)
