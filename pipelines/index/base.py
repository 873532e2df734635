"""The base of an incremental index build: the newest published version of the same kind, its live documents and
its term statistics."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sira.core import tables
from sira.pipelines.index.context import Build, INJECTED_COLUMNS, maybe_broadcast, not_injected


def find_base(b: Build) -> dict | None:
    """The newest published version this build can extend: same layout, analyzer, shards and enrichment choice."""
    from sira.pipelines.index.catalog import published_versions

    e = b.enrichment
    for row in reversed(published_versions(b.warehouse)):
        if (row.get("layout") == tables.INDEX_LAYOUT and row.get("analyzer_key") == b.analyzer_key
                and row["num_shards"] == b.num_shards and bool(row["enriched"]) == (e is not None)
                and row["preset"] == b.preset.name
                and (e is None or (row["tau"] == e.tau and row.get("enrichment_model") == e.model
                                   and row.get("enrichment_prompt_version") == e.prompt_version
                                   # decisions kept per segment, which unchanged documents carry over
                                   and row.get("segment_injections_table_version") is not None))):
            return row
    return None


def live_docs(b: Build, base: dict) -> DataFrame:
    """segment_docs rows of the base version's documents (its segments minus its tombstones), kept for the build."""
    if b.live is None:
        b.live = b.keep(read_live_docs(b, base))
    return b.live


def read_live_docs(b: Build, base: dict) -> DataFrame:
    # Published segments and a published version's rows never change, so the tables' latest versions serve (a
    # pinned old table version could outlive the Delta log's retention).
    docs = b.read(tables.SEGMENT_DOCS).where(F.col("segment").isin(list(base["segments"])))
    # Segments written before the decision columns: a plain one's values, which an enriched base never lacks.
    docs = docs.select(*[c for c in docs.columns if c not in INJECTED_COLUMNS], *[
        (F.coalesce(c, not_injected(c)) if c in docs.columns else not_injected(c)).alias(c) for c in INJECTED_COLUMNS])
    if base.get("num_tombstones"):
        dead = b.read(tables.TOMBSTONES).where(F.col("index_version") == base["index_version"])
        docs = docs.join(dead.select("segment", "shard", "doc_ord"), ["segment", "shard", "doc_ord"], "left_anti")
    return docs


def base_df_of(b: Build, base: dict, terms: DataFrame, rows: int) -> DataFrame:
    """(term_id, df) in the base's original corpus of those of `terms` (term_id; `rows` of them) it holds: its
    term_stats rows of those terms alone summed (the few terms go to every task and the rows stream past them)."""
    return (term_stats_rows(b, base).join(maybe_broadcast(terms, rows), "term_id", "left_semi")
            .groupBy("term_id").agg(F.sum("df").cast("long").alias("df")))


def term_stats_rows(b: Build, version: dict) -> DataFrame:
    """The term_stats rows of the versions `version` lists in its term_stats_versions, not yet summed."""
    return b.read(tables.TERM_STATS).where(F.col("index_version").isin(tables.term_stats_versions_of(version))) \
        .drop("index_version")


def base_term_stats(b: Build, version: dict) -> DataFrame:
    """(term_id, term, df, df_enriched, cf) of every term of the published `version` (its rows summed when it lists
    several term_stats_versions)."""
    rows = term_stats_rows(b, version)
    if len(tables.term_stats_versions_of(version)) == 1:
        return rows
    return rows.groupBy("term_id").agg(F.min("term").alias("term"), *[F.sum(c).alias(c) for c in (
        "df", "df_enriched", "cf")]).where(F.col("df_enriched") > 0)
