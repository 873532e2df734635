"""The Spark index build: docs (Delta) -> term_stats, shard_docs, postings, corpus_stats (Delta).

Every row carries `index_version`. The data tables are written first (a rerun of a failed build replaces
its own partial version with `replaceWhere`), and the `corpus_stats` row is appended last: readers only
see versions that have that row, so they never see a half-written index.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone
from typing import Iterator

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.storagelevel import StorageLevel

from pipelines.delta_io import read_table, table_exists, table_version
from sira_core import tables
from sira_core.analysis import Analyzer, AnalyzerConfig
from sira_core.hashing import shard_of, term_id
from sira_core.memory_index import index_text
from sira_core.presets import IndexPreset

ANALYZED_SCHEMA = "doc_id string, shard int, doc_len int, terms array<string>, term_ids array<bigint>, tfs array<int>"
_ANALYZED_ARROW = pa.schema([
    ("doc_id", pa.string()), ("shard", pa.int32()), ("doc_len", pa.int32()), ("terms", pa.list_(pa.string())),
    ("term_ids", pa.list_(pa.int64())), ("tfs", pa.list_(pa.int32())),
])


class TermIdCollision(RuntimeError):
    pass


def analyze_batches(analyzer_json: str, num_shards: int):
    """mapInArrow function: documents -> (doc_id, shard, doc_len, terms, term_ids, tfs). Runs on executors."""

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        analyzer = Analyzer(AnalyzerConfig.model_validate_json(analyzer_json))
        for batch in batches:
            out = {"doc_id": [], "shard": [], "doc_len": [], "terms": [], "term_ids": [], "tfs": []}
            cols = batch.to_pydict()
            for doc_id, title, text in zip(cols["doc_id"], cols["title"], cols["text"]):
                counts = Counter(analyzer.terms(index_text(title, text)))
                terms = list(counts)
                out["doc_id"].append(doc_id)
                out["shard"].append(shard_of(doc_id, num_shards))
                out["doc_len"].append(sum(counts.values()))
                out["terms"].append(terms)
                out["term_ids"].append([term_id(t) for t in terms])
                out["tfs"].append([counts[t] for t in terms])
            yield pa.RecordBatch.from_pydict(out, schema=_ANALYZED_ARROW)

    return fn


def next_index_version(warehouse: str) -> int:
    uri = tables.table_uri(warehouse, tables.CORPUS_STATS)
    if not table_exists(uri):
        return 1
    versions = read_table(uri, columns=["index_version"]).column("index_version").to_pylist()
    return max(versions, default=0) + 1


def _replace_version(df: DataFrame, uri: str, version: int, partition_by: list[str]) -> int:
    (
        df.write.format("delta")
        .mode("overwrite")
        .option("replaceWhere", f"index_version = {version}")
        .partitionBy(*partition_by)
        .save(uri)
    )
    return table_version(uri)


def build_index(spark: SparkSession, warehouse: str, preset: IndexPreset, num_shards: int, log=print) -> dict:
    """Build and publish one index version; returns its corpus_stats row."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    docs_uri = tables.table_uri(warehouse, tables.DOCS)
    docs_version = table_version(docs_uri)
    if docs_version is None:
        raise FileNotFoundError(f"no docs table at {docs_uri}; run `sira ingest` first")
    version = next_index_version(warehouse)
    analyzer_json = preset.analyzer.model_dump_json()
    log(f"index version {version}: preset {preset.name}, {num_shards} shards, docs table v{docs_version}")

    docs = spark.read.format("delta").option("versionAsOf", docs_version).load(docs_uri)
    analyzed = (
        docs.select("doc_id", "title", "text")
        .mapInArrow(analyze_batches(analyzer_json, num_shards), ANALYZED_SCHEMA)
        .withColumn("doc_ord", F.row_number().over(Window.partitionBy("shard").orderBy("doc_id")) - 1)
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    try:
        totals = analyzed.agg(F.count("*").alias("n"), F.sum("doc_len").alias("total")).first()
        num_docs, total_terms = int(totals["n"]), int(totals["total"] or 0)
        if num_docs == 0:
            raise ValueError(f"docs table {docs_uri} v{docs_version} is empty")
        log(f"analysed {num_docs} documents, {total_terms} terms")

        occurrences = analyzed.select(
            "shard", "doc_ord", F.explode(F.arrays_zip("terms", "term_ids", "tfs")).alias("p")
        ).select("shard", "doc_ord", F.col("p.terms").alias("term"), F.col("p.term_ids").alias("term_id"),
                 F.col("p.tfs").alias("tf"))
        term_stats = (
            occurrences.groupBy("term_id", "term")
            .agg(F.count("*").cast("long").alias("df"), F.sum("tf").cast("long").alias("cf"))
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        collisions = term_stats.groupBy("term_id").agg(F.collect_list("term").alias("terms")).where(
            F.size("terms") > 1).limit(5).collect()
        if collisions:
            raise TermIdCollision(f"term id hash collisions: {[r['terms'] for r in collisions]}")
        num_terms = term_stats.count()

        v = F.lit(version).cast("long").alias("index_version")
        term_stats_version = _replace_version(
            term_stats.select(v, "term_id", "term", "df", "cf"),
            tables.table_uri(warehouse, tables.TERM_STATS), version, ["index_version"],
        )
        shard_docs_version = _replace_version(
            analyzed.select(v, "shard", "doc_ord", "doc_id", "doc_len"),
            tables.table_uri(warehouse, tables.SHARD_DOCS), version, ["index_version", "shard"],
        )
        postings = (
            occurrences.join(term_stats.select("term_id", "df"), "term_id")
            .groupBy("shard", "term_id", "df")
            .agg(F.sort_array(F.collect_list(F.struct("doc_ord", "tf"))).alias("p"))
            .select(v, "shard", "term_id", "df", F.col("p.doc_ord").alias("doc_ords"), F.col("p.tf").alias("tfs"))
        )
        postings_version = _replace_version(
            postings, tables.table_uri(warehouse, tables.POSTINGS), version, ["index_version", "shard"]
        )
        log(f"wrote {num_terms} terms and postings for {num_shards} shards")
    finally:
        analyzed.unpersist()

    row = {
        "index_version": version,
        "preset": preset.name,
        "num_docs": num_docs,
        "avgdl": total_terms / num_docs,
        "total_terms": total_terms,
        "num_terms": num_terms,
        "num_shards": num_shards,
        "k1": preset.bm25.k1,
        "b": preset.bm25.b,
        "max_n": preset.analyzer.max_n,
        "analyzer_json": analyzer_json,
        "docs_table_version": docs_version,
        "term_stats_table_version": term_stats_version,
        "postings_table_version": postings_version,
        "shard_docs_table_version": shard_docs_version,
        "built_at": datetime.now(timezone.utc),
    }
    publish(spark, warehouse, row)
    log(f"published index version {version}")
    return row


def publish(spark: SparkSession, warehouse: str, row: dict) -> None:
    """Append the corpus_stats row: the single commit that makes an index version visible."""
    uri = tables.table_uri(warehouse, tables.CORPUS_STATS)
    if table_exists(uri):
        existing = read_table(uri, columns=["index_version"]).column("index_version").to_pylist()
        if row["index_version"] in existing:
            raise RuntimeError(f"index version {row['index_version']} was published by another build meanwhile")
    schema = (
        "index_version long, preset string, num_docs long, avgdl double, total_terms long, num_terms long, "
        "num_shards int, k1 double, b double, max_n int, analyzer_json string, docs_table_version long, "
        "term_stats_table_version long, postings_table_version long, shard_docs_table_version long, "
        "built_at timestamp"
    )
    spark.createDataFrame([tuple(row[c] for c in tables.CORPUS_STATS_COLUMNS)], schema).write.format(
        "delta").mode("append").save(uri)
