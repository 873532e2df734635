"""The Spark index build: docs (Delta) -> term_stats, shard_docs, postings, corpus_stats (Delta).

Every row carries `index_version`. The data tables are written first (a rerun of a failed build replaces
its own partial version with `replaceWhere`), and the `corpus_stats` row is appended last: readers only
see versions that have that row, so they never see a half-written index.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Iterator

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.storagelevel import StorageLevel

from pipelines.delta_io import read_table, table_exists, table_version
from sira_core import tables
from sira_core.analysis import Analyzer, AnalyzerConfig, index_text, ngrams
from sira_core.dfstats import corpus_side_filter
from sira_core.hashing import shard_of, term_id
from sira_core.presets import IndexPreset

ANALYZED_SCHEMA = (
    "doc_id string, shard int, doc_len int, terms array<string>, term_ids array<bigint>, tfs array<int>, "
    "decisions array<struct<phrase:string, kept:boolean, reason:string, min_df:bigint>>"
)
_ANALYZED_ARROW = pa.schema([
    ("doc_id", pa.string()), ("shard", pa.int32()), ("doc_len", pa.int32()), ("terms", pa.list_(pa.string())),
    ("term_ids", pa.list_(pa.int64())), ("tfs", pa.list_(pa.int32())),
    ("decisions", pa.list_(pa.struct([("phrase", pa.string()), ("kept", pa.bool_()), ("reason", pa.string()),
                                      ("min_df", pa.int64())]))),
])
_PHRASE_TERMS_ARROW = pa.schema([("doc_id", pa.string()), ("term", pa.string())])


class TermIdCollision(RuntimeError):
    pass


def analyze_batches(analyzer_json: str, num_shards: int, num_docs: int = 0, tau: float = 0.0):
    """mapInArrow function: documents (+ optional `phrases` and their original-corpus `df_map`) ->
    (doc_id, shard, doc_len, terms, term_ids, tfs, decisions). Kept phrases are injected into the same field,
    each analysed on its own, so the document length grows by their terms. Runs on executors."""

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        analyzer = Analyzer(AnalyzerConfig.model_validate_json(analyzer_json))
        for batch in batches:
            out = {name: [] for name in _ANALYZED_ARROW.names}
            cols = batch.to_pydict()
            phrases_col = cols.get("phrases") or [None] * batch.num_rows
            df_maps = cols.get("df_map") or [None] * batch.num_rows
            for doc_id, title, text, phrases, df_map in zip(cols["doc_id"], cols["title"], cols["text"],
                                                           phrases_col, df_maps):
                tokens = analyzer.tokens(index_text(title, text))
                counts = Counter(ngrams(tokens, analyzer.config.max_n))
                decisions = []
                if phrases:
                    lookup = {e["term"]: e["df"] for e in df_map or []}
                    decisions = corpus_side_filter(phrases, tokens, analyzer, lambda ts: lookup, num_docs, tau)
                    for d in decisions:
                        if d.kept:
                            counts.update(d.terms)
                terms = list(counts)
                out["doc_id"].append(doc_id)
                out["shard"].append(shard_of(doc_id, num_shards))
                out["doc_len"].append(sum(counts.values()))
                out["terms"].append(terms)
                out["term_ids"].append([term_id(t) for t in terms])
                out["tfs"].append([counts[t] for t in terms])
                out["decisions"].append([{"phrase": d.phrase, "kept": d.kept, "reason": d.reason, "min_df": d.min_df}
                                         for d in decisions])
            yield pa.RecordBatch.from_pydict(out, schema=_ANALYZED_ARROW)

    return fn


def phrase_terms_batches(analyzer_json: str):
    """mapInArrow function: (doc_id, phrases) -> distinct (doc_id, term) over the phrases' sub-n-grams."""

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        analyzer = Analyzer(AnalyzerConfig.model_validate_json(analyzer_json))
        for batch in batches:
            ids, terms = [], []
            for doc_id, phrases in zip(batch.column("doc_id").to_pylist(), batch.column("phrases").to_pylist()):
                for t in sorted(set(analyzer.terms_of_phrases(phrases or []))):
                    ids.append(doc_id)
                    terms.append(t)
            yield pa.RecordBatch.from_pydict({"doc_id": ids, "term": terms}, schema=_PHRASE_TERMS_ARROW)

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


