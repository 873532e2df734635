"""Steps 0-2 of an index build: what changed since the base (the docs table's change data feed), the analysis of
new and changed documents and of their enrichment phrases, and the term dictionary their new terms go to."""

from __future__ import annotations

from dataclasses import dataclass

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.storagelevel import StorageLevel

from sira.core import tables
from sira.pipelines.storage.delta_io import has_change_data, row_count, table_exists, table_version
from sira.pipelines.index.context import (ANALYSIS_ROWS_PER_FILE, BROADCAST_ROWS, Build, MissingAnalysis,
                                          TERM_ROWS_PER_FILE, TermIdCollision, maybe_broadcast, in_files, spark_ddl,
                                          without_fields)
from sira.pipelines.index.workers import (ANALYSIS_OUT, CHANGES_ANALYSIS_OUT, PHRASES_OUT, analyze_documents,
                                          analyze_phrases)


@dataclass
class Changes:
    """The net change of the docs table since the version a base index was built from."""

    rows: DataFrame  # (doc_id, content_hash, sign, title, text): sign 1 came, -1 went (with its text as it was)
    came: int
    went: int
    num_docs: int  # documents now


CHANGES_DDL = "doc_id string, content_hash string, sign int, title string, text string"


def docs_changes(b: Build, base: dict | None) -> Changes | None:
    """The documents whose content came or went between the docs version `base` was built from and this build's,
    from the docs table's change data feed. None, and the build compares whole tables instead, without a base or
    when the feed does not hold exactly those changes (not enabled, a rewrite or restore in between, change files
    gone) or its counts do not add up to the documents of both versions."""
    if base is None:
        return None
    uri = b.uri(tables.DOCS)
    since, until = int(base["docs_table_version"]), b.docs_version
    num_docs = row_count(uri, until)
    if num_docs is None or until < since or not has_change_data(uri, since, until):
        b.log(f"changes: no change data feed of {uri} from v{since} to v{until}: comparing whole tables")
        return None
    try:
        rows = _net_changes(b, uri, since, until)
        counts = rows.agg(F.count(F.when(F.col("sign") == 1, 1)).alias("came"),
                          F.count(F.when(F.col("sign") == -1, 1)).alias("went")).first()
    except (Py4JJavaError, PySparkException) as exc:  # e.g. its change files vacuumed
        b.log(f"changes: the change data feed of {uri} is unreadable ({str(exc).splitlines()[0][:300]}): comparing "
              "whole tables")
        return None
    came, went = int(counts["came"]), int(counts["went"])
    if num_docs != int(base["num_docs"]) + came - went:
        b.log(f"changes: the change data feed of {uri} ({came} came, {went} went since v{since}) does not take "
              f"v{since}'s {base['num_docs']} documents to v{until}'s {num_docs}: comparing whole tables")
        return None
    b.log(f"changes: {came} documents came and {went} went since docs v{since} (change data feed)")
    return Changes(rows, came, went, num_docs)


def _net_changes(b: Build, uri: str, since: int, until: int) -> DataFrame:
    """(CHANGES_DDL) from the change data feed of versions since + 1 .. until, kept."""
    if until == since:
        return b.spark.createDataFrame([], CHANGES_DDL)
    feed = (b.spark.read.format("delta").option("readChangeFeed", "true")
            .option("startingVersion", since + 1).option("endingVersion", until).load(uri))
    # A document as it was: the pre-image of its first change (none when that inserted it); as it is: the post-image
    # of its last (none when that deleted it). An update's pre-image comes before its post-image.
    order = F.col("_commit_version") * 2 + (F.col("_change_type") == "update_postimage").cast("long")
    image = F.struct("_change_type", "content_hash", "title", "text")
    net = feed.groupBy("doc_id").agg(F.min_by(image, order).alias("first"), F.max_by(image, order).alias("last"))
    net = net.select("doc_id", F.when(F.col("first._change_type") != "insert", F.col("first.content_hash"))
                     .alias("before"), F.when(F.col("last._change_type") != "delete", F.col("last.content_hash"))
                     .alias("after"), "first", "last")
    differs = ~F.col("before").eqNullSafe(F.col("after"))
    came = net.where(F.col("after").isNotNull() & differs).select(
        "doc_id", F.col("after").alias("content_hash"), F.lit(1).alias("sign"), "last.title", "last.text")
    went = net.where(F.col("before").isNotNull() & differs).select(
        "doc_id", F.col("before").alias("content_hash"), F.lit(-1).alias("sign"), "first.title", "first.text")
    return b.keep(came.unionByName(went), StorageLevel.MEMORY_AND_DISK)


