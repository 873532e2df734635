"""`sira index`: the Spark job that builds and publishes one index version from the docs table
(and, unless left out, the corpus-side enrichment)."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from sira.pipelines.tracking.console import console
from sira.core.defaults import DFFilterParams, IndexBuildParams


class IndexConfig(DFFilterParams, IndexBuildParams):
    model_config = ConfigDict(extra="forbid")

    warehouse: str
    enrichment: bool | None = Field(
        None, description="inject enrichment phrases; None: when the warehouse has an enrichment table")
    enrichment_model: str | None = None
    enrichment_prompt_version: str | None = None
    full: bool = Field(False, description="one segment with every document (from the kept analysis) instead of a "
                                          "new segment on top of the newest version of the same kind")
    max_segments: int = Field(16, ge=1, description="a build that would leave more segments merges the small ones "
                                                    "into its new segment")
    merge_below_fraction: float = Field(0.1, ge=0, le=1, description="... small: fewer live documents than this "
                                                                     "share of the version's")
    max_dead_fraction: float = Field(0.25, ge=0, le=1, description="a build that would leave more tombstoned "
                                     "documents than this share of those in its segments merges every segment")
    max_term_stats_versions: int = Field(8, ge=1, description="an incremental build writes only the term statistics "
                                         "that changed, as one more version its readers add up, up to this many")


def run(cfg: IndexConfig, spark=None) -> dict:
    from sira.pipelines.storage.delta_io import table_exists
    from sira.pipelines.index.build import build_in_session
    from sira.pipelines.index.context import EnrichmentChoice, SegmentPolicy
    from sira.core import tables

    use_enrichment = cfg.enrichment
    if use_enrichment is None:
        use_enrichment = table_exists(tables.table_uri(cfg.warehouse, tables.ENRICHMENT))
    choice = EnrichmentChoice(cfg.tau, cfg.enrichment_model, cfg.enrichment_prompt_version) if use_enrichment else None
    policy = SegmentPolicy(max_segments=cfg.max_segments, max_dead_fraction=cfg.max_dead_fraction,
                           merge_below_fraction=cfg.merge_below_fraction,
                           max_term_stats_versions=cfg.max_term_stats_versions)
    return build_in_session(cfg.warehouse, cfg.preset, cfg.shards, cfg.spark_master, choice, cfg.full, policy,
                            console.log, spark)
