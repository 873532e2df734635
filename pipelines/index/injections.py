"""Steps 3-4 of an index build: DF in the original corpus and the corpus-side DF rule, which decides the
enrichment terms each document gets (every document in a full build; in a night, those whose decisions can change)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sira.core import tables
from sira.pipelines.storage.delta_io import changed_data_files, read_data_files, table_version
from sira.pipelines.index.base import base_df_of, base_term_stats, live_docs, read_live_docs
from sira.pipelines.index.changes import (Changes, analyse_documents, analyse_phrases, analysis_of, enrichment_phrases,
                                          require_analysis, term_counts)
from sira.pipelines.index.context import (Build, EnrichmentChoice, INJECTED_COLUMNS, MissingAnalysis,
                                          maybe_broadcast, no_enrichment, not_injected)


def original_df(b: Build, current: DataFrame, base: dict | None,
                changes: Changes | None = None) -> tuple[DataFrame | None, DataFrame | None]:
    """(term_id, df) in the original corpus, needed by enriched builds (the DF rule) and by incremental ones
    (term_stats.df moves with the documents whose content changed); None when the postings give it (a plain full
    build). Incrementally it is the base's plus the delta of documents whose content came or went."""
    if base is None:
        if b.enrichment is None:
            return None, None
        return b.cut(term_counts(analysis_of(b, current)).groupBy("term_id").agg(
            F.count("*").cast("long").alias("df"))), None
    key = ["doc_id", "content_hash"]
    if changes is not None:
        came_went = changes.rows.select(*key, "sign")
    else:
        # One outer join of the current documents with the base's finds both what came (sign 1) and what went (-1).
        sides = current.select(*key, F.lit(True).alias("now")).join(
            live_docs(b, base).select(*key, F.lit(True).alias("before")), key, "full_outer")
        came_went = b.keep(sides.where(F.col("now").isNull() | F.col("before").isNull()).select(
            *key, F.when(F.col("now"), F.lit(1)).otherwise(F.lit(-1)).alias("sign")))
    changed = require_analysis(b, came_went, "documents whose content came or went", b.moved)
    # An enriched build adds the documents whose injections alone change (`_with_unchanged_movers`).
    b.changed, b.changed_rows = changed, changed.count()
    # d_cf too: in a plain build the documents whose content moved are those entering and leaving, so this is the
    # whole change of term_stats (`term_statistics` takes it as is).
    delta = b.keep(term_counts(changed, keep=("sign",)).groupBy("term_id")
                   .agg(F.sum("sign").cast("long").alias("d_df"),
                        F.sum(F.col("sign") * F.col("tf")).cast("long").alias("d_cf")))
    base_df = base_term_stats(b, base).select("term_id", "df")
    df = (base_df.join(delta, "term_id", "full_outer")
          .select("term_id", (F.coalesce("df", F.lit(0)) + F.coalesce("d_df", F.lit(0))).alias("df"))
          .where(F.col("df") > 0))
    # Kept for the enriched build's DF rule; a plain one reads it at most once, and writing term_stats would drop it.
    return (b.keep(df) if b.enrichment is not None else df), delta


def base_and_original_df(b: Build, docs: DataFrame, base: dict | None, changes: Changes | None
                         ) -> tuple[dict | None, DataFrame | None, DataFrame | None, int]:
    """The version this build extends (None: a full build), `original_df` against it and how many more documents
    were analysed. A base whose documents' kept analyses were compacted away cannot be extended: the build is a full
    one, and every document without a kept analysis is analysed first (with `changes`, only those that came were)."""
    current = docs.select("doc_id", "content_hash")
    try:
        return base, *original_df(b, current, base, changes), 0
    except MissingAnalysis as exc:
        b.log(f"full build: {exc}")
        b.moved = None  # the night's analyses: a full build reads the whole table
        more = analyse_documents(b, docs)[1] if changes is not None else 0
        return None, *original_df(b, current, None), more


