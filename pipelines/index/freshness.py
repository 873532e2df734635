"""Index freshness: find the newest index that matches the warehouse's current docs (and enrichment) tables, and
build what is missing or stale. `sira eval` ingests, enriches and indexes through `ensure_index`; the composite
jobs (`sira run`, `sira nightly`), which enrich as a step of their own, through `fresh_or_build`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from sira.pipelines.storage.delta_io import table_version
from sira.pipelines.storage.ingest import IngestConfig, Progress, ingest
from sira.pipelines.enrichment.backend_config import BackendConfig
from sira.pipelines.index.catalog import IndexNotFound, find_index
from sira.core import tables
from sira.core.defaults import DEFAULT_TAU

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def ensure_index(dataset_spec: str, warehouse: str, preset: str, shards: int, spark_master: str,
                 enriched: bool = False, tau: float = DEFAULT_TAU, doc_backend: BackendConfig | None = None,
                 task: str | None = None, *, log: Callable[[str], None], progress: Progress) -> dict:
    """The newest index of `preset` built from the current docs (and enrichment) tables; ingests, enriches
    (incrementally, with `doc_backend`) and indexes what is missing or stale."""
    from sira.pipelines.enrichment.corpus_enrichment import EnrichConfig, enrich_corpus, log_failures

    docs_version = table_version(tables.table_uri(warehouse, tables.DOCS))
    if docs_version is None:
        log(f"warehouse {warehouse} has no docs table: ingesting {dataset_spec}")
        summary = ingest(IngestConfig(source=dataset_spec, warehouse=warehouse), progress)
        log(f"ingest: read {summary['read']}, kept {summary['kept']}, rejected {summary['rejected']}")
        docs_version = summary["docs_table_version"]
    if not enriched:
        return fresh_or_build(warehouse, preset, shards, spark_master, docs_version, log=log)
    if doc_backend is None:
        if table_version(tables.table_uri(warehouse, tables.ENRICHMENT)) is not None:
            # No proposer named: index the warehouse's enrichment as it stands (each doc's newest proposal).
            return fresh_or_build(warehouse, preset, shards, spark_master, docs_version, tau, any_model=True, log=log)
        doc_backend = BackendConfig()  # nothing enriched yet: the CPU default proposer
    if doc_backend.backend == "encoder":  # it proposes from a plain index's vocabulary
        fresh_or_build(warehouse, preset, shards, spark_master, docs_version, log=log)
    enrich_summary = enrich_corpus(EnrichConfig(warehouse=warehouse, backend=doc_backend, task=task, preset=preset),
                                   log, progress)
    log_failures(enrich_summary, log, "the next run")
    return fresh_or_build(warehouse, preset, shards, spark_master, docs_version, tau,
                          enrich_summary["model"], enrich_summary["prompt_version"], log=log)


def fresh_index(warehouse: str, preset: str, docs_version: int | None, tau: float | None = None,
                model: str | None = None, prompt_version: str | None = None,
                any_model: bool = False) -> tuple[dict | None, str]:
    """The newest index of `preset` built from docs table version `docs_version` (and, when `model` is given or
    `any_model`, from the current enrichment table, that model and prompt, and tau), or None and why there is
    none: the one decision of whether an index is fresh, for the jobs that build and for `sira run`'s plan."""
    enriched = model is not None or any_model
    try:
        manifest = find_index(warehouse, preset=preset, enriched=enriched)
    except IndexNotFound:
        return None, f"no {preset} index {'with' if enriched else 'without'} enrichment in {warehouse}"
    enrichment_version = table_version(tables.table_uri(warehouse, tables.ENRICHMENT)) if enriched else None
    fresh = manifest["docs_table_version"] == docs_version and (not enriched or (
        manifest["enrichment_table_version"] == enrichment_version and manifest["tau"] == tau
        and (any_model or (manifest.get("enrichment_model") == model
                           and manifest.get("enrichment_prompt_version") == prompt_version))))
    if fresh:
        return manifest, "fresh"
    return None, f"index v{manifest['index_version']} is stale (built from other docs/enrichment versions or tau)"


def fresh_or_build(warehouse: str, preset: str, shards: int, spark_master: str, docs_version: int,
                   tau: float | None = None, model: str | None = None, prompt_version: str | None = None,
                   any_model: bool = False, *, log: Callable[[str], None], spark: SparkSession | None = None) -> dict:
    """The newest index of `preset` matching the current docs (and, when `model` is given or `any_model`, the
    current enrichment table, that model and prompt, and tau); built when there is none, in `spark` when given (the
    caller's to stop) or in a session of its own."""
    from sira.pipelines.index.build import build_in_session
    from sira.pipelines.index.context import EnrichmentChoice

    enriched = model is not None or any_model
    manifest, why = fresh_index(warehouse, preset, docs_version, tau, model, prompt_version, any_model)
    if manifest is not None:
        return manifest
    log(f"{why}: building one")
    build_in_session(warehouse, preset, shards, spark_master,
                     EnrichmentChoice(tau, model, prompt_version) if enriched else None, log=log, spark=spark)
    return find_index(warehouse, preset=preset, enriched=enriched)
