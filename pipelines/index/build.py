"""The Spark index build: docs (+ the corpus-side enrichment) -> one published index version, incrementally.

An index version (layout 2, see sira.core.tables) is a list of immutable segments minus the version's tombstones,
with its own term statistics. One build (`build_index`) runs these steps, each a function below, and reports the
seconds of each (`step_seconds`: changes, analysis, original df, injections, segment plan, segment, term statistics,
tombstones and injections, publish):

0. `docs_changes`: on top of a base, the documents whose content came or went since the docs version the base was
   built from, read from the docs table's change data feed (what the night's MERGE changed): with them, the steps
   below touch the night's documents, not a scan of the whole corpus. Without a usable feed (not enabled, a
   rewrite in between) they compare the whole table with the kept analyses and the base instead.
1. `analyse_documents`: documents with no kept analysis for this analyzer are analysed (BatchAnalyzer inside
   mapInArrow); their new terms go to `term_dictionary` first, then the analysis to `doc_analysis`. A night
   analyses only what is new or changed, and also what went, from the texts its change feed holds.
2. `analyse_phrases` (enriched): the same for the DF-independent checks of each document's enrichment phrases.
3. `original_df`: DF in the original corpus (the corpus-side DF rule and `term_stats.df`).
4. `decide_injections` (enriched): the DF rule over every candidate phrase; each doc's injected terms and key. A
   night (`incremental_injections`) decides again only the documents whose decisions can change: content that
   came, enrichment rows that came or went, a candidate term that crossed the DF limit. The decisions are kept
   with the segment their document enters (`segment_injections`).
5. `plan_segments`: against the base (the newest published version of the same kind), the documents that leave
   (tombstones) and those that enter a new segment. A build that would leave more than SegmentPolicy.max_segments
   segments merges the small ones into its new segment: their live documents enter it as they are (analysis,
   injections and decisions carried, no statistic moves) and those segments leave the version, as Lucene's
   tiered merges do; when that leaves too many dead documents, every segment merges (a compaction that decides
   nothing again). A full build (one segment with every document, from the kept analysis, every decision made
   again) when there is no base, or when asked (`--full`).
6. `write_segment`: doc ordinals (doc-id order per shard), `segment_docs`, and postings inverted per block of
   POSTINGS_BLOCK_DOCS ordinals in Python (applyInArrow): no row, task or Python call holds a posting list
   longer than a block, however common the term.
7. `term_statistics`: df, df_enriched, cf; incrementally only what entered minus what left, as rows that readers
   add to the base's (up to SegmentPolicy.max_term_stats_versions builds, then whole again).
8. `publish`: the corpus_stats row, last: readers only see versions that have it. Every data row of a version
   is keyed by it (or by its new segment), and a rerun of a killed build replaces them (`replaceWhere`).

The published index equals a full rebuild's (tests/test_incremental_index.py compares the tables, term statistics
summed as readers sum them, and rankings).
"""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
from pyspark.sql import SparkSession

from sira.core import tables
from sira.core.presets import IndexPreset
from sira.pipelines.storage.delta_io import read_table, table_exists, table_version
from sira.pipelines.index.base import find_base
from sira.pipelines.index.changes import STALE_ANALYSIS_FRACTION, analyse_documents, compact_analysis, docs_changes
from sira.pipelines.index.context import (Build, EnrichmentChoice, SegmentPolicy, collect_garbage, maybe_broadcast,
                                          no_enrichment, spark_ddl)
from sira.pipelines.index.injections import (base_and_original_df, desired_documents, incremental_injections,
                                             inject_enrichment)
from sira.pipelines.index.segments import (SegmentPlan, carried_decisions, moved_counts, plan_segments,
                                           write_injections, write_segment, write_tombstones)
from sira.pipelines.index.term_stats import term_statistics
from sira.pipelines.index.workers import warm_python_workers