def inject_enrichment(b: Build, docs: DataFrame, orig_df: DataFrame, num_docs: int) -> tuple[DataFrame, DataFrame,
                                                                                             dict]:
    """The corpus-side enrichment of the current documents through the DF rule: the injections rows, each
    document's injected terms (`decide_injections`) and the enrichment columns of corpus_stats."""
    phrases, enrichment_version = enrichment_phrases(b, docs)
    analyse_phrases(b, docs, phrases)
    injections, per_doc = decide_injections(b, phrases, orig_df, num_docs)
    info = {**no_enrichment(), "enrichment_table_version": enrichment_version,
            **_injection_counts(injections, b.enrichment)}
    b.log(f"enrichment v{enrichment_version}: kept {info['phrases_kept']} of {info['phrases_proposed']} proposed "
          "phrases")
    return injections, per_doc, info


@dataclass
class InjectionMoves:
    """An enriched night's documents that enter the new segment (their content came, their enrichment or the DF
    rule's decisions on it changed), as `desired_documents` rows with their decisions, and the ids of every document
    whose live row leaves (those and what went)."""

    entering: DataFrame
    rows: int
    leaving_ids: DataFrame
    leaving_rows: int
    injections: DataFrame  # the decisions of the entering documents' candidates
    info: dict  # corpus_stats' enrichment columns, but the phrase counts (`moved_counts`)


# A night whose enrichment changed more than this share of the documents decides every document's injections again.
MAX_TOUCHED_FRACTION = 0.2


def incremental_injections(b: Build, docs: DataFrame, base: dict, changes: Changes, orig_delta: DataFrame,
                           num_docs: int) -> InjectionMoves | None:
    """The injections an enriched night changes, deciding only the documents whose decisions can change: those
    whose content came, those with enrichment rows that came or went since the base's enrichment table version,
    and those with a candidate phrase holding a term whose side of the DF limit (tau x |C|) moved. The others keep
    their base decisions, which equal a rebuild's: a phrase's decision is whether any of its terms has a DF within
    the limit. None when the enrichment table's changes cannot be read (a decision of every document follows)."""
    uri = b.uri(tables.ENRICHMENT)
    version, since = table_version(uri), base.get("enrichment_table_version")
    if version is None:
        raise FileNotFoundError(f"no enrichment table at {uri}; run `sira enrich` first or pass --no-enrichment")
    files = changed_data_files(uri, int(since), version) if since is not None and version >= since else None
    try:
        touched = None if files is None else pc.unique(read_data_files(uri, files, ["doc_id"]).column("doc_id"))
    except FileNotFoundError:
        touched = None
    if touched is None or len(touched) > MAX_TOUCHED_FRACTION * num_docs:
        b.log(f"injections: the changes of {uri} since v{since} are "
              + ("unknown (log or files gone)" if touched is None else f"{len(touched)} documents'")
              + ": deciding every document's injections")
        return None
    key = ["doc_id", "content_hash"]
    started = time.perf_counter()
    flipped, n_flipped = _flipped_terms(b, base, orig_delta, num_docs)
    affected = b.spark.createDataFrame(pa.table({"doc_id": touched}).to_pandas(), "doc_id string") \
        .unionByName(changes.rows.where("sign = 1").select("doc_id"))
    if n_flipped:
        analyses = b.read(tables.PHRASE_ANALYSIS).where(F.col("analyzer_key") == b.analyzer_key)
        holders = (analyses.select("doc_id", F.explode("candidates").alias("c")).where(F.col("c.reason").isNull())
                   .select("doc_id", F.explode("c.term_ids").alias("term_id"))
                   .join(maybe_broadcast(flipped, n_flipped), "term_id", "left_semi").select("doc_id"))
        affected = affected.unionByName(holders)
    affected = b.cut(affected.distinct())
    n_affected = affected.count()
    # Their rows in the base (the content they had, their decisions), and the content they have now.
    live = b.cut(read_live_docs(b, base).join(maybe_broadcast(affected, n_affected), "doc_id", "left_semi"))
    came = changes.rows.where("sign = 1").select(*key, "title", "text")
    moved_ids = changes.rows.select("doc_id").distinct()
    current = b.cut(came.select(*key).unionByName(
        live.select(*key).join(maybe_broadcast(moved_ids, changes.came + changes.went), "doc_id", "left_anti")))
    n_current = current.count()
    found = time.perf_counter()
    phrases, enrichment_version = enrichment_phrases(b, maybe_broadcast(current, n_current), version)
    n_phrases = phrases.count()
    analysed = analyse_phrases(b, docs, phrases, n_phrases, texts=came)
    checked = time.perf_counter()
    decided, per_doc = decide_injections(b, None, lambda terms, n: _original_df_of(b, base, orig_delta, terms, n),
                                         num_docs, analysed)
    desired = desired_documents(current, per_doc)
    changed = ["doc_id", "content_hash", "inject_key", "decisions_key"]
    entering = b.keep(desired.join(maybe_broadcast(live.select(*changed), n_affected), changed, "left_anti"))
    n_entering = entering.count()
    leaving_ids = b.cut(entering.select("doc_id").unionByName(
        changes.rows.where("sign = -1").select("doc_id")).distinct())
    b.log(f"injections: {n_affected} documents decided again ({len(touched)} with enrichment rows that came or "
          f"went, {n_flipped} terms crossed the DF limit), {n_entering} of them enter the new segment; seconds: "
          f"finding them {found - started:.1f}, their phrases {checked - found:.1f}, deciding "
          f"{time.perf_counter() - checked:.1f}")
    info = {**no_enrichment(), "enriched": True, "tau": b.enrichment.tau, "enrichment_table_version":
            enrichment_version, "enrichment_model": b.enrichment.model,
            "enrichment_prompt_version": b.enrichment.prompt_version}
    decisions = decided.join(maybe_broadcast(entering.select("doc_id"), n_entering), "doc_id", "left_semi")
    return InjectionMoves(entering, n_entering, leaving_ids, leaving_ids.count(), decisions, info)


