"""`sira nightly`: bring a warehouse up to date with a new snapshot of its corpus, incrementally.

    ingest (MERGE by doc id + content hash) -> [plain index: the encoder's vocabulary] -> enrich only new or
    changed documents -> build and publish the enriched index -> expire index versions past the retention window

Each index build is incremental (sira.pipelines.index): only new or changed documents are analysed, and they
enter a new segment on top of the last version. `--no-enrichment` publishes the plain index only.

Publishing is atomic (a version becomes visible when its corpus_stats row lands, see sira.pipelines.index.build.publish), so a
running `sira serve` that follows the newest version switches without ever reading a half-written one. Every step
is idempotent: a failed or killed night is rerun as is; finished work (the docs MERGE, committed enrichment
chunks, a published index) is found and not redone. One MLflow parent run per night, a child run per step.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Callable

from pydantic import ConfigDict, Field

from sira.jobs import enrich as enrich_job
from sira.jobs import ingest as ingest_job
from sira.pipelines.tracking.console import console, progress_bar
from sira.pipelines.enrichment.corpus_enrichment import EnrichConfig, log_failures
from sira.pipelines.storage.ingest import IngestConfig
from sira.pipelines.enrichment.backend_config import BackendConfig
from sira.pipelines.enrichment.ray_enrich import COMMIT_EVERY
from sira.pipelines.tracking.stages import Stages
from sira.pipelines.tracking.tracking import Tracker, TrackingConfig
from sira.core.defaults import DFFilterParams, IndexBuildParams


class NightlyConfig(DFFilterParams, IndexBuildParams):
    model_config = ConfigDict(extra="forbid")

    warehouse: str
    source: str = Field(description="the corpus snapshot: beir:NAME, a BEIR folder, a .jsonl[.gz] or .parquet file")
    backend: BackendConfig = Field(default_factory=BackendConfig,
                                   description="corpus-side proposer")
    enrichment: bool = Field(True, description="enrich new or changed documents and publish the enriched index; "
                                               "False: publish the plain index only")
    task: str | None = Field(None, description="prompt task, recorded for the warehouse; default: the one recorded at ingest")
    ray_address: str | None = None
    keep_days: float = Field(7.0, ge=0, description="index versions older than this are deleted (the newest of "
                                                    "each kind is always kept)")
    commit_every: int = Field(COMMIT_EVERY, gt=0, description="most enrichment rows per Delta commit")
    max_delete_fraction: float = Field(0.5, ge=0, le=1, description="refuse a snapshot that deletes more than this "
                                                                    "share of the docs (a truncated file); 1: no limit")
    embeddings: bool | None = Field(None, description="keep document vectors (the dense variants): None: the ones "
                                                      "the encoder proposer makes as it enriches; True: also embed "
                                                      "the night's other new or changed documents; False: none")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)


def run(cfg: NightlyConfig, on_step: Callable[[str], None] | None = None) -> dict:
    from pyspark.sql import SparkSession

    from sira.pipelines.storage.spark_session import start_in_background, stop_started

    plain_first = cfg.backend.backend == "encoder" or not cfg.enrichment  # the encoder proposes from a plain index
    # The plain index step's Spark session starts while ingest runs (a caller's active session is used as is).
    session = start_in_background(cfg.spark_master, "sira-index") \
        if plain_first and SparkSession.getActiveSession() is None else None
    try:
        return _run(cfg, on_step, session)
    finally:
        stop_started(session)  # idempotent: stopped after the plain index already, unless a step failed first


def _run(cfg: NightlyConfig, on_step: Callable[[str], None] | None, session) -> dict:
    from pyspark.sql import SparkSession

    from sira.pipelines.enrichment.embeddings import embed_documents
    from sira.pipelines.enrichment.ray_enrich import ray_is_up, stop_ray
    from sira.pipelines.index.freshness import fresh_or_build
    from sira.pipelines.index.retention import expire_versions
    from sira.pipelines.storage.spark_session import start_in_background, stop_started

    tracker = Tracker(cfg.tracking, defer=True)  # MLflow loads once ingest is done (below)
    started = time.perf_counter()
    stages = Stages(lambda name: console.rule(f"[bold]nightly: {name}"), on_step)
    step = partial(stages.tracked, tracker, tags={"sira.job": "nightly"})

    with tracker.run(f"nightly {cfg.warehouse}", params=cfg,
                     tags={"sira.job": "nightly", "sira.warehouse": cfg.warehouse}) as parent:
        ingest = step("ingest", lambda: ingest_job.run(IngestConfig(
            source=cfg.source, warehouse=cfg.warehouse, mode="merge", max_delete_fraction=cfg.max_delete_fraction,
            task=cfg.task)),
            lambda s: {**s["changes"], "read": s["read"], "rejected": s["rejected"]})
        tracker.connect()  # from here the driver's Python mostly waits on the JVM: MLflow loads beside it
        changes = ingest["changes"]
        console.log(f"ingest: {changes['inserted']} inserted, {changes['updated']} updated, {changes['deleted']} "
                    f"deleted, {changes['unchanged']} unchanged, {ingest['rejected']} rejected")
        docs_version = ingest["docs_table_version"]
        if cfg.backend.backend == "encoder" or not cfg.enrichment:  # the encoder proposes from a plain index's terms
            manifest = step("index (plain)", lambda: fresh_or_build(
                cfg.warehouse, cfg.preset, cfg.shards, cfg.spark_master, docs_version, log=console.log,
                spark=session.result() if session is not None else None),
                            lambda m: {"index_version": m["index_version"]})
            stop_started(session)  # its JVM's memory goes back before the enrichment's workers start
        enrich = {"enriched": 0, "errors": 0}
        if cfg.enrichment:
            # A model behind a server (openai, vllm) leaves these cores to the enriched index step's Spark session,
            # which starts beside the enrichment; a local model's computes here, and its index starts after.
            later = start_in_background(cfg.spark_master, "sira-index") \
                if cfg.backend.backend in ("openai", "vllm") and SparkSession.getActiveSession() is None else None
            ray_was_up = ray_is_up()
            try:
                enrich = step("enrich", lambda: enrich_job.run(EnrichConfig(
                    warehouse=cfg.warehouse, backend=cfg.backend, task=cfg.task, preset=cfg.preset,
                    commit_every=cfg.commit_every, ray_address=cfg.ray_address, embeddings=cfg.embeddings is not False)),
                    lambda s: {k: s[k] for k in ("documents", "enriched", "skipped", "errors", "input_tokens",
                                                 "output_tokens", "docs_per_second")})
                log_failures(enrich, console.log, "the next night")
                if cfg.embeddings:  # the encoder's enrichment kept the night's vectors: only the rest are made
                    step("embed", lambda: embed_documents(cfg.warehouse, console.log, progress_bar,
                                                          ray_address=cfg.ray_address, model=cfg.backend.encoder.model),
                         lambda s: {k: s[k] for k in ("embedded", "skipped", "docs_per_second")})
                if not ray_was_up:
                    # Ray's idle workers and Ray Data's stats actor outlive the enrichment (1.6 and 1.0 GB at 5M
                    # documents) while the index step's Spark needs the memory; a Ray that was up before is left.
                    stop_ray()
                manifest = step("index (enriched)", lambda: fresh_or_build(
                    cfg.warehouse, cfg.preset, cfg.shards, cfg.spark_master, docs_version, cfg.tau, enrich["model"],
                    enrich["prompt_version"], log=console.log, spark=later.result() if later is not None else None),
                                lambda m: {"index_version": m["index_version"], "num_docs": m["num_docs"]})
            finally:
                stop_started(later)
        retention = step("retention", lambda: expire_versions(cfg.warehouse, cfg.keep_days),
                         lambda r: {"expired": len(r["expired_versions"]), "kept": len(r["kept_versions"]),
                                    "vacuumed_files": r["vacuumed_files"]})
        total = time.perf_counter() - started
        tracker.metrics({"seconds": total, "index_version": manifest["index_version"],
                         **{f"ingested.{k}": v for k, v in changes.items()}, "enriched": enrich["enriched"]})
    return {"ingested": changes, "enriched": enrich["enriched"], "index_version": manifest["index_version"],
            "rejected": ingest["rejected"], "enrichment_errors": enrich["errors"], "docs_table_version": docs_version,
            "expired_versions": retention["expired_versions"], "kept_versions": retention["kept_versions"],
            "step_seconds": stages.seconds, "seconds": total, "mlflow_run_id": parent.id}
