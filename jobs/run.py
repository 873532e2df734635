"""`sira run`: one dataset through the whole pipeline, ingest -> index -> enrich -> enriched index -> expand and
evaluate the variants (sira.core.variants: bm25, doc, query, sira and the dense baselines dense, hybrid,
sira+dense), reusing whatever the warehouse already holds, tracked in MLflow (a parent run per invocation, a child
run per variant) and ending with a comparison table.

`sira+rerank` (an LLM judges sira's top-k) runs only when named in `variants` with a reranker; it is not a
single call, and the comparison table says so.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from pydantic import ConfigDict, Field, model_validator

from sira.jobs import enrich as enrich_job
from sira.jobs import eval as eval_job
from sira.jobs.options import PROPOSER, RERANK, RERANK_DEFAULTS, TRACKING
from sira.pipelines.tracking.console import console, progress_bar
from sira.pipelines.enrichment.corpus_enrichment import EnrichConfig, log_failures
from sira.pipelines.enrichment.backend_config import BackendConfig
from sira.pipelines.enrichment.rerank import RerankConfig, judge_beside_proposer
from sira.pipelines.tracking.stages import Stages
from sira.pipelines.tracking.tracking import Tracker, TrackingConfig
from sira.core.defaults import DATASET_HELP, EvaluationParams, default_warehouse
from sira.core.variants import RERANK_VARIANT, RUN_VARIANTS, VariantName, needs_embeddings, needs_enriched_index


# `sira run`'s options: the RunConfig fields it takes, and its own defaults (no --doc-backend: the query side's).
OPTIONS = ("dataset", "warehouse", "preset", "split", "variants", *PROPOSER, "doc_backend.backend", "tau", "w", "depth",
           "shards", "spark_master", "tracking.enabled", *TRACKING, *RERANK)
OPTION_DEFAULTS = {"doc_backend.backend": None, **RERANK_DEFAULTS}


class RunConfig(EvaluationParams):
    model_config = ConfigDict(extra="forbid")

    dataset: str = Field("beir:scifact", description=DATASET_HELP)
    warehouse: str | None = Field(None, description="default: warehouses/<dataset name>")
    split: str = "test"
    variants: list[VariantName] = Field(default_factory=lambda: list(RUN_VARIANTS))
    backend: BackendConfig = Field(default_factory=BackendConfig,
                                   description="query-side proposer")
    doc_backend: BackendConfig | None = Field(None, description="corpus-side proposer (default: the query side's)")
    task: str | None = None
    rerank: RerankConfig | None = Field(None, description="the LLM reranker of the sira+rerank variant (only when "
                                                          "that variant is named)")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    _judge = model_validator(mode="before")(judge_beside_proposer)

    @model_validator(mode="after")
    def _rerank_only_when_asked(self) -> "RunConfig":
        if RERANK_VARIANT in self.variants and self.rerank is None:
            raise ValueError(f"variant {RERANK_VARIANT} needs a reranker: --rerank-backend openai|local")
        if RERANK_VARIANT not in self.variants and self.rerank is not None:
            raise ValueError(f"a reranker is used only by variant {RERANK_VARIANT}: add it to --variants")
        return self

    def warehouse_path(self, dataset_name: str) -> str:
        return self.warehouse or default_warehouse(dataset_name)

    @property
    def corpus_backend(self) -> BackendConfig:
        return self.doc_backend or self.backend

    @property
    def enriched(self) -> bool:
        """Whether a variant needs the enriched index (sira+rerank reranks sira)."""
        return needs_enriched_index(self.variants)

    def command(self) -> str:
        """The command line that reproduces this run (options left at their defaults are omitted)."""
        from sira.jobs.options import command_line

        # The dataset always: a report lists these lines by dataset.
        return command_line(f"sira run --dataset {self.dataset}", self, OPTIONS[1:], OPTION_DEFAULTS)


def run(cfg: RunConfig, on_stage: Callable[[str], None] | None = None) -> dict:
    from sira.pipelines.enrichment.corpus_enrichment import enrichment_sample
    from sira.pipelines.enrichment.embeddings import embed_documents
    from sira.pipelines.index.freshness import ensure_index, fresh_or_build
    from sira.pipelines.tracking.evaluation import track_evaluation
    from sira.pipelines.tracking.report import comparison_markdown
    from sira.pipelines.tracking.run_plan import plan
    from sira.core.datasets import resolve_dataset

    dataset = resolve_dataset(cfg.dataset)
    warehouse = cfg.warehouse_path(dataset.name)
    stages, estimate = plan(cfg, dataset.name, warehouse)
    console.log(f"sira run {dataset.name}/{cfg.split} in {warehouse}: " + " -> ".join(stages)
                + f" (roughly {max(1, round(estimate / 60))} min on 2 cores)")
    tracker = Tracker(cfg.tracking)
    started = time.perf_counter()
    results: dict[str, dict] = {}
    stages = Stages(lambda name: console.rule(f"[bold]{name}"), on_stage)
    stage = stages.run

    with tracker.run(f"run {dataset.name}/{cfg.split}", params=cfg,
                     tags={"sira.job": "run", "sira.dataset": dataset.name, "sira.split": cfg.split,
                           "sira.command": cfg.command()}) as parent:
        plain = stage("index (plain)", lambda: ensure_index(cfg.dataset, warehouse, cfg.preset, cfg.shards,
                                                            cfg.spark_master, log=console.log, progress=progress_bar))
        # The index each variant searches: enrichment is asked for once, here, and its index handed to every variant.
        indexes = {False: plain}
        enrich_summary = None
        if cfg.enriched:
            enrich_summary = stage("enrich", lambda: enrich_job.run(EnrichConfig(
                warehouse=warehouse, backend=cfg.corpus_backend, task=cfg.task, preset=cfg.preset)))
            log_failures(enrich_summary, console.log, "the next run")
            tracker.metrics({k: enrich_summary[k] for k in ("documents", "enriched", "skipped", "errors",
                                                            "input_tokens", "output_tokens", "seconds",
                                                            "docs_per_second")}, prefix="enrich.")
            tracker.json_artifact(enrichment_sample(warehouse, enrich_summary), "enrichment_sample.json")
        if needs_embeddings(cfg.variants):  # the encoder's enrichment kept its vectors: only the rest are made
            embedded = stage("embed", lambda: embed_documents(warehouse, console.log, progress_bar,
                                                                  model=cfg.corpus_backend.encoder.model))
            tracker.metrics({k: embedded[k] for k in ("embedded", "skipped", "seconds")}, prefix="embed.")
        if cfg.enriched:
            indexes[True] = stage("index (enriched)", lambda: fresh_or_build(
                warehouse, cfg.preset, cfg.shards, cfg.spark_master, plain["docs_table_version"], cfg.tau,
                enrich_summary["model"], enrich_summary["prompt_version"], log=console.log))
        for variant in cfg.variants:
            ecfg = eval_job.EvalConfig(dataset=cfg.dataset, preset=cfg.preset, split=cfg.split, variant=variant,
                                       warehouse=warehouse, shards=cfg.shards, tau=cfg.tau, depth=cfg.depth,
                                       spark_master=cfg.spark_master, w=cfg.w, task=cfg.task, backend=cfg.backend,
                                       doc_backend=cfg.corpus_backend,
                                       rerank=cfg.rerank if variant == RERANK_VARIANT else None)
            with tracker.run(f"{dataset.name}/{variant}", params=ecfg, nested=True,
                             tags={"sira.dataset": dataset.name, "sira.variant": variant}) as child:
                summary = stage(f"evaluate {variant}", lambda: eval_job.run(ecfg, indexes[ecfg.enriched]))
                track_evaluation(tracker, summary)
                results[variant] = {**summary, "mlflow_run_id": child.id}
        report = comparison_markdown(dataset.name, cfg.split, results)
        seconds = time.perf_counter() - started
        tracker.metrics({"seconds": seconds})
        tracker.text_artifact(report, "report.md")
    out = {"dataset": dataset.name, "split": cfg.split, "warehouse": warehouse, "variants": results,
           "enrichment": enrich_summary, "stage_seconds": stages.seconds, "seconds": seconds,
           "mlflow_run_id": parent.id, "tracking_uri": cfg.tracking.resolved_uri() if cfg.tracking.enabled else None}
    Path(warehouse).mkdir(parents=True, exist_ok=True)
    (Path(warehouse) / f"run-{dataset.name}-{cfg.split}.md").write_text(report, encoding="utf-8")
    return out