def _flipped_terms(b: Build, base: dict, orig_delta: DataFrame, num_docs: int) -> tuple[DataFrame, int]:
    """(term_id) of the terms on the other side of the DF limit than in the base: DF <= tau x |C| then and not now,
    or the reverse. With the same limit, only terms whose DF moved; otherwise every term is checked."""
    zero = F.lit(0).cast("long")
    old_limit, new_limit = base["tau"] * base["num_docs"], b.enrichment.tau * num_docs
    delta = b.cut(orig_delta.where("d_df != 0").select("term_id", "d_df"))
    n_delta = delta.count()
    if old_limit == new_limit:
        before = base_df_of(b, base, delta.select("term_id"), n_delta).withColumnRenamed("df", "before")
    else:
        before = base_term_stats(b, base).select("term_id", F.col("df").alias("before"))
    held = b.cut(before.join(maybe_broadcast(delta, n_delta), "term_id", "left")
                 .select("term_id", "before", (F.col("before") + F.coalesce("d_df", zero)).alias("after")))
    # Terms no base row holds: no DF before.
    new = delta.join(held.select("term_id"), "term_id", "left_anti").select(
        "term_id", zero.alias("before"), F.col("d_df").alias("after"))
    both = held.unionByName(new)
    flipped = b.cut(both.where((F.col("before") <= F.lit(old_limit)) != (F.col("after") <= F.lit(new_limit)))
                    .select("term_id"))
    return flipped, flipped.count()


def _original_df_of(b: Build, base: dict, orig_delta: DataFrame, terms: DataFrame, rows: int) -> DataFrame:
    """(term_id, df) now of those of `terms` some document holds: the base's DF plus the night's change."""
    zero = F.lit(0).cast("long")
    delta = orig_delta.select("term_id", "d_df").join(maybe_broadcast(terms, rows), "term_id", "left_semi")
    before = b.cut(base_df_of(b, base, terms, rows))
    return (maybe_broadcast(terms, rows).join(maybe_broadcast(before, rows), "term_id", "left")
            .join(delta, "term_id", "left")
            .select("term_id", (F.coalesce("df", zero) + F.coalesce("d_df", zero)).alias("df")).where("df > 0"))


