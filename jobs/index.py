"""`sira index`: the Spark job that builds and publishes one index version from the docs table
(and, unless left out, the corpus-side enrichment). Its config is in sira.pipelines.index.config."""

from __future__ import annotations

from sira.pipelines.index.config import IndexConfig
from sira.pipelines.tracking.console import console


def run(cfg: IndexConfig, spark=None) -> dict:
    from sira.pipelines.storage.delta_io import table_exists
    from sira.pipelines.index.build import build_in_session
    from sira.pipelines.index.context import EnrichmentChoice
    from sira.core import tables

    use_enrichment = cfg.enrichment
    if use_enrichment is None:
        use_enrichment = table_exists(tables.table_uri(cfg.warehouse, tables.ENRICHMENT))
    choice = EnrichmentChoice(cfg.tau, cfg.enrichment_model, cfg.enrichment_prompt_version) if use_enrichment else None
    return build_in_session(cfg.warehouse, cfg.preset, cfg.shards, cfg.spark_master, choice, cfg.full, cfg.segments,
                            console.log, spark)