def analyse_documents(b: Build, docs: DataFrame, changes: Changes | None = None) -> tuple[int, int, int]:
    """Analyse the documents that have no kept analysis for this analyzer; returns how many documents there are,
    how many were analysed now, and how many kept analyses are of no current document (stale). With `changes`,
    only the documents that came can lack one, and their texts come with the changes; in a plain build, see
    `_analyse_changes`."""
    if changes is not None:
        return _analyse_changes(b, changes)
    key = ["doc_id", "content_hash"]
    num_docs = row_count(b.uri(tables.DOCS), b.docs_version)
    if num_docs is None:
        num_docs = docs.count()
    todo, new, stale = docs.select(*key, "title", "text"), num_docs, 0
    if table_exists(b.uri(tables.DOC_ANALYSIS)):
        done = analyses_table(b).select(*key)
        kept = _kept_analyses(b, done)
        # Which documents lack an analysis, on the keys alone; the texts are read for those only.
        missing = b.cut(docs.select(*key).join(done, key, "left_anti"))
        new = missing.count()
        if new < num_docs:
            todo = todo.join(maybe_broadcast(missing, new), key)
        stale = kept - (num_docs - new)  # analyses of documents that changed or left since
    b.log(f"analysis: {new} new or changed documents to analyse, {num_docs - new} kept from earlier builds")
    if new:
        # Cut, not kept: the corpus-sized terms are read back from the table from here on (see `Build.cut`).
        out = b.cut(todo.mapInArrow(analyze_documents(b.analyzer_json, b.build_id), spark_ddl(ANALYSIS_OUT)))
        analyses = out.where(F.col("doc_id").isNotNull()).drop("term_id", "term")
        _keep_analyses(b, out.where(F.col("doc_id").isNull()).select("term_id", "term"), analyses, new)
        b.log(f"analysis: {new} documents analysed")
    return num_docs, new, stale


def analyses_table(b: Build) -> DataFrame:
    """The kept analyses of this build's analyzer (doc_analysis without its analyzer_key)."""
    return b.read(tables.DOC_ANALYSIS).where(F.col("analyzer_key") == b.analyzer_key).drop("analyzer_key")


def _kept_analyses(b: Build, done: DataFrame) -> int:
    """How many analyses `done` (this analyzer's, as `analyses_table`) holds: from the Delta log when it knows."""
    kept = row_count(b.uri(tables.DOC_ANALYSIS), partition=("analyzer_key", b.analyzer_key))
    return done.count() if kept is None else kept


def _keep_analyses(b: Build, spelled: DataFrame, analyses: DataFrame, rows: int) -> None:
    """Append the new terms `spelled` (term_id, term) to the dictionary, then `analyses` (`rows` of them; the
    doc_analysis columns but analyzer_key, and maybe others) to the kept ones."""
    # The dictionary first: a kept analysis implies its terms are spelled (a kill in between re-analyses).
    merge_dictionary(b, spelled)
    (in_files(analyses.select(F.lit(b.analyzer_key).alias("analyzer_key"), *without_fields(
        tables.DOC_ANALYSIS_SCHEMA, "analyzer_key").names), rows, ANALYSIS_ROWS_PER_FILE)
     .write.format("delta").mode("append").partitionBy("analyzer_key").save(b.uri(tables.DOC_ANALYSIS)))


def _analyse_changes(b: Build, changes: Changes) -> tuple[int, int, int]:
    """`analyse_documents` of a build with the night's changes: every document that came or went is analysed
    from the change feed's texts into `b.moved`, and those that came without a kept analysis are kept. The same
    analyzer gives a document that went the terms the base holds for it; reading them back instead meant a scan of
    every kept document's terms (6 s of a 1M-document night) to find a few of them. Only the keys of the kept
    analyses are read, to find the documents that came with one already (their content came back)."""
    key = ["doc_id", "content_hash"]
    have, n_have, stale = None, 0, 0
    if table_exists(b.uri(tables.DOC_ANALYSIS)):
        done = analyses_table(b).select(*key)
        if changes.came:
            # Cut from the table's lineage: the append below would re-plan a kept frame that reads it.
            came = changes.rows.where(F.col("sign") == 1).select(*key)
            have = b.cut(maybe_broadcast(came, changes.came).join(done, key))
            n_have = have.count()
        stale = _kept_analyses(b, done) - (changes.num_docs - (changes.came - n_have))
    new = changes.came - n_have
    b.log(f"analysis: {new} new or changed documents to analyse, {changes.num_docs - new} kept from earlier builds; "
          f"the {changes.went} whose content went analysed again from the change feed")
    out = b.keep(changes.rows.mapInArrow(analyze_documents(b.analyzer_json, b.build_id, signed=True),
                                         spark_ddl(CHANGES_ANALYSIS_OUT)))
    b.moved = out.where(F.col("doc_id").isNotNull()).drop("term_id", "term")
    if new:
        came = b.moved.where(F.col("sign") == 1)
        _keep_analyses(b, out.where(F.col("doc_id").isNull()).select("term_id", "term"),
                       came.join(maybe_broadcast(have, n_have), key, "left_anti") if n_have else came, new)
        b.log(f"analysis: {new} documents analysed")
    return changes.num_docs, new, stale