@dataclass(frozen=True)
class EnrichmentChoice:
    """Which enrichment rows an index injects: by default each document's newest successful one for its
    current content; `model` / `prompt_version` narrow that down."""

    tau: float = 0.05
    model: str | None = None
    prompt_version: str | None = None


def _enrichment_phrases(spark: SparkSession, warehouse: str, docs: DataFrame, choice: EnrichmentChoice):
    """(doc_id, phrases) for the current content of each doc, and the enrichment table version read."""
    uri = tables.table_uri(warehouse, tables.ENRICHMENT)
    version = table_version(uri)
    if version is None:
        raise FileNotFoundError(f"no enrichment table at {uri}; run `sira enrich` first or pass --no-enrichment")
    enr = spark.read.format("delta").option("versionAsOf", version).load(uri).where(F.col("error").isNull())
    if choice.model:
        enr = enr.where(F.col("model") == choice.model)
    if choice.prompt_version:
        enr = enr.where(F.col("prompt_version") == choice.prompt_version)
    newest = Window.partitionBy("doc_id").orderBy(F.col("enriched_at").desc(), F.col("model"), F.col("prompt_version"))
    phrases = (
        enr.join(docs.select("doc_id", "content_hash"), ["doc_id", "content_hash"])
        .withColumn("_rank", F.row_number().over(newest))
        .where("_rank = 1")
        .select("doc_id", "phrases", "model", "prompt_version")
    )
    return phrases, version


