"""A split's queries through a Retriever and scored against its judgments, as `sira eval` (and so `sira run` and
`sira sweep`) does it: the proposals first (under a bar of their own), the ranking, then the LLM reranker when the
variant has one; the metrics, with answer coverage on datasets that carry gold answers; the run's file name. Its
config, EvalConfig, is `sira eval`'s; CompareConfig is `sira compare`'s (two runs of a split, sira.pipelines.tracking.
runs.compare_run_files)."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sira.core.defaults import DATASET_HELP, PAIRED_PERMUTATIONS, EvaluationParams, default_warehouse
from sira.core.variants import BASELINE_VARIANT, RERANK_VARIANT, VariantName, help_text, variant
from sira.pipelines.enrichment.backend_config import BackendConfig
from sira.pipelines.enrichment.rerank import RerankConfig, judge_beside_proposer
from sira.pipelines.tracking.console import console, progress_bar


class EvalConfig(EvaluationParams):
    model_config = ConfigDict(extra="forbid")

    dataset: str = Field(description=DATASET_HELP)
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

    _judge = model_validator(mode="before")(judge_beside_proposer)

    @model_validator(mode="after")
    def _rerank_only_with_its_variant(self) -> "EvalConfig":
        if self.variant == RERANK_VARIANT and self.rerank is None:
            raise ValueError(f"variant {RERANK_VARIANT} needs a reranker: --rerank-backend openai|local")
        if self.variant != RERANK_VARIANT and self.rerank is not None:
            raise ValueError(f"rerank settings apply only to variant {RERANK_VARIANT}, not {self.variant}")
        return self

    @property
    def first_stage(self) -> str | None:
        """The single-call variant that retrieves (sira+rerank reranks what sira retrieves, hybrid fuses bm25)."""
        return variant(self.variant).first_stage

    @property
    def dense(self) -> bool:
        return variant(self.variant).dense

    @property
    def dense_encoder(self) -> str:
        """The encoder of the dense variants: the corpus-side encoder proposer's (its enrichment keeps them)."""
        return (self.doc_backend or self.backend).encoder.model

    @property
    def enriched(self) -> bool:
        return variant(self.variant).enriched_index

    @property
    def expanded(self) -> bool:
        return variant(self.variant).expanded_queries

    def warehouse_path(self, dataset_name: str) -> str:
        return self.warehouse or default_warehouse(dataset_name)


class CompareConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_run: Path = Field(description="TREC run of the baseline (e.g. the bm25 variant's run_file)")
    run_file: Path = Field(description="TREC run compared with it")
    dataset: str = Field(description=DATASET_HELP)
    split: str = "test"
    metric: str = Field("ndcg@10", description="a ranx metric")
    permutations: int = Field(PAIRED_PERMUTATIONS, ge=100, description="random sign swaps of the paired "
                                                                       "randomization test")
    seed: int = 0
    plot: Path | None = Field(None, description="also write a PNG of the sorted per-query differences")


@dataclass
class SplitRun:
    programs: list  # in query order
    run_hits: dict[str, dict[str, float]]  # qid -> {doc_id: score}, every query (an empty dict: no hit)
    expansion: dict | None  # the proposer's counters and how many proposed phrases the DF filter kept
    rerank: dict | None  # the reranker's counters
    seconds: float  # from ranking to the end (proposals not counted)


def open_variant(cfg: EvalConfig, warehouse: str, manifest: dict | None, queries_are_documents: bool):
    """The variant's BM25 retriever (with its proposer) and dense retriever, each None when it has no such part, and
    the index they search (built first when `manifest` is None and the warehouse lacks it; its documents embedded
    when the variant is dense)."""
    from sira.pipelines.index.freshness import ensure_index
    from sira.pipelines.serving.retrievers import CachedBatchProposer, open_retriever

    given = manifest is not None
    if manifest is None:
        manifest = ensure_index(cfg.dataset, warehouse, cfg.preset, cfg.shards, cfg.spark_master,
                                enriched=cfg.enriched, tau=cfg.tau, doc_backend=cfg.doc_backend, task=cfg.task,
                                log=console.log, progress=progress_bar)
    retriever = dense = None
    if cfg.first_stage is not None:
        proposer = (lambda m: CachedBatchProposer(warehouse, cfg.backend, cfg.task, m, cfg.ray_address)) \
            if cfg.expanded else None
        # A dataset whose queries are documents: a query's own document is never among its hits.
        retriever, _ = open_retriever(warehouse, manifest=manifest, proposer=proposer, tau=cfg.tau, w=cfg.w,
                                      k=cfg.depth, exclude_self=queries_are_documents)
    if cfg.dense:
        from sira.pipelines.enrichment.embeddings import embed_documents
        from sira.pipelines.serving.dense_retriever import open_dense

        if not given:  # a composite job that hands over the index has embedded in a stage of its own
            embed_documents(warehouse, console.log, progress_bar, ray_address=cfg.ray_address,
                            model=cfg.dense_encoder)
        dense = open_dense(warehouse, manifest, cfg.depth, exclude_self=queries_are_documents, model=cfg.dense_encoder)
    return retriever, dense, manifest