# Kept analyses of documents that changed or left are dropped once they outnumber this share of the corpus (an
# incremental build that needed one of them finds it missing and builds in full).
STALE_ANALYSIS_FRACTION = 0.2


def compact_analysis(b: Build, stale: int) -> None:
    """Rewrite this analyzer's kept analyses without those of documents no longer current (one commit)."""
    docs = b.read(tables.DOCS, b.docs_version).select("doc_id", "content_hash")
    kept = b.read(tables.DOC_ANALYSIS).where(F.col("analyzer_key") == b.analyzer_key).join(
        docs, ["doc_id", "content_hash"], "left_semi")
    (kept.write.format("delta").mode("overwrite").option("replaceWhere", f"analyzer_key = '{b.analyzer_key}'")
     .partitionBy("analyzer_key").save(b.uri(tables.DOC_ANALYSIS)))
    b.log(f"analysis: dropped {stale} kept analyses of documents that changed or left")


def merge_dictionary(b: Build, spelled: DataFrame) -> None:
    """Append the term ids the dictionary lacks; two spellings of one id is a collision, and an error."""
    uri = b.uri(tables.TERM_DICTIONARY)
    spellings = b.cut(spelled.groupBy("term_id").agg(F.min("term").alias("term"), F.max("term").alias("other")))
    n = spellings.count()
    # One join with the dictionary, stored: the check and the append both read it, and `limit` runs a job per few
    # partitions, each of which redid the join.
    if table_exists(uri):
        if n <= BROADCAST_ROWS:
            # A night's terms go to every task and the dictionary streams past them: the corpus-sized table is read,
            # not shuffled (an outer join would shuffle it, whichever side is small).
            known = b.read(tables.TERM_DICTIONARY).withColumnRenamed("term", "known").join(
                F.broadcast(spellings.select("term_id")), "term_id")
            spellings = spellings.join(maybe_broadcast(known, n), "term_id", "left")
        else:
            spellings = spellings.join(b.read(tables.TERM_DICTIONARY).withColumnRenamed("term", "known"), "term_id",
                                       "left")
    else:
        spellings = spellings.withColumn("known", F.lit(None).cast("string"))
    spellings = b.cut(spellings)  # cut, not kept: the append below would drop a kept frame that reads the dictionary
    clash = (F.col("term") != F.col("other")) | (F.col("known") != F.col("term"))  # null known: a new id, no clash
    # One counting job over all partitions at once; `limit` alone scans them in rounds of growing size (a job each,
    # the first on one core), and a clash is rare enough to be fetched after.
    found = spellings.where(clash).limit(5).collect() if spellings.where(clash).count() else []
    if found:
        raise TermIdCollision("term id hash collisions: " + str(
            [(r["term"], r["other"] if r["other"] != r["term"] else r["known"]) for r in found]))
    new = spellings.where(F.col("known").isNull()).select("term_id", "term")
    in_files(new, n, TERM_ROWS_PER_FILE).write.format("delta").mode("append").save(uri)


def enrichment_phrases(b: Build, docs: DataFrame, version: int | None = None) -> tuple[DataFrame, int]:
    """(doc_id, phrases, phrases_key) for the current content of each doc of `docs` (doc_id, content_hash), and the
    enrichment table version read (the newest unless given)."""
    uri = b.uri(tables.ENRICHMENT)
    version = table_version(uri) if version is None else version
    if version is None:
        raise FileNotFoundError(f"no enrichment table at {uri}; run `sira enrich` first or pass --no-enrichment")
    choice = b.enrichment
    enr = b.read(tables.ENRICHMENT, version).where(F.col("error").isNull())
    if choice.model:
        enr = enr.where(F.col("model") == choice.model)
    if choice.prompt_version:
        enr = enr.where(F.col("prompt_version") == choice.prompt_version)
    newest = Window.partitionBy("doc_id").orderBy(F.col("enriched_at").desc(), F.col("model"), F.col("prompt_version"))
    phrases = (
        enr.join(docs.select("doc_id", "content_hash"), ["doc_id", "content_hash"])
        .withColumn("_rank", F.row_number().over(newest)).where("_rank = 1")
        .where(F.size("phrases") > 0)
        .select("doc_id", "content_hash", "phrases",
                F.sha2(F.to_json(F.col("phrases")), 256).substr(1, 32).alias("phrases_key"))
    )
    return b.cut(phrases), version


