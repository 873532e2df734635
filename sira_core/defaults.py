"""The one home of the parameters and defaults that several jobs share. A job's config holds the parameter groups
below (it subclasses them instead of restating their fields), the CLI builds its shared options from the same
descriptions, and the library reads the constants. A proposer's expansion weight is the proposer's own
(sira.core.proposers), not listed here."""

from __future__ import annotations

from pydantic import BaseModel, Field

# The DF filter on both sides: a phrase is kept when its rarest term occurs in at most TAU * |C| documents. The
# corpus side (index) and the query side (search, eval, query, serve) take the same default.
DEFAULT_TAU = 0.05
TAU_HELP = ("document-frequency filter: a proposed phrase is kept only when its rarest term is in at most tau*|C| "
            "documents (the corpus side when indexing, the query side when expanding)")
# Weight of the expansion part of a query: None means the proposer's own default.
W_HELP = "weight of the expansion part; None: the proposer's measured default (encoder 0.25, LLM 0.5)"
# Document shards of an index.
DEFAULT_SHARDS = 4
SHARDS_HELP = "document shards of the index"
# Spark master of the index job: every core of this machine.
DEFAULT_SPARK_MASTER = "local[*]"
SPARK_MASTER_HELP = "Spark master URL of the index build"
# Hits kept per query in an evaluated run (the TREC run depth).
DEFAULT_DEPTH = 1000
DEPTH_HELP = "hits kept per query (the TREC run depth)"
# The index preset a job builds and searches unless told otherwise (sira.core.presets defines it).
DEFAULT_PRESET = "sira"
PRESET_HELP = "index preset: sira (the paper's analysis, bigrams) | pyserini-flat (Pyserini's BEIR flat baseline)"
# Hits `sira search` shows.
SEARCH_K = 10
# Where a dataset comes from (ingest, eval, run, compare).
DATASET_HELP = "beir:NAME or a folder in BEIR format"
# Random sign swaps of the paired randomization test (`sira compare`, the compare page).
PAIRED_PERMUTATIONS = 10_000
# Queries per scoring round.
QUERY_BATCH = 256
# Query-file lines per `sira query` chunk: expanded together, then appended to the runs table in one commit (the
# most a killed run redoes).
QUERY_COMMIT_LINES = 10_000
# What one `sira serve` request may ask: the longest query, the deepest k, and searches in flight at once.
SERVE_MAX_QUERY_CHARS = 2000
SERVE_MAX_K = 1000
SERVE_MAX_CONCURRENT = 32
# The OpenAI-compatible endpoint (vLLM's default port) when --base-url is not given.
DEFAULT_OPENAI_BASE_URL = "http://127.0.0.1:8000/v1"


class DFFilterParams(BaseModel):
    tau: float = Field(DEFAULT_TAU, gt=0, le=1, description=TAU_HELP)


class ExpansionParams(DFFilterParams):
    w: float | None = Field(None, ge=0, description=W_HELP)


class IndexBuildParams(BaseModel):
    preset: str = Field(DEFAULT_PRESET, description=PRESET_HELP)
    shards: int = Field(DEFAULT_SHARDS, ge=1, le=4096, description=SHARDS_HELP)
    spark_master: str = Field(DEFAULT_SPARK_MASTER, description=SPARK_MASTER_HELP)


class EvaluationParams(ExpansionParams, IndexBuildParams):
    """What an evaluated variant needs beyond its dataset: the index it builds and how queries are expanded."""

    depth: int = Field(DEFAULT_DEPTH, ge=100, description=DEPTH_HELP)


def default_warehouse(dataset_name: str) -> str:
    """Where a dataset's tables go when no --warehouse is given."""
    return f"warehouses/{dataset_name}"

# Seconds between a following server's checks for a newer index version: each reads only the new entries of
# corpus_stats' Delta log, so a night's version is found within this of its publish.
FOLLOW_POLL_S = 2.0