def run_split(retriever, name: str, queries: dict[str, str], warehouse: str, rerank=None, dense=None) -> SplitRun:
    """`queries` (qid -> text) through `retriever` (a BM25 Retriever; None: none), through `dense` (a
    DenseRetriever; fused with the BM25 ranking by reciprocal rank when both), then through `rerank` (a
    RerankConfig) when given."""
    programs, run_hits, expansion = [], None, None
    started = time.perf_counter()
    if retriever is not None:
        programs, run_hits, expansion, started = _lexical(retriever, name, queries)
    if dense is not None:
        with progress_bar(f"{name} queries (dense)", total=len(queries), unit="queries") as advance:
            dense_hits = dense.run(queries, on_batch=lambda batch: advance(len(batch)))
        if run_hits is None:
            run_hits = dense_hits
        else:
            from sira.core.dense import reciprocal_rank_fusion

            run_hits = reciprocal_rank_fusion([run_hits, dense_hits], depth=retriever.k)
    rerank_summary = None
    if rerank is not None:
        from sira.pipelines.enrichment.rerank import rerank_run

        with progress_bar("rerank judgments", total=None, unit="judgments") as advance:
            run_hits, rerank_summary = rerank_run(warehouse, queries, run_hits, rerank, on_progress=advance)
    return SplitRun(programs, run_hits, expansion, rerank_summary, time.perf_counter() - started)


def _lexical(retriever, name: str, queries: dict[str, str]) -> tuple:
    """The BM25 part: the proposals first (under a bar of their own), then the ranking; (programs, run hits, the
    expansion's summary, when the ranking started)."""
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
    return programs, run_hits, expansion, started


def split_metrics(dataset, split: str, qrels: dict, warehouse: str, run_hits: dict) -> dict[str, float]:
    from sira.core.metrics import DEFAULT_METRICS, evaluate_run
    from sira.pipelines.tracking.runs import answer_coverage_of

    metrics = evaluate_run(qrels, run_hits, DEFAULT_METRICS)
    answers = dataset.answers(split)
    if answers:  # does the answer string appear in the top-k passages?
        metrics.update(answer_coverage_of(warehouse, run_hits, answers))
    return metrics


def run_name(dataset_name: str, split: str, preset: str, variant: str, enriched_version: int | None,
             query_model: str | None, dense_encoder: str | None = None) -> str:
    """dataset-split-preset-variant, then what made the run differ from its peers: the enriched index version (the
    corpus-side proposer is part of it), the query-side model and a dense variant's encoder (unless the default),
    so runs of two proposers or encoders do not overwrite each other."""
    from sira.core.proposers import DEFAULT_ENCODER

    parts = [dataset_name, split, preset, variant]
    if enriched_version is not None:
        parts.append(f"index{enriched_version}")
    if query_model is not None:
        parts.append(re.sub(r"[^A-Za-z0-9._-]+", "_", query_model))
    if dense_encoder and dense_encoder != DEFAULT_ENCODER and dense_encoder not in (query_model or ""):
        parts.append(dense_encoder)
    return "-".join(parts)


def track_evaluation(tracker, summary: dict) -> None:
    """An evaluation's summary in its tracked run: the metrics, the speed, the proposer's and reranker's counters,
    the TREC run and the programs."""
    tracker.metrics({**summary["metrics"], "queries_per_second": summary.get("queries_per_second")})
    for part, keys in (("expansion", ("expanded", "cached", "errors", "input_tokens", "output_tokens",
                                      "phrases_proposed", "phrases_kept")),
                       ("rerank", ("judged", "cached", "errors", "input_tokens", "output_tokens", "seconds",
                                   "judgments_per_second"))):
        if summary.get(part):
            tracker.metrics({k: summary[part].get(k) for k in keys}, prefix=f"{part}.")
    tracker.artifact(summary["run_file"], "runs")
    tracker.artifact(summary["programs_file"], "programs")
