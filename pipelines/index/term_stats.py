"""Step 7 of an index build: the version's term statistics (df, df_enriched, cf), whole, or only what moved."""

from __future__ import annotations

from functools import reduce

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sira.core import tables
from sira.pipelines.index.base import base_term_stats, term_stats_rows
from sira.pipelines.index.changes import require_analysis
from sira.pipelines.index.context import (Build, TERM_ROWS_PER_FILE, maybe_broadcast, in_files, of_version,
                                          replace_rows, spark_ddl)
from sira.pipelines.index.segments import SegmentPlan, final_vectors
from sira.pipelines.index.workers import POSTING_COUNTS_OUT, posting_counts


def term_statistics(b: Build, plan: SegmentPlan, seg: dict, orig_df: DataFrame | None,
                    orig_delta: DataFrame | None, max_versions: int) -> dict:
    """Write term_stats of the new version (df, df_enriched, cf): whole in a full build, and in an incremental one
    only what moved, as one more of its base's term_stats_versions (up to `max_versions`); returns its totals and
    its term_stats_versions."""
    dictionary = b.read(tables.TERM_DICTIONARY)
    entering = seg["seg"]
    if "carried" in entering.columns:  # merged documents stay with the statistics they have
        entering = entering.where(~F.col("carried"))
    if plan.base is not None:
        return _moved_term_stats(b, plan, entering, orig_delta, dictionary, max_versions)
    postings = b.read(tables.SEGMENT_POSTINGS, seg["segment_postings_table_version"]).where(
        F.col("segment") == b.version)
    stats = (postings.select("term_id", "tfs").mapInArrow(posting_counts, spark_ddl(POSTING_COUNTS_OUT))
             .groupBy("term_id").agg(F.sum("df").alias("df_enriched"), F.sum("cf").alias("cf")))
    stats = stats.join(orig_df, "term_id", "left") if orig_df is not None else \
        stats.withColumn("df", F.col("df_enriched"))
    stats = stats.join(dictionary, "term_id", "left")
    total_terms = int(entering.agg(F.sum("doc_len")).first()[0] or 0)
    stats = b.cut(of_version(b, stats.withColumn("df", F.coalesce("df", F.lit(0)).cast("long")),
                              tables.TERM_STATS_SCHEMA))
    unspelled = stats.where(F.col("term").isNull())  # counted first: see merge_dictionary
    unspelled = unspelled.limit(3).collect() if unspelled.count() else []
    if unspelled:
        raise RuntimeError(f"term ids {[r['term_id'] for r in unspelled]} are missing from {tables.TERM_DICTIONARY}")
    version = replace_rows(stats, b.uri(tables.TERM_STATS), "index_version", b.version, ["index_version"])
    return {"table_version": version, "total_terms": total_terms, "num_terms": stats.count(), "versions": [b.version]}