def build_index(
    spark: SparkSession,
    warehouse: str,
    preset: IndexPreset,
    num_shards: int,
    enrichment: EnrichmentChoice | None = None,
    full: bool = False,
    policy: SegmentPolicy = SegmentPolicy(),
    log=print,
) -> dict:
    """Build and publish one index version (with the corpus-side enrichment when `enrichment` is given), on top
    of the newest version of the same kind unless `full`; returns its corpus_stats row, `documents_analysed`,
    whether it took the night's changes from the docs table's change data feed (`changes_from_feed`) and the
    seconds of each step (`step_seconds`)."""
    b = start_build(spark, warehouse, preset, num_shards, enrichment, log)
    warming = warm_python_workers(spark, b.analyzer_json)
    try:
        docs = b.read(tables.DOCS, b.docs_version)
        size_shuffles(spark, b.uri(tables.DOCS))
        base = None if full else find_base(b)
        with b.step("changes"):
            changes = docs_changes(b, base)
        with b.step("analysis"):
            num_docs, analysed, stale = analyse_documents(b, docs, changes)
        if num_docs == 0:
            raise ValueError(f"docs table {b.uri(tables.DOCS)} v{b.docs_version} is empty")
        current = docs.select("doc_id", "content_hash")
        with b.step("original df"):
            base, orig_df, orig_delta, more = base_and_original_df(b, docs, base, changes)
            analysed += more
        injections, per_doc, enrichment_info, moves = None, None, no_enrichment(), None
        if enrichment is not None:
            with b.step("injections"):
                if base is not None and changes is not None:
                    moves = incremental_injections(b, docs, base, changes, orig_delta, num_docs)
                if moves is None:
                    injections, per_doc, enrichment_info = inject_enrichment(b, docs, orig_df, num_docs)
        with b.step("segment plan"):
            plan = plan_segments(b, None if moves else desired_documents(current, per_doc), base, policy, moves)
        if moves is not None:
            injections, enrichment_info = moves.injections, {**moves.info, **moved_counts(base, plan)}
            if plan.carried is not None:  # the merged documents' decisions go with them
                names = tables.SEGMENT_INJECTIONS_SCHEMA.names[1:]
                injections = injections.select(*names).unionByName(carried_decisions(b, plan).select(*names))
        rows, n_rows = plan.written()
        if injections is not None and plan.base is not None and moves is None:
            # Decided for every document: the new segment keeps those of the documents it holds.
            injections = injections.join(maybe_broadcast(rows.select("doc_id"), n_rows), "doc_id", "left_semi")
        # A plain full build whose kept analyses are exactly the current documents' reads them without a join.
        whole = plan.base is None and enrichment is None and stale == 0
        with b.step("segment"):
            seg = write_segment(b, rows, n_rows, whole)
        with b.step("term statistics"):
            stats = term_statistics(b, plan, seg, orig_df, orig_delta, policy.max_term_stats_versions)
        with b.step("tombstones and injections"):
            tombstones_version = write_tombstones(b, plan)
            injections_version = None if injections is None else write_injections(b, injections)
    finally:
        warming.join()  # long done by now; no job of the build outlives it
        b.release()
    row = corpus_stats_row(b, num_docs, enrichment_info, plan, seg, stats, tombstones_version, injections_version)
    with b.step("publish"):
        publish(spark, warehouse, row)
    if stale > STALE_ANALYSIS_FRACTION * num_docs:
        compact_analysis(b, stale)
    log(f"published index version {b.version}: {num_docs} documents, {stats['total_terms']} terms, segments "
        f"{plan.segments}" + (f" ({plan.num_tombstones} tombstoned)" if plan.num_tombstones else ""))
    b.log("build steps: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in b.seconds.items()))
    return {**row, "documents_analysed": analysed, "changes_from_feed": changes is not None and plan.base is not None,
            "step_seconds": b.seconds}


def start_build(spark: SparkSession, warehouse: str, preset: IndexPreset, num_shards: int,
                enrichment: EnrichmentChoice | None, log) -> Build:
    """The build of the next index version from the current docs table."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    docs_version = table_version(tables.table_uri(warehouse, tables.DOCS))
    if docs_version is None:
        raise FileNotFoundError(f"no docs table at {tables.table_uri(warehouse, tables.DOCS)}; run `sira ingest` first")
    b = Build(spark, warehouse, preset, num_shards, enrichment, next_index_version(warehouse), docs_version, log)
    log(f"index version {b.version}: preset {preset.name}, {num_shards} shards, docs table v{docs_version}"
        + (f", enrichment tau {enrichment.tau}" if enrichment else ", no enrichment"))
    return b


def corpus_stats_row(b: Build, num_docs: int, enrichment_info: dict, plan: SegmentPlan, seg: dict, stats: dict,
                     tombstones_version: int, injections_version: int | None) -> dict:
    """The version's corpus_stats row: its statistics, settings and the table versions it reads."""
    return {
        "index_version": b.version, "preset": b.preset.name, "num_docs": num_docs,
        "avgdl": stats["total_terms"] / num_docs, "total_terms": stats["total_terms"], "num_terms": stats["num_terms"],
        "num_shards": b.num_shards, "k1": b.preset.bm25.k1, "b": b.preset.bm25.b, "max_n": b.preset.analyzer.max_n,
        "analyzer_json": b.analyzer_json, **enrichment_info, "docs_table_version": b.docs_version,
        "term_stats_table_version": stats["table_version"], "postings_table_version": None,
        "shard_docs_table_version": None, "injections_table_version": None,
        "segment_injections_table_version": injections_version,
        "built_at": datetime.now(timezone.utc), "layout": tables.INDEX_LAYOUT, "analyzer_key": b.analyzer_key,
        "segments": plan.segments, "base_version": plan.base_version, "num_tombstones": plan.num_tombstones,
        "segment_docs_table_version": seg["segment_docs_table_version"],
        "segment_postings_table_version": seg["segment_postings_table_version"],
        "tombstones_table_version": tombstones_version, "term_stats_versions": stats["versions"],
    }


def build_in_session(warehouse: str, preset_name: str, shards: int, spark_master: str,
                     enrichment: EnrichmentChoice | None, full: bool = False, policy: SegmentPolicy = SegmentPolicy(),
                     log=print, spark: SparkSession | None = None) -> dict:
    """`build_index` in `spark`, the active session, or a session of its own (stopped after: a caller's or a test's
    session stays up); its row with `built_at` as ISO text."""
    from sira.pipelines.storage.spark_session import get_spark
    from sira.core.presets import get_preset

    preset = get_preset(preset_name)  # fail on a bad preset before starting a JVM
    own_session = spark is None and SparkSession.getActiveSession() is None
    spark = spark or get_spark(spark_master, app_name="sira-index")
    try:
        row = build_index(spark, warehouse, preset, shards, enrichment, full=full, policy=policy, log=log)
    finally:
        if own_session:
            spark.stop()
        else:
            release_broadcasts(spark)
    return {**row, "built_at": row["built_at"].isoformat()}


def release_broadcasts(spark: SparkSession) -> None:
    """Free the hash relations of the build's broadcast joins in a session that outlives it (a caller's, a
    notebook's, a test suite's): each holds memory pages until Spark's ContextCleaner sees its plan collected, and
    in a heap that rarely fills that waits for the next periodic GC (`spark.cleaner.periodicGC.interval`), so a few
    builds in a row ran a 3 GB heap out of memory. The build's frames are unreachable once it returns; one
    collection on each side lets the cleaner drop them now."""
    collect_garbage(spark)


def size_shuffles(spark: SparkSession, docs_uri: str) -> None:
    """Shuffle partitions from the input's size (about 64 MB of documents each, at least two per core) unless set
    explicitly: adaptive execution coalesces small ones, but cannot split a partition that a corpus outgrew."""
    from deltalake import DeltaTable

    if spark.sparkContext.getConf().contains("spark.sql.shuffle.partitions"):
        return  # set by the user (SIRA_SPARK_CONF, spark-submit --conf): theirs stands
    size = sum(pa.table(DeltaTable(docs_uri).get_add_actions(flatten=True)).column("size_bytes").to_pylist())
    cores = spark.sparkContext.defaultParallelism
    spark.conf.set("spark.sql.shuffle.partitions", str(max(2 * cores, min(4000, size // (64 << 20) + 1))))


def next_index_version(warehouse: str) -> int:
    uri = tables.table_uri(warehouse, tables.CORPUS_STATS)
    if not table_exists(uri):
        return 1
    versions = read_table(uri, columns=["index_version"]).column("index_version").to_pylist()
    return max(versions, default=0) + 1


def publish(spark: SparkSession, warehouse: str, row: dict) -> None:
    """Append the corpus_stats row: the single commit that makes an index version visible."""
    uri = tables.table_uri(warehouse, tables.CORPUS_STATS)
    if table_exists(uri):
        existing = read_table(uri, columns=["index_version"]).column("index_version").to_pylist()
        if row["index_version"] in existing:
            raise RuntimeError(f"index version {row['index_version']} was published by another build meanwhile")
    spark.createDataFrame([tuple(row[c] for c in tables.CORPUS_STATS_SCHEMA.names)],
                          spark_ddl(tables.CORPUS_STATS_SCHEMA)).write.format(
        "delta").mode("append").option("mergeSchema", "true").save(uri)  # older tables gain new columns