def analyse_phrases(b: Build, docs: DataFrame, phrases: DataFrame, rows: int | None = None,
                    texts: DataFrame | None = None) -> DataFrame | None:
    """The DF-independent checks of the phrases (doc_id, content_hash, phrases_key, phrases) that lack a kept
    analysis, kept. With `rows` (a night's few phrase lists), the kept analyses' keys stream past them, `texts`
    (doc_id, content_hash, title, text) gives the documents' texts it holds (the docs table is read for the others),
    and the return value is the kept analyses of `phrases`, those made now and those found."""
    uri = b.uri(tables.PHRASE_ANALYSIS)
    keys, doc = ["doc_id", "content_hash", "phrases_key"], ["doc_id", "content_hash"]
    todo, found, n_found = phrases, None, 0
    if table_exists(uri):
        done = b.read(tables.PHRASE_ANALYSIS).where(F.col("analyzer_key") == b.analyzer_key).drop("analyzer_key")
        if rows is None:
            todo = todo.join(done.select(*keys), keys, "left_anti")
        else:
            found = b.cut(done.join(maybe_broadcast(phrases.select(*keys), rows), keys, "left_semi"))
            n_found = found.count()
            todo = phrases.join(maybe_broadcast(found.select(*keys), n_found), keys, "left_anti") if n_found \
                else phrases
    columns = ["doc_id", "content_hash", "phrases_key", "phrases", "title", "text"]
    if texts is not None:
        todo = b.cut(todo)
        have = todo.join(texts, doc)
        rest = b.cut(todo.join(texts.select(*doc), doc, "left_anti"))
        n_rest = rest.count()
        todo = have.unionByName(maybe_broadcast(rest, n_rest).join(docs.select(*doc, "title", "text"), doc)) \
            if n_rest else have
    else:
        todo = todo.join(docs.select(*doc, "title", "text"), doc)
    out = b.cut(todo.select(*columns).mapInArrow(analyze_phrases(b.analyzer_json), spark_ddl(PHRASES_OUT)))
    made = out.where(F.col("doc_id").isNotNull()).drop("term_id", "term")
    if made.count():
        merge_dictionary(b, out.where(F.col("doc_id").isNull()).select("term_id", "term"))
        (made.select(F.lit(b.analyzer_key).alias("analyzer_key"), "*")
         .write.format("delta").mode("append").partitionBy("analyzer_key").save(uri))
    elif not table_exists(uri):  # nothing proposed yet: an empty table, so that the decisions read no rows
        (b.spark.createDataFrame([], spark_ddl(tables.PHRASE_ANALYSIS_SCHEMA))
         .write.format("delta").mode("append").partitionBy("analyzer_key").save(uri))
    if rows is None:
        return None
    return made.unionByName(found) if n_found else made


def analysis_of(b: Build, keys: DataFrame, rows: int | None = None) -> DataFrame:
    """The kept analysis of the documents in `keys` (doc_id, content_hash, ...), joined to them; `rows`: how many
    keys there are, when known (few are broadcast). In a plain incremental build they are read from `b.changed`."""
    if b.changed is not None:  # the corpus-sized table is not scanned again for each
        done = b.changed.drop("sign")
    else:
        done = analyses_table(b)
    return maybe_broadcast(keys, rows).join(done, ["doc_id", "content_hash"])


def term_counts(df: DataFrame, ids: str = "term_ids", tfs: str = "tfs",
                keep: tuple[str, ...] = ("doc_id",)) -> DataFrame:
    """(*keep, term_id, tf): one row per term of each term vector in `df`."""
    return df.select(*keep, F.explode(F.arrays_zip(F.col(ids).alias("i"), F.col(tfs).alias("t"))).alias("p")) \
        .select(*keep, F.col("p.i").alias("term_id"), F.col("p.t").alias("tf"))


def require_analysis(b: Build, keys: DataFrame, what: str, joined: DataFrame | None = None) -> DataFrame:
    """The kept analysis of `keys` (or `joined`, when already read), checked to cover each of them once (it is never
    silently partial)."""
    expected = keys.count()
    joined = b.keep(analysis_of(b, keys, expected)) if joined is None else joined
    got = joined.count()
    if got != expected:
        raise MissingAnalysis(f"{tables.DOC_ANALYSIS} holds {got} analyses for the {expected} {what} (analyzer "
                              f"{b.analyzer_key})")
    return joined