def decide_injections(b: Build, phrases: DataFrame | None, orig_df: DataFrame | Callable[[DataFrame, int], DataFrame],
                      num_docs: int, analysed: DataFrame | None = None) -> tuple[DataFrame, DataFrame]:
    """Every candidate phrase decided (the injections rows) and, per document with candidates, the key of its
    decisions, their counts, and (with kept phrases) its injected terms (inj_term_ids, inj_tfs) and their key.
    `orig_df`: (term_id, df) in the original corpus, or, with `analysed` (the phrases' kept analyses, when a night has
    them at hand), a function giving those of some terms (term_id; how many), so that only their DFs are read."""
    few = analysed is not None
    if analysed is None:
        kept_analysis = b.read(tables.PHRASE_ANALYSIS).where(F.col("analyzer_key") == b.analyzer_key)
        analysed = phrases.select("doc_id", "content_hash", "phrases_key").join(
            kept_analysis, ["doc_id", "content_hash", "phrases_key"])
    cands = analysed.select("doc_id", F.posexplode("candidates").alias("position", "c"))
    pending = cands.where(F.col("c.reason").isNull()).select("doc_id", "position",
                                                             F.explode("c.term_ids").alias("term_id"))
    dfs = orig_df
    if few:
        terms = b.cut(pending.select("term_id").distinct())
        dfs = orig_df(terms, terms.count())
    min_df = (pending.join(dfs, "term_id", "left").groupBy("doc_id", "position")
              .agg(F.min(F.coalesce("df", F.lit(0))).cast("long").alias("min_df")))
    limit = b.enrichment.tau * num_docs  # kept unless dropped_by_df: min DF > tau*|C| (unseen: min DF 0, kept)
    decided = b.cut(
        cands.join(min_df, ["doc_id", "position"], "left")
        .withColumn("kept", F.col("c.reason").isNull() & (F.col("min_df") <= F.lit(limit)))
        .select("doc_id", F.col("position").cast("int"), F.col("c.phrase").alias("phrase"), "kept",
                F.coalesce("c.reason", F.when(F.col("kept"), "kept").otherwise("too common")).alias("reason"),
                F.when(F.col("c.reason").isNull(), F.col("min_df")).alias("min_df"),
                F.col("c.term_ids").alias("term_ids"), F.col("c.tfs").alias("tfs")))
    injected = (term_counts(decided.where("kept")).groupBy("doc_id", "term_id").agg(F.sum("tf").alias("tf"))
                .groupBy("doc_id").agg(F.sort_array(F.collect_list(F.struct("term_id", "tf"))).alias("p"))
                .select("doc_id", F.col("p.term_id").alias("inj_term_ids"),
                        F.col("p.tf").cast("array<int>").alias("inj_tfs"))
                .withColumn("inject_key", F.sha2(F.to_json(F.struct("inj_term_ids", "inj_tfs")), 256).substr(1, 32)))
    per_doc = decided.groupBy("doc_id").agg(
        F.sha2(F.to_json(F.sort_array(F.collect_list(F.struct("position", "phrase", "kept", "reason")))), 256)
        .substr(1, 32).alias("decisions_key"),
        F.count("*").cast("int").alias("phrases_proposed"),
        F.sum(F.col("kept").cast("int")).cast("int").alias("phrases_kept"))
    return decided.drop("term_ids", "tfs"), b.cut(per_doc.join(injected, "doc_id", "left"))


def _injection_counts(decided: DataFrame, e: EnrichmentChoice) -> dict:
    counts = decided.agg(F.count("*").alias("proposed"), F.sum(F.col("kept").cast("int")).alias("kept")).first()
    return {"enriched": True, "tau": e.tau, "phrases_proposed": int(counts["proposed"]),
            "phrases_kept": int(counts["kept"] or 0), "enrichment_model": e.model,
            "enrichment_prompt_version": e.prompt_version}


def desired_documents(current: DataFrame, per_doc: DataFrame | None) -> DataFrame:
    """(doc_id, content_hash, *INJECTED_COLUMNS): every document of `current` as the new version should hold it (no
    injected terms when `per_doc`, the enriched ones from `decide_injections`, is None)."""
    if per_doc is None:
        return current.select("doc_id", "content_hash", *[not_injected(c).alias(c) for c in INJECTED_COLUMNS])
    return current.join(per_doc, "doc_id", "left").select("doc_id", "content_hash", *[
        F.coalesce(F.col(c).cast(kind), not_injected(c)).alias(c) for c, (kind, _) in INJECTED_COLUMNS.items()])