def _moved_term_stats(b: Build, plan: SegmentPlan, entering: DataFrame, orig_delta: DataFrame | None,
                      dictionary: DataFrame, max_versions: int) -> dict:
    """`term_statistics` of an incremental build: what entered the new segment less what left, written as one more
    of the base's term_stats_versions (up to `max_versions`), or merged into the base's statistics (whole again)."""
    base = plan.base
    if b.changed is not None and b.enrichment is None and orig_delta is not None:
        # Plain: what entered and left is what came and went (`plan_segments`), whose counts `original_df` took.
        moved = orig_delta.withColumn("d_df_enriched", F.col("d_df"))
    else:
        leaving = require_analysis(b, plan.leaving.select("doc_id", "content_hash", "inj_term_ids", "inj_tfs"),
                                    "documents leaving")
        moved = (final_vectors(b, entering).withColumn("s", F.lit(1))
                 .unionByName(final_vectors(b, leaving).withColumn("s", F.lit(-1)))
                 .groupBy("term_id").agg(F.sum("s").cast("long").alias("d_df_enriched"),
                                         F.sum(F.col("s") * F.col("tf")).cast("long").alias("d_cf")))
        moved = (moved.join(orig_delta.drop("d_cf"), "term_id", "full_outer") if orig_delta is not None
                 else moved.withColumn("d_df", F.lit(0).cast("long")))
    moved = b.cut(moved)
    n_moved = moved.count()
    zero = F.lit(0).cast("long")
    deltas = ("d_df", "d_df_enriched", "d_cf")
    rows = term_stats_rows(b, base)
    # Each term that moved, with its df_enriched in the base (null: no row of the base's term_stats_versions
    # holds it). The few that moved go to every task and the base's rows stream past them (no shuffle of the
    # corpus-sized rows); their counts give the new version's number of terms: the base's, less those no
    # document holds any more, plus those some document holds now and none did.
    base_dfe = (rows.select("term_id", "df_enriched")
                .join(maybe_broadcast(moved.select("term_id"), n_moved), "term_id")
                .groupBy("term_id").agg(F.sum("df_enriched").alias("base_dfe")))
    met = b.cut(moved.join(maybe_broadcast(base_dfe, n_moved), "term_id", "left"))  # not kept: see `Build.cut`
    held = F.coalesce("base_dfe", zero) > 0
    after = F.coalesce("base_dfe", zero) + F.coalesce("d_df_enriched", zero)
    counts = met.agg(F.count(F.when(held & (after <= 0), 1)).alias("vanished"),
                     F.count(F.when(~held & (after > 0), 1)).alias("new_held"),
                     F.count(F.when(F.col("base_dfe").isNull(), 1)).alias("unseen"),
                     F.count(F.when(~held, 1)).alias("unheld")).first()
    total_terms = int(base["total_terms"]) + int(entering.agg(F.sum("doc_len")).first()[0] or 0) \
        - int(plan.leaving.agg(F.sum("doc_len")).first()[0] or 0)
    num_terms = int(base["num_terms"]) - int(counts["vanished"]) + int(counts["new_held"])
    versions = tables.term_stats_versions_of(base)
    if len(versions) < max_versions:
        # Only what moved, as one more of the base's versions; spelled for the terms no earlier row spells.
        unseen = met.where(F.col("base_dfe").isNull()).select("term_id")
        spelled = b.keep(maybe_broadcast(unseen, int(counts["unseen"])).join(dictionary, "term_id"))
        _require_spelled(spelled, int(counts["unseen"]))
        stats = (met.join(maybe_broadcast(spelled, int(counts["unseen"])), "term_id", "left")
                 .where(reduce(lambda a, c: a | (F.coalesce(c, zero) != 0), deltas, F.lit(False)))
                 .select("term_id", "term", *[F.coalesce(d, zero).alias(d[2:]) for d in deltas]))
        versions = [*versions, b.version]
    else:
        # The base's statistics with what moved (the few that moved go to every task), and the terms it did not
        # hold (no earlier counts: a term's df_enriched bounds its df and cf), spelled from the dictionary.
        def add(df: DataFrame) -> DataFrame:
            return df.select("term_id", "term", *[(F.coalesce(d[2:], zero) + F.coalesce(d, zero)).alias(d[2:])
                                                  for d in deltas])

        kept = add(base_term_stats(b, base).join(maybe_broadcast(moved, n_moved), "term_id", "left"))
        unheld = maybe_broadcast(met.where(~held).drop("base_dfe"), int(counts["unheld"]))
        new = b.keep(unheld.join(dictionary, "term_id"))
        _require_spelled(new, int(counts["unheld"]))
        new = add(new.select("term_id", "term", *[F.lit(None).cast("long").alias(d[2:]) for d in deltas], *deltas))
        stats = kept.unionByName(new).where(F.col("df_enriched") > 0)
        versions = [b.version]
    stats = of_version(b, stats.withColumn("df", F.coalesce("df", F.lit(0)).cast("long")), tables.TERM_STATS_SCHEMA)
    if len(versions) > 1:  # only what moved: at most the moved terms
        stats = in_files(stats, n_moved, TERM_ROWS_PER_FILE)
    version = replace_rows(stats, b.uri(tables.TERM_STATS), "index_version", b.version, ["index_version"])
    return {"table_version": version, "total_terms": total_terms, "num_terms": num_terms, "versions": versions}


def _require_spelled(spelled: DataFrame, expected: int) -> None:
    got = spelled.count()
    if got != expected:
        raise RuntimeError(f"{expected - got} new terms are missing from {tables.TERM_DICTIONARY}")