def build_index(
    spark: SparkSession,
    warehouse: str,
    preset: IndexPreset,
    num_shards: int,
    enrichment: EnrichmentChoice | None = None,
    log=print,
) -> dict:
    """Build and publish one index version (with the corpus-side enrichment when `enrichment` is given);
    returns its corpus_stats row."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    docs_uri = tables.table_uri(warehouse, tables.DOCS)
    docs_version = table_version(docs_uri)
    if docs_version is None:
        raise FileNotFoundError(f"no docs table at {docs_uri}; run `sira ingest` first")
    version = next_index_version(warehouse)
    analyzer_json = preset.analyzer.model_dump_json()
    log(f"index version {version}: preset {preset.name}, {num_shards} shards, docs table v{docs_version}"
        + (f", enrichment tau {enrichment.tau}" if enrichment else ", no enrichment"))

    docs = spark.read.format("delta").option("versionAsOf", docs_version).load(docs_uri)
    persisted: list[DataFrame] = []

    def keep(df: DataFrame) -> DataFrame:
        persisted.append(df.persist(StorageLevel.MEMORY_AND_DISK))
        return persisted[-1]

    by_shard_doc = Window.partitionBy("shard").orderBy("doc_id")
    try:
        original = keep(docs.select("doc_id", "title", "text").mapInArrow(
            analyze_batches(analyzer_json, num_shards), ANALYZED_SCHEMA))
        totals = original.agg(F.count("*").alias("n"), F.sum("doc_len").alias("total")).first()
        num_docs = int(totals["n"])
        if num_docs == 0:
            raise ValueError(f"docs table {docs_uri} v{docs_version} is empty")
        original_df = keep(original.select(F.explode("terms").alias("term")).groupBy("term")
                           .agg(F.count("*").cast("long").alias("df")))
        enrichment_info = {"enriched": False, "enrichment_table_version": None, "tau": None,
                           "phrases_proposed": 0, "phrases_kept": 0, "enrichment_model": None,
                           "enrichment_prompt_version": None}
        if enrichment is None:
            analyzed = original
        else:
            phrases, enr_version = _enrichment_phrases(spark, warehouse, docs, enrichment)
            phrases = keep(phrases)
            df_maps = (
                phrases.select("doc_id", "phrases").mapInArrow(phrase_terms_batches(analyzer_json),
                                                               "doc_id string, term string")
                .join(original_df, "term", "left")
                .groupBy("doc_id")
                .agg(F.collect_list(F.struct("term", F.coalesce("df", F.lit(0)).alias("df"))).alias("df_map"))
            )
            with_phrases = docs.select("doc_id", "title", "text").join(
                phrases.select("doc_id", "phrases"), "doc_id", "left").join(df_maps, "doc_id", "left")
            analyzed = keep(with_phrases.mapInArrow(
                analyze_batches(analyzer_json, num_shards, num_docs, enrichment.tau), ANALYZED_SCHEMA))
            counts = analyzed.select(F.explode("decisions").alias("d")).agg(
                F.count("*").alias("proposed"), F.sum(F.col("d.kept").cast("int")).alias("kept")).first()
            enrichment_info = {"enriched": True, "enrichment_table_version": enr_version, "tau": enrichment.tau,
                               "phrases_proposed": int(counts["proposed"]), "phrases_kept": int(counts["kept"] or 0),
                               "enrichment_model": enrichment.model,
                               "enrichment_prompt_version": enrichment.prompt_version}
            log(f"enrichment v{enr_version}: kept {enrichment_info['phrases_kept']} of "
                f"{enrichment_info['phrases_proposed']} proposed phrases")
        analyzed = keep(analyzed.withColumn("doc_ord", F.row_number().over(by_shard_doc) - 1))
        total_terms = int(analyzed.agg(F.sum("doc_len")).first()[0] or 0)
        log(f"analysed {num_docs} documents, {total_terms} terms")

        occurrences = analyzed.select(
            "shard", "doc_ord", F.explode(F.arrays_zip("terms", "term_ids", "tfs")).alias("p")
        ).select("shard", "doc_ord", F.col("p.terms").alias("term"), F.col("p.term_ids").alias("term_id"),
                 F.col("p.tfs").alias("tf"))
        term_stats = keep(
            occurrences.groupBy("term_id", "term")
            .agg(F.count("*").cast("long").alias("df_enriched"), F.sum("tf").cast("long").alias("cf"))
            .join(original_df, "term", "left")
            .withColumn("df", F.coalesce("df", F.lit(0)).cast("long"))
        )
        collisions = term_stats.groupBy("term_id").agg(F.collect_list("term").alias("terms")).where(
            F.size("terms") > 1).limit(5).collect()
        if collisions:
            raise TermIdCollision(f"term id hash collisions: {[r['terms'] for r in collisions]}")
        num_terms = term_stats.count()

        v = F.lit(version).cast("long").alias("index_version")
        term_stats_version = _replace_version(
            term_stats.select(v, "term_id", "term", "df", "df_enriched", "cf"),
            tables.table_uri(warehouse, tables.TERM_STATS), version, ["index_version"],
        )
        shard_docs_version = _replace_version(
            analyzed.select(v, "shard", "doc_ord", "doc_id", "doc_len"),
            tables.table_uri(warehouse, tables.SHARD_DOCS), version, ["index_version", "shard"],
        )
        postings = (
            occurrences.join(term_stats.select("term_id", F.col("df_enriched").alias("df")), "term_id")
            .groupBy("shard", "term_id", "df")
            .agg(F.sort_array(F.collect_list(F.struct("doc_ord", "tf"))).alias("p"))
            .select(v, "shard", "term_id", "df", F.col("p.doc_ord").alias("doc_ords"), F.col("p.tf").alias("tfs"))
        )
        postings_version = _replace_version(
            postings, tables.table_uri(warehouse, tables.POSTINGS), version, ["index_version", "shard"]
        )
        injections_version = None
        if enrichment is not None:
            injections_version = _replace_version(
                analyzed.select(v, "doc_id", F.posexplode("decisions").alias("position", "d")).select(
                    "index_version", "doc_id", "position", "d.phrase", "d.kept", "d.reason", "d.min_df"),
                tables.table_uri(warehouse, tables.INJECTIONS), version, ["index_version"],
            )
        log(f"wrote {num_terms} terms and postings for {num_shards} shards")
    finally:
        for df in persisted:
            df.unpersist()

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
        **enrichment_info,
        "docs_table_version": docs_version,
        "term_stats_table_version": term_stats_version,
        "postings_table_version": postings_version,
        "shard_docs_table_version": shard_docs_version,
        "injections_table_version": injections_version,
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
    spark.createDataFrame([tuple(row[c] for c, _ in tables.CORPUS_STATS_FIELDS)],
                          ", ".join(f"{c} {t}" for c, t in tables.CORPUS_STATS_FIELDS)).write.format(
        "delta").mode("append").option("mergeSchema", "true").save(uri)  # older tables gain new columns
