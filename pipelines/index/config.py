"""`sira index`'s config (IndexConfig) and the segment policy of a build: how many segments and dead documents a
version may hold before a build merges. Light (no Spark), so the command line and a job's config load without it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from sira.core.defaults import DFFilterParams, IndexBuildParams


class SegmentPolicy(BaseModel):
    """How many segments and dead documents a version may hold before a build merges segments into its new one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_segments: int = Field(16, ge=1, description="a build that would leave more segments merges the small ones "
                                                    "into its new segment")
    merge_below_fraction: float = Field(0.1, ge=0, le=1, description="... small: fewer live documents than this "
                                                                     "share of the version's (a night's segments, "
                                                                     "not the big one a full build wrote)")
    max_dead_fraction: float = Field(0.25, ge=0, le=1, description="a build that would leave more tombstoned "
                                     "documents than this share of those in its segments merges every segment")
    max_term_stats_versions: int = Field(8, ge=1, description="an incremental build writes only the term statistics "
                                         "that changed, as one more version its readers add up (sira.core.tables."
                                         "TERM_STATS_SCHEMA), up to this many; then whole again")


class IndexConfig(DFFilterParams, IndexBuildParams):
    model_config = ConfigDict(extra="forbid")

    warehouse: str
    enrichment: bool | None = Field(
        None, description="inject enrichment phrases; None: when the warehouse has an enrichment table")
    enrichment_model: str | None = None
    enrichment_prompt_version: str | None = None
    full: bool = Field(False, description="one segment with every document (from the kept analysis) instead of a "
                                          "new segment on top of the newest version of the same kind")
    segments: SegmentPolicy = Field(default_factory=SegmentPolicy)
