"""`sira run`: one dataset through the whole pipeline, ingest -> index -> enrich -> enriched index -> expand and
evaluate the single-call variants (sira.core.variants: bm25, doc, query, sira), reusing whatever the warehouse already holds, tracked in
MLflow (a parent run per invocation, a child run per variant) and ending with a comparison table.

`sira+rerank` (an LLM judges sira's top-k) runs only when named in `variants` with a reranker; it is not a
single call, and the comparison table says so.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from pydantic import ConfigDict, Field, model_validator

from sira.jobs import enrich as enrich_job
from sira.jobs import eval as eval_job
from sira.pipelines.tracking.console import console, progress_bar
from sira.pipelines.enrichment.corpus_enrichment import EnrichConfig, log_failures
from sira.pipelines.enrichment.backend_config import BackendConfig
from sira.pipelines.enrichment.rerank import RerankConfig
from sira.pipelines.tracking.stages import Stages
from sira.pipelines.tracking.tracking import Tracker, TrackingConfig
from sira.core.defaults import EvaluationParams, default_warehouse
from sira.core.variants import (RERANK_VARIANT, SINGLE_CALL_VARIANTS, VariantName, needs_enriched_index,
                                 needs_expanded_queries)


# Rough rates measured on the 2-core reference machine, used only for the up-front time estimate.
_SECONDS_PER_INDEX_BUILD = 75.0
# encoder: one actor per core on scifact's 5,183 docs and its 100,419 vocabulary entries.
_DOCS_PER_SECOND = {"encoder": 9.5, "local": 0.25, "openai": 5.0, "vllm": 50.0}
_VOCABULARY_ENTRIES_PER_SECOND = 450.0
_VOCABULARY_ENTRIES_PER_DOC = 20  # scifact's bigram vocabulary: 100,419 entries for 5,183 docs
# local: 10 scifact judgments by the packaged Gemma 3 270M on a busy machine; openai: the enrichment guess.
_JUDGMENTS_PER_SECOND = {"local": 0.12, "openai": 5.0}
# Query expansions per second (scifact-length queries); local: measured on scifact test, 2 cores, 2 engines.
_QUERIES_PER_SECOND = {"encoder": 20.0, "local": 0.5, "openai": 5.0, "vllm": 50.0}


class RunConfig(EvaluationParams):
    model_config = ConfigDict(extra="forbid")

    dataset: str = Field("beir:scifact", description="beir:NAME or a folder in BEIR format")
    warehouse: str | None = Field(None, description="default: warehouses/<dataset name>")
    split: str = "test"
    variants: list[VariantName] = Field(default_factory=lambda: list(SINGLE_CALL_VARIANTS))
    backend: BackendConfig = Field(default_factory=BackendConfig,
                                   description="query-side proposer")
    doc_backend: BackendConfig | None = Field(None, description="corpus-side proposer (default: the query side's)")
    task: str | None = None
    rerank: RerankConfig | None = Field(None, description="the LLM reranker of the sira+rerank variant (only when "
                                                          "that variant is named)")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

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
        parts = ["sira run", f"--dataset {self.dataset}"]
        default = RunConfig()
        for name, flag in (("warehouse", "--warehouse"), ("preset", "--preset"), ("split", "--split"),
                           ("tau", "--tau"), ("w", "--expansion-weight"), ("shards", "--shards")):
            if getattr(self, name) != getattr(default, name):
                parts.append(f"{flag} {getattr(self, name)}")
        if self.variants != default.variants:
            parts.append("--variants " + ",".join(self.variants))
        if self.backend != default.backend:
            parts.append(f"--backend {self.backend.backend}")
            if self.backend.model:
                parts.append(f"--model {self.backend.model}")
        if self.doc_backend is not None:
            parts.append(f"--doc-backend {self.doc_backend.backend}")
        if self.rerank is not None:
            parts.append(f"--rerank-backend {self.rerank.backend.backend}")
            if self.rerank.backend.model:
                parts.append(f"--rerank-model {self.rerank.backend.model}")
            if self.rerank.depth != RerankConfig().depth:
                parts.append(f"--rerank-depth {self.rerank.depth}")
        return " ".join(parts)


def plan(cfg: RunConfig, dataset_name: str, warehouse: str) -> tuple[list[str], float]:
    """The stages this invocation will run (work already in the warehouse is skipped) and a rough duration."""
    from sira.pipelines.index.freshness import fresh_index
    from sira.pipelines.storage.delta_io import table_version
    from sira.pipelines.enrichment.ray_enrich import docs_to_enrich
    from sira.core import tables
    from sira.core.enrichment import load_template, task_for_dataset

    stages, seconds = [], 10.0
    docs_version = table_version(tables.table_uri(warehouse, tables.DOCS))
    if docs_version is None:
        stages.append(f"ingest {cfg.dataset}")
        seconds += 15
    if docs_version is None or fresh_index(warehouse, cfg.preset, docs_version)[0] is None:
        stages.append("index (plain)")
        seconds += _SECONDS_PER_INDEX_BUILD
    if cfg.enriched:
        backend = cfg.corpus_backend
        version = backend.proposal_version(load_template("doc", cfg.task or task_for_dataset(dataset_name)).version)
        if docs_version is None:
            todo = _corpus_size(cfg.dataset)
        else:
            todo = docs_to_enrich(warehouse, backend.model_id(), version)[0].num_rows
        if todo:
            stages.append(f"enrich {todo} documents ({backend.backend})")
            seconds += todo / _DOCS_PER_SECOND.get(backend.backend, 1.0)
            if backend.backend == "encoder":
                seconds += todo * _VOCABULARY_ENTRIES_PER_DOC / _VOCABULARY_ENTRIES_PER_SECOND  # a first vocabulary
        if todo or fresh_index(warehouse, cfg.preset, docs_version, cfg.tau, backend.model_id(), version)[0] is None:
            stages.append("index (enriched)")
            seconds += _SECONDS_PER_INDEX_BUILD
    if needs_expanded_queries(cfg.variants):
        todo = _queries_to_expand(cfg, dataset_name, warehouse)
        if todo:
            stages.append(f"expand {todo} queries ({cfg.backend.backend})")
            seconds += todo / _QUERIES_PER_SECOND.get(cfg.backend.backend, 1.0)
    if cfg.rerank is not None:
        from sira.core.datasets import resolve_dataset

        judgments = len(resolve_dataset(cfg.dataset).queries(cfg.split)) * cfg.rerank.depth
        stages.append(f"rerank: up to {judgments} judgments ({cfg.rerank.backend.backend})")
        seconds += judgments / _JUDGMENTS_PER_SECOND[cfg.rerank.backend.backend]
    stages.append("evaluate " + ", ".join(cfg.variants))
    seconds += 15 * len(cfg.variants)
    return stages, seconds


def _queries_to_expand(cfg: RunConfig, dataset_name: str, warehouse: str) -> int:
    """Queries of the split whose expansion is not cached yet (for this query-side proposer and prompt)."""
    from sira.pipelines.enrichment.expansion_cache import cached_expansions, query_hash
    from sira.core.datasets import DatasetNotFound, resolve_dataset
    from sira.core.enrichment import load_template, task_for_dataset

    try:
        texts = {query_hash(text) for text in resolve_dataset(cfg.dataset).queries(cfg.split).values()}
    except (DatasetNotFound, ValueError):
        return 0  # a bad split is reported by the stage that evaluates it, under its name; this is an estimate
    template = load_template("query", cfg.task or task_for_dataset(dataset_name))
    cached = cached_expansions(warehouse, cfg.backend.model_id(), cfg.backend.proposal_version(template.version))
    return len(texts - set(cached))


def _corpus_size(spec: str) -> int:
    from sira.core.datasets import iter_lines, resolve_dataset

    return sum(1 for _ in iter_lines(resolve_dataset(spec).corpus_path))


def run(cfg: RunConfig, on_stage: Callable[[str], None] | None = None) -> dict:
    from sira.pipelines.index.freshness import ensure_index, fresh_or_build
    from sira.pipelines.tracking.report import comparison_markdown
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
            tracker.json_artifact(_enrichment_sample(warehouse, enrich_summary), "enrichment_sample.json")
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
                tracker.metrics(summary["metrics"])
                tracker.metrics({"queries_per_second": summary.get("queries_per_second")})
                if summary.get("expansion"):
                    exp = summary["expansion"]
                    tracker.metrics({k: exp.get(k) for k in ("expanded", "cached", "errors", "input_tokens",
                                                             "output_tokens", "phrases_proposed", "phrases_kept")},
                                    prefix="expansion.")
                if summary.get("rerank"):
                    rr = summary["rerank"]
                    tracker.metrics({k: rr.get(k) for k in ("judged", "cached", "errors", "input_tokens",
                                                            "output_tokens", "seconds", "judgments_per_second")},
                                    prefix="rerank.")
                tracker.artifact(summary["run_file"], "runs")
                tracker.artifact(summary["programs_file"], "programs")
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


def _enrichment_sample(warehouse: str, summary: dict, n: int = 50) -> list[dict]:
    import pyarrow.compute as pc

    from sira.pipelines.storage.delta_io import read_table
    from sira.core import tables

    t = read_table(tables.table_uri(warehouse, tables.ENRICHMENT))
    t = t.select([c for c in ("doc_id", "model", "prompt_version", "phrases", "weights", "error") if c in t.schema.names])
    t = t.filter(pc.and_(pc.equal(t["model"], summary["model"]), pc.equal(t["prompt_version"], summary["prompt_version"])))
    return json.loads(json.dumps(t.sort_by("doc_id").slice(0, n).to_pylist(), default=str))
